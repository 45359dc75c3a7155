"""The observation-level likelihood, shared by every fitting path.

Every observation row ``i`` of the observation table is a measured duration ``y_i`` (µs) whose
expected value is linear in the coefficients of its configuration ``c``:

    mu_i = x_i . theta_c          (x_i: the row's ``x_<term>`` features, theta_c = [beta_c, alpha_c])

Errors are multiplicative and heavy-tailed, so the likelihood is a Student-t on the log scale:

    log y_i ~ StudentT(nu_k, log mu_i + d_i, s_i),   s_i^2 = sigma_i^2 / n_i + tau_{c,k}^2 / n_i^2
    log sigma_i = log sigma_{c,k} + gamma_{c,k} * (l_i - l_ref_{c,k})

with ``k`` the row's noise class (its kind; steps that carry prefill work have their own,
:func:`noise_kind`), ``n_i`` the number of steps it spans (the noise of a sum of ``n``
independent step times shrinks like ``1/sqrt(n)``) and ``tau`` the timing error of the two anchors
of a ``step_window`` row (zero for other kinds). Alpha rows have ``n_i = 1``.

Load-dependent scale: ``l_i`` is the log of the load of one of the row's steps
(:func:`noise_load`; :data:`NOISE_LOADS` names the covariates, all computable where BLIS or a
replay predicts a step), ``l_ref`` the median of the fitted rows' ``l`` of the (configuration,
noise class), and ``gamma`` the growth of the log scale per unit of log load (an elasticity:
``sigma`` grows like ``load^gamma``), with the prior ``gamma ~ N(0, LOAD_GROWTH_SD)`` (a
half-normal for the ``*-growth`` forms, which only let the scale grow). ``gamma = 0`` is the
constant scale of the ``"none"`` covariate. Rows without load (alpha rows, a zero feature) sit at
``l_ref``; ``gamma`` lies in ``[-1, 1]`` (``[0, 1]`` for the growth-only forms) and the exponent
``gamma (l_i - l_ref)`` is clipped to ``+-LOAD_DEV_MAX``: a step's scale is at most 4 times, and
at least a quarter of, its reference scale, in fitting and in prediction alike (a heavy-tailed
draw at a scale without bound overflows).

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

from bayes_latency.errors import ConfigError

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


#: Load covariates of the noise scale (:func:`noise_load`): name -> what ``l_i`` is the log of.
NOISE_LOADS = {
    "none": "nothing (a constant scale per configuration and noise class)",
    "batch": "requests in the step (x_per_request / n_steps)",
    "batch-growth": "requests in the step, with gamma >= 0 (the scale can only grow)",
    "kv": "roofline time of the step's KV-cache reads (x_decode_kv + x_prefill_kv, per step, us)",
}
#: The covariate of a fit unless it asks for another: the one with the best held-out log
#: predictive density and PSIS-LOO of the comparison in ``results/benchmarks/heldout_real.md``
#: (``benchmarks/heldout_real.py --compare``).
DEFAULT_NOISE_LOAD = "batch-growth"
#: Noise classes whose scale follows the load: the steps of a serving engine. Benchmark means
#: (static batches, no serving load) keep a constant scale.
LOAD_KINDS = frozenset({"iteration", "iteration_prefill", "step_window"})
#: Prior sd of the growth ``gamma`` (log scale per unit of log load): a 4x heavier load widens the
#: scale by ``4^0.25 = 1.41`` at one prior sd.
LOAD_GROWTH_SD = 0.25
#: Largest ``|gamma (l_i - l_ref)|`` (log scale): the scale within 1/4-4x of its reference.
LOAD_DEV_MAX = float(np.log(4.0))


def check_noise_load(name: str) -> str:
    """``name`` if it is a known covariate of :data:`NOISE_LOADS`, else a ``ConfigError``."""
    if name not in NOISE_LOADS:
        raise ConfigError(f"unknown noise load {name!r}; expected one of {sorted(NOISE_LOADS)}")
    return name


def noise_load(rows: pd.DataFrame, load: str) -> np.ndarray:
    """Log load ``l_i`` of one step of each row for the covariate ``load`` (:data:`NOISE_LOADS`).

    Parameters
    ----------
    rows
        Rows with ``kind``, ``n_steps`` and the covariate's feature columns (a missing column
        counts 0; rows whose ``aggregate`` is ``"mean"`` carry one step's features already).
    load
        A key of :data:`NOISE_LOADS`.

    Returns
    -------
    np.ndarray
        ``(n,)`` log of the per-step load (requests, or us of KV reads); NaN where the row has
        none (a zero feature, a noise class outside :data:`LOAD_KINDS`, the ``"none"``
        covariate): those rows use ``l_ref``.
    """
    check_noise_load(load)
    out = np.full(len(rows), np.nan)
    if load == "none":
        return out
    n = np.maximum(rows["n_steps"].to_numpy(dtype=float), 1.0)
    if "aggregate" in rows.columns:
        n = np.where(rows["aggregate"].astype(str).to_numpy() == "mean", 1.0, n)
    cols = ("x_per_request",) if load.startswith("batch") else ("x_decode_kv", "x_prefill_kv")
    v = sum(rows[c].to_numpy(dtype=float) if c in rows.columns else np.zeros(len(rows))
            for c in cols) / n
    pos = (v > 0) & np.isin(noise_kind(rows), list(LOAD_KINDS))
    out[pos] = np.log(v[pos])
    return out


def load_refs(rows: pd.DataFrame, load: str) -> dict[tuple[str, str], float]:
    """Reference log load ``l_ref`` of each (configuration, noise class) of ``rows``: the median
    of its rows' finite :func:`noise_load` (0 without any)."""
    ll = noise_load(rows, load)
    key = [rows["config_id"].astype(str).to_numpy(), noise_kind(rows)]
    out = {}
    for (c, k), idx in pd.Series(0, index=rows.index).groupby(key).indices.items():
        fin = ll[idx][np.isfinite(ll[idx])]
        out[(str(c), str(k))] = float(np.median(fin)) if fin.size else 0.0
    return out


def load_growth_bounds(load: str) -> tuple[float, float]:
    """Bounds of ``gamma`` for the covariate ``load``: ``[0, 1]`` for the growth-only forms,
    ``[-1, 1]`` for the others (0 both ways for ``"none"``): the scale grows at most like the
    load itself."""
    if load == "none":
        return (0.0, 0.0)
    return (0.0, 1.0) if load.endswith("-growth") else (-1.0, 1.0)


def load_deviation(log_load: np.ndarray, ref: float) -> np.ndarray:
    """``l_i - l_ref``, 0 where the row has no load (NaN)."""
    d = np.asarray(log_load, dtype=float) - ref
    return np.where(np.isfinite(d), d, 0.0)


@dataclass(frozen=True)
class NoiseParams:
    """Noise of one (configuration, kind): log-scale sd per step at the reference load, anchor
    error, Student-t dof, and the growth ``gamma`` of the log scale with the log load
    ``l`` of covariate ``load`` around ``load_ref`` (see the module docstring)."""

    sigma: float
    tau: float
    nu: float
    gamma: float = 0.0
    load_ref: float = 0.0
    load: str = "none"

    def step_sigma(self, log_load: np.ndarray | None = None) -> np.ndarray | float:
        """Per-step log-scale ``sigma_i = sigma exp(gamma (l_i - l_ref))`` at log loads
        ``log_load`` (``None``: the reference load)."""
        if log_load is None or self.gamma == 0.0:
            return self.sigma if log_load is None else np.full(np.shape(log_load), self.sigma)
        dev = np.clip(self.gamma * load_deviation(log_load, self.load_ref),
                      -LOAD_DEV_MAX, LOAD_DEV_MAX)
        return self.sigma * np.exp(dev)

    def scale(self, n_steps: np.ndarray, log_load: np.ndarray | None = None) -> np.ndarray:
        """Per-row log-scale ``s_i`` for rows spanning ``n_steps`` steps at log loads
        ``log_load`` (:func:`noise_load`; ``None``: the reference load)."""
        n = np.maximum(np.asarray(n_steps, dtype=float), 1.0)
        return np.sqrt(self.step_sigma(log_load) ** 2 / n + self.tau**2 / n**2)

    def log_offset(self, n_steps: np.ndarray, log_load: np.ndarray | None = None) -> np.ndarray:
        """Per-row offset ``d_i`` of ``log y`` over ``log mu`` (:func:`sum_log_offset`)."""
        return sum_log_offset(self.step_sigma(log_load), n_steps)


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
