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

__all__ = ["ALLREDUCE_COLUMNS", "GEMM_COLUMNS", "SYSTEM_GPUS", "AllReduceTables", "GemmTables",
           "allreduce_coefficient", "kernel_data_root", "read_allreduce_tables",
           "read_gemm_tables", "roofline_efficiency"]

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


def _latest(folder: Path, name: str = "gemm_perf.parquet") -> Path | None:
    """The ``<version>/<name>`` of the newest version in ``folder``."""
    def key(p: Path) -> tuple:
        return tuple(int(x) if x.isdigit() else -1 for x in p.parent.name.split("."))

    files = sorted(folder.glob(f"*/{name}"), key=key)
    return files[-1] if files else None


def _root_and_systems(root: str | Path | None, systems: tuple[str, ...] | None
                      ) -> tuple[Path, tuple[str, ...]]:
    """``systems/data`` (default :func:`kernel_data_root`) and the system folders to read
    (default every one of :data:`SYSTEM_GPUS`), refusing a missing package or an unknown system."""
    if root is None:
        root = kernel_data_root()
        if root is None:
            raise BayesLatencyError("AIConfigurator's kernel tables are not installed: "
                                    "pip install 'bayes_latency[kernels]' (aiconfigurator-core)")
    unknown = [s for s in (systems or ()) if s not in SYSTEM_GPUS]
    if unknown:
        raise BayesLatencyError(f"systems {unknown}: no datasheet; known: {sorted(SYSTEM_GPUS)}")
    return Path(root), tuple(systems or SYSTEM_GPUS)


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

    root, systems = _root_and_systems(root, systems)
    frames, files, dropped = [], [], Counter()
    for system in systems:
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
                                f"{', '.join(systems)}")
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


# --------------------------------------------------------------------------------------------
# NCCL all-reduce tables: the communication term

#: Columns of an NCCL table file that :func:`read_allreduce_tables` needs.
_NCCL_REQUIRED = ("op_name", "nccl_dtype", "num_gpus", "message_size", "latency")
#: Bytes per element of an NCCL table's ``nccl_dtype`` (``message_size`` counts elements: the
#: 8-GPU H100 all-reduce of 2^28 half elements takes 2.11 ms, a bus bandwidth of 444 GB/s as
#: NCCL's own tests measure on NVSwitch; read as bytes it would be half that).
_NCCL_BYTES = {"half": 2.0, "bfloat16": 2.0, "float16": 2.0, "float": 4.0, "int8": 1.0}
#: Columns of the table :func:`read_allreduce_tables` returns.
ALLREDUCE_COLUMNS: tuple[str, ...] = (
    "gpu", "system", "version", "dtype", "tp", "message_bytes", "latency_us", "feature_us",
)
#: The least message of the bandwidth regime :func:`allreduce_coefficient` fits: 16 MiB (a
#: prefill chunk of 1,024 tokens of a 8,192-wide model in bf16); below it the per-call latency
#: (tens of µs) is a large part of the time.
MIN_BANDWIDTH_BYTES = 2.0**24


@dataclass
class AllReduceTables:
    """NCCL all-reduce measurements of the systems read, and what was dropped (reason -> rows)."""

    table: pd.DataFrame
    files: list[Path] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)


def read_allreduce_tables(root: str | Path | None = None, systems: tuple[str, ...] | None = None,
                          dtype: str = "half") -> AllReduceTables:
    """Read the NCCL all-reduce tables (``comm/nccl/<version>/nccl_perf.parquet``, the newest
    version per system) of ``dtype``, with BLIS's ``tp_allreduce`` feature of each call.

    BLIS charges a tensor-parallel all-reduce of ``M`` bytes ``M * 2 (tp - 1) / tp / hbm`` µs of
    feature (``hbm`` its bandwidth in bytes/µs, :mod:`bayes_latency.physics.basis`), so
    ``latency_us / feature_us`` is the ``tp_allreduce`` coefficient one call would take.

    Returns
    -------
    AllReduceTables
        ``table`` with :data:`ALLREDUCE_COLUMNS`, one row per (GPU, TP degree, message size).

    Raises
    ------
    BayesLatencyError
        ``aiconfigurator-core`` is not installed (and no ``root`` was given), or no system asked
        has an NCCL table.
    TraceFormatError
        A table lacks a required column (file and column named).
    """
    from bayes_latency.io import read_parquet
    from bayes_latency.physics.hardware import load_gpu

    root, systems = _root_and_systems(root, systems)
    if dtype not in _NCCL_BYTES:
        raise BayesLatencyError(f"NCCL dtype {dtype!r}: width unknown; known: "
                                f"{sorted(_NCCL_BYTES)}")
    frames, files, dropped = [], [], Counter()
    for system in systems:
        path = _latest(root / system / "comm" / "nccl", "nccl_perf.parquet")
        if path is None:
            continue
        raw = read_parquet(path)
        missing = [c for c in _NCCL_REQUIRED if c not in raw.columns]
        if missing:
            raise TraceFormatError(f"NCCL table lacks column {missing[0]!r}", file=str(path))
        raw = raw[(raw["op_name"].astype(str) == "all_reduce")
                  & (raw["nccl_dtype"].astype(str) == dtype)]
        tp = pd.to_numeric(raw["num_gpus"], errors="coerce").to_numpy(float)
        elems = pd.to_numeric(raw["message_size"], errors="coerce").to_numpy(float)
        lat = pd.to_numeric(raw["latency"], errors="coerce").to_numpy(float) * 1e3
        bad = ~(np.isfinite(tp) & np.isfinite(elems) & np.isfinite(lat) & (tp >= 2)
                & (elems > 0) & (lat > 0))
        if bad.any():
            dropped["non-finite or non-positive size or latency, or fewer than 2 GPUs"] += \
                int(bad.sum())
        gpu = load_gpu(SYSTEM_GPUS[system])
        nbytes = elems[~bad] * _NCCL_BYTES[dtype]
        tp = tp[~bad]
        frames.append(pd.DataFrame({
            "gpu": gpu.name, "system": system, "version": path.parent.name, "dtype": dtype,
            "tp": tp.astype(int), "message_bytes": nbytes, "latency_us": lat[~bad],
            "feature_us": nbytes * 2.0 * (tp - 1.0) / tp / gpu.blis.bytes_per_us}))
        files.append(path)
    if not frames:
        raise BayesLatencyError(f"{root}: no NCCL all-reduce table for "
                                f"{', '.join(systems)}")
    table = pd.concat(frames, ignore_index=True)[list(ALLREDUCE_COLUMNS)]
    return AllReduceTables(table=table, files=files, dropped=dict(dropped))


def allreduce_coefficient(table: pd.DataFrame, min_bytes: float = MIN_BANDWIDTH_BYTES,
                          at_bytes: tuple[float, ...] = (2.0**20, 2.0**23)) -> pd.DataFrame:
    """Per GPU and TP degree, BLIS's ``tp_allreduce`` coefficient that the kernel tables give.

    Over the messages of at least ``min_bytes`` the latency is a line in the feature,
    ``latency_us = latency_call + coefficient * feature_us`` (least squares): ``coefficient`` is
    the all-reduce's time per µs of BLIS's feature where bandwidth sets it (HBM over the bus
    bandwidth NCCL reaches), ``latency_call`` the fixed time of one call, which BLIS's feature
    cannot carry (two calls per layer: it lands in ``per_layer``); where the time grows faster
    than the bytes (a negative per-call time, e.g. PCIe all-reduces across sockets), the line
    through 0. ``coef_at_<MiB>mib`` is
    ``latency / feature`` at the message sizes of ``at_bytes`` (interpolated in log size): the
    coefficient a step of that message size would need without a per-call term.

    Returns
    -------
    pandas.DataFrame
        Index ``(gpu, tp)``; columns ``coefficient``, ``latency_call_us``, ``n_bandwidth``,
        ``coef_at_1mib``, ``coef_at_8mib`` (one per ``at_bytes``).
    """
    out = []
    for (gpu, tp), g in table.groupby(["gpu", "tp"], sort=True):
        g = g.sort_values("message_bytes")
        big = g[g["message_bytes"] >= min_bytes]
        row: dict = {"gpu": gpu, "tp": int(tp), "n_bandwidth": len(big)}
        if len(big) >= 2:
            A = np.column_stack([np.ones(len(big)), big["feature_us"].to_numpy(float)])
            y = big["latency_us"].to_numpy(float)
            lat_call, coef = np.linalg.lstsq(A, y, rcond=None)[0]
            if lat_call < 0.0:  # time growing faster than the bytes: the line through 0
                f = A[:, 1]
                lat_call, coef = 0.0, float(f @ y / (f @ f))
            row.update(coefficient=float(coef), latency_call_us=float(lat_call))
        else:
            row.update(coefficient=np.nan, latency_call_us=np.nan)
        ratio = (g["latency_us"] / g["feature_us"]).to_numpy(float)
        size = np.log(g["message_bytes"].to_numpy(float))
        for b in at_bytes:
            inside = size.size and size[0] <= np.log(b) <= size[-1]
            row[f"coef_at_{b / 2**20:g}mib"] = float(np.interp(np.log(b), size, ratio)) \
                if inside else np.nan
        out.append(row)
    return pd.DataFrame(out).set_index(["gpu", "tp"])
