"""Stage 1 of the fast exact path: one likelihood summary per configuration.

The likelihood of a configuration's rows depends on the fleet-level parameters only through that
configuration's coefficient vector ``theta_c`` (its beta and alpha). We therefore compute, once:

1. the maximum-likelihood point ``theta_hat`` (with ``theta >= 0``) jointly with the noise
   parameters of each observation kind (``sigma``, ``tau``, ``nu``; see :mod:`.likelihood`);
2. the gradient ``g`` (non-zero only on coefficients held at the bound 0) and the observed
   information ``I`` of the log-likelihood in ``theta`` at that point, with the noise
   parameters profiled out (Schur complement).

The second-order expansion ``log L_c(theta) ~ l_hat + g.(theta - theta_hat)
- 1/2 (theta - theta_hat)' I (theta - theta_hat)`` then stands in for thousands of rows inside the
hierarchical model (:mod:`.hierarchy`). With thousands of rows per configuration the likelihood
is very nearly quadratic in ``theta`` over the posterior's range (Bernstein-von Mises), which is why
this reproduces the full-data posterior: on 6 configurations x 800 rows, all 42 posterior
means within 0.1 posterior sd of full-data NUTS (max 0.090; ``benchmarks/fast_vs_full.py``,
``results/benchmarks/fast_vs_full.md``).
Coefficients whose features are all zero for a configuration get zero information: the prior
speaks for them.

The optimiser
-------------
In scaled coordinates ``u = theta / scale`` (``u >= 0``, at most 14 of them) and log noise
``eta`` (bounded, see ``*_BOUNDS``), the objective is the negative log-likelihood, plus a tiny
ridge ``RIDGE/2 |u - u0|^2`` around the start ``u0``, minus the noise log prior
(:class:`NoisePrior`). Its gradient and Hessian in ``(u, eta)`` are analytic
(:meth:`_ConfigProblem.derivatives`; per-kind quantities are computed once per kind and summed
with :func:`numpy.bincount`). :func:`~.newton._projected_newton` (:mod:`.newton`), a bound-constrained Newton method
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
from scipy import optimize, special
from threadpoolctl import threadpool_limits

from bayes_latency.data.report import IngestReport
from bayes_latency.model.likelihood import (
    FIT_ROLES,
    WINDOW_KINDS,
    NoiseParams,
    noise_kind,
    sum_log_offset,
)
from bayes_latency.model.newton import (  # noqa: F401 - the optimiser's settings re-exported
    EPS_BOUND,
    MAX_NEWTON_ITER,
    NEWTON_TOL,
    _projected_newton,
)

NU_BOUNDS = (1.5, 200.0)
#: Ridge (in coefficient / prior-median units) that pins directions the data leave flat.
RIDGE = 1e-4
SIGMA_BOUNDS = (1e-4, 5.0)
TAU_BOUNDS = (1e-7, 2.0)
#: Re-optimisations after the multi-step offsets (:func:`.likelihood.sum_log_offset`) are updated
#: to the fitted noise, and the largest change of an offset below which they stop (log scale).
#: The offsets move with ``sigma^2`` only, and each pass shrinks their change about a
#: thousandfold (2-3 passes of 1-3 Newton iterations each).
OFFSET_PASSES = 8
OFFSET_TOL = 1e-12


@dataclass(frozen=True)
class NoisePrior:
    """The priors of the noise parameters of the full model (:func:`.hierarchy._row_likelihood`),
    used as penalties in stage 1: the noise is set at its posterior mode, not its maximum
    likelihood. With a handful of rows of a kind (2-66 ``iteration`` rows per configuration of the
    ``small`` fleet) the maximum likelihood collapses (``nu`` at its bound 1.5, ``sigma`` 0.009
    against 0.154 in the full posterior) and shifted coefficient means by up to 0.65 posterior sd
    against full-data NUTS (``benchmarks/fast_vs_full.py``)."""

    sigma: dict[str, float]  # HalfNormal scale of sigma per kind
    tau: float = 0.05  # HalfNormal scale of tau (window anchor error)
    nu_alpha: float = 2.0  # Gamma(alpha, beta) of nu
    nu_beta: float = 0.1

    def logp_and_grad(self, layout: list[tuple[str, str]], eta: np.ndarray) -> tuple[float, np.ndarray]:
        """Log prior density of the noise in log coordinates (Jacobian included), and its gradient."""
        lp, g, _ = self.derivatives(layout, eta)
        return lp, g

    def derivatives(self, layout: list[tuple[str, str]], eta: np.ndarray
                    ) -> tuple[float, np.ndarray, np.ndarray]:
        """Log prior, its gradient and the diagonal of its Hessian (independent parameters)."""
        lp, g, h = 0.0, np.zeros(len(eta)), np.zeros(len(eta))
        for j, (kind, what) in enumerate(layout):
            v = float(np.exp(eta[j]))
            if what == "nu":
                lp += self.nu_alpha * eta[j] - self.nu_beta * v
                g[j] = self.nu_alpha - self.nu_beta * v
                h[j] = -self.nu_beta * v
            else:
                s0 = self.tau if what == "tau" else self.sigma.get(kind, 0.5)
                lp += -0.5 * v**2 / s0**2 + eta[j]
                g[j] = -(v**2) / s0**2 + 1.0
                h[j] = -2.0 * v**2 / s0**2
        return lp, g, h


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


def feature_columns(coefs: tuple[str, ...] | list[str]) -> list[str]:
    """Names of the feature columns ``x_<coef>`` of the observation table."""
    return [f"x_{c}" for c in coefs]


def fit_rows(observations: pd.DataFrame, report: IngestReport | None = None,
             coefs: tuple[str, ...] | list[str] | None = None) -> pd.DataFrame:
    """The rows the model fits: role beta or alpha, positive finite value, non-zero features.

    Features are the ``x_<coef>`` columns of ``coefs`` (default: every ``x_`` column), so a row
    whose only non-zero features belong to terms left out of a fit is dropped, with its count.
    Other rows are left out with a counted reason in ``report`` (never silently).
    """
    report = report if report is not None else IngestReport(source="fit rows")
    if "role" not in observations:
        raise ValueError("observation table has no 'role' column")
    rows = observations[observations["role"].isin(FIT_ROLES)]
    report.read["observations"] += len(observations)
    report.dropped["role_not_fitted"] += len(observations) - len(rows)
    v = rows["value_us"].to_numpy(dtype=float)
    bad = ~np.isfinite(v) | (v <= 0)
    if bad.any():
        report.drop("nonpositive_or_nan_value", int(bad.sum()))
    xcols = feature_columns(coefs) if coefs is not None else [c for c in rows.columns if c.startswith("x_")]
    X = rows[xcols].to_numpy(dtype=float)
    badx = ~np.isfinite(X).all(axis=1) | (X < 0).any(axis=1) | (X.sum(axis=1) <= 0)
    badx &= ~bad
    if badx.any():
        report.drop("invalid_or_zero_features", int(badx.sum()))
    kept = rows[~bad & ~badx]
    report.kept["fit_rows"] += len(kept)
    return kept


class _ConfigProblem:
    """Negative log-likelihood of one configuration in scaled coordinates.

    The rows' noise depends on the parameters of their kind only, so every per-kind quantity
    (noise values, the Student-t constants, the digamma / trigamma terms) is computed once per kind
    and gathered to the rows, and per-kind sums are :func:`numpy.bincount` calls.
    """

    def __init__(self, rows: pd.DataFrame, coefs: tuple[str, ...], scale: np.ndarray) -> None:
        self.coefs = coefs
        self.K = len(coefs)
        self.X = rows[feature_columns(coefs)].to_numpy(dtype=float)
        self.log_y_obs = np.log(rows["value_us"].to_numpy(dtype=float))
        self.n = np.maximum(rows["n_steps"].to_numpy(dtype=float), 1.0)
        # multi-step rows: log y - d_i is modelled around log mu (see .likelihood); d_i is held
        # fixed during a Newton pass and updated to the fitted noise between passes
        self.offset = np.zeros(len(self.n))
        self.log_y = self.log_y_obs.copy()
        kinds = rows["kind"].to_numpy()
        self.kinds = sorted(set(kinds))
        self.kind_idx = np.searchsorted(self.kinds, kinds)
        # noise parameter layout: per kind [log sigma, (log tau), log nu]
        self.layout: list[tuple[str, str]] = []
        for k in self.kinds:
            self.layout.append((k, "sigma"))
            if k in WINDOW_KINDS:
                self.layout.append((k, "tau"))
            self.layout.append((k, "nu"))
        self.scale = scale
        self.Xs = self.X * scale[None, :]
        self.active = (self.X > 0).any(axis=0)
        # where each kind's parameters sit in eta (tau: -1 for kinds without one)
        self.n_kinds = len(self.kinds)
        self.j_sigma = np.array([self.layout.index((k, "sigma")) for k in self.kinds], dtype=int)
        self.j_nu = np.array([self.layout.index((k, "nu")) for k in self.kinds], dtype=int)
        self.j_tau = np.array([self.layout.index((k, "tau")) if (k, "tau") in self.layout else -1
                               for k in self.kinds], dtype=int)
        self.has_tau = self.j_tau >= 0
        self.inv_n = 1.0 / self.n
        self.inv_n2 = self.inv_n**2

    def set_offset(self, eta: np.ndarray) -> float:
        """Set the rows' offsets ``d_i`` from the noise ``eta``; returns the largest change."""
        sig = np.exp(eta[self.j_sigma])
        new = sum_log_offset(sig[self.kind_idx], self.n)
        change = float(np.max(np.abs(new - self.offset), initial=0.0))
        self.offset = new
        self.log_y = self.log_y_obs - new
        return change

    # -- unpacking -------------------------------------------------------------------------
    def _kind_noise(self, eta: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-kind (sigma, tau, nu); tau is 0 for kinds without an anchor error."""
        sig = np.exp(eta[self.j_sigma])
        tau = np.where(self.has_tau, np.exp(eta[np.maximum(self.j_tau, 0)]), 0.0)
        return sig, tau, np.exp(eta[self.j_nu])

    def noise_params(self, eta: np.ndarray) -> dict[str, NoiseParams]:
        """Noise parameters by kind."""
        vals: dict[str, dict[str, float]] = {k: {"sigma": 0.0, "tau": 0.0, "nu": 30.0} for k in self.kinds}
        for j, (k, what) in enumerate(self.layout):
            vals[k][what] = float(np.exp(eta[j]))
        return {k: NoiseParams(**v) for k, v in vals.items()}

    # -- objective -------------------------------------------------------------------------
    def derivatives(self, u: np.ndarray, eta: np.ndarray, order: int = 1
                    ) -> tuple[float, np.ndarray | None, np.ndarray | None]:
        """Negative log-likelihood and, up to ``order``, its gradient and Hessian in ``(u, eta)``.

        Parameters
        ----------
        u, eta
            Scaled coefficients (``K``) and noise parameters (``len(layout)``).
        order
            0: value only; 1: and the gradient (``K + len(eta)``); 2: and the Hessian.

        Returns
        -------
        f, grad, hess
            ``grad`` / ``hess`` are ``None`` below their order.

        Notes
        -----
        Per row, with ``a = log s``, ``q = nu s^2 + r^2`` and ``r = log y - log mu``, the
        log density is ``G(nu) + nu a - (nu + 1)/2 log q``; the derivatives below follow from it.
        ``a`` depends on ``log sigma`` and ``log tau`` through the weights ``ws = sigma^2 / (n s^2)``
        and ``wt = 1 - ws``; ``r`` on ``u`` through ``-z = -Xs / mu``.
        """
        ki, nk = self.kind_idx, self.n_kinds
        mu = np.maximum(self.Xs @ u, 1e-300)
        r = self.log_y - np.log(mu)
        sig, tau, nu_k = self._kind_noise(eta)
        vs = (sig**2)[ki] * self.inv_n
        vt = (tau**2)[ki] * self.inv_n2
        s2 = vs + vt
        nu = nu_k[ki]
        r2 = r * r
        log1 = np.log1p(r2 / (nu * s2))
        c_k = special.gammaln((nu_k + 1) / 2) - special.gammaln(nu_k / 2) - 0.5 * np.log(nu_k * np.pi)
        f = -float(np.sum(c_k[ki] - 0.5 * np.log(s2) - 0.5 * (nu + 1) * log1))
        if order == 0:
            return f, None, None
        K, ne = self.K, len(self.layout)
        q = nu * s2 + r2
        nu1 = nu + 1.0
        ws, wt = vs / s2, vt / s2
        z = self.Xs / mu[:, None]
        l_r = -nu1 * r / q
        l_a = nu * (r2 - s2) / q
        psi_k = 0.5 * special.digamma((nu_k + 1) / 2) - 0.5 * special.digamma(nu_k / 2) - 0.5 / nu_k
        l_nu = psi_k[ki] - 0.5 * log1 + 0.5 * nu1 * r2 / (nu * q)
        g = np.zeros(K + ne)
        g[:K] = l_r @ z  # d l / d u = -l_r z; negated
        g[K + self.j_sigma] = -np.bincount(ki, l_a * ws, nk)
        if self.has_tau.any():
            g[K + self.j_tau[self.has_tau]] = -np.bincount(ki, l_a * wt, nk)[self.has_tau]
        g[K + self.j_nu] = -np.bincount(ki, l_nu * nu, nk)
        if order == 1:
            return f, g, None
        q2 = q * q
        l_rr = -nu1 * (nu * s2 - r2) / q2
        l_ar = 2.0 * nu * nu1 * s2 * r / q2
        l_aa = -2.0 * nu * nu1 * s2 * r2 / q2
        l_rb = nu * (-r / q + nu1 * s2 * r / q2)  # b = log nu
        l_ab = nu * (1.0 - nu * s2 / q - nu1 * s2 * r2 / q2)
        tri_k = (0.25 * special.polygamma(1, (nu_k + 1) / 2) - 0.25 * special.polygamma(1, nu_k / 2)
                 + 0.5 / nu_k)
        l_bb = nu * nu * (tri_k[ki] - s2 / q + 0.5 * nu1 * s2 * s2 / q2) + nu * l_nu
        H = np.zeros((K + ne, K + ne))
        H[:K, :K] = -((z * (l_rr + l_r)[:, None]).T @ z)
        # d2 l / du d eta_j = -l_{r eta_j} z, gathered into one product
        W = np.zeros((len(r), ne))
        at = np.arange(len(r))
        W[at, self.j_sigma[ki]] = l_ar * ws
        W[at, self.j_nu[ki]] = l_rb
        if self.has_tau.any():
            m = self.has_tau[ki]
            W[at[m], self.j_tau[ki][m]] = l_ar[m] * wt[m]
        H[:K, K:] = z.T @ W
        H[K:, :K] = H[:K, K:].T
        # eta block: per kind (d2 a / d log sigma^2 = d2 a / d log tau^2 = 2 ws wt = -d2 a / d both)
        c = 2.0 * ws * wt
        blocks = {("sigma", "sigma"): l_aa * ws * ws + l_a * c, ("tau", "tau"): l_aa * wt * wt + l_a * c,
                  ("sigma", "tau"): l_aa * ws * wt - l_a * c, ("sigma", "nu"): l_ab * ws,
                  ("tau", "nu"): l_ab * wt, ("nu", "nu"): l_bb}
        jj = {"sigma": self.j_sigma, "tau": self.j_tau, "nu": self.j_nu}
        for (w1, w2), vals in blocks.items():
            sums = -np.bincount(ki, vals, nk)
            has = self.has_tau if "tau" in (w1, w2) else np.ones(nk, bool)
            i1, i2 = K + jj[w1][has], K + jj[w2][has]
            H[i1, i2] = sums[has]
            H[i2, i1] = sums[has]
        return f, g, H

    def negloglik(self, u: np.ndarray, eta: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        """Negative log-likelihood and its gradients in ``u`` (scaled theta) and ``eta``."""
        f, g, _ = self.derivatives(u, eta, 1)
        return f, g[:self.K], g[self.K:]


def _initial(problem: _ConfigProblem) -> tuple[np.ndarray, np.ndarray]:
    """Start: non-negative least squares on relative errors, noise at moderate values."""
    A = problem.Xs / np.exp(problem.log_y)[:, None]
    b = np.ones(len(A))
    u0 = np.ones(problem.K)
    try:
        cols = problem.active
        sol, _ = optimize.nnls(A[:, cols], b, maxiter=50 * problem.K)
        u0 = np.full(problem.K, 1e-3)
        u0[cols] = np.maximum(sol, 1e-3)
    except RuntimeError:
        pass
    mu = problem.Xs @ u0
    r = problem.log_y - np.log(np.maximum(mu, 1e-300))
    eta0 = []
    for k, what in problem.layout:
        m = problem.kind_idx == problem.kinds.index(k)
        mad = np.median(np.abs(r[m] - np.median(r[m]))) * 1.4826 + 1e-3
        if what == "sigma":
            eta0.append(np.log(np.clip(mad * np.sqrt(np.median(problem.n[m])), 1e-3, 2.0)))
        elif what == "tau":
            eta0.append(np.log(0.01))
        else:
            eta0.append(np.log(5.0))
    return u0, np.asarray(eta0)


def _noise_prior_terms(prior: NoisePrior | None, layout: list[tuple[str, str]], eta: np.ndarray
                       ) -> tuple[float, np.ndarray, np.ndarray]:
    """:meth:`NoisePrior.derivatives`, or zeros without a prior."""
    if prior is None:
        return 0.0, np.zeros(len(eta)), np.zeros(len(eta))
    return prior.derivatives(layout, eta)


class _Objective:
    """The stage-1 objective in the optimiser's variables ``x``.

    ``x`` is ``u`` on the active coefficients, followed by ``eta`` unless the noise is held at
    ``eta_fixed``. The objective is the negative log-likelihood, plus ``RIDGE/2 |u - u_ref|^2``,
    minus the noise log prior (when the noise is estimated).
    """

    def __init__(self, problem: _ConfigProblem, u_ref: np.ndarray, noise_prior: NoisePrior | None,
                 eta_fixed: np.ndarray | None = None) -> None:
        self.p = problem
        self.act = np.flatnonzero(problem.active)
        self.na = self.act.size
        self.u_ref = u_ref
        self.eta_fixed = eta_fixed
        self.prior = noise_prior if eta_fixed is None else None
        K, ne = problem.K, len(problem.layout)
        self.sel = self.act if eta_fixed is not None else np.concatenate([self.act, K + np.arange(ne)])

    def split(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(u, eta)`` of the full problem at ``x``."""
        u = np.zeros(self.p.K)
        u[self.act] = x[:self.na]
        return u, (x[self.na:] if self.eta_fixed is None else self.eta_fixed)

    def __call__(self, x: np.ndarray, order: int) -> tuple[float, np.ndarray | None, np.ndarray | None]:
        na = self.na
        u, e = self.split(x)
        f, g, H = self.p.derivatives(u, e, order)
        dx = x[:na] - self.u_ref
        f += 0.5 * RIDGE * float(dx @ dx)
        lp, gp, hp = _noise_prior_terms(self.prior, self.p.layout, e)
        f -= lp
        if order == 0:
            return f, None, None
        gx = g[self.sel]
        gx[:na] += RIDGE * dx
        if self.eta_fixed is None:
            gx[na:] -= gp
        if order == 1:
            return f, gx, None
        Hx = H[np.ix_(self.sel, self.sel)]
        Hx[np.arange(na), np.arange(na)] += RIDGE
        if self.eta_fixed is None:
            Hx[na:, na:] -= np.diag(hp)
        return f, gx, Hx



def summarize_config(rows: pd.DataFrame, coefs: tuple[str, ...], scale: np.ndarray,
                     noise_prior: NoisePrior | None = None,
                     fixed_noise: dict[str, NoiseParams] | None = None) -> ConfigSummary:
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

    Returns
    -------
    ConfigSummary
    """
    with _one_blas_thread():
        return _summarize_config(rows, coefs, scale, noise_prior, fixed_noise)


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
                      fixed_noise: dict[str, NoiseParams] | None) -> ConfigSummary:
    """:func:`summarize_config`, with BLAS as the caller left it."""
    first = rows.iloc[0]
    p = _ConfigProblem(rows, coefs, scale)
    u0, eta0 = _initial(p)
    K = p.K
    eta_bounds = []
    for _, what in p.layout:
        lo, hi = {"sigma": SIGMA_BOUNDS, "tau": TAU_BOUNDS, "nu": NU_BOUNDS}[what]
        eta_bounds.append((np.log(lo), np.log(hi)))
    eta_lo = np.array([b[0] for b in eta_bounds])
    eta_hi = np.array([b[1] for b in eta_bounds])
    na = int(p.active.sum())
    fit_noise = fixed_noise is None
    if fit_noise:
        eta = np.clip(eta0, eta_lo, eta_hi)
    else:
        eta = np.log([getattr(fixed_noise[k], what) for k, what in p.layout])
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
              noise_prior: NoisePrior | None = None, scheduler: Any = None) -> list[ConfigSummary]:
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

    Returns
    -------
    list of ConfigSummary
        Sorted by configuration id.
    """
    from bayes_latency.parallel import run_units

    cols = ["config_id", "model", "gpu", "tp", "kind", "n_steps", "value_us", *feature_columns(coefs)]
    # stage 1 estimates one noise per (configuration, noise class): ``kind`` carries the class
    rows = rows[cols].assign(kind=noise_kind(rows))
    jobs = [(g, tuple(coefs), scale, noise_prior) for _, g in rows.groupby("config_id", sort=True)]
    return run_units(summarize_config, jobs, scheduler=scheduler,
                     cost_s=len(rows) * SECONDS_PER_ROW, weights=[len(j[0]) for j in jobs],
                     desc="stage 1", unit="row", scatter=True)
