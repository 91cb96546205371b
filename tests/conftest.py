"""Test environment: never reach the Hub or anything else outside this machine; keep every cache
in a temporary HF_HOME.

A guard on ``socket.socket.connect`` / ``connect_ex`` / ``sendto`` refuses every address that
is not this machine (loopback) and fails the test that tried, even where a library swallows the
refusal (Ray's usage statistics, a Hub client retrying)."""
import errno
import ipaddress
import os
import socket
import tempfile

import pytest

_HF_HOME = tempfile.mkdtemp(prefix="mecheval-test-hf-")
os.environ["HF_HOME"] = _HF_HOME
os.environ["HF_MECHEVAL_KERNEL_CACHE"] = os.path.join(_HF_HOME, "kernels")   # the compiled CPU scan
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"      # inherited by every process a test starts
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

_outside: list = []      # addresses outside this machine that the running test tried to reach


def _on_this_machine(address) -> bool:
    if not isinstance(address, tuple):       # a Unix socket's path
        return True
    host = str(address[0]).split("%")[0]
    if host in ("", "localhost"):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:                       # a host name: it would need the network to resolve
        return False
    ip = getattr(ip, "ipv4_mapped", None) or ip
    return ip.is_loopback or ip.is_unspecified


def _guarded(method, refused):
    def guarded(self, *args):
        address = args[-1] if method.__name__ == "sendto" else args[0]
        if self.family in (socket.AF_INET, socket.AF_INET6) and not _on_this_machine(address):
            _outside.append(address)
            return refused(address)
        return method(self, *args)
    return guarded


def _refuse(address):
    raise ConnectionRefusedError(errno.ECONNREFUSED, f"tests may not reach {address} (outside this machine)")


socket.socket.connect = _guarded(socket.socket.connect, _refuse)
socket.socket.connect_ex = _guarded(socket.socket.connect_ex, lambda address: errno.ECONNREFUSED)
socket.socket.sendto = _guarded(socket.socket.sendto, _refuse)


@pytest.fixture(autouse=True)
def _stay_on_this_machine():
    _outside.clear()
    yield
    if _outside:
        pytest.fail(f"the test tried to reach {_outside[0]}, outside this machine")
