"""Text inputs: UTF-8 only (a BOM accepted), YAML without duplicate keys or alias bombs, and
config.json sizes within plausible bounds; each refusal names the file."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from bayes_latency.data.experiment import load_serving_yaml
from bayes_latency.errors import ConfigError, PriorError, UnknownArchitectureError
from bayes_latency.physics.models import MODELS_DIR, load_architecture
from bayes_latency.priors import DEFAULT_PRIORS_PATH, load_priors
from bayes_latency.textfiles import MAX_ALIAS_NODES, load_yaml, read_text

SERVING = "model: llama-2-7b\ngpu: H100\nworkload: café\n"


def alias_bomb(levels: int = 10, width: int = 9) -> str:
    """``a0: &a0 [lol x width]`` then ``aN: &aN [*aN-1 x width]``: width**levels nodes."""
    lines = ["a0: &a0 [" + ", ".join(['"lol"'] * width) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]"
              for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_serving_yaml_in_latin1_names_the_file(tmp_path: Path):
    p = tmp_path / "serving.yaml"
    p.write_bytes(SERVING.encode("latin-1"))
    with pytest.raises(ConfigError, match=r"serving\.yaml: serving config is not UTF-8.*0xe9"):
        load_serving_yaml(p)


def test_serving_yaml_with_utf8_bom_is_read(tmp_path: Path):
    p = tmp_path / "serving.yaml"
    p.write_text(SERVING, encoding="utf-8-sig")
    assert load_serving_yaml(p)["workload"] == "café"
    assert read_text(p) == SERVING


def test_priors_in_latin1_names_the_file(tmp_path: Path):
    text = DEFAULT_PRIORS_PATH.read_text(encoding="utf-8") + "\n# café\n"
    p = tmp_path / "priors.yaml"
    p.write_bytes(text.encode("latin-1"))
    with pytest.raises(PriorError, match=r"priors\.yaml: prior file is not UTF-8"):
        load_priors(p)


def test_alias_bomb_in_serving_yaml_is_refused_fast(tmp_path: Path):
    p = tmp_path / "serving.yaml"
    p.write_text(SERVING + alias_bomb(), encoding="utf-8")
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=r"serving\.yaml: not valid YAML: .*alias"):
        load_serving_yaml(p)
    assert time.perf_counter() - t0 < 5.0


def test_alias_bomb_in_priors_description_is_refused(tmp_path: Path):
    text = DEFAULT_PRIORS_PATH.read_text(encoding="utf-8")
    p = tmp_path / "priors.yaml"
    p.write_text(text + "\n" + alias_bomb(), encoding="utf-8")
    with pytest.raises(PriorError, match=r"priors\.yaml: .*alias"):
        load_priors(p)


def test_small_aliases_and_merge_keys_still_load():
    doc = load_yaml("base: &b {x: 1, y: 2}\nd:\n  <<: *b\n  x: 3\ne: *b\n")
    assert doc == {"base": {"x": 1, "y": 2}, "d": {"x": 3, "y": 2}, "e": {"x": 1, "y": 2}}
    # just under the bound: 9**5 = 59,049 expanded nodes
    assert MAX_ALIAS_NODES > 9 ** 5 + 9 ** 4
    assert len(load_yaml(alias_bomb(levels=5))) == 5


def test_a_large_document_without_aliases_is_not_refused():
    text = "x: [" + ", ".join(["1"] * (2 * MAX_ALIAS_NODES)) + "]\n"
    assert len(load_yaml(text)["x"]) == 2 * MAX_ALIAS_NODES


def test_recursive_alias_is_refused():
    with pytest.raises(yaml.YAMLError, match="refers to itself"):
        load_yaml("a: &a [1, *a]\n")


def test_duplicate_key_in_serving_yaml_names_key_and_line(tmp_path: Path):
    p = tmp_path / "serving.yaml"
    p.write_text("model: llama-2-7b\ngpu: H100\ntp: 1\ntp: 2\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"(?s)serving\.yaml.*duplicate key 'tp' \(first at line 3\)"):
        load_serving_yaml(p)
    with pytest.raises(yaml.YAMLError, match="duplicate key 'é'"):
        load_yaml("é: 1\né: 2\n")  # the pure-Python parser too


@pytest.mark.parametrize("field, value", [
    ("num_hidden_layers", 1_000_000_000), ("hidden_size", 10 ** 12),
    ("num_local_experts", 10 ** 9), ("intermediate_size", 10 ** 15),
    ("num_hidden_layers", 1.5), ("kv_lora_rank", "wide"),
])
def test_config_json_sizes_are_bounded(tmp_path: Path, field: str, value: object):
    cfg = json.loads((MODELS_DIR / "mixtral-8x7b.json").read_text(encoding="utf-8"))
    cfg[field] = value
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg), encoding="utf-8")
    t0 = time.perf_counter()
    with pytest.raises(UnknownArchitectureError, match=rf"config\.json: field '{field}'"):
        load_architecture(p)
    assert time.perf_counter() - t0 < 2.0


def test_config_json_in_latin1_names_the_file(tmp_path: Path):
    p = tmp_path / "config.json"
    p.write_bytes('{"model_type": "llamá"}'.encode("latin-1"))
    with pytest.raises(UnknownArchitectureError, match=r"config\.json: config\.json is not UTF-8"):
        load_architecture(p)
