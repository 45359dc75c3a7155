"""BLIS's view of a model and a GPU: the numbers its ``trained-physics`` basis is computed from.

BLIS (inference-sim, ``sim/latency/trained_physics_model.go``) is the simulator our coefficients
are exported to, and its Go code is the specification of what an exported number means. Its
basis functions read a model's Hugging Face ``config.json`` and a GPU's ``hardware_config.json``
entry in their own way, which differs from this package's richer :class:`Architecture` in places
that change the numbers:

- head dimension is ``hidden_size // num_attention_heads`` (an explicit ``head_dim`` is ignored);
- KV-cache elements are always 2 bytes; activations use ``torch_dtype``'s width;
- a model is MoE when its routed-expert count is >= 2; every MoE layer loads *all* of its
  experts' weights each step (``n_experts / (TP·DP)`` per GPU), not the experts the batch routes to;
- only interleaved MoE models (``interleave_moe_layer_step > 0``) have dense layers next to MoE
  ones, and only they get the per-MoE-layer overhead (slot 7);
- embeddings and the LM head are in neither FLOPs nor weight bytes;
- TP communication is divided by the HBM bandwidth (the coefficient absorbs the link/HBM ratio).

This module mirrors ``GetModelConfigFromHF`` (``sim/latency/config.go``), the constructor
``NewTrainedPhysicsModel`` and ``hardware_config.json`` so that :mod:`bayes_latency.physics.basis`
computes BLIS's basis functions exactly (``tests/test_blis_golden.py`` checks it against BLIS's own
``StepTime`` on >= 200 batches). Pure Python; no dependency on the rest of the package.

References: BLIS commit ``f90a1e3`` (``../shared/blis/``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

BLIS_COMMIT = "f90a1e3a6787da17c2cd463dab6fb2660b1b1760"
"""The BLIS snapshot whose ``trained-physics`` basis this module mirrors."""

KV_BYTES = 2.0
"""BLIS's ``bytesPerKVElement``: KV-cache elements are FP16 whatever the weights."""

MOE_MIN_EXPERTS = 2
"""BLIS's ``MoEMinExperts``: fewer routed experts means a dense-equivalent model."""

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1, "uint8": 1, "fp8": 1,
                "int4": 1, "nf4": 1}
_EXPERT_COUNT_FIELDS = ("num_experts", "moe_num_experts", "n_routed_experts", "num_local_experts",
                        "num_routed_experts")


@dataclass(frozen=True)
class BlisModelShape:
    """The model numbers of BLIS's ``TrainedPhysicsModel`` (``NewTrainedPhysicsModel``).

    Attributes
    ----------
    n_layers, hidden, n_heads, n_kv_heads : int
        ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``, KV heads (MHA fallback).
    head_dim : int
        ``hidden // n_heads`` (integer division, as BLIS).
    d_ff_moe, d_ff_dense : int
        Routed-expert FFN width (``moe_intermediate_size`` or ``intermediate_size``) and dense-layer
        FFN width (``intermediate_size_mlp`` or ``intermediate_size``).
    shared_ffn : int
        Total shared-expert FFN width on each MoE layer (0 = none).
    n_experts : int
        Routed experts (0 for dense models).
    k_eff : int
        ``max(1, num_experts_per_tok)``.
    n_moe_layers, n_dense_layers : int
        Layer split (all MoE for uniform MoE models; ``L // (step + 1)`` MoE layers when interleaved).
    interleaved : bool
        ``interleave_moe_layer_step > 0`` on an MoE model (slot 7 applies only then).
    weight_bpp, act_bpp : float
        Bytes per weight (quantisation-aware) and per activation (``torch_dtype``).
    """

    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff_moe: int
    d_ff_dense: int
    shared_ffn: int
    n_experts: int
    k_eff: int
    n_moe_layers: int
    n_dense_layers: int
    interleaved: bool
    weight_bpp: float
    act_bpp: float

    @property
    def is_moe(self) -> bool:
        """BLIS's ``IsMoE``: at least :data:`MOE_MIN_EXPERTS` routed experts."""
        return self.n_experts >= MOE_MIN_EXPERTS

    @property
    def d_kv(self) -> int:
        """``n_kv_heads · head_dim`` (K or V width of one token and layer)."""
        return self.n_kv_heads * self.head_dim


@dataclass(frozen=True)
class BlisHardware:
    """One entry of BLIS's ``hardware_config.json``.

    Attributes
    ----------
    name : str
        The key BLIS knows the GPU by (``--hardware``).
    tflops_peak, tflops_fp8 : float
        ``TFlopsPeak`` and ``TFlopsFP8`` (0 = no FP8 path), TFLOP/s.
    bw_peak_tbs : float
        ``BwPeakTBs``, TB/s.
    in_blis : bool
        Whether BLIS's shipped ``hardware_config.json`` has this entry (else an exporter must pass
        a hardware config of its own).
    """

    name: str
    tflops_peak: float
    tflops_fp8: float
    bw_peak_tbs: float
    in_blis: bool = True

    def flops_per_us(self, weight_bpp: float) -> float:
        """BLIS's ``flopsPeakUs``: FP8 peak for 1-byte weights when the GPU has one."""
        if weight_bpp == 1.0 and self.tflops_fp8 > 0:
            return self.tflops_fp8 * 1e6
        return self.tflops_peak * 1e6

    @property
    def bytes_per_us(self) -> float:
        """BLIS's ``bwHbmUs`` (bytes per µs)."""
        return self.bw_peak_tbs * 1e6

    def to_hardware_config(self) -> dict[str, Any]:
        """This entry in BLIS's ``hardware_config.json`` layout."""
        return {"TFlopsPeak": self.tflops_peak, "TFlopsFP8": self.tflops_fp8,
                "BwPeakTBs": self.bw_peak_tbs}


def _get_int(cfg: Mapping[str, Any], key: str) -> int:
    """Go's ``getInt``: a JSON number truncated to int, anything else 0."""
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return 0
    return int(v)


def _first_nonzero(cfg: Mapping[str, Any], *keys: str) -> int:
    for k in keys:
        v = _get_int(cfg, k)
        if v != 0:
            return v
    return 0


def _quant_weight_bytes(qc: Any) -> float:
    """BLIS's ``parseQuantizationConfig``: weight bytes of a quantised checkpoint (0 = none)."""
    if not isinstance(qc, Mapping):
        return 0.0
    bits = qc.get("bits")
    if isinstance(bits, str):
        try:
            bits = int(bits)
        except ValueError:
            bits = 0
    if isinstance(bits, (int, float)) and not isinstance(bits, bool) and int(bits) > 0:
        return int(bits) / 8.0
    method = str(qc.get("quant_method") or "").lower()
    if method == "fp8":
        return 1.0
    if method == "compressed-tensors":
        groups = qc.get("config_groups")
        if isinstance(groups, Mapping):
            for k in sorted(groups):
                w = groups[k].get("weights") if isinstance(groups[k], Mapping) else None
                nb = w.get("num_bits") if isinstance(w, Mapping) else None
                if isinstance(nb, (int, float)) and nb > 0:
                    return float(nb) / 8.0
    return 0.0


def blis_shape_from_config(config: Mapping[str, Any],
                           default_act_bytes: float = 2.0) -> BlisModelShape:
    """BLIS's model numbers from a parsed Hugging Face ``config.json``.

    Mirrors ``ParseHFConfig`` (``text_config`` keys pivot over the top level),
    ``GetModelConfigFromHF`` and the constructor of ``TrainedPhysicsModel``.

    Parameters
    ----------
    config : Mapping
        The parsed JSON.
    default_act_bytes : float
        Activation width used when ``torch_dtype``/``dtype`` is absent or unknown (BLIS itself
        refuses such a config; this package keeps going with 2 bytes).
    """
    cfg: dict[str, Any] = dict(config)
    text = config.get("text_config")
    if isinstance(text, Mapping):
        cfg.update(text)
    n_heads = _get_int(cfg, "num_attention_heads")
    n_kv = _first_nonzero(cfg, "num_key_value_heads", "num_kv_heads", "multi_query_group_num")
    n_kv = n_kv or n_heads
    dtype = cfg.get("torch_dtype") if isinstance(cfg.get("torch_dtype"), str) else cfg.get("dtype")
    act = float(_DTYPE_BYTES.get(dtype, 0)) if isinstance(dtype, str) else 0.0
    act = act or float(default_act_bytes)
    d_ff = _first_nonzero(cfg, "intermediate_size", "ffn_hidden_size")
    n_exp = 0
    for k in _EXPERT_COUNT_FIELDS:
        v = _get_int(cfg, k)
        if v >= MOE_MIN_EXPERTS:
            n_exp = v
            break
    moe_ffn = _get_int(cfg, "moe_intermediate_size")
    shared = _get_int(cfg, "shared_expert_intermediate_size")
    if shared <= 0:
        n_shared = _get_int(cfg, "n_shared_experts")
        shared = n_shared * (moe_ffn or d_ff) if n_shared > 0 else 0
    wq = _quant_weight_bytes(cfg.get("quantization_config"))
    n_layers = _get_int(cfg, "num_hidden_layers")
    hidden = _get_int(cfg, "hidden_size")
    step = _get_int(cfg, "interleave_moe_layer_step")
    is_moe = n_exp >= MOE_MIN_EXPERTS
    if step > 0 and is_moe:
        n_moe = n_layers // (step + 1)
    elif is_moe:
        n_moe = n_layers
    else:
        n_moe = 0
    dense_mlp = _get_int(cfg, "intermediate_size_mlp")
    return BlisModelShape(
        n_layers=n_layers, hidden=hidden, n_heads=n_heads, n_kv_heads=n_kv,
        head_dim=hidden // n_heads if n_heads else 0,
        d_ff_moe=moe_ffn if moe_ffn > 0 else d_ff, d_ff_dense=dense_mlp if dense_mlp > 0 else d_ff,
        shared_ffn=shared, n_experts=n_exp, k_eff=max(1, _get_int(cfg, "num_experts_per_tok")),
        n_moe_layers=n_moe, n_dense_layers=n_layers - n_moe, interleaved=step > 0 and is_moe,
        weight_bpp=wq if wq > 0 else act, act_bpp=act)


def blis_shape_from_fields(*, n_layers: int, hidden: int, n_heads: int, n_kv_heads: int,
                           ffn: int, n_experts: int, experts_per_token: int, moe_ffn: int,
                           shared_ffn: int, n_moe_layers: int, weight_bytes: float,
                           act_bytes: float) -> BlisModelShape:
    """A :class:`BlisModelShape` from already-parsed fields (architectures built without a config).

    Uniform MoE when ``n_moe_layers == n_layers``, interleaved otherwise.
    """
    is_moe = n_experts >= MOE_MIN_EXPERTS
    n_moe = n_moe_layers if is_moe else 0
    return BlisModelShape(
        n_layers=n_layers, hidden=hidden, n_heads=n_heads, n_kv_heads=n_kv_heads or n_heads,
        head_dim=hidden // n_heads if n_heads else 0, d_ff_moe=moe_ffn or ffn, d_ff_dense=ffn,
        shared_ffn=shared_ffn, n_experts=n_experts if is_moe else 0,
        k_eff=max(1, experts_per_token), n_moe_layers=n_moe, n_dense_layers=n_layers - n_moe,
        interleaved=is_moe and 0 < n_moe < n_layers, weight_bpp=weight_bytes, act_bpp=act_bytes)


__all__ = ["BLIS_COMMIT", "BlisHardware", "BlisModelShape", "KV_BYTES", "MOE_MIN_EXPERTS",
           "blis_shape_from_config", "blis_shape_from_fields"]


# ------------------------------------------------------------------------------ KV blocks
_GIB = 1 << 30


def _moe_experts(cfg: Mapping[str, Any]) -> int:
    for k in ("num_local_experts", "num_experts", "n_routed_experts"):
        v = cfg.get(k)
        if isinstance(v, int) and v > 0:
            return v
    return 0


def kv_blocks_per_gpu(config: Mapping[str, Any], tp: int, memory_gib: float = 80.0,
                      gpu_memory_utilization: float = 0.9, block_size: int = 16,
                      bytes_per_param: float = 2.0) -> int:
    """KV cache blocks of ONE GPU, the number ``--total-kv-blocks`` means in BLIS.

    BLIS's auto-calculation (``CalculateKVBlocks``) computes
    ``(TP * mem * util - weights - activation - TP * non_torch) / per_gpu_block_bytes``: all
    GPUs' memory over one GPU's block size, TP x the blocks vLLM reports. This is that value
    divided by TP (same weights estimate, activation 5.5 GiB dense / 8 GiB MoE, non-torch
    0.15 GiB at TP 1 else 0.6 GiB per GPU). Dense, GQA and Mixtral-style MoE configs.

    Parameters
    ----------
    config
        The model's Hugging Face ``config.json`` (parsed).
    tp
        Tensor-parallel degree.
    memory_gib
        Memory of one GPU, GiB (BLIS: 80 for H100).

    Raises
    ------
    ConfigError
        When the config lacks a field or the model does not fit.
    """
    from bayes_latency.errors import ConfigError

    try:
        h = int(config["hidden_size"])
        n_layers = int(config["num_hidden_layers"])
        n_heads = int(config["num_attention_heads"])
        n_kv = int(config.get("num_key_value_heads") or n_heads)
        inter = int(config["intermediate_size"])
        vocab = int(config["vocab_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"model config lacks a field for KV blocks: {exc}") from exc
    head_dim = int(config.get("head_dim") or h // n_heads)
    kv_dim = n_kv * head_dim
    experts = _moe_experts(config)
    attn = h * (h + 2 * kv_dim) + h * h
    if experts >= 2:
        mlp = n_layers * (3 * h * inter * experts + experts * h)
    else:
        mlp = n_layers * 3 * h * inter
    lm_head = 0 if config.get("tie_word_embeddings") else vocab * h
    params = vocab * h + n_layers * (attn + 2 * h) + mlp + lm_head + h
    weights_gib = params * bytes_per_param / _GIB
    activation = 8.0 if experts >= 2 else 5.5
    non_torch = (0.15 if tp == 1 else 0.6) * tp
    total = memory_gib * gpu_memory_utilization * tp
    free = total - weights_gib - activation - non_torch
    per_token_gpu = n_layers * 2.0 * head_dim * n_kv * bytes_per_param / tp
    block_bytes = int(per_token_gpu * block_size)
    if free <= 0 or block_bytes <= 0:
        raise ConfigError(f"model does not fit on {tp} x {memory_gib} GiB")
    blis_auto = int(free * _GIB) // block_bytes
    return blis_auto // tp


__all__ += ["kv_blocks_per_gpu"]
