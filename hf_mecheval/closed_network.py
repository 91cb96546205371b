"""Run a command where the network is this machine's loopback and nothing else.

Ray (2.60) binds its GCS, raylet and worker gRPC servers to every interface whatever node
address it is given, and always starts its API server and a per-node agent, which look up cloud
metadata addresses: a local cluster is an unauthenticated service open to the network. A sweep's
local Ray cluster therefore runs in a private Linux network namespace (``unshare --user --net``,
no privileges needed where user namespaces are enabled) holding only a loopback interface: its
processes talk to each other over 127.0.0.1, nothing outside can reach them, and they can reach
nothing outside (a connection to another address fails with "network unreachable").

Standard library only: the namespace's first process imports this before anything heavy.
"""
from __future__ import annotations

import fcntl
import shutil
import socket
import struct
import subprocess

_UNSHARE = ("--user", "--map-root-user", "--net", "--")
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def unavailable() -> str | None:
    """Why this machine cannot give a process a loopback-only network, or None when it can."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return "the unshare command (util-linux) is not installed"
    try:
        done = subprocess.run([unshare, *_UNSHARE, "true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare failed: {exc}"
    if done.returncode != 0:
        return f"unshare --user --net failed ({done.stderr.strip() or done.returncode}): user namespaces are disabled here"
    return None


def closed_command(cmd: list[str]) -> list[str]:
    """``cmd`` run in a new user and network namespace (check ``unavailable`` first). The command
    must call ``bring_loopback_up`` before it uses the network: a new namespace's loopback is down."""
    return [shutil.which("unshare") or "unshare", *_UNSHARE, *cmd]


def bring_loopback_up() -> None:
    """Switch on this namespace's loopback interface (``ip link set lo up`` without needing ``ip``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sh22x", b"lo", 0)                  # struct ifreq: name, flags
        flags = struct.unpack("16sh22x", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", flags | _IFF_UP))


def interfaces(pid: int | str = "self") -> list[str]:
    """The network interfaces process ``pid`` sees (its namespace's, from ``/proc/PID/net/dev``)."""
    with open(f"/proc/{pid}/net/dev") as handle:
        return [line.split(":")[0].strip() for line in handle.readlines()[2:]]
