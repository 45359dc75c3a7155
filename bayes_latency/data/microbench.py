"""Reader of the Splitwise static-batch microbenchmarks (``splitwise_perf_model.csv``).

The CSV has one row per repetition of a (model, hardware, tensor_parallel, prompt_size,
batch_size, token_size) point, times in **milliseconds**:

- ``prompt_time``: one prefill of ``batch_size`` prompts of ``prompt_size`` tokens (no chunking);
- ``token_time``: mean decode iteration while ``batch_size`` sequences generate ``token_size``
  tokens after the prompt;
- ``e2e_time``: prompt plus all decode iterations; ``peak_power`` / ``average_power`` are
  fractions of TDP.

:func:`read_splitwise` converts times to microseconds, maps hardware names to the GPU names of
``physics/hardware.py`` and numbers the repetitions of each point.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from bayes_latency.data.report import IngestReport
from bayes_latency.errors import TraceFormatError
from bayes_latency.textfiles import check_text_start

__all__ = ["GPU_NAMES", "SPLITWISE_COLUMNS", "read_splitwise"]

#: Splitwise hardware name -> GPU name of physics/hardware.py.
GPU_NAMES: dict[str, str] = {"a100-80gb": "A100", "h100-80gb": "H100"}
#: Columns of the returned table.
SPLITWISE_COLUMNS: tuple[str, ...] = (
    "model", "gpu", "tp", "prompt_size", "batch_size", "token_size", "prompt_time_us",
    "token_time_us", "e2e_time_us", "repetition", "hardware", "peak_power", "average_power",
)
_REQUIRED = ("model", "hardware", "tensor_parallel", "prompt_size", "batch_size", "token_size",
             "prompt_time", "token_time", "e2e_time")
_POINT = ["model", "gpu", "tp", "prompt_size", "batch_size", "token_size"]


def read_splitwise(path: str | Path, report: IngestReport | None = None) -> pd.DataFrame:
    """Read Splitwise microbenchmarks into a tidy table (times in µs).

    Parameters
    ----------
    path
        ``splitwise_perf_model.csv``.
    report
        Report to add counts to (``read["rows"]``, ``kept["microbench_rows"]``, drops).

    Returns
    -------
    pandas.DataFrame
        :data:`SPLITWISE_COLUMNS`: ``model`` (as in the file, e.g. ``llama2-70b``), ``gpu``
        (``A100`` / ``H100``; an unknown hardware name is kept as is and noted), ``tp``,
        ``prompt_size``, ``batch_size``, ``token_size`` (int64), ``prompt_time_us``,
        ``token_time_us``, ``e2e_time_us`` (float), ``repetition`` (0-based index of the row
        within its run of consecutive rows of the same point: a point measured again in
        another sweep starts again at 0), ``hardware`` (raw name),
        ``peak_power``, ``average_power`` (NaN if absent). Rows with a missing, non-numeric,
        non-integral or non-positive size / tp, or a missing / non-positive time, are dropped
        and counted ``bad_value:<column>``.

    Raises
    ------
    TraceFormatError
        If the file cannot be read or lacks a required column (named in the error).
    """
    path = Path(path)
    report = report if report is not None else IngestReport(source=str(path))
    try:
        check_text_start(path, "microbenchmark CSV", TraceFormatError,
                         compressed_ok=path.suffix.lower() == ".gz")
        raw = pd.read_csv(path)
    except TraceFormatError:
        raise
    except Exception as exc:  # parser / IO errors of many kinds
        raise TraceFormatError(f"cannot read microbenchmark CSV: {exc}", file=str(path)) from exc
    for col in _REQUIRED:
        if col not in raw.columns:
            raise TraceFormatError(f"missing required column {col!r}", file=str(path), field=col)
    report.read["rows"] += len(raw)
    bad = np.zeros(len(raw), dtype=bool)
    out = pd.DataFrame(index=raw.index)
    for col in ("model", "hardware"):
        s = raw[col]
        this = s.isna().to_numpy() | (s.astype("str").str.strip() == "").to_numpy()
        this &= ~bad
        if this.any():
            report.drop(f"bad_value:{col}", int(this.sum()))
            bad |= this
        out[col] = s.astype("str").str.strip()
    for src, dst in (("tensor_parallel", "tp"), ("prompt_size", "prompt_size"),
                     ("batch_size", "batch_size"), ("token_size", "token_size")):
        v = pd.to_numeric(raw[src], errors="coerce").to_numpy(dtype=float)
        with np.errstate(invalid="ignore"):
            this = ~(np.isfinite(v) & (v > 0) & (np.floor(v) == v)) & ~bad
        if this.any():
            report.drop(f"bad_value:{src}", int(this.sum()))
            bad |= this
        out[dst] = np.where(np.isfinite(v), v, 0).astype(np.int64)
    for src in ("prompt_time", "token_time", "e2e_time"):
        v = pd.to_numeric(raw[src], errors="coerce").to_numpy(dtype=float)
        with np.errstate(invalid="ignore"):
            this = ~(np.isfinite(v) & (v > 0)) & ~bad
        if this.any():
            report.drop(f"bad_value:{src}", int(this.sum()))
            bad |= this
        out[f"{src}_us"] = v * 1000.0
    for col in ("peak_power", "average_power"):
        out[col] = (pd.to_numeric(raw[col], errors="coerce").astype(float)
                    if col in raw.columns else np.nan)
    out = out[~bad].copy()
    out["gpu"] = out["hardware"].map(lambda h: GPU_NAMES.get(h.lower(), h))
    unknown = sorted(set(out.loc[~out["hardware"].str.lower().isin(list(GPU_NAMES)),
                                 "hardware"]))
    if unknown:
        report.notes.append(f"unknown hardware kept as GPU name: {', '.join(unknown)}")
    # a point is repeated in consecutive rows; the same point can come back later in another
    # sweep (e.g. prompt 512 / batch 1 / 128 tokens in the prompt, batch and token sweeps)
    key = out[_POINT].astype("str").agg("|".join, axis=1)
    run = (key != key.shift()).cumsum()
    out["repetition"] = out.groupby(run, sort=False).cumcount().astype(np.int64)
    out = out[list(SPLITWISE_COLUMNS)].reset_index(drop=True)
    report.kept["microbench_rows"] += len(out)
    return out
