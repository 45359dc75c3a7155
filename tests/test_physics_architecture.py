"""Architecture parsing: shipped models, real Hugging Face configs, MoE/MLA/FP8 dialects."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bayes_latency.errors import ConfigError, UnknownArchitectureError
from bayes_latency.physics.architecture import Architecture, expected_distinct_experts
from bayes_latency.physics.hf_config import architecture_from_config
from bayes_latency.physics.models import known_architectures, load_architecture

_CONFIG_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "real" / "model-configs"
_CONFIGS = sorted(p.name for p in _CONFIG_DIR.glob("*.json")) or ["<absent>"]

SHIPPED = ("llama-2-7b", "llama-2-70b", "codellama-34b", "mixtral-8x7b", "llama-3.1-8b",
           "llama-3.1-70b", "qwen2.5-7b", "bloom-176b")


@pytest.mark.real
@pytest.mark.parametrize("fname", _CONFIGS)
def test_every_real_config_loads(real_dir: Path, fname: str) -> None:
    a = load_architecture(real_dir / "model-configs" / fname)
    assert isinstance(a, Architecture)
    assert a.n_layers > 0 and a.hidden > 0 and a.n_heads > 0 and a.vocab > 0
    assert 0 < a.params_dense_matmul_per_token <= a.params_total
    assert a.kv_bytes_per_token > 0
    assert len(a.moe_layers) == a.n_layers
    assert (a.n_experts > 0) == (a.n_moe_layers > 0)


@pytest.mark.real
def test_llama2_70b_real(real_dir: Path) -> None:
    a = load_architecture(real_dir / "model-configs" / "llama-2-70b-hf.json")
    assert (a.n_layers, a.n_heads, a.n_kv_heads, a.head_dim) == (80, 64, 8, 128)
    assert a.attention == "gqa"
    assert a.params_total == pytest.approx(69e9, rel=0.02)
    # same numbers as the shipped trimmed config
    assert a.params_total == load_architecture("llama-2-70b").params_total


@pytest.mark.real
def test_mixtral_real(real_dir: Path) -> None:
    a = load_architecture(real_dir / "model-configs" / "mixtral-8x7b-v0.1.json")
    assert (a.n_experts, a.experts_per_token, a.n_moe_layers) == (8, 2, 32)
    assert a.params_total == pytest.approx(46.7e9, rel=0.01)
    # active params: ~12.9B with embeddings (12.75B of matmul weights incl. the LM head)
    assert a.params_dense_matmul_per_token == pytest.approx(12.75e9, rel=0.02)
    assert a.expert_params_per_layer == 3 * 4096 * 14336


@pytest.mark.real
def test_llama4_scout_interleaved_fp8(real_dir: Path) -> None:
    cfg = json.loads((real_dir / "model-configs"
                      / "llama-4-scout-17b-16e-instruct-fp8-dynamic.json").read_text())
    a = architecture_from_config(cfg, name="scout")
    # interleave_moe_layer_step = 1 -> every one of the 48 layers is MoE
    assert a.n_moe_layers == 48 and a.n_experts == 16 and a.experts_per_token == 1
    assert a.n_shared_experts == 1
    assert a.weight_bytes == 1.0 and a.compute_bytes == 1.0   # compressed-tensors FP8 W8A8
    assert a.kv_bytes == 2.0                                  # kv_cache_scheme null -> bf16 KV
    assert a.params_total == pytest.approx(108e9, rel=0.03)   # 109B incl. the vision tower
    assert a.params_dense_matmul_per_token == pytest.approx(17e9, rel=0.06)
    # step 2: layers 1, 3, 5, ... are MoE (HF: range(step - 1, L, step)); dense ones use intermediate_size_mlp
    cfg["text_config"]["interleave_moe_layer_step"] = 2
    b = architecture_from_config(cfg, name="scout2")
    assert b.n_moe_layers == 24 and b.moe_layers[:4] == (False, True, False, True)
    assert b.ffn == 16384 and b.moe_ffn == 8192


@pytest.mark.real
def test_deepseek_v2_lite_mla(real_dir: Path) -> None:
    a = load_architecture(real_dir / "model-configs" / "deepseek-v2-lite.json")
    assert a.attention == "mla"
    assert (a.kv_lora_rank, a.qk_rope_head_dim, a.qk_nope_head_dim, a.v_head_dim) == (512, 64, 128, 128)
    # KV per token: (kv_lora_rank + qk_rope_head_dim) * 2 bytes per layer, 27 layers
    assert a.kv_bytes_per_token == 27 * (512 + 64) * 2
    assert a.kv_bytes_per_token_gpu(4) == a.kv_bytes_per_token   # latent replicated over TP
    # first_k_dense_replace = 1 -> 26 MoE layers of 64 experts, top-6, 2 shared
    assert (a.n_moe_layers, a.n_experts, a.experts_per_token, a.n_shared_experts) == (26, 64, 6, 2)
    assert a.params_total == pytest.approx(15.7e9, rel=0.02)
    assert a.params_dense_matmul_per_token == pytest.approx(2.4e9, rel=0.05)


@pytest.mark.real
def test_qwen3_moe_and_glm_fp8(real_dir: Path) -> None:
    q = load_architecture(real_dir / "model-configs" / "qwen3-30b-a3b.json")
    assert (q.n_experts, q.experts_per_token, q.moe_ffn, q.n_moe_layers) == (128, 8, 768, 48)
    assert q.params_total == pytest.approx(30.5e9, rel=0.02)
    assert q.head_dim == 128    # explicit head_dim (hidden/heads would be 64)
    g = load_architecture(real_dir / "model-configs" / "glm-5.2-fp8.json")
    assert g.attention == "mla" and g.weight_bytes == 1.0
    assert g.n_moe_layers == 78 - 3


def test_shipped_models_and_aliases() -> None:
    assert set(SHIPPED) <= set(known_architectures())
    for n in SHIPPED:
        assert load_architecture(n).name == n
    for alias, short in [("meta-llama/Llama-2-70b-hf", "llama-2-70b"), ("Llama-2-70b-hf", "llama-2-70b"),
                         ("LLAMA-2-70B", "llama-2-70b"),
                         ("codellama/CodeLlama-34b-Instruct-hf", "codellama-34b"),
                         ("mistralai/Mixtral-8x7B-v0.1", "mixtral-8x7b"),
                         ("meta-llama/Llama-2-7b-hf", "llama-2-7b"),
                         ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"), ("bigscience/bloom", "bloom-176b")]:
        assert load_architecture(alias).name == short, alias


def test_llama2_7b_counts() -> None:
    a = load_architecture("llama-2-7b")
    assert a.attention == "mha" and a.n_kv_heads == 32 and a.head_dim == 128
    per_layer = 4 * 4096 * 4096 + 3 * 4096 * 11008          # Q,K,V,O + gate/up/down
    assert a.params_dense_matmul_per_token == 32 * per_layer + 32000 * 4096
    # + embedding + 2 RMSNorms per layer + final norm
    assert a.params_total == 32 * per_layer + 2 * 32000 * 4096 + 32 * 2 * 4096 + 4096
    assert a.kv_bytes_per_token == 32 * 2 * 32 * 128 * 2     # 512 KiB


def test_bloom_176b() -> None:
    a = load_architecture("bloom-176b")
    assert (a.n_layers, a.hidden, a.n_heads, a.n_kv_heads, a.vocab) == (70, 14336, 112, 112, 250880)
    assert not a.gated_ffn and a.ffn == 4 * 14336 and a.attention == "mha"
    assert a.params_total == pytest.approx(176e9, rel=0.01)


def test_kv_heads_replicated_when_fewer_than_tp() -> None:
    a = load_architecture("qwen2.5-7b")    # 4 KV heads
    assert a.kv_heads_per_gpu(1) == 4 and a.kv_heads_per_gpu(2) == 2
    assert a.kv_heads_per_gpu(8) == 1      # replicated, not 0.5


def test_expected_distinct_experts() -> None:
    a = load_architecture("mixtral-8x7b")
    e = expected_distinct_experts(a, [0, 1, 512])
    assert e[0] == 0 and e[1] == pytest.approx(2.0) and e[2] == pytest.approx(8.0)
    assert expected_distinct_experts(load_architecture("llama-2-7b"), 5) == 0


def test_quantization_and_dtype() -> None:
    base = json.loads((Path(__file__).resolve().parents[1] / "bayes_latency" / "physics" / "data"
                       / "models" / "llama-3.1-8b.json").read_text())
    fp8 = architecture_from_config({**base, "quantization_config": {"quant_method": "fp8"}})
    assert fp8.weight_bytes == 1 and fp8.compute_bytes == 1 and fp8.kv_bytes == 2
    awq = architecture_from_config({**base, "quantization_config": {"quant_method": "awq", "bits": 4}})
    assert awq.weight_bytes == 0.5 and awq.compute_bytes == 2
    f32 = architecture_from_config({**base, "torch_dtype": "float32"})
    assert f32.weight_bytes == 2   # served in 16 bits


def test_unknown_and_bad_configs(tmp_path: Path) -> None:
    with pytest.raises(UnknownArchitectureError, match="llama-2-70b"):
        load_architecture("gpt-17")
    assert issubclass(UnknownArchitectureError, ConfigError)
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"hidden_size": 8, "num_attention_heads": 2, "vocab_size": 10}))
    with pytest.raises(UnknownArchitectureError, match=r"config\.json.*num_hidden_layers"):
        load_architecture(bad)
    with pytest.raises(UnknownArchitectureError, match="num_experts_per_tok"):
        architecture_from_config({"num_hidden_layers": 2, "hidden_size": 8, "num_attention_heads": 2,
                                  "vocab_size": 10, "num_local_experts": 4})
    # a directory holding config.json works too
    (tmp_path / "config.json").write_text((Path(__file__).resolve().parents[1] / "bayes_latency"
                                           / "physics" / "data" / "models" / "llama-2-7b.json").read_text())
    assert load_architecture(tmp_path).params_total == load_architecture("llama-2-7b").params_total


@pytest.mark.real
@pytest.mark.parametrize("short,fname", [
    ("llama-2-7b", "llama-2-7b-hf.json"), ("llama-2-70b", "llama-2-70b-hf.json"),
    ("codellama-34b", "codellama-34b-instruct-hf.json"), ("mixtral-8x7b", "mixtral-8x7b-v0.1.json"),
    ("llama-3.1-8b", "llama-3.1-8b-instruct.json"), ("llama-3.1-70b", "llama-3.1-70b-instruct.json"),
    ("qwen2.5-7b", "qwen2.5-7b-instruct.json"), ("yi-34b", "yi-34b.json"),
    ("qwen3-14b", "qwen3-14b.json"), ("qwen3-30b-a3b", "qwen3-30b-a3b.json"),
    ("mistral-nemo-12b", "mistral-nemo-instruct-2407.json"), ("deepseek-v2-lite", "deepseek-v2-lite.json"),
    ("llama-4-scout-17b-16e-fp8", "llama-4-scout-17b-16e-instruct-fp8-dynamic.json"),
])
def test_shipped_trimmed_configs_match_real(real_dir: Path, short: str, fname: str) -> None:
    shipped = load_architecture(short).to_dict()
    real = load_architecture(real_dir / "model-configs" / fname).to_dict()
    shipped.pop("name"), real.pop("name")
    assert shipped == real
