"""Kernel-level evidence on each GPU's roofline efficiency, as the hierarchy takes it.

A roofline term's coefficient is a GPU's datasheet time over the time it takes: ``1 / share``
of the datasheet it reaches. AIConfigurator's GEMM tables (:mod:`bayes_latency.data.kernels`)
measure that share per GPU under a serving framework, for the two regimes a step's terms are
made of (:func:`~bayes_latency.data.kernels.roofline_efficiency`):

- ``memory``: GEMMs with few rows, a decode step's weight reads (``weight_loading``) and the
  nearest kernel measure of its KV reads (``decode_kv``);
- ``compute``: large GEMMs, a prefill's compute (``prefill_compute``).

:func:`kernel_evidence` gives, per GPU and term of :data:`KERNEL_TERMS`, ``log_time = -log
share`` (the median over the bound GEMMs of that regime). The hierarchy reads it as one
measurement of the GPU's effect on that term in the framework's serving stack
(:mod:`bayes_latency.model.definition.kernels`):

    log_time[g, t] = kernel_offset[t] + eff_gpu[g, t] + e,   e ~ N(0, kernel_sigma^2)

``kernel_offset`` takes what a step adds to its GEMMs' time on every GPU alike;
``kernel_sigma`` (``hierarchy.kernel`` of the prior file) how far a GPU's step-level contrast
may sit from its kernels' (launch gaps, attention kernels, fusion). What the tables cannot say:
anything a step spends outside its GEMMs that differs between GPUs (scheduling on a slower
host, attention kernels, all-reduces), which the step-level data carry.

A GPU without a datasheet in :mod:`bayes_latency.physics.hardware` is not read
(:data:`~bayes_latency.data.kernels.SYSTEM_GPUS`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from bayes_latency.data.kernels import GemmTables, read_gemm_tables, roofline_efficiency
from bayes_latency.errors import BayesLatencyError

__all__ = ["KERNEL_TERMS", "KernelEvidence", "canonical_gpu", "evidence_from_tables", "gpu_row",
           "kernel_evidence"]

#: The terms the GEMM tables measure, and the regime of :func:`roofline_efficiency` that
#: measures each. ``decode_compute`` is not one: decode GEMMs are memory-bound, so its
#: coefficient is not a compute share (and it shares its effects with ``per_request`` where the
#: two are proportional).
KERNEL_TERMS: dict[str, str] = {"weight_loading": "memory", "decode_kv": "memory",
                                "prefill_compute": "compute"}


@dataclass(frozen=True)
class KernelEvidence:
    """Per GPU and term, the log of the datasheet-time multiple its kernels take.

    Attributes
    ----------
    gpus
        GPU names (:mod:`bayes_latency.physics.hardware`).
    terms
        Terms of :data:`KERNEL_TERMS` measured.
    log_time
        ``(gpu, term)``: ``-log`` of the median share of the datasheet the GEMMs of the term's
        regime reach.
    n
        ``(gpu, term)``: GEMMs behind each median.
    stack
        The serving stack the tables were measured under (``vllm``): the stack whose GPU
        contrast the kernels measure.
    source
        What was read (package version, framework, table versions).
    """

    gpus: tuple[str, ...]
    terms: tuple[str, ...]
    log_time: np.ndarray
    n: np.ndarray
    stack: str
    source: str

    def __post_init__(self) -> None:
        shape = (len(self.gpus), len(self.terms))
        for name in ("log_time", "n"):
            a = np.asarray(getattr(self, name), dtype=float)
            if a.shape != shape:
                raise BayesLatencyError(f"kernel evidence: {name} has shape {a.shape}, "
                                        f"expected {shape} (gpu, term)")
            if not np.all(np.isfinite(a)):
                raise BayesLatencyError(f"kernel evidence: {name} is not finite everywhere")
        unknown = [t for t in self.terms if t not in KERNEL_TERMS]
        if unknown:
            raise BayesLatencyError(f"kernel evidence: terms {unknown} are not measured by a "
                                    f"GEMM regime; known: {sorted(KERNEL_TERMS)}")

    def restricted(self, terms: tuple[str, ...]) -> KernelEvidence | None:
        """The evidence on the terms of ``terms`` only (None when it measures none of them)."""
        keep = [i for i, t in enumerate(self.terms) if t in terms]
        if not keep:
            return None
        return KernelEvidence(self.gpus, tuple(self.terms[i] for i in keep),
                              np.asarray(self.log_time)[:, keep], np.asarray(self.n)[:, keep],
                              self.stack, self.source)

    def to_json(self) -> str:
        """The evidence as JSON (a fit's ``kernels`` attribute)."""
        return json.dumps({"gpus": list(self.gpus), "terms": list(self.terms),
                           "log_time": np.asarray(self.log_time, float).round(12).tolist(),
                           "n": np.asarray(self.n, float).tolist(), "stack": self.stack,
                           "source": self.source}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> KernelEvidence:
        """The inverse of :meth:`to_json`."""
        d: dict[str, Any] = json.loads(text)
        return cls(tuple(d["gpus"]), tuple(d["terms"]), np.asarray(d["log_time"], float),
                   np.asarray(d["n"], float), str(d["stack"]), str(d["source"]))

    def index_of(self, gpu: str) -> int | None:
        """The row of ``gpu`` (:func:`gpu_row`), or None when the tables lack it."""
        return gpu_row(self.gpus, gpu)

    @property
    def hash(self) -> str:
        """Short SHA-256 of :meth:`to_json`."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]


def canonical_gpu(name: str) -> str:
    """The shipped datasheet name of ``name`` (an alias, any case:
    :func:`~bayes_latency.physics.hardware.resolve_gpu_name`), or ``name`` itself when no
    shipped datasheet knows it."""
    from bayes_latency.physics.hardware import resolve_gpu_name

    return resolve_gpu_name(str(name)) or str(name)


def gpu_row(gpus: Sequence[str], gpu: str) -> int | None:
    """The position of ``gpu`` in ``gpus``, either named by any alias a shipped datasheet
    knows (``A100`` for ``A100-80GB``: :func:`canonical_gpu`), or None when it is not there."""
    names = [canonical_gpu(g) for g in gpus]
    name = canonical_gpu(gpu)
    return names.index(name) if name in names else None


@lru_cache(maxsize=8)
def kernel_evidence(root: str | Path | None = None, framework: str = "vllm",
                    dtype: str = "bfloat16") -> KernelEvidence:
    """The GEMM tables of ``framework`` reduced to :class:`KernelEvidence` (``dtype`` GEMMs).

    The tables are read once per process (every fit of a study asks for them): the installed
    package's files do not change while it runs.

    Raises
    ------
    BayesLatencyError
        ``aiconfigurator-core`` is not installed (and no ``root`` given), no table of
        ``framework``, or no GPU has bound GEMMs of ``dtype`` in both regimes.
    """
    return evidence_from_tables(read_gemm_tables(root, framework=framework), framework, dtype)


def evidence_from_tables(tables: GemmTables, framework: str = "vllm",
                         dtype: str = "bfloat16") -> KernelEvidence:
    """:func:`kernel_evidence` of GEMM tables already read (:func:`read_gemm_tables` of
    ``framework``)."""
    eff = roofline_efficiency(tables.table)
    rows = [(gpu, r) for (gpu, dt), r in eff.iterrows() if dt == dtype]
    gpus, logt, n = [], [], []
    for gpu, r in rows:
        shares = [r[f"{KERNEL_TERMS[t]}_eff"] for t in KERNEL_TERMS]
        if not all(np.isfinite(s) and s > 0 for s in shares):
            continue
        gpus.append(str(gpu))
        logt.append([-np.log(float(s)) for s in shares])
        n.append([float(r[f"n_{KERNEL_TERMS[t]}"]) for t in KERNEL_TERMS])
    if not gpus:
        raise BayesLatencyError(f"no GPU has {dtype} GEMMs of both regimes in the "
                                f"{framework} tables")
    versions = ", ".join(f"{p.parents[3].name} {p.parent.name}" for p in tables.files)
    try:
        pkg = f"aiconfigurator-core {metadata.version('aiconfigurator-core')}"
    except metadata.PackageNotFoundError:
        pkg = "AIConfigurator tables"
    return KernelEvidence(tuple(gpus), tuple(KERNEL_TERMS), np.asarray(logt), np.asarray(n),
                          stack=framework, source=f"{pkg}, gemm/{framework} {dtype} ({versions})")
