"""Predictive checks on synthetic draws and a fake model with a known generative process."""

from __future__ import annotations

import argparse
import sys
import types

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from bayes_latency.checks.ppc import (
    ALL,
    FixedCoefficientModel,
    band_summary,
    ppc_rows,
    request_ppc,
    step_ppc,
    workload_ppc,
)

X_COLS = ["x_per_step", "x_decode_kv", "x_alpha_arrival", "x_alpha_post_decode", "x_alpha_per_token"]
TRUE = {"A|H100|tp1": np.array([5000.0, 1.5, 800.0, 300.0, 20.0]),
        "B|A100|tp2": np.array([8000.0, 2.0, 1000.0, 500.0, 30.0])}
EXPERIMENT = {"A|H100|tp1": "expA", "B|A100|tp2": "expB"}


def lognormal_sum(rng, mu, sigma, n_steps):
    """A value with multiplicative noise of log-sd ``sigma / sqrt(n_steps)`` around ``mu``."""
    s = sigma / np.sqrt(np.maximum(n_steps, 1))
    return mu * np.exp(s * rng.standard_normal(np.shape(mu)))


class FakeModel:
    """Posterior draws of theta around the truth; predictive noise like the generator's."""

    def __init__(self, n_draws=400, post_sd=0.0, sigma=0.1, seed=1):
        rng = np.random.default_rng(seed)
        self.sigma = sigma
        self.theta = {c: t * np.exp(post_sd * rng.standard_normal((n_draws, t.size)))
                      for c, t in TRUE.items()}

    def predict(self, df):
        x = df[X_COLS].to_numpy(float)
        mu = np.zeros((next(iter(self.theta.values())).shape[0], len(df)))
        for c, th in self.theta.items():
            m = (df["config_id"] == c).to_numpy()
            mu[:, m] = th @ x[m].T
        return xr.DataArray(mu, dims=("sample", "obs"), coords={"obs": df["obs_id"].to_numpy()})

    def sample_posterior_predictive(self, df, seed=0):
        mu = self.predict(df)
        rng = np.random.default_rng(seed)
        return mu.copy(data=lognormal_sum(rng, mu.values, self.sigma, df["n_steps"].to_numpy(float)))


def base_row(config, kind, **x):
    row = {"kind": kind, "experiment_id": EXPERIMENT[config], "workload": "w",
           "model": config.split("|")[0], "gpu": config.split("|")[1], "tp": int(config[-1]),
           "config_id": config, "aggregate": "sum", "role": "ppc"}
    row.update(dict.fromkeys(X_COLS, 0.0))
    row.update(x)
    return row


def make_world(n_req=150, sigma=0.1, n_iter=200, seed=0):
    """Requests, their observation rows (+ iteration rows) generated from TRUE."""
    rng = np.random.default_rng(seed)
    reqs, obs = [], []
    for config, th in TRUE.items():
        t = 10.0
        step = 1
        for i in range(n_req):
            t += rng.exponential(0.05)
            n_pre = int(rng.integers(1, 4))
            n_out = int(rng.integers(1, 60))
            n_dec = n_out - 1
            a_arr = lognormal_sum(rng, th[2], sigma, 1)
            wait = rng.exponential(2000.0)
            x_pre = {"x_per_step": n_pre, "x_decode_kv": rng.uniform(100, 1000) * n_pre}
            p = lognormal_sum(rng, th[0] * x_pre["x_per_step"] + th[1] * x_pre["x_decode_kv"],
                              sigma, n_pre)
            first, ft = step, step + n_pre - 1
            rid = f"r{i}"
            obs.append(base_row(config, "request_prefill", value_us=p, n_steps=n_pre,
                                step_first=first, step_last=ft, request_id=rid, **x_pre))
            d = 0.0
            if n_dec:
                x_dec = {"x_per_step": n_dec, "x_decode_kv": rng.uniform(100, 1000) * n_dec}
                d = lognormal_sum(rng, th[0] * x_dec["x_per_step"] + th[1] * x_dec["x_decode_kv"],
                                  sigma, n_dec)
                obs.append(base_row(config, "request_decode", value_us=d, n_steps=n_dec,
                                    step_first=ft + 1, step_last=ft + n_dec, request_id=rid,
                                    **x_dec))
            a_dep = lognormal_sum(rng, th[3] + th[4] * n_out, sigma, 1)
            queued_ns = (t * 1e6 + a_arr) * 1e3
            sched_ns = queued_ns + wait * 1e3
            ftok_ns = sched_ns + p * 1e3
            fin_ns = ftok_ns + d * 1e3
            reqs.append({"experiment_id": EXPERIMENT[config], "request_id": rid, "arrival_s": t,
                         "departed_s": (fin_ns / 1e3 + a_dep) / 1e6, "queued_ns": queued_ns,
                         "first_scheduled_ns": sched_ns, "first_scheduled_step": first,
                         "first_token_ns": ftok_ns, "first_token_step": ft, "finished_ns": fin_ns,
                         "finished_step": ft + n_dec, "prompt_tokens": 100, "output_tokens": n_out,
                         "status": "length", "complete": True, "stage": i % 2})
            step += 1000
        for _ in range(n_iter):
            x = {"x_per_step": 1.0, "x_decode_kv": rng.uniform(100, 5000)}
            obs.append(base_row(config, "iteration", n_steps=1, step_first=0, step_last=0,
                                value_us=lognormal_sum(rng, th[0] + th[1] * x["x_decode_kv"], sigma, 1),
                                **x))
    obs = pd.DataFrame(obs)
    obs.insert(0, "obs_id", np.arange(len(obs)))
    return obs, pd.DataFrame(reqs)


# ------------------------------------------------------------------------------ step level


def test_band_summary_math():
    draws = np.array([[1.0, 10.0], [2.0, 10.0], [3.0, 10.0], [4.0, 10.0], [5.0, 10.0]])
    out = band_summary(draws, np.array([3.0, 8.0]))
    assert out.loc[0, "pred_median_us"] == 3.0 and out.loc[0, "ape"] == 0.0
    assert out.loc[1, "ape"] == pytest.approx(25.0)
    assert out.loc[0, "pit"] == pytest.approx(0.5)  # 2 below, 1 tie
    assert out.loc[1, "pit"] == 0.0 and out.loc[1, "in_90"] == 0.0
    assert out.loc[0, "in_50"] == 1.0


def _calibrated(n=2000, s_true=0.1, s_draw=0.1, seed=0):
    rng = np.random.default_rng(seed)
    mu = rng.uniform(1e3, 5e4, n)
    cfg = np.where(np.arange(n) % 2 == 0, "A|H100|tp1", "B|A100|tp2")
    obs = pd.DataFrame({"obs_id": np.arange(n), "kind": "iteration", "config_id": cfg,
                        "experiment_id": "e", "value_us": mu * np.exp(s_true * rng.standard_normal(n))})
    draws = xr.DataArray(mu * np.exp(s_draw * rng.standard_normal((1000, n))),
                         dims=("sample", "obs"), coords={"obs": np.arange(n)})
    return obs, draws


def test_step_ppc_coverage_of_true_predictive():
    obs, draws = _calibrated()
    table = step_ppc(obs, draws)
    pooled = table[table["config_id"] == ALL].iloc[0]
    assert pooled["n"] == 2000
    assert pooled["coverage_90"] == pytest.approx(0.9, abs=0.03)
    assert pooled["coverage_50"] == pytest.approx(0.5, abs=0.04)
    assert pooled["pit_ks_pvalue"] > 0.001
    assert pooled["mdape"] == pytest.approx(100 * 0.1 * 0.6745, rel=0.15)  # median |N(0, 0.1)|
    assert set(table["config_id"]) == {"A|H100|tp1", "B|A100|tp2", ALL}


def test_step_ppc_flags_overconfident_draws():
    obs, draws = _calibrated(s_draw=0.03)
    pooled = step_ppc(obs, draws).set_index("config_id").loc[ALL]
    assert pooled["coverage_90"] < 0.6
    assert pooled["pit_ks_pvalue"] < 1e-6


def test_rows_aligned_by_obs_id_and_kind_filter():
    obs, draws = _calibrated(n=200)
    shuffled = draws.isel(obs=np.random.default_rng(3).permutation(200))
    a = ppc_rows(obs, draws)
    b = ppc_rows(obs, shuffled)
    pd.testing.assert_frame_equal(a, b)
    obs.loc[:99, "kind"] = "step_window"
    assert len(ppc_rows(obs, draws, kinds=("step_window",))) == 100
    assert len(ppc_rows(obs, draws.values, kinds=None)) == 200  # positional


# ------------------------------------------------------------------------------ request level


@pytest.mark.parametrize("with_request_id", [True, False])
def test_request_ppc_teacher_forcing_is_exact_without_noise(with_request_id):
    obs, reqs = make_world(n_req=40, sigma=0.0, n_iter=5)
    if not with_request_id:
        obs = obs.drop(columns="request_id")  # falls back to matching step spans
    res = request_ppc(FakeModel(n_draws=20, sigma=0.0), obs, reqs)
    assert len(res.requests) == 80 and res.notes == []
    assert res.rows["ape"].max() < 1e-6
    assert res.draws["e2e"].shape == (20, 80)
    one_token = res.requests["output_tokens"] == 1
    assert res.requests.loc[one_token, "tpot_us"].isna().all()
    assert set(res.rows["metric"]) == {"ttft", "tpot", "e2e"}


def test_request_ppc_coverage_and_mape():
    obs, reqs = make_world(n_req=150, sigma=0.1, n_iter=5)
    res = request_ppc(FakeModel(n_draws=400, sigma=0.1), obs, reqs, seed=5)
    summary = res.summary()
    e2e = summary[(summary["config_id"] == ALL) & (summary["metric"] == "e2e")].iloc[0]
    assert e2e["n"] == 300
    assert 0.82 <= e2e["coverage_90"] <= 0.97
    assert e2e["mape"] < 10
    assert set(summary["config_id"]) == {"A|H100|tp1", "B|A100|tp2", ALL}


def test_request_ppc_leaves_out_unmatched_and_incomplete():
    obs, reqs = make_world(n_req=20, sigma=0.0, n_iter=0)
    reqs.loc[0, "complete"] = False
    obs = obs[~((obs["request_id"] == "r1") & (obs["kind"] == "request_prefill"))]
    res = request_ppc(FakeModel(n_draws=10, sigma=0.0), obs, reqs)
    # r0 of expA incomplete; r1 of both experiments without a prefill row
    assert len(res.requests) == 37
    assert res.notes == ["1 incomplete or aborted requests left out",
                         "2 requests without request_prefill/request_decode rows left out"]


# ------------------------------------------------------------------------------ workload level


def test_workload_ppc_exact_and_truth():
    obs, reqs = make_world(n_req=40, sigma=0.0, n_iter=0)
    res = request_ppc(FakeModel(n_draws=20, sigma=0.0), obs, reqs)
    truth = pd.DataFrame({"experiment_id": ["expA", "expB"], "ttft_us": [1.0, 1.0],
                          "itl_us": [1.0, 1.0], "e2e_us": [1.0, 1.0]})
    e2e_obs = res.requests.groupby("experiment_id")["e2e_us"].mean()
    truth["e2e_us"] = e2e_obs.loc[truth["experiment_id"]].to_numpy() * 1.05
    life = pd.DataFrame({"experiment_id": ["expA"], "stage": ["summary"], "ttft_mean_s": [0.5],
                         "e2e_mean_s": [2.0], "output_len_mean": [31.0],
                         "decode_interval_s": [np.nan]})
    wl = workload_ppc(res, lifecycle=life, truth=truth)
    # 2 experiments x (all + 2 stages) x 3 metrics
    assert len(wl) == 18
    assert wl["error_pct"].abs().max() < 1e-6
    e2e = wl[wl["metric"] == "e2e_mean"]
    assert e2e["within_target"].all() and (e2e["target_pct"] == 10).all()
    assert wl.loc[wl["metric"] != "e2e_mean", "within_target"].isna().all()
    pooled_e2e = e2e[e2e["stage"] == ALL].set_index("experiment_id")
    assert pooled_e2e["truth_error_pct"].to_numpy() == pytest.approx([-100 * 0.05 / 1.05] * 2)
    itl = wl[(wl["metric"] == "itl_mean") & (wl["experiment_id"] == "expA") & (wl["stage"] == ALL)]
    assert itl["lifecycle_us"].iloc[0] == pytest.approx(1.5 / 30 * 1e6)
    assert itl["observed_us"].iloc[0] == pytest.approx(
        res.requests.query("experiment_id == 'expA' and output_tokens > 1")["tpot_us"].mean())


def test_workload_ppc_per_request_truth_and_band():
    obs, reqs = make_world(n_req=100, sigma=0.1, n_iter=0)
    res = request_ppc(FakeModel(n_draws=300, sigma=0.1), obs, reqs)
    truth = res.requests[["experiment_id", "request_id", "ttft_us", "e2e_us"]]
    wl = workload_ppc(res, truth=truth)
    e2e = wl[(wl["metric"] == "e2e_mean") & (wl["stage"] == ALL)]
    assert (e2e["q05_us"] < e2e["pred_mean_us"]).all() and (e2e["pred_mean_us"] < e2e["q95_us"]).all()
    assert e2e["error_pct"].abs().max() < 10
    np.testing.assert_allclose(e2e["truth_us"], e2e["observed_us"])


def test_truth_from_fixed_coefficients():
    obs, reqs = make_world(n_req=60, sigma=0.1, n_iter=0)
    names = [c[2:] for c in X_COLS]
    truth_model = FixedCoefficientModel({c: dict(zip(names, t, strict=True)) for c, t in TRUE.items()})
    truth = request_ppc(truth_model, obs, reqs).expected()
    assert list(truth.columns) == ["experiment_id", "request_id", "ttft_us", "tpot_us", "e2e_us"]
    res = request_ppc(FakeModel(n_draws=200, post_sd=0.0, sigma=0.1), obs, reqs)
    wl = workload_ppc(res, truth=truth)
    # the model knows the truth: predicted means sit within ~1% of the true means
    assert wl["truth_error_pct"].abs().max() < 1.5
    with pytest.raises(Exception, match="no coefficients"):
        FixedCoefficientModel({}).predict(obs)
    # a table with another term set's features too (ingest writes every named set's): a truth
    # over its own terms leaves them out; without its term set, a used feature is an error
    wide = obs.assign(x_compute_over_2w=1000.0)
    coefs = {c: dict(zip(names, t, strict=True)) for c, t in TRUE.items()}
    np.testing.assert_array_equal(
        FixedCoefficientModel(coefs, terms=names).predict(wide).values, truth_model.predict(obs).values)
    with pytest.raises(Exception, match="x_compute_over_2w"):
        FixedCoefficientModel(coefs).predict(wide)


# ------------------------------------------------------------------------------ CLI


def test_check_command_with_tables(monkeypatch, tmp_path, capsys):
    from bayes_latency.cli.check import check_command

    obs, reqs = make_world(n_req=30, sigma=0.1, n_iter=100)
    a = (obs["kind"] == "iteration") & (obs["experiment_id"] == "expA")
    obs.loc[a, "step_first"] = obs.loc[a, "step_last"] = np.arange(int(a.sum()))
    # one iteration row measured in a fifth of its compute at the GPU's peak: named, not a gate
    obs["x_prefill_compute"] = 0.0
    fast = obs.index[a][3]
    obs.loc[fast, "x_prefill_compute"] = 5.0 * obs.loc[fast, "value_us"]
    tables = tmp_path / "tables"
    tables.mkdir()
    obs.to_parquet(tables / "observations.parquet")
    reqs.to_parquet(tables / "requests.parquet")
    # an iterations table of expA whose steps from 80 on are host-bound (schedule() 5 ms over
    # its line): 20 of expA's 100 iteration rows
    n = 120
    batch = np.where(np.arange(n) < 60, 30.0, 90.0)
    pd.DataFrame({"experiment_id": "expA", "step_id": np.arange(n),
                  "iteration_us": 15_000.0 + 30 * batch + np.where(np.arange(n) >= 80, 3_000, 0),
                  "schedule_cpu_us": 200.0 + 3 * batch + np.where(np.arange(n) >= 80, 5_000, 0),
                  "num_prefill_reqs": 0.0, "num_decode_reqs": batch}).to_parquet(
        tables / "iterations.parquet")
    post = xr.Dataset({"beta": (("chain", "draw", "config", "term"),
                                np.random.default_rng(0).normal(1, 0.1, (1, 100, 2, 2)))},
                      coords={"config": list(TRUE), "term": ["per_step", "decode_kv"]})
    result = xr.DataTree.from_dict({"posterior": post})
    result.attrs = {"approximate": "true", "method": "laplace-hierarchy", "sampler": "laplace"}

    class Loaded(FakeModel):
        def __init__(self):
            super().__init__(n_draws=200)
            self.result = result

        @classmethod
        def load(cls, path):
            return cls()

    mod = types.ModuleType("bayes_latency.model.estimator")
    mod.LatencyModel = Loaded
    monkeypatch.setitem(sys.modules, "bayes_latency.model.estimator", mod)
    out = tmp_path / "out"
    args = argparse.Namespace(posterior=str(tmp_path / "p.nc"), tables=str(tables), out=str(out))
    assert check_command(args) == 0
    printed = capsys.readouterr().out
    assert "APPROXIMATE" in printed and "workload_ppc" in printed
    assert "mean E2E error per experiment" in printed
    assert "host CPU" in printed and "expA: 40 of 120 steps" in printed
    assert ("data (not a gate): 1 row(s) measured in less time than their compute takes at the "
            "GPU's peak" in printed and f"{obs.loc[fast, 'obs_id']} (0.20x)" in printed)
    ft = pd.read_csv(out / "faster_than_compute.csv")
    assert ft["obs_id"].tolist() == [obs.loc[fast, "obs_id"]]
    assert ft["ratio"].iloc[0] == pytest.approx(0.2, rel=1e-9)
    assert pd.read_csv(out / "host_overhead.csv")["n_host_bound"].tolist() == [40]
    md = (out / "host_overhead.md").read_text()
    assert "| expA | host-bound | 20 |" in md and "| expA | quiet | 80 |" in md
    for name in ("step_ppc.csv", "request_ppc.csv", "workload_ppc.csv", "diagnostics.md",
                 "forest.png",
                 "ppc_iterations.png", "pit.png", "calibration.png",
                 "workload_observed_vs_predicted.png"):
        assert (out / name).stat().st_size > 0, name
    wl = pd.read_csv(out / "workload_ppc.csv")
    assert set(wl["metric"]) == {"ttft_mean", "itl_mean", "e2e_mean"}


class HeavyTailModel(FakeModel):
    """FakeModel whose predictive draws carry one far-tail draw of a request span (as a
    Student-t on the log scale with dof < 2 gives: tiny fleet seed 5, Mixtral)."""

    def sample_posterior_predictive(self, df, seed=0):
        out = super().sample_posterior_predictive(df, seed=seed)
        vals = out.values.copy()
        span = np.flatnonzero((df["kind"] == "request_prefill").to_numpy())[0]
        vals[3, span] *= np.exp(20.0)
        return out.copy(data=vals)


def test_workload_point_prediction_inside_its_band_under_heavy_tails():
    """Regression: Mixtral's predicted mean E2E was 70,711 ms against its own band
    [4,806.8, 4,858.9] ms: the point was the average of draws, dominated by one far-tail draw."""
    obs, reqs = make_world(n_req=100, sigma=0.05, n_iter=0)
    res = request_ppc(HeavyTailModel(n_draws=200, sigma=0.05), obs, reqs)
    wl = workload_ppc(res)
    assert (wl["pred_mean_us"] > wl["q95_us"]).any()  # the average is pulled out of the band
    assert ((wl["q05_us"] <= wl["pred_median_us"]) & (wl["pred_median_us"] <= wl["q95_us"])).all()
    point = wl["observed_us"] * (1 + wl["error_pct"] / 100)
    np.testing.assert_allclose(point, wl["pred_median_us"], rtol=1e-9)
    assert wl.loc[wl["metric"] == "e2e_mean", "error_pct"].abs().max() < 10


def test_band_summary_holds_overflowed_draws_at_the_largest_float():
    """Draws past the float range (+inf) leave finite bands: no inf - inf quantile, no overflow."""
    import warnings

    from bayes_latency.checks.ppc.bands import band_summary

    d = np.array([[1.0, 1.0], [2.0, np.inf], [np.inf, np.inf], [np.inf, np.inf]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        b = band_summary(d, np.array([1.5, 1.0]))
    assert np.isfinite(b["q95_us"]).all() and b["q95_us"].iloc[1] == 1e300
    assert b["in_90"].tolist() == [1.0, 0.0]  # the second row's band starts far above 1
