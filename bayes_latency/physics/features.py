"""The feature of each latency term: one function per term, from a batch table and its configuration.

Each function takes a :class:`BasisContext` (the validated batch columns and the model, GPU and
serving configuration) and returns the term's feature per step; its docstring gives the equation
and the units of the feature and of the coefficient. :data:`FEATURES` maps a term's name to its
function. :mod:`bayes_latency.physics.basis` holds the registry of terms built on them (units,
BLIS slots, term sets) and :func:`~bayes_latency.physics.basis.basis_matrix`, which every caller
uses; the 11 BLIS terms mirror BLIS's ``StepTime`` (see that module's docstring and
``tests/test_blis_golden.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from bayes_latency.errors import ConfigError
from bayes_latency.physics.architecture import Architecture
from bayes_latency.physics.blis import KV_BYTES
from bayes_latency.physics.capacity import kv_capacity_tokens
from bayes_latency.physics.hardware import GPU
from bayes_latency.physics.serving import ServingConfig

__all__ = ["FEATURES", "HOST_LINK_BANDWIDTH", "KNEES", "US_PER_S", "BasisContext"]


US_PER_S = 1e6
HOST_LINK_BANDWIDTH = 25e9
"""Effective GPU<->host bandwidth (bytes/s, PCIe Gen4/5 x16 achievable) used by ``cpu_offload``."""


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


# ---- BLIS parity: the exported terms are BLIS's ``trained-physics`` basis functions -----------
# Every formula below mirrors ``StepTime`` in BLIS's sim/latency/trained_physics_model.go (commit
# in :data:`bayes_latency.physics.blis.BLIS_COMMIT`) with BLIS's own reading of the model config
# (``arch.blis_shape``) and GPU (``gpu.blis``); tests/test_blis_golden.py checks them against
# BLIS's StepTime on >= 200 batches. Notation as BLIS: L layers, d hidden, H heads, dH = d // H,
# dKV = kv_heads·dH, tp, dp (MoE only, else 1), G = tp·dp (MoE) or tp (dense), P prefill tokens,
# D decode tokens, T = P + D, ctx = Σ tokens in KV before each decode token.


def _blis(ctx: BasisContext) -> tuple[Any, float, float, float, float, float]:
    """(shape, tp, dp, G, FLOP per µs, bytes per µs) as BLIS sees the configuration."""
    m = ctx.arch.blis_shape
    tp = float(ctx.serving.tp)
    dp = float(ctx.serving.dp) if m.is_moe else 1.0
    group = tp * dp if m.is_moe else tp
    hw = ctx.gpu.blis
    return m, tp, dp, group, hw.flops_per_us(m.weight_bpp), hw.bytes_per_us


def _blis_ffn_flops(ctx: BasisContext, tokens: np.ndarray) -> np.ndarray:
    """FFN FLOPs of ``tokens`` tokens: routed experts (k_eff per token over G GPUs), shared
    experts and dense layers (6·d·d_ff per token and layer: 3 matrices)."""
    m, tp, dp, group, _, _ = _blis(ctx)
    d = float(m.hidden)
    out = np.zeros_like(tokens)
    if m.n_moe_layers > 0:
        out = out + m.n_moe_layers * (tokens * m.k_eff / group) * 6.0 * d * m.d_ff_moe
        if m.shared_ffn:
            out = out + m.n_moe_layers * tokens * 6.0 * d * m.shared_ffn / (tp * dp)
    if m.n_dense_layers > 0:
        out = out + m.n_dense_layers * tokens * 6.0 * d * m.d_ff_dense / (tp * dp)
    return out


def _blis_proj_flops(ctx: BasisContext, tokens: np.ndarray) -> np.ndarray:
    """Q/K/V/O projection FLOPs: ``L·2·tokens·d·(2d + 2dKV) / (tp·dp)``."""
    m, tp, dp, _, _, _ = _blis(ctx)
    d = float(m.hidden)
    return m.n_layers * 2.0 * tokens * d * (2.0 * d + 2.0 * m.d_kv) / (tp * dp)


def _prefill_compute(ctx: BasisContext) -> np.ndarray:
    """Prefill compute roofline (BLIS β slot 0), µs.

    ``[L·2·P·d·(2d+2dKV)/(tp·dp) + L·4·(H/tp)·dH·Σ_i c_i·(S_i + c_i/2)/dp + FFN(P)] / peak``,
    where chunk ``c_i`` belongs to a request of input length ``S_i`` (batch column
    ``prefill_input_pairs``; BLIS charges attention against the full input, whatever part of it is
    already in the KV cache) and ``FFN(N) = n_moe·N·k/G·6·d·d_ff_moe + n_moe·N·6·d·d_shared/(tp·dp)
    + n_dense·N·6·d·d_ff/(tp·dp)``. Peak: BLIS's ``TFlopsPeak`` (``TFlopsFP8`` for 1-byte
    weights). Coefficient: dimensionless (≈ 1 / achieved MFU).
    """
    m, tp, dp, _, flops_us, _ = _blis(ctx)
    p = ctx["prefill_tokens"]
    attn = m.n_layers * 4.0 * (m.n_heads / tp) * m.head_dim * ctx["prefill_input_pairs"] / dp
    return (_blis_proj_flops(ctx, p) + attn + _blis_ffn_flops(ctx, p)) / flops_us


def _decode_compute(ctx: BasisContext) -> np.ndarray:
    """Decode compute roofline (BLIS β slot 1), µs.

    ``[L·2·D·d·(2d+2dKV)/(tp·dp) + L·4·(H/tp)·dH·ctx/dp + FFN(D)] / peak`` with
    ``ctx = decode_ctx_tokens − decode_tokens`` (BLIS's Σ ProgressIndex: tokens in KV before each
    decoded token). Coefficient: dimensionless.
    """
    m, tp, dp, _, flops_us, _ = _blis(ctx)
    dtok = ctx["decode_tokens"]
    past = np.maximum(ctx["decode_ctx_tokens"] - dtok, 0.0)
    attn = m.n_layers * 4.0 * (m.n_heads / tp) * past * m.head_dim / dp
    return (_blis_proj_flops(ctx, dtok) + attn + _blis_ffn_flops(ctx, dtok)) / flops_us


def _prefill_kv(ctx: BasisContext) -> np.ndarray:
    """KV-cache writes of prefill (BLIS β slot 8, "prefill memory"), µs.

    ``L·2·(dKV/(tp·dp))·P·2 bytes / hbm_bw``. Coefficient: dimensionless. (Reads of the context
    already in the cache are the extra term ``prefill_context_kv``.)
    """
    m, tp, dp, _, _, bw_us = _blis(ctx)
    return m.n_layers * 2.0 * (m.d_kv / (tp * dp)) * ctx["prefill_tokens"] * KV_BYTES / bw_us


def _decode_kv(ctx: BasisContext) -> np.ndarray:
    """KV-cache reads and writes of decode (BLIS β slot 9, "decode memory"), µs.

    ``L·2·(dKV/(tp·dp))·2 bytes·decode_ctx_tokens / hbm_bw`` (``decode_ctx_tokens`` counts the
    decoded token itself: BLIS's ``sumCtx + D``). Coefficient: dimensionless.
    """
    m, tp, dp, _, _, bw_us = _blis(ctx)
    return m.n_layers * 2.0 * (m.d_kv / (tp * dp)) * KV_BYTES * ctx["decode_ctx_tokens"] / bw_us


def _weight_loading(ctx: BasisContext) -> np.ndarray:
    """Weight reads of one step on one GPU (BLIS β slot 2), µs.

    ``[L·d·(2d+2dKV)·w/tp + n_moe·(E/G)·3·d·d_ff_moe·w + n_moe·3·d·d_shared·w/tp
    + n_dense·3·d·d_ff·w/tp] / hbm_bw`` with ``w`` bytes per weight: every routed expert of every
    MoE layer is read each step (BLIS's saturation-point model); embeddings and LM head are not
    counted. Coefficient: dimensionless.
    """
    m, tp, _, group, _, bw_us = _blis(ctx)
    d, w = float(m.hidden), m.weight_bpp
    b = m.n_layers * d * (2.0 * d + 2.0 * m.d_kv) * w / tp
    if m.n_moe_layers > 0:
        b += m.n_moe_layers * (m.n_experts / group) * 3.0 * d * m.d_ff_moe * w
        if m.shared_ffn > 0:
            b += m.n_moe_layers * 3.0 * d * m.shared_ffn * w / tp
    if m.n_dense_layers > 0:
        b += m.n_dense_layers * 3.0 * d * m.d_ff_dense * w / tp
    return np.full(ctx.n, b / bw_us)


def _allreduce_basis(ctx: BasisContext, units: float) -> np.ndarray:
    """BLIS's ring all-reduce basis ``units·T·d·act_bytes·2·(tp−1)/tp / hbm_bw`` (0 at tp = 1)."""
    m, tp, _, _, _, bw_us = _blis(ctx)
    if tp <= 1:
        return np.zeros(ctx.n)
    return units * ctx.tokens * m.hidden * m.act_bpp * 2.0 * (tp - 1.0) / tp / bw_us


def _tp_allreduce(ctx: BasisContext) -> np.ndarray:
    """Tensor-parallel communication (BLIS β slot 3), µs; 0 at TP = 1.

    Ring all-reduces of the ``T x d`` activations, one per attention sublayer and one per dense
    FFN (``/dp``), plus one per MoE FFN when ``dp = 1``: ``V(L)/dp + V(n_dense)/dp + V(n_moe)``,
    ``V(u) = u·T·d·act_bytes·2·(tp−1)/tp / hbm_bw``. BLIS divides by the HBM bandwidth, so the
    coefficient absorbs the HBM/link bandwidth ratio (≈ 7.4 on H100 NVLink 4) over the achieved
    collective efficiency. Coefficient: dimensionless.
    """
    m, _, dp, _, _, _ = _blis(ctx)
    out = (_allreduce_basis(ctx, m.n_layers) + _allreduce_basis(ctx, m.n_dense_layers)) / dp
    if m.is_moe and m.n_moe_layers > 0 and dp == 1.0:
        out = out + _allreduce_basis(ctx, m.n_moe_layers)
    return out


def _per_layer(ctx: BasisContext) -> np.ndarray:
    """Per-layer fixed cost (BLIS β slot 4): feature ``L`` when T > 0 (layers); coefficient µs/layer."""
    return np.full(ctx.n, float(ctx.arch.blis_shape.n_layers))


def _per_request(ctx: BasisContext) -> np.ndarray:
    """Per-request cost (BLIS β slot 5): feature ``num_prefill_reqs + num_decode_reqs`` (BLIS's
    batch size); coefficient µs/request."""
    return ctx["num_prefill_reqs"] + ctx["num_decode_reqs"]


def _per_step(ctx: BasisContext) -> np.ndarray:
    """Per-step fixed cost (BLIS β slot 6: scheduler, sampling, launch): feature 1; coefficient µs."""
    return np.ones(ctx.n)


def _moe_layer(ctx: BasisContext) -> np.ndarray:
    """Per-MoE-layer cost of *interleaved* MoE models (BLIS β slot 7): feature ``n_moe`` when the
    model interleaves MoE and dense layers (Llama-4 Scout), else 0 (BLIS charges uniform MoE
    models such as Mixtral nothing here; see the extra term ``moe_routing``); coefficient µs/layer.
    """
    m = ctx.arch.blis_shape
    return np.full(ctx.n, float(m.n_moe_layers) if m.interleaved else 0.0)


def _moe_dispatch(ctx: BasisContext) -> np.ndarray:
    """MoE dispatch/combine all-to-all (BLIS β slot 10, β_EP), µs; 0 unless an MoE model runs
    with data parallelism (dp > 1).

    BLIS's default all-gather/reduce-scatter family:
    ``n_moe·(T/dp)·(G−1)/G·2·d·act_bytes / hbm_bw``. Coefficient: dimensionless.
    """
    m, _, dp, group, _, bw_us = _blis(ctx)
    if not m.is_moe or dp <= 1.0:
        return np.zeros(ctx.n)
    per_layer = (ctx.tokens / dp) * (group - 1.0) / group * 2.0 * m.hidden * m.act_bpp / bw_us
    return per_layer * m.n_moe_layers


# ---- extra terms: physics richer than BLIS's, fitted on request, never exported as such ------
def _prefill_context_kv(ctx: BasisContext) -> np.ndarray:
    """KV-cache reads of the context already cached when a prefill chunk runs, µs.

    ``L·2·kvh_gpu·d·kv_bytes·(prefill_kv_tokens − prefill_tokens) / hbm_bandwidth · 1e6`` (MLA:
    latent bytes): chunked and prefix-cached prefills re-read the earlier context, which BLIS's
    write-only prefill memory term does not see. Coefficient: dimensionless. Not exportable.
    """
    per_tok = ctx.arch.kv_bytes_per_token_gpu(ctx.serving.tp)
    ctx_tok = np.maximum(ctx["prefill_kv_tokens"] - ctx["prefill_tokens"], 0.0)
    return per_tok * ctx_tok / ctx.gpu.hbm_bandwidth * US_PER_S


def _moe_routing(ctx: BasisContext) -> np.ndarray:
    """Router, top-k and permutation cost of every MoE layer of a *uniform* MoE model: feature
    ``n_moe_layers`` (0 for dense and interleaved models, which BLIS's slot 7 covers); coefficient
    µs/layer. Constant per configuration, so an export folds it into ``per_step``.
    """
    m = ctx.arch.blis_shape
    return np.full(ctx.n, float(ctx.arch.n_moe_layers) if not m.interleaved else 0.0)


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


KNEES: tuple[float, ...] = (2.0, 6.0)
"""Knee positions of the ``compute_over_<k>w`` terms, in multiples of the step's weight-read time."""


def _compute_over(ctx: BasisContext, knee: float) -> np.ndarray:
    """``max(C − knee·W, 0)``: the step's compute beyond ``knee`` times its weight read, µs."""
    compute = _prefill_compute(ctx) + _decode_compute(ctx)
    return np.maximum(compute - knee * _weight_loading(ctx), 0.0)


def _compute_over_2w(ctx: BasisContext) -> np.ndarray:
    """Compute beyond twice the weight read, µs: ``max(C − 2·W, 0)`` with ``C`` the step's
    ``prefill_compute + decode_compute`` features and ``W`` its ``weight_loading`` feature (ideal
    times at the datasheet's peaks). A step whose GEMMs are short next to their weight read pays
    little for its compute (the GPU takes about the larger of the two); past the knee each µs of
    compute is paid in full. Coefficient: dimensionless, the added cost of compute past the knee
    (0 gives the additive basis back). Not exportable.
    """
    return _compute_over(ctx, KNEES[0])


def _compute_over_6w(ctx: BasisContext) -> np.ndarray:
    """Compute beyond six times the weight read, µs: ``max(C − 6·W, 0)``, as ``compute_over_2w``
    with the knee where many-token GEMMs reach their compute-bound efficiency. Coefficient:
    dimensionless (0 gives the additive basis back). Not exportable.
    """
    return _compute_over(ctx, KNEES[1])


#: Term name -> feature function (``fn(ctx) -> (n_rows,)`` array).
FEATURES: dict[str, Callable[[BasisContext], np.ndarray]] = {
    "prefill_compute": _prefill_compute,
    "prefill_kv": _prefill_kv,
    "decode_compute": _decode_compute,
    "decode_kv": _decode_kv,
    "weight_loading": _weight_loading,
    "tp_allreduce": _tp_allreduce,
    "per_layer": _per_layer,
    "per_request": _per_request,
    "per_step": _per_step,
    "moe_layer": _moe_layer,
    "moe_dispatch": _moe_dispatch,
    "prefill_context_kv": _prefill_context_kv,
    "moe_routing": _moe_routing,
    "cpu_offload": _cpu_offload,
    "kv_pressure": _kv_pressure,
    "compute_over_2w": _compute_over_2w,
    "compute_over_6w": _compute_over_6w,
}
