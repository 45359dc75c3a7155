"""Roofline basis: hand-computed features, MoE/TP behaviour, BLIS mapping, validation."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from bayes_latency.errors import ConfigError
from bayes_latency.physics.basis import (
    ALPHA_TERM_INFO,
    ALPHA_TERMS,
    BLIS_BETA_ORDER,
    DEFAULT_TERMS,
    EXTRA_TERMS,
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
from bayes_latency.physics.models import load_architecture
from bayes_latency.physics.serving import ServingConfig

H100 = load_gpu("H100")
PEAK, HBM = 989.5e12, 3.35e12          # BLIS hardware_config.json, H100


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
    # BLIS reads beta_coeffs positionally in StepTime (sim/latency/trained_physics_model.go)
    assert BLIS_BETA_ORDER == ("prefill_compute", "decode_compute", "weight_loading",
                               "tp_allreduce", "per_layer", "per_request", "per_step", "moe_layer",
                               "prefill_kv", "decode_kv", "moe_dispatch")
    for i, n in enumerate(BLIS_BETA_ORDER):
        assert get_term(n).blis_index == i
    for t in TERMS.values():
        assert t.group in ("compute", "memory", "communication", "overhead")
        assert t.doc and t.unit and t.feature_unit
    for n in EXTRA_TERMS:
        assert not get_term(n).exportable and get_term(n).blis_index is None
    assert get_term("moe_routing").fold == "per_step" and get_term("cpu_offload").fold is None
    assert all(TERMS[n].exportable for n in DEFAULT_TERMS)
    assert ALPHA_TERMS == ("alpha_arrival", "alpha_post_decode", "alpha_per_token")
    assert ALPHA_TERM_INFO["alpha_per_token"].unit == "us/token"
    with pytest.raises(ConfigError, match="unknown term"):
        get_term("nope")
    with pytest.raises(ConfigError, match="duplicate"):
        term_names(["per_step", "per_step"])


def test_llama2_7b_tp1_hand_computed() -> None:
    """BLIS's formulas (StepTime) written out for Llama-2-7B on H100 (BLIS: 989.5 TFLOP/s)."""
    a = load_architecture("llama-2-7b")
    f = basis_frame(BATCHES, a, H100, ServingConfig(tp=1))
    assert list(f.columns) == list(DEFAULT_TERMS) and list(f.index) == list(BATCHES.index)
    L, d, dkv, ff = 32, 4096, 4096, 11008
    proj = L * 2 * d * (2 * d + 2 * dkv)           # per token
    ffn = L * 6 * d * ff                           # per token, 3 matrices
    in_pairs = 512 * (512 + 512 / 2)               # BLIS: chunk x (input length + chunk / 2)
    attn = L * 4 * 32 * 128                        # per pair (H/tp * dH)
    p = f.loc["prefill"]
    assert p.prefill_compute == pytest.approx((512 * (proj + ffn) + attn * in_pairs) / PEAK * 1e6)
    assert p.prefill_kv == pytest.approx(L * 2 * dkv * 512 * 2 / HBM * 1e6)   # writes only
    w = L * d * (2 * d + 2 * dkv) * 2 + L * 3 * d * ff * 2                     # no embeddings
    assert p.weight_loading == pytest.approx(w / HBM * 1e6)
    assert (p.decode_compute, p.decode_kv, p.tp_allreduce, p.moe_layer, p.moe_dispatch) == (0, 0, 0, 0, 0)
    assert (p.per_layer, p.per_request, p.per_step) == (32, 1, 1)
    dd = f.loc["decode"]
    past = 32 * 1000 - 32                          # decode_ctx_tokens counts the decoded token
    assert dd.decode_compute == pytest.approx((32 * (proj + ffn) + attn * past) / PEAK * 1e6)
    assert dd.decode_kv == pytest.approx(L * 2 * dkv * 2 * 32000 / HBM * 1e6)
    assert dd.weight_loading == p.weight_loading
    assert (dd.prefill_compute, dd.prefill_kv, dd.per_layer, dd.per_request, dd.per_step) == (0, 0, 32, 32, 1)
    m = f.loc["mixed"]
    for t in ("prefill_compute", "prefill_kv", "decode_compute", "decode_kv"):
        assert m[t] == pytest.approx(p[t] + dd[t])
    assert m.weight_loading == p.weight_loading and m.per_request == 33 and m.per_step == 1
    e = f.loc["empty"]
    assert e.per_step == 1 and (e.drop("per_step") == 0).all()


def test_llama2_70b_tp4_hand_computed() -> None:
    a = load_architecture("llama-2-70b")
    f = basis_frame(BATCHES, a, H100, ServingConfig(tp=4))
    L, d, dkv, ff, tp = 80, 8192, 1024, 28672, 4
    proj = L * 2 * d * (2 * d + 2 * dkv) / tp
    ffn = L * 6 * d * ff / tp
    attn = L * 4 * (64 / tp) * 128
    p, dd, m = f.loc["prefill"], f.loc["decode"], f.loc["mixed"]
    assert p.prefill_compute == pytest.approx((512 * (proj + ffn) + attn * 512 * 768) / PEAK * 1e6)
    assert p.prefill_kv == pytest.approx(L * 2 * (dkv / tp) * 512 * 2 / HBM * 1e6)
    w = (L * d * (2 * d + 2 * dkv) + L * 3 * d * ff) * 2 / tp
    assert p.weight_loading == pytest.approx(w / HBM * 1e6)
    # all-reduce: attention + dense FFN per layer, T x hidden x 2 B, ring 2(tp-1)/tp, over HBM
    assert p.tp_allreduce == pytest.approx(2 * L * 512 * d * 2 * 2 * 0.75 / HBM * 1e6)
    assert p.tp_allreduce == pytest.approx(601.0, abs=0.1)
    assert m.tp_allreduce == pytest.approx(p.tp_allreduce + dd.tp_allreduce)
    assert dd.decode_compute == pytest.approx((32 * (proj + ffn) + attn * 31968) / PEAK * 1e6)
    assert dd.decode_kv == pytest.approx(L * 2 * (dkv / tp) * 2 * 32000 / HBM * 1e6)
    assert (dd.per_layer, dd.per_request, dd.per_step, dd.moe_layer) == (80, 32, 1, 0)


def test_tp_scaling() -> None:
    a = load_architecture("llama-2-7b")
    x1 = basis_frame(BATCHES, a, H100, ServingConfig(tp=1))
    x2 = basis_frame(BATCHES, a, H100, ServingConfig(tp=2))
    for t in ("prefill_compute", "decode_compute", "weight_loading", "prefill_kv", "decode_kv"):
        np.testing.assert_allclose(x2[t], x1[t] / 2)
    assert (x1.tp_allreduce == 0).all()
    assert (x2.tp_allreduce.iloc[:3] > 0).all() and x2.tp_allreduce.iloc[3] == 0
    for t in ("per_layer", "per_request", "per_step"):
        np.testing.assert_array_equal(x2[t], x1[t])


def test_moe_as_blis_sees_it() -> None:
    mix = load_architecture("mixtral-8x7b")
    one = pd.DataFrame([_row(num_decode_reqs=1, decode_tokens=1, decode_ctx_tokens=100)])
    many = pd.DataFrame([PREFILL])
    # every expert of every MoE layer is read each step, whatever the batch routes to
    w1 = basis_frame(one, mix, H100).weight_loading.iloc[0]
    assert w1 == basis_frame(many, mix, H100).weight_loading.iloc[0]
    d, dkv, ff = 4096, 1024, 14336
    assert w1 == pytest.approx((32 * d * (2 * d + 2 * dkv) + 32 * 8 * 3 * d * ff) * 2 / HBM * 1e6)
    # FFN compute counts top-2 experts per token
    pc = basis_frame(many, mix, H100).prefill_compute.iloc[0]
    expect = (512 * 32 * 2 * d * (2 * d + 2 * dkv) + 32 * 512 * 2 * 6 * d * ff
              + 32 * 4 * 32 * 128 * 512 * 768) / PEAK * 1e6
    assert pc == pytest.approx(expect)
    f = basis_frame(BATCHES, mix, H100, ServingConfig(tp=2))
    # uniform MoE: BLIS charges no per-MoE-layer overhead; the MoE FFN all-reduces at dp = 1
    assert (f.moe_layer == 0).all() and (f.moe_dispatch == 0).all()
    assert f.tp_allreduce["prefill"] == pytest.approx(2 * 32 * 512 * d * 2 * 2 * 0.5 / HBM * 1e6)
    assert basis_frame(BATCHES, mix, H100, terms=["moe_routing"]).moe_routing.iloc[0] == 32
    # dp > 1: MoE dispatch/combine (all-gather family), and no MoE all-reduce
    dp = basis_frame(BATCHES, mix, H100, ServingConfig(tp=2, dp=2))
    assert dp.moe_dispatch["prefill"] == pytest.approx(32 * (512 / 2) * 0.75 * 2 * d * 2 / HBM * 1e6)
    assert dp.tp_allreduce["prefill"] == pytest.approx(32 * 512 * d * 2 * 2 * 0.5 / HBM * 1e6 / 2)
    # interleaved MoE (Llama-4 Scout): 24 MoE layers get slot 7
    scout = load_architecture("llama-4-scout-17b-16e-fp8")
    assert basis_frame(BATCHES, scout, H100).moe_layer["prefill"] == 24
    assert basis_frame(BATCHES, scout, H100, terms=["moe_routing"]).moe_routing.iloc[0] == 0


def test_fp8_model_uses_fp8_peak() -> None:
    cfg = dict(model_type="llama", num_hidden_layers=2, hidden_size=256, num_attention_heads=4,
               intermediate_size=512, vocab_size=1000, torch_dtype="bfloat16")
    a16 = load_architecture(cfg)
    a8 = load_architecture({**cfg, "quantization_config": {"quant_method": "fp8"}})
    b = pd.DataFrame([PREFILL])
    r = basis_frame(b, a8, H100).iloc[0] / basis_frame(b, a16, H100).iloc[0]
    assert r.prefill_compute == pytest.approx(989.5 / 1979)
    assert r.weight_loading == pytest.approx(0.5)
    a100 = load_gpu("A100")
    assert basis_frame(b, a8, a100).prefill_compute.iloc[0] == \
        pytest.approx(basis_frame(b, a16, a100).prefill_compute.iloc[0])


def test_input_pairs_fallback_and_column() -> None:
    a = load_architecture("llama-2-7b")
    # absent column: one whole prompt per request -> c * (c + c/2) exactly
    with_col = pd.DataFrame([{**PREFILL, "prefill_input_pairs": 512 * 768.0}])
    np.testing.assert_allclose(basis_matrix(pd.DataFrame([PREFILL]), a, H100),
                               basis_matrix(with_col, a, H100))
    # a later chunk of a long prompt: BLIS charges the full input length
    later = pd.DataFrame([{**PREFILL, "prefill_input_pairs": 512 * (3000 + 256.0)}])
    assert basis_frame(later, a, H100).prefill_compute.iloc[0] > \
        basis_frame(with_col, a, H100).prefill_compute.iloc[0]


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
