"""The batch table: its columns, their validation and the prefill-chunk statistics behind them.

A batch table has one row per engine iteration and the columns :data:`BATCH_COLUMNS` (counts,
floats allowed; see :mod:`bayes_latency.physics.basis` for their meaning);
:func:`validate_batches` checks one and returns its columns as arrays, filling the optional ones
(:func:`input_pairs_fallback`); :func:`prefill_chunk_stats` computes the prefill columns from
the chunks of a step. The basis functions of :mod:`bayes_latency.physics.basis` read batch tables
through :func:`validate_batches`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from bayes_latency.errors import ConfigError

REQUIRED_COLUMNS: tuple[str, ...] = (
    "num_prefill_reqs", "prefill_tokens", "prefill_attn_pairs", "prefill_kv_tokens",
    "num_decode_reqs", "decode_tokens", "decode_ctx_tokens",
)
"""Batch-table columns every batch table must have."""
OPTIONAL_COLUMNS: tuple[str, ...] = ("prefill_input_pairs", "offload_tokens")
"""Batch-table columns that may be absent: ``offload_tokens`` defaults to 0,
``prefill_input_pairs`` to :func:`input_pairs_fallback`."""
BATCH_COLUMNS: tuple[str, ...] = REQUIRED_COLUMNS + OPTIONAL_COLUMNS
"""All batch-table columns, in order."""

def _as_frame(batches: Any) -> pd.DataFrame:
    if isinstance(batches, pd.DataFrame):
        return batches
    if isinstance(batches, pd.Series):
        return batches.to_frame().T
    if isinstance(batches, Mapping):
        vals = list(batches.values())
        if vals and all(np.ndim(v) == 0 for v in vals):
            return pd.DataFrame({k: [v] for k, v in batches.items()})
        return pd.DataFrame(dict(batches))
    if isinstance(batches, Sequence) and not isinstance(batches, (str, bytes)):
        return pd.DataFrame(list(batches))
    raise ConfigError(f"batch table must be a pandas DataFrame or mapping of columns, "
                      f"got {type(batches).__name__}")


def validate_batches(batches: Any) -> dict[str, np.ndarray]:
    """Check a batch table and return its columns as float64 arrays.

    Missing optional columns are filled in: ``offload_tokens`` with 0, ``prefill_input_pairs``
    with :func:`input_pairs_fallback`.

    Raises
    ------
    ConfigError
        Missing required column, non-numeric, negative or NaN value (names column and row index).
    """
    df = _as_frame(batches)
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise ConfigError(f"batch table: missing column(s) {missing}; required: {list(REQUIRED_COLUMNS)}")
    cols: dict[str, np.ndarray] = {}
    n = len(df)
    for c in BATCH_COLUMNS:
        if c not in df.columns:
            cols[c] = np.zeros(n)
            continue
        try:
            arr = pd.to_numeric(df[c], errors="raise").to_numpy(dtype=float, na_value=np.nan)
        except (TypeError, ValueError):
            raise ConfigError(f"batch table: column {c!r} is not numeric") from None
        bad = ~np.isfinite(arr) | (arr < 0)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ConfigError(f"batch table: column {c!r} has invalid value {arr[i]!r} at row index "
                              f"{df.index[i]!r} (must be finite and >= 0; {int(bad.sum())} bad rows)")
        cols[c] = arr
    if "prefill_input_pairs" not in df.columns:
        cols["prefill_input_pairs"] = input_pairs_fallback(
            cols["num_prefill_reqs"], cols["prefill_tokens"], cols["prefill_attn_pairs"])
    return cols


def input_pairs_fallback(num_prefill_reqs: Any, prefill_tokens: Any,
                         prefill_attn_pairs: Any) -> np.ndarray:
    """``prefill_input_pairs`` of a batch table that lacks the column.

    BLIS charges prefill attention as ``Σ_i c_i·(S_i + c_i/2)`` with ``S_i`` the request's input
    length. Without per-request input lengths we assume each chunk finishes its prompt
    (``S_i = o_i + c_i``) and chunks of equal size: ``pairs + P²/n − P/2`` where
    ``pairs = Σ c_i·(o_i + (c_i+1)/2)``. Exact for one whole prompt per request (static
    batches, unchunked prefills); producers that know the requests give the column itself.
    """
    n = np.asarray(num_prefill_reqs, dtype=float)
    p = np.asarray(prefill_tokens, dtype=float)
    pairs = np.asarray(prefill_attn_pairs, dtype=float)
    out = pairs + np.where(n > 0, p * p / np.maximum(n, 1.0), 0.0) - p / 2.0
    return np.where(p > 0, np.maximum(out, 0.0), 0.0)


def prefill_chunk_stats(chunk_tokens: Any, chunk_offsets: Any,
                        per_chunk: bool = False) -> tuple[Any, Any]:
    """Attention pairs and KV tokens of the prefill chunks of one step.

    Parameters
    ----------
    chunk_tokens : array-like
        ``c_i``: tokens of each chunk computed in the step.
    chunk_offsets : array-like
        ``o_i``: tokens already in the KV cache before chunk ``i`` (earlier chunks, prefix-cache
        hits, recomputed tokens).
    per_chunk : bool
        Return per-chunk arrays instead of the sums.

    Returns
    -------
    pairs, kv_tokens
        ``Σ c_i·(o_i + (c_i + 1)/2)`` (causal query-key pairs) and ``Σ (o_i + c_i)``.

    Examples
    --------
    >>> prefill_chunk_stats([512], [0])
    (131328.0, 512.0)
    """
    c = np.asarray(chunk_tokens, dtype=float)
    o = np.asarray(chunk_offsets, dtype=float)
    if c.shape != o.shape:
        raise ConfigError(f"prefill_chunk_stats: chunk_tokens shape {c.shape} != chunk_offsets "
                          f"shape {o.shape}")
    if (c < 0).any() or (o < 0).any() or not (np.isfinite(c).all() and np.isfinite(o).all()):
        raise ConfigError("prefill_chunk_stats: chunk sizes and offsets must be finite and >= 0")
    pairs = c * (o + (c + 1.0) / 2.0)
    kv = np.where(c > 0, o + c, 0.0)
    if per_chunk:
        return pairs, kv
    return float(pairs.sum()), float(kv.sum())

