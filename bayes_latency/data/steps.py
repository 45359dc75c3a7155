"""Tidy step tables (``step.BATCH_SUMMARY`` records) and the iteration times they reveal.

A *step table* has one row per sampled engine step with the trace attribute names as columns
(``step.id``, ``step.ts_start_ns``, ..., ``kv.blocks_free_gpu``; see ``data/otlp/read.py``
:data:`~bayes_latency.data.otlp.read.STEP_COLUMNS`) plus ``experiment_id``. The real
``batch_summaries.parquet`` is one; ``read_otlp(...).steps`` is another.

Iteration times
---------------
``step.duration_us`` is the CPU time of the scheduler's ``schedule()`` call, not the forward pass.
The time of engine iteration ``i`` is ``step.ts_start_ns(i+1) - step.ts_start_ns(i)``, known only
when both step ids were sampled (about 1 % of the steps at a 10 % sampling rate).
:func:`iterations_from_steps` builds the contract's ``iterations`` table from such pairs.

Batch columns from a summary (no per-request contexts, so ``ctx_approximated=True``)
-------------------------------------------------------------------------------------
- ``num_prefill_reqs``, ``prefill_tokens``, ``num_decode_reqs``, ``decode_tokens``: the summary's
  ``batch.*`` counts. Tokens recomputed after a preemption are counted by vLLM as *decode* tokens
  and stay there (the summary cannot separate them).
- ``prefill_kv_tokens = prefill_tokens`` and ``prefill_attn_pairs = n * c * (c + 1) / 2`` with
  ``c = prefill_tokens / n`` (``n`` prefill requests of equal chunks, offset 0). Both are lower
  bounds: chunks after the first one of a request, and prefix-cache hits, attend to an earlier
  context that the summary does not report. ``prefill_input_pairs`` is left out: the basis
  fills it in under the same equal-chunk assumption (``physics.basis.input_pairs_fallback``).
- ``decode_ctx_tokens``: the tokens resident in the KV cache, ``kv.usage_gpu_ratio *
  kv.blocks_total_gpu * block_size`` (``(blocks_total - blocks_free) * block_size`` when the ratio
  is missing), minus the prefill tokens scheduled in this step (their blocks are allocated by
  ``schedule()`` before the summary is built), clipped below at ``num_decode_reqs`` (each decode
  request has at least one token of context) and at 0. What it still includes: the earlier chunks
  of requests whose prefill is in progress and the unused tail of each request's last block
  (block granularity). What it misses: blocks shared through prefix caching are counted once.
  So it is an approximation, flagged by ``ctx_approximated``.
- ``offload_tokens = 0`` (not observable from summaries).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from bayes_latency.data.otlp.read import STEP_COLUMNS, STEP_INT_COLUMNS
from bayes_latency.data.report import IngestReport
from bayes_latency.errors import TraceFormatError
from bayes_latency.textfiles import check_regular

__all__ = [
    "REQUIRED_STEP_COLUMNS",
    "drop_over_serving_limits",
    "ITERATION_COLUMNS",
    "BATCH_COLUMNS",
    "load_step_table",
    "iterations_from_steps",
]

#: Columns a step table must have (the others of STEP_COLUMNS are filled with nulls).
REQUIRED_STEP_COLUMNS: tuple[str, ...] = (
    "step.id", "step.ts_start_ns", "step.duration_us", "batch.num_prefill_reqs",
    "batch.num_decode_reqs", "batch.prefill_tokens", "batch.decode_tokens",
)
#: Batch-table columns of physics/basis.py, in the contract's order.
BATCH_COLUMNS: tuple[str, ...] = (
    "num_prefill_reqs", "prefill_tokens", "prefill_attn_pairs", "prefill_kv_tokens",
    "num_decode_reqs", "decode_tokens", "decode_ctx_tokens", "offload_tokens",
)
#: Columns of the iterations table.
ITERATION_COLUMNS: tuple[str, ...] = (
    ("experiment_id", "step_id", "iteration_us", "schedule_cpu_us") + BATCH_COLUMNS
    + ("ctx_approximated",)
)
# columns where a negative value is impossible (checked when present)
_NON_NEGATIVE = tuple(c for c in STEP_INT_COLUMNS) + ("kv.usage_gpu_ratio",)
# times: NaN or negative drops the row
_TIME_COLUMNS = ("step.ts_start_ns", "step.duration_us")


def load_step_table(path: str | Path, experiment_id: str | None = None,
                    report: IngestReport | None = None) -> pd.DataFrame:
    """Read and validate a tidy step table (Parquet or CSV).

    Parameters
    ----------
    path
        ``.parquet`` / ``.pq`` or ``.csv`` file whose columns are trace attribute names
        (``step.id``, ``step.ts_start_ns``, ...), possibly with several experiments keyed by
        an ``experiment_id`` column. Other columns (``model``, ``tp`` ...) are kept.
    experiment_id
        Used when the file has no ``experiment_id`` column (default: the file stem).
    report
        Report to add counts to (``read["rows"]``, ``kept["steps"]``, drops by reason).

    Returns
    -------
    pandas.DataFrame
        :data:`~bayes_latency.data.otlp.read.STEP_COLUMNS` (nullable ``Int64``, except
        ``kv.usage_gpu_ratio`` float64) + ``experiment_id`` + any extra columns of the file,
        sorted by (experiment_id, step.id). Rows with a missing id, a NaN or negative time, a
        negative or non-numeric count, or a repeated (experiment_id, step.id) are dropped and
        counted (``bad_value:<column>``, ``duplicate_step``).

    Raises
    ------
    TraceFormatError
        If the file cannot be read, has an unknown suffix, or lacks a required column
        (:data:`REQUIRED_STEP_COLUMNS`; the error names it).
    """
    path = Path(path)
    report = report if report is not None else IngestReport(source=str(path))
    suffix = path.suffix.lower()
    try:
        check_regular(path, "step table", TraceFormatError)
        if suffix in (".parquet", ".pq"):
            raw = pd.read_parquet(path)
        elif suffix == ".csv":
            raw = pd.read_csv(path)
        else:
            raise TraceFormatError(f"unknown step table format {suffix!r} (use .parquet or .csv)",
                                   file=str(path))
    except TraceFormatError:
        raise
    except Exception as exc:  # pyarrow / parser errors of many kinds
        raise TraceFormatError(f"cannot read step table: {exc}", file=str(path)) from exc
    default_id = experiment_id if experiment_id is not None else path.stem
    return validate_step_table(raw, source=str(path), experiment_id=default_id, report=report)


def validate_step_table(raw: pd.DataFrame, source: str = "", experiment_id: str = "",
                        report: IngestReport | None = None) -> pd.DataFrame:
    """Validate an in-memory step table (see :func:`load_step_table`)."""
    report = report if report is not None else IngestReport(source=source)
    for col in REQUIRED_STEP_COLUMNS:
        if col not in raw.columns:
            raise TraceFormatError(f"step table lacks required column {col!r}",
                                   file=source or None, field=col)
    df = raw.copy()
    report.read["rows"] += len(df)
    if "experiment_id" not in df.columns:
        df["experiment_id"] = experiment_id
    df["experiment_id"] = df["experiment_id"].astype("str")
    bad = pd.Series(False, index=df.index)
    for col in STEP_COLUMNS:
        if col not in df.columns:
            df[col] = pd.array([None] * len(df),
                               dtype="float64" if col == "kv.usage_gpu_ratio" else "Int64")
            continue
        if col == "kv.usage_gpu_ratio":
            df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
            this = df[col] < 0
        else:
            ints, unusable = _as_int64(df[col])
            df[col] = ints
            this = unusable | (ints < 0).fillna(False).to_numpy(dtype=bool)
            if col == "step.id" or col in _TIME_COLUMNS:
                this |= ints.isna().to_numpy(dtype=bool)
            this = pd.Series(this, index=df.index)
        this = this.fillna(False).astype(bool) & ~bad
        if this.any():
            report.drop(f"bad_value:{col}", int(this.sum()))
            bad |= this
    df = df[~bad]
    extra = [c for c in df.columns if c not in STEP_COLUMNS and c != "experiment_id"]
    df = df[list(STEP_COLUMNS) + ["experiment_id"] + extra]
    df = df.sort_values(["experiment_id", "step.id"], kind="stable")
    dup = df.duplicated(subset=["experiment_id", "step.id"], keep="first")
    if dup.any():
        report.drop("duplicate_step", int(dup.sum()))
        df = df[~dup]
    df = df.reset_index(drop=True)
    report.kept["steps"] += len(df)
    return df


def _as_int64(col: pd.Series) -> tuple[pd.Series, np.ndarray]:
    """Nullable Int64 version of ``col`` and a mask of values that are not integers."""
    if pd.api.types.is_integer_dtype(col.dtype) and not pd.api.types.is_unsigned_integer_dtype(
            col.dtype):
        return col.astype("Int64"), np.zeros(len(col), dtype=bool)
    num = pd.to_numeric(col, errors="coerce")
    if pd.api.types.is_integer_dtype(num.dtype) and not pd.api.types.is_unsigned_integer_dtype(
            num.dtype):
        unusable = (num.isna() & col.notna()).to_numpy(dtype=bool)
        return num.astype("Int64"), unusable
    vals = num.astype("float64")
    arr = vals.to_numpy()
    with np.errstate(invalid="ignore"):
        usable = np.isfinite(arr) & (np.floor(arr) == arr) & (np.abs(arr) < 2.0**63)
    unusable = (~usable & ~np.isnan(arr)) | (np.isnan(arr) & col.notna().to_numpy())
    clean = np.where(usable, arr, 0.0).astype(np.int64)
    out = pd.Series(pd.array(clean, dtype="Int64"), index=col.index)
    out[~usable] = pd.NA
    return out, unusable


def _batch_from_summary(s: pd.DataFrame, block_size: int) -> dict[str, np.ndarray]:
    """Batch-table columns approximated from step summary rows (see module docstring)."""
    def col(name: str) -> np.ndarray:
        return s[name].to_numpy(dtype=float, na_value=np.nan)

    n_pre, p_tok = col("batch.num_prefill_reqs"), col("batch.prefill_tokens")
    n_dec, d_tok = col("batch.num_decode_reqs"), col("batch.decode_tokens")
    with np.errstate(divide="ignore", invalid="ignore"):
        c = np.where(n_pre > 0, p_tok / n_pre, 0.0)
    pairs = np.where(n_pre > 0, n_pre * c * (c + 1.0) / 2.0, 0.0)
    ratio = col("kv.usage_gpu_ratio")
    total = col("kv.blocks_total_gpu")
    free = col("kv.blocks_free_gpu")
    resident_blocks = np.where(np.isnan(ratio), total - free, ratio * total)
    resident = resident_blocks * block_size
    ctx = np.fmax(resident - np.nan_to_num(p_tok), n_dec)  # fmax: NaN resident -> n_dec
    ctx = np.where(np.isnan(resident), np.nan, np.maximum(ctx, 0.0))
    return {
        "num_prefill_reqs": n_pre, "prefill_tokens": p_tok, "prefill_attn_pairs": pairs,
        "prefill_kv_tokens": p_tok, "num_decode_reqs": n_dec, "decode_tokens": d_tok,
        "decode_ctx_tokens": ctx, "offload_tokens": np.zeros(len(s)),
    }


def iterations_from_steps(steps: pd.DataFrame, block_size: int = 16,
                          report: IngestReport | None = None) -> pd.DataFrame:
    """Iteration times of steps whose successor was also sampled (the ``iterations`` table).

    Parameters
    ----------
    steps
        Step table (:func:`load_step_table` or ``read_otlp(...).steps``). Without an
        ``experiment_id`` column all rows are one experiment (``""``).
    block_size
        KV block size in tokens (for ``decode_ctx_tokens``).
    report
        Report to add counts to: ``kept["iterations"]``, drops ``non_positive_gap`` (a pair whose
        start times do not increase) and ``duplicate_step``.

    Returns
    -------
    pandas.DataFrame
        :data:`ITERATION_COLUMNS`: ``experiment_id, step_id, iteration_us, schedule_cpu_us``, the
        batch-table columns of ``physics/basis.py`` and ``ctx_approximated`` (always True), one row
        per step id ``i`` with ``i + 1`` present in the same experiment; ``iteration_us =
        (ts_start_ns(i+1) - ts_start_ns(i)) / 1000`` and ``schedule_cpu_us = step.duration_us``.
    """
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    report = report if report is not None else IngestReport(source="iterations")
    needed = ("step.id", "step.ts_start_ns", "step.duration_us", "batch.num_prefill_reqs",
              "batch.num_decode_reqs", "batch.prefill_tokens", "batch.decode_tokens")
    for c in needed:
        if c not in steps.columns:
            raise TraceFormatError(f"step table lacks required column {c!r}", field=c)
    s = steps.copy()
    for c in ("kv.usage_gpu_ratio", "kv.blocks_total_gpu", "kv.blocks_free_gpu"):
        if c not in s.columns:
            s[c] = np.nan
    if "experiment_id" not in s.columns:
        s["experiment_id"] = ""
    s = s[s["step.id"].notna() & s["step.ts_start_ns"].notna()]
    s = s.sort_values(["experiment_id", "step.id"], kind="stable")
    dup = s.duplicated(subset=["experiment_id", "step.id"])
    if dup.any():
        report.drop("duplicate_step", int(dup.sum()))
        s = s[~dup]
    s = s.reset_index(drop=True)
    sid = s["step.id"].to_numpy(dtype=np.int64)
    ts = s["step.ts_start_ns"].to_numpy(dtype=np.int64)
    exp = s["experiment_id"].astype("str").to_numpy(dtype=object)
    nxt = np.zeros(len(s), dtype=bool)
    if len(s) > 1:
        nxt[:-1] = (sid[1:] == sid[:-1] + 1) & (exp[1:] == exp[:-1])
    idx = np.flatnonzero(nxt)
    gap_ns = ts[idx + 1] - ts[idx]
    ok = gap_ns > 0
    if (~ok).any():
        report.drop("non_positive_gap", int((~ok).sum()))
    idx, gap_ns = idx[ok], gap_ns[ok]
    rows = s.iloc[idx]
    batch = _batch_from_summary(rows, block_size)
    out = pd.DataFrame({
        "experiment_id": pd.Series(exp[idx], dtype="str"),
        "step_id": sid[idx],
        "iteration_us": gap_ns / 1000.0,
        "schedule_cpu_us": rows["step.duration_us"].to_numpy(dtype=float, na_value=np.nan),
        **batch,
        "ctx_approximated": np.ones(len(idx), dtype=bool),
    })
    report.kept["iterations"] += len(out)
    return out[list(ITERATION_COLUMNS)]


def drop_over_serving_limits(steps: pd.DataFrame, max_num_seqs: int | None,
                             max_num_batched_tokens: int | None, report: IngestReport,
                             source: str = "") -> pd.DataFrame:
    """The step summaries without the ones the serving config makes impossible.

    vLLM schedules at most ``max_num_seqs`` requests and ``max_num_batched_tokens`` tokens in one
    step; a summary above either (``batch.num_prefill_reqs + batch.num_decode_reqs``, or
    ``batch.prefill_tokens + batch.decode_tokens``) is a corrupt record or a wrong config. Such
    rows are dropped and counted (``steps`` records, reason ``over_max_num_seqs`` /
    ``over_max_num_batched_tokens``), with a note naming the first one. A limit of None is not
    checked (pass only the limits the user gave: the defaults may not be the server's).
    """
    if not len(steps) or (max_num_seqs is None and max_num_batched_tokens is None):
        return steps

    def col(name: str) -> np.ndarray:
        if name not in steps:
            return np.zeros(len(steps))
        return pd.to_numeric(steps[name], errors="coerce").to_numpy(dtype=float, na_value=0.0)

    reqs = col("batch.num_prefill_reqs") + col("batch.num_decode_reqs")
    toks = col("batch.prefill_tokens") + col("batch.decode_tokens")
    bad = np.zeros(len(steps), dtype=bool)
    for limit, vals, what, field in (
            (max_num_seqs, reqs, "requests", "max_num_seqs"),
            (max_num_batched_tokens, toks, "tokens", "max_num_batched_tokens")):
        if limit is None:
            continue
        over = (vals > limit) & ~bad
        if over.any():
            i = int(np.flatnonzero(over)[0])
            sid = steps["step.id"].iloc[i] if "step.id" in steps else i
            report.drop_record("steps", f"over_{field}", int(over.sum()))
            report.notes.append(
                f"{source}: {int(over.sum())} step summary(ies) schedule more {what} than the "
                f"serving config's {field} = {limit} (first: step {sid}, {vals[i]:g} {what}); "
                f"dropped")
            bad |= over
    if not bad.any():
        return steps
    report.kept["steps"] -= int(bad.sum())
    return steps.loc[~bad].reset_index(drop=True)
