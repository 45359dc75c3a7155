"""Factors that split the configurations alike are sampled through their sum."""

from __future__ import annotations

import numpy as np
import pymc as pm
from obs_factory import make_observations

from bayes_latency.model.definition.design import filled
from bayes_latency.model.definition.hierarchy import prior_arrays
from bayes_latency.model.definition.population import fixed_quantities
from bayes_latency.model.estimator import LatencyModel

# model and TP split these configurations identically (every Mixtral at TP 2), GPU does not
CONFIGS = [("llama-2-7b", "H100", 1), ("llama-2-7b", "A100", 1), ("mixtral-8x7b", "H100", 2)]


def test_confounded_factors_share_one_identified_direction_with_the_same_prior():
    obs, _ = make_observations(CONFIGS, n_iter=60, n_win=60, n_alpha=40, seed=2)
    m = LatencyModel()
    model = m.build(obs)
    free = {v.name for v in model.free_RVs}
    assert {"z_model", "z_tp", "z_gpu"} <= free
    # two levels per factor: scales fixed at the prior's (hierarchy.MIN_LEVELS_FOR_SCALE), fixed
    # quantities of the model (constant_data), not posterior variables
    fixed = fixed_quantities(model)
    assert {"sigma_model", "sigma_tp", "sigma_gpu"} <= set(fixed)
    # z_model is the joint direction, indexed by the LLM levels (llm); z_tp is prior only, on
    # the TP degrees (tp)
    assert model.named_vars_to_dims["z_model"] == ("coef", "llm")
    assert model.named_vars_to_dims["z_tp"] == ("coef", "tp")
    with model:
        pr = pm.sample_prior_predictive(draws=3000, random_seed=1, var_names=[
            "eff_model", "eff_tp", "eff_gpu", "theta_pop", "mu"]).prior
    # eff_tp is NaN (fixed at zero) on the terms without a TP effect
    em, et = pr["eff_model"].values[0], filled(pr["eff_tp"]).values[0]
    # members of a sum-only group read their group's first coefficient's effects (checked below)
    own = np.asarray([all(c not in g[0][1:] for g in m._sum_groups()) for c in m.design.coefs])
    assert not own.all()  # per_layer + per_step, alpha_post_decode + alpha_per_token
    for names, *_ in m._sum_groups():
        idx = [list(m.design.coefs).index(c) for c in names]
        np.testing.assert_array_equal(em[:, :, idx[1:]], np.repeat(em[:, :, idx[:1]],
                                                                   len(idx) - 1, axis=2))
    # the prior file's hierarchy.tp.without (weight_loading): no TP effect at all, and the model
    # effect alone carries the confounded pair's direction for it
    no_tp = np.asarray([c in m.priors.hierarchy_without("tp") for c in m.design.coefs])
    assert no_tp.any() and np.all(et[:, :, no_tp] == 0)
    zm = (em[:, 0, :] / fixed["sigma_model"][1])[:, own]
    zt = (et[:, 0, :] / fixed["sigma_tp"][1])[:, own & ~no_tp]
    # each effect keeps its own prior: zero-sum over 2 levels -> sd sqrt(1/2), independent
    np.testing.assert_allclose(zm.std(axis=0), np.sqrt(0.5), rtol=0.08)
    np.testing.assert_allclose(zt.std(axis=0), np.sqrt(0.5), rtol=0.08)
    assert abs(np.corrcoef(zm[:, 0], zt[:, 0])[0, 1]) < 0.06
    # and the population means are the sum of all effects, as before
    d = m.design
    pa = prior_arrays(m.priors, d.coefs, d.gpus)
    log_m = (pr["mu"].values[0][:, None, :] + pa.gpu_offset[d.index("gpu")][None]
             + em[:, d.index("model")] + et[:, d.index("tp")]
             + pr["eff_gpu"].values[0][:, d.index("gpu")])
    # plus the shift that keeps each configuration's group sum on the typical one (_sum_shift)
    mu = pr["mu"].values[0]
    for names, w, cw in m._sum_groups():
        idx = [list(d.coefs).index(c) for c in names]
        for ci, cid in enumerate(d.configs.index):
            shift = (np.log(np.exp(mu[:, idx]) @ w) - np.log(np.exp(mu[:, idx]) @ cw[cid]))
            log_m[:, ci, idx] += shift[:, None]
    np.testing.assert_allclose(np.log(pr["theta_pop"].values[0]), log_m, atol=1e-10)


def test_factors_that_split_differently_stay_separate():
    obs, _ = make_observations([("llama-2-7b", "H100", 1), ("llama-2-7b", "H100", 2),
                                ("mixtral-8x7b", "H100", 2)], n_iter=60, n_win=60, n_alpha=40)
    model = LatencyModel().build(obs)
    assert model.named_vars_to_dims["z_tp"] == ("coef", "tp")
    assert model.named_vars_to_dims["z_model"] == ("coef", "llm")


def test_residual_scale_of_one_configuration_terms_is_the_prior_median():
    obs, _ = make_observations(CONFIGS, n_iter=60, n_win=60, n_alpha=40, seed=2)
    m = LatencyModel()
    model = m.build(obs)
    assert "sigma_config_free" in {v.name for v in model.free_RVs}
    with model:
        pr = pm.sample_prior_predictive(draws=200, random_seed=1,
                                        var_names=["sigma_config", "sigma_config_free"]).prior
    median = prior_arrays(m.priors, m.design.coefs, m.design.gpus).sigma_config["median"]
    # NaN where fixed (not a posterior quantity); the fixed value is a fixed quantity
    assert np.all(np.isnan(pr["sigma_config"].sel(coef="tp_allreduce").values))
    assert float(fixed_quantities(model)["sigma_config_fixed"][1]) == median
    sc = filled(pr["sigma_config"], median)
    # tp_allreduce has data only on the TP-2 Mixtral: fixed; decode_kv on all three: sampled
    np.testing.assert_allclose(sc.sel(coef="tp_allreduce").values, median)
    np.testing.assert_array_equal(sc.sel(coef="decode_kv").values,
                                  pr["sigma_config_free"].sel(coef="decode_kv").values)
    assert sc.sel(coef="decode_kv").std() > 0.01


def test_config_common_shift_moves_every_beta_term_of_a_configuration():
    import pytensor
    import pytensor.tensor as pt

    from bayes_latency.priors import load_priors

    obs, _ = make_observations(CONFIGS, n_iter=40, n_win=40, n_alpha=40, seed=2)
    assert "z_config_common" not in {v.name for v in LatencyModel().build(obs).free_RVs}
    pr = load_priors()
    pr.hierarchy["config_common"] = {"dist": "halfnormal", "sigma": 0.3}
    m = LatencyModel(priors=pr)
    model = m.build(obs)
    assert model.named_vars_to_dims["z_config_common"] == ("config",)
    (log_tp,) = model.replace_rvs_by_values([pt.log(model["theta_pop"])])
    zv = model.rvs_to_values[model["z_config_common"]]
    jac = pytensor.gradient.jacobian(log_tp[0], zv)  # (coef, config) of the first configuration
    f = pytensor.function(model.value_vars, jac, on_unused_input="ignore")
    J = f(**model.initial_point())
    beta = np.asarray([c in m.terms for c in m.design.coefs])
    np.testing.assert_allclose(J[beta, 0], 0.3)  # every beta term by sigma_config_common
    np.testing.assert_allclose(J[~beta], 0.0)  # the alpha terms not at all
    np.testing.assert_allclose(J[:, 1:], 0.0)  # nor the other configurations
