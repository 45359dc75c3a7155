"""Sampling past the requested draws until the gates pass (``fit(max_draws=...)``)."""

from __future__ import annotations

import numpy as np
import pytest

from bayes_latency.model.inference.sampler import Until, checkpoints, sample

pm = pytest.importorskip("pymc")
pytest.importorskip("nutpie")


@pytest.fixture(scope="module")
def model():
    with pm.Model(coords={"k": ["a", "b"]}) as m:
        mu = pm.Normal("mu", 0.0, 1.0, dims="k")
        pm.Normal("y", mu.sum(), 1.0, observed=np.array([0.3, -0.2, 0.5]))
    return m


def _run(model, draws, until=None, seed=3):
    timings: dict = {}
    dt = sample(model, "nutpie", draws=draws, tune=100, chains=2, seed=seed, progress=False,
                target_accept=0.9, adaptation="diag", timings=timings, until=until)
    return dt, timings


def test_checkpoints():
    assert checkpoints(2000, 8000) == [2000, 3000, 4000, 5000, 6000, 7000, 8000]
    assert checkpoints(100, 120) == [100, 120]
    assert checkpoints(3, 7) == [3, 4, 5, 6, 7]


def test_stops_at_the_first_checkpoint_that_does_not_continue(model):
    seen = []

    def check(post, div):
        seen.append(int(post.sizes["draw"]))
        assert post.sizes["chain"] == 2 and div >= 0
        return "pass" if post.sizes["draw"] >= 300 else "continue"

    dt, timings = _run(model, 200, Until(1000, check))
    assert seen == [200, 300]
    assert dt["posterior"].sizes["draw"] == 300
    assert dt["sample_stats"].sizes["draw"] == 300
    assert [e["decision"] for e in timings["extension"]] == ["continue", "pass"]
    # the draws kept are the first 300 of the same chains: a plain run of 300 draws
    plain, _ = _run(model, 300)
    np.testing.assert_array_equal(dt["posterior"]["mu"].values, plain["posterior"]["mu"].values)


def test_runs_to_max_draws_when_the_check_never_stops(model):
    dt, timings = _run(model, 100, Until(250, lambda post, div: "continue"))
    assert dt["posterior"].sizes["draw"] == 250
    assert [e["draws"] for e in timings["extension"]] == [100, 150, 200, 250]
    assert timings["extension"][-1]["decision"] == "max_draws"


def test_a_hopeless_check_stops_early(model):
    dt, timings = _run(model, 100, Until(1000, lambda post, div: "chains disagree"))
    assert dt["posterior"].sizes["draw"] == 100
    assert timings["extension"] == [{"draws": 100, "decision": "chains disagree",
                                     "check_s": timings["extension"][0]["check_s"]}]


def test_fit_samples_again_at_a_smaller_step_after_divergences(monkeypatch):
    """An extended fit that stopped on divergences is repeated once at RETRY_TARGET_ACCEPT, and
    the result records both attempts."""
    from obs_factory import CONFIGS, make_observations

    from bayes_latency.model import estimator
    from bayes_latency.model.inference import extension
    from bayes_latency.model.inference.sampler import RETRY_TARGET_ACCEPT

    obs, _ = make_observations(CONFIGS[:1], n_iter=40, n_win=20, n_alpha=10, seed=0)
    calls = []
    real_sample = extension.sample

    def fake(model, sampler, **kw):
        calls.append(kw["target_accept"])
        dt = real_sample(model, "laplace", **{**kw, "until": None})
        kw["timings"]["extension"] = [
            {"draws": kw["draws"], "decision": "1 divergent transitions: more draws do not "
             "remove them" if len(calls) == 1 else "pass", "check_s": 0.0}]
        return dt

    monkeypatch.setattr(extension, "sample", fake)
    m = estimator.LatencyModel().fit(obs, draws=20, tune=10, max_draws=80, prior_draws=0)
    assert calls == [0.99, RETRY_TARGET_ACCEPT]
    ext = m.convergence()["extension"]
    assert [(e["target_accept"], e["decision"][:12]) for e in ext] == [
        (0.99, "1 divergent "), (RETRY_TARGET_ACCEPT, "pass")]
    assert m._settings["target_accept"] == RETRY_TARGET_ACCEPT
