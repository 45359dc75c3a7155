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

_GREEDY = -1  # completion step unknown: plain greedy replay


@dataclass
class _Segments:
    """Scheduling segments (one per SCHEDULED event) as parallel lists."""

    req: list[int] = field(default_factory=list)
    start: list[int] = field(default_factory=list)
    end: list[int] = field(default_factory=list)
    total: list[int] = field(default_factory=list)  # prompt + outputs at schedule time
    d_r: list[int] = field(default_factory=list)  # outputs at schedule time
    complete: list[int] = field(default_factory=list)  # completion step, _GREEDY, or end+1


def _segments(ev: Any, last_step: int, issues: Counter) -> _Segments:
    """Cut each request's journey into scheduling segments (sorted by start, admission order);
    ``ev``: a frame or a mapping of arrays with ``_req, event, step, prefill_total,
    decode_done``, rows in journey order."""
    seg = _Segments()
    # Python lists: the loop below reads them one element at a time (numpy scalars cost more)
    req = np.asarray(ev["_req"]).tolist()
    kind = np.asarray(ev["event"]).tolist()
    step = np.asarray(ev["step"], dtype=np.int64).tolist()
    ptot = np.asarray(ev["prefill_total"], dtype=np.int64).tolist()
    ddone = np.asarray(ev["decode_done"], dtype=np.int64).tolist()
    n = len(req)
    open_ = False
    s_start = s_tot = s_dr = 0
    s_ft = -1
    cur = -1

    def close(end: int, d_end: int | None) -> None:
        nonlocal open_
        open_ = False
        if end < s_start:
            issues["empty_segment"] += 1
            return
        end = min(end, last_step)
        if s_ft >= 0:
            comp = s_ft
            if d_end is not None and d_end - s_dr > 0 and end - (d_end - s_dr) + 1 != s_ft:
                issues["decode_count_mismatch"] += 1
        elif d_end is not None:
            produced = d_end - s_dr
            comp = end + 1 if produced <= 0 else end - produced + 1
            if comp < s_start:
                issues["completion_before_schedule"] += 1
                comp = _GREEDY
        else:
            comp = _GREEDY
        seg.req.append(cur)
        seg.start.append(s_start)
        seg.end.append(end)
        seg.total.append(s_tot)
        seg.d_r.append(s_dr)
        seg.complete.append(comp)

    for i in range(n):
        r = req[i]
        if r != cur:
            if open_:
                close(last_step, None)
                issues["unfinished_request"] += 1
            cur = r
        k = kind[i]
        if k == "SCHEDULED":
            if open_:
                issues["missing_preempted"] += 1
                close(step[i] - 1, None)
            open_ = True
            s_start, s_dr, s_ft = int(step[i]), int(ddone[i]), -1
            s_tot = int(ptot[i]) + s_dr
        elif k == "FIRST_TOKEN":
            if open_ and s_ft < 0:
                s_ft = int(step[i])
            else:
                issues["orphan_first_token"] += 1
        elif k == "PREEMPTED":
            if open_:
                close(int(step[i]) - 1, int(ddone[i]))
            else:
                issues["orphan_preempted"] += 1
        elif k == "FINISHED":
            if open_:
                close(int(step[i]), int(ddone[i]))
    if open_:
        close(last_step, None)
        issues["unfinished_request"] += 1
    return seg


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
