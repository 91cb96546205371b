"""Test environment: never reach the Hub or anything else outside this machine; keep every cache
in a temporary HF_HOME.

The network guard (``tests/network_guard/sitecustomize.py``) refuses every address that is not
this machine (loopback), in this process and in every Python process a test starts, and fails
the test that tried, even where a library swallows the refusal (Ray's usage statistics, a Hub
client retrying)."""
import gc
import importlib.util
import os
import sys
import tempfile

import pytest

_HF_HOME = tempfile.mkdtemp(prefix="mecheval-test-hf-")
os.environ["HF_HOME"] = _HF_HOME
os.environ["HF_MECHEVAL_KERNEL_CACHE"] = os.path.join(_HF_HOME, "kernels")   # the compiled CPU scan
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"      # inherited by every process a test starts
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _free_cores() -> int:
    """The cores other work leaves free as the session starts: the cores less the 1-minute load
    average (rounded), at least one."""
    cores = os.cpu_count() or 1
    try:
        busy = round(os.getloadavg()[0])
    except OSError:                       # no load average on this platform
        busy = 0
    return max(1, min(cores, cores - busy))


# Threads (set before torch is imported; a value already in the environment is kept). Beside other
# work, OpenMP threads that spin while they wait for each other lose whole scheduler slices to it
# (benchmarks/bench_busy_machine.py: a 2-thread step several times slower), so the suite's
# threads sleep when they wait, and each test process takes the cores free when the session
# starts, shared among pytest-xdist's workers. Every process a test starts inherits both.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OMP_NUM_THREADS",
                      str(max(1, _free_cores() // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))))

_GUARD_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "network_guard")
network_guard = sys.modules.get("sitecustomize")
if getattr(network_guard, "LOG_ENV", None) != "MECHEVAL_TEST_NETWORK_LOG":
    _spec = importlib.util.spec_from_file_location("mecheval_network_guard", os.path.join(_GUARD_DIR, "sitecustomize.py"))
    network_guard = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(network_guard)
# else: a pytest-xdist worker, which the controller started as a process of its own: the guard
# came in at its start-up (sitecustomize) and is the one installed; this process is pytest now

network_guard.install(pytest_pid=os.getpid())
_outside = network_guard.outside
# every Python process a test starts loads the same guard, and records what it tried here
_NETWORK_LOG = os.path.join(_HF_HOME, "outside-attempts.jsonl")
os.environ[network_guard.LOG_ENV] = _NETWORK_LOG
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_GUARD_DIR, os.environ.get("PYTHONPATH")) if p)


def _subprocess_attempts() -> list[str]:
    try:
        with open(_NETWORK_LOG) as handle:
            return handle.read().splitlines()
    except FileNotFoundError:
        return []


def pytest_collection_finish(session):
    """Freeze what collection left alive (torch, transformers, every test module: ~0.5 M objects)
    so that a full garbage collection stops walking it. transformers' Trainer collects at the end
    of every training run (accelerate's ``free_memory``); over a heap this size that took 0.36 s,
    half of a two-step run's time, and the suite trains hundreds of such runs in-process (the flag
    probe alone 268). Objects made after this point are collected as before."""
    gc.collect()
    gc.freeze()


@pytest.fixture
def guard():
    """The network guard this session installed: ``guard.outside`` (what this process tried),
    ``guard.LOG_ENV``. A fixture, not ``import conftest``: under pytest-xdist that import is
    another module than the conftest pytest loaded, with a guard of its own."""
    return network_guard


@pytest.fixture(autouse=True)
def _stay_on_this_machine():
    _outside.clear()
    before = len(_subprocess_attempts())
    yield
    if _outside:
        pytest.fail(f"the test tried to reach {_outside[0]}, outside this machine")
    new = _subprocess_attempts()[before:]
    if new:
        pytest.fail(f"a process the test started tried to reach outside this machine: {new[0]}")
