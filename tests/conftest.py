"""Test environment: never reach the Hub or anything else outside this machine; keep every cache
in a temporary HF_HOME.

The network guard (``tests/network_guard/sitecustomize.py``) refuses every address that is not
this machine (loopback), in this process and in every Python process a test starts, and fails
the test that tried, even where a library swallows the refusal (Ray's usage statistics, a Hub
client retrying)."""
import importlib.util
import os
import tempfile

import pytest

_HF_HOME = tempfile.mkdtemp(prefix="mecheval-test-hf-")
os.environ["HF_HOME"] = _HF_HOME
os.environ["HF_MECHEVAL_KERNEL_CACHE"] = os.path.join(_HF_HOME, "kernels")   # the compiled CPU scan
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"      # inherited by every process a test starts
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

_GUARD_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "network_guard")
_spec = importlib.util.spec_from_file_location("mecheval_network_guard", os.path.join(_GUARD_DIR, "sitecustomize.py"))
network_guard = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(network_guard)

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
