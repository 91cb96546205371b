"""Tests stay on this machine: the guard of conftest.py, and the Ray launcher's local, silent cluster."""
import errno
import json
import os
import socket
import subprocess
import sys
import types

import pytest


def test_the_guard_refuses_addresses_outside_this_machine(guard):
    sock = socket.socket()
    sock.settimeout(1)
    with pytest.raises(ConnectionRefusedError):
        sock.connect(("192.0.2.1", 80))           # TEST-NET-1: reserved, never anyone's host
    assert sock.connect_ex(("192.0.2.1", 80)) != 0
    assert guard.outside == [("192.0.2.1", 80)] * 2
    guard.outside.clear()                        # this test made the attempts on purpose
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    client = socket.socket()
    client.connect(server.getsockname())         # loopback is this machine
    client.close()
    server.close()
    sock.close()


def test_the_guard_holds_in_processes_a_test_starts(tmp_path, guard):
    """Every Python process a test starts loads the same guard (PYTHONPATH, sitecustomize) and
    records what it tried in the file conftest.py reads after each test (here a file of its own,
    since the attempt is on purpose)."""
    log = tmp_path / "attempts.jsonl"
    probe = ("import socket\ns = socket.socket()\ntry:\n    s.connect(('192.0.2.1', 80))\n"
             "except ConnectionRefusedError as e:\n    print('refused', e)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                          env={**os.environ, guard.LOG_ENV: str(log)})
    assert done.stdout.startswith("refused") and "outside this machine" in done.stdout, done
    (attempt,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert attempt["address"] == "('192.0.2.1', 80)"


def _fake_ray(calls):
    return types.SimpleNamespace(
        is_initialized=lambda: False, shutdown=lambda: None, remote=lambda **kwargs: (lambda f: f),
        init=lambda **kwargs: calls.append((kwargs, os.environ.get("RAY_USAGE_STATS_ENABLED"))))


def test_the_ray_launcher_joins_the_cluster_ray_address_names_without_usage_statistics(monkeypatch):
    from hf_mecheval.training.launchers import run_jobs

    calls = []
    monkeypatch.setitem(sys.modules, "ray", _fake_ray(calls))
    monkeypatch.delenv("RAY_USAGE_STATS_ENABLED", raising=False)
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    assert run_jobs("ray", [], "runs", 1, [None], False, None) == []
    (kwargs, stats), = calls
    assert stats == "0" and "address" not in kwargs and kwargs["include_dashboard"] is False


def test_the_ray_launcher_refuses_a_local_cluster_where_it_cannot_close_the_network(monkeypatch):
    from hf_mecheval import closed_network
    from hf_mecheval.errors import MechEvalError
    from hf_mecheval.training.jobs import Run
    from hf_mecheval.training.launchers import run_jobs

    calls = []
    monkeypatch.setitem(sys.modules, "ray", _fake_ray(calls))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(closed_network, "unavailable", lambda: "user namespaces are disabled here")
    with pytest.raises(MechEvalError, match="disabled here. Use --launcher local on one machine, or start a Ray "
                                            "cluster yourself and set RAY_ADDRESS"):
        run_jobs("ray", [Run("r", {})], "runs", 1, [None], False, None)
    assert calls == []            # no cluster started here, open to the network


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="network namespaces are Linux's")
def test_a_closed_command_sees_only_loopback_and_reaches_nothing_else(guard):
    from hf_mecheval import closed_network

    if closed_network.unavailable():
        pytest.skip(f"no user namespaces here: {closed_network.unavailable()}")
    probe = ("import socket\nfrom hf_mecheval import closed_network as c\nc.bring_loopback_up()\n"
             "print(c.interfaces())\nserver = socket.socket(); server.bind(('127.0.0.1', 0)); server.listen()\n"
             "socket.create_connection(server.getsockname(), timeout=5).close()\n"
             "try:\n    socket.create_connection(('192.0.2.1', 80), timeout=5)\n"
             "except OSError as e:\n    print(e.errno)\n")
    env = {k: v for k, v in os.environ.items() if k != guard.LOG_ENV}
    done = subprocess.run(closed_network.closed_command([sys.executable, "-c", probe]), capture_output=True,
                          text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["['lo']", str(errno.ENETUNREACH)]
