"""Reference for ``tests/test_replay_kernel.py``: the replay loop and journey segmentation as
plain Python loops (``_replay``, ``_segments``), which the numba kernels of
:mod:`bayes_latency.data.rebuild.kernel` must match.

``_replay`` applies the reference scheduling policy (decodes first, then running partial prefills in admission order, then the requests
scheduled at the step) to the journey segments of :mod:`.reconstruct_segments`, choosing each
segment's cached prefix when prefix caching is on, and returns the chunks as ``_Replay``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from bayes_latency.data.rebuild.segments import _GREEDY, _Segments


@dataclass
class _Replay:
    """Output of one replay pass."""

    m_step: list[int]
    m_seg: list[int]
    m_tok: list[int]
    m_done: list[int]
    h: np.ndarray
    ambiguous: np.ndarray
    amb_steps: set[int]
    dyn_complete: dict[int, int]
    pinned: list[int]
    issues: Counter


def _replay(seg: _Segments, s0: int, s1: int, ndec: np.ndarray, budget: int, block: int,
            caching: bool, guess: int | None, summary_total: dict[int, int]) -> _Replay:
    """Walk the steps once, splitting prefill/recompute tokens into chunks.

    With prefix caching, a segment's cached prefix ``h`` is chosen at its completion step:
    feasible values keep the last chunk in ``[1, budget_left]``; when several are feasible the
    choice is a guess (``guess``, else the smallest), adjusted so that the step's total matches
    a sampled summary, and raised when a later request of the same step would not fit.
    Segments whose ``h`` (or whose budget) depended on a guess are marked ambiguous.
    """
    n_seg = len(seg.req)
    total, comp, end = seg.total, seg.complete, seg.end
    starts: dict[int, list[int]] = {}
    for j in range(n_seg):
        starts.setdefault(seg.start[j], []).append(j)
    done = [0] * n_seg
    h = np.zeros(n_seg, dtype=np.int64)
    ambiguous = np.zeros(n_seg, dtype=bool)
    hmax = [((t - 1) // block) * block if caching else 0 for t in total]
    issues: Counter = Counter()
    m_step: list[int] = []
    m_seg: list[int] = []
    m_tok: list[int] = []
    m_done: list[int] = []
    amb_steps: set[int] = set()
    dyn_complete: dict[int, int] = {}
    dyn = [0] * (s1 - s0 + 2)  # (a list: read once per step, numpy scalars cost more)
    pinned: list[int] = []
    ndec_l = ndec.tolist()
    dyn_run = 0
    active: list[int] = []
    end_set = set(end)
    # result fields: seg, chunk, h (None before completion), completes, issue, lo, hi, guessed,
    # unsure (depends on a guess made earlier in the step or here)
    SEG, CHUNK, H, COMP, ISSUE, LO, HI, GUESS, UNSURE = range(9)

    def run_step(s: int, left: int, over: dict[int, int]) -> list[list]:
        out = []
        unsure = False
        for j in active:
            rem = total[j] - done[j]  # remaining with h = 0
            c_j = comp[j]
            if c_j == _GREEDY:
                chunk = min(rem, left)
                r = [j, chunk, None, chunk == rem and rem > 0, "", 0, 0, False, unsure]
            elif s < c_j:
                chunk = max(min(left, rem - 1), 0)
                r = [j, chunk, None, False, "completion_late" if rem - 1 < left else "",
                     0, 0, False, unsure]
            elif not caching:
                chunk = rem
                r = [j, chunk, 0, True, "chunk_over_budget" if rem > left else "", 0, 0, False,
                     unsure]
            else:
                lo = max(0, rem - left)
                lo = -(-lo // block) * block
                hi = min(rem - 1, hmax[j])
                hi = (hi // block) * block if hi >= 0 else -1
                issue, guessed = "", False
                if hi < 0:
                    hj = 0
                elif lo > hi:
                    hj, issue = hi, "chunk_over_budget"
                elif lo == hi:
                    hj = lo
                else:
                    guessed = True
                    g = over.get(j, lo if guess is None else guess)
                    hj = min(max((g // block) * block, lo), hi)
                unsure = unsure or guessed or bool(issue)
                chunk = rem - hj
                r = [j, chunk, hj, True, issue, lo, hi, guessed, unsure]
            out.append(r)
            left = max(left - chunk, 0)
        return out

    def refit(res: list[list], over: dict[int, int]) -> bool:
        """Raise earlier guesses so that an over-budget completion fits; True if changed."""
        bad = next((k for k, r in enumerate(res) if r[ISSUE] == "chunk_over_budget"), None)
        if bad is None:
            return False
        need = res[bad][LO] - res[bad][HI]
        changed = False
        for r in reversed(res[:bad]):
            if need <= 0:
                break
            if r[GUESS] and r[H] < r[HI]:
                up = min(r[HI], r[H] + -(-need // block) * block)
                need -= up - r[H]
                over[r[SEG]] = up
                changed = True
        return changed

    for s in range(s0, s1 + 1):
        i = s - s0
        dyn_run += dyn[i]
        new = starts.get(s)
        if new:
            active.extend(new)
        if not active:
            continue
        # a segment ends its last step before s: every active one has end >= s - 1 (the
        # previous step removed the others), so only one ending at s - 1 or a new one can be
        # past its end; the scan over the active ones runs only then
        if ((s - 1 in end_set or (new and any(end[j] < s for j in new)))
                and any(end[j] < s for j in active)):
            active = [j for j in active if end[j] >= s]
            if not active:
                continue
        n_dec = ndec_l[i] + dyn_run
        left = budget - n_dec
        if left < 0:
            issues["decodes_over_budget"] += 1
            left = 0
        over: dict[int, int] = {}
        res = run_step(s, left, over)
        if caching and any(r[GUESS] for r in res):
            if refit(res, over):
                res = run_step(s, left, over)
            if s in summary_total:
                delta = summary_total[s] - n_dec - sum(r[CHUNK] for r in res)
                if delta:
                    for r in res:
                        if r[GUESS] and delta:
                            want = min(max(int(round((r[H] - delta) / block)) * block, r[LO]),
                                       r[HI])
                            over[r[SEG]] = want
                            delta -= r[H] - want
                    res = run_step(s, left, over)
                    if refit(res, over):
                        res = run_step(s, left, over)
                guessed = [r for r in res if r[GUESS]]
                tot = n_dec + sum(r[CHUNK] for r in res)
                if (summary_total[s] == tot and len(guessed) == 1
                        and not any(r[ISSUE] for r in res)):
                    # pinned only if another h would have changed the step's total (it does not
                    # when a later request absorbs whatever budget is left)
                    g = guessed[0]
                    sensitive = True
                    for alt in (g[H] - block, g[H] + block):
                        if g[LO] <= alt <= g[HI]:
                            alt_res = run_step(s, left, {**over, g[SEG]: alt})
                            if n_dec + sum(r[CHUNK] for r in alt_res) == tot:
                                sensitive = False
                    if sensitive:
                        pinned.append(int(g[H]))
                        for r in res:  # nothing in this step is a guess any more
                            r[GUESS] = r[UNSURE] = False
        finished = []
        for r in res:
            j, chunk = r[SEG], r[CHUNK]
            if r[ISSUE]:
                issues[r[ISSUE]] += 1
            if chunk > 0:
                m_step.append(s)
                m_seg.append(j)
                m_tok.append(chunk)
                m_done.append(done[j])
                done[j] += chunk
            if r[H] is not None:
                h[j] = r[H]
                if r[UNSURE]:
                    ambiguous[j] = True
            if r[UNSURE]:
                amb_steps.add(s)
            if r[COMP]:
                finished.append(j)
                if comp[j] == _GREEDY:
                    dyn_complete[j] = s
                    if s + 1 <= end[j]:
                        dyn[s + 1 - s0] += 1
                        dyn[min(end[j], s1) + 1 - s0] -= 1
        if finished:
            fs = set(finished)
            active = [j for j in active if j not in fs]
    if caching:
        # segments that never completed (preempted or aborted during prefill, or greedy ones):
        # their cached prefix only shifts the offsets; use the guess, leaving >= 1 token to do
        for j in range(n_seg):
            if comp[j] != _GREEDY and comp[j] <= end[j]:
                continue
            if j in dyn_complete:
                continue
            room = ((total[j] - done[j] - 1) // block) * block
            h[j] = max(0, min(guess or 0, hmax[j], room))
            ambiguous[j] = True
    # flag every chunk step of an ambiguous segment (its offsets depend on the guess)
    if ambiguous.any():
        amb_seg = np.flatnonzero(ambiguous)
        ms = np.asarray(m_step, dtype=np.int64)
        sel = np.isin(np.asarray(m_seg, dtype=np.int64), amb_seg)
        amb_steps.update(ms[sel].tolist())
    return _Replay(m_step, m_seg, m_tok, m_done, h, ambiguous, amb_steps, dyn_complete, pinned,
                   issues)


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
