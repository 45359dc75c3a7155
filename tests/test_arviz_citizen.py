"""The fitted result is a full ArviZ citizen: every standard call works on it without glue.

One small real fit (module scope, run under ``DeprecationWarning`` as an error) and a second one
with a term subset for ``az.compare``; each standard ArviZ call runs on the saved-and-loaded
result. A call that fails for a reason of ArviZ's own is marked ``xfail(strict=True)`` with the
reason, so the test notices when upstream fixes it.
"""

from __future__ import annotations

import json
import warnings

import matplotlib
import numpy as np
import pandas as pd
import pytest
import xarray as xr
from obs_factory import make_observations

matplotlib.use("Agg")

import arviz as az  # noqa: E402
import arviz_plots as azp  # noqa: E402
import arviz_stats as azs  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

from bayes_latency import LatencyModel, select  # noqa: E402
from bayes_latency.checks.diagnostics import diagnose, prior_sensitivity  # noqa: E402
from bayes_latency.model.posterior.groups import OBS_VAR  # noqa: E402
from bayes_latency.physics.basis import DEFAULT_TERMS  # noqa: E402

CONFIGS = [("llama-2-7b", "H100", 1), ("llama-2-7b", "A100", 1), ("llama-2-70b", "H100", 4),
           ("mixtral-8x7b", "H100", 2)]
FIT = {"draws": 200, "tune": 200, "chains": 2, "seed": 1, "prior_draws": 100,
       "max_draws": None}
SUBSET = tuple(t for t in DEFAULT_TERMS if t not in ("prefill_kv", "decode_compute"))


@pytest.fixture(scope="module")
def data():
    return make_observations(CONFIGS, n_iter=120, n_win=80, n_alpha=40, seed=3)


@pytest.fixture(scope="module")
def saved(data, tmp_path_factory):
    """A fit under ``-W error::DeprecationWarning``, saved (every draw: ``thin=1``), loaded back
    from the file alone."""
    obs, _ = data
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        m = LatencyModel().fit(obs, **FIT)
    path = m.save(tmp_path_factory.mktemp("arviz") / "post.nc", thin=1)
    return LatencyModel.load(path)


@pytest.fixture(scope="module")
def subset(data):
    obs, _ = data
    return LatencyModel(terms=SUBSET).fit(obs, **FIT)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_groups_layout(saved, data):
    dt = saved.result
    for g in ("posterior", "sample_stats", "observed_data", "log_likelihood",
              "posterior_predictive", "prior", "prior_predictive", "log_prior"):
        assert g in dt.children, g
    n = len(saved_rows(data))
    for g in ("observed_data", "log_likelihood", "posterior_predictive", "prior_predictive"):
        ds = dt[g]
        assert OBS_VAR in ds.data_vars and ds.sizes["obs"] == n, g
        assert ds.attrs["subsample"] == "false" and int(ds.attrs["n_rows_fitted"]) == n
    for c in ("config", "kind", "experiment"):  # per-row coordinates: observed_data only
        assert dt["observed_data"][c].dims == ("obs",)
        assert c not in dt["log_likelihood"].coords
    post = dt["posterior"]
    assert dt["log_likelihood"].sizes["draw"] == post.sizes["draw"]
    assert dt["posterior_predictive"].sizes["draw"] == post.sizes["draw"]
    assert dt["prior"].sizes["draw"] == FIT["prior_draws"]
    assert {"mu", "sigma_config"} <= set(dt["prior"].data_vars)
    assert not {"z_pop", "beta", "theta_pop"} & set(dt["prior"].data_vars)
    for v in ("beta", "alpha", "mu"):
        assert post[v].attrs.get("units") and post[v].attrs.get("long_name"), v
    assert dt["observed_data"][OBS_VAR].attrs["units"] == "log(µs)"
    # no non-index coordinates on the draws; no dimension named model (arviz-plots' own)
    for g in ("posterior", "prior", "log_prior", "log_likelihood", "posterior_predictive"):
        ds = dt[g].to_dataset()
        assert set(ds.coords) == set(ds.dims), g
        assert "model" not in ds.dims, g
    assert post["eff_model"].dims[2:] == ("llm", "coef") and post["z_tp"].dims[2:] == ("coef", "tp")
    const = dt["constant_data"]
    assert list(const["term_unit"].values)[:1] == ["1"]
    assert set(const["coef_kind"].values) == {"beta", "alpha"}
    fixed = json.loads(const.attrs["fixed_posterior_variables"])
    assert "sigma_gpu" in fixed  # a two-level factor: fixed scales, stored once
    for v in fixed:
        assert v in const.data_vars and v not in post.data_vars
    # terms without a TP effect (weight_loading, prior file): NaN in the posterior, 0 for use
    assert np.isnan(post["eff_tp"].sel(coef="weight_loading")).all()
    assert (saved._post()["eff_tp"].sel(coef="weight_loading") == 0).all()


def saved_rows(data) -> pd.DataFrame:
    from bayes_latency.model.definition.summaries import fit_rows

    return fit_rows(data[0])


def test_select_configurations_on_the_file(saved, tmp_path):
    # on the file alone, after a netCDF round trip: the configuration table is constant_data
    dt = xr.open_datatree(saved.save(tmp_path / "sel.nc"), engine="h5netcdf")
    gpu = saved._canonical("llama-2-7b", "H100")[1]  # the level name the fit stored
    h100 = select(dt, gpu="H100")  # alias H100 -> H100-SXM
    assert set(dt["constant_data"]["config_llm"].sel(config=h100).values) == {
        "llama-2-7b", "llama-2-70b", "mixtral-8x7b"}
    one = select(dt, llm="llama-2-70b", gpu="H100", tp=4)
    assert one == [f"llama-2-70b|{gpu}|tp4"]
    beta = dt["posterior"]["beta"].sel(config=one)
    assert beta.sizes["config"] == 1
    assert az.summary(dt, var_names=["beta"], coords={"config": one}).shape[0] == \
        len(dt["posterior"]["term"])
    assert select(dt, llm="llama-2-70b", tp=1) == []
    ds = saved.sel(model="llama-2-70b", gpu="H100", tp=4)  # alias H100 -> H100-SXM
    assert list(ds["config"].values) == [f"llama-2-70b|{gpu}|tp4"]
    assert len(saved.config_ids(gpu="H100")) == 3


def test_loads_with_embedded_priors_and_settings(saved):
    assert saved.priors.hash == saved.result.attrs["priors_hash"]
    assert saved._settings["draws"] == FIT["draws"]


def test_predict_batch_table_for_seen_and_unseen_configs(saved):
    batches = pd.DataFrame({"num_prefill_reqs": [1, 0], "prefill_tokens": [512, 0],
                            "prefill_attn_pairs": [512 * 256.5, 0], "prefill_kv_tokens": [512, 0],
                            "num_decode_reqs": [0, 32], "decode_tokens": [0, 32],
                            "decode_ctx_tokens": [0, 32_000]})
    seen = saved.predict_batches(batches, model="llama-2-7b", gpu="H100", tp=1)
    unseen = saved.predict_batches(batches, model="llama-3.1-8b", gpu="H100", tp=1)
    for band in (seen, unseen):
        assert isinstance(band, pd.DataFrame)
        assert (band["q05_us"] < band["mean_us"]).all() and (band["mean_us"] < band["q95_us"]).all()
    assert seen.attrs["unseen_levels"] == "" and "model" in unseen.attrs["unseen_levels"]
    width = lambda b: ((b["q95_us"] - b["q05_us"]) / b["mean_us"]).to_numpy()  # noqa: E731
    assert np.all(width(unseen) > width(seen))
    with pytest.raises(TypeError):
        saved.predict_batches(batches, model="llama-2-7b")
    # predict takes observation rows only, and says where a batch table goes
    with pytest.raises(Exception, match="predict_batches"):
        saved.predict(batches)
    with pytest.raises(TypeError):
        saved.predict(batches, model="llama-2-7b", gpu="H100", tp=1)


def test_predict_returns_draws_per_row(saved, data):
    obs, _ = data
    mu = saved.predict(obs.head(5), n_draws=20)
    assert isinstance(mu, xr.DataArray) and mu.dims == ("sample", "obs") and mu.shape == (20, 5)


# ----------------------------------------------------------------------- the ArviZ calls
def test_az_summary(saved):
    s = az.summary(saved.result, var_names=["beta"])
    assert len(s) == saved.result["posterior"]["beta"][0, 0].size


def test_az_loo_covers_every_row(saved, data):
    res = az.loo(saved.result)
    assert res.n_data_points == len(saved_rows(data)) and np.isfinite(res.elpd)


def test_az_loo_pit(saved):
    pit = az.loo_pit(saved.result)
    v = pit[OBS_VAR].values
    assert np.all((v >= -1e-6) & (v <= 1 + 1e-6)) and 0.3 < v.mean() < 0.7


def test_az_compare_two_variants(saved, subset):
    cmp = az.compare({"all_terms": saved.result, "subset": subset.result})
    assert set(cmp.index) == {"all_terms", "subset"}


def test_plot_forest_coefficients_by_configuration(saved):
    azp.plot_forest(saved.result, var_names=["beta"], coords={"term": ["decode_kv", "per_step"]},
                    backend="matplotlib")


@pytest.fixture(scope="module")
def thinned(saved, tmp_path_factory):
    """The file as ``save`` writes it by default (thinned, float32 draws, compressed)."""
    return LatencyModel.load(saved.save(tmp_path_factory.mktemp("arviz") / "default.nc")).result


def _no_runtime_warning(call):
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        return call()


DEFAULT_CALLS = {
    "summary": lambda dt: _no_runtime_warning(lambda: az.summary(dt)),
    "rhat": lambda dt: _no_runtime_warning(lambda: az.rhat(dt)),
    "ess": lambda dt: _no_runtime_warning(lambda: az.ess(dt)),
    "loo": lambda dt: az.loo(dt),
    "loo_pit": lambda dt: az.loo_pit(dt),
    "psense_summary": lambda dt: azs.psense_summary(dt),
    "plot_forest": lambda dt: azp.plot_forest(dt, backend="matplotlib"),
    "plot_trace_dist": lambda dt: azp.plot_trace_dist(dt, backend="matplotlib"),
    "plot_rank_dist": lambda dt: azp.plot_rank_dist(dt, backend="matplotlib"),
    "plot_ppc_dist": lambda dt: azp.plot_ppc_dist(dt, backend="matplotlib"),
    "plot_loo_pit": lambda dt: azp.plot_loo_pit(dt, backend="matplotlib"),
}


@pytest.mark.parametrize("name", list(DEFAULT_CALLS))
def test_defaults_on_the_whole_saved_file(thinned, name):
    """Each call with its defaults (no var_names) on the file ``save`` writes."""
    DEFAULT_CALLS[name](thinned)


def test_compare_two_saved_files(thinned, subset, tmp_path):
    other = LatencyModel.load(subset.save(tmp_path / "subset.nc")).result
    cmp = az.compare({"all_terms": thinned, "subset": other})
    assert set(cmp.index) == {"all_terms", "subset"}


@pytest.mark.xfail(strict=True, raises=ValueError, reason=(
    "arviz-plots 1.3: plot_prior_posterior without var_names concatenates the prior and the "
    "posterior with an outer join, so every element of every posterior variable gets a panel "
    "(beyond rcParams plot.max_subplots = 40 for any fit of this model: beta alone has "
    "configurations x terms elements), whatever the prior group holds"))
def test_plot_prior_posterior_defaults(thinned):
    azp.plot_prior_posterior(thinned, backend="matplotlib")


def test_plot_prior_posterior_of_the_prior_group(thinned):
    """The prior group's variables, each against its posterior."""
    azp.plot_prior_posterior(thinned, var_names=["mu", "sigma_config"], backend="matplotlib")


def test_saved_file_is_thinned_float32_and_keeps_free_variables_exact(saved, thinned):
    from bayes_latency.model.posterior.groups import FILE_MAX_SAMPLES

    n = saved.result["posterior"].sizes["chain"] * saved.result["posterior"].sizes["draw"]
    k = thinned.attrs["thinned_by"]
    assert k == -(-n // FILE_MAX_SAMPLES) and thinned.attrs["n_samples"] <= FILE_MAX_SAMPLES
    for g in ("posterior", "sample_stats", "log_likelihood", "posterior_predictive", "log_prior"):
        assert thinned[g].sizes["draw"] == len(range(0, saved.result["posterior"].sizes["draw"], k))
    assert thinned["posterior"]["beta"].dtype == np.float32
    assert thinned["posterior"]["z_pop"].dtype == np.float64  # a free variable


def test_pointwise_loglik_has_the_log_likelihood_layout(saved, data):
    rows = saved_rows(data)
    ll = saved.pointwise_loglik(rows)
    ref = saved.result["log_likelihood"][OBS_VAR]
    assert ll.name == OBS_VAR and ll.dims == ref.dims == ("chain", "draw", "obs")
    np.testing.assert_allclose(ll.sel(obs=ref["obs"].values).values, ref.values, atol=1e-5)


def test_plot_forest_all_variables(saved):
    """Worked only once the LLM dimension was not named ``model``: arviz-plots lays out the y
    offsets of a multi-fit plot by that name."""
    azp.plot_forest(saved.result, backend="matplotlib")


def test_plot_trace_and_rank(saved):
    azp.plot_trace_dist(saved.result, var_names=["mu"], coords={"coef": ["decode_kv"]},
                        backend="matplotlib")
    azp.plot_rank_dist(saved.result, var_names=["mu"], coords={"coef": ["decode_kv"]},
                       backend="matplotlib")


def test_plot_ppc_dist_and_loo_pit(saved):
    azp.plot_ppc_dist(saved.result, backend="matplotlib")
    azp.plot_loo_pit(saved.result, backend="matplotlib")


def test_plot_prior_posterior(saved):
    azp.plot_prior_posterior(saved.result, var_names=["mu"], coords={"coef": ["decode_kv"]},
                             backend="matplotlib")


def test_psense_summary_and_check_report(saved):
    tab = azs.psense_summary(saved.result, var_names=["mu"])
    assert {"prior", "likelihood"} <= set(tab.columns)
    sens = prior_sensitivity(saved.result)
    assert set(sens.index) == set(saved.coefs)
    assert set(sens["verdict"]) <= {"prior-dominated", "data-dominated", "prior-data conflict",
                                    "insensitive"}
    md = diagnose(saved.result).to_markdown()
    assert "## Prior sensitivity" in md and "## Identifiability" in md


def test_thinned_file_keeps_groups_aligned(saved, tmp_path):
    path = saved.save(tmp_path / "thin.nc", thin=4)
    m = LatencyModel.load(path)
    dt = m.result
    n = saved.result["posterior"].sizes["draw"]
    for g in ("posterior", "log_likelihood", "posterior_predictive", "log_prior"):
        assert dt[g].sizes["draw"] == len(range(0, n, 4)), g
    assert dt.attrs["thinned_by"] == 4
    assert np.isfinite(az.loo(dt).elpd) and az.loo_pit(dt)[OBS_VAR].size == dt["observed_data"].sizes["obs"]


def test_subsample_is_labelled_and_scaled_in_the_report(saved, data):
    from bayes_latency.model.posterior.groups import predictive_rows

    rows = saved_rows(data)
    sub, flag = predictive_rows(rows, n_samples=1000, seed=0, max_values=100 * 1000)
    assert flag and len(sub) == 100
    dt = saved.result.copy()
    ll = dt["log_likelihood"].to_dataset()
    ll.attrs.update({"subsample": "true", "n_rows_fitted": 2 * ll.sizes["obs"]})
    dt["log_likelihood"] = ll
    loo = diagnose(dt).loo
    assert "subsample" in loo and loo["elpd_all_rows"] == pytest.approx(2 * loo["elpd"], rel=1e-6)


def test_non_default_priors_load_check_and_export_from_the_file_alone(saved, tmp_path):
    """A file whose embedded priors differ from the default ones rebuilds with them."""
    import argparse

    import yaml

    from bayes_latency.cli.check import check_command
    from bayes_latency.cli.export import export_command
    from bayes_latency.errors import ModelMismatchError
    from bayes_latency.priors import load_priors

    content = yaml.safe_load(saved.result.attrs["priors_yaml"])
    content["terms"]["decode_kv"]["median"] = 1.7  # a non-default prior
    custom = load_priors(content)
    assert custom.hash != load_priors().hash
    dt = saved.result.copy()
    dt.attrs.update({"priors_yaml": yaml.safe_dump(custom.content(), sort_keys=False),
                     "priors_hash": custom.hash})
    path = tmp_path / "custom.nc"
    dt.to_netcdf(path, engine="h5netcdf")
    m = LatencyModel.load(path)
    assert m.priors.hash == custom.hash and m.priors.term("decode_kv")["median"] == 1.7
    assert check_command(argparse.Namespace(posterior=str(path), out=str(tmp_path / "chk"),
                                            tables=None)) in (0, 1)
    assert "Prior sensitivity" in (tmp_path / "chk" / "diagnostics.md").read_text()
    assert export_command(argparse.Namespace(posterior=str(path), model="llama-2-7b", gpu="H100",
                                             tp=1, draws=0, format="json",
                                             out=str(tmp_path / "e.json"))) == 0
    with pytest.raises(ModelMismatchError, match="load without priors"):
        LatencyModel.load(path, priors=load_priors())
    dt.attrs["priors_hash"] = "0" * 64  # embedded priors no longer match the recorded hash
    dt.to_netcdf(tmp_path / "bad.nc", engine="h5netcdf")
    with pytest.raises(ModelMismatchError, match="altered"):
        LatencyModel.load(tmp_path / "bad.nc")


def test_log_prior_is_pymcs_compute_log_prior(saved, data):
    """The vectorized log prior (one call over all draws, no Numba compile) gives PyMC's numbers."""
    import pymc as pm
    import xarray as xr

    from bayes_latency.model.posterior.groups import log_prior

    obs, _ = data
    pm_model = LatencyModel().build(obs)
    post = saved.result["posterior"].to_dataset().isel(draw=slice(0, 15))
    free = [v.name for v in pm_model.free_RVs]
    ref = pm.stats.compute_log_prior(xr.DataTree.from_dict({"posterior": post[free]}),
                                     model=pm_model, extend_inferencedata=False, progressbar=False)
    ref = ref.to_dataset() if isinstance(ref, xr.DataTree) else ref
    mine = log_prior(pm_model, post)
    assert sorted(mine.data_vars) == sorted(ref.data_vars) == sorted(free)
    for v in free:
        assert mine[v].dims == ref[v].dims
        np.testing.assert_allclose(mine[v].values, ref[v].values, rtol=1e-10, atol=1e-10)
