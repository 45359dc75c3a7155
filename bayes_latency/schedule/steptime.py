"""Fast scalar path for the true mean step time ``beta . basis(batch)``.

The engine needs each step's time before it can schedule the next step (arrivals depend on the
clock), so it cannot call the vectorised :func:`~bayes_latency.physics.basis.basis_matrix` once
per experiment. Every default term is linear in the batch columns except through the total token
count ``T = prefill_tokens + decode_tokens`` (the ``T > 0`` indicator of the fixed costs and the
expected distinct experts of MoE weight loading). So

    beta . basis(batch) = H[T] + c_D·D + Σ_k c_k·x_k

with ``H[T] = beta . basis(prefill_tokens = T)`` tabulated for every ``T`` up to the token budget and
the slopes ``c`` obtained by probing :func:`basis_matrix` with large increments (exact for linear
terms). ``tests/test_synth_engine.py`` checks the result against ``basis_matrix @ beta`` to 1e-9.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from bayes_latency.physics.architecture import Architecture
from bayes_latency.physics.basis import DEFAULT_TERMS, REQUIRED_COLUMNS, basis_matrix
from bayes_latency.physics.hardware import GPU
from bayes_latency.physics.serving import ServingConfig

COLUMNS: tuple[str, ...] = (*REQUIRED_COLUMNS, "prefill_input_pairs")
"""Batch columns the probes set (``prefill_input_pairs`` explicitly: no fallback)."""

SLOPE_COLUMNS: tuple[str, ...] = ("num_prefill_reqs", "prefill_attn_pairs", "prefill_kv_tokens",
                                  "prefill_input_pairs", "num_decode_reqs", "decode_ctx_tokens")
"""Batch columns entering the linear part (besides ``decode_tokens``)."""

_PROBE = float(2 ** 20)


class StepTimeModel:
    """True mean step time of one configuration, evaluated per step in O(1).

    Parameters
    ----------
    arch, gpu, serving
        The configuration.
    beta : sequence of float
        True coefficients in the order of ``terms``.
    terms : sequence of str
        Term set (default :data:`~bayes_latency.physics.basis.DEFAULT_TERMS`).

    Attributes
    ----------
    table : numpy.ndarray
        ``H[T]`` for ``T = 0 .. max_num_batched_tokens`` (all tokens as prefill tokens).
    c_decode : float
        Extra µs of one decode token over one prefill token.
    slopes : dict[str, float]
        µs per unit of each :data:`SLOPE_COLUMNS` column.
    """

    def __init__(self, arch: Architecture, gpu: GPU, serving: ServingConfig,
                 beta: Sequence[float], terms: Sequence[str] = DEFAULT_TERMS) -> None:
        self.arch, self.gpu, self.serving = arch, gpu, serving
        self.terms = tuple(terms)
        self.beta = np.asarray(beta, dtype=float)
        if self.beta.shape != (len(self.terms),):
            raise ValueError(f"beta has shape {self.beta.shape}, expected ({len(self.terms)},)")
        t_max = int(serving.max_num_batched_tokens)
        n = t_max + 1
        rows = {c: np.zeros(n) for c in COLUMNS}
        rows["prefill_tokens"] = np.arange(n, dtype=float)
        self.table = self._mean(pd.DataFrame(rows))
        base = {c: 0.0 for c in COLUMNS}
        base["prefill_tokens"] = 1.0
        h1 = float(self.table[1])
        self.slopes: dict[str, float] = {}
        for c in SLOPE_COLUMNS:
            row = dict(base)
            row[c] = _PROBE
            self.slopes[c] = (float(self._mean(pd.DataFrame([row]))[0]) - h1) / _PROBE
        k = float(min(1024, t_max))
        pre = dict.fromkeys(COLUMNS, 0.0)
        pre["prefill_tokens"] = k
        dec = dict.fromkeys(COLUMNS, 0.0)
        dec["decode_tokens"] = k
        two = self._mean(pd.DataFrame([pre, dec]))
        self.c_decode = float(two[1] - two[0]) / k
        # plain Python floats/list for the engine's hot loop
        self.table_list: list[float] = [float(x) for x in self.table]

    def _mean(self, batches: pd.DataFrame) -> np.ndarray:
        return basis_matrix(batches, self.arch, self.gpu, self.serving, self.terms) @ self.beta

    def mean_us(self, num_prefill_reqs: float, prefill_tokens: int, prefill_attn_pairs: float,
                prefill_kv_tokens: float, prefill_input_pairs: float, num_decode_reqs: float,
                decode_tokens: int, decode_ctx_tokens: float) -> float:
        """Mean step time (µs) of one batch; ``prefill_tokens + decode_tokens`` <= the budget."""
        s = self.slopes
        return (self.table_list[prefill_tokens + decode_tokens] + self.c_decode * decode_tokens
                + s["num_prefill_reqs"] * num_prefill_reqs
                + s["prefill_attn_pairs"] * prefill_attn_pairs
                + s["prefill_kv_tokens"] * prefill_kv_tokens
                + s["prefill_input_pairs"] * prefill_input_pairs
                + s["num_decode_reqs"] * num_decode_reqs
                + s["decode_ctx_tokens"] * decode_ctx_tokens)

    def mean_us_array(self, batches: pd.DataFrame) -> np.ndarray:
        """Vectorised fast path over a batch table (same formula as :meth:`mean_us`)."""
        p = batches["prefill_tokens"].to_numpy(dtype=np.int64)
        d = batches["decode_tokens"].to_numpy(dtype=np.int64)
        out = self.table[p + d] + self.c_decode * d
        for c, v in self.slopes.items():
            out = out + v * batches[c].to_numpy(dtype=float)
        return out

    def reference_us(self, batches: pd.DataFrame) -> np.ndarray:
        """``basis_matrix(batches) @ beta`` (the slow exact definition)."""
        return self._mean(batches)


__all__ = ["SLOPE_COLUMNS", "StepTimeModel"]
