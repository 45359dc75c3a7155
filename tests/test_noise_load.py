"""The load-dependent noise scale (:mod:`bayes_latency.model.definition.likelihood`): the covariate, the
per-row scale, stage 1's derivatives and estimates of the growth, and the band coverage by load
of ``bayes-latency check`` (:func:`bayes_latency.checks.ppc.bands.coverage_by_load`). Small
synthetic tables; each test runs in about a second or less."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from obs_factory import make_observations
from test_summaries import COEFS, PRIOR, central_differences

from bayes_latency.errors import ConfigError
from bayes_latency.model.definition.likelihood import (
    LOAD_DEV_MAX,
    NoiseParams,
    load_refs,
    noise_load,
)
from bayes_latency.model.definition.noise import row_noise
from bayes_latency.model.definition.summaries import (
    _ConfigProblem,
    _initial,
    fit_rows,
    summarize_config,
)
from bayes_latency.physics.basis import ALPHA_TERMS, DEFAULT_TERMS
from bayes_latency.priors import load_priors


@pytest.fixture(scope="module")
def scale() -> np.ndarray:
    return np.asarray([load_priors().prior_median(c) for c in COEFS])


def _iterations(gamma: float, seed: int, n: int = 1500, sigma: float = 0.03) -> pd.DataFrame:
    """Fit rows of one configuration whose iterations' log-scale grows like ``batch^gamma``
    about the median batch (Student-t, 30 dof), on top of the factory's small noise."""
    obs, _ = make_observations([("llama-2-70b", "H100", 4)], n_iter=n, n_win=40, n_alpha=40,
                               seed=seed, sigma=0.002, nu=30.0)
    rows = fit_rows(obs)
    it = (rows["kind"] == "iteration").to_numpy()
    b = rows["x_per_request"].to_numpy(float)
    ref = np.median(np.log(b[it & (b > 0)]))
    rng = np.random.default_rng(seed + 100)
    s = sigma * np.exp(gamma * (np.log(np.maximum(b, 1.0)) - ref))
    noise = s * rng.standard_t(30.0, size=len(rows))
    rows.loc[it, "value_us"] = rows.loc[it, "value_us"].to_numpy() * np.exp(noise[it])
    return rows


def test_noise_load_is_the_log_load_of_one_step_of_the_load_kinds():
    rows = pd.DataFrame({
        "kind": ["iteration", "step_window", "benchmark_mean", "iteration", "alpha_arrival"],
        "aggregate": ["sum", "sum", "mean", "sum", "sum"],
        "n_steps": [1, 4, 128, 1, 1],
        "x_per_request": [32.0, 64.0, 8.0, 0.0, 0.0],
        "x_decode_kv": [10.0, 40.0, 5.0, 0.0, 0.0], "x_prefill_kv": [2.0, 0.0, 0.0, 0.0, 0.0]})
    b = noise_load(rows, "batch")
    np.testing.assert_allclose(b[:2], np.log([32.0, 16.0]))  # a window: per step
    assert np.isnan(b[2:]).all()  # benchmark means, no load, alpha rows
    np.testing.assert_allclose(noise_load(rows, "kv")[:2], np.log([12.0, 10.0]))
    assert np.isnan(noise_load(rows, "none")).all()
    with pytest.raises(ConfigError, match="unknown noise load 'queue'"):
        noise_load(rows, "queue")


def test_scale_grows_like_the_load_to_the_power_gamma_and_is_clipped():
    p = NoiseParams(sigma=0.02, tau=0.0, nu=5.0, gamma=0.5, load_ref=np.log(32.0), load="batch")
    s = p.scale(np.ones(4), np.log([32.0, 128.0, 8.0, np.nan]))
    np.testing.assert_allclose(s, [0.02, 0.04, 0.01, 0.02], rtol=1e-12)
    huge = NoiseParams(sigma=0.02, tau=0.0, nu=5.0, gamma=2.0, load_ref=0.0, load="batch")
    assert huge.scale(np.ones(1), np.array([10.0]))[0] == pytest.approx(0.02 * np.exp(LOAD_DEV_MAX))
    # the constant scale without a load, and the offset of multi-step rows uses the row's scale
    assert NoiseParams(0.02, 0.0, 5.0).scale(np.ones(2)).tolist() == [0.02, 0.02]
    assert p.log_offset(np.array([2.0]), np.log([128.0]))[0] == pytest.approx(0.5 * 0.04**2 * 0.5)


def test_row_noise_gives_each_row_the_scale_at_its_load():
    ref = np.log(40.0)
    noise = {"a": {"iteration": NoiseParams(0.02, 0.0, 5.0, 0.5, ref, "batch")}}
    rows = pd.DataFrame({"config_id": ["a", "a"], "kind": ["iteration"] * 2, "n_steps": [1, 1],
                         "x_per_request": [40.0, 160.0], "x_prefill_compute": [0.0, 0.0]})
    scale, nu, _ = row_noise(noise, rows)
    np.testing.assert_allclose(scale, [0.02, 0.04], rtol=1e-12)
    assert load_refs(rows, "batch") == {("a", "iteration"): pytest.approx(np.log(80.0))}


def test_derivatives_with_a_load_growth_match_finite_differences(scale):
    rows = _iterations(0.4, seed=1, n=300)
    p = _ConfigProblem(rows, COEFS, scale, "batch")
    assert ("iteration", "gamma") in p.layout and ("alpha_arrival", "gamma") not in p.layout
    u0, eta0 = _initial(p)
    rng = np.random.default_rng(2)
    u = np.where(p.active, u0 * np.exp(0.1 * rng.standard_normal(p.K)), 0.0)
    eta = eta0 + 0.2 * rng.standard_normal(len(eta0))
    f, g, H = p.derivatives(u, eta, 2)
    keep = np.concatenate([p.active, np.ones(len(eta), bool)])
    z = np.concatenate([u, eta])
    fd_g, fd_H = central_differences(p, z, keep)
    assert np.allclose(g[keep], fd_g[keep], rtol=1e-5, atol=1e-6 * np.abs(g[keep]).max())
    Hk = H[np.ix_(keep, keep)]
    assert np.allclose(Hk, fd_H[np.ix_(keep, keep)], rtol=1e-4, atol=1e-6 * np.abs(Hk).max())


@pytest.mark.parametrize("gamma", [0.0, 0.6])
def test_stage1_estimates_the_growth_of_the_scale_with_the_batch(scale, gamma):
    """Iterations whose scale grows like batch^0.6 (or not at all): the estimate is within 0.15,
    and the constant-scale fit's sigma lies between the scales of small and large batches."""
    rows = _iterations(gamma, seed=4)
    s = summarize_config(rows.assign(kind=rows["kind"]), COEFS, scale, PRIOR, load="batch")
    p = s.noise["iteration"]
    assert p.load == "batch" and s.converged
    assert abs(p.gamma - gamma) < 0.15, p.gamma
    assert 0.024 < p.sigma < 0.036, p.sigma
    flat = summarize_config(rows, COEFS, scale, PRIOR, load="none").noise["iteration"]
    assert flat.gamma == 0.0
    grow = summarize_config(rows, COEFS, scale, PRIOR, load="batch-growth").noise["iteration"]
    assert grow.gamma >= 0.0


def test_coverage_by_load_bins_steps_by_batch_and_part_of_the_run():
    from bayes_latency.checks.ppc.bands import coverage_by_load
    from bayes_latency.checks.run import load_coverage_markdown

    n = 90
    step_rows = pd.DataFrame({
        "config_id": "c", "kind": "iteration", "n_steps": 1, "experiment_id": "e",
        "step_first": np.arange(n), "x_per_request": np.r_[np.full(60, 20.0), np.full(30, 100.0)]})
    # the last third (the 100-request steps) outside its 90% band, the rest inside
    inside = np.r_[np.ones(60), np.zeros(30)]
    rows = pd.DataFrame({"in_50": inside, "in_90": inside, "q05_us": 0.9, "q95_us": 1.1,
                         "pred_median_us": 1.0})
    t = coverage_by_load(step_rows, rows)
    batch = t[t["by"] == "batch"].set_index("bin")
    assert batch.loc["(16.0, 32.0]", "coverage_90"] == 1.0
    assert batch.loc["(96.0, 128.0]", "coverage_90"] == 0.0
    part = t[t["by"] == "run part"].set_index("bin")
    assert list(part.index) == ["first third", "second third", "last third"]
    assert part["n"].tolist() == [30, 30, 30]
    assert part["coverage_90"].tolist() == [1.0, 1.0, 0.0]
    assert t["median_band_rel_width"].round(6).eq(0.2).all()
    md = load_coverage_markdown(t)
    assert "run part last third: 0.000 of 30" in md and "batch (96.0, 128.0]: 0.000 of 30" in md
    assert coverage_by_load(step_rows.drop(columns="x_per_request"), rows).empty


def test_cli_offers_every_noise_load_and_defaults_to_the_packages():
    from bayes_latency.cli.main import build_parser
    from bayes_latency.model.definition.likelihood import NOISE_LOADS

    p = build_parser()
    fit = next(a for a in p._subparsers._group_actions[0].choices["fit"]._actions
               if a.dest == "noise_load")
    assert sorted(fit.choices) == sorted(NOISE_LOADS)
    assert p.parse_args(["fit", "t", "--out", "p.nc"]).noise_load is None


def test_the_summaries_group_keeps_the_load_covariate_and_growth(scale, tmp_path):
    """Stage-1 noise with a load growth, written as the result's ``summaries`` group (through a
    netCDF file) and read back: the same noise table, the same per-row scales."""
    import xarray as xr

    from bayes_latency.model.definition.design import Design
    from bayes_latency.model.definition.noise import noise_from_result
    from bayes_latency.model.posterior.persistence import noise_dataset
    from bayes_latency.model.posterior.state import FitState

    rows = _iterations(0.5, seed=5, n=400)
    s = summarize_config(rows, COEFS, scale, PRIOR, load="batch")
    configs = pd.DataFrame({"model": ["llama-2-70b"], "gpu": ["H100-SXM"], "tp": [4]},
                           index=pd.Index([s.config_id], name="config_id"))
    state = FitState(priors=None, design=Design(COEFS, tuple(DEFAULT_TERMS), tuple(ALPHA_TERMS),
                                                configs),
                     method="laplace-hierarchy", variant="hierarchy", sampler="nutpie",
                     noise={s.config_id: s.noise}, noise_load="batch")
    ds = noise_dataset(state, rows)
    path = tmp_path / "summaries.nc"
    ds.to_netcdf(path)
    tree = xr.DataTree.from_dict({"summaries": xr.open_dataset(path).load(),
                                  "posterior": xr.Dataset()})
    back = noise_from_result(tree, "laplace-hierarchy")[s.config_id]
    assert back["iteration"].load == "batch" and back["iteration"].gamma > 0.3
    for k, p in s.noise.items():
        assert back[k].gamma == pytest.approx(p.gamma, abs=1e-12)
        assert back[k].load_ref == pytest.approx(p.load_ref, abs=1e-12)
    np.testing.assert_allclose(row_noise({s.config_id: back}, rows)[0],
                               row_noise({s.config_id: s.noise}, rows)[0], rtol=1e-12)


@pytest.mark.slow
def test_the_full_path_samples_the_growth_and_reads_it_back():
    """``method="full"``: ``noise_gamma (config, kind)`` is a free parameter of the row
    likelihood, and the noise table of the result carries its posterior mean."""
    from bayes_latency.model.estimator import LatencyModel

    obs, _ = make_observations([("llama-2-70b", "H100", 4)], n_iter=120, n_win=20, n_alpha=20,
                               seed=8, sigma=0.03, nu=10.0)
    m = LatencyModel(method="full", sampler="laplace", noise_load="batch").fit(
        obs, draws=50, chains=1, progress=False, prior_draws=0)
    post = m.result["posterior"]
    assert "noise_gamma" in post
    cfg = str(m.design.configs.index[0])
    p = m.noise(cfg, "iteration")
    assert p.load == "batch" and np.isfinite(p.load_ref) and p.load_ref > 0
    assert p.gamma == pytest.approx(float(post["noise_gamma"].sel(
        config=cfg, kind="iteration").mean()), rel=1e-6)


@pytest.mark.parametrize("gamma", [0.0, 0.6])
def test_the_growth_only_optimum_holds_gamma_at_zero_or_is_stationary(scale, gamma):
    """``batch-growth``: at stage 1's optimum the objective's gradient in each ``gamma`` is zero
    (interior) or points below the bound 0 where ``gamma`` sits on it."""
    from bayes_latency.model.definition.summaries import _Objective

    rows = _iterations(gamma, seed=6, n=600)
    s = summarize_config(rows, COEFS, scale, PRIOR, load="batch-growth")
    p = _ConfigProblem(rows, COEFS, scale, "batch-growth")
    u0, _ = _initial(p)
    eta = p.eta_of(s.noise)
    p.set_offset(eta)
    obj = _Objective(p, u0[p.active], PRIOR)
    _, g, H = obj(np.concatenate([(s.theta_hat / scale)[p.active], eta]), 2)
    na = int(p.active.sum())
    for j, (k, w) in enumerate(p.layout):
        if w != "gamma":
            continue
        gj, sd = g[na + j], 1.0 / np.sqrt(H[na + j, na + j])
        if eta[j] == 0.0:
            assert gj >= -1e-6 / sd, (k, gj)
        else:
            assert abs(gj) * sd < 1e-5, (k, gj)
    it = s.noise["iteration"].gamma
    assert 0.0 <= it < 0.15 if gamma == 0.0 else abs(it - gamma) < 0.15, it
