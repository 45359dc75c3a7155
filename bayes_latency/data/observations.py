"""The observation table: every measured duration as a linear functional of per-step features.

Each row is ``value_us ≈ Σ_j beta_j · x_j`` (or ``Σ alpha_k · x_alpha_k``), where ``x`` is the sum
(or mean) of the per-step basis (:func:`~bayes_latency.physics.basis.basis_matrix`) over the steps
the row spans. Row kinds (``docs/ARCHITECTURE.md``):

``iteration`` (role ``beta``)
    Step ``i`` with both ``i`` and ``i+1`` sampled: ``(ts_start(i+1) - ts_start(i)) / 1000``.
``step_window`` (role ``beta``)
    The step timeline cut at *anchors* (estimates of step start times) into non-overlapping
    windows ``[a, b)``: value ``anchor(b) - anchor(a)``, features the sum of the basis over
    ``a..b-1``. Anchors are exact for sampled steps (``step.ts_start_ns``); otherwise they come
    from journey events: the earliest ``SCHEDULED``/``PREEMPTED`` at ``s`` (inside ``s``'s
    ``schedule()``, just after the start) or else the latest ``FIRST_TOKEN``/``FINISHED`` at
    ``s-1`` (just before ``s`` starts). Both are bias-corrected by their median offset to the
    exact starts of sampled steps when at least :data:`MIN_CALIBRATION` pairs exist, and
    ``anchor_error_us`` is the 95th percentile of the remaining absolute error (summed over the
    two ends). Windows of one step between two exact anchors are ``iteration`` rows instead, so
    no step is counted twice.
``request_prefill`` / ``request_decode`` (role ``ppc``)
    ``FIRST_TOKEN - SCHEDULED`` over steps ``first_scheduled..first_token`` and ``FINISHED -
    FIRST_TOKEN`` over ``first_token+1..finished``: overlapping sums, for predictive checks only.
``alpha_arrival`` / ``alpha_departure`` (role ``alpha``)
    ``QUEUED - api.ARRIVED`` (feature ``x_alpha_arrival`` = 1) and ``api.DEPARTED - FINISHED``
    (``x_alpha_post_decode`` = 1, ``x_alpha_per_token`` = output tokens).
``scheduler_cpu`` (role ``aux``)
    ``step.duration_us`` of sampled steps (CPU time of ``schedule()``) with that step's features.
``benchmark_mean`` (role ``beta``, aggregate ``mean``)
    Static-batch microbenchmarks (:func:`observations_from_microbench`).

Rows that cannot be used are dropped and counted in the :class:`IngestReport` (never silently):
windows or iterations spanning an idle engine (``idle_gap``: no request alive across a step
boundary, or ``empty_step``: a step with nothing scheduled), whose time per µs of ideal roofline
time (the sum of the roofline features) exceeds :data:`LONG_GAP_FACTOR` times the median
(``long_gap``: an idle period the request journeys did not reveal), or whose value is not positive
(``nonpositive_value``); alpha rows with missing or negative times.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from bayes_latency.data.reconstruct import BATCH_COLUMNS, reconstruct_batches
from bayes_latency.data.report import IngestReport
from bayes_latency.physics.basis import (
    ALPHA_TERMS,
    DEFAULT_TERMS,
    basis_matrix,
    get_term,
    term_names,
)

__all__ = [
    "BASE_COLUMNS",
    "DEFAULT_STACK",
    "config_id",
    "EXTRA_COLUMNS",
    "LONG_GAP_FACTOR",
    "MIN_CALIBRATION",
    "build_observations",
    "domain_violations",
    "drop_out_of_domain",
    "empty_observations",
    "observation_columns",
    "observations_from_iterations",
    "observations_from_microbench",
    "validate_observations",
]

DEFAULT_STACK = "vllm"
"""Serving software of trace-derived rows; other stacks (e.g. ``splitwise`` microbenchmarks) get
their own configurations and a ``stack`` level in the hierarchy."""


def config_id(model: str, gpu: str, tp: int, stack: str = DEFAULT_STACK) -> str:
    """The configuration key of the observation table: ``model|gpu|tpN`` (``|stack`` appended
    for stacks other than vLLM)."""
    base = f"{model}|{gpu}|tp{int(tp)}"
    return base if stack == DEFAULT_STACK else f"{base}|{stack}"


BASE_COLUMNS: tuple[str, ...] = (
    "obs_id", "kind", "experiment_id", "workload", "model", "gpu", "tp", "stack", "config_id",
    "value_us",
    "n_steps", "step_first", "step_last", "aggregate", "role", "max_num_batched_tokens",
    "max_num_seqs", "ep",
)
"""Contract columns before the feature columns."""
EXTRA_COLUMNS: tuple[str, ...] = ("anchor_exact", "anchor_error_us", "ctx_approximated")
"""Columns after the features: both window anchors exact, their timing error bound (µs), and
whether the features use approximated contexts (batches from summaries, not journeys)."""
LONG_GAP_FACTOR = 10.0
"""Timeline rows whose time per µs of roofline time exceeds this multiple of the median are
dropped (``long_gap``)."""
MIN_CALIBRATION = 5
"""Minimum (event, exact start) pairs to bias-correct journey-event anchors."""

_KIND_ROLE = {"iteration": "beta", "step_window": "beta", "benchmark_mean": "beta",
              "request_prefill": "ppc", "request_decode": "ppc", "scheduler_cpu": "aux",
              "alpha_arrival": "alpha", "alpha_departure": "alpha",
              "workload_ttft": "workload", "workload_e2e": "workload", "workload_decode": "ppc"}


def observation_columns(terms: Sequence[str] = DEFAULT_TERMS) -> list[str]:
    """All columns of the observation table for a term set, in order."""
    return (list(BASE_COLUMNS) + [f"x_{t}" for t in term_names(terms)]
            + [f"x_{a}" for a in ALPHA_TERMS] + list(EXTRA_COLUMNS))


def empty_observations(terms: Sequence[str] = DEFAULT_TERMS) -> pd.DataFrame:
    """An observation table with no rows and the right columns and dtypes."""
    return _finish([], terms)


def _finish(frames: list[pd.DataFrame], terms: Sequence[str]) -> pd.DataFrame:
    cols = observation_columns(terms)
    frames = [f for f in frames if len(f)]
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)
    for c in cols:
        if c not in df.columns:
            df[c] = np.nan
    df = df[cols]
    xcols = [c for c in cols if c.startswith("x_")]
    df[xcols] = df[xcols].astype("float64").fillna(0.0)
    for c in ("value_us", "anchor_error_us"):
        df[c] = df[c].astype("float64")
    for c in ("n_steps", "tp", "max_num_batched_tokens", "max_num_seqs", "ep"):
        df[c] = df[c].astype("int64")
    for c in ("step_first", "step_last"):
        df[c] = df[c].astype("Int64")
    for c in ("anchor_exact", "ctx_approximated"):
        df[c] = df[c].fillna(False).astype(bool)
    df["stack"] = df["stack"].fillna(DEFAULT_STACK)
    for c in ("obs_id", "kind", "experiment_id", "workload", "model", "gpu", "stack", "config_id",
              "aggregate", "role"):
        df[c] = df[c].astype(str)
    return df.reset_index(drop=True)


def _rows(kind: str, values: np.ndarray, X: np.ndarray | None, terms: Sequence[str], *,
          n_steps: Any = 1, step_first: Any = None, step_last: Any = None,
          alpha: Mapping[str, Any] | None = None, aggregate: str = "sum",
          anchor_exact: Any = False, anchor_error_us: Any = np.nan,
          ctx_approximated: Any = False) -> pd.DataFrame:
    """Observation rows of one kind (configuration columns are added by the caller)."""
    n = len(values)
    return pd.DataFrame(_row_dict(kind, values, X, terms, n_steps=n_steps, step_first=step_first,
                                  step_last=step_last, alpha=alpha, aggregate=aggregate,
                                  anchor_exact=anchor_exact, anchor_error_us=anchor_error_us,
                                  ctx_approximated=ctx_approximated),
                        index=range(n))  # one constructor: inserting columns one by one is slow


def _row_dict(kind: str, values: np.ndarray, X: np.ndarray | None, terms: Sequence[str], *,
              n_steps: Any = 1, step_first: Any = None, step_last: Any = None,
              alpha: Mapping[str, Any] | None = None, aggregate: str = "sum",
              anchor_exact: Any = False, anchor_error_us: Any = np.nan,
              ctx_approximated: Any = False) -> dict[str, Any]:
    """The columns of :func:`_rows` (arrays, or scalars for constant columns), no frame."""
    n = len(values)
    d: dict[str, Any] = {"kind": kind, "value_us": np.asarray(values, dtype=float),
                         "n_steps": n_steps, "step_first": step_first, "step_last": step_last,
                         "aggregate": aggregate, "role": _KIND_ROLE[kind],
                         "anchor_exact": anchor_exact, "anchor_error_us": anchor_error_us,
                         "ctx_approximated": ctx_approximated}
    names = term_names(terms)
    feats = np.zeros((n, len(names))) if X is None else np.asarray(X, dtype=float).reshape(n, -1)
    for j, t in enumerate(names):
        d[f"x_{t}"] = feats[:, j]
    for a in ALPHA_TERMS:
        d[f"x_{a}"] = 0.0 if alpha is None or a not in alpha else alpha[a]
    return d


def _str_column(parts: Sequence[Any], n: int) -> Any:
    """A ``str`` column (as ``.astype(str)`` makes it) of Arrow string arrays, or of one string
    repeated ``n`` times."""
    import pyarrow as pa

    arr = pa.repeat(parts, n) if isinstance(parts, str) else (
        pa.concat_arrays(list(parts)) if len(parts) else pa.array([], pa.string()))
    return pd.array(arr, dtype="str")


def _assemble(parts: Sequence[dict[str, Any]], terms: Sequence[str], *, experiment_id: str,
              workload: str, arch: Any, gpu: Any, serving: Any,
              stack: str = DEFAULT_STACK, report: IngestReport | None = None) -> pd.DataFrame:
    """``_finish([_label(_nullable_steps(concat of the frames of parts)), ...])`` built column
    by column (``parts``: :func:`_row_dict` outputs, each of one kind): the same frame, value
    for value and dtype for dtype, without a pandas call per part and column. With ``report``,
    also :func:`drop_out_of_domain` (checked on the columns)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    sizes = [len(p["value_us"]) for p in parts]
    n = sum(sizes)

    def cat(name: str, dtype: Any) -> np.ndarray:
        arrs = []
        for p, k in zip(parts, sizes, strict=True):
            v = p[name]
            arrs.append(np.full(k, np.nan if v is None else v, dtype=dtype) if np.ndim(v) == 0
                        else np.asarray(v, dtype=dtype))
        return np.concatenate(arrs) if arrs else np.empty(0, dtype=dtype)

    model, gname, tp = str(arch.name), str(gpu.name), int(serving.tp)
    out: dict[str, Any] = {}
    # obs ids: experiment/kind/k, k counting the rows of each kind in order
    seen: dict[str, int] = {}
    ids = []
    for p, k in zip(parts, sizes, strict=True):
        kind = p["kind"]
        k0 = seen.get(kind, 0)
        seen[kind] = k0 + k
        num = pa.array(np.arange(k0, k0 + k, dtype=np.int64)).cast(pa.string())
        ids.append(pc.binary_join_element_wise(f"{experiment_id}/{kind}", num, "/"))
    ints = {"tp": tp, "max_num_batched_tokens": int(serving.max_num_batched_tokens),
            "max_num_seqs": int(serving.max_num_seqs), "ep": int(serving.ep)}
    strs = {"experiment_id": experiment_id, "workload": workload, "model": model, "gpu": gname,
            "stack": stack, "config_id": config_id(model, gname, tp, stack)}
    for c in observation_columns(terms):
        if c == "obs_id":
            out[c] = _str_column(ids, n)
        elif c in ("kind", "aggregate", "role"):
            out[c] = _str_column([pa.repeat(str(p[c]), k) for p, k in zip(parts, sizes,
                                                                             strict=True)], n)
        elif c in strs:
            out[c] = _str_column(str(strs[c]), n)
        elif c in ints:
            out[c] = np.full(n, ints[c], dtype=np.int64)
        elif c in ("step_first", "step_last"):
            v = cat(c, float)
            mask = np.isnan(v)
            out[c] = pd.arrays.IntegerArray(np.where(mask, 0, np.round(v)).astype(np.int64),
                                            mask)
        elif c == "n_steps":
            out[c] = cat(c, np.int64)
        elif c in ("anchor_exact", "ctx_approximated"):
            out[c] = cat(c, bool)
        elif c.startswith("x_"):
            v = cat(c, float) if parts and c in parts[0] else np.full(n, np.nan)
            out[c] = np.where(np.isnan(v), 0.0, v)
        else:  # value_us, anchor_error_us
            out[c] = cat(c, float)
    if report is not None:
        # drop_out_of_domain's check on the columns, before the frame exists (same rows kept)
        viol = _violations(out)
        df = pd.DataFrame(out)
        return _drop_rows(df, viol, report) if viol else df
    return pd.DataFrame(out)


def _label(df: pd.DataFrame, *, experiment_id: str, workload: str, arch: Any, gpu: Any,
           serving: Any, stack: str = DEFAULT_STACK) -> pd.DataFrame:
    """Add configuration columns and obs ids (``experiment/kind/k``)."""
    model, gname, tp = str(arch.name), str(gpu.name), int(serving.tp)
    k = df.groupby("kind", sort=False).cumcount().to_numpy()
    labels = {"experiment_id": experiment_id, "workload": workload, "model": model, "gpu": gname,
              "tp": tp, "stack": stack, "config_id": config_id(model, gname, tp, stack),
              "max_num_batched_tokens": int(serving.max_num_batched_tokens),
              "max_num_seqs": int(serving.max_num_seqs), "ep": int(serving.ep),
              "obs_id": [f"{experiment_id}/{kd}/{i}"
                         for kd, i in zip(df["kind"].tolist(), k.tolist(), strict=True)]}
    new = [c for c in labels if c not in df.columns]
    if len(new) < len(labels):  # a column already there is overwritten in place, as before
        for c in labels:
            if c not in new:
                df[c] = labels[c]
    return pd.concat([df, pd.DataFrame({c: labels[c] for c in new}, index=df.index)], axis=1)


def _f64(s: pd.Series) -> np.ndarray:
    """``s.astype("float64").to_numpy()`` (NaN for nulls) without pandas' ``astype``."""
    return s.to_numpy(dtype=float, na_value=np.nan)


def _clean_sorted_steps(steps: pd.DataFrame) -> bool:
    """Whether ``steps`` has no null ``step.id`` / ``step.ts_start_ns`` and strictly increasing
    step ids (then dropping nulls and repeats and sorting by ``step.id`` leave it as it is)."""
    sid, ts = steps["step.id"], steps["step.ts_start_ns"]
    if sid.hasnans or ts.hasnans:
        return False
    v = sid.to_numpy()
    return v.dtype.kind in "iu" and bool((v[1:] > v[:-1]).all())


def _all_equal(col: pd.Series, value: str) -> bool:
    """Whether every value of a text column is ``value`` (one pyarrow pass; False when unsure,
    e.g. a column that is not text)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not pd.api.types.is_string_dtype(col.dtype) or col.dtype == object:
        return False
    try:
        arr = pa.array(col)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        return False
    if not pa.types.is_string(arr.type) and not pa.types.is_large_string(arr.type):
        return False
    return arr.null_count == 0 and bool(pc.all(pc.equal(arr, value)).as_py())


def _steps_of(tables: Mapping[str, Any], name: str, experiment_id: str) -> pd.DataFrame | None:
    df = tables.get(name) if isinstance(tables, Mapping) else getattr(tables, name, None)
    if df is None:
        return None
    if "experiment_id" in df.columns and experiment_id is not None and len(df):
        if _all_equal(df["experiment_id"], str(experiment_id)):
            return df
        sel = df["experiment_id"].astype(str) == str(experiment_id)
        if sel.any() and not sel.all():  # (all rows: the frame itself, no copy)
            df = df[sel]
    return df


# ------------------------------------------------------------------------------- timeline
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


def _nullable_steps(df: pd.DataFrame) -> pd.DataFrame:
    for c in ("step_first", "step_last"):
        df[c] = pd.array(pd.to_numeric(df[c], errors="coerce"), dtype="Float64").round().astype(
            "Int64")
    return df


# ------------------------------------------------------------------------------- public API
def build_observations(tables: Mapping[str, Any], serving: Any, arch: Any, gpu: Any,
                       experiment_id: str, workload: str = "",
                       terms: Sequence[str] = DEFAULT_TERMS
                       ) -> tuple[pd.DataFrame, IngestReport]:
    """Observation rows of one experiment.

    Parameters
    ----------
    tables
        Mapping (or object with attributes) holding ``steps``, ``requests``, ``journey_events``
        and optionally ``batches`` (rebuilt by
        :func:`~bayes_latency.data.reconstruct.reconstruct_batches`; rebuilt here when absent and
        journeys exist). Rows of other experiments are ignored.
    serving, arch, gpu
        :class:`~bayes_latency.physics.serving.ServingConfig`, ``Architecture``, ``GPU``.
    experiment_id, workload
        Labels of the rows.
    terms
        Term set of the ``x_`` columns.

    Returns
    -------
    observations : pandas.DataFrame
        Columns :func:`observation_columns`.
    report : IngestReport
        ``kept`` per kind, ``dropped`` per ``kind:reason``, notes on anchors and approximations.

    Notes
    -----
    Without journeys, only ``iteration`` and ``scheduler_cpu`` rows can be built, from batches
    approximated from the step summaries (``ctx_approximated=True``).
    """
    report = IngestReport(source=f"observations {experiment_id}")
    steps = _steps_of(tables, "steps", experiment_id)
    ev = _steps_of(tables, "journey_events", experiment_id)
    requests = _steps_of(tables, "requests", experiment_id)
    batches = _steps_of(tables, "batches", experiment_id)
    if steps is not None and len(steps) and not _clean_sorted_steps(steps):
        steps = steps.dropna(subset=["step.id", "step.ts_start_ns"]).drop_duplicates("step.id")
        steps = steps.sort_values("step.id")
    have_journeys = ev is not None and len(ev) > 0
    if not have_journeys:
        if steps is None or not len(steps):
            report.notes.append("no journeys and no step summaries: no observation")
            return empty_observations(terms), report
        from bayes_latency.data.steps import iterations_from_steps

        it = iterations_from_steps(steps, block_size=int(serving.block_size), report=report)
        obs = observations_from_iterations(it, arch, gpu, serving, experiment_id=experiment_id,
                                           workload=workload, terms=terms)
        report.notes.append("no journeys: iteration rows from step summaries only "
                            "(ctx_approximated)")
        obs = drop_out_of_domain(obs, report)
        report.kept.update(obs["kind"].value_counts().to_dict())
        return obs, report
    if batches is None or not len(batches):
        batches, _, rrep = reconstruct_batches(ev, requests, serving, steps, with_members=False)
        report.notes.append(rrep.format())
    b_sid = batches["step_id"].to_numpy()
    if not (isinstance(batches.index, pd.RangeIndex) and batches.index.start == 0
            and batches.index.step == 1 and b_sid.dtype.kind in "iu"
            and bool((b_sid[1:] > b_sid[:-1]).all())):  # (else already what the sort gives)
        batches = batches.sort_values("step_id").reset_index(drop=True)
    s0 = int(batches["step_id"].iloc[0])
    n = len(batches)
    if not np.array_equal(batches["step_id"].to_numpy(), np.arange(s0, s0 + n)):
        raise ValueError("batches must hold every step id from the first to the last")
    X = basis_matrix(batches[[c for c in BATCH_COLUMNS if c in batches]], arch, gpu, serving,
                     terms)
    cs = np.vstack([np.zeros((1, X.shape[1])), np.cumsum(X, axis=0)])

    # rows as dicts of columns (_row_dict), one frame at the end (_assemble)
    parts: list[dict[str, Any]] = _timeline_rows(batches, X, steps, ev, requests, terms, report,
                                                 make=_row_dict)
    if requests is not None and len(requests):
        parts += _request_rows(requests, cs, s0, n, terms, report, make=_row_dict)
        parts += _alpha_rows(requests, terms, report, make=_row_dict)
    if steps is not None and len(steps) and "step.duration_us" in steps.columns:
        sid = steps["step.id"].to_numpy(dtype=np.int64)
        dur = steps["step.duration_us"].to_numpy(dtype=float, na_value=np.nan)
        inside = (sid >= s0) & (sid < s0 + n)
        ok = inside & np.isfinite(dur) & (dur > 0)
        if (~ok).sum():
            report.drop("scheduler_cpu:missing_or_nonpositive", int((~ok).sum()))
        if ok.any():
            parts.append(_row_dict("scheduler_cpu", dur[ok], X[sid[ok] - s0], terms,
                                   step_first=sid[ok], step_last=sid[ok]))
    parts = [p for p in parts if len(p["value_us"])]
    if not parts:
        return empty_observations(terms), report
    df = _assemble(parts, terms, experiment_id=experiment_id, workload=workload, arch=arch,
                   gpu=gpu, serving=serving, report=report)
    report.kept.update(df["kind"].value_counts().to_dict())
    return df, report


def observations_from_iterations(iterations: pd.DataFrame, arch: Any, gpu: Any, serving: Any,
                                 experiment_id: str | None = None, workload: str = "",
                                 terms: Sequence[str] = DEFAULT_TERMS) -> pd.DataFrame:
    """``iteration`` rows from an ``iterations`` table (e.g. the real H100 step summaries).

    Parameters
    ----------
    iterations
        ``iterations`` table (:func:`~bayes_latency.data.steps.iterations_from_steps`):
        ``experiment_id, step_id, iteration_us`` + batch-table columns + ``ctx_approximated``.
        Rows with a NaN batch column or a non-positive time are skipped.
    arch, gpu, serving
        Configuration of the experiment(s).
    experiment_id
        Label; default: the table's own ``experiment_id`` column.
    workload, terms
        Workload label and term set.

    Returns
    -------
    pandas.DataFrame
        Observation rows of kind ``iteration``.
    """
    it = iterations
    # tables from step summaries have no prefill_input_pairs: the basis fills it in
    cols = [c for c in BATCH_COLUMNS if c in it.columns]
    ok = it[cols].notna().all(axis=1).to_numpy() & (it["iteration_us"].to_numpy(float) > 0)
    it = it[ok]
    if not len(it):
        return empty_observations(terms)
    X = basis_matrix(it[cols], arch, gpu, serving, terms)
    apx = it["ctx_approximated"].to_numpy(bool) if "ctx_approximated" in it else True
    df = _rows("iteration", it["iteration_us"].to_numpy(float), X, terms,
               step_first=it["step_id"].to_numpy(), step_last=it["step_id"].to_numpy(),
               anchor_exact=True, anchor_error_us=0.0, ctx_approximated=apx)
    df = _nullable_steps(df)
    frames = []
    eids = (it["experiment_id"].astype(str).to_numpy() if experiment_id is None
            and "experiment_id" in it else np.full(len(it), experiment_id or ""))
    for eid in dict.fromkeys(eids):
        part = df[eids == eid].reset_index(drop=True)
        frames.append(_label(part, experiment_id=str(eid), workload=workload, arch=arch, gpu=gpu,
                             serving=serving))
    return _finish(frames, terms)


_SPLITWISE_MODELS = {"llama2-70b": "llama-2-70b", "bloom-176b": "bloom-176b",
                     "llama-2-70b": "llama-2-70b"}


def observations_from_microbench(df: pd.DataFrame, terms: Sequence[str] = DEFAULT_TERMS,
                                 report: IngestReport | None = None,
                                 stack: str = "splitwise") -> pd.DataFrame:
    """``benchmark_mean`` rows from static-batch microbenchmarks (Splitwise format).

    Parameters
    ----------
    df
        One row per measurement with columns ``model, hardware, tensor_parallel`` (or ``tp``),
        ``prompt_size, batch_size, token_size`` and ``prompt_time``, ``token_time`` in
        milliseconds (or ``prompt_time_us``, ``token_time_us``). Repetitions of a point are
        averaged into one row.
    terms
        Term set.
    stack
        Serving software the benchmark ran on (Splitwise's own harness by default): its rows
        form configurations of their own (``model|gpu|tpN|stack``), and the hierarchy gives the
        stack an effect, because a static-batch harness is not the traced vLLM server (measured:
        Llama-2-70B H100 TP4 decode at batch 1 takes 29.4 ms in Splitwise, while the vLLM run's
        median step at batch ~43 is 19.0 ms).
    report
        Counts of points kept/skipped (unknown model or GPU).

    Returns
    -------
    pandas.DataFrame
        Observation rows (kind ``benchmark_mean``, aggregate ``mean``, role ``beta``):

        - ``prompt_time``: one prefill of ``batch_size`` prompts of ``prompt_size`` tokens
          (a single step, no chunking): ``n_steps`` 1.
        - ``token_time``: the mean decode iteration over ``token_size`` steps of ``batch_size``
          sequences whose context grows from ``prompt_size`` to ``prompt_size + token_size - 1``:
          features = mean of the per-step basis, ``n_steps = token_size``.
    """
    from bayes_latency.errors import ConfigError
    from bayes_latency.physics.architecture import load_architecture
    from bayes_latency.physics.hardware import load_gpu
    from bayes_latency.physics.serving import ServingConfig

    report = report if report is not None else IngestReport(source="microbench")
    d = df.copy()
    if "tp" not in d.columns:
        d["tp"] = d["tensor_parallel"]
    for c in ("prompt_time", "token_time"):
        if f"{c}_us" not in d.columns:
            d[f"{c}_us"] = d[c].astype(float) * 1e3
    keys = ["model", "hardware", "tp", "prompt_size", "batch_size"]
    frames = []
    for (model, hw, tp), g in d.groupby(["model", "hardware", "tp"], sort=True):
        try:
            arch = load_architecture(_SPLITWISE_MODELS.get(str(model), str(model)))
            gpu = load_gpu(str(hw))
        except ConfigError as e:
            report.drop("benchmark:unknown_config", len(g))
            report.notes.append(f"microbench {model}/{hw}: {e}")
            continue
        tp = int(tp)
        eid = f"splitwise-{arch.name}-{gpu.name}-tp{tp}"
        parts = []
        # prompt_time: one static prefill per (prompt, batch)
        pt = g.groupby(keys, sort=True)["prompt_time_us"].mean().reset_index()
        P = pt["prompt_size"].to_numpy(float)
        B = pt["batch_size"].to_numpy(float)
        budget = int(max(2048, (P * B).max()))
        serving = ServingConfig(tp=tp, max_num_batched_tokens=budget,
                                max_num_seqs=int(max(128, B.max())), prefix_caching=False)
        batches = pd.DataFrame({
            "num_prefill_reqs": B, "prefill_tokens": B * P,
            "prefill_attn_pairs": B * P * (P + 1) / 2, "prefill_kv_tokens": B * P,
            "num_decode_reqs": 0.0, "decode_tokens": 0.0, "decode_ctx_tokens": 0.0,
        })
        X = basis_matrix(batches, arch, gpu, serving, terms)
        parts.append(_rows("benchmark_mean", pt["prompt_time_us"].to_numpy(float), X, terms,
                           n_steps=1, aggregate="mean", anchor_exact=True, anchor_error_us=0.0))
        # token_time: mean decode step over token_size steps
        tt = g.groupby(keys + ["token_size"], sort=True)["token_time_us"].mean().reset_index()
        feats = []
        for p, b, k in tt[["prompt_size", "batch_size", "token_size"]].itertuples(index=False):
            k = int(k)
            ctx = float(p) + np.arange(k, dtype=float)
            bt = pd.DataFrame({
                "num_prefill_reqs": 0.0, "prefill_tokens": 0.0, "prefill_attn_pairs": 0.0,
                "prefill_kv_tokens": 0.0, "num_decode_reqs": float(b), "decode_tokens": float(b),
                "decode_ctx_tokens": float(b) * ctx,
            })
            feats.append(basis_matrix(bt, arch, gpu, serving, terms).mean(axis=0))
        if feats:
            parts.append(_rows("benchmark_mean", tt["token_time_us"].to_numpy(float),
                               np.vstack(feats), terms,
                               n_steps=tt["token_size"].to_numpy(np.int64), aggregate="mean",
                               anchor_exact=True, anchor_error_us=0.0))
        out = pd.concat(parts, ignore_index=True)
        out = _nullable_steps(out)
        frames.append(_label(out, experiment_id=eid, workload="splitwise", arch=arch, gpu=gpu,
                             serving=serving, stack=stack))
        report.kept["benchmark_mean"] += len(out)
    return _finish(frames, terms)


#: Columns the model reads from an observation table (besides the ``x_`` feature columns).
REQUIRED_COLUMNS: tuple[str, ...] = ("kind", "model", "gpu", "tp", "config_id", "value_us",
                                     "role")


def domain_violations(obs: pd.DataFrame) -> dict[str, np.ndarray]:
    """Rows of an observation table outside the domain, per column (boolean masks).

    ``value_us`` and every ``x_`` feature must be finite and >= 0, ``anchor_error_us`` null or
    finite and >= 0, ``tp`` >= 1 and the other integer columns >= 0 (nulls allowed).
    """
    return _violations({c: obs[c] for c in obs.columns})


def _violations(columns: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """:func:`domain_violations` of columns (Series, numpy or pandas arrays) by name."""
    out: dict[str, np.ndarray] = {}
    for c, s in columns.items():
        dtype = s.dtype
        if pd.api.types.is_bool_dtype(dtype) or not pd.api.types.is_numeric_dtype(dtype):
            continue
        v = (s.to_numpy(dtype=float, na_value=np.nan) if not isinstance(s, np.ndarray)
             else s.astype(float, copy=False))
        if c == "value_us" or c.startswith("x_"):
            bad = ~np.isfinite(v) | (v < 0)
        else:
            lo = 1.0 if c == "tp" else 0.0
            bad = np.isinf(v) | (v < lo)
        if bad.any():
            out[c] = bad
    return out


def validate_observations(obs: pd.DataFrame, source: str = "observations") -> pd.DataFrame:
    """Check an observation table before fitting (columns, types, domain of every value).

    Returns
    -------
    pandas.DataFrame
        ``obs`` unchanged.

    Raises
    ------
    TraceFormatError
        Naming the file, the column and the first offending row: a missing column, a column of
        the wrong type, no rows, or a value outside :func:`domain_violations`' domain.
    """
    from bayes_latency.errors import TraceFormatError

    if not isinstance(obs, pd.DataFrame):
        raise TraceFormatError("not a table", file=source)
    for c in REQUIRED_COLUMNS:
        if c not in obs.columns:
            raise TraceFormatError("observation table lacks a required column", file=source,
                                   field=c)
    if not any(c.startswith("x_") for c in obs.columns):
        raise TraceFormatError("observation table has no feature (x_*) column", file=source,
                               field="x_*")
    for c in ("value_us", "tp", *[c for c in obs.columns if c.startswith("x_")]):
        s = obs[c]
        if pd.api.types.is_bool_dtype(s) or not pd.api.types.is_numeric_dtype(s):
            raise TraceFormatError(f"column is not numeric ({s.dtype})", file=source, field=c)
    if not len(obs):
        raise TraceFormatError("observation table has no rows", file=source)
    for c, bad in domain_violations(obs).items():
        i = int(np.flatnonzero(bad)[0])
        raise TraceFormatError(f"{int(bad.sum())} value(s) outside the column's domain "
                               f"(first: row {i}, value {obs[c].iloc[i]!r})", file=source,
                               field=c)
    return obs


def drop_out_of_domain(obs: pd.DataFrame, report: IngestReport) -> pd.DataFrame:
    """``obs`` without the rows :func:`domain_violations` flags, counted ``out_of_domain:<col>``
    in ``report`` (a last guard: the readers drop bad records earlier, with their own reasons)."""
    viol = domain_violations(obs)
    if not viol:
        return obs
    return _drop_rows(obs, viol, report)


def _drop_rows(obs: pd.DataFrame, viol: dict[str, np.ndarray],
               report: IngestReport) -> pd.DataFrame:
    """``obs`` without the rows flagged in ``viol``, counted per column."""
    bad = np.zeros(len(obs), dtype=bool)
    for c, m in viol.items():
        new = m & ~bad
        if new.any():
            report.drop(f"out_of_domain:{c}", int(new.sum()))
        bad |= m
    return obs[~bad].reset_index(drop=True)
