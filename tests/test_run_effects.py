"""Run effects (:mod:`bayes_latency.model.definition.runs`, stage 1 and 2, and
:mod:`bayes_latency.model.posterior.shifts`): a run's common shift is estimated and profiled,
its scale is fitted from the contrasts, and predictions tell a fitted run from a new one."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from obs_factory import COEFS, make_observations, prior_scale
from obs_factory import STAGE1_PRIOR as PRIOR

from bayes_latency.model.definition import runs
from bayes_latency.model.definition.summaries import (
    _ConfigProblem,
    fit_rows,
    shift_moments,
    summarize,
    summarize_config,
)
from bayes_latency.model.posterior.persistence import run_effects_dataset
from bayes_latency.model.posterior.shifts import FITTED_RUN, NEW_RUN, RunTable, row_shifts

#: The true log shifts of the three runs of the test configuration.
SHIFTS = {"run-a": 0.06, "run-b": 0.0, "run-c": -0.06}


@pytest.fixture(scope="module")
def scale() -> np.ndarray:
    return prior_scale()


@pytest.fixture(scope="module")
def three_runs() -> pd.DataFrame:
    """One configuration's rows split into three runs, each run's values times exp(shift)."""
    obs, _ = make_observations([("llama-2-70b", "H100", 4)], n_iter=600, n_win=60, n_alpha=60,
                               seed=3, sigma=0.03)
    rows = fit_rows(obs).reset_index(drop=True)
    names = np.asarray(list(SHIFTS))[np.arange(len(rows)) % 3]
    rows["experiment_id"] = names
    rows["value_us"] = rows["value_us"] * np.exp([SHIFTS[n] for n in names])
    return rows


def test_contrast_basis_is_orthonormal_and_sums_to_zero() -> None:
    for n in (2, 3, 7):
        B = runs.contrast_basis(n)
        assert B.shape == (n, n - 1)
        np.testing.assert_allclose(B.T @ B, np.eye(n - 1), atol=1e-12)
        np.testing.assert_allclose(B.sum(axis=0), 0.0, atol=1e-12)
    assert runs.contrast_basis(1).shape == (1, 0)


def test_run_keys_prefer_run_id_and_windows_need_steps() -> None:
    rows = pd.DataFrame({"experiment_id": ["e1", "e1/s0", "e2", "e3"],
                         "run_id": [None, "r1", "", None],
                         "kind": ["iteration", "workload_ttft", "iteration", "benchmark_mean"],
                         "step_first": [4100, np.nan, 10, 5]})
    assert list(runs.run_keys(rows)) == ["e1", "r1", "e2", "e3"]
    w = runs.window_keys(rows)
    assert w[0] == f"e1#w{4100 // runs.WINDOW_STEPS}" and w[2] == "e2#w0"
    assert w[1] == "" and w[3] == ""  # no step index, or a kind without steps


def test_shift_design_rows_and_small_windows() -> None:
    n = runs.MIN_WINDOW_ROWS
    rows = pd.DataFrame({"experiment_id": ["a"] * (2 * n) + ["b"] * (n + 1),
                         "kind": "iteration",
                         "step_first": [0] * n + [runs.WINDOW_STEPS] * n + [0] * n + [9 * 10**6]})
    sd = runs.shift_design(rows, windows=True)
    assert sd.runs == ("a", "b")
    # run b's second window has one row: no window of its own; run b keeps one window (no contrast)
    assert len(sd.windows) == 3 and list(sd.contrast_level) == [0, 1]
    np.testing.assert_allclose(sd.B.sum(axis=0)[:1], 0.0, atol=1e-12)
    w = np.array([0.1, -0.2])
    shifts = sd.R @ w
    assert np.isclose(shifts[0] - shifts[-1], 2 * 0.1 / np.sqrt(2) + (-0.2) / np.sqrt(2))
    off = runs.shift_design(rows)
    assert off.n_contrasts == (1 if not runs.WINDOWS else 2)


def test_shift_derivatives_match_finite_differences(three_runs: pd.DataFrame,
                                                    scale: np.ndarray) -> None:
    sd = runs.shift_design(three_runs)
    p = _ConfigProblem(three_runs, COEFS, scale, "none", shift=sd.R)
    assert p.nw == 2
    rng = np.random.default_rng(0)
    u = np.concatenate([np.where(p.active, 1.0 + 0.1 * rng.random(p.K), 0.0), [0.03, -0.02]])
    eta = np.zeros(len(p.layout)) - 2.0
    f, g, H = p.derivatives(u, eta, 2)
    for j in range(p.K, p.P + 2):
        h = 1e-6
        up, um = u.copy(), u.copy()
        ep, em = eta.copy(), eta.copy()
        if j < p.P:
            up[j] += h
            um[j] -= h
        else:
            ep[j - p.P] += h
            em[j - p.P] -= h
        fp, gp, _ = p.derivatives(up, ep, 1)
        fm, gm, _ = p.derivatives(um, em, 1)
        assert np.isclose((fp - fm) / (2 * h), g[j], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose((gp - gm) / (2 * h), H[:, j], rtol=1e-4, atol=1e-3)


def test_stage_one_recovers_the_run_shifts(three_runs: pd.DataFrame, scale: np.ndarray) -> None:
    s = summarize_config(three_runs, COEFS, scale, PRIOR)
    assert s.runs == tuple(sorted(SHIFTS)) and len(s.contrast_hat) == 2
    truth = np.array([SHIFTS[r] for r in s.runs])
    # sum-zero shifts: the truth's are already centred; within 3 standard errors
    assert np.all(np.abs(s.shift_hat - truth) < 3 * s.shift_se + 1e-3)
    assert np.all(s.shift_se > 0) and np.all(s.shift_se < 0.01)
    # without run effects the rows of one configuration look noisier
    flat = summarize_config(three_runs, COEFS, scale, PRIOR, run_effects=False)
    assert s.noise["iteration"].sigma < flat.noise["iteration"].sigma


def test_scale_estimate_and_two_passes(three_runs: pd.DataFrame, scale: np.ndarray) -> None:
    out = summarize(three_runs, COEFS, scale, PRIOR, scheduler="inline")
    (s,) = out
    sig = shift_moments(out)
    # three shifts of sd 0.06: the scale's estimate is of that order, far from the floor
    assert 0.02 < sig[0] < 0.2
    assert s.shift_sigma and np.isclose(s.shift_sigma[0], sig[0])
    # the second pass shrinks the shifts towards 0, by little at this precision
    assert np.all(np.abs(s.shift_hat) <= np.abs(s.contrast_hat @ runs.contrast_basis(3).T) + 1e-3)


def test_contrast_loglik_matches_the_mvnormal() -> None:
    from scipy.stats import multivariate_normal

    rng = np.random.default_rng(1)
    A = rng.normal(size=(4, 4))
    C = A @ A.T * 1e-4
    w = rng.normal(size=4) * 0.05
    z, lam = runs.contrast_arrays([(w, C, np.zeros(4, int))])["run"]
    got = runs.contrast_loglik(z, lam, 0.03)
    want = multivariate_normal(np.zeros(4), C + 0.03**2 * np.eye(4)).logpdf(w)
    assert np.isclose(got, want, rtol=1e-10)


def test_row_shifts_fitted_and_new_runs(three_runs: pd.DataFrame, scale: np.ndarray) -> None:
    out = summarize(three_runs, COEFS, scale, PRIOR, scheduler="inline")
    table = RunTable.from_dataset(run_effects_dataset(out))
    assert table.n_runs == {out[0].config_id: 3}
    sigma = 0.05
    post = xr.Dataset({"sigma_run": (("chain", "draw"), np.full((1, 4000), sigma))})
    rows = three_runs.iloc[[0, 1, 2]].copy()
    rows.loc[rows.index[2], "experiment_id"] = "run-unseen"
    shift, status = row_shifts(table, post, rows, 4000, seed=0)
    assert list(status) == [FITTED_RUN, FITTED_RUN, NEW_RUN]
    fitted = table.runs[(out[0].config_id, str(rows["experiment_id"].iloc[0]))]
    assert abs(shift[:, 0].mean() - fitted[0]) < 4 * fitted[1] / np.sqrt(4000) + 1e-6
    # a new run of a configuration of 3 fitted runs: sd sigma sqrt(1 + 1/3), within 5%
    assert abs(shift[:, 2].std() / (sigma * np.sqrt(4 / 3)) - 1.0) < 0.05
    new, st = row_shifts(table, post, rows, 10, seed=0, run="new")
    assert set(st) == {NEW_RUN}
    none, st = row_shifts(table, post, rows, 10, seed=0, run="configuration")
    assert not none.any() and set(st) == {"configuration"}
    with pytest.raises(ValueError, match="run must be one of"):
        row_shifts(table, post, rows, 10, run="bogus")


def test_model_has_sigma_run_only_when_runs_repeat(three_runs: pd.DataFrame,
                                                   scale: np.ndarray) -> None:
    import pymc as pm

    from bayes_latency.model.definition.hierarchy import run_scales

    out = summarize(three_runs, COEFS, scale, PRIOR, scheduler="inline")
    with pm.Model() as m:
        run_scales(out)
    assert "sigma_run" in m.named_vars and "loglik_run" in m.named_vars
    single = summarize(three_runs.assign(experiment_id="one"), COEFS, scale, PRIOR,
                       scheduler="inline")
    with pm.Model() as m1:
        run_scales(single)
    assert "sigma_run" not in m1.named_vars


@pytest.fixture(scope="module")
def fitted_runs(three_runs: pd.DataFrame, tmp_path_factory) -> tuple:
    """A Laplace fit of two configurations, one of three runs (module-scoped, ~15 s), saved
    and loaded back."""
    from bayes_latency.model.estimator import LatencyModel

    other, _ = make_observations([("llama-2-7b", "H100", 1)], n_iter=300, n_win=30, n_alpha=30,
                                 seed=4, sigma=0.03)
    obs = pd.concat([three_runs, fit_rows(other)], ignore_index=True)
    obs["obs_id"] = np.arange(len(obs))
    m = LatencyModel(sampler="laplace").fit(obs, draws=200, seed=0, progress=False)
    path = tmp_path_factory.mktemp("runs") / "posterior.nc"
    m.save(path)
    return obs, m, LatencyModel.load(path)


def _width(d: np.ndarray) -> float:
    """Median 95% / 5% quantile ratio of ``(sample, obs)`` draws."""
    return float(np.median(np.quantile(d, 0.95, axis=0) / np.quantile(d, 0.05, axis=0)))


def test_fit_predicts_fitted_and_new_runs(fitted_runs: tuple) -> None:
    obs, m, loaded = fitted_runs
    post = loaded.result["posterior"]
    assert "sigma_run" in post and "sigma_window" not in post
    assert 0.0 < float(post["sigma_run"].mean()) < 0.2
    rows = obs[obs["experiment_id"] == "run-a"].head(5).copy()
    mu = loaded.predict(rows, n_draws=100)
    assert set(mu["run_status"].values) == {FITTED_RUN}
    new = loaded.predict(rows.assign(experiment_id="run-z"), n_draws=100)
    assert set(new["run_status"].values) == {NEW_RUN}
    # the new run's band is wider than the fitted run's (its shift is drawn, not estimated)
    assert _width(new.values) > _width(mu.values)
    # the saved file predicts as the fitted estimator does (its draws are stored as float32)
    np.testing.assert_allclose(m.predict(rows, n_draws=100).values, mu.values, rtol=1e-5)


def test_export_draws_are_a_new_run(fitted_runs: tuple) -> None:
    from bayes_latency.export.document import export_notes

    _, _, m = fitted_runs
    conf = m.coefficients("llama-2-70b", "H100", 4)
    new = m.coefficients("llama-2-70b", "H100", 4, new_run=True)
    assert conf.attrs["run"] == "configuration" and new.attrs["run"] == "new run"
    assert new.attrs["n_runs"] == 3
    ratio = new["beta"].std("sample") / conf["beta"].std("sample")
    assert float(ratio.min()) >= 0.99  # every coefficient's band at least as wide
    assert any("new run of the configuration" in n for n in export_notes(new))
    # a configuration of one run: its new run draws from the same sigma_run, 1 + 1/1
    one = m.coefficients("llama-2-7b", "H100", 1, new_run=True)
    assert one.attrs["n_runs"] == 1


def test_fitted_rows_are_scored_about_their_run(fitted_runs: tuple) -> None:
    """The saved log-likelihood and posterior predictive groups, ``pointwise_loglik`` and the
    adequacy gate's LOO-PIT score a fitted run's rows about its fitted shift: the runs sit
    +-0.06 off the average run under a 0.03 noise, so about the configuration alone run-a's
    LOO-PIT would pile up near 1 and run-c's near 0."""
    from bayes_latency.checks.adequacy import loo_pit_rows
    from bayes_latency.model.posterior.groups import OBS_VAR
    from bayes_latency.model.posterior.shifts import fitted_log_shifts

    obs, _, loaded = fitted_runs
    shift = fitted_log_shifts(loaded.run_table, obs)
    run = obs["experiment_id"].to_numpy()
    for name, truth in SHIFTS.items():
        assert abs(shift[run == name].mean() - truth) < 0.02, name
    assert not shift[~np.isin(run, list(SHIFTS))].any()  # one run: no shift
    assert not fitted_log_shifts(None, obs).any()
    rows = obs[np.isin(run, ["run-a", "run-c"]) & (obs["kind"] == "iteration").to_numpy()]
    rows = rows.reset_index(drop=True)
    pit, _ = loo_pit_rows(loaded, rows, n_draws=200)
    for name in ("run-a", "run-c"):
        mean = float(pit[rows["experiment_id"].to_numpy() == name].mean())
        assert abs(mean - 0.5) < 0.1, (name, mean)
    # the saved groups are about the same shifts
    ref = loaded.result["log_likelihood"][OBS_VAR]
    ll = loaded.pointwise_loglik(obs.assign(obs_id=obs["obs_id"].astype(str)))
    np.testing.assert_allclose(ll.sel(obs=ref["obs"].values).values, ref.values, atol=1e-4)
    pp = loaded.result["posterior_predictive"][OBS_VAR]
    o = pd.Series(np.arange(len(obs)), index=obs["obs_id"].astype(str))
    sel = o.loc[pp["obs"].values.astype(str)].to_numpy()
    sel_a = run[sel] == "run-a"
    gap = (pp.mean(("chain", "draw")).values - np.log(obs["value_us"].to_numpy()[sel]))
    assert abs(float(np.median(gap[sel_a]))) < 0.02


def test_too_many_runs_fit_as_one(monkeypatch, three_runs: pd.DataFrame) -> None:
    monkeypatch.setattr(runs, "MAX_RUNS", 2)
    sd = runs.shift_design(three_runs)
    assert sd.n_contrasts == 0 and len(sd.runs) == 3
    note = runs.too_many_runs(three_runs)
    assert "more than 2 runs" in note and "(3 runs)" in note
    monkeypatch.setattr(runs, "MAX_RUNS", 64)
    assert runs.too_many_runs(three_runs) == ""


def test_runs_of_few_rows_share_one_shift(three_runs: pd.DataFrame) -> None:
    few = pd.DataFrame({"experiment_id": ["s1", "s1", "s2", "s3", "s3", "s3"], "kind": "workload_e2e"})
    rows = pd.concat([three_runs[["experiment_id", "kind"]].head(60).assign(experiment_id="big"),
                      few], ignore_index=True)
    sd = runs.shift_design(rows)
    assert sd.runs == ("big", "s1", "s2", "s3") and sd.n_contrasts == 1
    # the small runs' rows of B are equal; big against them sums to zero
    np.testing.assert_allclose(sd.B[1], sd.B[2])
    np.testing.assert_allclose(sd.B[1], sd.B[3])
    np.testing.assert_allclose(sd.B[0] + sd.B[1], 0.0, atol=1e-12)
    assert runs.shift_design(few).n_contrasts == 0  # every run small: one shared shift


def test_run_notes_say_which_run(fitted_runs: tuple) -> None:
    from bayes_latency.export.origin import run_notes

    _, _, m = fitted_runs
    assert "not a new run's" in run_notes(m.coefficients("llama-2-70b", "H100", 4))[0]
    assert "new run of the configuration" in run_notes(
        m.coefficients("llama-2-70b", "H100", 4, new_run=True))[0]
    bare = m.coefficients("llama-2-70b", "H100", 4)
    bare.attrs["run"] = "new run, no run scale"
    assert "no run-to-run scale" in run_notes(bare)[0]
    bare.attrs.pop("run")
    assert run_notes(bare) == []


def test_fit_of_single_runs_has_no_run_scale(tiny_posterior) -> None:
    from bayes_latency.model.estimator import LatencyModel

    _, post = tiny_posterior
    m = LatencyModel.load(post)
    assert "sigma_run" not in m.result["posterior"]  # the tiny fleet: one run per configuration
    cid = str(m.design.configs.index[0])
    first = m.design.configs.loc[cid]
    coefs = m.coefficients(str(first["model"]), str(first["gpu"]), int(first["tp"]), new_run=True)
    assert coefs.attrs["run"] == "new run, no run scale"


def test_ppc_rows_carry_each_row_s_run_status() -> None:
    from bayes_latency.checks.ppc import ppc_rows

    rows = pd.DataFrame({"obs_id": ["a", "b", "c"], "kind": ["iteration", "benchmark_mean",
                                                               "iteration"],
                         "config_id": "x", "value_us": [1.0, 2.0, 3.0]})
    draws = xr.DataArray(np.ones((4, 3)), dims=("sample", "obs"),
                         coords={"obs": ["c", "a", "b"],
                                 "run_status": ("obs", [NEW_RUN, FITTED_RUN, NEW_RUN])})
    # matched by obs_id, not by position; only the kinds kept
    assert list(ppc_rows(rows, draws)["run_status"]) == [FITTED_RUN, NEW_RUN]
    by_position = draws.drop_vars("obs")
    assert list(ppc_rows(rows, by_position)["run_status"]) == [NEW_RUN, NEW_RUN]
