"""Identifiability analysis (model/definition/identifiability.py) and the serving-stack level."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from obs_factory import random_batches

from bayes_latency.data.observations.build import config_id
from bayes_latency.model.definition.hierarchy import Design
from bayes_latency.model.definition.identifiability import config_identifiability, identifiability
from bayes_latency.physics.basis import DEFAULT_TERMS, basis_matrix
from bayes_latency.physics.hardware import load_gpu
from bayes_latency.physics.models import load_architecture
from bayes_latency.physics.serving import ServingConfig
from bayes_latency.priors import load_priors


def _decode_only(n: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    nd = rng.integers(1, 128, n)
    return pd.DataFrame({"num_prefill_reqs": 0, "prefill_tokens": 0, "prefill_attn_pairs": 0.0,
                         "prefill_kv_tokens": 0, "num_decode_reqs": nd, "decode_tokens": nd,
                         "decode_ctx_tokens": nd * rng.uniform(200, 2500, n)})


SCALE = np.array([load_priors().prior_median(t) for t in DEFAULT_TERMS])


def _X(batches: pd.DataFrame, model: str = "llama-2-70b", tp: int = 4) -> np.ndarray:
    return basis_matrix(batches, load_architecture(model), load_gpu("H100"), ServingConfig(tp=tp))


def test_constant_terms_and_one_token_per_decode_are_flagged() -> None:
    X = _X(_decode_only(300))
    scale = SCALE
    r = config_identifiability(X, X @ scale, DEFAULT_TERMS, scale, "c")
    groups = {frozenset(g) for g in r.groups}
    # constant per step of a dense configuration: only their sum is identified
    assert frozenset({"weight_loading", "per_layer", "per_step"}) in groups
    # one token per decoding request: decode_compute moves with per_request
    assert any({"decode_compute", "per_request"} <= g for g in groups)
    assert "moe_layer" not in r.active and "prefill_compute" not in r.active
    assert r.rank < len(r.active)


def test_prefill_chunks_identify_more_directions_than_decode_only_steps() -> None:
    Xd = _X(_decode_only(400))
    Xm = _X(random_batches(np.random.default_rng(1), 400))
    rd = config_identifiability(Xd, Xd @ SCALE, DEFAULT_TERMS, SCALE, "decode")
    rm = config_identifiability(Xm, Xm @ SCALE, DEFAULT_TERMS, SCALE, "mixed")
    assert rm.rank > rd.rank
    assert {"prefill_compute", "prefill_kv"} <= set(rm.active) - set(rd.active)


def test_fleet_report_finds_groups_no_configuration_separates() -> None:
    frames = []
    for model, tp in (("llama-2-70b", 4), ("codellama-34b", 2)):
        X = _X(_decode_only(200, seed=tp), model, tp)
        df = pd.DataFrame(X, columns=[f"x_{t}" for t in DEFAULT_TERMS])
        df["value_us"] = X @ SCALE
        df["config_id"] = config_id(model, "H100-SXM", tp)
        frames.append(df)
    rep = identifiability(pd.concat(frames, ignore_index=True), DEFAULT_TERMS, SCALE)
    every = {frozenset(g) for g in rep.confounded_everywhere}
    assert frozenset({"weight_loading", "per_layer", "per_step"}) in every
    assert rep.involved(["per_step"]) and not rep.involved(["moe_layer"])
    assert "no configuration separates" in rep.summary()
    assert list(rep.to_frame()["rank"]) == [c.rank for c in rep.configs]


def test_bad_shapes_and_missing_columns_raise() -> None:
    with pytest.raises(ValueError, match="line up"):
        config_identifiability(np.ones((3, 2)), np.ones(3), ["a", "b", "c"], np.ones(3))
    with pytest.raises(ValueError, match="lack columns"):
        identifiability(pd.DataFrame({"config_id": ["a"]}), ["a"], np.ones(1))


def test_config_id_and_design_stack_level() -> None:
    assert config_id("m", "H100-SXM", 4) == "m|H100-SXM|tp4"
    assert config_id("m", "H100-SXM", 4, "splitwise") == "m|H100-SXM|tp4|splitwise"
    configs = pd.DataFrame({"model": ["m", "m"], "gpu": ["g", "g"], "tp": [4, 4],
                            "stack": ["vllm", "splitwise"]},
                           index=["m|g|tp4", "m|g|tp4|splitwise"])
    d = Design(("a",), ("a",), (), configs)
    assert d.stacks == ["splitwise", "vllm"]
    assert list(d.index("stack")) == [1, 0]
    legacy = Design(("a",), ("a",), (), configs.drop(columns="stack"))
    assert legacy.stacks == ["vllm"] and list(legacy.index("stack")) == [0, 0]


def test_configurations_flat_in_both_coefficients_do_not_separate_them():
    """A pair one group in some configuration and each flat on its own elsewhere (real data:
    per_layer / per_step in the Splitwise Bloom benchmark means) is confounded everywhere; a
    configuration that identifies one of the two and not the other still separates them."""
    from bayes_latency.model.definition.identifiability import (
        ConfigIdentifiability,
        IdentifiabilityReport,
    )

    def cfg(name, groups, active=("a", "b", "c")):
        return ConfigIdentifiability(config_id=name, active=list(active), rank=0,
                                     groups=[list(g) for g in groups])

    joint = cfg("joint", [("a", "b")])
    both_alone = cfg("both_alone", [("a",), ("b",)])
    assert IdentifiabilityReport([joint, both_alone]).confounded_everywhere == [["a", "b"]]
    # before: the configuration where both are flat alone counted as separating them
    one_alone = cfg("one_alone", [("a",)])  # a flat, b identified: they are told apart
    assert IdentifiabilityReport([joint, one_alone]).confounded_everywhere == []
    apart = cfg("apart", [("a", "c"), ("b",)])
    assert IdentifiabilityReport([joint, both_alone, apart]).confounded_everywhere == []
