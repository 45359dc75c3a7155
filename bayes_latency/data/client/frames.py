"""The client tables' columns and dtypes, and the summary statistics computed from request rows.

Every client reader (:mod:`.lifecycle`, :mod:`.vllm_bench`, :mod:`.tracev2`) builds its output
with :func:`summary_frame` and :func:`requests_frame`, so that all formats give the same two
tables; :mod:`.read` recognises a format and dispatches to its reader.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from bayes_latency.data.client.lifecycle import LIFECYCLE_COLUMNS

__all__ = ["CLIENT_REQUEST_COLUMNS", "CLIENT_SUMMARY_COLUMNS", "MAX_PLAUSIBLE_DECODE_S",
           "MAX_PLAUSIBLE_LATENCY_S", "decode_interval", "plausibility_notes",
           "requests_frame", "summary_frame", "summary_from_requests"]

#: Columns of the client summary rows (the ``lifecycle`` table's, plus four).
#: ``max_concurrency`` / ``burstiness`` are vLLM's load settings (NaN elsewhere), ``duration_s``
#: the run's wall time (vLLM's ``duration``; TraceV2: first send to last chunk).
CLIENT_SUMMARY_COLUMNS: tuple[str, ...] = LIFECYCLE_COLUMNS + ("source", "max_concurrency",
                                                               "burstiness", "duration_s")

#: Columns of the per-request client table ``client_requests``.
#: ``arrival_s`` / ``send_s`` are seconds since the run's first arrival, on one clock (NaN when
#: the input does not record them; without arrivals ``arrival_s = send_s``; for TraceV2, whose
#: arrivals and sends are on different clocks, they are aligned so that the smallest send delay
#: is 0); ``status`` is ``"ok"`` or ``"error"`` (failed, timed-out or unfinished
#: requests, whose latencies are NaN) and ``error`` the recorded message (cut to 200 characters).
CLIENT_REQUEST_COLUMNS: tuple[str, ...] = (
    "experiment_id", "source", "request_index", "request_id", "arrival_s", "send_s",
    "prompt_tokens", "output_tokens", "ttft_s", "e2e_s", "decode_interval_s", "status", "error")

_STATS = (("mean", None), ("median", 50.0), ("p90", 90.0), ("p99", 99.0))


def _stats(values: np.ndarray) -> dict[str, float]:
    """mean / median / p90 / p99 of the finite values (NaN when there are none)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if not v.size:
        return {s: math.nan for s, _ in _STATS}
    return {s: float(v.mean()) if q is None else float(np.percentile(v, q)) for s, q in _STATS}


def summary_from_requests(req: pd.DataFrame, itl_values: np.ndarray | None = None
                          ) -> dict[str, float]:
    """Lifecycle summary fields computed from a per-request table.

    Parameters
    ----------
    req
        Rows of :data:`CLIENT_REQUEST_COLUMNS` of one run (failed rows included).
    itl_values
        All inter-token (inter-chunk) intervals of the successful requests, seconds, when the
        input records them; else the ITL statistics are NaN.

    Returns
    -------
    dict
        ``count, successes, failures``, ``<m>_<stat>_s`` for ``ttft, e2e, tpot`` (the per-request
        decode interval ``(e2e - ttft) / (output - 1)``, requests with > 1 output token),
        ``ntpot`` (``e2e / output``) and ``itl``, ``prompt_len_mean``, ``output_len_mean``,
        ``decode_interval_s`` (from the means, as in :mod:`bayes_latency.data.client.lifecycle`).
    """
    ok = req[req["status"] == "ok"]
    out: dict[str, float] = {"count": float(len(req)), "successes": float(len(ok)),
                             "failures": float(len(req) - len(ok))}
    ttft = ok["ttft_s"].to_numpy(dtype=float)
    e2e = ok["e2e_s"].to_numpy(dtype=float)
    n_out = ok["output_tokens"].to_numpy(dtype=float, na_value=np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        ntpot = np.where(n_out > 0, e2e / n_out, np.nan)
    per = {"ttft": ttft, "e2e": e2e, "tpot": ok["decode_interval_s"].to_numpy(dtype=float),
           "ntpot": ntpot,
           "itl": np.asarray(itl_values, dtype=float) if itl_values is not None else np.array([])}
    for m, vals in per.items():
        for s, v in _stats(vals).items():
            out[f"{m}_{s}_s"] = v
    out["prompt_len_mean"] = _mean(ok["prompt_tokens"])
    out["output_len_mean"] = _mean(ok["output_tokens"])
    out["decode_interval_s"] = decode_interval(out["e2e_mean_s"], out["ttft_mean_s"],
                                               out["output_len_mean"])
    return out


def _mean(s: pd.Series) -> float:
    v = s.to_numpy(dtype=float, na_value=np.nan)
    v = v[np.isfinite(v)]
    return float(v.mean()) if v.size else math.nan


def decode_interval(e2e_mean: float, ttft_mean: float, out_len_mean: float) -> float:
    """``(mean E2E - mean TTFT) / (mean output length - 1)``; NaN when the length is <= 1."""
    if not out_len_mean > 1.0:
        return math.nan
    return (e2e_mean - ttft_mean) / (out_len_mean - 1.0)


def summary_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Summary rows -> a frame of :data:`CLIENT_SUMMARY_COLUMNS` with the lifecycle dtypes."""
    df = pd.DataFrame(rows)
    for c in CLIENT_SUMMARY_COLUMNS:
        if c not in df:
            df[c] = None
    df["stage"] = df["stage"].astype("str")
    df["stage_index"] = pd.array(df["stage_index"].tolist(), dtype="Int64")
    df["tp"] = pd.array([None if v is None or (isinstance(v, float) and math.isnan(v)) else v
                         for v in df["tp"].tolist()], dtype="Int64")
    for c in ("model", "source", "experiment_id"):
        df[c] = df[c].astype("object")
    for c in CLIENT_SUMMARY_COLUMNS:
        if c not in ("experiment_id", "stage", "stage_index", "model", "tp", "source"):
            df[c] = pd.to_numeric(df[c], errors="coerce").astype(np.float64)
    return df[list(CLIENT_SUMMARY_COLUMNS)].reset_index(drop=True)


def requests_frame(rows: dict[str, list[Any]] | pd.DataFrame) -> pd.DataFrame:
    """Per-request columns -> a frame of :data:`CLIENT_REQUEST_COLUMNS` with fixed dtypes."""
    df = pd.DataFrame(rows)
    for c in CLIENT_REQUEST_COLUMNS:
        if c not in df:
            df[c] = pd.Series(dtype="object")
    df["request_index"] = df["request_index"].astype(np.int64)
    for c in ("prompt_tokens", "output_tokens"):
        df[c] = pd.array([None if v is None or (isinstance(v, float) and math.isnan(v))
                          else int(v) for v in df[c].tolist()], dtype="Int64")
    for c in ("arrival_s", "send_s", "ttft_s", "e2e_s", "decode_interval_s"):
        df[c] = pd.to_numeric(df[c], errors="coerce").astype(np.float64)
    for c in ("experiment_id", "source", "request_id", "status", "error"):
        df[c] = df[c].astype("object")
    return df[list(CLIENT_REQUEST_COLUMNS)].reset_index(drop=True)


def _empty_requests() -> pd.DataFrame:
    return requests_frame({c: [] for c in CLIENT_REQUEST_COLUMNS})


#: Mean TTFT or E2E (seconds) above which a client summary is flagged as implausible: requests
#: of a benchmark taking more than half an hour on average, likely latencies in the wrong unit
#: (milliseconds written as seconds turn a 2.5 s E2E into 41 minutes).
MAX_PLAUSIBLE_LATENCY_S = 1800.0
#: Mean decode interval (seconds per output token) above which a summary is flagged: vLLM decodes
#: a token in 5-200 ms (x1000: 5-200 s).
MAX_PLAUSIBLE_DECODE_S = 2.0


def plausibility_notes(lifecycle: pd.DataFrame | None, source: str = "") -> list[str]:
    """Notes on client summary rows whose means no LLM server produces (see
    :data:`MAX_PLAUSIBLE_LATENCY_S`, :data:`MAX_PLAUSIBLE_DECODE_S`); the rows are kept."""
    if lifecycle is None or not len(lifecycle):
        return []
    notes = []
    checks = (("ttft_mean_s", MAX_PLAUSIBLE_LATENCY_S, "mean TTFT"),
              ("e2e_mean_s", MAX_PLAUSIBLE_LATENCY_S, "mean E2E"),
              ("decode_interval_s", MAX_PLAUSIBLE_DECODE_S, "mean decode interval"))
    for col, limit, what in checks:
        if col not in lifecycle:
            continue
        v = pd.to_numeric(lifecycle[col], errors="coerce").to_numpy(dtype=float)
        over = np.flatnonzero(np.isfinite(v) & (v > limit))
        if len(over):
            r = lifecycle.iloc[int(over[0])]
            notes.append(f"{source}: implausible {what} {v[over[0]]:.6g} s "
                         f"(above {limit:g} s; latencies in the wrong unit?) in "
                         f"{len(over)} row(s), first: experiment {r.get('experiment_id')!r} "
                         f"stage {r.get('stage')!r}")
    return notes
