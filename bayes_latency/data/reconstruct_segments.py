"""Journey segments: each request's journey cut into scheduling segments, and per-step interval sums.

Part of :mod:`bayes_latency.data.reconstruct`: a segment runs from a ``SCHEDULED`` event (first
schedule or resume) to the next ``PREEMPTED`` or ``FINISHED``; its completion step (prefill or
recompute done) comes from ``FIRST_TOKEN`` or from the tokens produced before the segment's end,
else it is ``_GREEDY`` (left to the replay, :mod:`.reconstruct_replay`). ``_interval_sums`` turns
decode intervals into per-step counts and context sums.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

_GREEDY = -1  # completion step unknown: plain greedy replay
# event ranks (the same as reconstruct._EVENT_RANK)
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


def _segments(ev: Any, last_step: int, issues: Counter) -> _Segments:
    """Cut each request's journey into scheduling segments (in journey order: by request, then
    start); ``ev``: a frame or a mapping of arrays with ``_req, event, step, prefill_total,
    decode_done`` (and optionally ``_rank``, the event's rank in ``reconstruct._EVENT_RANK``),
    rows sorted by request, step and rank; the issues met are added to ``issues``.

    The loop runs compiled (:func:`.reconstruct_kernel.segments_kernel`); ``sched`` holds, per
    segment, the row of the last ``SCHEDULED`` event of its request at its start step (the
    admission-order key).
    """
    from bayes_latency.data.reconstruct_kernel import SEGMENT_ISSUES, segments_kernel

    if "_rank" in ev:
        rank = np.asarray(ev["_rank"], dtype=np.int64)
    else:
        rank = pd.Index(list(_RANK)).get_indexer(np.asarray(ev["event"], dtype=object))
    out, issue_n, issue_first = segments_kernel(
        np.asarray(ev["_req"], dtype=np.int64), np.ascontiguousarray(rank, dtype=np.int64),
        np.asarray(ev["step"], dtype=np.int64), np.asarray(ev["prefill_total"], dtype=np.int64),
        np.asarray(ev["decode_done"], dtype=np.int64), int(last_step))
    for c in sorted(range(len(SEGMENT_ISSUES)), key=lambda c: issue_first[c]):
        if issue_n[c]:  # in order of first occurrence, as the loop counted them
            issues[SEGMENT_ISSUES[c]] += int(issue_n[c])
    return _Segments(req=out[0], start=out[1], end=out[2], total=out[3], d_r=out[4],
                     complete=out[5], sched=out[6])


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
