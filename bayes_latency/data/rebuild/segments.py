"""Journey segments: each request's journey cut into scheduling segments, and per-step interval sums.

Part of :mod:`bayes_latency.data.rebuild.reconstruct`: a segment runs from a ``SCHEDULED`` event (first
schedule or resume) to the next ``PREEMPTED`` or ``FINISHED``; its completion step (prefill or
recompute done) comes from ``FIRST_TOKEN`` or from the tokens produced before the segment's end,
else it is ``_GREEDY`` (left to the replay, :mod:`.replay`). ``_interval_sums`` turns
decode intervals into per-step counts and context sums.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

_GREEDY = -1  # completion step unknown: plain greedy replay
# event ranks: the order of events of one request at one step
_RANK = {"QUEUED": 0, "PREEMPTED": 1, "SCHEDULED": 2, "FIRST_TOKEN": 3, "FINISHED": 4}


@dataclass
class _Segments:
    """Scheduling segments (one per SCHEDULED event) as parallel int64 arrays (or lists)."""

    req: Any = field(default_factory=list)
    start: Any = field(default_factory=list)
    end: Any = field(default_factory=list)
    total: Any = field(default_factory=list)  # prompt + outputs at schedule time
    d_r: Any = field(default_factory=list)  # outputs at schedule time
    complete: Any = field(default_factory=list)  # completion step, _GREEDY, or end+1
    sched: Any = field(default_factory=list)  # journey row of the admission-order key


def _interval_sums(first: np.ndarray, last: np.ndarray, base: np.ndarray, s0: int,
                   n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per step s: count of intervals [first, last] covering s, and sum of base + (s - first).

    ``base`` is the value at the interval's first step; the value grows by one per step.
    """
    keep = last >= first
    first, last, base = first[keep] - s0, last[keep] - s0, base[keep]
    cnt = np.zeros(n + 1, dtype=np.int64)
    np.add.at(cnt, first, 1)
    np.add.at(cnt, last + 1, -1)
    cnt = np.cumsum(cnt)[:n]
    const = np.zeros(n + 1, dtype=np.float64)
    np.add.at(const, first, (base - first).astype(np.float64))
    np.add.at(const, last + 1, -(base - first).astype(np.float64))
    const = np.cumsum(const)[:n]
    return cnt, const + np.arange(n) * cnt
