"""Roofline basis: the one place that knows the latency terms.

A step's forward-pass time is modelled as ``iteration_us = sum_j beta_j * x_j(batch)``, where each
feature ``x_j`` is computed here from a *batch table* (one row per engine iteration) and the
model / GPU / serving configuration. Roofline terms have a feature in µs (an ideal time at peak
FLOP/s or peak bandwidth), so their coefficient is a dimensionless inefficiency factor (>= 1 in
practice); overhead terms have a count as feature and a coefficient in µs per unit.

Batch table columns (all counts, floats allowed)
------------------------------------------------
``num_prefill_reqs, prefill_tokens, prefill_attn_pairs, prefill_kv_tokens, num_decode_reqs,
decode_tokens, decode_ctx_tokens`` (required) and ``offload_tokens`` (optional, default 0).
See ``docs/ARCHITECTURE.md`` and :func:`prefill_chunk_stats`. Negative or NaN values raise
:class:`~bayes_latency.errors.ConfigError` naming the column and row index.

Notation: ``P`` prefill tokens, ``D`` decode tokens, ``T = P + D``, ``L`` layers, ``H`` query heads,
``d`` head dim, ``kvh_gpu = max(1, n_kv_heads / TP)``, ``N_matmul`` =
:attr:`Architecture.params_dense_matmul_per_token`, ``peak`` = GPU dense peak for the model's
matmul dtype (FP8 checkpoints use the FP8 peak when the GPU has one). Every feature is 0 for an
empty step (``T = 0``) except ``per_step`` = 1.

Default terms (``DEFAULT_TERMS``, this order is the ``term`` coordinate of the posterior)
----------------------------------------------------------------------------------------
====  ================  ===============================================================  ==========
 #    name              feature per step                                                 coef unit
====  ================  ===============================================================  ==========
 0    prefill_compute   (2·P·N_matmul + 4·L·H·d·prefill_attn_pairs) / (TP·peak), µs       1
 1    prefill_kv        L·2·kvh_gpu·d·kv_bytes·prefill_kv_tokens / hbm_bw, µs             1
 2    decode_compute    (2·D·N_matmul + 4·L·H·d·decode_ctx_tokens) / (TP·peak), µs        1
 3    decode_kv         L·2·kvh_gpu·d·kv_bytes·decode_ctx_tokens / hbm_bw, µs             1
 4    weight_loading    weight bytes read per GPU / hbm_bw, µs (MoE: expected experts)    1
 5    tp_allreduce      TP>1: 2·L·T·hidden·act_bytes·2(TP−1)/TP / interconnect_bw, µs     1
 6    per_layer         L (if T > 0)                                                      µs/layer
 7    per_request       num_prefill_reqs + num_decode_reqs                                µs/request
 8    per_step          1                                                                 µs
 9    moe_layer         number of MoE layers (if T > 0)                                   µs/layer
 10   moe_dispatch      EP>1: 2·n_moe·T·k·hidden·act_bytes·(EP−1)/EP / interconnect_bw    1
====  ================  ===============================================================  ==========

MLA models (DeepSeek-V2) use ``2·H·(d_qk + d_v)`` instead of ``4·H·d`` for attention FLOPs per
query-key pair and ``(kv_lora_rank + qk_rope_head_dim)·kv_bytes`` instead of ``2·kvh_gpu·d·kv_bytes``
for KV bytes per token and layer.

Extra terms (``exportable=False``, opt-in via ``terms=``): ``cpu_offload`` and ``kv_pressure``.

BLIS slot mapping
-----------------
BLIS's ``trained-physics`` latency model takes a 10-element ``beta_coeffs`` vector. Which of our
terms fills which slot is **this package's own mapping**, defined only here, by the ``blis_index``
of each :class:`Term` (and mirrored in :data:`BLIS_BETA_ORDER`, which is derived from it)::

    0 prefill_compute  1 prefill_kv  2 weight_loading  3 decode_kv  4 per_layer
    5 per_request      6 per_step    7 moe_layer       8 decode_compute  9 tp_allreduce

``moe_dispatch`` is in the default set but has no BLIS slot (``blis_index=None``); exporters must
warn or fold it. If BLIS's slot order changes, change the ``blis_index`` values below and nothing
else.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from bayes_latency.errors import ConfigError
from bayes_latency.physics.architecture import (
    Architecture,
    expected_distinct_experts,
    load_architecture,
)
from bayes_latency.physics.hardware import GPU, load_gpu
from bayes_latency.physics.serving import ServingConfig

US_PER_S = 1e6
HOST_LINK_BANDWIDTH = 25e9
"""Effective GPU<->host bandwidth (bytes/s, PCIe Gen4/5 x16 achievable) used by ``cpu_offload``."""
ACTIVATION_RESERVE = 0.10
"""Fraction of the vLLM memory budget kept for activations / CUDA graphs in :func:`kv_capacity_tokens`."""

REQUIRED_COLUMNS: tuple[str, ...] = (
    "num_prefill_reqs", "prefill_tokens", "prefill_attn_pairs", "prefill_kv_tokens",
    "num_decode_reqs", "decode_tokens", "decode_ctx_tokens",
)
"""Batch-table columns every batch table must have."""
OPTIONAL_COLUMNS: tuple[str, ...] = ("offload_tokens",)
"""Batch-table columns that default to 0 when absent."""
BATCH_COLUMNS: tuple[str, ...] = REQUIRED_COLUMNS + OPTIONAL_COLUMNS
"""All batch-table columns, in order."""


# ----------------------------------------------------------------------------- context
@dataclass(frozen=True)
class BasisContext:
    """Validated batch columns (float64 arrays) plus the configuration, passed to term functions.

    Attributes
    ----------
    cols : dict[str, numpy.ndarray]
        One float64 array per :data:`BATCH_COLUMNS` entry.
    arch, gpu, serving
        The configuration.
    """

    cols: dict[str, np.ndarray]
    arch: Architecture
    gpu: GPU
    serving: ServingConfig

    def __getitem__(self, key: str) -> np.ndarray:
        return self.cols[key]

    @property
    def n(self) -> int:
        """Number of rows."""
        return len(self.cols["prefill_tokens"])

    @property
    def tokens(self) -> np.ndarray:
        """``T = prefill_tokens + decode_tokens`` per row."""
        return self.cols["prefill_tokens"] + self.cols["decode_tokens"]

    @property
    def active(self) -> np.ndarray:
        """1.0 where the step schedules at least one token, else 0.0."""
        return (self.tokens > 0).astype(float)

    @property
    def peak_flops(self) -> float:
        """GPU dense peak FLOP/s for the model's matmul dtype."""
        return self.gpu.peak_flops(self.arch.compute_bytes)


# ----------------------------------------------------------------------------- terms
@dataclass(frozen=True)
class Term:
    """One latency term: a feature column and how its coefficient is read.

    Attributes
    ----------
    name : str
        Identifier (the ``term`` coordinate and ``x_<name>`` observation column).
    unit : str
        Unit of the coefficient (``"1"`` for dimensionless roofline multipliers).
    feature_unit : str
        Unit of the feature.
    blis_index : int or None
        Slot in BLIS's 10-element ``beta_coeffs`` (None = no slot).
    exportable : bool
        Whether exporters may emit the coefficient to a simulator.
    group : str
        ``"compute"``, ``"memory"``, ``"communication"`` or ``"overhead"``.
    doc : str
        Equation and units.
    fn : callable
        ``fn(ctx: BasisContext) -> numpy.ndarray`` of shape (n_rows,).
    """

    name: str
    unit: str
    feature_unit: str
    blis_index: int | None
    exportable: bool
    group: str
    doc: str
    fn: Callable[[BasisContext], np.ndarray] = field(repr=False, compare=False)

    def feature(self, batches: Any, arch: Architecture, gpu: GPU,
                serving: ServingConfig | None = None) -> np.ndarray:
        """Feature column of this term for a batch table (see :func:`basis_matrix`)."""
        return basis_matrix(batches, arch, gpu, serving, terms=(self,))[:, 0]


def _prefill_compute(ctx: BasisContext) -> np.ndarray:
    """Prefill compute roofline, µs.

    ``(2·P·N_matmul + L·a·prefill_attn_pairs) / (TP·peak_flops) · 1e6`` with
    ``a = 2·H·(d_qk + d_v)`` attention FLOPs per query-key pair per layer (``4·H·d``).
    Coefficient: dimensionless (≈ 1 / achieved MFU).
    """
    a = ctx.arch
    flops = (2.0 * ctx["prefill_tokens"] * a.params_dense_matmul_per_token
             + a.n_layers * a.attn_flops_per_pair_per_layer * ctx["prefill_attn_pairs"])
    return flops / (ctx.serving.tp * ctx.peak_flops) * US_PER_S


def _decode_compute(ctx: BasisContext) -> np.ndarray:
    """Decode compute roofline, µs.

    ``(2·D·N_matmul + L·a·decode_ctx_tokens) / (TP·peak_flops) · 1e6``, ``a = 4·H·d`` (MLA:
    ``2·H·(d_qk + d_v)``). Coefficient: dimensionless.
    """
    a = ctx.arch
    flops = (2.0 * ctx["decode_tokens"] * a.params_dense_matmul_per_token
             + a.n_layers * a.attn_flops_per_pair_per_layer * ctx["decode_ctx_tokens"])
    return flops / (ctx.serving.tp * ctx.peak_flops) * US_PER_S


def _prefill_kv(ctx: BasisContext) -> np.ndarray:
    """KV-cache traffic of prefill attention, µs.

    ``L·2·kvh_gpu·d·kv_bytes·prefill_kv_tokens / hbm_bandwidth · 1e6`` (MLA: latent bytes).
    Coefficient: dimensionless (≈ 1 / achieved bandwidth fraction).
    """
    per_tok = ctx.arch.kv_bytes_per_token_gpu(ctx.serving.tp)
    return per_tok * ctx["prefill_kv_tokens"] / ctx.gpu.hbm_bandwidth * US_PER_S


def _decode_kv(ctx: BasisContext) -> np.ndarray:
    """KV-cache reads of decode attention, µs.

    ``L·2·kvh_gpu·d·kv_bytes·decode_ctx_tokens / hbm_bandwidth · 1e6``. Coefficient: dimensionless.
    """
    per_tok = ctx.arch.kv_bytes_per_token_gpu(ctx.serving.tp)
    return per_tok * ctx["decode_ctx_tokens"] / ctx.gpu.hbm_bandwidth * US_PER_S


def _weight_loading(ctx: BasisContext) -> np.ndarray:
    """Weight reads of one forward pass on one GPU, µs (0 when T = 0).

    ``(N_read·wb / TP + n_moe·E_T·expert_params·wb / (TP·EP)) / hbm_bandwidth · 1e6`` where
    ``N_read`` are the non-expert parameters read every step (all but routed experts and the
    embedding table), ``wb`` weight bytes and ``E_T = E·(1 − (1 − k/E)^T)`` the expected distinct
    experts touched by ``T`` tokens per MoE layer. Coefficient: dimensionless.
    """
    a, s = ctx.arch, ctx.serving
    t = ctx.tokens
    dense = a.params_nonexpert_read * a.weight_bytes / s.tp
    experts = (a.n_moe_layers * expected_distinct_experts(a, t) * a.expert_params_per_layer
               * a.weight_bytes / (s.tp * s.ep))
    return (dense * ctx.active + experts) / ctx.gpu.hbm_bandwidth * US_PER_S


def _tp_allreduce(ctx: BasisContext) -> np.ndarray:
    """Tensor-parallel all-reduce traffic, µs (0 at TP = 1).

    Two ring all-reduces per layer of the ``T x hidden`` activations:
    ``2·L·T·hidden·act_bytes·2(TP−1)/TP / interconnect_bandwidth · 1e6``. Coefficient: dimensionless
    (≈ 1 / NCCL bus efficiency, plus latency absorbed).
    """
    a, tp = ctx.arch, ctx.serving.tp
    if tp <= 1:
        return np.zeros(ctx.n)
    vol = 2.0 * a.n_layers * ctx.tokens * a.hidden * a.act_bytes * 2.0 * (tp - 1) / tp
    return vol / ctx.gpu.interconnect_bandwidth * US_PER_S


def _per_layer(ctx: BasisContext) -> np.ndarray:
    """Per-layer fixed cost: feature ``L`` when T > 0 (layers); coefficient µs/layer (launches)."""
    return ctx.arch.n_layers * ctx.active


def _per_request(ctx: BasisContext) -> np.ndarray:
    """Per-request cost: feature ``num_prefill_reqs + num_decode_reqs``; coefficient µs/request."""
    return (ctx["num_prefill_reqs"] + ctx["num_decode_reqs"]) * ctx.active


def _per_step(ctx: BasisContext) -> np.ndarray:
    """Per-step fixed cost (scheduler, sampling, launch): feature 1; coefficient µs."""
    return np.ones(ctx.n)


def _moe_layer(ctx: BasisContext) -> np.ndarray:
    """MoE routing/gating fixed cost: feature ``n_moe_layers`` when T > 0; coefficient µs/layer."""
    return ctx.arch.n_moe_layers * ctx.active


def _moe_dispatch(ctx: BasisContext) -> np.ndarray:
    """Expert-parallel all-to-all, µs (0 at EP = 1).

    Dispatch + combine of ``k`` copies of each token's activations per MoE layer:
    ``2·n_moe·T·k·hidden·act_bytes·(EP−1)/EP / interconnect_bandwidth · 1e6``. Coefficient: dimensionless.
    """
    a, ep = ctx.arch, ctx.serving.ep
    if ep <= 1 or not a.n_moe_layers:
        return np.zeros(ctx.n)
    vol = (2.0 * a.n_moe_layers * ctx.tokens * a.experts_per_token * a.hidden * a.act_bytes
           * (ep - 1) / ep)
    return vol / ctx.gpu.interconnect_bandwidth * US_PER_S


def _cpu_offload(ctx: BasisContext) -> np.ndarray:
    """KV offload traffic over the host link, µs.

    ``offload_tokens · kv_bytes_per_token_gpu / 25e9 · 1e6`` (each GPU moves its own KV shard over
    its own host link at :data:`HOST_LINK_BANDWIDTH`). Coefficient: dimensionless.
    """
    per_tok = ctx.arch.kv_bytes_per_token_gpu(ctx.serving.tp)
    return ctx["offload_tokens"] * per_tok / HOST_LINK_BANDWIDTH * US_PER_S * ctx.active


def _kv_pressure(ctx: BasisContext) -> np.ndarray:
    """KV-cache occupancy by decode contexts: ``decode_ctx_tokens / kv_capacity_tokens``.

    Dimensionless feature; coefficient µs (cost of a full cache: fragmentation, paging).
    """
    cap = kv_capacity_tokens(ctx.arch, ctx.gpu, ctx.serving)
    if cap <= 0:
        raise ConfigError(f"term 'kv_pressure': model {ctx.arch.name!r} leaves no KV-cache memory "
                          f"on {ctx.gpu.name} at tp={ctx.serving.tp}")
    return ctx["decode_ctx_tokens"] / cap * ctx.active


def _mk(name: str, unit: str, feature_unit: str, blis_index: int | None, exportable: bool,
        group: str, fn: Callable[[BasisContext], np.ndarray]) -> Term:
    return Term(name=name, unit=unit, feature_unit=feature_unit, blis_index=blis_index,
                exportable=exportable, group=group, doc=" ".join((fn.__doc__ or "").split()), fn=fn)


# The registry. ``blis_index`` here is THE BLIS slot mapping (see module docstring).
TERMS: dict[str, Term] = {t.name: t for t in (
    _mk("prefill_compute", "1", "us", 0, True, "compute", _prefill_compute),
    _mk("prefill_kv", "1", "us", 1, True, "memory", _prefill_kv),
    _mk("decode_compute", "1", "us", 8, True, "compute", _decode_compute),
    _mk("decode_kv", "1", "us", 3, True, "memory", _decode_kv),
    _mk("weight_loading", "1", "us", 2, True, "memory", _weight_loading),
    _mk("tp_allreduce", "1", "us", 9, True, "communication", _tp_allreduce),
    _mk("per_layer", "us/layer", "layers", 4, True, "overhead", _per_layer),
    _mk("per_request", "us/request", "requests", 5, True, "overhead", _per_request),
    _mk("per_step", "us", "1", 6, True, "overhead", _per_step),
    _mk("moe_layer", "us/layer", "layers", 7, True, "overhead", _moe_layer),
    _mk("moe_dispatch", "1", "us", None, True, "communication", _moe_dispatch),
    _mk("cpu_offload", "1", "us", None, False, "communication", _cpu_offload),
    _mk("kv_pressure", "us", "1", None, False, "overhead", _kv_pressure),
)}
"""Ordered registry of every known term (default terms first, then extras)."""

DEFAULT_TERMS: tuple[str, ...] = (
    "prefill_compute", "prefill_kv", "decode_compute", "decode_kv", "weight_loading",
    "tp_allreduce", "per_layer", "per_request", "per_step", "moe_layer", "moe_dispatch",
)
"""The default term set, in the order of the posterior's ``term`` coordinate."""

EXTRA_TERMS: tuple[str, ...] = ("cpu_offload", "kv_pressure")
"""Non-default, non-exportable terms usable through ``terms=``."""

BLIS_BETA_ORDER: tuple[str, ...] = tuple(
    t.name for t in sorted((t for t in TERMS.values() if t.blis_index is not None),
                           key=lambda t: t.blis_index or 0))
"""Term names by BLIS ``beta_coeffs`` slot (derived from ``Term.blis_index``)."""


@dataclass(frozen=True)
class AlphaTerm:
    """A request-level (API-side) latency term outside the engine step.

    Attributes
    ----------
    name, unit, feature_unit, doc : str
    """

    name: str
    unit: str
    feature_unit: str
    doc: str


ALPHA_TERM_INFO: dict[str, AlphaTerm] = {a.name: a for a in (
    AlphaTerm("alpha_arrival", "us", "1",
              "API arrival -> engine QUEUED (tokenization, input processing); feature 1 per request, "
              "coefficient µs."),
    AlphaTerm("alpha_post_decode", "us", "1",
              "engine FINISHED -> API DEPARTED fixed part (detokenize, response); feature 1 per "
              "request, coefficient µs."),
    AlphaTerm("alpha_per_token", "us/token", "output tokens",
              "per-output-token API cost (detokenize, stream); feature = output tokens, "
              "coefficient µs/token."),
)}
"""Units and meaning of the alpha terms."""

ALPHA_TERMS: tuple[str, ...] = tuple(ALPHA_TERM_INFO)
"""Alpha (request-level) term names: ``alpha_arrival``, ``alpha_post_decode``, ``alpha_per_token``."""


def get_term(name: str | Term) -> Term:
    """The :class:`Term` called ``name`` (a ``Term`` is returned unchanged).

    Raises
    ------
    ConfigError
        Unknown term (lists the known ones).
    """
    if isinstance(name, Term):
        return name
    try:
        return TERMS[name]
    except KeyError:
        raise ConfigError(f"unknown term {name!r}; known terms: {', '.join(TERMS)}") from None


def term_names(terms: Sequence[str | Term] = DEFAULT_TERMS) -> list[str]:
    """Names of a term set (validated; duplicates raise :class:`ConfigError`)."""
    names = [get_term(t).name for t in terms]
    if len(set(names)) != len(names):
        raise ConfigError(f"duplicate terms in term set: {names}")
    return names


# ----------------------------------------------------------------------------- batches
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

    Missing optional columns (``offload_tokens``) are filled with 0.

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
    return cols


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


# ----------------------------------------------------------------------------- main API
def basis_matrix(batches: Any, arch: Architecture, gpu: GPU,
                 serving: ServingConfig | None = None,
                 terms: Sequence[str | Term] = DEFAULT_TERMS) -> np.ndarray:
    """Feature matrix of a batch table.

    Parameters
    ----------
    batches : pandas.DataFrame or mapping
        Batch table (columns :data:`BATCH_COLUMNS`; a mapping of scalars is one row).
    arch : Architecture
        (or a name / config path accepted by :func:`load_architecture`)
    gpu : GPU
        (or a name / datasheet path accepted by :func:`load_gpu`)
    serving : ServingConfig, optional
        Defaults to ``ServingConfig()`` (TP = 1).
    terms : sequence of str or Term
        Term set, default :data:`DEFAULT_TERMS`.

    Returns
    -------
    numpy.ndarray
        Shape ``(n_rows, n_terms)``, float64.

    Raises
    ------
    ConfigError
        Bad batch table or unknown term.
    """
    serving = serving if serving is not None else ServingConfig()
    ts = [get_term(t) for t in terms]
    term_names(ts)
    ctx = BasisContext(cols=validate_batches(batches), arch=load_architecture(arch),
                       gpu=load_gpu(gpu), serving=serving)
    out = np.empty((ctx.n, len(ts)), dtype=float)
    active = ctx.active
    for j, t in enumerate(ts):
        col = np.broadcast_to(np.asarray(t.fn(ctx), dtype=float), (ctx.n,))
        # an empty step (T = 0) has only its fixed cost
        out[:, j] = col if t.name == "per_step" else col * active
    return out


def basis_frame(batches: Any, arch: Architecture, gpu: GPU,
                serving: ServingConfig | None = None,
                terms: Sequence[str | Term] = DEFAULT_TERMS) -> pd.DataFrame:
    """:func:`basis_matrix` as a DataFrame (columns = term names, index = the batch table's)."""
    m = basis_matrix(batches, arch, gpu, serving, terms)
    idx = batches.index if isinstance(batches, pd.DataFrame) else None
    return pd.DataFrame(m, columns=term_names(terms), index=idx)


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


__all__ = [
    "ACTIVATION_RESERVE", "ALPHA_TERMS", "ALPHA_TERM_INFO", "AlphaTerm", "BATCH_COLUMNS",
    "BLIS_BETA_ORDER", "BasisContext", "DEFAULT_TERMS", "EXTRA_TERMS", "HOST_LINK_BANDWIDTH",
    "OPTIONAL_COLUMNS", "REQUIRED_COLUMNS", "TERMS", "Term", "basis_frame", "basis_matrix",
    "fits", "get_term", "kv_capacity_tokens", "prefill_chunk_stats", "term_names",
    "validate_batches", "weight_bytes_per_gpu",
]
