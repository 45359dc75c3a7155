"""The observation-level likelihood, shared by every fitting path.

Every observation row ``i`` of the observation table is a measured duration ``y_i`` (µs) whose
expected value is linear in the coefficients of its configuration ``c``:

    mu_i = x_i . theta_c          (x_i: the row's ``x_<term>`` features, theta_c = [beta_c, alpha_c])

Errors are multiplicative and heavy-tailed, so the likelihood is a Student-t on the log scale:

    log y_i ~ StudentT(nu_k, log mu_i + d_i, s_i),   s_i^2 = sigma_{c,k}^2 / n_i + tau_{c,k}^2 / n_i^2

with ``k`` the row's noise class (its kind; steps that carry prefill work have their own,
:func:`noise_kind`), ``n_i`` the number of steps it spans (the noise of a sum of ``n``
independent step times shrinks like ``1/sqrt(n)``) and ``tau`` the timing error of the two anchors
of a ``step_window`` row (zero for other kinds). Alpha rows have ``n_i = 1``.

The coefficients give the *median* of one step (``x . theta``; the step noise is symmetric on the
log scale). The median of a sum (or mean) of ``n`` steps with multiplicative noise of log-scale
variance ``v`` is higher than the sum of the medians, by the offset (:func:`sum_log_offset`)

    d_i = v / 2 * (1 - 1/n_i),   v = sigma_{c,k}^2

(the lognormal approximation of a sum of lognormals, Fenton-Wilkinson: ``log`` of the mean of ``n``
steps has mean ``v/2 - v/(2n)``; 0 for a single step, ``v/2 = log E[exp(eps)]`` for long sums).
``v`` is the kind's fitted per-step scale ``sigma`` squared, not the Student-t variance
``sigma^2 nu / (nu - 2)``: the Student-t location of ``log`` of a sum of heavy-tailed steps lies
below its mean, towards the median (simulated sums of 2 / 3 / 10 / 39 steps of the synthetic
step noise, 0.06 t_4: median 0.27 / 0.42 / 0.71 / 0.91 of ``v/2`` for the variance ``v``, Student-t
location 0.28 / 0.55 / 0.78 / 0.98). On the tiny fleet (seeds 0-9, stage 1, 159 directions the data
identify; windows over guessed cached prefixes left out), the constant-per-step direction sat
+0.97 sd (mean z) above the truth without the offset, -0.09 with it, and -0.60 with ``v`` the true
step variance (0.0071).

This module is numpy-only (no PyMC): it is used by the per-configuration summaries, by the
posterior predictive draws and by pointwise log-likelihoods for LOO.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import special

#: Kinds whose rows are fitted, and the coefficient block they inform.
FIT_ROLES = ("beta", "alpha", "workload")
#: Kinds with an anchor-timing error term ``tau``.
WINDOW_KINDS = frozenset({"step_window"})

#: Kinds whose rows of steps that carry prefill work have a noise of their own, and its name.
#: Measured on the real H100 iterations (all-data fit, MODEL_VERSION 8, one noise per kind):
#: steps with a prefill chunk scatter 2-3x as much as pure decode steps (log-residual MAD 0.022-
#: 0.038 against 0.012-0.024), so one scale put 0.23-0.44 of the mixed steps inside their 50%
#: band and 0.40-0.62 of the decode steps (by run and by first two thirds / last third of the
#: run); with the two classes 0.40-0.56 and 0.38-0.53.
PREFILL_NOISE_KINDS = {"iteration": "iteration_prefill",
                       "benchmark_mean": "benchmark_mean_prefill"}
#: Feature columns whose being non-zero marks a row's steps as carrying prefill work.
_PREFILL_FEATURES = ("x_prefill_compute", "x_prefill_kv")


def noise_kind(rows: pd.DataFrame) -> np.ndarray:
    """Each row's noise class: its ``kind``, or for a kind of :data:`PREFILL_NOISE_KINDS` whose
    steps carry prefill work (a non-zero ``x_prefill_compute``, else ``x_prefill_kv``), that
    kind's prefill class (``iteration_prefill``, ``benchmark_mean_prefill``).

    The likelihood's ``sigma, tau, nu`` are per (configuration, noise class); everything else
    (checks, reports) still groups rows by ``kind``. Rows without either feature column keep
    their kind.
    """
    kind = rows["kind"].astype(str).to_numpy()
    col = next((c for c in _PREFILL_FEATURES if c in rows.columns), None)
    if col is None:
        return kind
    pre = rows[col].to_numpy(dtype=float) > 0
    out = kind.astype(object)
    for base, cls in PREFILL_NOISE_KINDS.items():
        out[(kind == base) & pre] = cls
    return out.astype(str)


@dataclass(frozen=True)
class NoiseParams:
    """Noise of one (configuration, kind): log-scale sd per step, anchor error, Student-t dof."""

    sigma: float
    tau: float
    nu: float

    def scale(self, n_steps: np.ndarray) -> np.ndarray:
        """Per-row log-scale ``s_i`` for rows spanning ``n_steps`` steps."""
        n = np.maximum(np.asarray(n_steps, dtype=float), 1.0)
        return np.sqrt(self.sigma**2 / n + self.tau**2 / n**2)

    def log_offset(self, n_steps: np.ndarray) -> np.ndarray:
        """Per-row offset ``d_i`` of ``log y`` over ``log mu`` (:func:`sum_log_offset`)."""
        return sum_log_offset(self.sigma, n_steps)


def sum_log_offset(sigma: float | np.ndarray, n_steps: np.ndarray) -> np.ndarray:
    """How far the median of ``log`` of a sum of ``n`` steps lies above ``log`` of the sum of
    their medians: ``sigma^2 / 2 * (1 - 1/n)`` (see the module docstring).

    Parameters
    ----------
    sigma
        Per-step log-scale noise (scalar or per row).
    n_steps
        Steps each row spans (values below 1 count as 1: offset 0).

    Returns
    -------
    np.ndarray
        Offsets on the log scale, per row.
    """
    n = np.maximum(np.asarray(n_steps, dtype=float), 1.0)
    return 0.5 * np.asarray(sigma, dtype=float) ** 2 * (1.0 - 1.0 / n)


def student_t_logpdf(r: np.ndarray, nu: float | np.ndarray, s: np.ndarray) -> np.ndarray:
    """Log density of a Student-t residual ``r`` with dof ``nu`` and scale ``s``."""
    nu = np.asarray(nu, dtype=float)
    z2 = (r / s) ** 2
    return (special.gammaln((nu + 1) / 2) - special.gammaln(nu / 2)
            - 0.5 * np.log(nu * np.pi) - np.log(s) - (nu + 1) / 2 * np.log1p(z2 / nu))


def row_loglik(log_y: np.ndarray, X: np.ndarray, theta: np.ndarray, scale: np.ndarray,
               nu: np.ndarray, offset: np.ndarray | float = 0.0) -> np.ndarray:
    """Pointwise log-likelihood of rows for one or many coefficient draws.

    Parameters
    ----------
    log_y
        ``(n,)`` log of the observed values (µs).
    X
        ``(n, K)`` features.
    theta
        ``(K,)`` or ``(S, K)`` or ``(S, n, K)`` coefficients (draws first).
    scale, nu
        ``(n,)`` per-row Student-t scale and dof.
    offset
        ``(n,)`` per-row offset ``d_i`` of the location over ``log mu`` (:func:`sum_log_offset`).

    Returns
    -------
    np.ndarray
        ``(n,)`` or ``(S, n)`` log densities.
    """
    if theta.ndim == 3:
        mu = np.einsum("snk,nk->sn", theta, X)
    else:
        mu = theta @ X.T
    mu = np.maximum(mu, 1e-12)
    return student_t_logpdf(log_y - offset - np.log(mu), nu, scale)


def student_t_draws(rng: np.random.Generator, mean_log: np.ndarray, scale: np.ndarray,
                    nu: np.ndarray) -> np.ndarray:
    """Draws of ``exp(log mean + s * t_nu)``: predictive values with multiplicative noise."""
    t = rng.standard_t(np.broadcast_to(nu, mean_log.shape))
    return np.exp(mean_log + scale * t)
