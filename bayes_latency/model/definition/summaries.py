"""Stage 1 of the fast exact path: one likelihood summary per configuration.

The likelihood of a configuration's rows depends on the fleet-level parameters only through that
configuration's coefficient vector ``theta_c`` (its beta and alpha). We therefore compute, once:

1. the maximum-likelihood point ``theta_hat`` (with ``theta >= 0``) jointly with the noise
   parameters of each observation kind (``sigma``, ``tau``, ``nu``; see :mod:`bayes_latency.model.definition.likelihood`);
2. the gradient ``g`` (non-zero only on coefficients held at the bound 0) and the observed
   information ``I`` of the log-likelihood in ``theta`` at that point, with the noise
   parameters profiled out (Schur complement).

The second-order expansion ``log L_c(theta) ~ l_hat + g.(theta - theta_hat)
- 1/2 (theta - theta_hat)' I (theta - theta_hat)`` then stands in for thousands of rows inside the
hierarchical model (:mod:`bayes_latency.model.definition.hierarchy`). With thousands of rows per configuration the likelihood
is very nearly quadratic in ``theta`` over the posterior's range (Bernstein-von Mises), which is why
this reproduces the full-data posterior: on 6 configurations x 800 rows, all 42 posterior
means within 0.1 posterior sd of full-data NUTS (max 0.090; ``benchmarks/fast_vs_full.py``,
``results/benchmarks/fast_vs_full.md``).
Coefficients whose features are all zero for a configuration get zero information: the prior
speaks for them.

The optimiser
-------------
In scaled coordinates ``u = theta / scale`` (``u >= 0``, at most 14 of them) and log noise
``eta`` (bounded, see ``*_BOUNDS``), the objective (:mod:`bayes_latency.model.definition.objective`) is the negative
log-likelihood, plus a tiny ridge ``RIDGE/2 |u - u0|^2`` around the start ``u0``, minus the noise
log prior (:class:`~bayes_latency.model.definition.objective.NoisePrior`), with analytic gradient and Hessian in ``(u, eta)``.
:func:`~bayes_latency.model.definition.newton._projected_newton` (:mod:`bayes_latency.model.definition.newton`), a bound-constrained Newton method
(Bertsekas' projected Newton with an Armijo search along the projection arc), minimises it in two
passes: the coefficients with the noise held at its start (the first step of the former
alternation, which keeps the search in the same basin), then coefficients and noise jointly,
converging quadratically to a Newton decrement below ``NEWTON_TOL`` (about 1e-6 posterior sd).
The same Hessian, evaluated at the optimum, gives the profiled information. BLAS is held to one
thread meanwhile (:func:`_one_blas_thread`).

This replaced an alternation of scipy's ``trust-constr`` on ``u`` with L-BFGS-B on ``eta`` (up to
12 rounds), whose time went to trust-constr's Python and sparse-algebra overhead, and which stopped
up to 4e-5 short of the optimum of the objective (its log-likelihood off by up to 2e-4 and its
noise parameters by up to 4e-4 relative, traded against the noise prior). Measured on the demo table (12
configurations, 80,400 rows) on a 2-core machine shared with another job: all configurations one
after the other took 8.9 s before (8.0-16.8 s on re-runs, depending on the other job and on
OpenBLAS threads), 0.40 s after (10-35 Newton iterations, 15-80 ms per configuration);
:func:`summarize` as the estimator calls it 7.6 s before (a 2-process pool), 0.40 s after
(serially; configurations now run inline or as tasks on Dask distributed, see :func:`summarize`).
Against the former optimiser, per configuration: coefficients within 1e-4 posterior sd, information within 3e-6 (relative Frobenius), gradient within 5e-5
posterior sd, noise within 4e-4 (relative), and the objective lower (better) in every one.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from bayes_latency.model.definition.likelihood import (
    DEFAULT_NOISE_LOAD,
    NoiseParams,
    check_noise_load,
    load_growth_bounds,
    noise_kind,
)
from bayes_latency.model.definition.newton import (  # noqa: F401 - the optimiser's settings re-exported
    EPS_BOUND,
    MAX_NEWTON_ITER,
    NEWTON_TOL,
    _projected_newton,
)
from bayes_latency.model.definition.objective import (  # noqa: F401 - the objective's names re-exported
    NU_BOUNDS,
    RIDGE,
    SIGMA_BOUNDS,
    TAU_BOUNDS,
    NoisePrior,
    _ConfigProblem,
    _initial,
    _noise_prior_terms,
    _Objective,
)
from bayes_latency.model.definition.rows import feature_columns, fit_rows  # noqa: F401 - re-exported

#: Re-optimisations after the multi-step offsets (:func:`bayes_latency.model.definition.likelihood.sum_log_offset`) are updated
#: to the fitted noise, and the largest change of an offset below which they stop (log scale).
#: The offsets move with ``sigma^2`` only, and each pass shrinks their change about a
#: thousandfold (2-3 passes of 1-3 Newton iterations each).
OFFSET_PASSES = 8
OFFSET_TOL = 1e-12


@dataclass
class ConfigSummary:
    """Likelihood summary of one configuration (see module docstring)."""

    config_id: str
    model: str
    gpu: str
    tp: int
    coefs: tuple[str, ...]
    theta_hat: np.ndarray
    grad: np.ndarray
    info: np.ndarray
    noise: dict[str, NoiseParams]
    n_rows: dict[str, int]
    loglik: float
    converged: bool
    message: str = ""
    active: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))

    def quadratic(self, theta: np.ndarray) -> np.ndarray:
        """The quadratic stand-in for the log-likelihood at ``theta`` (``(..., K)``), up to a constant."""
        d = theta - self.theta_hat
        return d @ self.grad - 0.5 * np.einsum("...k,kl,...l->...", d, self.info, d)


def summarize_config(rows: pd.DataFrame, coefs: tuple[str, ...], scale: np.ndarray,
                     noise_prior: NoisePrior | None = None,
                     fixed_noise: dict[str, NoiseParams] | None = None,
                     load: str = DEFAULT_NOISE_LOAD) -> ConfigSummary:
    """Maximum likelihood and curvature of one configuration's rows (see module docstring).

    Parameters
    ----------
    rows
        Fitted rows of one configuration (``value_us``, ``kind``, ``n_steps``, ``x_<coef>``).
    coefs
        Coefficient names (beta terms then alpha terms).
    scale
        Typical magnitude of each coefficient (prior medians); the optimiser works in ``theta/scale``.
    noise_prior
        Priors of the noise parameters (penalties; ``None`` = plain maximum likelihood).
    fixed_noise
        Noise parameters by kind to hold fixed instead of estimating and profiling them (a
        diagnostic: ``benchmarks/fast_vs_full.py`` fixes them at the full path's posterior).
    load
        Load covariate of the noise scale (:data:`~bayes_latency.model.definition.likelihood.NOISE_LOADS`): each noise class
        whose rows' loads differ gets a growth ``gamma`` (:mod:`bayes_latency.model.definition.likelihood`).

    Returns
    -------
    ConfigSummary
    """
    with _one_blas_thread():
        return _summarize_config(rows, coefs, scale, noise_prior, fixed_noise, load)


def _one_blas_thread() -> contextlib.AbstractContextManager:
    """Limit BLAS to one thread (``threadpoolctl``).

    Stage 1's products are ``rows x K`` by ``K`` or ``K x K`` matrices: OpenBLAS threads them at a
    few thousand rows, which gains nothing, and when the other core is busy the threads wait on
    each other. Measured on the demo's largest configuration (12,142 rows) with another job on
    the second core: 0.67 s with OpenBLAS' 2 threads, 0.037 s with one.
    """
    return threadpool_limits(limits=1, user_api="blas")


#: Configurations with fewer fitted rows than this are optimised from a grid of noise starts
#: (:func:`_noise_starts`). With a few dozen rows (benchmark means) the Student-t likelihood has
#: several local optima: on the real Splitwise H100 TP2 means (32 rows), three, at objective
#: -50.9, -48.1 and -45.3, with the constant-per-step coefficient at 73, 48 and 7 us; the start
#: alone decides which one Newton reaches. Large configurations are close to unimodal and keep
#: the single default start (the demo's 12 configurations have 2,756-12,142 rows).
MULTISTART_MAX_ROWS = 2000
#: The grid: the default sigma start times these factors, crossed with these ``nu`` starts.
SIGMA_START_FACTORS = (0.3, 1.0, 3.0)
NU_STARTS = (2.0, 5.0, 30.0)


def _noise_starts(p: _ConfigProblem, eta: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> list[np.ndarray]:
    """Noise starting points: ``eta`` alone, or for small configurations the default first, then
    the grid :data:`SIGMA_START_FACTORS` x :data:`NU_STARTS` (the best optimum is kept)."""
    starts = [eta]
    if len(p.log_y) >= MULTISTART_MAX_ROWS:
        return starts
    is_nu = np.array([what == "nu" for _, what in p.layout])
    is_sig = np.array([what == "sigma" for _, what in p.layout])
    for fs in SIGMA_START_FACTORS:
        for nu in NU_STARTS:
            e = eta.copy()
            e[is_sig] += np.log(fs)
            e[is_nu] = np.log(nu)
            starts.append(np.clip(e, lo, hi))
    return starts


def _summarize_config(rows: pd.DataFrame, coefs: tuple[str, ...], scale: np.ndarray,
                      noise_prior: NoisePrior | None,
                      fixed_noise: dict[str, NoiseParams] | None, load: str) -> ConfigSummary:
    """:func:`summarize_config`, with BLAS as the caller left it."""
    first = rows.iloc[0]
    p = _ConfigProblem(rows, coefs, scale, check_noise_load(load))
    u0, eta0 = _initial(p)
    K = p.K
    eta_bounds = []
    for _, what in p.layout:
        if what == "gamma":  # not a log coordinate
            eta_bounds.append(load_growth_bounds(load))
            continue
        lo, hi = {"sigma": SIGMA_BOUNDS, "tau": TAU_BOUNDS, "nu": NU_BOUNDS}[what]
        eta_bounds.append((np.log(lo), np.log(hi)))
    eta_lo = np.array([b[0] for b in eta_bounds])
    eta_hi = np.array([b[1] for b in eta_bounds])
    na = int(p.active.sum())
    fit_noise = fixed_noise is None
    if fit_noise:
        eta = np.clip(eta0, eta_lo, eta_hi)
    else:
        eta = p.eta_of(fixed_noise)
    # a tiny ridge in scaled coordinates, centred on the start, pins the directions the data leave
    # flat (coefficients identified only as a sum); it is left out of the summary, whose expansion
    # is exact anywhere
    u_ref = u0[p.active]
    p.set_offset(eta)
    lo_x = np.concatenate([np.zeros(na), eta_lo])
    hi_x = np.concatenate([np.full(na, np.inf), eta_hi])
    best, n_iter = None, 0
    for eta_start in _noise_starts(p, eta, eta_lo, eta_hi) if fit_noise else [eta]:
        # 1. the coefficients with the noise held at its start (or fixed) value
        obj_u = _Objective(p, u_ref, noise_prior, eta_fixed=eta_start)
        res = _projected_newton(obj_u, np.maximum(u_ref, 1e-9), np.zeros(na), np.full(na, np.inf))
        n_iter += res.n_iter
        # 2. coefficients and noise jointly, from there
        if fit_noise:
            obj = _Objective(p, u_ref, noise_prior)
            res = _projected_newton(obj, np.concatenate([res.x, eta_start]), lo_x, hi_x)
            n_iter += res.n_iter
            cand = (res, *obj.split(res.x))
        else:
            cand = (res, obj_u.split(res.x)[0], eta_start)
        if best is None or cand[0].f < best[0].f:
            best = cand
    res, u, eta = best
    # the offsets of multi-step rows follow the fitted noise: re-optimise from the optimum until
    # they settle (with the noise fixed they were exact from the start)
    for _ in range(OFFSET_PASSES if fit_noise else 0):
        if p.set_offset(eta) < OFFSET_TOL:
            break
        obj = _Objective(p, u_ref, noise_prior)
        res = _projected_newton(obj, np.concatenate([u[p.active], eta]), lo_x, hi_x)
        n_iter += res.n_iter
        u, eta = obj.split(res.x)
    what = "projected Newton on (u, eta)" if fit_noise else "projected Newton with the noise fixed"
    message = f"{what}: {n_iter} iterations, f={res.f:.6f}, {res.message}"

    f, g, H = p.derivatives(u, eta, 2)
    gu = g[:K]
    # observed information in u, noise profiled out (Schur complement), all analytic
    Huu = H[:K, :K]
    Hue = H[:K, K:]
    Hee = H[K:, K:] - np.diag(_noise_prior_terms(noise_prior, p.layout, eta)[2])
    # only profile noise parameters that are not stuck at a bound
    free = np.array([fit_noise and b[0] + 1e-6 < e < b[1] - 1e-6
                     for e, b in zip(eta, eta_bounds, strict=True)], dtype=bool)
    info_u = Huu.copy()
    if free.any():
        Hf = Hee[np.ix_(free, free)]
        try:
            info_u = Huu - Hue[:, free] @ np.linalg.solve(Hf, Hue[:, free].T)
        except np.linalg.LinAlgError:
            pass
    info_u = 0.5 * (info_u + info_u.T)
    # make it positive semi-definite (Student-t outliers can give small negative directions)
    w, V = np.linalg.eigh(info_u)
    info_u = (V * np.clip(w, 0.0, None)) @ V.T
    inactive = ~p.active
    info_u[inactive, :] = 0.0
    info_u[:, inactive] = 0.0
    # the data gradient at the expansion point: non-zero on coefficients held at the bound 0, and
    # whatever the optimiser left elsewhere (keeping it makes the expansion exact to 2nd order
    # wherever the optimiser stopped)
    grad_u = -gu
    grad_u[inactive] = 0.0
    theta_hat = u * scale
    info = info_u / np.outer(scale, scale)
    grad = grad_u / scale
    n_rows = {k: int(np.sum(p.kind_idx == i)) for i, k in enumerate(p.kinds)}
    return ConfigSummary(
        config_id=str(first["config_id"]), model=str(first["model"]), gpu=str(first["gpu"]),
        tp=int(first["tp"]), coefs=tuple(coefs), theta_hat=theta_hat, grad=grad, info=info,
        noise=p.noise_params(eta), n_rows=n_rows, loglik=-f, converged=res.converged,
        message=message, active=p.active.copy(),
    )


#: Stage-1 cost per fitted row (seconds, one core), for the choice between inline and a local
#: Dask cluster: 80,400 demo rows take 0.40-0.50 s.
SECONDS_PER_ROW = 6e-6


def summarize(rows: pd.DataFrame, coefs: tuple[str, ...], scale: np.ndarray,
              noise_prior: NoisePrior | None = None, scheduler: Any = None,
              load: str = DEFAULT_NOISE_LOAD) -> list[ConfigSummary]:
    """One :class:`ConfigSummary` per configuration of the (already filtered) fit rows.

    Parameters
    ----------
    rows
        Fit rows (:func:`fit_rows`) of every configuration.
    coefs, scale
        As in :func:`summarize_config`.
    noise_prior
        As in :func:`summarize_config`.
    scheduler
        Where the configurations run (they are independent; :func:`summarize_config` is the one
        function, inline or as a Dask task, so the results are the same): None (inline below
        about :data:`bayes_latency.parallel.INLINE_MAX_SECONDS` of work at
        :data:`SECONDS_PER_ROW`, i.e. about 1.7 million rows, else a local cluster;
        ``$DASK_SCHEDULER_ADDRESS`` when set), ``"inline"``, ``"local"``, a scheduler address or
        a ``distributed.Client``.
    load
        As in :func:`summarize_config`.

    Returns
    -------
    list of ConfigSummary
        Sorted by configuration id.
    """
    from bayes_latency.parallel import run_units

    cols = ["config_id", "model", "gpu", "tp", "kind", "n_steps", "value_us", *feature_columns(coefs)]
    # the load covariates' features (.likelihood.noise_load), whether or not the terms use them
    cols += [c for c in ("x_per_request", "x_decode_kv", "x_prefill_kv", "aggregate")
             if c not in cols and c in rows.columns]
    # stage 1 estimates one noise per (configuration, noise class): ``kind`` carries the class
    rows = rows[cols].assign(kind=noise_kind(rows))
    jobs = [(g, tuple(coefs), scale, noise_prior, None, check_noise_load(load))
            for _, g in rows.groupby("config_id", sort=True)]
    return run_units(summarize_config, jobs, scheduler=scheduler,
                     cost_s=len(rows) * SECONDS_PER_ROW, weights=[len(j[0]) for j in jobs],
                     desc="stage 1", unit="row", scatter=True)
