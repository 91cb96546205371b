"""Tests stay on this machine: the guard of conftest.py, and the Ray launcher's local, silent cluster."""
import socket
import sys
import types

import pytest

import conftest


def test_the_guard_refuses_addresses_outside_this_machine():
    sock = socket.socket()
    sock.settimeout(1)
    with pytest.raises(ConnectionRefusedError):
        sock.connect(("192.0.2.1", 80))           # TEST-NET-1: reserved, never anyone's host
    assert sock.connect_ex(("192.0.2.1", 80)) != 0
    assert conftest._outside == [("192.0.2.1", 80)] * 2
    conftest._outside.clear()                    # this test made the attempts on purpose
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    client = socket.socket()
    client.connect(server.getsockname())         # loopback is this machine
    client.close()
    server.close()
    sock.close()


def test_the_ray_launcher_starts_a_local_cluster_without_usage_statistics(monkeypatch):
    from hf_mecheval.training.sweep import _launch_ray

    calls = []
    fake = types.SimpleNamespace(
        is_initialized=lambda: False, shutdown=lambda: None, remote=lambda **kwargs: (lambda f: f),
        init=lambda **kwargs: calls.append((kwargs, __import__("os").environ.get("RAY_USAGE_STATS_ENABLED"))))
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.delenv("RAY_USAGE_STATS_ENABLED", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert _launch_ray([], "runs", 1, False, 0) == []
    (kwargs, stats), = calls
    assert stats == "0" and kwargs["address"] == "local" and kwargs["include_dashboard"] is False
