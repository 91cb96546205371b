"""Whether a job fits in this machine's memory, asked before the job starts: a size that cannot
fit (a typo such as a hidden size of 10^9, or 10^12 documents) is one clear error with the
estimate, rather than an allocation failure deep inside numpy or torch, or a machine swapping.

Estimates are rough (what dominates: parameters with their optimizer state, activations, the
documents) and only refuse what is clearly beyond the machine; they never tune anything.
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
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            limits.append(int(text))
    return min(limits) if limits else None


def format_bytes(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} EiB"


def check_memory(what: str, parts: dict[str, float], limit: int | None = None) -> None:
    """Refuse ``what`` when the estimated bytes ``parts`` (named) add up to more than ``limit``
    (default: ``memory_limit()``)."""
    limit = memory_limit() if limit is None else limit
    total = sum(parts.values())
    if limit is not None and total > limit:
        shown = ", ".join(f"{name} {format_bytes(v)}" for name, v in parts.items() if v >= 0.01 * total)
        raise MechEvalError(f"{what} would need about {format_bytes(total)} of memory ({shown}), more than the "
                            f"{format_bytes(limit)} this machine has; choose smaller sizes")
