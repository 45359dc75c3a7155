"""The estimator: stage-1 summaries, one module-scoped real fit reused by many checks, save/load."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import yaml
from obs_factory import make_observations

from bayes_latency.cli.fit import fit_command
from bayes_latency.errors import ConfigError, ConvergenceError, ModelMismatchError
from bayes_latency.model.definition.likelihood import row_loglik
from bayes_latency.model.definition.population import fixed_quantities
from bayes_latency.model.definition.summaries import feature_columns, fit_rows, summarize_config
from bayes_latency.model.estimator import LatencyModel
from bayes_latency.physics.basis import ALPHA_TERMS, DEFAULT_TERMS
from bayes_latency.priors import load_priors

CONFIGS = [("llama-2-7b", "H100", 1), ("llama-2-7b", "A100", 1), ("llama-2-70b", "H100", 4),
           ("llama-2-70b", "A100", 4), ("mixtral-8x7b", "H100", 2), ("mixtral-8x7b", "A100", 4)]
COEFS = tuple(DEFAULT_TERMS) + tuple(ALPHA_TERMS)


@pytest.fixture(scope="module")
def data():
    return make_observations(CONFIGS, n_iter=300, n_win=300, n_alpha=150, seed=3)


@pytest.fixture(scope="module")
def fitted(data):
    obs, _ = data
    return LatencyModel().fit(obs, draws=1000, tune=600, chains=2, seed=1, max_draws=None)


# ---------------------------------------------------------------- stage 1
def test_summary_recovers_identified_terms_and_is_quadratic():
    obs, truth = make_observations([("llama-2-70b", "H100", 4)], n_iter=3000, n_win=0, n_alpha=400, seed=5)
    rows = fit_rows(obs)
    scale = np.asarray([load_priors().prior_median(c) for c in COEFS])
    s = summarize_config(rows, COEFS, scale)
    assert s.converged
    true = np.asarray([truth[s.config_id][c] for c in COEFS])
    for name in ("decode_kv", "alpha_arrival", "alpha_per_token"):
        k = COEFS.index(name)
        assert abs(s.theta_hat[k] / true[k] - 1) < 0.05, name
    # terms with no feature in this config carry no information
    assert not s.active[COEFS.index("moe_layer")]
    assert np.all(s.info[COEFS.index("moe_layer")] == 0)
    # the quadratic stand-in tracks the exact log-likelihood for small moves along identified terms
    X = rows[feature_columns(COEFS)].to_numpy(float)
    log_y = np.log(rows["value_us"].to_numpy(float))
    scale_r = np.array([s.noise[k].scale(n) for k, n in zip(rows["kind"], rows["n_steps"], strict=True)]).ravel()
    nu_r = np.array([s.noise[k].nu for k in rows["kind"]])
    base = row_loglik(log_y, X, s.theta_hat, scale_r, nu_r).sum()
    k = COEFS.index("decode_kv")
    sd = 1 / np.sqrt(s.info[k, k])
    step = np.zeros(len(COEFS))
    step[k] = sd
    exact = row_loglik(log_y, X, s.theta_hat + step, scale_r, nu_r).sum() - base
    approx = s.quadratic(s.theta_hat + step) - s.quadratic(s.theta_hat)
    assert exact == pytest.approx(approx, abs=0.1)


def test_fit_rows_counts_every_drop():
    obs, _ = make_observations(CONFIGS[:1], n_iter=50, n_win=10, n_alpha=10)
    obs.loc[0, "value_us"] = np.nan
    obs.loc[1, "value_us"] = -3.0
    obs.loc[2, [c for c in obs.columns if c.startswith("x_")]] = 0.0
    obs.loc[3, "role"] = "ppc"
    from bayes_latency.data.report import IngestReport

    rep = IngestReport()
    rows = fit_rows(obs, rep)
    assert len(rows) == len(obs) - 4
    assert rep.dropped["nonpositive_or_nan_value"] == 2
    assert rep.dropped["invalid_or_zero_features"] == 1
    assert rep.dropped["role_not_fitted"] == 1


# ---------------------------------------------------------------- the fitted model
def test_result_structure_and_attrs(fitted):
    r = fitted.result
    post = r["posterior"]
    assert set(post["beta"].dims) == {"chain", "draw", "config", "term"}
    assert list(post["term"].values) == list(DEFAULT_TERMS)
    assert list(post["alpha_term"].values) == list(ALPHA_TERMS)
    for key in ("bayes_latency_version", "model_version", "priors_hash", "data_hash", "method"):
        assert r.attrs[key]
    assert r.attrs["approximate"] == "false"
    ll = r["log_likelihood"]  # every fitted row, or a labelled subsample above the budget
    from bayes_latency.model.posterior.groups import FILE_MAX_SAMPLES, MAX_PREDICTIVE_VALUES

    # the budget counts the samples a saved file keeps
    n = len(fitted._rows)
    S = min(post.sizes["chain"] * post.sizes["draw"], FILE_MAX_SAMPLES)
    assert int(ll.attrs["n_rows_fitted"]) == n
    assert ll["log_duration"].sizes["obs"] == min(n, MAX_PREDICTIVE_VALUES // S)
    assert ll.attrs["subsample"] == ("true" if n * S > MAX_PREDICTIVE_VALUES else "false")


def test_converges_on_small_fleet(fitted):
    c = fitted.convergence()
    # divergences at sampler seeds 1 / 2 / 3: 3 / 2 / 1 (sum-only groups, fixed two-level scales;
    # max R-hat 1.0156 / 1.0049 / 1.0136, bulk ESS 301 / 396 / 324), before 2 / 2 / 1 (1.0075 /
    # 1.0135 / 1.0209, ESS 184 / 213 / 133)
    assert c["divergences"] <= 3, c
    assert c["max_rhat"] < 1.03, c
    assert c["min_ess_bulk"] > 100, c


def test_identified_coefficients_cover_truth(fitted, data):
    _, truth = data
    post = fitted.result["posterior"]
    hits, total = 0, 0
    for cid in truth:
        for t in ("prefill_compute", "decode_kv", "tp_allreduce"):
            if t == "tp_allreduce" and cid.endswith("tp1"):
                continue
            q = post["beta"].sel(config=cid, term=t).quantile([0.025, 0.975], dim=("chain", "draw")).values
            hits += q[0] <= truth[cid][t] <= q[1]
            total += 1
    assert hits >= total - 1, (hits, total)


def test_unseen_configuration_has_wider_bands(fitted):
    seen = fitted.coefficients("llama-2-70b", "H100", 4)
    unseen = fitted.coefficients("llama-3.1-8b", "H100", 1)
    assert unseen.attrs["unseen_levels"].split(",") == ["model", "config"]
    w_seen = np.log(seen["beta"].sel(term="decode_kv")).std()
    w_unseen = np.log(unseen["beta"].sel(term="decode_kv")).std()
    assert float(w_unseen) > 2 * float(w_seen)
    assert np.all(np.isfinite(unseen["beta"].values)) and np.all(unseen["beta"].values >= 0)


def test_unseen_model_effect_includes_the_uncertainty_of_the_zero_sum_mean(fitted):
    """A new model lies N(0, sigma^2 (1 + 1/n)) from the fitted mean of n zero-sum effects."""
    from bayes_latency.model.definition.hierarchy import prior_arrays

    gpu = fitted._canonical("llama-2-7b", "H100")[1]
    ds = fitted.coefficients("llama-3.1-8b", "H100", 1)
    post = fitted._post().stack(sample=("chain", "draw"))  # with the fixed quantities
    n_models = post.sizes["llm"]  # the LLM factor's levels
    k = "decode_kv"
    offset = prior_arrays(fitted.priors, fitted.coefs, [gpu]).gpu_offset[0][fitted.coefs.index(k)]
    base = (post["mu"].sel(coef=k) + offset + post["eff_gpu"].sel(gpu=gpu, coef=k)
            + post["eff_tp"].sel(tp=1, coef=k)).values
    resid = np.log(ds["beta"].sel(term=k).values) - base
    sig2 = float((post["sigma_model"].sel(coef=k) ** 2).mean())
    sc2 = float((post["sigma_config"].sel(coef=k) ** 2).mean())
    expected = sig2 * (1 + 1 / n_models) + sc2
    without = sig2 + sc2  # the spread if a new level were drawn N(0, sigma^2)
    assert n_models == 3 and without / expected < 0.86, (sig2, sc2)
    assert 0.88 < resid.var() / expected < 1.12, (resid.var(), expected, without)


def test_unknown_architecture_or_gpu_is_a_config_error(fitted):
    with pytest.raises(ConfigError):
        fitted.coefficients("not-a-model", "H100", 1)
    with pytest.raises(ConfigError):
        fitted.coefficients("llama-2-7b", "TPUv9", 1)


def test_predict_and_posterior_predictive(fitted, data):
    obs, _ = data
    rows = obs[obs["kind"] == "iteration"].head(300)
    mu = fitted.predict(rows, n_draws=100)
    assert mu.dims == ("sample", "obs") and mu.shape == (100, 300)
    med = np.median(mu.values, axis=0)
    ape = np.abs(med / rows["value_us"].to_numpy() - 1)
    assert np.median(ape) < 0.1
    y = fitted.sample_posterior_predictive(rows, n_draws=400)
    lo, hi = np.quantile(y.values, [0.05, 0.95], axis=0)
    cover = np.mean((rows["value_us"].to_numpy() >= lo) & (rows["value_us"].to_numpy() <= hi))
    assert 0.8 <= cover <= 0.98


def test_save_load_roundtrip_and_mismatch(fitted, tmp_path):
    p = fitted.save(tmp_path / "post.nc", thin=1)  # every draw (float32 on the file)
    m2 = LatencyModel.load(p)
    a = fitted.coefficients("llama-2-7b", "H100", 1)["beta"].mean("sample")
    b = m2.coefficients("llama-2-7b", "H100", 1)["beta"].mean("sample")
    xr.testing.assert_allclose(a, b)
    # other priors -> refused
    other = tmp_path / "priors.yaml"
    raw = yaml.safe_load((Path(__file__).parents[1] / "priors" / "default.yaml").read_text())
    raw["terms"]["per_step"]["median"] = 999.0
    other.write_text(yaml.safe_dump(raw))
    with pytest.raises(ModelMismatchError, match="priors"):
        LatencyModel.load(p, priors=other)
    # another model version -> refused
    fitted.result.attrs["model_version"] = "0-old"
    try:
        fitted.save(tmp_path / "old.nc")
    finally:
        from bayes_latency import MODEL_VERSION

        fitted.result.attrs["model_version"] = MODEL_VERSION
    with pytest.raises(ModelMismatchError, match="model version"):
        LatencyModel.load(tmp_path / "old.nc")


def test_fit_command_fails_loudly_when_not_converged(data, tmp_path):
    obs, _ = data
    obs.to_parquet(tmp_path / "observations.parquet")
    args = argparse.Namespace(tables=str(tmp_path), out=str(tmp_path / "p.nc"), method="laplace-hierarchy",
                              sampler="nutpie", priors=None, draws=20, tune=20, chains=2, seed=0,
                              max_rhat=1.01)
    with pytest.raises(ConvergenceError):
        fit_command(args)
    from bayes_latency.cli.main import main

    code = main(["fit", str(tmp_path), "--out", str(tmp_path / "p2.nc"), "--draws", "20", "--tune", "20"])
    assert code == 1


def test_missing_feature_columns_is_a_clear_error(data):
    obs, _ = data
    with pytest.raises(ConfigError, match="x_per_step"):
        LatencyModel().build(obs.drop(columns=["x_per_step"]))


def test_approximate_sampler_is_labelled(data):
    obs, _ = data
    small = obs[obs["config_id"].isin(pd.unique(obs["config_id"])[:2])]
    m = LatencyModel(sampler="laplace").fit(small, draws=200, chains=2)
    assert m.result.attrs["approximate"] == "true"
    c = m.convergence()
    assert c["approximate"] and c["passed"]


def test_pooled_effect_scales_option(data, tmp_path):
    raw = yaml.safe_load(Path(load_priors().path).read_text())
    raw["hierarchy"]["model"]["spread"] = 0.5
    f = tmp_path / "pooled.yaml"
    f.write_text(yaml.safe_dump(raw))
    obs, _ = data
    # three models, two GPUs, three TP degrees: the model's scales are sampled (pooled), the
    # two GPUs' fixed (hierarchy.MIN_LEVELS_FOR_SCALE), the TP degrees' sampled independently
    model = LatencyModel(priors=f).build(obs[obs["config_id"].isin(pd.unique(obs["config_id"])[:5])])
    names = {v.name for v in model.free_RVs}
    assert {"tau_model", "zeta_model", "sigma_tp"} <= names and "sigma_model" not in names
    assert "sigma_model" in {v.name for v in model.deterministics}
    assert "sigma_gpu" in fixed_quantities(model)  # constant: constant_data, not the posterior


def test_factor_without_terms_option(data, tmp_path):
    """``hierarchy.tp.without``: no TP effect on those terms, in the model (prior draws of
    ``eff_tp``) and for a TP degree the fit never saw (:func:`unseen_config_theta`)."""
    import pymc as pm

    from bayes_latency.model.definition.design import prior_arrays
    from bayes_latency.model.posterior.unseen import unseen_config_theta

    raw = yaml.safe_load(Path(load_priors().path).read_text())
    raw["hierarchy"]["tp"]["without"] = ["weight_loading"]
    f = tmp_path / "tp_without.yaml"
    f.write_text(yaml.safe_dump(raw))
    obs, _ = data
    m = LatencyModel(priors=f)
    model = m.build(obs)
    k = list(m.coefs).index("weight_loading")
    # no TP effect on weight_loading: fixed (NaN in the posterior, population.NAN_FIXED)
    eff = pm.draw(model["eff_tp"], draws=50, random_seed=0)  # (draw, tp, coef)
    assert eff.shape[1] == 3 and np.all(np.isnan(eff[:, :, k]))
    assert np.all(np.abs(np.delete(eff, k, axis=2)).max(axis=(0, 1)) > 0)
    # an unseen TP degree: no draw on weight_loading, one on every other term
    K, S = len(m.coefs), 400  # laid out as the stacked posterior: (..., coef, sample)
    post = xr.Dataset({
        "mu": (("coef", "sample"), np.zeros((K, S))),
        "eff_model": (("llm", "coef", "sample"), np.zeros((1, K, S))),
        "eff_gpu": (("gpu", "coef", "sample"), np.zeros((1, K, S))),
        "eff_tp": (("tp", "coef", "sample"), np.zeros((1, K, S))),
        "sigma_tp": (("coef", "sample"), np.full((K, S), 0.3)),
        "sigma_config": (("coef", "sample"), np.full((K, S), 1e-9)),
    }, coords={"coef": list(m.coefs), "llm": ["llama-2-7b"], "gpu": ["H100"], "tp": [1]})
    pa = prior_arrays(m.priors, m.coefs, ["H100"])
    theta, unseen = unseen_config_theta(post, pa, "llama-2-7b", "H100", 8, "vllm",
                                        np.random.default_rng(0), design=m.design,
                                        variant=m.variant)
    logt = np.log(theta)
    assert unseen == ["tp", "config"]
    assert np.std(logt[:, k]) < 1e-6 and np.std(np.delete(logt, k, axis=1), axis=0).min() > 0.2


def test_stack_level_only_when_stacks_mix(data):
    obs, _ = data
    two = obs[obs["config_id"].isin(pd.unique(obs["config_id"])[:2])].copy()
    m = LatencyModel()
    assert "z_stack" not in {v.name for v in m.build(two).free_RVs}
    bench = two[two["config_id"] == two["config_id"].iloc[0]].copy()
    bench["stack"] = "splitwise"
    bench["config_id"] = bench["config_id"] + "|splitwise"
    mixed = pd.concat([two.assign(stack="vllm"), bench], ignore_index=True)
    model = m.build(mixed)
    free = {v.name for v in model.free_RVs}
    # two stacks: per-term departures and a shift common to every term, at fixed scales
    assert {"z_stack", "z_stack_common"} <= free and "sigma_stack" not in free
    assert "eff_stack" in {v.name for v in model.deterministics}
    assert {"sigma_stack", "sigma_stack_common"} <= set(fixed_quantities(model))
    assert m.design.stacks == ["splitwise", "vllm"] and len(m.design.configs) == 3


def test_fit_hints_name_confounded_terms(fitted):
    conv = fitted.convergence({"max_rhat": 1.0, "min_ess_bulk": 1e9})
    assert not conv["passed"] and conv["hints"]
    assert conv["hints"][0].startswith("coefficients failing the gates")
    groups = fitted.identifiability.confounded_everywhere
    assert any({"per_layer", "per_step"} <= set(g) for g in groups), groups  # constant per step
    assert any("no configuration of the data separates" in h for h in conv["hints"])


def test_hints_after_load_still_name_confounded_terms(fitted, tmp_path):
    loaded = LatencyModel.load(fitted.save(tmp_path / "p.nc"))
    assert loaded.identifiability.to_dict() == fitted.identifiability.to_dict()
    settings = json.loads(loaded.result.attrs["sampler_settings"])
    assert settings["adaptation"] == "low_rank" and settings["draws"] == 1000
    conv = loaded.convergence({"max_rhat": 1.0, "min_ess_bulk": 1e9})
    assert any("no configuration of the data separates" in h for h in conv["hints"])


def test_fit_command_takes_terms(data, tmp_path):
    obs, _ = data
    obs.to_parquet(tmp_path / "observations.parquet")
    from bayes_latency.cli.main import main

    code = main(["fit", str(tmp_path), "--out", str(tmp_path / "p.nc"), "--draws", "20", "--tune", "20",
                 "--terms", "prefill_compute,decode_kv,weight_loading,per_request",
                 "--target-accept", "0.9"])
    assert code == 1  # 20 draws cannot pass the gates, but the file is written with 4 terms
    assert list(LatencyModel.load(tmp_path / "p.nc").terms) == [
        "prefill_compute", "decode_kv", "weight_loading", "per_request"]


def test_fit_rows_checks_only_the_fitted_terms():
    obs, _ = make_observations(CONFIGS[:1], n_iter=20, n_win=0, n_alpha=5)
    beta_cols = [f"x_{t}" for t in DEFAULT_TERMS]
    obs.loc[0, beta_cols] = 0.0
    obs.loc[0, "x_decode_compute"] = 5.0  # non-zero only in a term the fit leaves out
    terms = [t for t in DEFAULT_TERMS if t != "decode_compute"]
    from bayes_latency.data.report import IngestReport

    rep = IngestReport()
    rows = fit_rows(obs, rep, terms + list(ALPHA_TERMS))
    assert 0 not in rows.index and rep.dropped["invalid_or_zero_features"] == 1
    assert 0 in fit_rows(obs).index


def test_summary_with_fixed_noise_keeps_it_and_matches_the_free_fit():
    obs, _ = make_observations([("llama-2-70b", "H100", 4)], n_iter=400, n_win=200, n_alpha=100, seed=6)
    rows = fit_rows(obs)
    scale = np.asarray([load_priors().prior_median(c) for c in COEFS])
    free = summarize_config(rows, COEFS, scale)
    fixed = summarize_config(rows, COEFS, scale, fixed_noise=free.noise)
    for k, p in free.noise.items():
        assert fixed.noise[k].sigma == pytest.approx(p.sigma) and fixed.noise[k].nu == pytest.approx(p.nu)
    k = COEFS.index("decode_kv")
    assert fixed.theta_hat[k] == pytest.approx(free.theta_hat[k], rel=1e-3)
    # nothing is profiled out: the information is at least the profiled one along decode_kv
    assert fixed.info[k, k] >= free.info[k, k] * (1 - 1e-6)


def test_full_path_fits_the_same_noise_model_as_stage_1():
    """The full-data reference has sigma, tau and the Student-t dof per (configuration, kind),
    the parameters stage 1 profiles per configuration; a dof shared per kind made the two paths
    different models (beta means up to 0.12 posterior sd apart in benchmarks/fast_vs_full.py)."""
    obs, _ = make_observations(CONFIGS[:2], n_iter=30, n_win=30, n_alpha=10, seed=4)
    model = LatencyModel(method="full").build(obs)
    for name in ("noise_sigma", "noise_tau", "noise_nu"):
        assert model.named_vars_to_dims[name] == ("config", "kind"), name


@pytest.mark.parametrize("sampler", ["pymc", "numpyro"])
def test_other_nuts_samplers_fit_the_same_model(sampler):
    """PyMC's own NUTS and numpyro (selectable instead of nutpie) run the same model and give a
    posterior in the same layout, labelled with the sampler; a well-measured coefficient lands
    on its truth."""
    obs, truth = make_observations(CONFIGS[:2], n_iter=60, n_win=60, n_alpha=30, seed=5)
    m = LatencyModel(sampler=sampler).fit(obs, draws=100, tune=100, chains=2, seed=1,
                                          max_draws=None)
    post = m.result["posterior"]
    assert m.result.attrs["sampler"] == sampler and m.result.attrs["approximate"] == "false"
    assert post.sizes["chain"] == 2 and post.sizes["draw"] == 100
    assert set(post["beta"].dims) == {"chain", "draw", "config", "term"}
    assert float(post["beta"].min()) >= 0
    for cid in m.design.configs.index:
        est = float(post["alpha"].sel(config=cid, alpha_term="alpha_arrival").mean())
        assert est == pytest.approx(truth[cid]["alpha_arrival"], rel=0.1), cid
    assert "max_rhat" in m.convergence()
