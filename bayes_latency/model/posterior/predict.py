"""Coefficient draws of any configuration and the predictions made from them.

- :func:`config_ids`, :func:`canonical_levels`: fitted configurations matching levels, names
  resolved (GPU aliases, Hugging Face model names).
- :func:`coefficient_draws`: ``beta (sample, term)`` and ``alpha (sample, alpha_term)`` of a
  seen configuration (its fitted draws) or an unseen one (:func:`bayes_latency.model.posterior.unseen.unseen_config_theta`).
- :func:`predict_rows`, :func:`replicate_rows`, :func:`pointwise_loglik`: expected values,
  posterior predictive draws and pointwise log-likelihood of observation rows.
- :func:`predict_reference` (with :func:`reference_batches` and :func:`coefficient_arrays`):
  iteration times of a batch table, with 90% bands, from a configuration's coefficient draws;
  the export document (:mod:`bayes_latency.export.document`) uses it too.

Importing this module is light (no PyMC, PyTensor or ArviZ).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from bayes_latency.data.observations.build import DEFAULT_STACK, config_id
from bayes_latency.errors import BayesLatencyError, ConfigError
from bayes_latency.model.definition.likelihood import row_loglik, student_t_draws
from bayes_latency.model.definition.noise import NoiseTable, row_noise
from bayes_latency.model.definition.rows import feature_columns
from bayes_latency.model.posterior.shifts import (
    RunTable,
    fitted_log_shifts,
    new_run_factor,
    row_shifts,
)
from bayes_latency.model.posterior.state import FitState

#: Run status of rows predicted by a fit without run effects (the full path).
NO_RUN_EFFECTS = "no run effects"


# ------------------------------------------------------------------------------ levels
def canonical_levels(design: Any, model: str, gpu: str) -> tuple[str, str]:
    """``(model, gpu)`` as the fit names them: fitted levels as they are, others resolved."""
    from bayes_latency.physics.hardware import load_gpu
    from bayes_latency.physics.models import load_architecture

    if model not in list(design.models):
        model = load_architecture(model).name
    if gpu not in list(design.gpus):
        gpu = load_gpu(gpu).name
    return model, gpu


def config_ids(design: Any, model: str | None = None, gpu: str | None = None,
               tp: int | None = None, stack: str | None = None) -> list[str]:
    """Fitted configuration ids of ``design`` matching the given levels (None matches all);
    aliases resolve like :func:`canonical_levels`."""
    from bayes_latency.physics.hardware import load_gpu
    from bayes_latency.physics.models import load_architecture

    c = design.configs
    keep = np.ones(len(c), dtype=bool)
    if model is not None:
        m = model if model in set(c["model"]) else load_architecture(model).name
        keep &= (c["model"] == m).to_numpy()
    if gpu is not None:
        g = gpu if gpu in set(c["gpu"]) else load_gpu(gpu).name
        keep &= (c["gpu"] == g).to_numpy()
    if tp is not None:
        keep &= (c["tp"].astype(int) == int(tp)).to_numpy()
    if stack is not None:
        keep &= (c["stack"] == stack).to_numpy()
    return [str(i) for i in c.index[keep]]


# ------------------------------------------------------------------------------ coefficients
def coefficient_draws(state: FitState, post: xr.Dataset, model: str, gpu: str, tp: int,
                      n_draws: int | None = None, seed: int = 0,
                      stack: str = DEFAULT_STACK, new_run: bool = False) -> xr.Dataset:
    """Posterior draws of beta and alpha of any configuration, from the posterior ``post``
    (chain, draw): :meth:`LatencyModel.coefficients
    <bayes_latency.model.estimator.LatencyModel.coefficients>`, which documents it.
    ``new_run``: each draw times the factor of a new run of the configuration
    (:func:`~bayes_latency.model.posterior.shifts.new_run_factor`; attrs ``run``)."""
    from bayes_latency.model.definition.design import prior_arrays
    from bayes_latency.model.posterior.unseen import kernel_terms_of, unseen_config_theta

    model, gpu = canonical_levels(state.design, model, gpu)
    post = post.stack(sample=("chain", "draw"))
    rng = np.random.default_rng(seed)
    pa = prior_arrays(state.priors, state.coefs, [gpu])
    unseen: list[str] = []
    cid = config_id(model, gpu, tp, stack)
    if cid in state.design.configs.index:
        theta = np.concatenate([post["beta"].sel(config=cid).values,
                                post["alpha"].sel(config=cid).values], axis=0).T
    elif state.variant == "no_pooling":
        raise ConfigError(f"the no_pooling variant cannot speak for unseen configuration {cid}")
    elif state.variant == "population":
        raise ConfigError(f"{cid} is not a configuration of this fit; a fit under a fleet's "
                          "population speaks for its own configurations (the population itself, "
                          "or a fit of its tables, speaks for others)")
    else:
        theta, unseen = unseen_config_theta(post, pa, model, gpu, int(tp), stack, rng,
                                            design=state.design, variant=state.variant)
    run: dict[str, object] = {"run": "configuration"}
    if "gpu" in unseen and (kt := kernel_terms_of(post, gpu)):
        run["kernel_terms"] = ",".join(kt)
    if new_run and state.runs is not None and "sigma_run" in post:
        theta = theta * new_run_factor(state.runs, post, cid, theta.shape[0], seed=seed)[:, None]
        run = {"run": "new run", "sigma_run": float(post["sigma_run"].mean()),
               "n_runs": int(state.runs.n_runs.get(cid, 0))}
    elif new_run:  # the fit has no run-to-run scale: a new run's draws are the configuration's
        run = {"run": "new run, no run scale"}
    return coefficient_dataset(theta, state.terms, state.alpha_terms, rng, n_draws,
                               model=model, gpu=gpu, tp=int(tp), stack=stack,
                               unseen_levels=",".join(unseen), config_id=cid, **run)


def coefficient_dataset(theta: np.ndarray, terms: Sequence[str], alpha_terms: Sequence[str],
                        rng: np.random.Generator, n_draws: int | None = None,
                        **attrs: object) -> xr.Dataset:
    """``(sample, coef)`` coefficient draws (beta terms, then alpha terms) as the Dataset of
    :func:`coefficient_draws`: ``beta (sample, term)``, ``alpha (sample, alpha_term)``, ``attrs``
    (``model``, ``gpu``, ``tp``, ``stack``, ``unseen_levels``, ``config_id``); ``n_draws`` of
    them drawn without replacement (in their order) when there are more."""
    S = theta.shape[0]
    if n_draws is not None and int(n_draws) < S:
        theta = theta[np.sort(rng.choice(S, size=int(n_draws), replace=False))]
    nb = len(terms)
    ds = xr.Dataset({"beta": (("sample", "term"), theta[:, :nb]),
                     "alpha": (("sample", "alpha_term"), theta[:, nb:])},
                    coords={"term": list(terms), "alpha_term": list(alpha_terms)})
    ds.attrs.update(attrs)
    return ds


def mu_rows(state: FitState, post: xr.Dataset, observations: pd.DataFrame, X: np.ndarray,
            n_draws: int, seed: int, run: str = "auto") -> tuple[np.ndarray, np.ndarray]:
    """(S, n) expected value of each row under the coefficient draws of its configuration and
    the shift of its run (:func:`bayes_latency.model.posterior.shifts.row_shifts`; ``run``: one
    of its modes), and each row's run status.

    Per configuration ``einsum("sk,nk->sn")`` of its (S, K) draws and its rows' features: no
    (S, n, K) array of each row's coefficients (1.2 GB on the demo's ~51,000 step rows). S is
    ``n_draws``, or every posterior draw when there are fewer.
    """
    n_draws = min(int(n_draws), int(post.sizes["chain"] * post.sizes["draw"]))
    out = np.empty((n_draws, len(observations)))
    cfg = observations["config_id"].to_numpy()
    for _, idx in pd.Series(cfg).groupby(cfg, sort=False).indices.items():
        first = observations.iloc[idx[0]]
        ds = coefficient_draws(state, post, str(first["model"]), str(first["gpu"]),
                               int(first["tp"]), n_draws=n_draws, seed=seed,
                               stack=str(first.get("stack", DEFAULT_STACK)))
        th = np.concatenate([ds["beta"].values, ds["alpha"].values], axis=1)
        out[:, idx] = np.einsum("sk,nk->sn", th, X[idx])
    if state.runs is None:
        return out, np.full(len(observations), NO_RUN_EFFECTS)
    shift, status = row_shifts(state.runs, post, observations, n_draws, seed=seed, run=run)
    return out * np.exp(shift), status


# ------------------------------------------------------------------------------ rows
def require_row_columns(coefs: tuple[str, ...], observations: pd.DataFrame) -> None:
    """Refuse a table without the feature columns of ``coefs``, ``config_id`` and ``obs_id``
    (a batch table needs its configuration, :func:`predict_reference`)."""
    missing = [c for c in feature_columns(coefs) + ["config_id", "obs_id"]
               if c not in observations.columns]
    if missing:
        raise ConfigError(
            f"predict: the table lacks {missing}. For a batch table (columns of "
            "physics.basis.BATCH_COLUMNS) use "
            "predict_batches(batches, model=..., gpu=..., tp=...)")


def predict_rows(state: FitState, post: xr.Dataset, observations: pd.DataFrame,
                 n_draws: int = 200, seed: int = 0, run: str = "auto") -> xr.DataArray:
    """Posterior draws of each observation row's expected value (µs), without observation
    noise: ``mu_us (sample, obs)``, with the coordinate ``run_status (obs)``: ``fitted run``
    (the row's run was fitted: its own shift) or ``new run`` (a new run of the configuration;
    ``run="new"`` makes every row one); see :mod:`bayes_latency.model.posterior.shifts`."""
    require_row_columns(state.coefs, observations)
    X = observations[feature_columns(state.coefs)].to_numpy(dtype=float)
    mu, status = mu_rows(state, post, observations, X, n_draws, seed, run=run)
    return xr.DataArray(mu, dims=("sample", "obs"),
                        coords={"obs": observations["obs_id"].to_numpy(),
                                "run_status": ("obs", status)}, name="mu_us")


def replicate_rows(mu: xr.DataArray, noise: NoiseTable, observations: pd.DataFrame,
                   seed: int = 0) -> xr.DataArray:
    """Posterior predictive draws (µs) ``y_us (sample, obs)`` around the expected values ``mu``
    (:func:`predict_rows`), with the fitted heavy-tailed noise of each row."""
    scale, nu, off = row_noise(noise, observations)
    rng = np.random.default_rng(seed + 1)
    vals = student_t_draws(rng, np.log(np.maximum(mu.values, 1e-12)) + off[None, :],
                           scale[None, :], nu[None, :])
    return mu.copy(data=vals).rename("y_us")


def config_theta(post: xr.Dataset, config: str) -> np.ndarray:
    """``(chain * draw, K)`` draws of configuration ``config``'s coefficients: its ``beta``
    terms, then its ``alpha`` terms."""
    b = post["beta"].sel(config=config).transpose("chain", "draw", "term").values
    a = post["alpha"].sel(config=config).transpose("chain", "draw", "alpha_term").values
    C, D = b.shape[:2]
    return np.concatenate([b.reshape(C * D, -1), a.reshape(C * D, -1)], axis=1)


def pointwise_loglik(post: xr.Dataset, coefs: tuple[str, ...], noise: NoiseTable,
                     observations: pd.DataFrame, runs: RunTable | None = None) -> xr.DataArray:
    """``log p(log y_i | theta)`` for every posterior draw: ``log_duration (chain, draw, obs)``,
    the layout of the result's ``log_likelihood`` group. Rows of a run in ``runs`` (the fit's
    :class:`~bayes_latency.model.posterior.shifts.RunTable`) are scored about its fitted shift,
    the others about their configuration."""
    C, D = post.sizes["chain"], post.sizes["draw"]
    X = observations[feature_columns(coefs)].to_numpy(dtype=float)
    log_y = np.log(observations["value_us"].to_numpy(dtype=float))
    scale, nu, off = row_noise(noise, observations)
    off = off + fitted_log_shifts(runs, observations)
    cfg = observations["config_id"].astype(str).to_numpy()
    ll = np.empty((C * D, len(observations)), dtype=np.float32)
    for c in pd.unique(cfg):
        m = cfg == c
        ll[:, m] = row_loglik(log_y[m], X[m], config_theta(post, c), scale[m], nu[m], off[m])
    # the layout of the result's log_likelihood group: same variable and dimension names
    return xr.DataArray(ll.reshape(C, D, -1), dims=("chain", "draw", "obs"),
                        coords={"chain": post["chain"].values, "draw": post["draw"].values,
                                "obs": observations["obs_id"].astype(str).to_numpy()},
                        name="log_duration")


# ------------------------------------------------------------------------------ batch tables
def reference_batches() -> pd.DataFrame:
    """Default reference batches (batch-table rows, see ``physics/basis.py``)."""
    from bayes_latency.physics import prefill_chunk_stats

    pairs_2048, kv_2048 = prefill_chunk_stats([2048], [0])
    pairs_1024, kv_1024 = prefill_chunk_stats([1024], [0])
    zero_decode = {"num_decode_reqs": 0, "decode_tokens": 0, "decode_ctx_tokens": 0}
    zero_prefill = {"num_prefill_reqs": 0, "prefill_tokens": 0, "prefill_attn_pairs": 0,
                    "prefill_kv_tokens": 0}
    rows = {
        "prefill_2048": {"num_prefill_reqs": 1, "prefill_tokens": 2048,
                         "prefill_attn_pairs": pairs_2048, "prefill_kv_tokens": kv_2048,
                         **zero_decode},
        "decode_32x1000": {**zero_prefill, "num_decode_reqs": 32, "decode_tokens": 32,
                           "decode_ctx_tokens": 32 * 1000},
        "decode_128x2000": {**zero_prefill, "num_decode_reqs": 128, "decode_tokens": 128,
                            "decode_ctx_tokens": 128 * 2000},
        "mixed_1024_prefill_32x1000_decode": {
            "num_prefill_reqs": 1, "prefill_tokens": 1024, "prefill_attn_pairs": pairs_1024,
            "prefill_kv_tokens": kv_1024, "num_decode_reqs": 32, "decode_tokens": 32,
            "decode_ctx_tokens": 32 * 1000},
    }
    return pd.DataFrame.from_dict(rows, orient="index").astype(float)


def coefficient_arrays(coefs: xr.Dataset) -> tuple[xr.DataArray, xr.DataArray]:
    """``beta (sample, term)`` and ``alpha (sample, alpha_term)`` of ``coefs`` (validated:
    every draw finite and >= 0, else :class:`~bayes_latency.errors.BayesLatencyError`)."""
    for v, dim in (("beta", "term"), ("alpha", "alpha_term")):
        if v not in coefs.data_vars:
            raise BayesLatencyError(f"coefficients have no {v!r} variable")
        if set(coefs[v].dims) != {"sample", dim}:
            raise BayesLatencyError(f"coefficients {v!r} must have dims (sample, {dim}), "
                                    f"got {coefs[v].dims}")
    beta = coefs["beta"].transpose("sample", "term")
    alpha = coefs["alpha"].transpose("sample", "alpha_term")
    for da, dim in ((beta, "term"), (alpha, "alpha_term")):
        vals = np.asarray(da.values, dtype=float)
        bad = ~np.isfinite(vals) | (vals < 0)
        if bad.any():
            j = int(np.flatnonzero(bad.any(axis=0))[0])
            name = str(da[dim].values[j])
            example = vals[bad[:, j], j][0]
            raise BayesLatencyError(
                f"coefficient {name!r} has {int(bad[:, j].sum())} draws that are not finite and "
                f">= 0 (e.g. {example!r}): refusing to export")
    return beta, alpha


def predict_reference(coefs: xr.Dataset, config: Mapping[str, Any],
                      batches: pd.DataFrame | Mapping[str, Mapping[str, float]] | None = None,
                      ) -> pd.DataFrame:
    """Predicted iteration time (µs) of reference batches with 90% bands.

    Parameters
    ----------
    coefs
        Coefficients of the configuration.
    config
        ``model`` (name or config.json path), ``gpu``, ``tp`` and optional serving knobs.
    batches
        Batch-table rows indexed by name (DataFrame) or ``{name: row}``; default: pure prefill
        of 2048 tokens, pure decode 32 x 1000 and 128 x 2000 context tokens, and a mixed step.

    Returns
    -------
    DataFrame
        Index = batch name; the batch columns and ``mean_us, median_us, q05_us, q95_us``.
    """
    from bayes_latency.physics import ServingConfig, basis_matrix, load_architecture, load_gpu

    beta, _ = coefficient_arrays(coefs)
    if batches is None:
        table = reference_batches()
    elif isinstance(batches, pd.DataFrame):
        table = batches.copy()
    else:
        table = pd.DataFrame.from_dict(dict(batches), orient="index")
    arch = load_architecture(str(config["model"]))
    gpu = load_gpu(str(config["gpu"]))
    serving = ServingConfig.from_dict(dict(config), arch=arch)
    terms = [str(t) for t in beta["term"].values]
    x = basis_matrix(table, arch, gpu, serving, terms=terms)
    pred = np.asarray(beta.values, dtype=float) @ x.T  # (sample, batch)
    q = np.quantile(pred, [0.05, 0.5, 0.95], axis=0)
    out = table.copy()
    out["mean_us"] = pred.mean(axis=0)
    out["median_us"] = q[1]
    out["q05_us"] = q[0]
    out["q95_us"] = q[2]
    return out
