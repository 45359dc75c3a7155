"""The ArviZ groups of a fit: what makes the result a full ArviZ citizen.

The stage-2 likelihood of the fast path is marginal (each configuration's coefficients are
integrated out by :mod:`bayes_latency.model.definition.marginal`), so PyMC cannot produce the observation-level groups by
itself. They are computed here, after sampling, from the conditional configuration draws
(``beta``, ``alpha``) and the row likelihood of :mod:`bayes_latency.model.definition.likelihood`:

``observed_data``
    ``log_duration (obs)``: log of every fitted row's measured duration (log µs), with the
    non-index coordinates ``config``, ``kind``, ``experiment`` and ``n_steps`` on ``obs`` (in
    this group only: the draw groups carry the ``obs`` index alone, so ArviZ's functions that
    combine variables or groups find the same coordinates everywhere).
``log_likelihood``
    ``log_duration (chain, draw, obs)``: ``log p(log y_i | theta_c, noise)`` for every fitted row
    and every posterior draw (the same rows as ``observed_data``).
``posterior_predictive``
    ``log_duration (chain, draw, obs)``: a replicated log duration per row and posterior draw,
    with the fitted heavy-tailed noise. ArviZ's ``loo_pit`` weighs the predictive draws with the
    PSIS weights of the log-likelihood, so the two groups hold the same draws (ArviZ aligns them
    exactly).
``prior``, ``prior_predictive``
    ``prior``: the prior draws of what a user compares with the posterior (:data:`PRIOR_VARS`:
    the population means ``mu``, the residual scale ``sigma_config`` and the sampled effect
    scales ``sigma_<factor>``), from ``pm.sample_prior_predictive`` (the likelihood term is not
    sampled). ``prior_predictive``: replicated log durations of the first
    :data:`PRIOR_PREDICTIVE_DRAWS` prior draws, through ``beta`` / ``alpha`` drawn from the
    configuration residual given them.
``log_prior``
    ``log p`` of every free variable of the PyMC model at each posterior draw
    (``pm.compute_log_prior``): the *top-level* priors, which is what prior power-scaling
    (:func:`arviz_stats.psense`) scales.

All groups keep one variable name (``log_duration``) across ``observed_data``,
``posterior_predictive``, ``log_likelihood`` and ``prior_predictive``, so ``az.loo``,
``az.loo_pit``, ``azp.plot_ppc_dist`` and ``azp.plot_loo_pit`` work on the result without glue.

When ``rows x samples a saved file keeps`` (:data:`FILE_MAX_SAMPLES`)
would exceed :data:`MAX_PREDICTIVE_VALUES`, the observation groups hold a random subsample of the
rows instead, and their attributes say so (``subsample = "true"``, ``n_rows_fitted``).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import xarray as xr

from bayes_latency.model.definition.design import filled
from bayes_latency.model.definition.noise import row_noise
from bayes_latency.model.definition.rows import feature_columns
from bayes_latency.model.posterior.predict import config_theta, pointwise_loglik
from bayes_latency.model.posterior.shifts import fitted_log_shifts

if TYPE_CHECKING:  # pragma: no cover
    import pymc as pm

    from bayes_latency.model.posterior.state import FitState

#: Name of the observed variable in every observation-level group.
OBS_VAR = "log_duration"
#: Observation dimension.
OBS_DIM = "obs"
#: Prior draws stored in ``prior`` and ``prior_predictive``.
PRIOR_DRAWS = 500
#: PyTensor mode of the prior-sampling and log-prior functions (None: PyTensor's default, Numba).
#: "FAST_COMPILE" (Python linker, no Numba compilation): measured on the demo fit,
#: prior 1.0 s with it against 0.9 s with Numba on warm caches but 8.5 s on empty ones (a first
#: fit compiles every Op of the prior graph); the log prior is evaluated once on all posterior
#: draws (a vectorized graph, :func:`log_prior`), 1.5 s for 2000 draws, where PyMC's per-draw
#: loop with Numba took 1.8 s warm and 4.5 s cold.
PRIOR_MODE: str | None = "FAST_COMPILE"
#: At most this many posterior samples (chain x draw) in a saved file: :func:`save_result` thins
#: every draw-indexed group together by the factor that keeps at most this many (``psense`` needs
#: ``log_likelihood`` and ``log_prior`` on the posterior's draws, ``loo_pit`` the predictive on the
#: log-likelihood's). 800 samples keep the bulk ESS of a fit that passes the gates above 400
#: (NUTS draws are autocorrelated, so thinning loses less than its factor: the tiny fleet's
#: 2 x 2000 draws, min bulk ESS 1207, thinned by 5); ``thin=1`` keeps every draw.
FILE_MAX_SAMPLES = 800
#: Largest ``rows x samples`` of one observation-level group in a saved file (the samples a saved
#: file keeps, :data:`FILE_MAX_SAMPLES`; float32, 4 bytes each
#: before compression). Above it the groups hold a labelled random subsample of rows: the tiny
#: fleet (2,199 rows x 800 samples) is covered row by row, the demo fit (80,400 rows) keeps
#: 2,500 rows.
MAX_PREDICTIVE_VALUES = 2_000_000
#: Prior draws replicated in ``prior_predictive`` (the first of the ``prior`` group's draws).
PRIOR_PREDICTIVE_DRAWS = 100
#: Variables of the ``prior`` group besides the sampled effect scales ``sigma_<factor>``: the
#: population quantities whose priors the prior file sets. The standardised ``z_*``, the derived
#: ``theta_pop`` / ``eff_*`` and the configuration draws ``beta`` / ``alpha`` (whose prior reaches
#: the data through ``prior_predictive``) are not in it.
PRIOR_VARS = ("mu", "sigma_config")

#: Units and meaning of the variables, written into their attrs.
VARIABLE_ATTRS: dict[str, dict[str, str]] = {
    "beta": {"long_name": "iteration-time coefficients of one configuration",
             "units": "per term, see constant_data term_unit (1 for roofline terms: multiplier "
                      "of a roofline time in µs; µs per unit for overhead terms)"},
    "alpha": {"long_name": "request overhead coefficients of one configuration",
              "units": "per term, see constant_data alpha_term_unit (µs or µs/token)"},
    "theta_pop": {"long_name": "population-implied coefficient of a configuration "
                  "(median of its configuration residual)", "units": "as beta / alpha (coef)"},
    "mu": {"long_name": "population log-coefficient (ARD relevance folded in)",
           "units": "log of the coefficient unit"},
    "relevance": {"long_name": "ARD relevance of a gated term (1: in use, ~0: switched off); "
                  "terms without a gate (not on ard_term) have relevance 1", "units": "1"},
    "z_pop": {"long_name": "standardised population log-coefficient", "units": "1"},
    "sigma_config": {"long_name": "relative sd of a configuration's coefficients around the "
                     "population prediction", "units": "1 (fraction)"},
    "sigma_config_free": {"long_name": "sampled residual scale (used where the coefficient has "
                          "data in 2+ configurations; else sigma_config is the prior median)",
                          "units": "1 (fraction)"},
    "sigma_model": {"long_name": "sd of the LLM effect on log-coefficients", "units": "log"},
    "sigma_gpu": {"long_name": "sd of the GPU effect on log-coefficients", "units": "log"},
    "sigma_tp": {"long_name": "sd of the TP-degree effect on log-coefficients", "units": "log"},
    "sigma_stack": {"long_name": "sd of the serving-stack effect on log-coefficients",
                    "units": "log"},
    "eff_model": {"long_name": "LLM effect on log-coefficients (zero-sum, over llm)",
                  "units": "log"},
    "eff_gpu": {"long_name": "GPU effect on log-coefficients (zero-sum)", "units": "log"},
    "eff_tp": {"long_name": "TP-degree effect on log-coefficients (zero-sum)", "units": "log"},
    "eff_stack": {"long_name": "serving-stack effect on log-coefficients (zero-sum)",
                  "units": "log"},
    "z_model": {"long_name": "standardised LLM effect (over llm)", "units": "1"},
    "z_gpu": {"long_name": "standardised GPU effect", "units": "1"},
    "z_tp": {"long_name": "standardised TP-degree effect", "units": "1"},
    "z_stack": {"long_name": "standardised serving-stack effect", "units": "1"},
    "eps_config": {"long_name": "standardised configuration residual (full path)", "units": "1"},
    "z_config": {"long_name": "standardised configuration coefficient (no_pooling)",
                 "units": "1"},
    "noise_sigma": {"long_name": "log-scale sd of one step's duration", "units": "log"},
    "noise_tau": {"long_name": "anchor timing error of a step window", "units": "log"},
    "noise_nu": {"long_name": "Student-t degrees of freedom", "units": "1"},
    OBS_VAR: {"long_name": "log of a measured duration (iteration, step window, request "
              "overhead)", "units": "log(µs)"},
}


def _attrs_for(name: str) -> dict[str, str]:
    if name in VARIABLE_ATTRS:
        return dict(VARIABLE_ATTRS[name])
    for prefix in ("tau_", "zeta_"):
        if name.startswith(prefix):
            return {"long_name": f"pooled effect-scale parameter {name}", "units": "1"}
    return {}


def annotate(ds: xr.Dataset, kind: str = "") -> xr.Dataset:
    """Write units and meaning into the attrs of every variable of ``ds`` (in place; returned).

    ``kind`` = ``"log_density"`` for ``log_prior`` / ``log_likelihood`` groups.
    """
    for v in ds.data_vars:
        if kind == "log_density":
            ds[v].attrs.update({"long_name": f"pointwise log density of {v}",
                                "units": "nats"})
        else:
            ds[v].attrs.update(_attrs_for(str(v)))
    return ds


def coef_units(names: Any) -> list[str]:
    """Unit of each coefficient (``constant_data`` ``coef_unit`` / ``term_unit`` /
    ``alpha_term_unit``)."""
    from bayes_latency.physics.basis import ALPHA_TERM_INFO, get_term

    return [ALPHA_TERM_INFO[n].unit if n in ALPHA_TERM_INFO else get_term(n).unit
            for n in map(str, names)]


# ------------------------------------------------------------------------------ row selection
def predictive_rows(rows: pd.DataFrame, n_samples: int, seed: int,
                    max_values: int = MAX_PREDICTIVE_VALUES) -> tuple[pd.DataFrame, bool]:
    """Rows the observation-level groups cover: all of them, or a labelled random subsample."""
    if len(rows) * max(n_samples, 1) <= max_values:
        return rows, False
    n = max(1, max_values // max(n_samples, 1))
    return rows.sample(n=n, random_state=seed).sort_index(), True


def _obs_coords(rows: pd.DataFrame, per_row: bool = False) -> dict[str, Any]:
    """The ``obs`` index (the rows' ``obs_id``); with ``per_row`` (``observed_data``), the rows'
    ``config``, ``kind``, ``experiment`` and ``n_steps`` as non-index coordinates too."""
    coords: dict[str, Any] = {OBS_DIM: rows["obs_id"].astype(str).to_numpy()}
    if per_row:
        exp = rows["experiment_id"].astype(str).to_numpy() if "experiment_id" in rows else \
            np.full(len(rows), "", dtype=object).astype(str)
        coords.update({"config": (OBS_DIM, rows["config_id"].astype(str).to_numpy()),
                       "kind": (OBS_DIM, rows["kind"].astype(str).to_numpy()),
                       "experiment": (OBS_DIM, exp),
                       "n_steps": (OBS_DIM, rows["n_steps"].to_numpy(dtype=float))})
    return coords


def _group_attrs(rows: pd.DataFrame, n_fitted: int, subsample: bool) -> dict[str, Any]:
    return {"n_rows": len(rows), "n_rows_fitted": n_fitted,
            "subsample": "true" if subsample else "false",
            "rows": ("a random subsample of the fitted rows (see n_rows / n_rows_fitted): LOO "
                     "scores these rows only" if subsample else "every fitted row")}


def observed_data(rows: pd.DataFrame, n_fitted: int, subsample: bool) -> xr.Dataset:
    """``observed_data``: log of each row's measured duration (log µs)."""
    ds = xr.Dataset({OBS_VAR: (OBS_DIM, np.log(rows["value_us"].to_numpy(dtype=float)))},
                    coords=_obs_coords(rows, per_row=True))
    ds.attrs.update(_group_attrs(rows, n_fitted, subsample))
    return annotate(ds)


def _row_inputs(state: FitState, rows: pd.DataFrame, shifted: bool = True
                ) -> tuple[np.ndarray, ...]:
    X = rows[feature_columns(state.coefs)].to_numpy(dtype=float)
    # the offset of multi-step rows (.likelihood) shifts log y like the observed values
    scale, nu, off = row_noise(state.noise, rows)
    if shifted:  # a fitted run's rows sit off the configuration by its fitted shift
        off = off + fitted_log_shifts(state.runs, rows)
    return X, scale, nu, rows["config_id"].astype(str).to_numpy(), off


def log_likelihood(state: FitState, rows: pd.DataFrame, post: xr.Dataset,
                   n_fitted: int, subsample: bool) -> xr.Dataset:
    """``log_likelihood``: pointwise row log-likelihood at every posterior draw (float32)."""
    ll = pointwise_loglik(post, state.coefs, state.noise, rows, runs=state.runs)
    ds = xr.Dataset({OBS_VAR: (("chain", "draw", OBS_DIM), ll.values)},
                    coords={"chain": post["chain"].values, "draw": post["draw"].values,
                            **_obs_coords(rows)})
    ds.attrs.update(_group_attrs(rows, n_fitted, subsample))
    ds.attrs["computed"] = ("after sampling, from the conditional configuration draws beta/alpha "
                            "and the Student-t row likelihood on the log scale, a fitted run's "
                            "rows about its fitted shift")
    return annotate(ds, "log_density")


def _replicate(state: FitState, rows: pd.DataFrame, theta_of: Any, S: int,
               rng: np.random.Generator, shifted: bool = True) -> np.ndarray:
    X, scale, nu, cfg, off = _row_inputs(state, rows, shifted)
    out = np.empty((S, len(rows)), dtype=np.float32)
    for c in pd.unique(cfg):
        m = cfg == c
        mu = np.maximum(theta_of(c) @ X[m].T, 1e-12)
        t = rng.standard_t(np.broadcast_to(nu[m][None, :], mu.shape))
        out[:, m] = np.log(mu) + off[m][None, :] + scale[m][None, :] * t
    return out


def posterior_predictive(state: FitState, rows: pd.DataFrame, post: xr.Dataset, seed: int,
                         n_fitted: int, subsample: bool) -> xr.Dataset:
    """``posterior_predictive``: one replicated log duration per row and posterior draw."""
    C, D = post.sizes["chain"], post.sizes["draw"]
    vals = _replicate(state, rows, lambda c: config_theta(post, c), C * D,
                      np.random.default_rng(seed + 11))
    ds = xr.Dataset({OBS_VAR: (("chain", "draw", OBS_DIM), vals.reshape(C, D, -1))},
                    coords={"chain": post["chain"].values, "draw": post["draw"].values,
                            **_obs_coords(rows)})
    ds.attrs.update(_group_attrs(rows, n_fitted, subsample))
    ds.attrs.update({"n_samples": C * D, "draws": "every posterior draw (chain x draw): ArviZ's "
                     "loo_pit needs the predictive and log-likelihood draws to match",
                     "noise": "fitted Student-t noise on the log scale per (config, noise class: kind, prefill steps apart)",
                     "runs": "a fitted run's rows about its fitted shift"})
    return annotate(ds)


# ------------------------------------------------------------------------------ prior
def prior_groups(state: FitState, pm_model: pm.Model, rows: pd.DataFrame, seed: int,
                 n_fitted: int, subsample: bool, draws: int = PRIOR_DRAWS,
                 ) -> tuple[xr.Dataset, xr.Dataset]:
    """``prior`` (:data:`PRIOR_VARS` and the sampled scales) and ``prior_predictive`` (log
    durations).

    The PyMC model's likelihood is a ``pm.Potential`` (fast path), which prior sampling ignores;
    the population variables come from ``pm.sample_prior_predictive`` and the configuration
    coefficients from the configuration residual given them, ``theta ~ N(m, (m sigma_config)^2)``
    restricted to ``theta >= 0``, as in the model. Replicated rows use the fitted noise (the
    fast path fixes the noise at its stage-1 estimates).
    """
    import pymc as pm
    import pytensor

    from bayes_latency.model.definition.conditional import truncated_normal_positive

    names = [v.name for v in pm_model.free_RVs + pm_model.deterministics]
    # cxx="": the inner functions of the OpFromGraph random variables (ZeroSumNormal) in Python
    # too, not C thunks built by gcc on empty caches (11 modules, ~7 s of a machine's first demo
    # fit; same draws)
    with warnings.catch_warnings(), pytensor.config.change_flags(cxx=""):
        warnings.filterwarnings("ignore", message=".*Potential.*")
        pr = pm.sample_prior_predictive(draws=draws, model=pm_model, var_names=names,
                                        random_seed=seed + 13,
                                        compile_kwargs=_compile_kwargs())
    prior = pr["prior"].to_dataset() if isinstance(pr, xr.DataTree) else pr.prior
    rng = np.random.default_rng(seed + 17)
    d = state.design
    nb = len(state.terms)
    if "beta" not in prior:
        m = prior["theta_pop"].transpose("chain", "draw", "config", "coef").values
        sc = filled(prior["sigma_config"], _sigma_config_fixed(state))
        sc = sc.transpose("chain", "draw", "coef").values[:, :, None, :]
        theta = truncated_normal_positive(m, np.maximum(m * sc, 1e-300), rng)
        prior = prior.assign(
            beta=(("chain", "draw", "config", "term"), theta[..., :nb]),
            alpha=(("chain", "draw", "config", "alpha_term"), theta[..., nb:]),
        ).assign_coords(term=list(state.terms), alpha_term=list(state.alpha_terms))
    full = prior.isel(draw=slice(0, PRIOR_PREDICTIVE_DRAWS))
    keep = [v for v in prior.data_vars
            if v in PRIOR_VARS or (str(v).startswith("sigma_") and v != "sigma_config_free")]
    prior = annotate(prior[keep])
    prior.attrs["draws"] = (f"{prior.sizes['draw']} draws of the prior of the population "
                            "variables, by pm.sample_prior_predictive")
    C, D = full.sizes["chain"], full.sizes["draw"]
    cfg_of = {c: config_theta(full, c) for c in d.configs.index}
    vals = _replicate(state, rows, lambda c: cfg_of[c], C * D, rng, shifted=False)
    pp = xr.Dataset({OBS_VAR: (("chain", "draw", OBS_DIM), vals.reshape(C, D, -1))},
                    coords={"chain": full["chain"].values, "draw": full["draw"].values,
                            **_obs_coords(rows)})
    pp.attrs["draws"] = (f"the first {D} draws of the prior, beta/alpha from the configuration "
                         "residual given them")
    pp.attrs.update(_group_attrs(rows, n_fitted, subsample))
    pp.attrs["noise"] = "fitted Student-t noise on the log scale per (config, noise class: kind, prefill steps apart)"
    return prior, annotate(pp)


def _sigma_config_fixed(state: FitState) -> float:
    """The residual scale of coefficients with data in fewer than two configurations (the
    prior median; ``sigma_config_fixed`` of ``constant_data``)."""
    from bayes_latency.model.definition.design import prior_arrays

    return float(prior_arrays(state.priors, state.coefs, state.design.gpus)
                 .sigma_config["median"])


def _compile_kwargs() -> dict[str, str] | None:
    return {"mode": PRIOR_MODE} if PRIOR_MODE else None


def log_prior(pm_model: pm.Model, post: xr.Dataset) -> xr.Dataset:
    """``log_prior``: elementwise log density of every free variable at each posterior draw.

    The same numbers as ``pm.stats.compute_log_prior`` (log densities of the untransformed free
    variables, same names and dims), computed by one call of a graph vectorized over the
    posterior draws instead of one call per draw, in :data:`PRIOR_MODE`.
    """
    import pymc
    import pytensor
    from pymc.backends.arviz import coords_and_dims_for_inferencedata, dict_to_dataset
    from pymc.model.transform.conditioning import remove_value_transforms
    from pytensor.graph.replace import vectorize_graph

    umodel = remove_value_transforms(pm_model)
    free = list(umodel.free_RVs)
    names = [rv.name for rv in free]
    values = [umodel.rvs_to_values[rv] for rv in free]
    batched = [v.type.clone(shape=(None, *v.type.shape))(name=v.name) for v in values]
    outs = vectorize_graph(umodel.logp(vars=free, sum=False), replace=dict(zip(values, batched,
                                                                                strict=True)))
    fn = pytensor.function(batched, outs, mode=PRIOR_MODE, on_unused_input="ignore")
    C, D = post.sizes["chain"], post.sizes["draw"]
    args = [np.ascontiguousarray(post[n].transpose("chain", "draw", ...).values
                                 .reshape(C * D, *post[n].shape[2:]), dtype=v.type.dtype)
            for n, v in zip(names, values, strict=True)]
    res = fn(*args)
    coords, dims = coords_and_dims_for_inferencedata(umodel)
    ds = dict_to_dataset({n: np.asarray(r).reshape(C, D, *np.shape(r)[1:])
                          for n, r in zip(names, res, strict=True)},
                         inference_library=pymc, dims=dims,
                         coords={**coords, "chain": post["chain"].values,
                                 "draw": post["draw"].values},
                         sample_dims=["chain", "draw"], skip_event_dims=True)
    ds = ds.to_dataset() if isinstance(ds, xr.DataTree) else ds
    ds.attrs["meaning"] = ("log prior density of the free variables of the PyMC model (the "
                           "top-level priors); beta/alpha are integrated out on the fast path")
    return annotate(ds, "log_density")


def add_groups(result: xr.DataTree, state: FitState, pm_model: pm.Model | None,
               rows: pd.DataFrame, seed: int, prior_draws: int = PRIOR_DRAWS
               ) -> tuple[dict[str, float], list[str]]:
    """Add every ArviZ group to ``result`` (in place) from its posterior, the fit's state and
    its rows; returns timings in seconds and notes for the fit report."""
    import time

    timings: dict[str, float] = {}
    notes: list[str] = []
    res = result
    post = res["posterior"].to_dataset()

    # rows x the samples a saved file keeps (save thins every draw-indexed group together)
    S = min(post.sizes["chain"] * post.sizes["draw"], FILE_MAX_SAMPLES)
    sub_rows, subsample = predictive_rows(rows, S, seed)
    n_fitted = len(rows)
    t0 = time.perf_counter()
    res["observed_data"] = xr.DataTree(observed_data(sub_rows, n_fitted, subsample))
    res["log_likelihood"] = xr.DataTree(log_likelihood(state, sub_rows, post, n_fitted, subsample))
    timings["log_likelihood_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    res["posterior_predictive"] = xr.DataTree(
        posterior_predictive(state, sub_rows, post, seed, n_fitted, subsample))
    timings["posterior_predictive_s"] = time.perf_counter() - t0
    if pm_model is None:
        return timings, notes
    if prior_draws > 0:
        t0 = time.perf_counter()
        prior, prior_pp = prior_groups(state, pm_model, sub_rows, seed, n_fitted, subsample,
                                       draws=prior_draws)
        res["prior"] = xr.DataTree(prior)
        res["prior_predictive"] = xr.DataTree(prior_pp)
        timings["prior_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    try:
        res["log_prior"] = xr.DataTree(log_prior(pm_model, post))
    except Exception as e:  # noqa: BLE001 - e.g. an approximate posterior without free RVs
        notes.append(f"log_prior group not computed: {type(e).__name__}: {e}")
    timings["log_prior_s"] = time.perf_counter() - t0
    return timings, notes
