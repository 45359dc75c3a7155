"""Serving configuration of one vLLM deployment (parallelism and scheduler knobs).

:meth:`ServingConfig.from_dict` accepts our own key names, vLLM's CLI names (dashes or
underscores, ``tensor_parallel_size``, ``enable_chunked_prefill`` ...) and the inference-perf
``exp-config.yaml`` names (``tensor_parallelism`` -> ``tp``). Keys that describe the experiment
rather than the server (``model``, ``gpu``, ``app``, ``workload`` ...) are ignored.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from bayes_latency.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from bayes_latency.physics.architecture import Architecture

_ALIASES: dict[str, str] = {
    "tensor_parallelism": "tp", "tensor_parallel_size": "tp", "tensor_parallel": "tp",
    "data_parallelism": "dp", "data_parallel_size": "dp",
    "expert_parallelism": "ep", "expert_parallel_size": "ep",
    "enable_chunked_prefill": "chunked_prefill",
    "enable_prefix_caching": "prefix_caching",
    "kv_offload_gb": "cpu_offload_gb",
}

CONTEXT_KEYS = frozenset({
    "model", "gpu", "hardware", "app", "workload", "experiment_id", "name", "notes", "seed",
    "served_model_name", "dtype", "kv_cache_dtype", "description", "date", "vllm_version",
    "profile", "engine", "image", "framework",
})
"""Keys of serving/experiment files that are not serving knobs (ignored by ``from_dict``)."""

_INT_FIELDS = ("tp", "dp", "ep", "max_num_batched_tokens", "max_num_seqs", "max_model_len",
               "block_size")
_BOOL_FIELDS = ("chunked_prefill", "prefix_caching")


@dataclass(frozen=True)
class ServingConfig:
    """Parallelism and scheduler knobs of one vLLM server.

    Attributes
    ----------
    tp : int
        Tensor parallelism (GPUs per model replica for the dense weights).
    dp : int
        Data parallelism (independent replicas; does not change one engine's step time).
    ep : int
        Expert parallelism for the routed experts on top of ``tp`` (1 = experts are tensor-sliced
        over the ``tp`` ranks). Routed expert weights per GPU are divided by ``tp * ep``.
    max_num_batched_tokens : int
        Token budget of one scheduler step.
    max_num_seqs : int
        Maximum running requests.
    max_model_len : int
        Maximum prompt + output length.
    block_size : int
        KV-cache block size in tokens.
    chunked_prefill, prefix_caching : bool
        vLLM features.
    cpu_offload_gb : float
        Host memory for KV offload (0 = off).
    gpu_memory_utilization : float
        Fraction of device memory vLLM may use, in (0, 1].
    """

    tp: int = 1
    dp: int = 1
    ep: int = 1
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 128
    max_model_len: int = 4096
    block_size: int = 16
    chunked_prefill: bool = True
    prefix_caching: bool = True
    cpu_offload_gb: float = 0.0
    gpu_memory_utilization: float = 0.9

    def __post_init__(self) -> None:
        # accept numpy scalars and integral floats (values read from tables), store plain types
        for f in _INT_FIELDS:
            v = getattr(self, f)
            if isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)) \
                    and float(v).is_integer():
                object.__setattr__(self, f, int(v))
        for f in _BOOL_FIELDS:
            if isinstance(getattr(self, f), np.bool_):
                object.__setattr__(self, f, bool(getattr(self, f)))
        for f in ("cpu_offload_gb", "gpu_memory_utilization"):
            v = getattr(self, f)
            if isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)):
                object.__setattr__(self, f, float(v))
        for f in _INT_FIELDS:
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"serving config: field {f!r} must be a positive integer, got {v!r}")
        for f in _BOOL_FIELDS:
            if not isinstance(getattr(self, f), bool):
                raise ConfigError(f"serving config: field {f!r} must be a boolean, "
                                  f"got {getattr(self, f)!r}")
        if not isinstance(self.cpu_offload_gb, float) or not self.cpu_offload_gb >= 0:
            raise ConfigError(f"serving config: field 'cpu_offload_gb' must be >= 0, "
                              f"got {self.cpu_offload_gb!r}")
        u = self.gpu_memory_utilization
        if not isinstance(u, float) or not 0 < u <= 1:
            raise ConfigError(f"serving config: field 'gpu_memory_utilization' must be in (0, 1], "
                              f"got {u!r}")

    @property
    def n_gpus(self) -> int:
        """GPUs of one engine (``tp * ep``; data-parallel replicas are separate engines)."""
        return self.tp * self.ep

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None, *, strict: bool = False,
                  source: str | None = None, arch: Architecture | None = None) -> ServingConfig:
        """Build and validate a config from a mapping.

        Parameters
        ----------
        d : Mapping or None
            Serving knobs; our names, vLLM names (dashes allowed) or inference-perf
            ``exp-config.yaml`` names. ``None`` gives the defaults.
        strict : bool
            Raise on keys that are neither knobs nor known context keys (:data:`CONTEXT_KEYS`);
            otherwise such keys are ignored.
        source : str, optional
            File name used in error messages.
        arch : Architecture, optional
            When given, also check the config against the model (see :meth:`check_against`).

        Raises
        ------
        ConfigError
            Naming the offending field.
        """
        src = source or "serving config"
        if d is None:
            d = {}
        if not isinstance(d, Mapping):
            raise ConfigError(f"{src}: expected a mapping, got {type(d).__name__}")
        names = {f.name for f in fields(cls)}
        kw: dict[str, Any] = {}
        for raw_key, v in d.items():
            k = str(raw_key).strip().lstrip("-").replace("-", "_")
            k = _ALIASES.get(k, k)
            if k not in names:
                if strict and k not in CONTEXT_KEYS:
                    raise ConfigError(f"{src}: unknown field {raw_key!r}; known: {sorted(names)}")
                continue
            if k in kw:
                raise ConfigError(f"{src}: field {k!r} given twice (as {raw_key!r})")
            kw[k] = _coerce(k, v, src)
        try:
            cfg = cls(**kw)
        except ConfigError as e:
            raise ConfigError(str(e).replace("serving config", src, 1)) from None
        if arch is not None:
            cfg.check_against(arch, source=src)
        return cfg

    def check_against(self, arch: Architecture, source: str | None = None) -> None:
        """Check the config fits the model: ``ep`` divides the expert count, ``ep == 1`` for dense.

        Raises
        ------
        ConfigError
            Naming the field.
        """
        src = source or "serving config"
        if self.ep > 1:
            if not arch.n_experts:
                raise ConfigError(f"{src}: field 'ep' = {self.ep} but model {arch.name!r} has no experts")
            if arch.n_experts % self.ep:
                raise ConfigError(f"{src}: field 'ep' = {self.ep} does not divide the "
                                  f"{arch.n_experts} experts of {arch.name!r}")
        if arch.attention != "mla" and arch.n_heads % self.tp:
            raise ConfigError(f"{src}: field 'tp' = {self.tp} does not divide the "
                              f"{arch.n_heads} attention heads of {arch.name!r}")

    def to_dict(self) -> dict[str, Any]:
        """Plain dict with our field names."""
        return asdict(self)

    def replace(self, **changes: Any) -> ServingConfig:
        """Copy with some fields changed (validated)."""
        d = self.to_dict()
        d.update(changes)
        return ServingConfig.from_dict(d, strict=True)


def _coerce(k: str, v: Any, src: str) -> Any:
    if k in _INT_FIELDS:
        if isinstance(v, bool):
            raise ConfigError(f"{src}: field {k!r} must be a positive integer, got {v!r}")
        try:
            fv = float(v)
        except (TypeError, ValueError):
            raise ConfigError(f"{src}: field {k!r} must be a positive integer, got {v!r}") from None
        if not math.isfinite(fv) or fv != int(fv):
            raise ConfigError(f"{src}: field {k!r} must be an integer, got {v!r}")
        return int(fv)
    if k in _BOOL_FIELDS:
        if isinstance(v, bool):
            return v
        if isinstance(v, str) and v.strip().lower() in ("true", "yes", "on", "1"):
            return True
        if isinstance(v, str) and v.strip().lower() in ("false", "no", "off", "0"):
            return False
        if isinstance(v, int) and v in (0, 1):
            return bool(v)
        raise ConfigError(f"{src}: field {k!r} must be a boolean, got {v!r}")
    try:
        return float(v)
    except (TypeError, ValueError):
        raise ConfigError(f"{src}: field {k!r} must be a number, got {v!r}") from None


__all__ = ["CONTEXT_KEYS", "ServingConfig"]
