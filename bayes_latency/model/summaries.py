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
this reproduces the full-data posterior (``benchmarks/fast_vs_full.py`` measures it).
Coefficients whose features are all zero for a configuration get zero information: the prior
speaks for them.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import optimize, special

from bayes_latency.data.report import IngestReport
from bayes_latency.model.likelihood import FIT_ROLES, WINDOW_KINDS, NoiseParams, student_t_logpdf

NU_BOUNDS = (1.5, 200.0)
#: Ridge (in coefficient / prior-median units) that pins directions the data leave flat.
RIDGE = 1e-4
#: Coefficient / noise alternations of the stage-1 optimiser.
MAX_ALTERNATIONS = 12
SIGMA_BOUNDS = (1e-4, 5.0)
TAU_BOUNDS = (1e-7, 2.0)


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
        lp, g = 0.0, np.zeros(len(eta))
        for j, (kind, what) in enumerate(layout):
            v = float(np.exp(eta[j]))
            if what == "nu":
                lp += self.nu_alpha * eta[j] - self.nu_beta * v
                g[j] = self.nu_alpha - self.nu_beta * v
            else:
                s0 = self.tau if what == "tau" else self.sigma.get(kind, 0.5)
                lp += -0.5 * v**2 / s0**2 + eta[j]
                g[j] = -(v**2) / s0**2 + 1.0
        return lp, g


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
    """Negative log-likelihood of one configuration in scaled coordinates."""

    def __init__(self, rows: pd.DataFrame, coefs: tuple[str, ...], scale: np.ndarray) -> None:
        self.coefs = coefs
        self.K = len(coefs)
        self.X = rows[feature_columns(coefs)].to_numpy(dtype=float)
        self.log_y = np.log(rows["value_us"].to_numpy(dtype=float))
        self.n = np.maximum(rows["n_steps"].to_numpy(dtype=float), 1.0)
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

    # -- unpacking -------------------------------------------------------------------------
    def noise_arrays(self, eta: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per-row (s, nu) and per-row d s / d log sigma, d s / d log tau."""
        sig = np.zeros(len(self.kinds))
        tau = np.zeros(len(self.kinds))
        nu = np.zeros(len(self.kinds))
        for j, (k, what) in enumerate(self.layout):
            ki = self.kinds.index(k)
            val = np.exp(eta[j])
            if what == "sigma":
                sig[ki] = val
            elif what == "tau":
                tau[ki] = val
            else:
                nu[ki] = val
        s2 = sig[self.kind_idx] ** 2 / self.n + tau[self.kind_idx] ** 2 / self.n**2
        s = np.sqrt(s2)
        return s, nu[self.kind_idx], sig[self.kind_idx] ** 2 / self.n / s, tau[self.kind_idx] ** 2 / self.n**2 / s

    def noise_params(self, eta: np.ndarray) -> dict[str, NoiseParams]:
        """Noise parameters by kind."""
        vals: dict[str, dict[str, float]] = {k: {"sigma": 0.0, "tau": 0.0, "nu": 30.0} for k in self.kinds}
        for j, (k, what) in enumerate(self.layout):
            vals[k][what] = float(np.exp(eta[j]))
        return {k: NoiseParams(**v) for k, v in vals.items()}

    # -- objective -------------------------------------------------------------------------
    def negloglik(self, u: np.ndarray, eta: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        """Negative log-likelihood and its gradients in ``u`` (scaled theta) and ``eta``."""
        mu = np.maximum(self.Xs @ u, 1e-300)
        r = self.log_y - np.log(mu)
        s, nu, ds_dls, ds_dlt = self.noise_arrays(eta)
        q = nu * s**2 + r**2
        ll = student_t_logpdf(r, nu, s)
        dl_dr = -(nu + 1) * r / q
        g_u = (dl_dr / mu) @ self.Xs * -1.0
        dl_ds = -1.0 / s + (nu + 1) * r**2 / (s * q)
        dl_dnu = (0.5 * special.digamma((nu + 1) / 2) - 0.5 * special.digamma(nu / 2) - 0.5 / nu
                  - 0.5 * np.log1p(r**2 / (nu * s**2)) + (nu + 1) / 2 * r**2 / (nu * q))
        g_eta = np.zeros(len(self.layout))
        for j, (k, what) in enumerate(self.layout):
            m = self.kind_idx == self.kinds.index(k)
            if what == "sigma":
                g_eta[j] = np.sum((dl_ds * ds_dls)[m])
            elif what == "tau":
                g_eta[j] = np.sum((dl_ds * ds_dlt)[m])
            else:
                g_eta[j] = np.sum((dl_dnu * nu)[m])
        return -float(ll.sum()), -g_u, -g_eta

    def hess_uu(self, u: np.ndarray, eta: np.ndarray) -> np.ndarray:
        """Analytic Hessian of the log-likelihood in ``u`` (negative semi-definite near the mode)."""
        mu = np.maximum(self.Xs @ u, 1e-300)
        r = self.log_y - np.log(mu)
        s, nu, _, _ = self.noise_arrays(eta)
        q = nu * s**2 + r**2
        f1 = -(nu + 1) * r / q
        f2 = -(nu + 1) * (nu * s**2 - r**2) / q**2
        w = (f1 + f2) / mu**2
        return (self.Xs * w[:, None]).T @ self.Xs


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
    """
    first = rows.iloc[0]
    p = _ConfigProblem(rows, coefs, scale)
    u0, eta0 = _initial(p)
    K = p.K
    ne = len(eta0)
    eta_bounds = []
    for _, what in p.layout:
        lo, hi = {"sigma": SIGMA_BOUNDS, "tau": TAU_BOUNDS, "nu": NU_BOUNDS}[what]
        eta_bounds.append((np.log(lo), np.log(hi)))

    # a tiny ridge in scaled coordinates pins the directions the data leave flat (coefficients
    # identified only as a sum); it is left out of the summary, whose expansion is exact anywhere
    act = np.flatnonzero(p.active)
    eta_lo = np.array([b[0] for b in eta_bounds])
    eta_hi = np.array([b[1] for b in eta_bounds])
    u = np.where(p.active, u0, 0.0)
    if fixed_noise is None:
        eta = np.clip(eta0, eta_lo, eta_hi)
    else:
        eta = np.log([getattr(fixed_noise[k], what) for k, what in p.layout])
    ua = u[act].copy()

    def f_u(x: np.ndarray) -> tuple[float, np.ndarray]:
        uu = np.zeros(K)
        uu[act] = x
        f, gu, _ = p.negloglik(uu, eta)
        dx = x - u0[act]
        return f + 0.5 * RIDGE * float(dx @ dx), gu[act] + RIDGE * dx

    def h_u(x: np.ndarray) -> np.ndarray:
        uu = np.zeros(K)
        uu[act] = x
        H = -p.hess_uu(uu, eta)[np.ix_(act, act)]
        w, V = np.linalg.eigh(0.5 * (H + H.T))  # Newton needs a PSD model of the curvature
        return (V * np.clip(w, 0.0, None)) @ V.T + RIDGE * np.eye(act.size)

    def neg_log_prior(e: np.ndarray) -> tuple[float, np.ndarray]:
        if noise_prior is None:
            return 0.0, np.zeros(len(e))
        lp, g = noise_prior.logp_and_grad(p.layout, e)
        return -lp, -g

    def f_e(e: np.ndarray) -> tuple[float, np.ndarray]:
        f, _, ge = p.negloglik(u, e)
        fp, gp = neg_log_prior(e)
        return f + fp, ge + gp

    converged, message, f_prev = False, "", np.inf
    for _ in range(MAX_ALTERNATIONS):
        if act.size:
            ru = optimize.minimize(f_u, np.maximum(ua, 1e-9), jac=True, hess=h_u, method="trust-constr",
                                   bounds=optimize.Bounds(np.zeros(act.size), np.full(act.size, np.inf)),
                                   options={"maxiter": 200, "gtol": 1e-9, "xtol": 1e-12})
            ua = np.maximum(ru.x, 0.0)
            u = np.zeros(K)
            u[act] = ua
        if fixed_noise is None:
            re = optimize.minimize(f_e, eta, jac=True, method="L-BFGS-B",
                                   bounds=list(zip(eta_lo, eta_hi, strict=True)),
                                   options={"maxiter": 500, "ftol": 1e-12})
            eta = re.x
            f_now = float(re.fun)
            message = f"alternating Newton/L-BFGS: f={f_now:.6f}"
        else:
            f_now = p.negloglik(u, eta)[0]
            message = f"Newton with the noise fixed: f={f_now:.6f}"
        if abs(f_prev - f_now) <= 1e-8 * max(1.0, abs(f_now)):
            converged = True
            break
        f_prev = f_now
    f, gu, ge = p.negloglik(u, eta)
    # observed information in u, noise profiled out (Schur complement)
    Huu = -p.hess_uu(u, eta)
    h = 1e-4
    Hee = np.zeros((ne, ne))
    Hue = np.zeros((K, ne))
    for j in range(ne):
        e1, e2 = eta.copy(), eta.copy()
        e1[j] += h
        e2[j] -= h
        _, gu1, ge1 = p.negloglik(u, e1)
        _, gu2, ge2 = p.negloglik(u, e2)
        ge1, ge2 = ge1 + neg_log_prior(e1)[1], ge2 + neg_log_prior(e2)[1]
        Hee[:, j] = (ge1 - ge2) / (2 * h)
        Hue[:, j] = (gu1 - gu2) / (2 * h)
    Hee = 0.5 * (Hee + Hee.T)
    # only profile noise parameters that are not stuck at a bound
    free = np.array([fixed_noise is None and b[0] + 1e-6 < e < b[1] - 1e-6
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
        noise=p.noise_params(eta), n_rows=n_rows, loglik=-f, converged=converged,
        message=message, active=p.active.copy(),
    )


def _summarize_one(args: tuple) -> ConfigSummary:
    return summarize_config(*args)


def summarize(rows: pd.DataFrame, coefs: tuple[str, ...], scale: np.ndarray,
              workers: int | None = None, noise_prior: NoisePrior | None = None) -> list[ConfigSummary]:
    """One :class:`ConfigSummary` per configuration of the (already filtered) fit rows.

    Configurations are independent, so they run in ``workers`` processes (default: the CPU
    count, at most 4; 1 for small inputs, where starting processes costs more than it saves).
    """
    cols = ["config_id", "model", "gpu", "tp", "kind", "n_steps", "value_us", *feature_columns(coefs)]
    jobs = [(g[cols], tuple(coefs), scale, noise_prior) for _, g in rows.groupby("config_id", sort=True)]
    if workers is None:
        workers = 1 if len(rows) < 20_000 else min(len(jobs), os.cpu_count() or 1, 4)
    if workers <= 1:
        return [_summarize_one(j) for j in jobs]
    ctx = multiprocessing.get_context("spawn" if sys.platform == "darwin" else "fork")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        return list(pool.map(_summarize_one, jobs))
