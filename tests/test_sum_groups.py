"""Coefficients the data give only as a sum: found from the rows, sampled in the sum's coordinate."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pymc as pm
import pytensor
import pytensor.tensor as pt
from obs_factory import make_observations
from pytensor.gradient import jacobian

from bayes_latency.model.definition.hierarchy import SumGroupTransform
from bayes_latency.model.definition.identifiability import (
    MAX_WEIGHT_SPREAD,
    pooled_groups,
    sum_groups,
    weight_spread,
)


def test_sum_groups_are_the_proportional_features():
    obs, _ = make_observations([("llama-2-7b", "H100", 1), ("llama-2-7b", "A100", 1)],
                               n_iter=40, n_win=40, n_alpha=40, seed=3)
    coefs = [c[2:] for c in obs.columns if c.startswith("x_")]
    rows = obs[obs["role"].isin(["beta", "alpha"])]
    groups = {tuple(g.coefs): g.weights for g in sum_groups(rows, coefs)}
    # per_layer and per_step are constant per step of a dense model: weight 1 / 32 layers
    key = next(k for k in groups if "per_step" in k)
    assert "per_layer" in key
    np.testing.assert_allclose(groups[key][list(key).index("per_step")]
                               / groups[key][list(key).index("per_layer")], 1 / 32, rtol=1e-9)
    # a feature that varies on its own (decode tokens) is in no group
    assert all("decode_compute" not in k for k in groups)


def test_sum_groups_tolerance_on_the_ratio():
    rows = pd.DataFrame({"config_id": ["a"] * 4 + ["b"] * 4,
                         "x_p": [1.0] * 8,
                         "x_n": [100, 101, 99, 100, 200, 202, 198, 200.0],  # ratio cv ~1%
                         "x_q": [1, 5, 9, 2, 1, 1, 1, 1.0]})  # varies in config a
    groups = sum_groups(rows, ["p", "n", "q"])
    assert [g.coefs for g in groups] == [["p", "n"]]
    np.testing.assert_allclose(groups[0].weights, [1.0, np.sqrt(100 * 200)], rtol=1e-9)
    np.testing.assert_allclose(groups[0].config_weights["b"], [1.0, 200.0])
    assert sum_groups(rows, ["p", "n", "q"], tol=0.001) == []


def test_groups_whose_weights_differ_across_configurations_are_not_pooled():
    # p, n proportional in every configuration, but n/p is 100 in a and 200 in b: the two
    # configurations identify the split, so the model must not sample it as a sum
    rows = pd.DataFrame({"config_id": ["a"] * 4 + ["b"] * 4,
                         "x_p": [1.0] * 8,
                         "x_n": [100, 101, 99, 100, 200, 202, 198, 200.0],
                         "x_q": [1, 5, 9, 2, 1, 1, 1, 1.0]})
    (g,) = sum_groups(rows, ["p", "n", "q"])
    np.testing.assert_allclose(weight_spread(g), np.log(2.0), rtol=1e-9)
    assert pooled_groups(rows, ["p", "n", "q"]) == []
    # the left-out members are not paired again as a near pair
    assert all("n" not in p.coefs for p in pooled_groups(rows, ["p", "n", "q"]))
    # weights within the limit (n/p 100 and 110): pooled
    rows.loc[rows["config_id"] == "b", "x_n"] = [110, 111.1, 108.9, 110.0]
    assert np.log(1.1) < MAX_WEIGHT_SPREAD
    assert [g.coefs for g in pooled_groups(rows, ["p", "n", "q"])] == [["p", "n"]]


def test_sum_group_transform_is_exact_with_a_constant_jacobian():
    m = np.array([0.3, np.log(1600.0), np.log(32.0), -1.0])
    s = np.array([0.5, 0.7, 0.7, 0.9])
    tr = SumGroupTransform([(np.array([1, 2]), np.array([1.0, 250.0])),
                            (np.array([0, 3]), np.array([1.0, 0.1]))], m, s)
    u = pt.dvector("u")
    z = tr.backward(u)
    f = pytensor.function([u], [z, tr.forward(z), jacobian(z, u), tr.log_jac_det(u).sum()])
    rng = np.random.default_rng(0)
    for _ in range(5):
        uv = rng.normal(size=4)
        zv, back, J, ljd = f(uv)
        np.testing.assert_allclose(back, uv, atol=1e-10)  # forward inverts backward
        np.testing.assert_allclose(np.log(abs(np.linalg.det(J))), ljd, atol=1e-10)
    # the sum's coordinate: S = sum_k w_k exp(mu_k) moves with u[1] alone
    zv, *_ = f(np.array([0.0, 0.4, -2.0, 0.0]))
    zw, *_ = f(np.array([0.0, 0.4, 1.5, 0.0]))
    S = [np.log(np.exp(m[1] + s[1] * x[1]) + 250.0 * np.exp(m[2] + s[2] * x[2])) for x in (zv, zw)]
    np.testing.assert_allclose(S[0], S[1], atol=1e-10)


def test_unseen_levels_share_the_group_effect():
    from bayes_latency.model.posterior.unseen import _shared_effects

    rng = np.random.default_rng(1)
    eff = rng.normal(size=(2, 5, 10))  # (level, coef, sample)
    eff[:, 3] = eff[:, 1]  # coefficient 3 reads coefficient 1's effects (a sum-only group)
    eff[:, 2] = 0.0
    eff[:, 4] = 0.0  # zero effects (e.g. a term without data) are not a group
    np.testing.assert_array_equal(_shared_effects(eff), [0, 1, 2, 1, 4])


def test_near_pairs_share_most_rows_in_proportion():
    from bayes_latency.model.definition.identifiability import near_pairs

    # d (decode tokens) and r (requests): equal on decode rows, r alone on the prefill rows;
    # p (prompt tokens) only on prefill rows; c: constant on the prefill rows only (a coincidence)
    dec = np.array([3, 8, 16, 32, 5, 9, 12, 40.0])
    rows = pd.DataFrame({"config_id": ["a"] * 10 + ["b"] * 10,
                         "x_d": np.r_[dec, 0, 0, dec * 2, 0, 0],
                         "x_r": np.r_[dec * 0.5, 1, 1, dec, 1, 1],
                         "x_p": np.r_[[0.0] * 8, 500, 900, [0.0] * 8, 300, 700],
                         "x_c": np.r_[[0.0] * 8, 7, 7, [0.0] * 8, 7, 7]})
    pairs = near_pairs(rows, ["d", "r", "p", "c"])
    assert [g.coefs for g in pairs] == [["d", "r"]]  # p + c share only the 2 prefill rows of 10
    np.testing.assert_allclose(pairs[0].weights, [1.0, 0.5])
    np.testing.assert_allclose(pairs[0].config_weights["b"], [1.0, 0.5])
    assert not pairs[0].exact
    assert near_pairs(rows, ["d", "r", "p", "c"], exclude=["r"]) == []
    # active in one configuration on different rows only: not a sum there
    rows.loc[(rows["config_id"] == "b") & (rows["x_d"] > 0), "x_r"] = 0.0
    rows.loc[rows["config_id"] == "b", "x_r"] = np.r_[[0.0] * 8, 1, 1]
    assert near_pairs(rows, ["d", "r"]) == []


def test_sum_group_members_without_ard_gate_when_switched_off(monkeypatch):
    from bayes_latency.model.definition import hierarchy
    from bayes_latency.model.estimator import LatencyModel

    monkeypatch.setattr(hierarchy, "GATE_SUM_GROUPS", False)
    obs, _ = make_observations([("llama-2-7b", "H100", 1), ("llama-2-7b", "A100", 1)],
                               n_iter=40, n_win=40, n_alpha=40, seed=3)

    m = LatencyModel()
    model = m.build(obs)
    members = {c for g in m._sum_groups() for c in g[0]}
    assert {"per_layer", "per_step"} <= members
    rel = pm.draw(model["relevance"], draws=20, random_seed=1)  # (20, coef)
    gated = [c in members for c in m.design.coefs]
    # no gate: relevance 1 at every draw, NaN (fixed) in the posterior
    assert np.isnan(rel[:, gated]).all()
    assert (rel[:, ~np.asarray(gated)] < 1.0).any()  # the other beta terms keep theirs
