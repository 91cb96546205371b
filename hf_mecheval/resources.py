"""Whether a job fits in this machine's memory, asked before the job starts: a size that cannot
fit (a typo such as a hidden size of 10^9, or 10^12 documents) is one clear error with the
estimate, rather than an allocation failure deep inside numpy or torch, or a machine swapping.

Estimates are rough (what dominates: parameters with their optimizer state, activations, the
documents) and only refuse what is clearly beyond the machine; they never tune anything. The
one exception is the intervention grid, whose memory depends on a model's internals: it measures
one document and lowers its batch size to fit what is available now (interventions/memory.py).
"""
from __future__ import annotations

import os
from pathlib import Path

from .errors import MechEvalError


def memory_limit() -> int | None:
    """Bytes of memory this process may use: the machine's physical memory, or a smaller limit
    of its container (cgroup); None where neither can be read."""
    limits = []
    try:
        limits.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        cap = _read_int(path)            # "max" (no limit) reads as None
        if cap is not None:
            limits.append(cap)
    return min(limits) if limits else None


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def memory_available() -> int | None:
    """Bytes this process may still take without pushing the machine (or its container) into
    swap or the OOM killer: the kernel's estimate (MemAvailable in /proc/meminfo, which counts
    reclaimable caches as available) and the container's limit less its usage, never more than
    ``memory_limit()``; where neither estimate can be read (not Linux), psutil's if it is
    installed, else ``memory_limit()``. None where nothing can be read."""
    found = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)          # reported in kB
    except (OSError, ValueError, IndexError):
        pass
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        cap, used = _read_int(limit_file), _read_int(usage_file)
        if cap is not None and used is not None:
            found.append(max(0, cap - used))
    if not found:
        try:
            import psutil
            found.append(int(psutil.virtual_memory().available))
        except (ImportError, OSError, AttributeError):
            pass
    limit = memory_limit()
    if limit is not None:
        found.append(limit)
    return min(found) if found else None


def format_bytes(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} EiB"


def check_memory(what: str, parts: dict[str, float], limit: int | None = None, *,
                 has: str = "this machine has", advice: str = "choose smaller sizes") -> None:
    """Refuse ``what`` when the estimated bytes ``parts`` (named) add up to more than ``limit``
    (default: ``memory_limit()``). The message says "more than the <limit> <has>; <advice>"."""
    limit = memory_limit() if limit is None else limit
    total = sum(parts.values())
    if limit is not None and total > limit:
        shown = ", ".join(f"{name} {format_bytes(v)}" for name, v in parts.items() if v >= 0.01 * total)
        raise MechEvalError(f"{what} would need about {format_bytes(total)} of memory ({shown}), more than the "
                            f"{format_bytes(limit)} {has}; {advice}")
