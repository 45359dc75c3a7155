"""The machine a command or benchmark measured on, worded once for every report.

A timing means little without the machine behind it: the demo's README, the client study's
``parts.json``, the few-shot study and the benchmarks' reports all name the CPU model, the number
of cores and the 1-minute load average at the start and at the end of the run
(:func:`machine_line`). A fit's time also depends on what PyTensor's on-disk cache of compiled
model code holds (:func:`compile_cache_state`): a machine's first fit compiles everything.
"""

from __future__ import annotations

import math
import os
import platform
from pathlib import Path

__all__ = ["compile_cache_state", "cpu_model", "load_average", "machine_line"]


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def load_average() -> float:
    """1-minute load average (NaN where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # platforms without a load average
        return math.nan


def machine_line(load_start: float, load_end: float | None = None) -> str:
    """``CPU, N cores, 1-minute load average A at the start and B at the end``; ``load_end``
    defaults to the load average now."""
    end = load_average() if load_end is None else load_end
    return (f"{cpu_model()}, {os.cpu_count()} cores, 1-minute load average "
            f"{load_start:.1f} at the start and {end:.1f} at the end")


def compile_cache_state() -> str:
    """What PyTensor's on-disk cache of Numba-compiled model code holds, in words: ``"empty (a
    machine's first fit compiles the model from scratch)"`` or ``"N compiled functions"``."""
    try:
        from pytensor.link.numba.cache import NUMBA_CACHE_PATH
    except ImportError:  # another PyTensor layout: say nothing rather than guess
        return "not known"
    d = Path(NUMBA_CACHE_PATH)
    n = sum(1 for _ in d.glob("*.nbi")) if d.is_dir() else 0
    return ("empty (a machine's first fit compiles the model from scratch)" if n == 0
            else f"{n:,} compiled functions")
