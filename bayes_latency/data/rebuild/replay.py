"""The two compiled passes of the batch rebuild: cutting journeys into segments, then the replay.

Part of :mod:`bayes_latency.data.rebuild.reconstruct`: ``_segments`` cuts each request's journey
into scheduling segments (:func:`.kernel.segments_kernel`); ``_replay`` applies the reference scheduling
policy (decodes first, then running partial prefills in admission order, then the requests
scheduled at the step) to the journey segments of :mod:`.segments`, choosing each
segment's cached prefix when prefix caching is on, and returns the chunks as ``_Replay``.

Both loops run compiled: :func:`.kernel.replay_kernel` (numba over flat
int64 arrays), imported at the first replay so that importing the package does not load numba.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from bayes_latency.data.rebuild.segments import _RANK, _Segments

# the kernel's issue codes (0: none) and their report names
_ISSUE_NAMES = {1: "completion_late", 2: "chunk_over_budget", 3: "decodes_over_budget"}


@dataclass
class _Replay:
    """Output of one replay pass.

    ``m_*``: one entry per chunk (step, segment, tokens, tokens done before it), in replay
    order; ``h`` / ``ambiguous``: cached prefix and guess flag per segment; ``amb_steps``:
    sorted step ids whose chunks depend on a guess; ``dyn_complete``: per segment, the step at
    which the replay completed a ``_GREEDY`` segment, else ``_GREEDY``; ``pinned``: cached
    prefixes pinned by summaries, in order.
    """

    m_step: np.ndarray
    m_seg: np.ndarray
    m_tok: np.ndarray
    m_done: np.ndarray
    h: np.ndarray
    ambiguous: np.ndarray
    amb_steps: np.ndarray
    dyn_complete: np.ndarray
    pinned: np.ndarray
    issues: Counter


def _segments(ev: Any, last_step: int, issues: Counter) -> _Segments:
    """Cut each request's journey into scheduling segments (in journey order: by request, then
    start); ``ev``: a frame or a mapping of arrays with ``_req, event, step, prefill_total,
    decode_done`` (and optionally ``_rank``, the event's rank in ``segments._RANK``),
    rows sorted by request, step and rank; the issues met are added to ``issues``.

    The loop runs compiled (:func:`.kernel.segments_kernel`); ``sched`` holds, per
    segment, the row of the last ``SCHEDULED`` event of its request at its start step (the
    admission-order key).
    """
    from bayes_latency.data.rebuild.kernel import (  # numba: loaded on use
        SEGMENT_ISSUES,
        segments_kernel,
    )

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


def _replay(seg: _Segments, s0: int, s1: int, ndec: np.ndarray, budget: int, block: int,
            caching: bool, guess: int | None, summary_total: dict[int, int]) -> _Replay:
    """Walk the steps once, splitting prefill/recompute tokens into chunks.

    With prefix caching, a segment's cached prefix ``h`` is chosen at its completion step:
    feasible values keep the last chunk in ``[1, budget_left]``; when several are feasible the
    choice is a guess (``guess``, else the smallest), adjusted so that the step's total matches
    a sampled summary, and raised when a later request of the same step would not fit.
    Segments whose ``h`` (or whose budget) depended on a guess are marked ambiguous.
    """
    n = max(s1 - s0 + 1, 0)
    sum_has = np.zeros(n, dtype=np.bool_)
    sum_val = np.zeros(n, dtype=np.int64)
    if summary_total:
        keys = np.fromiter(summary_total.keys(), dtype=np.int64, count=len(summary_total))
        vals = np.fromiter(summary_total.values(), dtype=np.int64, count=len(summary_total))
        inside = (keys >= s0) & (keys <= s1)
        sum_has[keys[inside] - s0] = True
        sum_val[keys[inside] - s0] = vals[inside]
    from bayes_latency.data.rebuild.kernel import replay_kernel  # numba: loaded on use

    out = replay_kernel(
        np.asarray(seg.start, dtype=np.int64), np.asarray(seg.end, dtype=np.int64),
        np.asarray(seg.total, dtype=np.int64), np.asarray(seg.complete, dtype=np.int64),
        int(s0), int(s1), np.ascontiguousarray(ndec, dtype=np.int64), int(budget), int(block),
        bool(caching), -1 if guess is None else int(guess), sum_has, sum_val)
    m_step, m_seg, m_tok, m_done, h, ambiguous, amb_steps, dyn_complete, pinned = out[:9]
    issue_n, issue_first = out[9], out[10]
    issues: Counter = Counter()
    for c in sorted(_ISSUE_NAMES, key=lambda c: issue_first[c]):  # first occurrence order
        if issue_n[c]:
            issues[_ISSUE_NAMES[c]] = int(issue_n[c])
    return _Replay(m_step, m_seg, m_tok, m_done, h, ambiguous, amb_steps, dyn_complete, pinned,
                   issues)
