"""Observation rows from the request journeys: step timeline windows, requests, alpha rows.

Part of :mod:`bayes_latency.data.observations.build` (whose docstring describes the row kinds and the
drop reasons): anchors of step starts from exact summaries and journey events, the
``iteration`` / ``step_window`` rows cut at them, and the ``request_*`` and ``alpha_*`` rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from bayes_latency.data.observations.table import _rows
from bayes_latency.data.report import IngestReport
from bayes_latency.physics.basis import get_term, term_names

LONG_GAP_FACTOR = 10.0
"""Timeline rows whose time per µs of roofline time exceeds this multiple of the median are
dropped (``long_gap``)."""
MIN_CALIBRATION = 5
"""Minimum (event, exact start) pairs to bias-correct journey-event anchors."""

def _f64(s: pd.Series) -> np.ndarray:
    """``s.astype("float64").to_numpy()`` (NaN for nulls) without pandas' ``astype``."""
    return s.to_numpy(dtype=float, na_value=np.nan)


class _Events:
    """The journey columns :func:`_step_extreme` reads, converted once per experiment (event
    codes by ``factorize``, steps as float, times as int64 or float), and its results."""

    def __init__(self, ev: pd.DataFrame) -> None:
        self.codes, self.names = pd.factorize(ev["event"])
        self.step = ev["step"].to_numpy(dtype=float, na_value=np.nan)
        ts = ev["ts_monotonic_ns"]
        self.ts = (ts.to_numpy(dtype=np.int64) if pd.api.types.is_integer_dtype(ts)
                   and not ts.hasnans else ts.to_numpy(dtype=float, na_value=np.nan))
        self.done: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}


def _step_extreme(ev: pd.DataFrame | _Events, events: Sequence[str], how: str
                  ) -> tuple[np.ndarray, np.ndarray]:
    """``ev[ev.event.isin(events)].groupby("step")["ts_monotonic_ns"].<how>()`` (``how``: min or
    max) as (ascending steps, values as float), with numpy: rows without a step are left out,
    as groupby does."""
    e = ev if isinstance(ev, _Events) else _Events(ev)
    key = (tuple(events), how)
    if key not in e.done:
        e.done[key] = _extreme(e, events, how)
    return e.done[key]


def _extreme(e: _Events, events: Sequence[str], how: str) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_step_extreme` of converted journey columns."""
    wanted = [i for i, name in enumerate(e.names) if name in set(events)]
    sel = np.isin(e.codes, wanted)
    step, ts = e.step[sel], e.ts[sel]
    ok = ~np.isnan(step)
    step, ts = step[ok].astype(np.int64), ts[ok]
    if not len(step):
        return np.empty(0, dtype=np.int64), np.empty(0)
    order = np.argsort(step, kind="stable")
    step, ts = step[order], ts[order]
    start = np.flatnonzero(np.r_[True, step[1:] != step[:-1]])
    red = (np.fmin if how == "min" else np.fmax) if ts.dtype.kind == "f" else (
        np.minimum if how == "min" else np.maximum)
    return step[start], red.reduceat(ts, start).astype(float)


def _idle_boundaries(requests: pd.DataFrame | None, ev: pd.DataFrame | _Events, s0: int, n: int
                     ) -> np.ndarray:
    """``idle[i]``: no request alive across the boundary between step ``s0+i`` and the next.

    A request is alive from the step its QUEUED event falls in (the next one when it was queued
    after that step's last token was emitted, i.e. while the engine was idle) until its
    FINISHED step (excluded).
    """
    idle = np.zeros(n, dtype=bool)
    if requests is None or not len(requests):
        return idle
    end_step, end_ts = _step_extreme(ev, ["FIRST_TOKEN", "FINISHED"], "max")
    q_step = _f64(requests["queued_step"])
    fs = _f64(requests["first_scheduled_step"])
    q_step = np.where(np.isnan(q_step), fs - 1, q_step)
    q_ns = _f64(requests["queued_ns"])
    # each request's queued step looked up among the steps of end_ts (NaN when absent)
    e_ts = np.full(len(q_step), np.nan)
    if len(end_step):
        at = np.clip(np.searchsorted(end_step, q_step), 0, len(end_step) - 1)
        hit = end_step[at] == q_step
        e_ts[hit] = end_ts[at[hit]]
    start = np.where(np.isfinite(e_ts) & np.isfinite(q_ns) & (q_ns > e_ts), q_step + 1, q_step)
    fin = _f64(requests["finished_step"])
    fin = np.where(np.isfinite(fin), fin, s0 + n + 1)
    ok = np.isfinite(start)
    lo = np.clip(start[ok] - s0, 0, n).astype(np.int64)
    hi = np.clip(fin[ok] - s0, 0, n).astype(np.int64)
    keep = hi > lo
    carry = np.zeros(n + 1, dtype=np.int64)
    np.add.at(carry, lo[keep], 1)
    np.add.at(carry, hi[keep], -1)
    carry = np.cumsum(carry)[:n]
    return carry == 0


def _event_anchors(steps: pd.DataFrame | None, ev: pd.DataFrame | _Events, s0: int, n: int,
                   report: IngestReport, idle_at: np.ndarray
                   ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Step-start estimates for indices ``0..n`` (index ``i`` = start of step ``s0 + i``).

    ``idle_at[i]``: the engine was idle just before index ``i`` (not used for calibration).
    Returns ``{"exact": (t, err), "scheduled": (t, err), "finished": (t, err)}`` with times in
    ns (NaN where unknown) and error bounds in µs.
    """
    m = n + 1
    t = np.full(m, np.nan)
    if steps is not None and len(steps):
        sid = steps["step.id"].to_numpy(dtype=np.int64)
        ts = steps["step.ts_start_ns"].to_numpy(dtype=float, na_value=np.nan)
        ok = (sid >= s0) & (sid <= s0 + n) & np.isfinite(ts)
        t[sid[ok] - s0] = ts[ok]
    out = {"exact": (t, np.where(np.isfinite(t), 0.0, np.nan))}
    sch = _step_extreme(ev, ["SCHEDULED", "PREEMPTED"], "min")
    fin = _step_extreme(ev, ["FIRST_TOKEN", "FINISHED"], "max")
    for name, (st, vals), shift in (("scheduled", sch, 0), ("finished", fin, 1)):
        st = st + shift
        ok = (st >= s0) & (st <= s0 + n)
        idx, vals = st[ok] - s0, vals[ok]
        cal = np.isfinite(t[idx]) & ~idle_at[idx]
        off = vals[cal] - t[idx[cal]]
        if len(off) >= MIN_CALIBRATION:
            med = float(np.median(off))
            bound = float(np.quantile(np.abs(off - med), 0.95)) / 1e3
            report.notes.append(f"anchors from {name} events: median offset {med / 1e3:.1f} us, "
                                f"95% error {bound:.1f} us ({len(off)} calibration pairs)")
        else:
            med = 0.0
            bound = float(np.max(np.abs(off))) / 1e3 if len(off) else np.nan
            report.notes.append(f"anchors from {name} events: uncalibrated ({len(off)} pairs)")
        est = np.full(m, np.nan)
        est[idx] = vals - med
        out[name] = (est, np.where(np.isfinite(est), bound, np.nan))
    return out


def _timeline_rows(batches: pd.DataFrame, X: np.ndarray, steps: pd.DataFrame | None,
                   ev: pd.DataFrame, requests: pd.DataFrame | None, terms: Sequence[str],
                   report: IngestReport, make: Callable[..., Any] = _rows) -> list[Any]:
    """``iteration`` and ``step_window`` rows of one experiment.

    Every index ``i`` (start of step ``s0 + i``) gets one anchor: exact, else SCHEDULED-based,
    else FINISHED-based. Where the engine was idle between step ``i-1`` and ``i`` (no request
    alive across the boundary), the anchor splits in two: the end of the window before it is the
    FINISHED-based estimate (the end of step ``i-1``'s forward pass), the start of the window
    after it the exact or SCHEDULED-based one; the idle time is in neither window.
    """
    s0 = int(batches["step_id"].iloc[0])
    n = len(batches)
    m = n + 1
    ev = _Events(ev)  # (the journey columns converted once for the three extremes below)
    idle = _idle_boundaries(requests, ev, s0, n)
    idle_at = np.zeros(m, dtype=bool)  # idle between index i-1 and i
    idle_at[1:] = idle
    anc = _event_anchors(steps, ev, s0, n, report, idle_at)
    # one anchor per index, preferring exact > scheduled > finished
    t, err, exact = np.full(m, np.nan), np.full(m, np.nan), np.zeros(m, dtype=bool)
    for name in ("finished", "scheduled", "exact"):
        tv, ev_err = anc[name]
        ok = np.isfinite(tv)
        t[ok], err[ok] = tv[ok], ev_err[ok]
        exact[ok] = name == "exact"
    t_start, t_end = t.copy(), t.copy()
    e_start, e_end = err.copy(), err.copy()
    x_start, x_end = exact.copy(), exact.copy()
    tf, ef = anc["finished"]
    t_end[idle_at], e_end[idle_at], x_end[idle_at] = tf[idle_at], ef[idle_at], False
    only_fin = idle_at & ~np.isfinite(anc["exact"][0]) & ~np.isfinite(anc["scheduled"][0])
    t_start[only_fin] = np.nan

    cs = np.vstack([np.zeros((1, X.shape[1])), np.cumsum(X, axis=0)])
    tokens = (batches["prefill_tokens"].to_numpy(float) + batches["decode_tokens"].to_numpy(float))
    c_empty = np.concatenate([[0], np.cumsum(tokens <= 0)])
    c_idle = np.concatenate([[0], np.cumsum(idle)])
    ctx_apx = batches["ctx_approximated"].to_numpy(dtype=bool)
    c_apx = np.concatenate([[0], np.cumsum(ctx_apx)])
    # steps whose prefill chunks rest on a guessed cached prefix (data.reconstruct): their
    # features are not measured, and the guess is biased (tiny fleet, prefix-cached Mixtral: 2.3x
    # the true prefill tokens), so windows over them are not fitted
    amb = (batches["prefix_ambiguous"].to_numpy(dtype=bool) if "prefix_ambiguous" in batches
           else np.zeros(n, dtype=bool))
    c_amb = np.concatenate([[0], np.cumsum(amb)])

    idx = np.flatnonzero(np.isfinite(t_start) | np.isfinite(t_end))
    if len(idx) < 2:
        return []
    a, b = idx[:-1], idx[1:]
    pair = np.isfinite(t_start[a]) & np.isfinite(t_end[b])
    lost = int((b - a)[~pair].sum())
    if lost:
        report.notes.append(f"{lost} steps next to idle gaps have no usable anchor pair")
    a, b = a[pair], b[pair]
    value = (t_end[b] - t_start[a]) / 1e3
    nst = b - a
    both = x_start[a] & x_end[b]
    kind = np.where(both & (nst == 1), "iteration", "step_window")
    feats = cs[b] - cs[a]
    bad_empty = (c_empty[b] - c_empty[a]) > 0
    bad_idle = ~bad_empty & ((c_idle[b - 1] - c_idle[a]) > 0)  # boundaries inside the window
    nonpos = ~bad_empty & ~bad_idle & ~(value > 0)
    bad_amb = ~bad_empty & ~bad_idle & ~nonpos & ((c_amb[b] - c_amb[a]) > 0)
    usable = ~(bad_empty | bad_idle | nonpos | bad_amb)
    # time per unit of ideal (roofline) time: idle time inflates it, a long but busy step not
    roof = [j for j, t in enumerate(term_names(terms)) if get_term(t).unit == "1"]
    ideal = feats[:, roof].sum(axis=1) if roof else np.zeros(len(value))
    ratio = np.where(ideal > 0, value / np.where(ideal > 0, ideal, 1.0), value / nst)
    ok_r = usable & (ideal > 0)
    med = float(np.median(ratio[ok_r])) if ok_r.any() else np.nan
    long_gap = ok_r & (ratio > LONG_GAP_FACTOR * med)
    for reason, mask in (("empty_step", bad_empty), ("idle_gap", bad_idle),
                         ("nonpositive_value", nonpos), ("prefix_guessed", bad_amb),
                         ("long_gap", long_gap)):
        for k in ("iteration", "step_window"):
            cnt = int((mask & (kind == k)).sum())
            if cnt:
                report.drop(f"{k}:{reason}", cnt)
    keep = usable & ~long_gap
    out = []
    for k in ("iteration", "step_window"):
        sel = keep & (kind == k)
        if not sel.any():
            continue
        out.append(make(k, value[sel], feats[sel], terms, n_steps=nst[sel],
                         step_first=s0 + a[sel], step_last=s0 + b[sel] - 1,
                         anchor_exact=both[sel], anchor_error_us=(e_start[a] + e_end[b])[sel],
                         ctx_approximated=(c_apx[b] - c_apx[a])[sel] > 0))
    return out


def _request_rows(requests: pd.DataFrame, cs: np.ndarray, s0: int, n: int,
                  terms: Sequence[str], report: IngestReport,
                  make: Callable[..., Any] = _rows) -> list[Any]:
    """``request_prefill`` and ``request_decode`` rows (complete, non-aborted requests)."""
    r = requests[requests["complete"].astype(bool) & ~requests["aborted"].astype(bool)]
    out = []
    specs = (("request_prefill", "first_scheduled", "first_token", 0),
             ("request_decode", "first_token", "finished", 1))
    for kind, a_name, b_name, shift in specs:
        ta = _f64(r[f"{a_name}_ns"])
        tb = _f64(r[f"{b_name}_ns"])
        first = _f64(r[f"{a_name}_step"]) + shift
        last = _f64(r[f"{b_name}_step"])
        ok = np.isfinite(ta) & np.isfinite(tb) & np.isfinite(first) & np.isfinite(last)
        if (~ok).sum():
            report.drop(f"{kind}:missing_time", int((~ok).sum()))
        nst = np.where(ok, last - first + 1, 0)
        none = ok & (nst < 1)
        if none.any():  # one output token: no decode phase, nothing to observe (not a drop)
            report.notes.append(f"{kind}: {int(none.sum())} requests span no step (skipped)")
        outside = ok & ~none & ((first < s0) | (last > s0 + n - 1))
        if outside.any():
            report.drop(f"{kind}:outside_timeline", int(outside.sum()))
        value = (tb - ta) / 1e3
        nonpos = ok & ~none & ~outside & ~(value > 0)
        if nonpos.any():
            report.drop(f"{kind}:nonpositive_value", int(nonpos.sum()))
        sel = ok & ~none & ~outside & ~nonpos
        if not sel.any():
            continue
        i0 = (first[sel] - s0).astype(np.int64)
        i1 = (last[sel] - s0).astype(np.int64) + 1
        out.append(make(kind, value[sel], cs[i1] - cs[i0], terms, n_steps=i1 - i0,
                         step_first=first[sel].astype(np.int64),
                         step_last=last[sel].astype(np.int64)))
    return out


def _alpha_rows(requests: pd.DataFrame, terms: Sequence[str], report: IngestReport,
                make: Callable[..., Any] = _rows) -> list[Any]:
    """``alpha_arrival`` and ``alpha_departure`` rows."""
    out = []
    arr = _f64(requests["arrival_s"]) * 1e6
    que = _f64(requests["queued_ns"]) / 1e3
    v = que - arr
    qstep = _f64(requests["queued_step"])
    missing = ~np.isfinite(v)
    neg = ~missing & (v < 0)
    if missing.any():
        report.drop("alpha_arrival:missing_time", int(missing.sum()))
    if neg.any():
        report.drop("alpha_arrival:negative", int(neg.sum()))
    sel = ~missing & ~neg
    if sel.any():
        out.append(make("alpha_arrival", v[sel], None, terms, step_first=qstep[sel],
                         step_last=qstep[sel], alpha={"alpha_arrival": 1.0}))
    dep = _f64(requests["departed_s"]) * 1e6
    fin = _f64(requests["finished_ns"]) / 1e3
    otok = _f64(requests["output_tokens"])
    fstep = _f64(requests["finished_step"])
    aborted = requests["aborted"].astype(bool).to_numpy()
    v = dep - fin
    missing = ~aborted & ~(np.isfinite(v) & np.isfinite(otok))
    neg = ~aborted & ~missing & (v < 0)
    for reason, mask in (("aborted", aborted), ("missing_time", missing), ("negative", neg)):
        if mask.any():
            report.drop(f"alpha_departure:{reason}", int(mask.sum()))
    sel = ~aborted & ~missing & ~neg
    if sel.any():
        out.append(make("alpha_departure", v[sel], None, terms, step_first=fstep[sel],
                         step_last=fstep[sel],
                         alpha={"alpha_post_decode": 1.0, "alpha_per_token": otok[sel]}))
    return out
