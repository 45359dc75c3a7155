"""Floor 1: physics (pure numpy, never imports pymc).

- :mod:`~bayes_latency.physics.architecture`: model shapes from Hugging Face ``config.json``.
- :mod:`~bayes_latency.physics.hardware`: GPU datasheets.
- :mod:`~bayes_latency.physics.serving`: vLLM serving knobs.
- :mod:`~bayes_latency.physics.basis`: the latency terms and their features (the one place that
  knows the terms and the BLIS slot mapping).
"""

from __future__ import annotations

from bayes_latency.physics.architecture import Architecture
from bayes_latency.physics.basis import (
    ALPHA_TERMS,
    BATCH_COLUMNS,
    BLIS_BETA_ORDER,
    DEFAULT_TERMS,
    TERMS,
    Term,
    basis_frame,
    basis_matrix,
    fits,
    get_term,
    kv_capacity_tokens,
    prefill_chunk_stats,
    term_names,
)
from bayes_latency.physics.hardware import GPU, known_gpus, load_gpu
from bayes_latency.physics.models import known_architectures, load_architecture
from bayes_latency.physics.serving import ServingConfig

__all__ = [
    "ALPHA_TERMS", "Architecture", "BATCH_COLUMNS", "BLIS_BETA_ORDER", "DEFAULT_TERMS", "GPU",
    "ServingConfig", "TERMS", "Term", "basis_frame", "basis_matrix", "fits", "get_term",
    "known_architectures", "known_gpus", "kv_capacity_tokens", "load_architecture", "load_gpu",
    "prefill_chunk_stats", "term_names",
]
