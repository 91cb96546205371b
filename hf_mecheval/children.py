"""Child processes that never outlive the process that started them.

A sweep starts every training (and evaluation) process with ``run_child``: the child gets its
own process group, so stopping it stops everything it started, and is told its parent's pid.
The child calls ``follow_parent`` first thing: when the parent dies — even by ``kill -9``, which
runs no clean-up in the parent — the kernel sends the child SIGTERM (Linux ``PR_SET_PDEATHSIG``;
elsewhere a thread watches the parent), and the child then takes its whole process group down.
Without this a killed sweep leaves its trainings running, and a re-run writes into the same runs.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading

PARENT_ENV = "MECHEVAL_PARENT_PID"
_PR_SET_PDEATHSIG = 1

_live: dict[int, subprocess.Popen] = {}
_live_lock = threading.Lock()


def run_child(cmd: list[str], stdout, env: dict) -> int:
    """``subprocess.run(cmd)`` (stderr into ``stdout``) in its own process group, stopped with
    its parent (see the module docstring); returns the exit status."""
    proc = subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.STDOUT, env={**env, PARENT_ENV: str(os.getpid())},
                            start_new_session=True)
    with _live_lock:
        _live[proc.pid] = proc
    try:
        return proc.wait()
    finally:
        with _live_lock:
            _live.pop(proc.pid, None)


def stop_children(sig: int = signal.SIGTERM) -> None:
    """Stop every child ``run_child`` started that is still running, with its process group."""
    with _live_lock:
        pids = list(_live)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)


def _stop_group(signum=None, frame=None) -> None:
    """Stop this process's group: this process (it leads the group) and everything it started."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.killpg(os.getpgrp(), signal.SIGTERM)


def follow_parent() -> None:
    """In a process started by ``run_child``: stop, with everything it started, when the parent
    dies. Does nothing in a process started otherwise."""
    parent = os.environ.pop(PARENT_ENV, None)       # not inherited by what this process starts
    if parent is None or not parent.isdigit():
        return
    parent = int(parent)
    if os.getpgrp() == os.getpid():                  # a group of its own: SIGTERM takes it all down
        signal.signal(signal.SIGTERM, _stop_group)
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    else:
        def watch():
            import time

            while os.getppid() == parent:
                time.sleep(1.0)
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=watch, daemon=True, name="follow-parent").start()
    if os.getppid() != parent:                       # it died before the signal was asked for
        os.kill(os.getpid(), signal.SIGTERM)
