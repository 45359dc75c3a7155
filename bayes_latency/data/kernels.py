"""Reader of AIConfigurator's measured GEMM tables: kernel latencies per GPU, beside the roofline.

AIConfigurator (``aiconfigurator-core``, Apache-2.0; the optional extra ``kernels`` of this
package) ships kernel latencies measured under serving frameworks on many GPUs, as Parquet files
inside the installed package: ``systems/data/<system>/gemm/<framework>/<version>/gemm_perf.parquet``
with columns ``framework, version, device, op_name, kernel_source, gemm_dtype, m, n, k, latency``
(latency in milliseconds). They are read from the installed package, never copied.

:func:`read_gemm_tables` returns one row per measured GEMM ``(m x k) @ (k x n)``, with its
roofline quantities on the GPU's datasheet (:mod:`bayes_latency.physics.hardware`):

- ``flops = 2 m n k``; ``t_compute_us = flops / peak`` (the bf16 peak, or the fp8 peak for fp8
  GEMMs);
- ``bytes = (m k + k n + m n) * dtype bytes`` (each operand read once, the result written once);
  ``t_memory_us = bytes / hbm_bandwidth``;
- ``latency_us`` the measurement.

:func:`roofline_efficiency` reduces them per GPU and dtype to the share of the datasheet a GPU
reaches where a GEMM is compute-bound (``t_compute / latency`` of large GEMMs) and where it is
memory-bound (``t_memory / latency`` of GEMMs with few rows, the shape of a decode step's weight
reads). Those two shares are what a serving step's compute and weight-loading terms are made of;
a kernel table says nothing of what a step adds around its kernels (scheduling, launches between
layers, attention and communication kernels, the framework's own overhead), which the step-level
coefficients carry.

Rows with a non-finite or non-positive latency or shape are dropped and counted
(:attr:`GemmTables.dropped`); a file without a required column is an error naming the file and
the column.
"""

from __future__ import annotations

import importlib.util
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from bayes_latency.errors import BayesLatencyError, TraceFormatError

__all__ = ["GEMM_COLUMNS", "SYSTEM_GPUS", "GemmTables", "kernel_data_root", "read_gemm_tables",
           "roofline_efficiency"]

#: AIConfigurator system folder -> GPU name of ``physics/hardware.py`` (systems without a
#: datasheet there are not read).
SYSTEM_GPUS: dict[str, str] = {"a100_sxm": "A100-80GB", "h100_sxm": "H100-SXM",
                               "h200_sxm": "H200-SXM", "l40s": "L40S"}
#: Columns of a GEMM table file that the reader needs.
_REQUIRED = ("framework", "version", "kernel_source", "gemm_dtype", "m", "n", "k", "latency")
#: Columns of the table :func:`read_gemm_tables` returns.
GEMM_COLUMNS: tuple[str, ...] = (
    "gpu", "system", "framework", "version", "kernel_source", "dtype", "m", "n", "k",
    "latency_us", "flops", "bytes", "t_compute_us", "t_memory_us",
)
_DTYPE_BYTES = {"bfloat16": 2.0, "float16": 2.0, "fp8": 1.0, "fp8_block": 1.0}
#: A GEMM is compute-bound in :func:`roofline_efficiency` when its compute time on the
#: datasheet is at least this multiple of its memory time, memory-bound when at most its inverse.
BOUND_RATIO = 4.0
#: The least work of a GEMM that :func:`roofline_efficiency` counts: 256 MiB moved (beyond every
#: GPU's L2 cache, 40-96 MB, and 80-300 µs of reading, so a launch's few µs are small) for a
#: memory-bound one, 10^11 FLOPs (100-400 µs at peak) for a compute-bound one.
MIN_MEMORY_BYTES = 2.0**28
MIN_FLOPS = 1e11


@dataclass
class GemmTables:
    """GEMM measurements of the systems read, and what was dropped.

    Attributes
    ----------
    table
        One row per measurement, columns :data:`GEMM_COLUMNS`.
    files
        The Parquet files read.
    dropped
        Reason -> number of rows dropped.
    """

    table: pd.DataFrame
    files: list[Path] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)


def kernel_data_root() -> Path | None:
    """``systems/data`` of the installed ``aiconfigurator-core``, or None when it is not
    installed (the package is located, not imported)."""
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        root = Path(loc) / "systems" / "data"
        if root.is_dir():
            return root
    return None


def _latest(folder: Path) -> Path | None:
    """The ``<version>/gemm_perf.parquet`` of the newest framework version in ``folder``."""
    def key(p: Path) -> tuple:
        return tuple(int(x) if x.isdigit() else -1 for x in p.parent.name.split("."))

    files = sorted(folder.glob("*/gemm_perf.parquet"), key=key)
    return files[-1] if files else None


def read_gemm_tables(root: str | Path | None = None, framework: str = "vllm",
                     systems: tuple[str, ...] | None = None) -> GemmTables:
    """Read the GEMM tables of ``framework`` (its newest version per system).

    Parameters
    ----------
    root
        ``systems/data`` of AIConfigurator (default :func:`kernel_data_root`).
    framework
        Folder under ``gemm/`` (``vllm``, ``sglang``, ``trtllm``).
    systems
        System folders to read (default: every one of :data:`SYSTEM_GPUS` present).

    Returns
    -------
    GemmTables

    Raises
    ------
    BayesLatencyError
        ``aiconfigurator-core`` is not installed (and no ``root`` was given), or ``root`` holds
        no GEMM table of ``framework`` for the systems asked.
    TraceFormatError
        A table lacks a required column (file and column named).
    """
    from bayes_latency.io import read_parquet
    from bayes_latency.physics.hardware import load_gpu

    if root is None:
        root = kernel_data_root()
        if root is None:
            raise BayesLatencyError("AIConfigurator's kernel tables are not installed: "
                                    "pip install 'bayes_latency[kernels]' (aiconfigurator-core)")
    root = Path(root)
    unknown = [s for s in (systems or ()) if s not in SYSTEM_GPUS]
    if unknown:
        raise BayesLatencyError(f"systems {unknown}: no datasheet; known: {sorted(SYSTEM_GPUS)}")
    frames, files, dropped = [], [], Counter()
    for system in systems or tuple(SYSTEM_GPUS):
        path = _latest(root / system / "gemm" / framework)
        if path is None:
            continue
        raw = read_parquet(path)
        missing = [c for c in _REQUIRED if c not in raw.columns]
        if missing:
            raise TraceFormatError(f"GEMM table lacks column {missing[0]!r}", file=str(path))
        gpu = load_gpu(SYSTEM_GPUS[system])
        t = pd.DataFrame({
            "gpu": gpu.name, "system": system,
            "framework": raw["framework"].astype(str).str.lower(),
            "version": raw["version"].astype(str),
            "kernel_source": raw["kernel_source"].astype(str),
            "dtype": raw["gemm_dtype"].astype(str),
            "m": pd.to_numeric(raw["m"], errors="coerce"),
            "n": pd.to_numeric(raw["n"], errors="coerce"),
            "k": pd.to_numeric(raw["k"], errors="coerce"),
            "latency_us": pd.to_numeric(raw["latency"], errors="coerce") * 1e3,
        })
        nums = t[["m", "n", "k", "latency_us"]].to_numpy(float)
        bad = ~(np.isfinite(nums).all(axis=1) & (nums > 0).all(axis=1))
        if bad.any():
            dropped["non-finite or non-positive shape or latency"] += int(bad.sum())
        t = t[~bad]
        width = t["dtype"].map(_DTYPE_BYTES)
        unk = width.isna()
        if unk.any():
            dropped["dtype without a known width"] += int(unk.sum())
        t, width = t[~unk], width[~unk].astype(float)
        m, n, k = (t[c].to_numpy(float) for c in ("m", "n", "k"))
        flops = 2.0 * m * n * k
        peak = np.where(t["dtype"].str.startswith("fp8"), gpu.peak_flops_fp8,
                        gpu.peak_flops_bf16)
        nbytes = (m * k + k * n + m * n) * width.to_numpy()
        t = t.assign(flops=flops, bytes=nbytes, t_compute_us=flops / peak * 1e6,
                     t_memory_us=nbytes / gpu.hbm_bandwidth * 1e6)
        frames.append(t)
        files.append(path)
    if not frames:
        raise BayesLatencyError(f"{root}: no {framework} GEMM table for "
                                f"{', '.join(systems or tuple(SYSTEM_GPUS))}")
    table = pd.concat(frames, ignore_index=True)[list(GEMM_COLUMNS)]
    return GemmTables(table=table, files=files, dropped=dict(dropped))


def roofline_efficiency(table: pd.DataFrame, bound_ratio: float = BOUND_RATIO,
                        min_bytes: float = MIN_MEMORY_BYTES, min_flops: float = MIN_FLOPS
                        ) -> pd.DataFrame:
    """Per GPU and dtype, the share of the datasheet its GEMMs reach where compute-bound and
    where memory-bound.

    Parameters
    ----------
    table
        :func:`read_gemm_tables`' table.
    bound_ratio
        A GEMM counts as compute-bound when ``t_compute >= bound_ratio * t_memory``, as
        memory-bound when ``t_memory >= bound_ratio * t_compute``.
    min_bytes, min_flops
        The least bytes of a memory-bound GEMM and FLOPs of a compute-bound one counted
        (:data:`MIN_MEMORY_BYTES`, :data:`MIN_FLOPS`).

    Returns
    -------
    pandas.DataFrame
        Index ``(gpu, dtype)``; columns ``compute_eff`` (median of ``t_compute / latency`` of the
        compute-bound GEMMs), ``compute_q10``, ``compute_q90``, ``n_compute``, and the same for
        ``memory``; NaN where a GPU has no GEMM of that regime.
    """
    out = []
    for (gpu, dtype), g in table.groupby(["gpu", "dtype"], sort=True):
        row = {"gpu": gpu, "dtype": dtype}
        for name, sel, share in (
                ("compute", (g["t_compute_us"] >= bound_ratio * g["t_memory_us"])
                 & (g["flops"] >= min_flops), g["t_compute_us"] / g["latency_us"]),
                ("memory", (g["t_memory_us"] >= bound_ratio * g["t_compute_us"])
                 & (g["bytes"] >= min_bytes), g["t_memory_us"] / g["latency_us"])):
            v = share[sel].to_numpy(float)
            row[f"{name}_eff"] = float(np.median(v)) if v.size else np.nan
            row[f"{name}_q10"] = float(np.quantile(v, 0.1)) if v.size else np.nan
            row[f"{name}_q90"] = float(np.quantile(v, 0.9)) if v.size else np.nan
            row[f"n_{name}"] = int(v.size)
        out.append(row)
    return pd.DataFrame(out).set_index(["gpu", "dtype"])
