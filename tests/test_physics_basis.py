"""Roofline basis: hand-computed features, MoE/TP behaviour, BLIS mapping, validation."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from bayes_latency.errors import ConfigError
from bayes_latency.physics.architecture import load_architecture
from bayes_latency.physics.basis import (
    ALPHA_TERM_INFO,
    ALPHA_TERMS,
    BLIS_BETA_ORDER,
    DEFAULT_TERMS,
    TERMS,
    basis_frame,
    basis_matrix,
    fits,
    get_term,
    kv_capacity_tokens,
    prefill_chunk_stats,
    term_names,
)
from bayes_latency.physics.hardware import load_gpu
from bayes_latency.physics.serving import ServingConfig

H100 = load_gpu("H100")
PEAK, HBM, NVL = 989e12, 3.35e12, 450e9


def _row(**kw: float) -> dict[str, float]:
    base = dict(num_prefill_reqs=0, prefill_tokens=0, prefill_attn_pairs=0, prefill_kv_tokens=0,
                num_decode_reqs=0, decode_tokens=0, decode_ctx_tokens=0)
    base.update(kw)
    return base


PAIRS_512 = 512 * (0 + (512 + 1) / 2)      # one 512-token chunk at offset 0 = 131328
PREFILL = _row(num_prefill_reqs=1, prefill_tokens=512, prefill_attn_pairs=PAIRS_512,
               prefill_kv_tokens=512)
DECODE = _row(num_decode_reqs=32, decode_tokens=32, decode_ctx_tokens=32 * 1000)
MIXED = _row(num_prefill_reqs=1, prefill_tokens=512, prefill_attn_pairs=PAIRS_512,
             prefill_kv_tokens=512, num_decode_reqs=32, decode_tokens=32, decode_ctx_tokens=32000)
EMPTY = _row()
BATCHES = pd.DataFrame([PREFILL, DECODE, MIXED, EMPTY], index=["prefill", "decode", "mixed", "empty"])


def test_prefill_chunk_stats() -> None:
    assert prefill_chunk_stats([512], [0]) == (PAIRS_512, 512.0)
    # chunk of 100 after 300 cached tokens + chunk of 10 at offset 0
    pairs, kv = prefill_chunk_stats([100, 10], [300, 0])
    assert pairs == 100 * (300 + 101 / 2) + 10 * (0 + 11 / 2)
    assert kv == 400 + 10
    with pytest.raises(ConfigError):
        prefill_chunk_stats([1, 2], [0])


def test_term_registry() -> None:
    assert DEFAULT_TERMS == ("prefill_compute", "prefill_kv", "decode_compute", "decode_kv",
                             "weight_loading", "tp_allreduce", "per_layer", "per_request",
                             "per_step", "moe_layer", "moe_dispatch")
    assert list(TERMS)[:11] == list(DEFAULT_TERMS)
    assert BLIS_BETA_ORDER == ("prefill_compute", "prefill_kv", "weight_loading", "decode_kv",
                               "per_layer", "per_request", "per_step", "moe_layer",
                               "decode_compute", "tp_allreduce")
    assert get_term("moe_dispatch").blis_index is None
    for i, n in enumerate(BLIS_BETA_ORDER):
        assert get_term(n).blis_index == i
    for t in TERMS.values():
        assert t.group in ("compute", "memory", "communication", "overhead")
        assert t.doc and t.unit and t.feature_unit
    assert not get_term("cpu_offload").exportable and not get_term("kv_pressure").exportable
    assert all(TERMS[n].exportable for n in DEFAULT_TERMS)
    assert ALPHA_TERMS == ("alpha_arrival", "alpha_post_decode", "alpha_per_token")
    assert ALPHA_TERM_INFO["alpha_per_token"].unit == "us/token"
    with pytest.raises(ConfigError, match="unknown term"):
        get_term("nope")
    with pytest.raises(ConfigError, match="duplicate"):
        term_names(["per_step", "per_step"])


def test_llama2_7b_tp1_hand_computed() -> None:
    a = load_architecture("llama-2-7b")
    f = basis_frame(BATCHES, a, H100, ServingConfig(tp=1))
    assert list(f.columns) == list(DEFAULT_TERMS) and list(f.index) == list(BATCHES.index)
    # N_matmul = 32 layers * (4*4096^2 attention + 3*4096*11008 FFN) + 32000*4096 LM head
    n_mm = 32 * (4 * 4096**2 + 3 * 4096 * 11008) + 32000 * 4096
    assert n_mm == 6_607_077_376
    attn = 32 * 4 * 32 * 128                       # L * 4 * H * d FLOPs per pair
    kv_tok = 32 * 2 * 32 * 128 * 2                 # L * 2 * kvh * d * 2 bytes = 524288
    w_read = (a.params_total - 32000 * 4096) * 2   # all weights except the embedding table
    p = f.loc["prefill"]
    assert p.prefill_compute == pytest.approx((2 * 512 * n_mm + attn * PAIRS_512) / PEAK * 1e6)
    assert p.prefill_compute == pytest.approx(6910.5, abs=0.1)
    assert p.prefill_kv == pytest.approx(kv_tok * 512 / HBM * 1e6)          # 80.13 µs
    assert p.weight_loading == pytest.approx(w_read / HBM * 1e6)            # 3944.7 µs
    assert p.weight_loading == pytest.approx(3944.7, abs=0.1)
    assert (p.decode_compute, p.decode_kv, p.tp_allreduce, p.moe_layer, p.moe_dispatch) == (0, 0, 0, 0, 0)
    assert (p.per_layer, p.per_request, p.per_step) == (32, 1, 1)
    d = f.loc["decode"]
    assert d.decode_compute == pytest.approx((2 * 32 * n_mm + attn * 32000) / PEAK * 1e6)
    assert d.decode_kv == pytest.approx(kv_tok * 32000 / HBM * 1e6)         # 5008.1 µs
    assert d.decode_kv == pytest.approx(5008.1, abs=0.1)
    assert d.weight_loading == p.weight_loading
    assert (d.prefill_compute, d.prefill_kv, d.per_layer, d.per_request, d.per_step) == (0, 0, 32, 32, 1)
    m = f.loc["mixed"]
    # additive terms add up; weights are read once; one step
    for t in ("prefill_compute", "prefill_kv", "decode_compute", "decode_kv"):
        assert m[t] == pytest.approx(p[t] + d[t])
    assert m.weight_loading == p.weight_loading and m.per_request == 33 and m.per_step == 1
    e = f.loc["empty"]
    assert e.per_step == 1 and (e.drop("per_step") == 0).all()


def test_llama2_70b_tp4_hand_computed() -> None:
    a = load_architecture("llama-2-70b")
    f = basis_frame(BATCHES, a, H100, ServingConfig(tp=4))
    # attention per layer: Q,O 8192x8192, K,V 8192x1024 (8 KV heads of 128)
    n_mm = 80 * (2 * 8192**2 + 2 * 8192 * 1024 + 3 * 8192 * 28672) + 32000 * 8192
    assert n_mm == 68_713_185_280
    attn = 80 * 4 * 64 * 128
    kv_tok_gpu = 80 * 2 * (8 // 4) * 128 * 2      # kvh_gpu = 2 -> 81920 B/token/GPU
    p, d, m = f.loc["prefill"], f.loc["decode"], f.loc["mixed"]
    assert p.prefill_compute == pytest.approx((2 * 512 * n_mm + attn * PAIRS_512) / (4 * PEAK) * 1e6)
    assert p.prefill_kv == pytest.approx(kv_tok_gpu * 512 / HBM * 1e6)      # 12.52 µs
    assert p.weight_loading == pytest.approx((a.params_total - 32000 * 8192) * 2 / 4 / HBM * 1e6)
    # all-reduce: 2 per layer of T x hidden x 2 B, ring factor 2(TP-1)/TP = 1.5
    assert p.tp_allreduce == pytest.approx(2 * 80 * 512 * 8192 * 2 * 1.5 / NVL * 1e6)   # 4473.9 µs
    assert p.tp_allreduce == pytest.approx(4473.9, abs=0.1)
    assert d.tp_allreduce == pytest.approx(2 * 80 * 32 * 8192 * 2 * 1.5 / NVL * 1e6)
    assert m.tp_allreduce == pytest.approx(p.tp_allreduce + d.tp_allreduce)
    assert d.decode_compute == pytest.approx((2 * 32 * n_mm + attn * 32000) / (4 * PEAK) * 1e6)
    assert d.decode_kv == pytest.approx(kv_tok_gpu * 32000 / HBM * 1e6)
    assert (d.per_layer, d.per_request, d.per_step, d.moe_layer) == (80, 32, 1, 0)


def test_tp_scaling() -> None:
    a = load_architecture("llama-2-7b")
    x1 = basis_frame(BATCHES, a, H100, ServingConfig(tp=1))
    x2 = basis_frame(BATCHES, a, H100, ServingConfig(tp=2))
    for t in ("prefill_compute", "decode_compute", "weight_loading", "prefill_kv", "decode_kv"):
        np.testing.assert_allclose(x2[t], x1[t] / 2)       # 32 KV heads split over 2 GPUs
    assert (x1.tp_allreduce == 0).all()
    assert (x2.tp_allreduce.iloc[:3] > 0).all() and x2.tp_allreduce.iloc[3] == 0
    for t in ("per_layer", "per_request", "per_step"):
        np.testing.assert_array_equal(x2[t], x1[t])
    # KV heads replicate once TP exceeds them: qwen2.5-7b has 4 KV heads (28 query heads)
    q = load_architecture("qwen2.5-7b")
    k4 = basis_frame(BATCHES, q, H100, ServingConfig(tp=4)).decode_kv["decode"]
    k7 = basis_frame(BATCHES, q, H100, ServingConfig(tp=7)).decode_kv["decode"]
    assert k4 == k7 == pytest.approx(28 * 2 * 1 * 128 * 2 * 32000 / HBM * 1e6)


def test_moe_weight_loading_grows_with_tokens() -> None:
    mix, dense = load_architecture("mixtral-8x7b"), load_architecture("llama-2-7b")
    one = pd.DataFrame([_row(num_decode_reqs=1, decode_tokens=1, decode_ctx_tokens=100)])
    many = pd.DataFrame([PREFILL])
    wm1 = basis_frame(one, mix, H100).weight_loading.iloc[0]
    wm512 = basis_frame(many, mix, H100).weight_loading.iloc[0]
    assert wm1 < wm512
    # T = 1 touches top-2 experts: non-expert weights + 32 layers * 2 * 3*4096*14336 params, 2 B each
    expert = 3 * 4096 * 14336
    nonexpert = mix.params_total - 32 * 8 * expert - 32000 * 4096
    assert wm1 == pytest.approx((nonexpert + 32 * 2 * expert) * 2 / HBM * 1e6)
    # T = 512 touches all 8 experts: 8 * (1 - 0.75**512) ~= 8
    assert wm512 == pytest.approx((nonexpert + 32 * 8 * expert) * 2 / HBM * 1e6, rel=1e-9)
    assert basis_frame(one, dense, H100).weight_loading.iloc[0] == \
        basis_frame(many, dense, H100).weight_loading.iloc[0]
    # FFN compute counts top-2 experts, not all 8
    pc = basis_frame(many, mix, H100).prefill_compute.iloc[0]
    assert pc < 2 * 512 * mix.params_total / PEAK * 1e6 / 3
    f = basis_frame(BATCHES, mix, H100)
    assert (f.moe_layer.iloc[:3] == 32).all() and f.moe_layer.iloc[3] == 0
    assert (f.moe_dispatch == 0).all()
    ep = basis_frame(BATCHES, mix, H100, ServingConfig(tp=2, ep=2))
    # EP=2: 2 * 32 MoE layers * T * top-2 * 4096 * 2 B * (1/2) / NVLink
    assert ep.moe_dispatch["prefill"] == pytest.approx(2 * 32 * 512 * 2 * 4096 * 2 * 0.5 / NVL * 1e6)


def test_fp8_model_uses_fp8_peak() -> None:
    cfg = dict(model_type="llama", num_hidden_layers=2, hidden_size=256, num_attention_heads=4,
               intermediate_size=512, vocab_size=1000)
    a16 = load_architecture(cfg)
    a8 = load_architecture({**cfg, "quantization_config": {"quant_method": "fp8"}})
    b = pd.DataFrame([PREFILL])
    r = basis_frame(b, a8, H100).iloc[0] / basis_frame(b, a16, H100).iloc[0]
    assert r.prefill_compute == pytest.approx(989 / 1979)
    assert r.weight_loading == pytest.approx(0.5, rel=0.01)   # 1 byte weights (norms included)
    a100 = load_gpu("A100")
    assert basis_frame(b, a8, a100).prefill_compute.iloc[0] == \
        pytest.approx(basis_frame(b, a16, a100).prefill_compute.iloc[0])


def test_extra_terms() -> None:
    a = load_architecture("llama-2-7b")
    s = ServingConfig()
    b = pd.DataFrame([{**DECODE, "offload_tokens": 100}])
    f = basis_frame(b, a, H100, s, terms=("per_step", "cpu_offload", "kv_pressure"))
    assert list(f.columns) == ["per_step", "cpu_offload", "kv_pressure"]
    assert f.cpu_offload.iloc[0] == pytest.approx(100 * 524288 / 25e9 * 1e6)
    cap = kv_capacity_tokens(a, H100, s)
    assert f.kv_pressure.iloc[0] == pytest.approx(32000 / cap)
    # offload_tokens is optional: absent -> 0
    assert basis_frame(pd.DataFrame([DECODE]), a, H100, s, terms=["cpu_offload"]).iloc[0, 0] == 0


def test_kv_capacity_and_fits() -> None:
    a = load_architecture("llama-2-7b")
    # (81559 MiB * 0.9 util * (1 - 0.10 reserve) - 6.74e9 params * 2 B) / 524288 B per token
    expect = int(np.floor((81559 * 2**20 * 0.9 * 0.9 - a.params_total * 2) / 524288))
    assert kv_capacity_tokens(a, H100, ServingConfig()) == expect == 106420
    big = load_architecture("llama-2-70b")
    assert kv_capacity_tokens(big, H100, ServingConfig(tp=1)) == 0
    assert not fits(big, H100, ServingConfig(tp=1))
    assert fits(big, H100, ServingConfig(tp=4))
    c4 = kv_capacity_tokens(big, H100, ServingConfig(tp=4))
    assert c4 == int(np.floor((81559 * 2**20 * 0.81 - big.params_total * 2 / 4) / 81920))


def test_batch_validation() -> None:
    a = load_architecture("llama-2-7b")
    bad = BATCHES.copy()
    bad.loc["decode", "decode_ctx_tokens"] = -5
    with pytest.raises(ConfigError, match=r"decode_ctx_tokens.*'decode'"):
        basis_matrix(bad, a, H100)
    nan = pd.DataFrame([PREFILL, DECODE])
    nan.loc[1, "prefill_tokens"] = np.nan
    with pytest.raises(ConfigError, match=r"prefill_tokens.*row index 1"):
        basis_matrix(nan, a, H100)
    with pytest.raises(ConfigError, match="prefill_attn_pairs"):
        basis_matrix(pd.DataFrame([PREFILL]).drop(columns="prefill_attn_pairs"), a, H100)
    # one mapping of scalars = one row; empty table = empty matrix
    assert basis_matrix(PREFILL, a, H100).shape == (1, 11)
    assert basis_matrix(pd.DataFrame(columns=list(PREFILL)), a, H100).shape == (0, 11)


def test_vectorised_large_batch_fast() -> None:
    rng = np.random.default_rng(0)
    n = 100_000
    p = rng.integers(0, 2048, n)
    df = pd.DataFrame(dict(num_prefill_reqs=(p > 0).astype(int), prefill_tokens=p,
                           prefill_attn_pairs=p * (p + 1) / 2, prefill_kv_tokens=p,
                           num_decode_reqs=rng.integers(0, 128, n), decode_tokens=0,
                           decode_ctx_tokens=rng.integers(0, 100_000, n)))
    df["decode_tokens"] = df.num_decode_reqs
    x = basis_matrix(df, load_architecture("mixtral-8x7b"), H100, ServingConfig(tp=2))
    assert x.shape == (n, 11) and np.isfinite(x).all() and (x >= 0).all()


def test_names_accepted_for_arch_and_gpu() -> None:
    a = load_architecture("llama-2-7b")
    np.testing.assert_array_equal(basis_matrix(BATCHES, "Llama-2-7b-hf", "h100-80gb"),
                                  basis_matrix(BATCHES, a, H100))
