"""The fit path's speed measures: deterministics after sampling, Numba's LLVM level while compiling."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest
import xarray as xr

from bayes_latency.model.inference import compiled, sampler
from bayes_latency.model.inference.compiled import _numba_opt
from bayes_latency.model.posterior.deterministics import _with_deterministics


def _model() -> pm.Model:
    with pm.Model(coords={"coef": ["a", "b", "c"], "config": ["x", "y"]}) as model:
        z = pm.Normal("z", 0.0, 1.0, dims="coef")
        s = pm.HalfNormal("s", 1.0)
        idx = np.array([0, 2])
        pm.Deterministic("theta", pt.exp(z[None, :] * s + np.arange(2.0)[:, None]), dims=("config", "coef"))
        pm.Deterministic("picked", z[idx] + s, dims="config")
        pm.Deterministic("fixed", pt.as_tensor_variable(np.full(3, 0.5)), dims="coef")
    return model


def test_deterministics_after_sampling_match_pymc():
    model = _model()
    rng = np.random.default_rng(0)
    C, D = 2, 7
    post = xr.Dataset({"z": (("chain", "draw", "coef"), rng.normal(size=(C, D, 3))),
                       "s": (("chain", "draw"), rng.uniform(0.5, 2.0, size=(C, D)))},
                      coords={"chain": [0, 1], "draw": np.arange(D), "coef": ["a", "b", "c"]})
    out = _with_deterministics(model, post)
    ref = pm.compute_deterministics(post, model=model, progressbar=False,
                                     compile_kwargs={"mode": "FAST_COMPILE"})
    for v in ("theta", "picked", "fixed"):
        assert out[v].dims == ("chain", "draw", *model.named_vars_to_dims[v])
        np.testing.assert_allclose(out[v].values, ref[v].transpose(*out[v].dims).values, rtol=1e-12)
    assert list(out["config"].values) == ["x", "y"]  # coordinates of dims no free variable has
    np.testing.assert_array_equal(out["z"].values, post["z"].values)


def test_free_variables_and_deterministics_from_the_unconstrained_draws():
    """nutpie's trace holds the value variables (``s_log__``): the free variables come back
    from them, in the model's order, and the value variables go."""
    model = _model()
    rng = np.random.default_rng(1)
    C, D = 2, 5
    coords = {"chain": [0, 1], "draw": np.arange(D)}
    z, log_s = rng.normal(size=(C, D, 3)), rng.normal(size=(C, D))
    uc = xr.Dataset({"z": (("chain", "draw", "coef"), z), "s_log__": (("chain", "draw"), log_s)},
                    coords={**coords, "coef": ["a", "b", "c"]})
    out = _with_deterministics(model, uc)
    ref = _with_deterministics(model, xr.Dataset(
        {"z": (("chain", "draw", "coef"), z), "s": (("chain", "draw"), np.exp(log_s))},
        coords={**coords, "coef": ["a", "b", "c"]}))
    assert list(out.data_vars) == ["z", "s", "theta", "picked", "fixed"]
    for v in out.data_vars:
        assert out[v].dims == ref[v].dims
        np.testing.assert_allclose(out[v].values, ref[v].values, rtol=1e-14)
    with pytest.raises(KeyError, match="s_log__"):
        _with_deterministics(model, uc.drop_vars("s_log__"))


def test_numba_opt_is_scoped_and_yields_to_the_environment(monkeypatch):
    from numba.core import config

    before = int(config.OPT)
    monkeypatch.delenv("NUMBA_OPT", raising=False)
    with _numba_opt(compiled.NUMBA_OPT):
        assert int(config.OPT) == compiled.NUMBA_OPT
    assert int(config.OPT) == before
    monkeypatch.setenv("NUMBA_OPT", "2")
    with _numba_opt(0):
        assert int(config.OPT) == before
    with pytest.raises(RuntimeError), _numba_opt(0):
        raise RuntimeError
    assert int(config.OPT) == before


def _data_model(y: np.ndarray, prior_sd: float = 1.0) -> pm.Model:
    with pm.Model(coords={"obs": np.arange(len(y))}) as model:
        data = pm.Data("y", y)
        mu = pm.Normal("mu", 0.0, prior_sd)
        s = pm.HalfNormal("s", 1.0)
        pm.Potential("lik", pm.logp(pm.Normal.dist(mu, s), data).sum())
    return model


def _draws(model: pm.Model) -> np.ndarray:
    timings: dict[str, float] = {}
    dt = sampler.sample(model, "nutpie", draws=30, tune=30, chains=1, seed=3, progress=False,
                        target_accept=0.9, adaptation="diag", timings=timings)
    return dt["posterior"]["mu"].values


def test_compiled_model_is_reused_for_new_data_with_the_draws_of_a_fresh_compile(monkeypatch):
    monkeypatch.setattr(compiled, "_COMPILED", [])
    a, b = _data_model(np.array([0.1, 0.4, -0.2])), _data_model(np.array([1.1, 1.5, 0.9]))
    assert compiled._same_structure(a, b)
    assert not compiled._same_structure(a, _data_model(np.array([0.1, 0.4, -0.2]), prior_sd=2.0))
    assert not compiled._same_structure(a, _data_model(np.array([0.1, 0.4])))  # other coords
    _draws(a)
    first = compiled._COMPILED[0][1]
    reused = _draws(b)
    assert len(compiled._COMPILED) == 1 and compiled._COMPILED[0][1] is first  # not recompiled
    compiled._COMPILED.clear()
    fresh = _draws(b)
    np.testing.assert_array_equal(reused, fresh)
    assert abs(reused.mean() - 1.17) < 0.5  # b's data, not a's


def test_latency_models_of_new_values_share_their_structure():
    """A calibration's refits (same configurations, new values) compile once: the stage-1
    summaries are data, everything else the same graph."""
    from obs_factory import make_observations

    from bayes_latency.model.definition.hierarchy import SUMMARY_DATA
    from bayes_latency.model.estimator import LatencyModel

    configs = [("llama-2-7b", "H100", 1), ("llama-2-70b", "H100", 4), ("llama-2-70b", "A100", 4)]
    obs, _ = make_observations(configs, n_iter=120, n_win=60, n_alpha=40, seed=3)
    moved = obs.assign(value_us=obs["value_us"] * np.where(np.arange(len(obs)) % 3 == 0, 1.03, 1.0))
    a, b = LatencyModel().build(obs), LatencyModel().build(moved)
    assert all(n in a.named_vars for n in SUMMARY_DATA)
    assert not np.array_equal(a["summary_theta_hat"].get_value(), b["summary_theta_hat"].get_value())
    assert compiled._same_structure(a, b)
    fewer = obs[obs["config_id"] != obs["config_id"].iloc[0]]
    assert not compiled._same_structure(a, LatencyModel().build(fewer))


def test_posterior_only_fits_skip_the_arviz_groups():
    from obs_factory import make_observations

    from bayes_latency.model.estimator import LatencyModel, posterior_only

    obs, _ = make_observations([("llama-2-7b", "H100", 1), ("llama-2-70b", "H100", 4)],
                               n_iter=80, n_win=40, n_alpha=30, seed=4)
    with posterior_only():
        m = LatencyModel(sampler="laplace").fit(obs, draws=20, chains=2, prior_draws=10)
    assert "posterior" in m.result.children and "summaries" in m.result.children
    assert not {"log_likelihood", "posterior_predictive", "prior", "log_prior"} & set(m.result.children)
    assert m.result.attrs["arviz_groups"].startswith("skipped")
    m = LatencyModel(sampler="laplace").fit(obs, draws=20, chains=2, prior_draws=10)
    assert {"log_likelihood", "posterior_predictive", "prior", "log_prior"} <= set(m.result.children)


def test_c_callbacks_without_shape_errors_give_nutpies_draws(monkeypatch):
    import contextlib

    import nutpie.compile_pymc as ncp

    orig = ncp._make_c_logp_func
    with compiled._c_callbacks_without_shape_errors():
        assert ncp._make_c_logp_func is compiled._c_logp_func  # this nutpie's builders are swapped
        assert ncp._make_c_expand_func is compiled._c_expand_func
    assert ncp._make_c_logp_func is orig
    monkeypatch.setattr(compiled, "_COMPILED", [])
    ours = _draws(_data_model(np.array([0.1, 0.4, -0.2])))
    compiled._COMPILED.clear()
    monkeypatch.setattr(compiled, "_c_callbacks_without_shape_errors", contextlib.nullcontext)
    np.testing.assert_array_equal(ours, _draws(_data_model(np.array([0.1, 0.4, -0.2]))))


def test_c_callbacks_left_alone_for_other_builders(monkeypatch):
    import nutpie.compile_pymc as ncp

    def other(n_dim, logp_fn, user_data):  # noqa: ANN001, ANN202 - another nutpie's signature
        return None

    monkeypatch.setattr(ncp, "_make_c_logp_func", other)
    with compiled._c_callbacks_without_shape_errors():
        assert ncp._make_c_logp_func is other
