"""GPU datasheets: peak FLOP/s, HBM bandwidth, memory and interconnect.

Shipped datasheets live in ``physics/data/gpus.yaml`` (H100 SXM, H200 SXM, A100 80GB/40GB, L40S,
L4). :func:`load_gpu` resolves a name or alias case-insensitively (``H100``, ``h100-80gb``,
``H100-SXM``, ``A100``, ``a100-80gb`` ...) or reads a user datasheet: a YAML file with the same
fields, either flat (one GPU) or a mapping ``{name: {fields}}`` holding exactly one GPU.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from bayes_latency.errors import ConfigError, UnknownGPUError
from bayes_latency.physics.blis import BlisHardware
from bayes_latency.textfiles import load_yaml, read_text, refuse_special

GPUS_FILE = Path(__file__).resolve().parent / "data" / "gpus.yaml"
"""The shipped datasheet file."""

_FIELDS = ("peak_flops_bf16", "peak_flops_fp8", "hbm_bandwidth", "memory_bytes",
           "interconnect_bandwidth", "sm_count")
_OPTIONAL = {"peak_flops_fp8", "sm_count", "aliases", "name", "blis"}


@dataclass(frozen=True)
class GPU:
    """Datasheet numbers of one GPU model.

    Attributes
    ----------
    name : str
        Canonical name (e.g. ``H100-SXM``).
    peak_flops_bf16 : float
        Dense BF16/FP16 tensor-core peak, FLOP/s.
    peak_flops_fp8 : float or None
        Dense FP8 tensor-core peak, FLOP/s (None when the GPU has no FP8 tensor cores).
    hbm_bandwidth : float
        Device memory bandwidth, bytes/s.
    memory_bytes : float
        Device memory, bytes.
    interconnect_bandwidth : float
        GPU-to-GPU bandwidth per direction, bytes/s (NVLink, or PCIe without NVLink).
    sm_count : int
        Streaming multiprocessors (0 when unknown).
    aliases : tuple[str, ...]
        Other names that resolve to this GPU.
    blis_entry : BlisHardware or None
        The GPU's entry in BLIS's ``hardware_config.json`` (datasheet key ``blis:`` with ``name``,
        ``tflops_peak``, ``tflops_fp8``, ``bw_peak_tbs``); None when BLIS does not ship one, in
        which case :attr:`blis` derives it from this datasheet.
    """

    name: str
    peak_flops_bf16: float
    peak_flops_fp8: float | None
    hbm_bandwidth: float
    memory_bytes: float
    interconnect_bandwidth: float
    sm_count: int = 0
    aliases: tuple[str, ...] = ()
    blis_entry: BlisHardware | None = None

    @property
    def blis(self) -> BlisHardware:
        """The numbers BLIS's ``trained-physics`` basis uses for this GPU (the exported terms use these)."""
        if self.blis_entry is not None:
            return self.blis_entry
        return BlisHardware(name=self.name, tflops_peak=self.peak_flops_bf16 / 1e12,
                            tflops_fp8=(self.peak_flops_fp8 or 0.0) / 1e12,
                            bw_peak_tbs=self.hbm_bandwidth / 1e12, in_blis=False)

    def peak_flops(self, dtype_bytes: float = 2.0) -> float:
        """Dense tensor-core peak in FLOP/s for matmul inputs of ``dtype_bytes`` bytes.

        1-byte (FP8) inputs use the FP8 peak when the GPU has one, otherwise the BF16 peak
        (e.g. A100 runs FP8 checkpoints through BF16 tensor cores). Wider inputs use BF16.
        """
        if dtype_bytes <= 1.0 and self.peak_flops_fp8:
            return float(self.peak_flops_fp8)
        return float(self.peak_flops_bf16)


#: Plausible range of each datasheet field (units of the datasheet: FLOP/s, bytes/s, bytes): wide
#: around every GPU made (an L4's 121 TFLOP/s to a B200's 4.5 PFLOP/s of FP8), narrow enough to
#: catch a value in other units (989 for 989 TFLOP/s) or a typo of the exponent.
PLAUSIBLE = {"peak_flops_bf16": (1e12, 1e17, "FLOP/s"), "peak_flops_fp8": (1e12, 1e17, "FLOP/s"),
             "hbm_bandwidth": (1e10, 1e15, "bytes/s"), "memory_bytes": (1e9, 1e13, "bytes"),
             "interconnect_bandwidth": (1e8, 1e14, "bytes/s"), "sm_count": (1, 1e5, "SMs")}


def _gpu_from_mapping(name: str, d: Mapping[str, Any], src: str) -> GPU:
    if not isinstance(d, Mapping):
        raise ConfigError(f"{src}: GPU {name!r} is not a mapping of datasheet fields")
    unknown = set(d) - set(_FIELDS) - _OPTIONAL
    if unknown:
        raise ConfigError(f"{src}: GPU {name!r}: unknown field(s) {sorted(unknown)}; "
                          f"expected {list(_FIELDS)}")
    vals: dict[str, Any] = {}
    for f in _FIELDS:
        v = d.get(f)
        if v is None:
            if f in _OPTIONAL:
                vals[f] = None if f == "peak_flops_fp8" else 0
                continue
            raise ConfigError(f"{src}: GPU {name!r}: missing field {f!r}")
        try:
            fv = float(v)
        except (TypeError, ValueError):
            raise ConfigError(f"{src}: GPU {name!r}: field {f!r} is not a number: {v!r}") from None
        if not fv > 0:
            raise ConfigError(f"{src}: GPU {name!r}: field {f!r} must be > 0, got {v!r}")
        lo, hi, unit = PLAUSIBLE.get(f, (0.0, math.inf, ""))
        if not lo <= fv <= hi:
            raise ConfigError(f"{src}: GPU {name!r}: field {f!r} = {v!r} is outside the "
                              f"plausible range [{lo:g}, {hi:g}] {unit}; write it in {unit} "
                              f"(e.g. an H100's peak_flops_bf16 is 989.0e12, not 989)")
        vals[f] = fv
    aliases = d.get("aliases") or ()
    if isinstance(aliases, str):
        aliases = (aliases,)
    blis = _blis_entry(name, d.get("blis"), src)
    return GPU(blis_entry=blis, name=str(d.get("name") or name), peak_flops_bf16=vals["peak_flops_bf16"],
               peak_flops_fp8=vals["peak_flops_fp8"], hbm_bandwidth=vals["hbm_bandwidth"],
               memory_bytes=vals["memory_bytes"],
               interconnect_bandwidth=vals["interconnect_bandwidth"],
               sm_count=int(vals["sm_count"] or 0), aliases=tuple(str(a) for a in aliases))


def _blis_entry(name: str, d: Any, src: str) -> BlisHardware | None:
    if d is None:
        return None
    fields = ("name", "tflops_peak", "tflops_fp8", "bw_peak_tbs")
    if not isinstance(d, Mapping) or set(d) != set(fields):
        raise ConfigError(f"{src}: GPU {name!r}: field 'blis' must be a mapping with exactly "
                          f"{list(fields)}, got {d!r}")
    try:
        vals = {f: float(d[f]) for f in fields[1:]}
    except (TypeError, ValueError):
        raise ConfigError(f"{src}: GPU {name!r}: field 'blis' has a non-numeric value: {d!r}") from None
    if not (vals["tflops_peak"] > 0 and vals["bw_peak_tbs"] > 0 and vals["tflops_fp8"] >= 0):
        raise ConfigError(f"{src}: GPU {name!r}: field 'blis' needs tflops_peak > 0, "
                          f"bw_peak_tbs > 0, tflops_fp8 >= 0, got {d!r}")
    return BlisHardware(name=str(d["name"]), **vals)


@lru_cache(maxsize=1)
def _shipped() -> dict[str, GPU]:
    raw = load_yaml(read_text(GPUS_FILE, "GPU datasheets", ConfigError))
    return {n: _gpu_from_mapping(n, d, str(GPUS_FILE)) for n, d in raw.items()}


@lru_cache(maxsize=1)
def _alias_table() -> dict[str, str]:
    table: dict[str, str] = {}
    for n, g in _shipped().items():
        for a in (n, *g.aliases):
            table[_norm(a)] = n
    return table


def _norm(s: str) -> str:
    return s.strip().lower().replace("_", "-").replace(" ", "-")


def known_gpus() -> list[str]:
    """Canonical names of the shipped GPUs."""
    return sorted(_shipped())


def resolve_gpu_name(name: str) -> str | None:
    """Canonical shipped GPU name for ``name`` (alias, any case), or None."""
    return _alias_table().get(_norm(name))


def load_gpu(name_or_path: str | Path | GPU) -> GPU:
    """Resolve a GPU name/alias or read a user datasheet YAML.

    Parameters
    ----------
    name_or_path : str, Path or GPU
        A shipped name or alias (case-insensitive), or a path to a YAML file with the fields of
        :class:`GPU` (flat, or ``{name: {fields}}`` with one entry). A ``GPU`` is returned unchanged.

    Returns
    -------
    GPU

    Raises
    ------
    UnknownGPUError
        Unknown name (the message lists the known ones).
    ConfigError
        Malformed datasheet file (names file and field).
    """
    if isinstance(name_or_path, GPU):
        return name_or_path
    s = str(name_or_path)
    canon = resolve_gpu_name(s)
    if canon is not None:
        return _shipped()[canon]
    p = Path(s).expanduser()
    refuse_special(p, "GPU datasheet", ConfigError, folders_ok=False)
    if p.suffix.lower() in (".yaml", ".yml") or p.is_file():
        if not p.is_file():
            raise UnknownGPUError(f"GPU datasheet file {p} does not exist; "
                                  f"known GPUs: {', '.join(known_gpus())}")
        try:
            raw = load_yaml(read_text(p, "GPU datasheet", ConfigError))
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError(f"{p}: cannot read GPU datasheet: {e}") from None
        if not isinstance(raw, Mapping) or not raw:
            raise ConfigError(f"{p}: GPU datasheet must be a non-empty mapping")
        if "peak_flops_bf16" in raw:
            return _gpu_from_mapping(str(raw.get("name") or p.stem), raw, str(p))
        if len(raw) != 1:
            raise ConfigError(f"{p}: expected one GPU entry, found {len(raw)}: {sorted(raw)}")
        (n, d), = raw.items()
        return _gpu_from_mapping(str(n), d, str(p))
    raise UnknownGPUError(f"unknown GPU {s!r}; known GPUs: {', '.join(known_gpus())} "
                          f"(aliases: {', '.join(sorted(a for g in _shipped().values() for a in g.aliases))}); "
                          "or pass a datasheet YAML path")


__all__ = ["GPU", "GPUS_FILE", "known_gpus", "load_gpu", "resolve_gpu_name"]
