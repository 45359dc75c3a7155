"""The observation table's columns, row construction and domain checks.

Part of :mod:`bayes_latency.data.observations.build` (whose docstring describes the row kinds): the
contract columns, configuration ids, rows of one kind as column dicts (``_row_dict``) or frames
(``_rows``), their assembly into the final frame (``_assemble``, ``_finish``, ``_label``) and the
domain of every value (:func:`domain_violations`, :func:`validate_observations`,
:func:`drop_out_of_domain`), and the rows no GPU can have measured
(:func:`faster_than_peak_compute`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from pandas.api.types import pandas_dtype

from bayes_latency.data.frames import frame
from bayes_latency.data.report import IngestReport
from bayes_latency.physics.basis import ALPHA_TERMS, DEFAULT_TERMS, term_names

# dtypes resolved once: a dtype string costs pandas a registry lookup per call (12-22
# microseconds; thousands of calls per demo-fleet ingest)
_STR = pandas_dtype("str")

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

_KIND_ROLE = {"iteration": "beta", "step_window": "beta", "benchmark_mean": "beta",
              "request_prefill": "ppc", "request_decode": "ppc", "scheduler_cpu": "aux",
              "alpha_arrival": "alpha", "alpha_departure": "alpha",
              "workload_ttft": "workload", "workload_e2e": "workload", "workload_decode": "ppc"}


#: Roles of the kinds whose value holds the GPU work of their features (not the scheduler's CPU
#: time, ``aux``, nor the per-request host overheads, ``alpha``).
GPU_TIME_ROLES = frozenset({"beta", "ppc", "workload"})


def faster_than_peak_compute(obs: pd.DataFrame) -> pd.DataFrame:
    """Rows measured in less time than their compute takes at the GPU's datasheet peak.

    ``compute_floor_us = x_prefill_compute + x_decode_compute``: the row's FLOPs at the dense
    peak FLOP/s of the model's matmul dtype, in µs (:mod:`bayes_latency.physics.basis`). No GPU
    computes faster than its peak, so ``value_us < compute_floor_us`` means the value is not
    the row's GPU time (a failed measurement, or a gap between step starts that does not span
    the step) or the row's GPU, dtype or model is wrong. Only rows whose kind holds GPU time
    (:data:`GPU_TIME_ROLES`) and whose floor is positive are compared; a table without either
    feature column has none.

    Returns
    -------
    pandas.DataFrame
        ``obs_id``, ``kind``, ``config_id``, ``value_us``, ``compute_floor_us`` and ``ratio``
        (``value_us / compute_floor_us``) of each such row, lowest ratio first.
    """
    cols = ["obs_id", "kind", "config_id", "value_us", "compute_floor_us", "ratio"]
    feats = [c for c in ("x_prefill_compute", "x_decode_compute") if c in obs.columns]
    if not feats or not len(obs) or not {"kind", "value_us"} <= set(obs.columns):
        return pd.DataFrame(columns=cols)
    floor = obs[feats].to_numpy(float).sum(axis=1)
    value = obs["value_us"].to_numpy(float)
    gpu = obs["kind"].map(_KIND_ROLE).isin(GPU_TIME_ROLES).to_numpy()
    with np.errstate(invalid="ignore"):
        bad = gpu & (floor > 0) & np.isfinite(floor) & (value < floor)
    out = obs.loc[bad].reindex(columns=["obs_id", "kind", "config_id", "value_us"])
    out["compute_floor_us"] = floor[bad]
    out["ratio"] = value[bad] / floor[bad]
    return out[cols].sort_values("ratio", kind="stable").reset_index(drop=True)


def without_faster_than_peak(obs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``obs`` without the rows of :func:`faster_than_peak_compute` (what a fit leaves out), and
    those rows."""
    fast = faster_than_peak_compute(obs)
    if not len(fast):
        return obs, fast
    return obs[~obs["obs_id"].isin(fast["obs_id"])], fast


def peak_compute_note(rows: pd.DataFrame, max_examples: int = 3) -> str:
    """One line on the rows of :func:`faster_than_peak_compute` (empty when there are none)."""
    if not len(rows):
        return ""
    ex = "; ".join(f"{r.obs_id} ({r.ratio:.2f}x)" for r in rows.head(max_examples).itertuples())
    more = f"; {len(rows) - max_examples} more" if len(rows) > max_examples else ""
    return (f"{len(rows)} row(s) measured in less time than their compute takes at the GPU's "
            f"peak (value_us below x_prefill_compute + x_decode_compute): {ex}{more}. No GPU "
            "is that fast: the value is not the row's GPU time (a failed measurement, or a gap "
            "that does not span the step), or the row's GPU, dtype or model is wrong; dropped "
            "from the fit")


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
    return pd.array(arr, dtype=_STR)


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
        df = frame(out)
        return _drop_rows(df, viol, report) if viol else df
    return frame(out)


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


def _nullable_steps(df: pd.DataFrame) -> pd.DataFrame:
    for c in ("step_first", "step_last"):
        df[c] = pd.array(pd.to_numeric(df[c], errors="coerce"), dtype="Float64").round().astype(
            "Int64")
    return df


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


def validate_observations(obs: pd.DataFrame, source: str = "observations",
                          locate: Callable[[int], tuple[str, int]] | None = None
                          ) -> pd.DataFrame:
    """Check an observation table before fitting (columns, types, domain of every value).

    ``locate`` maps a row of ``obs`` to ``(file, row in that file)`` (for a table read from
    several partitions, :func:`bayes_latency.data.tables.row_locator`): a bad value is then
    reported at its partition file and row.

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
        where, row = locate(i) if locate is not None else (source, i)
        raise TraceFormatError(f"{int(bad.sum())} value(s) outside the column's domain "
                               f"(first: row {row}, value {obs[c].iloc[i]!r})", file=where,
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
