"""The batch rebuild's loops compiled with numba: the replay of :mod:`.replay`
and the journey segments of :mod:`.segments`.

:func:`replay_kernel` is a line-by-line port of the pure-Python loop it replaced (kept as
``tests/replay_reference.py``): the same order of operations and the same integer arithmetic
(Python's floor division; the one ``round`` of a float ratio as ``np.rint``, both round half to
even), so its outputs are identical; ``tests/test_replay_kernel.py`` compares the two on drawn
segments with and without prefix caching, guesses and sampled summaries. The active segments are
an array with a length, the per-step ``over`` overrides a stamp array (an override is set when its
stamp is the current step), each step's results arrays indexed like the active list; the chunks
grow by doubling. Issues are counted per code with the order of their first occurrence (the
caller rebuilds the ``Counter`` in that order). :func:`segments_kernel` is the same kind of port
of the segment cutting, and also returns each segment's ``SCHEDULED`` row (the admission-order
key the caller sorts by).

Compiled on first use and cached on disk (``cache=True``): with an empty cache the first rebuild
compiles both for 10-12 CPU-seconds; in a fresh process, loading numba and the cached code costs
about 0.45-0.5 CPU-seconds (numba's import and its LLVM start-up, shared with any other compiled
code of the process, e.g. :mod:`bayes_latency.schedule.loop`); ``benchmarks/ingest_scale.py``
part 1 measures both.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from bayes_latency.data.rebuild.segments import _GREEDY

# issue codes (0: none); names in replay._ISSUE_NAMES
_LATE, _OVER, _DEC_OVER = 1, 2, 3


@njit(cache=True)
def _run_step(s, left, caching, guess, block, act, n_act, total, done, comp, hmax, ov_stamp,
              ov_val, o_chunk, o_h, o_has_h, o_comp, o_issue, o_lo, o_hi, o_guess,
              o_unsure):  # pragma: no cover - compiled
    """Chunks of the active segments at step ``s`` with ``left`` tokens of budget, written to
    the ``o_*`` arrays at the active list's positions (the Python loop's ``run_step``)."""
    unsure = False
    for k in range(n_act):
        j = act[k]
        rem = total[j] - done[j]  # remaining with h = 0
        c_j = comp[j]
        hj = 0
        lo = 0
        hi = 0
        has_h = False
        completes = False
        guessed = False
        issue = 0
        if c_j == _GREEDY:
            chunk = min(rem, left)
            completes = chunk == rem and rem > 0
        elif s < c_j:
            chunk = max(min(left, rem - 1), 0)
            if rem - 1 < left:
                issue = _LATE
        elif not caching:
            chunk = rem
            has_h = True
            completes = True
            if rem > left:
                issue = _OVER
        else:
            lo = max(0, rem - left)
            lo = -(-lo // block) * block
            hi = min(rem - 1, hmax[j])
            hi = (hi // block) * block if hi >= 0 else -1
            if hi < 0:
                hj = 0
            elif lo > hi:
                hj = hi
                issue = _OVER
            elif lo == hi:
                hj = lo
            else:
                guessed = True
                if ov_stamp[j] == s:
                    g = ov_val[j]
                elif guess < 0:
                    g = lo
                else:
                    g = guess
                hj = min(max((g // block) * block, lo), hi)
            unsure = unsure or guessed or issue != 0
            chunk = rem - hj
            has_h = True
            completes = True
        o_chunk[k] = chunk
        o_h[k] = hj
        o_has_h[k] = has_h
        o_comp[k] = completes
        o_issue[k] = issue
        o_lo[k] = lo
        o_hi[k] = hi
        o_guess[k] = guessed
        o_unsure[k] = unsure
        left = max(left - chunk, 0)


@njit(cache=True)
def _refit(s, block, act, n_act, o_h, o_issue, o_lo, o_hi, o_guess, ov_stamp,
           ov_val):  # pragma: no cover - compiled
    """Raise earlier guesses so that an over-budget completion fits; True if changed."""
    bad = -1
    for k in range(n_act):
        if o_issue[k] == _OVER:
            bad = k
            break
    if bad < 0:
        return False
    need = o_lo[bad] - o_hi[bad]
    changed = False
    for k in range(bad - 1, -1, -1):
        if need <= 0:
            break
        if o_guess[k] and o_h[k] < o_hi[k]:
            up = min(o_hi[k], o_h[k] + -(-need // block) * block)
            need -= up - o_h[k]
            ov_stamp[act[k]] = s
            ov_val[act[k]] = up
            changed = True
    return changed


@njit(cache=True)
def _grow(a, n):  # pragma: no cover - compiled
    out = np.empty(2 * len(a) + 16, dtype=a.dtype)
    out[:n] = a[:n]
    return out


@njit(cache=True)
def replay_kernel(start, end, total, comp, s0, s1, ndec, budget, block, caching, guess,
                   sum_has, sum_val):  # pragma: no cover - compiled
    """The replay over flat arrays (see :func:`.replay._replay`); ``guess`` < 0 for none, ``sum_has``
    / ``sum_val`` the sampled summaries' totals per step ``s0..s1``."""
    n_seg = len(total)
    n = s1 - s0 + 1
    ov_none = -(1 << 62)
    done = np.zeros(n_seg, dtype=np.int64)
    h = np.zeros(n_seg, dtype=np.int64)
    ambiguous = np.zeros(n_seg, dtype=np.bool_)
    hmax = np.zeros(n_seg, dtype=np.int64)
    if caching:
        for j in range(n_seg):
            hmax[j] = ((total[j] - 1) // block) * block
    issue_n = np.zeros(4, dtype=np.int64)
    issue_first = np.full(4, 1 << 62, dtype=np.int64)
    n_issue_events = 0
    cap = 2 * n_seg + 16
    m_step = np.empty(cap, dtype=np.int64)
    m_seg = np.empty(cap, dtype=np.int64)
    m_tok = np.empty(cap, dtype=np.int64)
    m_done = np.empty(cap, dtype=np.int64)
    n_m = 0
    amb_step = np.zeros(max(n, 0), dtype=np.bool_)
    dyn_complete = np.full(n_seg, _GREEDY, dtype=np.int64)
    dyn_has = np.zeros(n_seg, dtype=np.bool_)
    dyn = np.zeros(max(n + 1, 1), dtype=np.int64)
    pinned = np.empty(max(n, 0), dtype=np.int64)
    n_pinned = 0
    # s - 1 in the set of segment ends, for s0 <= s <= s1
    is_end = np.zeros(max(n, 0) + 1, dtype=np.bool_)
    for j in range(n_seg):
        if s0 - 1 <= end[j] <= s1 - 1:
            is_end[end[j] - (s0 - 1)] = True
    by_start = np.argsort(start, kind="mergesort")  # segments of one start in index order
    p = 0
    act = np.empty(n_seg, dtype=np.int64)
    n_act = 0
    ov_stamp = np.full(n_seg, ov_none, dtype=np.int64)
    ov_val = np.zeros(n_seg, dtype=np.int64)
    fin = np.zeros(n_seg, dtype=np.bool_)
    # results of the step (o_*) and of the alternative tried for pinning (a_*)
    o_chunk = np.zeros(n_seg, dtype=np.int64)
    o_h = np.zeros(n_seg, dtype=np.int64)
    o_has_h = np.zeros(n_seg, dtype=np.bool_)
    o_comp = np.zeros(n_seg, dtype=np.bool_)
    o_issue = np.zeros(n_seg, dtype=np.int64)
    o_lo = np.zeros(n_seg, dtype=np.int64)
    o_hi = np.zeros(n_seg, dtype=np.int64)
    o_guess = np.zeros(n_seg, dtype=np.bool_)
    o_unsure = np.zeros(n_seg, dtype=np.bool_)
    a_chunk = np.zeros(n_seg, dtype=np.int64)
    a_h = np.zeros(n_seg, dtype=np.int64)
    a_has_h = np.zeros(n_seg, dtype=np.bool_)
    a_comp = np.zeros(n_seg, dtype=np.bool_)
    a_issue = np.zeros(n_seg, dtype=np.int64)
    a_lo = np.zeros(n_seg, dtype=np.int64)
    a_hi = np.zeros(n_seg, dtype=np.int64)
    a_guess = np.zeros(n_seg, dtype=np.bool_)
    a_unsure = np.zeros(n_seg, dtype=np.bool_)
    dyn_run = 0
    for s in range(s0, s1 + 1):
        i = s - s0
        dyn_run += dyn[i]
        while p < n_seg and start[by_start[p]] < s:
            p += 1
        new_past_end = False
        while p < n_seg and start[by_start[p]] == s:
            j = by_start[p]
            act[n_act] = j
            n_act += 1
            if end[j] < s:
                new_past_end = True
            p += 1
        if n_act == 0:
            continue
        if is_end[i] or new_past_end:
            any_past = False
            for k in range(n_act):
                if end[act[k]] < s:
                    any_past = True
                    break
            if any_past:
                m = 0
                for k in range(n_act):
                    if end[act[k]] >= s:
                        act[m] = act[k]
                        m += 1
                n_act = m
                if n_act == 0:
                    continue
        n_dec = ndec[i] + dyn_run
        left = budget - n_dec
        if left < 0:
            if issue_n[_DEC_OVER] == 0:
                issue_first[_DEC_OVER] = n_issue_events
            issue_n[_DEC_OVER] += 1
            n_issue_events += 1
            left = 0
        _run_step(s, left, caching, guess, block, act, n_act, total, done, comp, hmax,
                  ov_stamp, ov_val, o_chunk, o_h, o_has_h, o_comp, o_issue, o_lo, o_hi,
                  o_guess, o_unsure)
        any_guess = False
        for k in range(n_act):
            if o_guess[k]:
                any_guess = True
                break
        if caching and any_guess:
            if _refit(s, block, act, n_act, o_h, o_issue, o_lo, o_hi, o_guess, ov_stamp,
                      ov_val):
                _run_step(s, left, caching, guess, block, act, n_act, total, done, comp, hmax,
                          ov_stamp, ov_val, o_chunk, o_h, o_has_h, o_comp, o_issue, o_lo,
                          o_hi, o_guess, o_unsure)
            if sum_has[i]:
                tot_chunks = 0
                for k in range(n_act):
                    tot_chunks += o_chunk[k]
                delta = sum_val[i] - n_dec - tot_chunks
                if delta != 0:
                    for k in range(n_act):
                        if o_guess[k] and delta != 0:
                            want = min(max(np.int64(np.rint((o_h[k] - delta) / block)) * block,
                                           o_lo[k]), o_hi[k])
                            ov_stamp[act[k]] = s
                            ov_val[act[k]] = want
                            delta -= o_h[k] - want
                    _run_step(s, left, caching, guess, block, act, n_act, total, done, comp,
                              hmax, ov_stamp, ov_val, o_chunk, o_h, o_has_h, o_comp, o_issue,
                              o_lo, o_hi, o_guess, o_unsure)
                    if _refit(s, block, act, n_act, o_h, o_issue, o_lo, o_hi, o_guess,
                              ov_stamp, ov_val):
                        _run_step(s, left, caching, guess, block, act, n_act, total, done,
                                  comp, hmax, ov_stamp, ov_val, o_chunk, o_h, o_has_h, o_comp,
                                  o_issue, o_lo, o_hi, o_guess, o_unsure)
                n_guessed = 0
                kg = -1
                any_issue = False
                tot = n_dec
                for k in range(n_act):
                    tot += o_chunk[k]
                    if o_guess[k]:
                        n_guessed += 1
                        kg = k
                    if o_issue[k] != 0:
                        any_issue = True
                if sum_val[i] == tot and n_guessed == 1 and not any_issue:
                    # pinned only if another h would have changed the step's total (it does
                    # not when a later request absorbs whatever budget is left)
                    g_seg, g_h = act[kg], o_h[kg]
                    sensitive = True
                    for alt in (g_h - block, g_h + block):
                        if o_lo[kg] <= alt <= o_hi[kg]:
                            st, sv = ov_stamp[g_seg], ov_val[g_seg]
                            ov_stamp[g_seg] = s
                            ov_val[g_seg] = alt
                            _run_step(s, left, caching, guess, block, act, n_act, total, done,
                                      comp, hmax, ov_stamp, ov_val, a_chunk, a_h, a_has_h,
                                      a_comp, a_issue, a_lo, a_hi, a_guess, a_unsure)
                            ov_stamp[g_seg] = st
                            ov_val[g_seg] = sv
                            alt_tot = n_dec
                            for k in range(n_act):
                                alt_tot += a_chunk[k]
                            if alt_tot == tot:
                                sensitive = False
                    if sensitive:
                        pinned[n_pinned] = g_h
                        n_pinned += 1
                        for k in range(n_act):  # nothing in this step is a guess any more
                            o_guess[k] = False
                            o_unsure[k] = False
        n_fin = 0
        for k in range(n_act):
            j = act[k]
            chunk = o_chunk[k]
            c = o_issue[k]
            if c != 0:
                if issue_n[c] == 0:
                    issue_first[c] = n_issue_events
                issue_n[c] += 1
                n_issue_events += 1
            if chunk > 0:
                if n_m == len(m_step):
                    m_step = _grow(m_step, n_m)
                    m_seg = _grow(m_seg, n_m)
                    m_tok = _grow(m_tok, n_m)
                    m_done = _grow(m_done, n_m)
                m_step[n_m] = s
                m_seg[n_m] = j
                m_tok[n_m] = chunk
                m_done[n_m] = done[j]
                n_m += 1
                done[j] += chunk
            if o_has_h[k]:
                h[j] = o_h[k]
                if o_unsure[k]:
                    ambiguous[j] = True
            if o_unsure[k]:
                amb_step[i] = True
            if o_comp[k]:
                fin[j] = True
                n_fin += 1
                if comp[j] == _GREEDY:
                    dyn_complete[j] = s
                    dyn_has[j] = True
                    if s + 1 <= end[j]:
                        dyn[s + 1 - s0] += 1
                        dyn[min(end[j], s1) + 1 - s0] -= 1
        if n_fin:
            m = 0
            for k in range(n_act):
                if not fin[act[k]]:
                    act[m] = act[k]
                    m += 1
            n_act = m
    if caching:
        # segments that never completed (preempted or aborted during prefill, or greedy ones):
        # their cached prefix only shifts the offsets; use the guess, leaving >= 1 token to do
        g0 = guess if guess > 0 else 0
        for j in range(n_seg):
            if comp[j] != _GREEDY and comp[j] <= end[j]:
                continue
            if dyn_has[j]:
                continue
            room = ((total[j] - done[j] - 1) // block) * block
            h[j] = max(0, min(g0, hmax[j], room))
            ambiguous[j] = True
    # flag every chunk step of an ambiguous segment (its offsets depend on the guess)
    for k in range(n_m):
        if ambiguous[m_seg[k]]:
            amb_step[m_step[k] - s0] = True
    amb_steps = np.flatnonzero(amb_step) + s0
    return (m_step[:n_m].copy(), m_seg[:n_m].copy(), m_tok[:n_m].copy(), m_done[:n_m].copy(), h,
            ambiguous, amb_steps, dyn_complete, pinned[:n_pinned].copy(), issue_n, issue_first)


# ---------------------------------------------------------------------------- segments
# event ranks (segments._RANK) and the segment issues, in segments_kernel's codes
_PREEMPTED, _SCHEDULED, _FIRST_TOKEN, _FINISHED = 1, 2, 3, 4
SEGMENT_ISSUES = ("empty_segment", "decode_count_mismatch", "completion_before_schedule",
                  "unfinished_request", "missing_preempted", "orphan_first_token",
                  "orphan_preempted")


@njit(cache=True)
def _count(code, issue_n, issue_first, cnt):  # pragma: no cover - compiled
    if issue_n[code] == 0:
        issue_first[code] = cnt[1]
    issue_n[code] += 1
    cnt[1] += 1


@njit(cache=True)
def _close(end, d_end, has_d, last_step, cur, s_start, s_tot, s_dr, s_ft, s_i, req, step, rank,
           out, issue_n, issue_first, cnt):  # pragma: no cover - compiled
    """Close the open segment at ``end`` (the Python loop's ``close``)."""
    if end < s_start:
        _count(0, issue_n, issue_first, cnt)
        return
    end = min(end, last_step)
    if s_ft >= 0:
        comp = s_ft
        if has_d and d_end - s_dr > 0 and end - (d_end - s_dr) + 1 != s_ft:
            _count(1, issue_n, issue_first, cnt)
    elif has_d:
        produced = d_end - s_dr
        comp = end + 1 if produced <= 0 else end - produced + 1
        if comp < s_start:
            _count(2, issue_n, issue_first, cnt)
            comp = _GREEDY
    else:
        comp = _GREEDY
    # the last SCHEDULED event of this request at the segment's start step (rows are sorted by
    # request, step, rank: such events are contiguous): the admission-order key
    last = s_i
    while (last + 1 < len(req) and req[last + 1] == req[s_i] and step[last + 1] == step[s_i]
           and rank[last + 1] == _SCHEDULED):
        last += 1
    k = cnt[0]
    out[0, k] = cur
    out[1, k] = s_start
    out[2, k] = end
    out[3, k] = s_tot
    out[4, k] = s_dr
    out[5, k] = comp
    out[6, k] = last
    cnt[0] += 1


@njit(cache=True)
def segments_kernel(req, rank, step, ptot, ddone, last_step):  # pragma: no cover - compiled
    """Scheduling segments of journey rows sorted by request, step, rank (see
    :func:`.replay._segments`): an int64 array of rows ``req, start, end, total,
    d_r, complete, scheduled event`` by segment, issue counts and first occurrences."""
    n = len(req)
    out = np.empty((7, n), dtype=np.int64)
    issue_n = np.zeros(7, dtype=np.int64)
    issue_first = np.full(7, 1 << 62, dtype=np.int64)
    cnt = np.zeros(2, dtype=np.int64)  # segments, issue events
    open_ = False
    s_start = s_tot = s_dr = 0
    s_ft = -1
    s_i = -1
    cur = -1
    for i in range(n):
        r = req[i]
        if r != cur:
            if open_:
                open_ = False
                _close(last_step, 0, False, last_step, cur, s_start, s_tot, s_dr, s_ft, s_i,
                       req, step, rank, out, issue_n, issue_first, cnt)
                _count(3, issue_n, issue_first, cnt)
            cur = r
        k = rank[i]
        if k == _SCHEDULED:
            if open_:
                _count(4, issue_n, issue_first, cnt)
                open_ = False
                _close(step[i] - 1, 0, False, last_step, cur, s_start, s_tot, s_dr, s_ft, s_i,
                       req, step, rank, out, issue_n, issue_first, cnt)
            open_ = True
            s_start, s_dr, s_ft, s_i = step[i], ddone[i], -1, i
            s_tot = ptot[i] + s_dr
        elif k == _FIRST_TOKEN:
            if open_ and s_ft < 0:
                s_ft = step[i]
            else:
                _count(5, issue_n, issue_first, cnt)
        elif k == _PREEMPTED:
            if open_:
                open_ = False
                _close(step[i] - 1, ddone[i], True, last_step, cur, s_start, s_tot, s_dr, s_ft,
                       s_i, req, step, rank, out, issue_n, issue_first, cnt)
            else:
                _count(6, issue_n, issue_first, cnt)
        elif k == _FINISHED:
            if open_:
                open_ = False
                _close(step[i], ddone[i], True, last_step, cur, s_start, s_tot, s_dr, s_ft, s_i,
                       req, step, rank, out, issue_n, issue_first, cnt)
    if open_:
        _close(last_step, 0, False, last_step, cur, s_start, s_tot, s_dr, s_ft, s_i, req, step,
               rank, out, issue_n, issue_first, cnt)
        _count(3, issue_n, issue_first, cnt)
    return out[:, :cnt[0]].copy(), issue_n, issue_first
