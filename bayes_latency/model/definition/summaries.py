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
A configuration of several runs also has a log shift per run (:mod:`bayes_latency.model.definition.runs`),
sum-zero, profiled out like the noise; :func:`summarize` estimates them in three passes and keeps
the contrasts that inform ``sigma_run`` in stage 2.

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
import dataclasses
from collections.abc import Sequence
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
from bayes_latency.model.definition.runs import LEVELS, SHIFT_BOUND, ShiftDesign, shift_design

#: Re-optimisations after the multi-step offsets (:func:`bayes_latency.model.definition.likelihood.sum_log_offset`) are updated
#: to the fitted noise, and the largest change of an offset below which they stop (log scale).
#: The offsets move with ``sigma^2`` only, and each pass shrinks their change about a
#: thousandfold (2-3 passes of 1-3 Newton iterations each).
OFFSET_PASSES = 8
OFFSET_TOL = 1e-12
#: Floor of the shift scales in the stage-1 prior (log scale): below it the shifts are pinned.
MIN_SHIFT_SIGMA = 1e-3


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
    #: the run and window effects (:mod:`bayes_latency.model.definition.runs`): the levels
    #: (``window_run``: each window's run), their estimated log shifts and standard errors, and
    #: the sum-zero contrasts that inform ``sigma_run`` / ``sigma_window``: estimates, covariance
    #: and level (0 run, 1 window) of each
    runs: tuple[str, ...] = ()
    windows: tuple[str, ...] = ()
    window_run: tuple[str, ...] = ()
    shift_hat: np.ndarray = field(default_factory=lambda: np.zeros(0))
    shift_se: np.ndarray = field(default_factory=lambda: np.zeros(0))
    contrast_hat: np.ndarray = field(default_factory=lambda: np.zeros(0))
    contrast_cov: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    contrast_level: np.ndarray = field(default_factory=lambda: np.zeros(0, int))
    #: the shifts' stage-1 prior scales (:func:`shift_moments`; empty: flat)
    shift_sigma: tuple[float, ...] = ()

    def quadratic(self, theta: np.ndarray) -> np.ndarray:
        """The quadratic stand-in for the log-likelihood at ``theta`` (``(..., K)``), up to a constant."""
        d = theta - self.theta_hat
        return d @ self.grad - 0.5 * np.einsum("...k,kl,...l->...", d, self.info, d)


def summarize_config(rows: pd.DataFrame, coefs: tuple[str, ...], scale: np.ndarray,
                     noise_prior: NoisePrior | None = None,
                     fixed_noise: dict[str, NoiseParams] | None = None,
                     load: str = DEFAULT_NOISE_LOAD, run_effects: bool = True,
                     shift_sigma: tuple[float, ...] | None = None) -> ConfigSummary:
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
    run_effects
        Estimate a log shift per run (sum-zero over the configuration's runs) and per window of
        a run (sum-zero within the run) and profile them out of the information
        (:mod:`bayes_latency.model.definition.runs`); ``False``: every row of the configuration
        is one run.
    shift_sigma
        ``(sigma_run, sigma_window)``: the shifts' Gaussian prior in stage 1 (random effects at
        these scales, whose information on the coefficients is kept); None: flat (fixed
        effects, the contrasts that inform the scales in stage 2).

    Returns
    -------
    ConfigSummary
    """
    with _one_blas_thread():
        return _summarize_config(rows, coefs, scale, noise_prior, fixed_noise, load, run_effects,
                                 shift_sigma)


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
                      fixed_noise: dict[str, NoiseParams] | None, load: str,
                      run_effects: bool = True,
                      shift_sigma: tuple[float, ...] | None = None) -> ConfigSummary:
    """:func:`summarize_config`, with BLAS as the caller left it."""
    first = rows.iloc[0]
    sd = shift_design(rows) if run_effects else None
    p = _ConfigProblem(rows, coefs, scale, check_noise_load(load),
                       shift=None if sd is None else sd.R)
    if sd is not None and shift_sigma is not None and p.nw:
        p.w_prec = 1.0 / np.square(np.maximum(np.asarray(shift_sigma, dtype=float),
                                              MIN_SHIFT_SIGMA))[sd.contrast_level]
    u0, eta0 = _initial(p)
    K, P = p.K, p.P
    eta_bounds = []
    for _, what in p.layout:
        if what == "gamma":  # not a log coordinate
            eta_bounds.append(load_growth_bounds(load))
            continue
        lo, hi = {"sigma": SIGMA_BOUNDS, "tau": TAU_BOUNDS, "nu": NU_BOUNDS}[what]
        eta_bounds.append((np.log(lo), np.log(hi)))
    eta_lo = np.array([b[0] for b in eta_bounds])
    eta_hi = np.array([b[1] for b in eta_bounds])
    na = int(p.active_x.sum())
    nc = na - p.nw  # active coefficients; the shift contrasts follow them in x
    fit_noise = fixed_noise is None
    if fit_noise:
        eta = np.clip(eta0, eta_lo, eta_hi)
    else:
        eta = p.eta_of(fixed_noise)
    # a tiny ridge in scaled coordinates, centred on the start, pins the directions the data leave
    # flat (coefficients identified only as a sum); it is left out of the summary, whose expansion
    # is exact anywhere
    u_ref = u0[p.active_x]
    p.set_offset(eta)
    lo_u = np.concatenate([np.zeros(nc), np.full(p.nw, -SHIFT_BOUND)])
    hi_u = np.concatenate([np.full(nc, np.inf), np.full(p.nw, SHIFT_BOUND)])
    lo_x = np.concatenate([lo_u, eta_lo])
    hi_x = np.concatenate([hi_u, eta_hi])
    best, n_iter = None, 0
    for eta_start in _noise_starts(p, eta, eta_lo, eta_hi) if fit_noise else [eta]:
        # 1. the coefficients with the noise held at its start (or fixed) value
        obj_u = _Objective(p, u_ref, noise_prior, eta_fixed=eta_start)
        res = _projected_newton(obj_u, np.maximum(u_ref, lo_u + 1e-9), lo_u, hi_u)
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
        res = _projected_newton(obj, np.concatenate([u[p.active_x], eta]), lo_x, hi_x)
        n_iter += res.n_iter
        u, eta = obj.split(res.x)
    what = "projected Newton on (u, eta)" if fit_noise else "projected Newton with the noise fixed"
    message = f"{what}: {n_iter} iterations, f={res.f:.6f}, {res.message}"

    f, g, H = p.derivatives(u, eta, 2)
    gu = g[:K]
    # observed information in u, shifts and noise profiled out (Schur complement), all analytic
    Huu = H[:K, :K]
    Hue = H[:K, K:]
    Hee = H[K:, K:].copy()
    Hee[P - K:, P - K:] -= np.diag(_noise_prior_terms(noise_prior, p.layout, eta)[2])
    Hee[np.arange(p.nw), np.arange(p.nw)] += p.w_prec
    # only profile noise parameters that are not stuck at a bound (the shifts always)
    free = np.array([True] * p.nw + [fit_noise and b[0] + 1e-6 < e < b[1] - 1e-6
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
    theta_hat = u[:K] * scale
    info = info_u / np.outer(scale, scale)
    grad = grad_u / scale
    n_rows = {k: int(np.sum(p.kind_idx == i)) for i, k in enumerate(p.kinds)}
    effects = _shift_estimates(p, sd, u, eta, H, free, noise_prior) if sd is not None else {}
    return ConfigSummary(
        config_id=str(first["config_id"]), model=str(first["model"]), gpu=str(first["gpu"]),
        tp=int(first["tp"]), coefs=tuple(coefs), theta_hat=theta_hat, grad=grad, info=info,
        noise=p.noise_params(eta), n_rows=n_rows, loglik=-f, converged=res.converged,
        message=message, active=p.active.copy(), **effects,
    )


def _shift_estimates(p: _ConfigProblem, sd: ShiftDesign, u: np.ndarray, eta: np.ndarray,
                     H: np.ndarray, free: np.ndarray, noise_prior: NoisePrior | None
                     ) -> dict[str, Any]:
    """The run and window fields of :class:`ConfigSummary`: the contrasts ``w`` at the optimum,
    their covariance (the ``w`` block of the inverse Hessian of the objective over the active
    coefficients, the shifts and the free noise parameters), and the levels' shifts ``B w``
    with their standard errors."""
    K, P = p.K, p.P
    out: dict[str, Any] = {"runs": sd.runs, "windows": sd.windows, "window_run": sd.window_run}
    if p.nw == 0:
        n = len(sd.runs) + len(sd.windows)
        return {**out, "shift_hat": np.zeros(n), "shift_se": np.zeros(n)}
    Hx = H.copy()
    Hx[P:, P:] -= np.diag(_noise_prior_terms(noise_prior, p.layout, eta)[2])
    act = np.flatnonzero(p.active)
    Hx[act, act] += RIDGE
    Hx[K + np.arange(p.nw), K + np.arange(p.nw)] += p.w_prec
    keep = np.concatenate([act, K + np.arange(p.nw), K + np.flatnonzero(free)])
    keep = np.unique(keep)
    sub = Hx[np.ix_(keep, keep)]
    pos = np.searchsorted(keep, K + np.arange(p.nw))
    try:
        cov_all = np.linalg.inv(sub)
    except np.linalg.LinAlgError:
        cov_all = np.linalg.pinv(sub)
    cov = cov_all[np.ix_(pos, pos)]
    cov = 0.5 * (cov + cov.T)
    w_hat = u[K:P]
    cov_v = sd.B @ cov @ sd.B.T
    return {**out, "shift_hat": sd.B @ w_hat, "shift_se": np.sqrt(np.clip(np.diag(cov_v), 0, None)),
            "contrast_hat": w_hat.copy(), "contrast_cov": cov,
            "contrast_level": sd.contrast_level.copy()}


#: Stage-1 cost per fitted row (seconds, one core), for the choice between inline and a local
#: Dask cluster: 80,400 demo rows take 0.40-0.50 s.
SECONDS_PER_ROW = 6e-6


def summarize(rows: pd.DataFrame, coefs: tuple[str, ...], scale: np.ndarray,
              noise_prior: NoisePrior | None = None, scheduler: Any = None,
              load: str = DEFAULT_NOISE_LOAD, run_effects: bool = True) -> list[ConfigSummary]:
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
    run_effects
        As in :func:`summarize_config`. Configurations with run contrasts (two or more runs) take
        two more passes: flat shifts with the noise held at the fit without them (their contrasts
        inform ``sigma_run`` in stage 2), then the shifts as random effects at the scales of
        :func:`shift_moments` (the summaries' coefficients, information and fitted shifts). The
        other configurations' summaries are those without run effects, with their run named.

    Returns
    -------
    list of ConfigSummary
        Sorted by configuration id.
    """
    from bayes_latency.parallel import run_units

    cols = ["config_id", "model", "gpu", "tp", "kind", "n_steps", "value_us", *feature_columns(coefs)]
    # the runs and windows of the run effects (.runs)
    cols += [c for c in ("experiment_id", "run_id", "step_first") if c in rows.columns]
    # the load covariates' features (.likelihood.noise_load), whether or not the terms use them
    cols += [c for c in ("x_per_request", "x_decode_kv", "x_prefill_kv", "aggregate")
             if c not in cols and c in rows.columns]
    # stage 1 estimates one noise per (configuration, noise class): ``kind`` carries the class
    rows = rows[cols].assign(kind=noise_kind(rows))
    groups = [g for _, g in rows.groupby("config_id", sort=True)]
    load = check_noise_load(load)
    jobs = [(g, tuple(coefs), scale, noise_prior, None, load, False) for g in groups]
    first = run_units(summarize_config, jobs, scheduler=scheduler,
                      cost_s=len(rows) * SECONDS_PER_ROW, weights=[len(j[0]) for j in jobs],
                      desc="stage 1", unit="row", scatter=True)
    if not run_effects:
        return first
    designs = [shift_design(g) for g in groups]
    out = [dataclasses.replace(s, runs=d.runs, windows=d.windows, window_run=d.window_run,
                               shift_hat=np.zeros(len(d.runs) + len(d.windows)),
                               shift_se=np.zeros(len(d.runs) + len(d.windows)))
           for s, d in zip(first, designs, strict=True)]
    redo = [i for i, d in enumerate(designs) if d.n_contrasts]
    if not redo:
        return out
    # the contrasts that inform the scales: flat shifts, the noise held at the fit without
    # them (with a few rows per run, free noise collapses onto shifts that fit them exactly and
    # the contrasts' curvature then claims a precision they do not have)
    cost, weights = (sum(len(groups[i]) for i in redo) * SECONDS_PER_ROW,
                     [len(groups[i]) for i in redo])
    flat = run_units(summarize_config, [(groups[i], tuple(coefs), scale, noise_prior,
                                         first[i].noise, load, True) for i in redo],
                     scheduler=scheduler, cost_s=cost, weights=weights,
                     desc="stage 1 (run contrasts)", unit="row", scatter=True)
    sig = tuple(shift_moments(flat))
    # the summaries: the shifts as random effects at the fleet's estimate of their scale
    again = run_units(summarize_config, [(*jobs[i][:6], True, sig) for i in redo],
                      scheduler=scheduler, cost_s=cost, weights=weights,
                      desc="stage 1 (run effects)", unit="row", scatter=True)
    for i, f, s in zip(redo, flat, again, strict=True):
        out[i] = dataclasses.replace(s, contrast_hat=f.contrast_hat, contrast_cov=f.contrast_cov,
                                     contrast_level=f.contrast_level, shift_sigma=sig)
    return out


def shift_moments(summaries: Sequence[ConfigSummary]) -> np.ndarray:
    """Estimate of ``(sigma_run, sigma_window)`` from the flat contrasts of every configuration,
    the stage-1 prior of the second pass: per level, the maximum of
    ``sum_j log N(w_j; 0, sigma^2 + C_jj)`` (each contrast with its own variance, so a contrast
    of a window of few rows weighs little), at least :data:`MIN_SHIFT_SIGMA`."""
    from scipy.optimize import minimize_scalar

    out = np.full(len(LEVELS), MIN_SHIFT_SIGMA)
    for lv in range(len(LEVELS)):
        parts = [(s.contrast_hat[s.contrast_level == lv],
                  np.diag(s.contrast_cov)[s.contrast_level == lv]) for s in summaries
                 if len(s.contrast_hat)]
        if not parts or not sum(len(w) for w, _ in parts):
            continue
        w = np.concatenate([p[0] for p in parts])
        c = np.clip(np.concatenate([p[1] for p in parts]), 0.0, None)

        def nll(t: float, w: np.ndarray = w, c: np.ndarray = c) -> float:
            v = np.exp(2.0 * t) + c
            return float(0.5 * np.sum(np.log(v) + w * w / v))

        res = minimize_scalar(nll, bounds=(np.log(MIN_SHIFT_SIGMA), np.log(SHIFT_BOUND)),
                              method="bounded")
        out[lv] = max(float(np.exp(res.x)), MIN_SHIFT_SIGMA)
    return out
