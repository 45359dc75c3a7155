"""Transformer architectures described from a Hugging Face ``config.json``.

:class:`Architecture` holds the few numbers the roofline basis needs (layers, widths, heads,
experts, byte widths) and derives parameter and KV-cache sizes from them.
:func:`load_architecture` accepts a known short name (shipped as trimmed JSON configs in
``physics/data/models/``), one of its aliases (e.g. ``meta-llama/Llama-2-70b-hf``), a path to a
``config.json``, or an already parsed dict.

Supported config dialects
-------------------------
- Llama / Mistral / Qwen2 / Qwen3 / Yi / CodeLlama (gated SiLU FFN, GQA via ``num_key_value_heads``,
  explicit ``head_dim`` when present).
- Mixtral (``num_local_experts``, ``num_experts_per_tok``), Qwen2/3-MoE (``num_experts``,
  ``moe_intermediate_size``, ``decoder_sparse_step``, ``mlp_only_layers``, shared experts via
  ``shared_expert_intermediate_size``), DeepSeek-V2/V3 and GLM-MoE (``n_routed_experts``,
  ``n_shared_experts``, ``first_k_dense_replace``, ``moe_layer_freq``, MLA ``kv_lora_rank`` ...),
  Llama-4 (parameters nested under ``text_config``, ``interleave_moe_layer_step``, one shared
  expert, dense layers of width ``intermediate_size_mlp``).
- BLOOM / GPT-2 / OPT / GPT-NeoX / Falcon style names (``n_layer``, ``n_head``, ``n_embd`` ...)
  with a non-gated 2-matrix FFN of width ``4 * hidden`` when no size is given.

Byte widths: weights take 2 bytes (bf16/fp16; fp32 checkpoints are served in 16 bits by vLLM)
unless ``quantization_config`` says otherwise (``fp8`` -> 1 byte, ``compressed-tensors`` ->
``num_bits / 8`` of the weight group, GPTQ/AWQ ``bits / 8``). Activations are 2 bytes. The KV cache
uses the activation dtype (2 bytes) unless the checkpoint declares an 8-bit ``kv_cache_scheme``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from bayes_latency.errors import UnknownArchitectureError
from bayes_latency.physics.blis import (
    BlisModelShape,
    blis_shape_from_config,
    blis_shape_from_fields,
)

MODELS_DIR = Path(__file__).resolve().parent / "data" / "models"
"""Directory of the shipped (trimmed) model configs, one ``<short-name>.json`` each."""

# Short name -> extra aliases (the short name itself, the file stem, and any "org/name" whose
# last component matches are always accepted; comparison is case-insensitive).
_ALIASES: dict[str, tuple[str, ...]] = {
    "llama-2-7b": ("meta-llama/Llama-2-7b-hf", "Llama-2-7b-hf", "meta-llama/Llama-2-7b-chat-hf",
                   "llama2-7b", "llama-2-7b-chat"),
    "llama-2-70b": ("meta-llama/Llama-2-70b-hf", "Llama-2-70b-hf", "meta-llama/Llama-2-70b-chat-hf",
                    "llama2-70b", "llama-2-70b-chat"),
    "codellama-34b": ("codellama/CodeLlama-34b-Instruct-hf", "CodeLlama-34b-Instruct-hf",
                      "codellama/CodeLlama-34b-hf", "codellama-34b-instruct", "codellama-34b-instruct-hf"),
    "mixtral-8x7b": ("mistralai/Mixtral-8x7B-v0.1", "Mixtral-8x7B-v0.1",
                     "mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b-instruct"),
    "llama-3.1-8b": ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B",
                     "meta-llama/Meta-Llama-3.1-8B-Instruct", "llama-3.1-8b-instruct", "llama3.1-8b"),
    "llama-3.1-70b": ("meta-llama/Llama-3.1-70B-Instruct", "meta-llama/Llama-3.1-70B",
                      "meta-llama/Meta-Llama-3.1-70B-Instruct", "llama-3.1-70b-instruct",
                      "llama3.1-70b"),
    "qwen2.5-7b": ("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B", "qwen2.5-7b-instruct"),
    "bloom-176b": ("bigscience/bloom", "bloom", "bloom176b"),
    "yi-34b": ("01-ai/Yi-34B", "01-ai/Yi-34B-Chat", "yi-34b-chat"),
    "qwen3-14b": ("Qwen/Qwen3-14B",),
    "qwen3-30b-a3b": ("Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B-Instruct-2507"),
    "mistral-nemo-12b": ("mistralai/Mistral-Nemo-Instruct-2407", "mistralai/Mistral-Nemo-Base-2407",
                         "mistral-nemo-instruct-2407", "mistral-nemo"),
    "deepseek-v2-lite": ("deepseek-ai/DeepSeek-V2-Lite", "deepseek-ai/DeepSeek-V2-Lite-Chat"),
    "llama-4-scout-17b-16e-fp8": ("RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic",
                                  "Llama-4-Scout-17B-16E-Instruct-FP8-dynamic",
                                  "llama-4-scout-17b-16e-instruct-fp8-dynamic", "llama-4-scout-fp8"),
}

_NON_GATED_TYPES = frozenset({"bloom", "gpt2", "gpt_neox", "opt", "falcon", "gpt_bigcode",
                              "gptj", "gpt_neo", "phi", "starcoder2", "mpt"})
_GATED_ACTS = ("silu", "swiglu", "swish", "geglu", "gelu_pytorch_tanh_gated")


@dataclass(frozen=True)
class Architecture:
    """Shape of a decoder-only transformer, as seen by the roofline basis.

    Attributes
    ----------
    name : str
        Short name (or the config path's stem).
    n_layers, hidden, n_heads, n_kv_heads, head_dim : int
        Decoder layers, model width, query heads, KV heads (GQA/MQA) and head dimension.
        For MLA models ``head_dim`` is the query/key head dim (``qk_nope + qk_rope``).
    ffn : int
        Intermediate width of a *dense* FFN layer.
    vocab : int
        Vocabulary size (LM head rows).
    n_experts, experts_per_token : int
        Routed experts per MoE layer and top-k (0, 0 for dense models).
    n_shared_experts : int
        Always-active shared experts on each MoE layer.
    moe_ffn : int
        Intermediate width of one routed expert.
    shared_expert_ffn : int
        Intermediate width of one shared expert.
    moe_layers : tuple[bool, ...]
        Per layer, whether its FFN is a mixture of experts.
    weight_bytes, kv_bytes, act_bytes : float
        Bytes per weight parameter, per KV-cache element and per activation element.
    compute_bytes : float
        Byte width of the matmul inputs (1 for W8A8 FP8 checkpoints, else 2): selects the GPU peak.
    attention : str
        ``"mha"``, ``"gqa"``, ``"mqa"`` or ``"mla"`` (multi-head latent attention).
    kv_lora_rank, q_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim : int
        MLA fields (0 when not MLA; ``q_lora_rank`` 0 = full-rank query projection).
    gated_ffn : bool
        Gated FFN (3 matrices: gate, up, down) vs plain (2 matrices).
    tie_word_embeddings : bool
        LM head shares the embedding matrix.
    blis : BlisModelShape or None
        The same model as BLIS's ``trained-physics`` basis reads it from the same ``config.json``
        (see :mod:`bayes_latency.physics.blis`); None when built without a config, in which case
        :attr:`blis_shape` derives it from the fields above.
    """

    name: str
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    n_experts: int = 0
    experts_per_token: int = 0
    n_shared_experts: int = 0
    moe_ffn: int = 0
    shared_expert_ffn: int = 0
    moe_layers: tuple[bool, ...] = field(default=())
    weight_bytes: float = 2.0
    kv_bytes: float = 2.0
    act_bytes: float = 2.0
    compute_bytes: float = 2.0
    attention: str = "mha"
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    gated_ffn: bool = True
    tie_word_embeddings: bool = False
    blis: BlisModelShape | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.moe_layers:
            object.__setattr__(self, "moe_layers",
                               tuple([self.n_experts > 0] * self.n_layers))
        if len(self.moe_layers) != self.n_layers:
            raise UnknownArchitectureError(
                f"architecture {self.name!r}: moe_layers has {len(self.moe_layers)} entries, "
                f"expected n_layers={self.n_layers}")

    @property
    def blis_shape(self) -> BlisModelShape:
        """The model as BLIS's ``trained-physics`` basis sees it (the exported terms use this)."""
        if self.blis is not None:
            return self.blis
        return blis_shape_from_fields(
            n_layers=self.n_layers, hidden=self.hidden, n_heads=self.n_heads,
            n_kv_heads=self.n_kv_heads, ffn=self.ffn, n_experts=self.n_experts,
            experts_per_token=self.experts_per_token, moe_ffn=self.moe_ffn,
            shared_ffn=self.n_shared_experts * self.shared_expert_ffn,
            n_moe_layers=self.n_moe_layers, weight_bytes=self.weight_bytes,
            act_bytes=self.act_bytes)

    # ------------------------------------------------------------------ sizes
    @property
    def is_moe(self) -> bool:
        """True when at least one layer is a mixture of experts."""
        return self.n_moe_layers > 0

    @property
    def n_moe_layers(self) -> int:
        """Number of layers whose FFN is a mixture of experts."""
        return int(sum(self.moe_layers))

    @property
    def n_dense_layers(self) -> int:
        """Number of layers with a dense FFN."""
        return self.n_layers - self.n_moe_layers

    @property
    def ffn_matrices(self) -> int:
        """Weight matrices per FFN (3 for gated SiLU/GeLU, 2 otherwise)."""
        return 3 if self.gated_ffn else 2

    @property
    def q_dim(self) -> int:
        """Width of the query/key head (``head_dim``; ``qk_nope + qk_rope`` for MLA)."""
        return self.head_dim

    @property
    def v_dim(self) -> int:
        """Width of the value head (``v_head_dim`` for MLA, else ``head_dim``)."""
        return self.v_head_dim if self.attention == "mla" and self.v_head_dim else self.head_dim

    @property
    def attn_params_per_layer(self) -> int:
        """Attention projection parameters of one layer (Q, K, V, O; MLA low-rank projections)."""
        h, nh = self.hidden, self.n_heads
        if self.attention == "mla":
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            if self.q_lora_rank:
                q = h * self.q_lora_rank + self.q_lora_rank * nh * qk
            else:
                q = h * nh * qk
            kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim)
            kv_b = self.kv_lora_rank * nh * (self.qk_nope_head_dim + self.v_head_dim)
            o = nh * self.v_head_dim * h
            return q + kv_a + kv_b + o
        return h * nh * self.head_dim * 2 + h * self.n_kv_heads * self.head_dim * 2

    @property
    def dense_ffn_params(self) -> int:
        """Parameters of one dense FFN layer."""
        return self.ffn_matrices * self.hidden * self.ffn

    @property
    def expert_params_per_layer(self) -> int:
        """Parameters of ONE routed expert in one MoE layer (0 for dense models).

        The routed experts of a MoE layer hold ``n_experts * expert_params_per_layer`` parameters.
        """
        return self.ffn_matrices * self.hidden * self.moe_ffn if self.n_experts else 0

    @property
    def shared_params_per_moe_layer(self) -> int:
        """Shared-expert plus router parameters of one MoE layer."""
        if not self.n_experts:
            return 0
        shared = self.n_shared_experts * self.ffn_matrices * self.hidden * self.shared_expert_ffn
        return shared + self.hidden * self.n_experts

    @property
    def embedding_params(self) -> int:
        """Token embedding parameters (``vocab * hidden``)."""
        return self.vocab * self.hidden

    @property
    def lm_head_params(self) -> int:
        """LM head parameters (``vocab * hidden``; shared with the embedding when tied)."""
        return self.vocab * self.hidden

    @property
    def params_total(self) -> int:
        """All parameters: embeddings, LM head (unless tied), attention, FFNs, experts, norms."""
        layers = (self.n_layers * (self.attn_params_per_layer + 2 * self.hidden)
                  + self.n_dense_layers * self.dense_ffn_params
                  + self.n_moe_layers * (self.n_experts * self.expert_params_per_layer
                                         + self.shared_params_per_moe_layer))
        head = 0 if self.tie_word_embeddings else self.lm_head_params
        return self.embedding_params + head + layers + self.hidden

    @property
    def params_routed_experts(self) -> int:
        """Parameters of all routed experts of all MoE layers."""
        return self.n_moe_layers * self.n_experts * self.expert_params_per_layer

    @property
    def params_nonexpert_read(self) -> int:
        """Parameters read in full by every forward pass, routed experts excluded.

        Everything but the routed experts and the embedding table (a lookup touches only a few
        rows; when tied to the LM head the matrix is read by the head and counted once).
        """
        return self.params_total - self.params_routed_experts - (
            0 if self.tie_word_embeddings else self.embedding_params)

    @property
    def params_dense_matmul_per_token(self) -> int:
        """Matmul parameters one token touches: attention projections + dense FFN layers
        + top-k routed experts, shared experts and router on MoE layers + LM head.

        ``2 * params_dense_matmul_per_token`` is the matmul FLOPs per token (attention scores excluded).
        """
        return (self.n_layers * self.attn_params_per_layer
                + self.n_dense_layers * self.dense_ffn_params
                + self.n_moe_layers * (self.experts_per_token * self.expert_params_per_layer
                                       + self.shared_params_per_moe_layer)
                + self.lm_head_params)

    @property
    def attn_flops_per_pair_per_layer(self) -> int:
        """Attention FLOPs per query-key pair per layer: ``2 * H * (d_qk + d_v)`` (= 4·H·d)."""
        return 2 * self.n_heads * (self.q_dim + self.v_dim)

    def kv_heads_per_gpu(self, tp: int = 1) -> float:
        """KV heads held by one GPU at tensor parallelism ``tp``: ``max(1, n_kv_heads / tp)``.

        KV heads are replicated when ``n_kv_heads < tp``.
        """
        return max(1.0, self.n_kv_heads / max(1, tp))

    def kv_bytes_per_token_per_layer(self, tp: int = 1) -> float:
        """KV-cache bytes of one token in one layer on one GPU.

        ``2 * kvh_gpu * head_dim * kv_bytes`` (K and V); for MLA the compressed latent plus the
        rope key, ``(kv_lora_rank + qk_rope_head_dim) * kv_bytes``, replicated on every TP rank.
        """
        if self.attention == "mla":
            return float((self.kv_lora_rank + self.qk_rope_head_dim) * self.kv_bytes)
        return 2.0 * self.kv_heads_per_gpu(tp) * self.head_dim * self.kv_bytes

    def kv_bytes_per_token_gpu(self, tp: int = 1) -> float:
        """KV-cache bytes of one token (all layers) held by one GPU at tensor parallelism ``tp``."""
        return self.n_layers * self.kv_bytes_per_token_per_layer(tp)

    @property
    def kv_bytes_per_token(self) -> float:
        """KV-cache bytes of one token over all layers (whole model, TP = 1)."""
        return self.kv_bytes_per_token_gpu(1)

    @property
    def weight_bytes_total(self) -> float:
        """Bytes of all weights."""
        return self.params_total * self.weight_bytes

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the fields (``moe_layers`` as a list)."""
        from dataclasses import asdict
        d = asdict(self)
        d["moe_layers"] = list(self.moe_layers)
        return d


# ---------------------------------------------------------------------- parsing
def _first(cfg: Mapping[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    return default


def _int_field(cfg: Mapping[str, Any], src: str, *keys: str, default: Any = None) -> int:
    v = _first(cfg, *keys, default=default)
    if v is None:
        raise UnknownArchitectureError(
            f"{src}: missing field {keys[0]!r} (also tried {list(keys[1:])})")
    try:
        iv = int(v)
    except (TypeError, ValueError):
        raise UnknownArchitectureError(f"{src}: field {keys[0]!r} is not an integer: {v!r}") from None
    if iv < 0:
        raise UnknownArchitectureError(f"{src}: field {keys[0]!r} is negative: {iv}")
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
        step = int(text["interleave_moe_layer_step"] or 1)
        if step <= 0:
            raise UnknownArchitectureError(f"{src}: field 'interleave_moe_layer_step' must be >= 1")
        return tuple((i + 1) % step == 0 for i in range(n_layers))
    if "first_k_dense_replace" in text or "moe_layer_freq" in text:  # DeepSeek / GLM
        k = int(text.get("first_k_dense_replace") or 0)
        freq = int(text.get("moe_layer_freq") or 1)
        return tuple(i >= k and i % max(1, freq) == 0 for i in range(n_layers))
    if "decoder_sparse_step" in text or "mlp_only_layers" in text:  # Qwen2/3-MoE
        step = int(text.get("decoder_sparse_step") or 1)
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

    kv_lora = int(text.get("kv_lora_rank") or 0)
    if kv_lora > 0:
        attention = "mla"
        rope = _int_field(text, src, "qk_rope_head_dim")
        nope = _int_field(text, src, "qk_nope_head_dim")
        v_head = _int_field(text, src, "v_head_dim", default=nope)
        q_lora = int(text.get("q_lora_rank") or 0)
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
    dense_ffn = _first(text, "intermediate_size_mlp") if model_type.startswith("llama4") else None
    if dense_ffn is None:
        dense_ffn = _first(text, "intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size")
    if dense_ffn is None:
        dense_ffn = 4 * hidden
    moe_ffn = int(_first(text, "moe_intermediate_size", default=0) or 0)
    if n_experts and not moe_ffn:
        moe_ffn = int(_first(text, "intermediate_size", default=dense_ffn))
    n_shared = 0
    shared_ffn = 0
    if n_experts:
        if text.get("shared_expert_intermediate_size"):  # Qwen2-MoE
            n_shared, shared_ffn = 1, int(text["shared_expert_intermediate_size"])
        elif text.get("n_shared_experts"):  # DeepSeek / GLM
            n_shared, shared_ffn = int(text["n_shared_experts"]), moe_ffn
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


# ---------------------------------------------------------------------- registry
def _norm(s: str) -> str:
    return s.strip().lower()


@lru_cache(maxsize=1)
def _alias_table() -> dict[str, str]:
    table: dict[str, str] = {}
    for p in sorted(MODELS_DIR.glob("*.json")):
        table[_norm(p.stem)] = p.stem
    for short, aliases in _ALIASES.items():
        table[_norm(short)] = short
        for a in aliases:
            table[_norm(a)] = short
            table[_norm(a.split("/")[-1])] = short
    return table


def known_architectures() -> list[str]:
    """Short names of the shipped model configs."""
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


def resolve_name(name: str) -> str | None:
    """Short name of a shipped model for ``name`` (alias, ``org/name``, any case), or None."""
    table = _alias_table()
    key = _norm(name)
    if key in table:
        return table[key]
    last = key.split("/")[-1]
    return table.get(last)


@lru_cache(maxsize=64)
def _load_shipped(short: str) -> Architecture:
    path = MODELS_DIR / f"{short}.json"
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    return architecture_from_config(cfg, name=short, source=str(path))


def load_architecture(name_or_path: str | Path | Mapping[str, Any] | Architecture) -> Architecture:
    """Resolve a model to its :class:`Architecture`.

    Parameters
    ----------
    name_or_path : str, Path, Mapping or Architecture
        A known short name or alias (case-insensitive; e.g. ``llama-2-70b``,
        ``meta-llama/Llama-2-70b-hf``), a path to a Hugging Face ``config.json`` (or a directory
        holding one), a parsed config dict, or an ``Architecture`` (returned unchanged).

    Returns
    -------
    Architecture

    Raises
    ------
    UnknownArchitectureError
        Unknown name (the message lists the known ones) or malformed config (names file and field).
    """
    if isinstance(name_or_path, Architecture):
        return name_or_path
    if isinstance(name_or_path, Mapping):
        cfg = name_or_path
        nm = str(cfg.get("_name_or_path") or cfg.get("name") or "custom")
        return architecture_from_config(cfg, name=nm)
    s = str(name_or_path)
    short = resolve_name(s)
    if short is not None and (MODELS_DIR / f"{short}.json").is_file():
        return _load_shipped(short)
    p = Path(s).expanduser()
    if p.is_dir() and (p / "config.json").is_file():
        p = p / "config.json"
    if p.is_file():
        try:
            with open(p, encoding="utf-8") as f:
                cfg = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise UnknownArchitectureError(f"{p}: cannot read config.json: {e}") from None
        nm = p.parent.name if p.name == "config.json" else p.stem
        return architecture_from_config(cfg, name=nm, source=str(p))
    raise UnknownArchitectureError(
        f"unknown model {s!r}: not a known name and not a config.json path; "
        f"known: {', '.join(known_architectures())}")


def expected_distinct_experts(arch: Architecture, n_tokens: Any) -> Any:
    """Expected number of distinct routed experts touched in one MoE layer by ``n_tokens`` tokens.

    ``E * (1 - (1 - k/E) ** T)`` under uniform independent routing (0 for ``T = 0``,
    ``k`` for ``T = 1``, tends to ``E``). Vectorised over ``n_tokens``.
    """
    t = np.asarray(n_tokens, dtype=float)
    if not arch.n_experts:
        return np.zeros_like(t)
    e, k = float(arch.n_experts), float(arch.experts_per_token)
    return e * (1.0 - np.power(1.0 - k / e, t))


__all__ = ["Architecture", "MODELS_DIR", "architecture_from_config", "expected_distinct_experts",
           "known_architectures", "load_architecture", "resolve_name"]

