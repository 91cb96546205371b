# Two entry points that work on a fresh machine: `make quickstart` and `make test`.
# Each creates or refreshes .venv by itself. Where no NVIDIA GPU is present the CPU
# build of torch is installed first, so that resolving the project's dependencies
# does not pull a multi-GB CUDA wheel.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
TORCH_CPU_VERSION ?= 2.13.0
# test processes (pytest-xdist): one per core; each takes its share of the cores free when the
# session starts, and its threads sleep when they wait (tests/conftest.py)
TEST_WORKERS ?= auto
STAMP  := $(VENV)/.installed

.PHONY: venv test quickstart clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
	  echo "GPU found: installing the default torch build"; \
	else \
	  $(PIP) install --quiet "torch==$(TORCH_CPU_VERSION)" || \
	  $(PIP) install --quiet "torch==$(TORCH_CPU_VERSION)" --index-url https://download.pytorch.org/whl/cpu; \
	fi
	$(PIP) install --quiet -e ".[test,interp]"
	touch $(STAMP)

# transformers' common model tests come from its release's source distribution (hash-checked)
test: $(STAMP)
	$(PY) tests/hf_common/fetch.py
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(PY) -m pytest -q --durations=15 -n $(TEST_WORKERS)

# The main job: 8 models on a reduced AR setting, interventions, report (runs/quickstart/).
quickstart: $(STAMP)
	$(VENV)/bin/mecheval quickstart

clean:
	rm -rf $(VENV) build *.egg-info
