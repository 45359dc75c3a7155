"""The stage-1 objective of one configuration: negative log-likelihood, derivatives, noise prior.

:class:`_ConfigProblem` is the negative log-likelihood of a configuration's rows in scaled
coordinates ``u = theta / scale`` (``u >= 0``) and log noise ``eta`` (bounded, see ``*_BOUNDS``),
with analytic gradient and Hessian (:meth:`_ConfigProblem.derivatives`; per-kind quantities are
computed once per kind and summed with :func:`numpy.bincount`). :class:`NoisePrior` is the
noise parameters' prior, a penalty in stage 1; :class:`_Objective` is what the optimiser
minimises: the negative log-likelihood, plus a tiny ridge ``RIDGE/2 |u - u0|^2`` around the start
``u0``, minus the noise log prior; :func:`_initial` is its starting point. The optimiser and the
summaries it makes are in :mod:`bayes_latency.model.definition.summaries`.

Importing this module is light (NumPy, pandas and SciPy).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import optimize, special

from bayes_latency.model.definition.likelihood import (
    DEFAULT_NOISE_LOAD,
    LOAD_DEV_MAX,
    LOAD_GROWTH_SD,
    WINDOW_KINDS,
    NoiseParams,
    load_deviation,
    noise_load,
    sum_log_offset,
)
from bayes_latency.model.definition.rows import feature_columns

NU_BOUNDS = (1.5, 200.0)
#: Ridge (in coefficient / prior-median units) that pins directions the data leave flat.
RIDGE = 1e-4
SIGMA_BOUNDS = (1e-4, 5.0)
TAU_BOUNDS = (1e-7, 2.0)


@dataclass(frozen=True)
class NoisePrior:
    """The priors of the noise parameters of the full model (:func:`bayes_latency.model.definition.hierarchy._row_likelihood`),
    used as penalties in stage 1: the noise is set at its posterior mode, not its maximum
    likelihood. With a handful of rows of a kind (2-66 ``iteration`` rows per configuration of the
    ``small`` fleet) the maximum likelihood collapses (``nu`` at its bound 1.5, ``sigma`` 0.009
    against 0.154 in the full posterior) and shifted coefficient means by up to 0.65 posterior sd
    against full-data NUTS (``benchmarks/fast_vs_full.py``)."""

    sigma: dict[str, float]  # HalfNormal scale of sigma per kind
    tau: float = 0.05  # HalfNormal scale of tau (window anchor error)
    nu_alpha: float = 2.0  # Gamma(alpha, beta) of nu
    nu_beta: float = 0.1
    gamma: float = LOAD_GROWTH_SD  # Normal(0, gamma) sd of the load growth (.likelihood)

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
            if what == "gamma":  # not a log coordinate: N(0, sd) on gamma itself
                lp += -0.5 * eta[j] ** 2 / self.gamma**2
                g[j] = -eta[j] / self.gamma**2
                h[j] = -1.0 / self.gamma**2
            elif what == "nu":
                lp += self.nu_alpha * eta[j] - self.nu_beta * v
                g[j] = self.nu_alpha - self.nu_beta * v
                h[j] = -self.nu_beta * v
            else:
                s0 = self.tau if what == "tau" else self.sigma.get(kind, 0.5)
                lp += -0.5 * v**2 / s0**2 + eta[j]
                g[j] = -(v**2) / s0**2 + 1.0
                h[j] = -2.0 * v**2 / s0**2
        return lp, g, h


class _ConfigProblem:
    """Negative log-likelihood of one configuration in scaled coordinates.

    The rows' noise depends on the parameters of their kind only, so every per-kind quantity
    (noise values, the Student-t constants, the digamma / trigamma terms) is computed once per kind
    and gathered to the rows, and per-kind sums are :func:`numpy.bincount` calls.
    """

    def __init__(self, rows: pd.DataFrame, coefs: tuple[str, ...], scale: np.ndarray,
                 load: str = DEFAULT_NOISE_LOAD, shift: np.ndarray | None = None) -> None:
        self.coefs = coefs
        self.K = len(coefs)
        # run and window log shifts in contrast coordinates (.runs.shift_design): row i's mean
        # is multiplied by exp(R[i] @ w); the parameters are u (K coefficients) then w (nw)
        self.R = np.zeros((len(rows), 0)) if shift is None else np.asarray(shift, dtype=float)
        self.nw = int(self.R.shape[1])
        self.P = self.K + self.nw
        #: precision of the shifts' Gaussian prior ``w ~ N(0, 1/prec)`` (0: flat; set by the
        #: caller, see .summaries.summarize)
        self.w_prec = np.zeros(self.nw)
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
        # the load of each row's steps (.likelihood.noise_load) about its kind's median: a kind
        # whose rows all sit at one load (or have none) gets no growth parameter
        self.load = load
        log_load = noise_load(rows, load)
        self.load_ref = np.zeros(len(self.kinds))
        self.dl = np.zeros(len(self.n))
        for i in range(len(self.kinds)):
            m = self.kind_idx == i
            fin = log_load[m][np.isfinite(log_load[m])]
            if fin.size:
                self.load_ref[i] = float(np.median(fin))
                self.dl[m] = load_deviation(log_load[m], self.load_ref[i])
        grows = [bool(np.ptp(self.dl[self.kind_idx == i]) > 1e-9) for i in range(len(self.kinds))]
        # noise parameter layout: per kind [log sigma, (gamma), (log tau), log nu]
        self.layout: list[tuple[str, str]] = []
        for k, gr in zip(self.kinds, grows, strict=True):
            self.layout.append((k, "sigma"))
            if gr:
                self.layout.append((k, "gamma"))
            if k in WINDOW_KINDS:
                self.layout.append((k, "tau"))
            self.layout.append((k, "nu"))
        self.scale = scale
        self.Xs = self.X * scale[None, :]
        self.active = (self.X > 0).any(axis=0)
        #: the optimiser's free entries of (u, w): active coefficients and every shift
        self.active_x = np.concatenate([self.active, np.ones(self.nw, bool)])
        # where each kind's parameters sit in eta (tau: -1 for kinds without one)
        self.n_kinds = len(self.kinds)
        self.j_sigma = np.array([self.layout.index((k, "sigma")) for k in self.kinds], dtype=int)
        self.j_nu = np.array([self.layout.index((k, "nu")) for k in self.kinds], dtype=int)
        self.j_tau = np.array([self.layout.index((k, "tau")) if (k, "tau") in self.layout else -1
                               for k in self.kinds], dtype=int)
        self.has_tau = self.j_tau >= 0
        self.j_gamma = np.array([self.layout.index((k, "gamma")) if (k, "gamma") in self.layout
                                 else -1 for k in self.kinds], dtype=int)
        self.has_gamma = self.j_gamma >= 0
        self.inv_n = 1.0 / self.n
        self.inv_n2 = self.inv_n**2

    def set_offset(self, eta: np.ndarray) -> float:
        """Set the rows' offsets ``d_i`` from the noise ``eta``; returns the largest change."""
        new = sum_log_offset(self._row_sigma(eta), self.n)
        change = float(np.max(np.abs(new - self.offset), initial=0.0))
        self.offset = new
        self.log_y = self.log_y_obs - new
        return change

    # -- unpacking -------------------------------------------------------------------------
    def _row_sigma(self, eta: np.ndarray) -> np.ndarray:
        """Per-row step scale ``sigma_k exp(gamma_k (l_i - l_ref_k))``, the exponent clipped to
        ``+-LOAD_DEV_MAX`` (:mod:`bayes_latency.model.definition.likelihood`)."""
        dev = np.clip(self._gamma_rows(eta) * self.dl, -LOAD_DEV_MAX, LOAD_DEV_MAX)
        return np.exp(eta[self.j_sigma][self.kind_idx] + dev)

    def _gamma_rows(self, eta: np.ndarray) -> np.ndarray:
        """Each row's ``gamma`` (0 for kinds without one)."""
        gam = np.where(self.has_gamma, eta[np.maximum(self.j_gamma, 0)], 0.0)
        return gam[self.kind_idx]

    def _dl_free(self, eta: np.ndarray) -> np.ndarray:
        """``l_i - l_ref``, 0 where the exponent is clipped (it no longer moves with gamma)."""
        return np.where(np.abs(self._gamma_rows(eta) * self.dl) < LOAD_DEV_MAX, self.dl, 0.0)

    def _kind_noise(self, eta: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-kind (sigma, tau, nu); tau is 0 for kinds without an anchor error."""
        sig = np.exp(eta[self.j_sigma])
        tau = np.where(self.has_tau, np.exp(eta[np.maximum(self.j_tau, 0)]), 0.0)
        return sig, tau, np.exp(eta[self.j_nu])

    def eta_of(self, noise: dict[str, NoiseParams]) -> np.ndarray:
        """The noise parameters ``noise`` (by kind) in this problem's ``eta`` layout (logs of
        ``sigma``, ``tau``, ``nu``; ``gamma`` as is): the inverse of :meth:`noise_params`."""
        return np.array([getattr(noise[k], w) if w == "gamma" else np.log(getattr(noise[k], w))
                         for k, w in self.layout])

    def noise_params(self, eta: np.ndarray) -> dict[str, NoiseParams]:
        """Noise parameters by kind."""
        vals: dict[str, dict[str, float]] = {k: {"sigma": 0.0, "tau": 0.0, "nu": 30.0, "gamma": 0.0}
                                             for k in self.kinds}
        for j, (k, what) in enumerate(self.layout):
            vals[k][what] = float(eta[j] if what == "gamma" else np.exp(eta[j]))
        return {k: NoiseParams(**v, load_ref=float(self.load_ref[i]), load=self.load)
                for i, (k, v) in enumerate(vals.items())}

    # -- objective -------------------------------------------------------------------------
    def derivatives(self, u: np.ndarray, eta: np.ndarray, order: int = 1
                    ) -> tuple[float, np.ndarray | None, np.ndarray | None]:
        """Negative log-likelihood and, up to ``order``, its gradient and Hessian in ``(u, eta)``.

        Parameters
        ----------
        u, eta
            Scaled coefficients (``K``) followed by the shift contrasts (``nw``), and noise
            parameters (``len(layout)``).
        order
            0: value only; 1: and the gradient (``P + len(eta)``, ``P = K + nw``); 2: and the
            Hessian.

        Returns
        -------
        f, grad, hess
            ``grad`` / ``hess`` are ``None`` below their order.

        Notes
        -----
        Per row, with ``a = log s``, ``q = nu s^2 + r^2`` and ``r = log y - log mu``, the
        log density is ``G(nu) + nu a - (nu + 1)/2 log q``; the derivatives below follow from it.
        ``a`` depends on ``log sigma`` and ``log tau`` through the weights ``ws = sigma^2 / (n s^2)``
        and ``wt = 1 - ws``; ``r`` on ``u`` through ``-z = -Xs / mu`` and on the shifts ``w``
        through ``-R`` (``r`` is linear in ``w``: no second-order term of its own).
        """
        ki, nk = self.kind_idx, self.n_kinds
        K, nw, P = self.K, self.nw, self.P
        mu = np.maximum(self.Xs @ u[:K], 1e-300)
        r = self.log_y - np.log(mu)
        if nw:
            r = r - self.R @ u[K:P]
        _, tau, nu_k = self._kind_noise(eta)
        vs = self._row_sigma(eta) ** 2 * self.inv_n
        vt = (tau**2)[ki] * self.inv_n2
        s2 = vs + vt
        nu = nu_k[ki]
        r2 = r * r
        log1 = np.log1p(r2 / (nu * s2))
        c_k = special.gammaln((nu_k + 1) / 2) - special.gammaln(nu_k / 2) - 0.5 * np.log(nu_k * np.pi)
        f = -float(np.sum(c_k[ki] - 0.5 * np.log(s2) - 0.5 * (nu + 1) * log1))
        if order == 0:
            return f, None, None
        ne = len(self.layout)
        q = nu * s2 + r2
        nu1 = nu + 1.0
        ws, wt = vs / s2, vt / s2
        z = self.Xs / mu[:, None]
        l_r = -nu1 * r / q
        l_a = nu * (r2 - s2) / q
        psi_k = 0.5 * special.digamma((nu_k + 1) / 2) - 0.5 * special.digamma(nu_k / 2) - 0.5 / nu_k
        l_nu = psi_k[ki] - 0.5 * log1 + 0.5 * nu1 * r2 / (nu * q)
        g = np.zeros(P + ne)
        g[:K] = l_r @ z  # d l / d u = -l_r z; negated
        if nw:
            g[K:P] = l_r @ self.R  # d l / d w = -l_r R; negated
        g[P + self.j_sigma] = -np.bincount(ki, l_a * ws, nk)
        hg, dl = self.has_gamma, self._dl_free(eta)
        if hg.any():
            g[P + self.j_gamma[hg]] = -np.bincount(ki, l_a * ws * dl, nk)[hg]
        if self.has_tau.any():
            g[P + self.j_tau[self.has_tau]] = -np.bincount(ki, l_a * wt, nk)[self.has_tau]
        g[P + self.j_nu] = -np.bincount(ki, l_nu * nu, nk)
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
        H = np.zeros((P + ne, P + ne))
        H[:K, :K] = -((z * (l_rr + l_r)[:, None]).T @ z)
        if nw:
            H[:K, K:P] = -((z * l_rr[:, None]).T @ self.R)
            H[K:P, :K] = H[:K, K:P].T
            H[K:P, K:P] = -((self.R * l_rr[:, None]).T @ self.R)
        # d2 l / du d eta_j = -l_{r eta_j} z, gathered into one product
        W = np.zeros((len(r), ne))
        at = np.arange(len(r))
        W[at, self.j_sigma[ki]] = l_ar * ws
        W[at, self.j_nu[ki]] = l_rb
        if hg.any():
            m = hg[ki]
            W[at[m], self.j_gamma[ki][m]] = (l_ar * ws * dl)[m]
        if self.has_tau.any():
            m = self.has_tau[ki]
            W[at[m], self.j_tau[ki][m]] = l_ar[m] * wt[m]
        H[:K, P:] = z.T @ W
        H[P:, :K] = H[:K, P:].T
        if nw:  # d2 l / dw d eta_j = -l_{r eta_j} R
            H[K:P, P:] = self.R.T @ W
            H[P:, K:P] = H[K:P, P:].T
        # eta block: per kind (d2 a / d log sigma^2 = d2 a / d log tau^2 = 2 ws wt = -d2 a / d both)
        c = 2.0 * ws * wt
        # gamma moves log sigma_i by dl_i: its terms are log sigma's times dl (or dl^2)
        ss, st = l_aa * ws * ws + l_a * c, l_aa * ws * wt - l_a * c
        blocks = {("sigma", "sigma"): ss, ("tau", "tau"): l_aa * wt * wt + l_a * c,
                  ("sigma", "tau"): st, ("sigma", "nu"): l_ab * ws,
                  ("tau", "nu"): l_ab * wt, ("nu", "nu"): l_bb,
                  ("sigma", "gamma"): ss * dl, ("gamma", "gamma"): ss * dl * dl,
                  ("gamma", "tau"): st * dl, ("gamma", "nu"): l_ab * ws * dl}
        jj = {"sigma": self.j_sigma, "tau": self.j_tau, "nu": self.j_nu, "gamma": self.j_gamma}
        for (w1, w2), vals in blocks.items():
            sums = -np.bincount(ki, vals, nk)
            has = np.ones(nk, bool)
            if "tau" in (w1, w2):
                has = has & self.has_tau
            if "gamma" in (w1, w2):
                has = has & hg
            i1, i2 = P + jj[w1][has], P + jj[w2][has]
            H[i1, i2] = sums[has]
            H[i2, i1] = sums[has]
        return f, g, H

    def negloglik(self, u: np.ndarray, eta: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        """Negative log-likelihood and its gradients in ``u`` (scaled theta, then the shift
        contrasts) and ``eta``."""
        f, g, _ = self.derivatives(u, eta, 1)
        return f, g[:self.P], g[self.P:]


def _initial(problem: _ConfigProblem) -> tuple[np.ndarray, np.ndarray]:
    """Start: non-negative least squares on relative errors (shifts at 0), noise at moderate
    values; ``u0`` has the coefficients then the shift contrasts."""
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
        elif what == "gamma":
            eta0.append(0.0)
        else:
            eta0.append(np.log(5.0))
    return np.concatenate([u0, np.zeros(problem.nw)]), np.asarray(eta0)


def _noise_prior_terms(prior: NoisePrior | None, layout: list[tuple[str, str]], eta: np.ndarray
                       ) -> tuple[float, np.ndarray, np.ndarray]:
    """:meth:`NoisePrior.derivatives`, or zeros without a prior."""
    if prior is None:
        return 0.0, np.zeros(len(eta)), np.zeros(len(eta))
    return prior.derivatives(layout, eta)


class _Objective:
    """The stage-1 objective in the optimiser's variables ``x``.

    ``x`` is ``u`` on the active coefficients and the shift contrasts
    (:attr:`_ConfigProblem.active_x`), followed by ``eta`` unless the noise is held at
    ``eta_fixed``. The objective is the negative log-likelihood, plus ``RIDGE/2 |u - u_ref|^2``,
    plus the shifts' penalty ``1/2 sum_j prec_j w_j^2`` (:attr:`_ConfigProblem.w_prec`), minus
    the noise log prior (when the noise is estimated).
    """

    def __init__(self, problem: _ConfigProblem, u_ref: np.ndarray, noise_prior: NoisePrior | None,
                 eta_fixed: np.ndarray | None = None) -> None:
        self.p = problem
        self.act = np.flatnonzero(problem.active_x)
        self.na = self.act.size
        self.u_ref = u_ref
        self.eta_fixed = eta_fixed
        self.prior = noise_prior if eta_fixed is None else None
        P, ne = problem.P, len(problem.layout)
        self.sel = self.act if eta_fixed is not None else np.concatenate([self.act, P + np.arange(ne)])

    def split(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(u, eta)`` of the full problem at ``x``."""
        u = np.zeros(self.p.P)
        u[self.act] = x[:self.na]
        return u, (x[self.na:] if self.eta_fixed is None else self.eta_fixed)

    def __call__(self, x: np.ndarray, order: int) -> tuple[float, np.ndarray | None, np.ndarray | None]:
        na = self.na
        u, e = self.split(x)
        f, g, H = self.p.derivatives(u, e, order)
        dx = x[:na] - self.u_ref
        f += 0.5 * RIDGE * float(dx @ dx)
        nw, prec = self.p.nw, self.p.w_prec
        w = x[na - nw:na]
        f += 0.5 * float(prec @ (w * w))
        lp, gp, hp = _noise_prior_terms(self.prior, self.p.layout, e)
        f -= lp
        if order == 0:
            return f, None, None
        gx = g[self.sel]
        gx[:na] += RIDGE * dx
        gx[na - nw:na] += prec * w
        if self.eta_fixed is None:
            gx[na:] -= gp
        if order == 1:
            return f, gx, None
        Hx = H[np.ix_(self.sel, self.sel)]
        Hx[np.arange(na), np.arange(na)] += RIDGE
        Hx[np.arange(na - nw, na), np.arange(na - nw, na)] += prec
        if self.eta_fixed is None:
            Hx[na:, na:] -= np.diag(hp)
        return f, gx, Hx
