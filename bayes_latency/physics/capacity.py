"""Memory capacity of an engine: weight bytes per GPU, KV-cache capacity, whether a model fits.

:func:`kv_capacity_tokens` is the KV-cache size in tokens of one engine (vLLM's memory budget less
the weights and an activation reserve, :data:`ACTIVATION_RESERVE`); the ``kv_pressure`` term of
:mod:`bayes_latency.physics.basis` divides by it.
"""

from __future__ import annotations

import numpy as np

from bayes_latency.physics.architecture import Architecture
from bayes_latency.physics.hardware import GPU
from bayes_latency.physics.serving import ServingConfig

ACTIVATION_RESERVE = 0.10
"""Fraction of the vLLM memory budget kept for activations / CUDA graphs in :func:`kv_capacity_tokens`."""


def weight_bytes_per_gpu(arch: Architecture, serving: ServingConfig) -> float:
    """Bytes of weights resident on one GPU (non-expert / TP + routed experts / (TP·EP))."""
    routed = arch.params_routed_experts
    return ((arch.params_total - routed) * arch.weight_bytes / serving.tp
            + routed * arch.weight_bytes / (serving.tp * serving.ep))


def kv_capacity_tokens(arch: Architecture, gpu: GPU, serving: ServingConfig | None = None,
                       activation_reserve: float = ACTIVATION_RESERVE) -> int:
    """KV-cache capacity in tokens of one engine.

    Per GPU: ``floor((memory·gpu_memory_utilization·(1 − reserve) − weight bytes per GPU)
    / KV bytes per token per GPU)``, i.e. with ``TP`` GPUs and no KV-head replication
    ``floor((memory·util·TP − weight bytes total − reserve·memory·util·TP) / kv_bytes_per_token)``.
    Returns 0 when the weights do not fit.
    """
    serving = serving if serving is not None else ServingConfig()
    budget = gpu.memory_bytes * serving.gpu_memory_utilization * (1.0 - activation_reserve)
    free = budget - weight_bytes_per_gpu(arch, serving)
    per_tok = arch.kv_bytes_per_token_gpu(serving.tp)
    if free <= 0 or per_tok <= 0:
        return 0
    return int(np.floor(free / per_tok))


def fits(arch: Architecture, gpu: GPU, serving: ServingConfig | None = None) -> bool:
    """True when the weights fit and the KV cache holds at least one ``max_model_len`` request."""
    serving = serving if serving is not None else ServingConfig()
    return kv_capacity_tokens(arch, gpu, serving) >= serving.max_model_len
