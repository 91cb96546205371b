#!/usr/bin/env bash
# Every GPU check of the models and stacked-sweep issues, in one call of the device tool
# (about 6-9 minutes on one H200; its files come back from $OUT):
#
#   run(command="bash benchmarks/gpu_checks.sh", carry=[".whl"], timeout_s=600)
#
# It uses the device image's own torch / transformers / accelerate and this source tree
# (PYTHONPATH), installs nothing from the network (there is none there), and writes:
#   parity.txt         kernel path vs PyTorch path, forward and backward, with the speed-up
#                      (tests/models/test_models.py::test_kernel_path_matches_torch_path, -m gpu)
#   runs_per_hour.txt  benchmarks/bench_stacked.py --runs-per-hour: runs per hour of the AR recipe,
#                      one at a time vs the best stack, hidden 64 / 128 / 256
#   models.txt         benchmarks/bench_models.py on the GPU (our models vs transformers' peers)
# Kernel packages: flash-linear-attention's ops (fla-core, pure Python + Triton) can travel as a
# wheel in the ignored folder .whl/ (python3 -m pip download --no-deps --only-binary=:all: -d .whl
# fla-core==0.6.0), which enables DeltaNet's and Gated DeltaNet's kernel parity. mamba-ssm and
# causal-conv1d need a CUDA build far longer than the device budget: Mamba's and Mamba-2's parity
# tests skip unless wheels are carried.
set -uo pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT="${OUT:-/tmp/gpu_checks}"
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
{ nvidia-smi -L; python3 -c "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__, '| cuda', torch.cuda.is_available())"; } 2>&1 | tee "$OUT/device.txt"
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -rs -s tests/models/test_models.py 2>&1 | tee "$OUT/parity.txt"
timeout 270 python3 benchmarks/bench_stacked.py --runs-per-hour --steps 6 --max-stack 32 2>&1 | tee "$OUT/runs_per_hour.txt"
timeout 120 python3 benchmarks/bench_models.py --device cuda --steps 6 --rounds 2 --only ours hf-gpt2 hf-mamba 2>&1 | tee "$OUT/models.txt"
echo "done: $(ls "$OUT")"
