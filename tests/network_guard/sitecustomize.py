"""The test suite's network guard, in the pytest process (``conftest.py`` imports it) and in
every Python process a test starts (``conftest.py`` puts this folder on ``PYTHONPATH``, so
Python imports this file at start-up as ``sitecustomize``).

``socket.socket.connect`` / ``connect_ex`` / ``sendto`` refuse every address that is not this
machine (loopback) and record it, even where a library swallows the refusal (Ray's usage
statistics, a Hub client retrying): in the pytest process in ``outside``, in other processes as
a line in the file ``MECHEVAL_TEST_NETWORK_LOG`` names, which ``conftest.py`` reads after each
test. A process in a loopback-only network namespace (``hf_mecheval/closed_network.py``) is
left to the kernel, which refuses any other address there by itself ("network unreachable")."""
import errno
import ipaddress
import json
import os
import socket
import sys

LOG_ENV = "MECHEVAL_TEST_NETWORK_LOG"
outside: list = []       # addresses outside this machine that this process tried to reach


def on_this_machine(address) -> bool:
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


def _only_loopback() -> bool:
    try:
        with open("/proc/self/net/dev") as handle:
            return [line.split(":")[0].strip() for line in handle.readlines()[2:]] == ["lo"]
    except OSError:
        return False


def _record(address) -> None:
    outside.append(address)
    log = os.environ.get(LOG_ENV)
    if log and os.getpid() != _PYTEST_PID:
        with open(log, "a") as handle:
            handle.write(json.dumps({"pid": os.getpid(), "argv": sys.argv[:3], "address": repr(address)}) + "\n")


def _guarded(method, refused):
    def guarded(self, *args):
        address = args[-1] if method.__name__ == "sendto" else args[0]
        if self.family in (socket.AF_INET, socket.AF_INET6) and not on_this_machine(address) \
                and not _only_loopback():
            _record(address)
            return refused(address)
        return method(self, *args)
    return guarded


def _refuse(address):
    raise ConnectionRefusedError(errno.ECONNREFUSED, f"tests may not reach {address} (outside this machine)")


def install(pytest_pid: int | None = None) -> None:
    global _PYTEST_PID
    _PYTEST_PID = pytest_pid
    if getattr(socket.socket.connect, "_mecheval_guard", False):
        return
    for name, refused in (("connect", _refuse), ("connect_ex", lambda address: errno.ECONNREFUSED),
                          ("sendto", _refuse)):
        wrapped = _guarded(getattr(socket.socket, name), refused)
        wrapped._mecheval_guard = True
        setattr(socket.socket, name, wrapped)


_PYTEST_PID = None
if os.environ.get(LOG_ENV):            # a process a test started
    install()
