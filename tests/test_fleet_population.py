"""The fleet's population as a file and as the prior of new configurations
(:mod:`bayes_latency.model.posterior.fleet`), the ``population`` command and the few-shot study's
plumbing. One fast Laplace fit of the tiny fleet (the session's ``tiny_posterior``) gives the
population."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from bayes_latency.cli.main import main
from bayes_latency.errors import ConfigError, ModelMismatchError
from bayes_latency.model.posterior.fleet import (
    NOISE_LOG_SD_DEFAULT,
    NOISE_LOG_SD_MIN,
    Population,
    client_noise,
    fleet_noise,
    leave_out,
    parse_leave_out,
    population_from_result,
)
from bayes_latency.model.posterior.population_file import load_population


@pytest.fixture(scope="module")
def pop_file(tiny_posterior, tmp_path_factory) -> tuple[Population, object]:
    from bayes_latency.model.posterior.persistence import read_result

    _, post = tiny_posterior
    noise = {"workload_e2e": {"sigma": 0.02, "rows": 12, "configs": 3, "log_mean": -4.1,
                              "log_sd": 0.4},
             "iteration": {"sigma": 0.05, "rows": 300, "configs": 3, "log_mean": -3.0,
                           "log_sd": 0.1},
             "benchmark_mean_prefill": {"sigma": 0.13, "rows": 60, "configs": 1,
                                        "log_mean": None, "log_sd": None}}
    pop = population_from_result(read_result(post).result, n_samples=100, source="tiny fleet",
                                 noise=noise)
    path = tmp_path_factory.mktemp("pop") / "population.nc"
    pop.save(path)
    return load_population(path), path


def _configs(pop: Population, rows: list[tuple[str, str, int]]) -> pd.DataFrame:
    return pd.DataFrame([{"model": m, "gpu": g, "tp": t} for m, g, t in rows],
                        index=[f"c{i}" for i in range(len(rows))])


def test_round_trip_keeps_draws_levels_and_provenance(pop_file):
    pop, path = pop_file
    d = pop.describe()
    assert d["n_samples"] == 100 and d["source"] == "tiny fleet" and d["configs"]
    assert d["client_noise"] == {"workload_e2e": {"sigma": 0.02, "rows": 12}}
    assert set(d["fleet_noise"]) == {"workload_e2e", "iteration", "benchmark_mean_prefill"}
    assert d["fleet_noise"]["iteration"] == {"sigma": 0.05, "rows": 300, "configs": 3,
                                             "log_mean": -3.0, "log_sd": 0.1}
    assert path.stat().st_size < 400_000
    assert set(pop.draws["mu"].dims) == {"coef", "sample"}
    assert all(str(v.dtype) == "float32" for v in pop.draws.data_vars.values())
    assert pop.terms and pop.draws.sizes["coef"] == len(pop.coefs)


def test_seen_levels_give_a_tighter_prior_than_an_unseen_model(pop_file):
    pop, _ = pop_file
    m0, g0, t0 = pop.configs.iloc[0][["model", "gpu", "tp"]]
    t1, t2 = (pop.design.tps * 2)[:2]   # seen TP degrees: only the model is unseen
    prior = pop.config_prior(_configs(pop, [(m0, g0, int(t0)), ("bloom-176b", g0, t1),
                                            ("bloom-176b", g0, t2)]), n_draws=1000)
    assert prior.unseen["c0"] == [] and "model" in prior.unseen["c1"]
    # every noise class the fleet fitted: the lognormal of its configurations' scales (sd at
    # least NOISE_LOG_SD_MIN; at the RMS with NOISE_LOG_SD_DEFAULT without a spread); other
    # classes: none
    assert prior.noise_prior["workload_e2e"] == pytest.approx((-4.1, 0.4))
    assert prior.noise_prior["iteration"] == pytest.approx((-3.0, NOISE_LOG_SD_MIN))
    assert prior.noise_prior["benchmark_mean_prefill"] == pytest.approx(
        (np.log(0.13), NOISE_LOG_SD_DEFAULT))
    assert "benchmark_mean" not in prior.noise_prior
    sd = prior.sd
    # every term's prior is tighter for the seen configuration; where the data speak (the terms
    # the tiny fleet identifies), by more than half
    assert np.all(sd[0] < sd[1]), sd
    assert np.min(sd[0] / sd[1]) < 0.5, sd
    # the two configurations of the unseen model share its drawn effect: correlated priors
    cov = prior.chol @ prior.chol.T
    K = len(pop.coefs)
    k = int(np.argmax(sd[1]))
    corr = cov[K + k, 2 * K + k] / np.sqrt(cov[K + k, K + k] * cov[2 * K + k, 2 * K + k])
    assert corr > 0.5, corr


def test_a_file_of_another_model_version_or_format_is_refused(pop_file, tmp_path):
    _, path = pop_file
    ds = xr.open_dataset(path, engine="h5netcdf").load()
    for attr, value, needle in (("model_version", "0", "model version"),
                                ("population_format", "99", "population format")):
        bad = ds.copy()
        bad.attrs = {**ds.attrs, attr: value}
        p = tmp_path / f"bad_{attr}.nc"
        bad.to_netcdf(p, engine="h5netcdf")
        with pytest.raises(ModelMismatchError, match=needle):
            load_population(p)
    with pytest.raises(ModelMismatchError, match="terms"):
        load_population(path, terms=("per_step",))


def test_a_file_with_the_client_kinds_noise_only_still_loads(pop_file, tmp_path):
    """A population file that records only ``client_noise`` (no ``fleet_noise`` attribute)
    loads; its client kinds get the lognormal prior with the default spread, no other class."""
    pop, path = pop_file
    ds = xr.open_dataset(path, engine="h5netcdf").load()
    # the writer of such files kept the client kinds only, as attrs ``client_noise``
    ds.attrs["client_noise"] = json.dumps(client_noise(json.loads(ds.attrs.pop("fleet_noise"))))
    p = tmp_path / "client_only.nc"
    ds.to_netcdf(p, engine="h5netcdf")
    old = load_population(p)
    assert old.fleet_noise == {"workload_e2e": {"sigma": 0.02, "rows": 12, "configs": None,
                                                "log_mean": None, "log_sd": None}}
    m0, g0, t0 = old.configs.iloc[0][["model", "gpu", "tp"]]
    prior = old.config_prior(_configs(old, [(m0, g0, int(t0))]), n_draws=200)
    assert list(prior.noise_prior) == ["workload_e2e"]
    assert prior.noise_prior["workload_e2e"] == pytest.approx((np.log(0.02),
                                                               NOISE_LOG_SD_DEFAULT))


def test_fleet_noise_has_every_noise_class_of_the_fitted_rows():
    """Per noise class (prefill steps apart): the row-weighted RMS of the configurations'
    scales, the rows, configurations and the sd of the log scales; ppc rows not counted."""
    from types import SimpleNamespace

    from bayes_latency.model.definition.likelihood import NoiseParams

    rows = pd.DataFrame({
        "config_id": ["a"] * 3 + ["b"] * 1 + ["a", "b", "b"] + ["a"],
        "kind": ["benchmark_mean"] * 4 + ["benchmark_mean"] * 3 + ["workload_e2e"],
        "x_prefill_compute": [0.0] * 4 + [1.0] * 3 + [0.0],
        "role": ["beta"] * 7 + ["ppc"]})
    sig = {("a", "benchmark_mean"): 0.3, ("b", "benchmark_mean"): 0.5,
           ("a", "benchmark_mean_prefill"): 0.1, ("b", "benchmark_mean_prefill"): 0.2}
    model = SimpleNamespace(_rows=rows,
                            noise=lambda c, k: NoiseParams(sigma=sig[(c, k)], tau=0.0, nu=5.0))
    fn = fleet_noise(model)
    assert set(fn) == {"benchmark_mean", "benchmark_mean_prefill"}
    d = fn["benchmark_mean"]
    assert d["rows"] == 4 and d["configs"] == 2
    assert d["sigma"] == pytest.approx(np.sqrt((3 * 0.3**2 + 0.5**2) / 4), rel=1e-9)
    assert d["log_sd"] == pytest.approx(np.std(np.log([0.3, 0.5]), ddof=1), rel=1e-9)
    assert d["log_mean"] == pytest.approx(np.log(np.sqrt(0.3 * 0.5)), rel=1e-9)
    p = fn["benchmark_mean_prefill"]
    assert p["rows"] == 3 and p["sigma"] == pytest.approx(np.sqrt((0.01 + 2 * 0.04) / 3))
    assert fleet_noise(SimpleNamespace(_rows=None)) == {}


def test_leave_out_keys_are_checked():
    obs = pd.DataFrame({"model": ["a", "a", "b"], "gpu": ["H100"] * 3, "tp": [1, 2, 1],
                        "config_id": ["x", "y", "z"]})
    kept, n = leave_out(obs, "model=a")
    assert n == 2 and list(kept["model"]) == ["b"]
    assert leave_out(obs, "tp=2")[1] == 1
    for spec, needle in (("colour=red", "unknown key 'colour'"), ("model", "KEY=VALUE"),
                         ("tp=two", "integer"), ("model=c", "no row has model 'c'")):
        with pytest.raises(ConfigError, match=needle):
            leave_out(obs, spec)
    assert parse_leave_out(" GPU = H100 ") == ("gpu", "H100")


def test_population_command_errors_are_one_line(tiny_posterior, tmp_path, capsys):
    tables, post = tiny_posterior
    for argv, needle in (
            ([str(tables), "--out", str(tmp_path / "p.nc"), "--leave-out", "colour=red"],
             "unknown key"),
            ([str(post), "--out", str(tmp_path / "p.nc"), "--leave-out", "model=llama-2-7b"],
             "needs a tables folder")):
        assert main(["population", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and needle in err, err
        assert not (tmp_path / "p.nc").exists()


def test_fit_under_the_population_speaks_for_its_configurations(pop_file, tiny_posterior):
    from bayes_latency.data.tables import read_table
    from bayes_latency.model.estimator import LatencyModel

    pop, _ = pop_file
    tables, _ = tiny_posterior
    obs = read_table(tables, "observations")
    cid = sorted(obs["config_id"].unique())[0]
    one = obs[obs["config_id"] == cid].head(40).reset_index(drop=True)
    m = LatencyModel(population=pop, sampler="laplace").fit(one, draws=100, chains=2)
    assert m.variant == "population" and m.terms == pop.terms
    # the fleet's classes take its lognormal noise prior, the others the priors file's
    post = m.result["posterior"]
    assert "noise_sigma" in post and (post["noise_sigma"].values > 0).all()
    assert "iteration" in list(post["fleet_kind"].values)
    info = json.loads(m.result.attrs["population"])
    assert info["source"] == "tiny fleet" and cid in info["unseen_levels"]
    c = one.iloc[0]
    beta = m.coefficients(c["model"], c["gpu"], int(c["tp"]))["beta"]
    assert np.isfinite(beta.values).all() and (beta.values >= 0).all()
    with pytest.raises(ConfigError, match="population"):
        m.coefficients("bloom-176b", c["gpu"], 8)


def test_calibration_notes_name_the_population_and_the_host_limit():
    from bayes_latency.export.origin import calibration_notes

    notes = calibration_notes({"name": "fleet without model=x", "models": ["a"], "gpus": ["H100"],
                               "tps": [1], "data_hash": "h", "unseen_levels": {"c": ["model"]}},
                              ["run/stage1/workload_ttft"])
    assert "fleet without model=x" in notes[0] and "model" in notes[0]
    assert "per-request alphas cannot follow" in notes[1]
    assert "roofline priors alone" in calibration_notes(None)[0]


def test_fewshot_summary_and_report_from_a_table():
    from bayes_latency.study.client.fewshot import render, summary_table

    rows = []
    for setting, err in (("zero-shot", 0.05), ("one-shot population", 0.02),
                         ("blis-published", 0.12)):
        for i, wl in enumerate(("codegen", "general")):
            rows.append({"setting": setting, "held_out_model": "m", "shot_run": "m-tp1-roleplay",
                         "run": f"m-tp1-{wl}", "workload": wl, "err_e2e_mean": err * (i + 1),
                         "err_ttft_mean": -err, "err_decode_interval": err,
                         "e2e_mean_in_band": 1.0, "band_e2e_mean_width": 0.1,
                         "ttft_mean_in_band": 0.0, "band_ttft_mean_width": 0.2})
    t = pd.DataFrame(rows)
    s = summary_table(t)
    z = s[(s["setting"] == "zero-shot") & (s["runs"] == "all")].iloc[0]
    assert z["n"] == 2 and z["E2E"] == pytest.approx(0.075) and z["E2E coverage"] == 1.0
    w = s[(s["setting"] == "zero-shot") & (s["runs"] == "without general runs")].iloc[0]
    assert w["n"] == 1 and w["E2E"] == pytest.approx(0.05)
    text = render({"table": t, "fits": pd.DataFrame([{"fit": "x", "passed": True}]),
                   "quick": True, "models": ["m"], "all_models": ["m", "n"], "terms": ["a"],
                   "settings": "s", "n_draws": 4, "calibrate_s": [30.0, 50.0],
                   "runtime_s": 60.0, "date": "d", "machine": "cpu", "code": "c", "shots": 1})
    assert "one-shot population" in text and "median 40 s" in text and "7.5%" in text
    assert "its first normal run" in text and "each in turn" not in text


def test_fewshot_study_without_blis_does_nothing(tmp_path, monkeypatch):
    from bayes_latency.study.client.fewshot import main as fewshot

    monkeypatch.delenv("BLIS_BIN", raising=False)
    assert fewshot(tmp_path, blis=None, quick=True, log=lambda _m: None) == 0
    assert not (tmp_path / "client" / "fewshot.md").exists()


def test_run_level_scale_borrows_the_fleet_scatter_of_client_means():
    from types import SimpleNamespace

    from bayes_latency.calibrate.predict import run_level_sigma
    from bayes_latency.priors import load_priors

    rows = pd.DataFrame({"kind": ["workload_e2e"] * 2, "config_id": ["c", "c"]})
    noise = SimpleNamespace(sigma=0.06)
    pop = {"client_noise": {"workload_e2e": {"sigma": 0.013, "rows": 20}}}
    models = [SimpleNamespace(priors=load_priors(), _rows=rows, noise=lambda c, k: noise,
                              result=SimpleNamespace(attrs=attrs))
              for attrs in ({}, {"population": json.dumps(pop)})]
    alone, src_alone = run_level_sigma(models[0], "c", "workload_e2e")
    borrowed, src = run_level_sigma(models[1], "c", "workload_e2e")
    assert borrowed < 0.8 * alone and "population 20 rows" in src and "population" not in src_alone


def test_the_shipped_population_loads_under_this_model_version():
    """The population ``calibrate`` borrows from by default is readable by this package (model
    version, file format, terms, its own embedded priors) and holds the real fleet."""
    from bayes_latency import MODEL_VERSION
    from bayes_latency.model.posterior.population_file import SHIPPED_POPULATION, load_population

    pop = load_population(SHIPPED_POPULATION)
    d = pop.describe()
    assert d["model_version"] == MODEL_VERSION
    assert {"llama-2-7b", "llama-2-70b", "codellama-34b", "mixtral-8x7b"} <= set(d["models"])
    assert d["n_samples"] >= 100 and d["left_out"] == ""
    assert SHIPPED_POPULATION.stat().st_size < 1_000_000
