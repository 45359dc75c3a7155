"""Transformer architectures described from a Hugging Face ``config.json``.

:class:`Architecture` holds the few numbers the roofline basis needs (layers, widths, heads,
experts, byte widths) and derives parameter and KV-cache sizes from them.
:func:`~bayes_latency.physics.models.load_architecture` accepts a known short name (shipped as trimmed JSON configs in
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

The parsing of ``config.json`` is :func:`bayes_latency.physics.hf_config.architecture_from_config`;
:func:`bayes_latency.physics.models.load_architecture` resolves a name, alias or path to an
:class:`Architecture`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bayes_latency.errors import UnknownArchitectureError
from bayes_latency.physics.blis import (
    BlisModelShape,
    blis_shape_from_fields,
)


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


__all__ = ["Architecture", "expected_distinct_experts"]

