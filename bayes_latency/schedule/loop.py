"""The engine's scheduler loop, compiled with numba over flat arrays.

:func:`~bayes_latency.schedule.engine.run_engine` prepares the requests as flat arrays, calls
:func:`schedule_loop` and assembles the result. The loop is the reference scheduling policy of
``schedule/engine.py``'s docstring step for step (same order of operations and integer arithmetic
as the plain-Python loop it was ported from, noise drawn from the caller's generator in the same
blocks at the same points): ``tests/test_engine_kernel.py`` compares every output array against
stored reference values (``tests/golden/engine_cases.npz``), scheduling columns exactly and
float-derived ones within a stated tolerance.

Requests are integers ``0..n-1``; their state lives in arrays (``computed[r]``, ``nblocks[r]``,
...). The running list is an array with a length, the waiting deque a ring buffer, the prefix
cache two boolean arrays over dense group and prompt ids. Outputs go to arrays that grow by
doubling. Noise blocks come from the generator through ``numba.objmode`` (one call per 8192
steps), so the generator's final state depends only on the number of steps.

Compiled on first use and cached on disk (``cache=True``): the first call in a fresh
environment compiles for a few seconds.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit, objmode

# event codes (same values as schedule/engine.py)
_EV_SCHED_FIRST, _EV_SCHED_RESUME, _EV_FIRST_TOKEN, _EV_PREEMPTED, _EV_FINISHED = 1, 2, 3, 4, 5

#: Integer step columns of :func:`schedule_loop` (``STEP_COLUMNS`` less the two float ones).
STEP_INT_COLUMNS: tuple[str, ...] = (
    "ts_start_ns", "num_prefill_reqs", "prefill_tokens", "prefill_attn_pairs",
    "prefill_kv_tokens", "num_decode_reqs", "decode_tokens", "decode_ctx_tokens",
    "sum_num_prefill_reqs", "sum_num_decode_reqs", "sum_prefill_tokens", "sum_decode_tokens",
    "running_depth", "waiting_depth", "num_finished", "num_preempted", "blocks_free",
    "iteration_ns", "cpu_ns", "sampled", "rich",
)
#: Float step columns.
STEP_FLOAT_COLUMNS: tuple[str, ...] = ("prefill_input_pairs", "mean_us")


class _Noise:
    """Pre-drawn noise in blocks (deterministic for a given generator)."""

    def __init__(self, rng: np.random.Generator, nc: Any, block: int = 8192) -> None:
        self.rng, self.nc, self.block = rng, nc, block

    def refill(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        nc, n, r = self.nc, self.block, self.rng
        eps = np.clip(nc.iteration_scale * r.standard_t(nc.iteration_nu, size=n),
                      -nc.iteration_clip, nc.iteration_clip)
        return (np.ascontiguousarray(np.exp(eps), dtype=np.float64),
                np.ascontiguousarray(np.exp(nc.cpu_sigma * r.standard_normal(n)),
                                     dtype=np.float64),
                np.ascontiguousarray(r.random(n), dtype=np.float64),
                np.ascontiguousarray(r.random(n), dtype=np.float64))


#: Noise sources of the loops running now, by key (the compiled loop holds only the key).
_SOURCES: dict[int, _Noise] = {}


def _refill(key: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    return _SOURCES[key].refill()


@njit(cache=True)
def _room(a: np.ndarray, used: int, extra: int) -> np.ndarray:
    """``a`` with at least ``used + extra`` rows (doubling; the first ``used`` rows kept)."""
    if used + extra <= a.shape[0]:
        return a
    m = max(used + extra, 2 * a.shape[0])
    b = np.empty((m, a.shape[1]), dtype=a.dtype)
    b[:used] = a[:used]
    return b


@njit(cache=True)
def _event(evs: np.ndarray, n_ev: int, r: int, code: int, s: int, prefill: int, decode: int,
           npre: int) -> int:
    """Write the event ``(r, code, s, prefill, decode, npre)`` at row ``n_ev``; the next row."""
    evs[n_ev, 0] = r
    evs[n_ev, 1] = code
    evs[n_ev, 2] = s
    evs[n_ev, 3] = prefill
    evs[n_ev, 4] = decode
    evs[n_ev, 5] = npre
    return n_ev + 1


@njit(cache=True)
def _preempt_last(running: np.ndarray, nrun: int, nblocks: np.ndarray, shared: np.ndarray,
                  computed: np.ndarray, npre: np.ndarray, resumed: np.ndarray, hw: np.ndarray,
                  out: np.ndarray, wq: np.ndarray, whead: int, wcap: int, wcount: int, free: int,
                  evs: np.ndarray, n_ev: int, s: int) -> tuple[int, int, int, int, int, int]:
    """Preempt the last running request (recompute later): free its blocks, requeue it first,
    record the event. Returns ``(v, nrun, free, whead, wcount, n_ev)``."""
    v = running[nrun - 1]
    nrun -= 1
    free += nblocks[v] - shared[v]
    nblocks[v] = 0
    shared[v] = 0
    computed[v] = 0
    npre[v] += 1
    resumed[v] = True
    whead = whead - 1 if whead > 0 else wcap - 1
    wq[whead] = v
    wcount += 1
    n_ev = _event(evs, n_ev, v, _EV_PREEMPTED, s, hw[v], out[v], npre[v])
    return v, nrun, free, whead, wcount, n_ev


@njit(cache=True)
def schedule_loop(q_sorted, arrivals, prompt, maxt, group, pblocks, key, ublocks, n_groups,
                  n_keys, H, c_dec, c_npre, c_pairs, c_pkv, c_ipairs, c_ndec, c_ctx, bs,
                  budget_max, max_seqs, pc, chunked, pool_max, capacity, cpu_base, cpu_per,
                  cpu_frac, s_rate, r_rate, wake_lo, wake_span, block, noise_key):  # noqa: ANN001
    """Run the scheduler; see the module docstring.

    Returns
    -------
    tuple
        ``(steps_int, steps_float, events, chunks, snaps, first_sched, first_tok, fin_step,
        cache_hit, npre)``: steps by :data:`STEP_INT_COLUMNS` / :data:`STEP_FLOAT_COLUMNS`,
        events ``(req, code, step, prefill_done, decode_done, npre)``, chunks ``(step, req,
        tokens, offset, recompute)``, snapshots ``(step, req, decode?, prompt, computed, out,
        npre, scheduled, blocks, shared)``, per-request arrays.
    """
    n = q_sorted.shape[0]
    m = max(n, 1)
    total = prompt.copy()
    out = np.zeros(m, np.int64)
    computed = np.zeros(m, np.int64)
    nblocks = np.zeros(m, np.int64)
    shared = np.zeros(m, np.int64)
    npre = np.zeros(m, np.int64)
    hw = np.zeros(m, np.int64)
    sched = np.zeros(m, np.int64)
    resumed = np.zeros(m, np.bool_)
    cached_g = np.zeros(max(n_groups, 1), np.bool_)
    cached_k = np.zeros(max(n_keys, 1), np.bool_)
    first_sched = np.zeros(n, np.int64)
    first_tok = np.zeros(n, np.int64)
    fin_step = np.zeros(n, np.int64)
    cache_hit = np.zeros(n, np.int64)
    running = np.empty(m, np.int64)
    nrun = 0
    wcap = m + 1
    wq = np.empty(wcap, np.int64)
    whead = 0
    wcount = 0
    dec = np.empty(m, np.int64)
    partial = np.empty(m, np.int64)
    pre_r = np.empty(m, np.int64)
    pre_c = np.empty(m, np.int64)
    steps_i = np.empty((1024, 21), np.int64)
    steps_f = np.empty((1024, 2), np.float64)
    evs = np.empty((1024, 6), np.int64)
    chs = np.empty((1024, 5), np.int64)
    sns = np.empty((16, 10), np.int64)
    n_ev = 0
    n_ch = 0
    n_sn = 0
    eps = np.empty(0, np.float64)
    cpun = np.empty(0, np.float64)
    us = np.empty(0, np.float64)
    ur = np.empty(0, np.float64)
    ni = block
    pool = 0
    free = capacity
    nxt = 0
    s = 0
    t = q_sorted[0] + np.int64(wake_lo) if n else np.int64(0)
    n_fin_prev = 0
    n_preempted = 0
    while True:
        while nxt < n and q_sorted[nxt] < t:
            wq[(whead + wcount) % wcap] = arrivals[nxt]
            wcount += 1
            nxt += 1
        if nrun == 0 and wcount == 0:
            if nxt >= n:
                break
            if ni >= block:
                with objmode(eps="float64[::1]", cpun="float64[::1]", us="float64[::1]",
                             ur="float64[::1]"):
                    eps, cpun, us, ur = _refill(noise_key)
                ni = 0
            t = q_sorted[nxt] + np.int64(wake_lo + wake_span * us[ni])
            ni += 1
            continue
        s += 1
        budget = budget_max
        n_preempted = 0
        live = nrun + wcount
        evs = _room(evs, n_ev, 3 * live + 8)
        chs = _room(chs, n_ch, live + 2)
        steps_i = _room(steps_i, s - 1, 1)
        steps_f = _room(steps_f, s - 1, 1)
        # ---- 1. decodes, in running order
        ndec = 0
        npart = 0
        ctx = 0
        i = 0
        while i < nrun:
            r = running[i]
            if out[r] != 0 and total[r] - computed[r] == 1:
                if computed[r] // bs + 1 > nblocks[r]:
                    ok = True
                    while free < 1:
                        v, nrun, free, whead, wcount, n_ev = _preempt_last(
                            running, nrun, nblocks, shared, computed, npre, resumed, hw, out,
                            wq, whead, wcap, wcount, free, evs, n_ev, s)
                        n_preempted += 1
                        if v == r:
                            ok = False
                            break
                    if not ok:
                        break
                    nblocks[r] += 1
                    free -= 1
                sched[r] = 1
                dec[ndec] = r
                ndec += 1
                ctx += computed[r] + 1
                budget -= 1
            else:
                partial[npart] = r
                npart += 1
            i += 1
        # ---- 2. running partial prefills / recomputes, in running order
        npr = 0
        ptok = 0
        pairs = 0
        pkv = 0
        ipairs = 0.0
        npl = 0
        for k in range(npart):
            r = partial[k]
            if budget <= 0:
                break
            if nblocks[r] == 0 and computed[r] == 0:
                continue
            ok = True
            c = 0
            need = 0
            while True:
                c = total[r] - computed[r]
                if c > budget:
                    c = budget
                need = -(-(computed[r] + c) // bs) - nblocks[r]
                if need <= free:
                    break
                v, nrun, free, whead, wcount, n_ev = _preempt_last(
                    running, nrun, nblocks, shared, computed, npre, resumed, hw, out, wq, whead,
                    wcap, wcount, free, evs, n_ev, s)
                n_preempted += 1
                if sched[v] != 0:                      # withdraw its decode of this step
                    j = 0
                    while dec[j] != v:
                        j += 1
                    for jj in range(j, ndec - 1):
                        dec[jj] = dec[jj + 1]
                    ndec -= 1
                    ctx -= computed[v] + 1
                    budget += 1
                    sched[v] = 0
                if v == r:
                    ok = False
                    break
            if not ok:
                break
            nblocks[r] += need
            free -= need
            sched[r] = c
            o = computed[r]
            pre_r[npl] = r
            pre_c[npl] = c
            npl += 1
            chs[n_ch, 0] = s
            chs[n_ch, 1] = r
            chs[n_ch, 2] = c
            chs[n_ch, 3] = o
            chs[n_ch, 4] = 1 if out[r] != 0 else 0
            n_ch += 1
            npr += 1
            ptok += c
            pairs += c * o + c * (c + 1) // 2
            pkv += o + c
            ipairs += c * (total[r] + c / 2)
            budget -= c
        # ---- 3. waiting queue, FCFS (not in a step that preempted)
        if n_preempted == 0:
            while wcount > 0 and budget > 0 and nrun < max_seqs:
                r = wq[whead]
                if not pc:
                    hit = 0
                elif key[r] >= 0 and cached_k[key[r]]:
                    hit = ublocks[r]
                elif cached_g[group[r]]:
                    hit = pblocks[r]
                else:
                    hit = 0
                o = hit * bs
                rem = total[r] - o
                c = rem if rem <= budget else budget
                if not chunked and c < rem:
                    break
                need = -(-(o + c) // bs) - hit
                if need > free:
                    break
                whead = whead + 1 if whead + 1 < wcap else 0
                wcount -= 1
                code = _EV_SCHED_RESUME if resumed[r] else _EV_SCHED_FIRST
                n_ev = _event(evs, n_ev, r, code, s, hw[r], out[r], npre[r])
                if not resumed[r]:
                    first_sched[r] = s
                    cache_hit[r] = o
                running[nrun] = r
                nrun += 1
                computed[r] = o
                shared[r] = hit
                nblocks[r] = hit + need
                free -= need
                sched[r] = c
                pre_r[npl] = r
                pre_c[npl] = c
                npl += 1
                chs[n_ch, 0] = s
                chs[n_ch, 1] = r
                chs[n_ch, 2] = c
                chs[n_ch, 3] = o
                chs[n_ch, 4] = 1 if out[r] != 0 else 0
                n_ch += 1
                npr += 1
                ptok += c
                pairs += c * o + c * (c + 1) // 2
                pkv += o + c
                ipairs += c * (total[r] + c / 2)
                budget -= c
        # ---- step time
        nsched = ndec + npr
        if ni >= block:
            with objmode(eps="float64[::1]", cpun="float64[::1]", us="float64[::1]",
                         ur="float64[::1]"):
                eps, cpun, us, ur = _refill(noise_key)
            ni = 0
        j = ni
        ni += 1
        mean = (H[ptok + ndec] + c_dec * ndec + c_npre * npr + c_pairs * pairs + c_pkv * pkv
                + c_ipairs * ipairs + c_ndec * ndec + c_ctx * ctx)
        it_ns = np.int64(np.rint(mean * eps[j] * 1000.0))
        cpu = (cpu_base + cpu_per * nsched) * cpun[j] * 1000.0
        cap = cpu_frac * it_ns
        cpu_ns = np.int64(cpu if cpu < cap else cap)
        sampled = us[j] < s_rate
        rich = sampled and ur[j] < r_rate
        sum_pre_reqs = 0
        sum_pre_tok = 0
        for k in range(npl):
            if out[pre_r[k]] == 0:
                sum_pre_reqs += 1
                sum_pre_tok += pre_c[k]
        if rich:
            sns = _room(sns, n_sn, nrun)
            for k in range(nrun):
                r = running[k]
                sns[n_sn, 0] = s
                sns[n_sn, 1] = r
                sns[n_sn, 2] = 1 if out[r] != 0 else 0
                sns[n_sn, 3] = prompt[r]
                sns[n_sn, 4] = computed[r]
                sns[n_sn, 5] = out[r]
                sns[n_sn, 6] = npre[r]
                sns[n_sn, 7] = sched[r]
                sns[n_sn, 8] = nblocks[r]
                sns[n_sn, 9] = shared[r]
                n_sn += 1
        row = s - 1
        steps_i[row, 0] = t
        steps_i[row, 1] = npr
        steps_i[row, 2] = ptok
        steps_i[row, 3] = pairs
        steps_i[row, 4] = pkv
        steps_i[row, 5] = ndec
        steps_i[row, 6] = ndec
        steps_i[row, 7] = ctx
        steps_i[row, 8] = sum_pre_reqs
        steps_i[row, 9] = nsched - sum_pre_reqs
        steps_i[row, 10] = sum_pre_tok
        steps_i[row, 11] = ptok + ndec - sum_pre_tok
        steps_i[row, 12] = nrun
        steps_i[row, 13] = wcount
        steps_i[row, 14] = n_fin_prev
        steps_i[row, 15] = n_preempted
        steps_i[row, 16] = free
        steps_i[row, 17] = it_ns
        steps_i[row, 18] = cpu_ns
        steps_i[row, 19] = 1 if sampled else 0
        steps_i[row, 20] = 1 if rich else 0
        steps_f[row, 0] = ipairs
        steps_f[row, 1] = mean
        # ---- forward pass done: credit tokens
        n_fin = 0
        for k in range(ndec):
            r = dec[k]
            computed[r] += 1
            sched[r] = 0
            out[r] += 1
            total[r] += 1
            if out[r] == maxt[r]:
                n_ev = _event(evs, n_ev, r, _EV_FINISHED, s, hw[r], out[r], npre[r])
                fin_step[r] = s
                n_fin += 1
        for k in range(npl):
            r = pre_r[k]
            computed[r] += pre_c[k]
            sched[r] = 0
            if hw[r] < prompt[r]:
                hw[r] = computed[r] if computed[r] < prompt[r] else prompt[r]
            if pc:
                g = group[r]
                if pblocks[r] != 0 and not cached_g[g] and computed[r] >= pblocks[r] * bs \
                        and pool + pblocks[r] <= pool_max:
                    cached_g[g] = True
                    pool += pblocks[r]
                    shared[r] = pblocks[r]
                kr = key[r]
                if kr >= 0 and ublocks[r] != 0 and not cached_k[kr] \
                        and computed[r] >= ublocks[r] * bs \
                        and (cached_g[g] or pblocks[r] == 0) \
                        and pool + ublocks[r] - pblocks[r] <= pool_max:
                    cached_k[kr] = True
                    pool += ublocks[r] - pblocks[r]
                    free += pblocks[r] - shared[r]
                    shared[r] = ublocks[r]
            if computed[r] == total[r]:
                out[r] += 1
                total[r] += 1
                if out[r] == 1:
                    n_ev = _event(evs, n_ev, r, _EV_FIRST_TOKEN, s, hw[r], 1, npre[r])
                    first_tok[r] = s
                if out[r] == maxt[r]:
                    n_ev = _event(evs, n_ev, r, _EV_FINISHED, s, hw[r], out[r], npre[r])
                    fin_step[r] = s
                    n_fin += 1
        if n_fin:
            keep = 0
            for k in range(nrun):
                r = running[k]
                if out[r] == maxt[r]:
                    free += nblocks[r] - shared[r]
                    nblocks[r] = 0
                    shared[r] = 0
                else:
                    running[keep] = r
                    keep += 1
            nrun = keep
        n_fin_prev = n_fin
        t += it_ns
    return (steps_i[:s], steps_f[:s], evs[:n_ev], chs[:n_ch], sns[:n_sn], first_sched,
            first_tok, fin_step, cache_hit, npre[:n])


def run_loop(rng: np.random.Generator, nc: Any, **kw: Any) -> tuple:
    """:func:`schedule_loop` with noise drawn from ``rng`` (blocks of 8192 steps)."""
    src = _Noise(rng, nc)
    k = id(src)
    _SOURCES[k] = src
    try:
        return schedule_loop(block=src.block, noise_key=k, **kw)
    finally:
        del _SOURCES[k]
