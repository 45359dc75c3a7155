"""Parsing a Hugging Face ``config.json`` into an :class:`~bayes_latency.physics.architecture.Architecture`.

:func:`architecture_from_config` reads the config dialects listed in
:mod:`bayes_latency.physics.architecture` (Llama-style, Mixtral, Qwen-MoE, DeepSeek / GLM-MoE,
Llama-4, BLOOM / GPT-2 style names), the byte widths from ``quantization_config`` and the MoE
layer pattern; malformed or missing fields raise
:class:`~bayes_latency.errors.UnknownArchitectureError` naming the file and the field.
:mod:`bayes_latency.physics.architecture` re-exports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from bayes_latency.errors import UnknownArchitectureError
from bayes_latency.physics.blis import blis_shape_from_config

if TYPE_CHECKING:  # pragma: no cover
    from bayes_latency.physics.architecture import Architecture

_NON_GATED_TYPES = frozenset({"bloom", "gpt2", "gpt_neox", "opt", "falcon", "gpt_bigcode",
                              "gptj", "gpt_neo", "phi", "starcoder2", "mpt"})
_GATED_ACTS = ("silu", "swiglu", "swish", "geglu", "gelu_pytorch_tanh_gated")


def _first(cfg: Mapping[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    return default


#: Largest plausible values of the size fields of a config.json (released models stay one to
#: two orders of magnitude below): a larger value is a corrupt or mistyped file, and would make
#: the per-layer tables and the FLOP counts of the physics layer absurd.
MAX_FIELD = {
    "num_hidden_layers": 4_096,
    "hidden_size": 1_048_576,
    "num_attention_heads": 16_384,
    "num_key_value_heads": 16_384,
    "vocab_size": 16_777_216,
    "head_dim": 65_536,
    "qk_rope_head_dim": 65_536,
    "qk_nope_head_dim": 65_536,
    "v_head_dim": 65_536,
    "kv_lora_rank": 1_048_576,
    "q_lora_rank": 1_048_576,
    "intermediate_size": 16_777_216,
    "moe_intermediate_size": 16_777_216,
    "shared_expert_intermediate_size": 16_777_216,
    "num_local_experts": 65_536,
    "num_experts_per_tok": 65_536,
    "n_shared_experts": 65_536,
    "interleave_moe_layer_step": 4_096,
    "first_k_dense_replace": 4_096,
    "moe_layer_freq": 4_096,
    "decoder_sparse_step": 4_096,
}


def _int_field(cfg: Mapping[str, Any], src: str, *keys: str, default: Any = None,
               cap: str | None = None) -> int:
    """The first of ``keys`` present in ``cfg`` as a non-negative integer at most
    ``MAX_FIELD[cap or keys[0]]`` (integral floats accepted)."""
    v = _first(cfg, *keys, default=default)
    if v is None:
        raise UnknownArchitectureError(
            f"{src}: missing field {keys[0]!r} (also tried {list(keys[1:])})")
    if isinstance(v, bool):
        raise UnknownArchitectureError(f"{src}: field {keys[0]!r} is not an integer: {v!r}")
    try:
        iv = int(v)
        if isinstance(v, float) and iv != v:
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        raise UnknownArchitectureError(f"{src}: field {keys[0]!r} is not an integer: {v!r}") from None
    if iv < 0:
        raise UnknownArchitectureError(f"{src}: field {keys[0]!r} is negative: {iv}")
    most = MAX_FIELD.get(cap or keys[0])
    if most is not None and iv > most:
        raise UnknownArchitectureError(f"{src}: field {keys[0]!r} = {iv} is larger than any "
                                       f"plausible model (at most {most:,})")
    return iv


def _quant_bytes(full: Mapping[str, Any], text: Mapping[str, Any]) -> tuple[float, float, float | None]:
    """(weight_bytes, compute_bytes, kv_bytes or None) from ``quantization_config``."""
    q = _first(text, "quantization_config") or _first(full, "quantization_config") or {}
    if not isinstance(q, Mapping) or not q:
        return 2.0, 2.0, None
    method = str(q.get("quant_method", "")).lower()
    kv: float | None = None
    kvs = q.get("kv_cache_scheme")
    if isinstance(kvs, Mapping) and kvs.get("num_bits"):
        kv = float(kvs["num_bits"]) / 8.0
    if method in ("fp8", "fbgemm_fp8", "modelopt"):
        return 1.0, 1.0, kv
    if method == "compressed-tensors":
        groups = q.get("config_groups") or {}
        wbits, abits = 16, 16
        for g in groups.values() if isinstance(groups, Mapping) else []:
            w = (g or {}).get("weights") or {}
            a = (g or {}).get("input_activations") or {}
            if w.get("num_bits"):
                wbits = min(wbits, int(w["num_bits"]))
            if a.get("num_bits"):
                abits = min(abits, int(a["num_bits"]))
        wb = wbits / 8.0
        cb = 1.0 if (wbits == 8 and abits == 8) else 2.0
        return wb, cb, kv
    bits = q.get("bits") or q.get("w_bit") or q.get("num_bits")
    if bits:
        return float(bits) / 8.0, 2.0, kv
    if q.get("load_in_4bit"):
        return 0.5, 2.0, kv
    if q.get("load_in_8bit"):
        return 1.0, 2.0, kv
    return 2.0, 2.0, kv


def _moe_layers(text: Mapping[str, Any], n_layers: int, n_experts: int, src: str) -> tuple[bool, ...]:
    if n_experts <= 0:
        return tuple([False] * n_layers)
    explicit = text.get("moe_layers")
    if isinstance(explicit, (list, tuple)) and explicit and all(isinstance(i, int) for i in explicit):
        s = set(explicit)
        return tuple(i in s for i in range(n_layers))
    if "interleave_moe_layer_step" in text:  # Llama-4
        step = _int_field(text, src, "interleave_moe_layer_step", default=1) or 1
        if step <= 0:
            raise UnknownArchitectureError(f"{src}: field 'interleave_moe_layer_step' must be >= 1")
        return tuple((i + 1) % step == 0 for i in range(n_layers))
    if "first_k_dense_replace" in text or "moe_layer_freq" in text:  # DeepSeek / GLM
        k = _int_field(text, src, "first_k_dense_replace", default=0)
        freq = _int_field(text, src, "moe_layer_freq", default=1)
        return tuple(i >= k and i % max(1, freq) == 0 for i in range(n_layers))
    if "decoder_sparse_step" in text or "mlp_only_layers" in text:  # Qwen2/3-MoE
        step = _int_field(text, src, "decoder_sparse_step", default=1)
        dense = set(text.get("mlp_only_layers") or [])
        return tuple(i not in dense and (i + 1) % max(1, step) == 0 for i in range(n_layers))
    return tuple([True] * n_layers)


def architecture_from_config(config: Mapping[str, Any], name: str = "custom",
                             source: str | None = None) -> Architecture:
    """Build an :class:`Architecture` from a parsed Hugging Face ``config.json``.

    Parameters
    ----------
    config : Mapping
        The parsed JSON. Multimodal configs with a ``text_config`` (Llama-4) use that sub-dict.
    name : str
        Name given to the architecture.
    source : str, optional
        File name used in error messages.

    Returns
    -------
    Architecture

    Raises
    ------
    UnknownArchitectureError
        When a required field is missing or malformed (message names the file and field).
    """
    from bayes_latency.physics.architecture import Architecture  # it imports this module

    src = source or f"config of {name!r}"
    if not isinstance(config, Mapping):
        raise UnknownArchitectureError(f"{src}: expected a JSON object, got {type(config).__name__}")
    text: Mapping[str, Any] = config.get("text_config") or config
    if not isinstance(text, Mapping):
        raise UnknownArchitectureError(f"{src}: field 'text_config' is not an object")
    model_type = str(text.get("model_type") or config.get("model_type") or "").lower()

    n_layers = _int_field(text, src, "num_hidden_layers", "n_layer", "num_layers", "n_layers")
    hidden = _int_field(text, src, "hidden_size", "n_embd", "d_model")
    n_heads = _int_field(text, src, "num_attention_heads", "n_head", "num_heads", "n_heads")
    if n_layers == 0 or hidden == 0 or n_heads == 0:
        raise UnknownArchitectureError(f"{src}: layers, hidden size and heads must be positive")
    if text.get("multi_query") is True:
        default_kv = 1
    else:
        default_kv = n_heads
    n_kv = _int_field(text, src, "num_key_value_heads", "num_kv_heads", "n_head_kv",
                      default=default_kv) or n_heads
    vocab = _int_field(text, src, "vocab_size", "padded_vocab_size")

    kv_lora = _int_field(text, src, "kv_lora_rank", default=0)
    if kv_lora > 0:
        attention = "mla"
        rope = _int_field(text, src, "qk_rope_head_dim")
        nope = _int_field(text, src, "qk_nope_head_dim")
        v_head = _int_field(text, src, "v_head_dim", default=nope)
        q_lora = _int_field(text, src, "q_lora_rank", default=0)
        head_dim = nope + rope
    else:
        rope = nope = v_head = q_lora = 0
        head_dim = _int_field(text, src, "head_dim", default=0)
        if not head_dim:
            if hidden % n_heads:
                raise UnknownArchitectureError(
                    f"{src}: field 'hidden_size' = {hidden} is not divisible by "
                    f"'num_attention_heads' = {n_heads} (and no 'head_dim' is given)")
            head_dim = hidden // n_heads
        if n_kv > n_heads or n_heads % n_kv:
            raise UnknownArchitectureError(
                f"{src}: field 'num_key_value_heads' = {n_kv} does not divide "
                f"'num_attention_heads' = {n_heads}")
        if n_kv == n_heads:
            attention = "mha"
        elif n_kv == 1:
            attention = "mqa"
        else:
            attention = "gqa"

    # FFN widths and experts
    n_experts = _int_field(text, src, "num_local_experts", "n_routed_experts", "num_experts",
                           default=0)
    top_k = _int_field(text, src, "num_experts_per_tok", "moe_topk", "top_k", default=0)
    if n_experts and not top_k:
        raise UnknownArchitectureError(f"{src}: MoE config without field 'num_experts_per_tok'")
    if top_k > n_experts:
        top_k = n_experts if n_experts else 0
    ffn_keys = ("intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size")
    if model_type.startswith("llama4") and _first(text, "intermediate_size_mlp") is not None:
        ffn_keys = ("intermediate_size_mlp",)
    dense_ffn = _int_field(text, src, *ffn_keys, default=4 * hidden, cap="intermediate_size")
    moe_ffn = _int_field(text, src, "moe_intermediate_size", default=0)
    if n_experts and not moe_ffn:
        moe_ffn = _int_field(text, src, "intermediate_size", default=dense_ffn)
    n_shared = 0
    shared_ffn = 0
    if n_experts:
        if text.get("shared_expert_intermediate_size"):  # Qwen2-MoE
            n_shared = 1
            shared_ffn = _int_field(text, src, "shared_expert_intermediate_size")
        elif text.get("n_shared_experts"):  # DeepSeek / GLM
            n_shared, shared_ffn = _int_field(text, src, "n_shared_experts"), moe_ffn
        elif model_type.startswith("llama4"):  # Llama-4: one shared expert per MoE layer
            n_shared, shared_ffn = 1, moe_ffn
    moe_layers = _moe_layers(text, n_layers, n_experts, src)

    act = str(_first(text, "hidden_act", "activation_function", default="silu")).lower()
    gated = model_type not in _NON_GATED_TYPES and any(a in act for a in _GATED_ACTS)
    if model_type in ("gemma", "gemma2", "gemma3", "gemma3_text"):
        gated = True

    wb, cb, kvb = _quant_bytes(config, text)
    act_bytes = 2.0
    tie = bool(_first(text, "tie_word_embeddings", default=config.get("tie_word_embeddings", False)))
    if model_type == "bloom":
        tie = bool(config.get("tie_word_embeddings", True))

    blis = blis_shape_from_config(config, default_act_bytes=act_bytes)
    if not (blis.n_layers and blis.hidden and blis.n_heads):
        blis = None   # naming BLIS does not read (BLOOM/GPT style): derived from the fields
    return Architecture(
        blis=blis,
        name=name, n_layers=n_layers, hidden=hidden, n_heads=n_heads, n_kv_heads=n_kv,
        head_dim=int(head_dim), ffn=int(dense_ffn), vocab=vocab, n_experts=n_experts,
        experts_per_token=top_k, n_shared_experts=n_shared, moe_ffn=moe_ffn if n_experts else 0,
        shared_expert_ffn=shared_ffn, moe_layers=moe_layers, weight_bytes=wb,
        kv_bytes=kvb if kvb is not None else act_bytes, act_bytes=act_bytes, compute_bytes=cb,
        attention=attention, kv_lora_rank=kv_lora, q_lora_rank=q_lora, qk_rope_head_dim=rope,
        qk_nope_head_dim=nope, v_head_dim=v_head, gated_ffn=gated, tie_word_embeddings=tie,
    )
