"""ServingConfig validation and key aliases."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bayes_latency.errors import ConfigError
from bayes_latency.physics.models import load_architecture
from bayes_latency.physics.serving import ServingConfig


def test_defaults() -> None:
    s = ServingConfig()
    assert (s.tp, s.dp, s.ep, s.max_num_batched_tokens, s.max_num_seqs, s.max_model_len,
            s.block_size) == (1, 1, 1, 2048, 128, 4096, 16)
    assert s.chunked_prefill and s.prefix_caching
    assert s.cpu_offload_gb == 0.0 and s.gpu_memory_utilization == 0.9
    assert ServingConfig.from_dict(None) == s


def test_aliases_and_context_keys() -> None:
    s = ServingConfig.from_dict({"model": "meta-llama/Llama-2-70b-hf", "tensor_parallelism": 4,
                                 "max-num-batched-tokens": "8192", "enable_prefix_caching": "false",
                                 "app": "inference-perf"}, strict=True)
    assert s.tp == 4 and s.max_num_batched_tokens == 8192 and s.prefix_caching is False


@pytest.mark.real
def test_real_exp_config(real_dir: Path) -> None:
    for f in sorted((real_dir / "h100-lifecycle").glob("*/exp-config.yaml")):
        raw = yaml.safe_load(f.read_text())
        s = ServingConfig.from_dict(raw, source=str(f), strict=True)
        assert s.tp == raw["tensor_parallelism"]
        assert s.max_num_seqs == raw["max_num_seqs"]


@pytest.mark.parametrize("field,value", [("tp", 0), ("max_num_seqs", -1), ("block_size", 2.5),
                                         ("tp", "four"), ("gpu_memory_utilization", 1.5),
                                         ("chunked_prefill", "maybe"), ("cpu_offload_gb", -2)])
def test_bad_values_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field):
        ServingConfig.from_dict({field: value}, source="serving.yaml")


def test_unknown_key_strict_and_ep() -> None:
    with pytest.raises(ConfigError, match="max_num_seq"):
        ServingConfig.from_dict({"max_num_seq": 3}, strict=True)
    assert ServingConfig.from_dict({"max_num_seq": 3}).max_num_seqs == 128   # lenient by default
    mix = load_architecture("mixtral-8x7b")
    assert ServingConfig.from_dict({"ep": 4}, arch=mix).ep == 4
    with pytest.raises(ConfigError, match="'ep'"):
        ServingConfig.from_dict({"ep": 3}, arch=mix)
    with pytest.raises(ConfigError, match="'ep'"):
        ServingConfig.from_dict({"ep": 2}, arch=load_architecture("llama-2-7b"))
    with pytest.raises(ConfigError, match="'tp'"):
        ServingConfig.from_dict({"tp": 3}, arch=load_architecture("llama-2-7b"))
    with pytest.raises(ConfigError, match="twice"):
        ServingConfig.from_dict({"tp": 2, "tensor_parallelism": 2})
    assert ServingConfig(tp=2).replace(tp=4).tp == 4


def test_numpy_and_integral_values() -> None:
    import numpy as np

    s = ServingConfig(tp=np.int64(2), max_num_seqs=64.0, chunked_prefill=np.bool_(False),
                      gpu_memory_utilization=np.float32(0.5), cpu_offload_gb=1)
    assert s.tp == 2 and type(s.tp) is int and type(s.max_num_seqs) is int
    assert s.chunked_prefill is False and type(s.gpu_memory_utilization) is float
    with pytest.raises(ConfigError, match="'tp'"):
        ServingConfig(tp=2.5)
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        ServingConfig(gpu_memory_utilization=float("nan"))
