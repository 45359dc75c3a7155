"""The hierarchical model in PyMC.

For configuration ``c`` = (model ``m``, GPU ``g``, TP degree ``t``) and coefficient ``k`` (the beta
terms, then the alpha terms):

    log theta[c, k] = mu[k] + prior_offset[g, k]                    population mean (priors/)
                      + sigma_model[k] * z_model[m, k]               crossed partial pooling,
                      + sigma_gpu[k]   * z_gpu[g, k]                 non-centred, zero-sum effects
                      + sigma_tp[k]    * z_tp[t, k]
                      + log relevance[k]                             ARD: can shrink a term to ~0
                      + delta[c, k],  delta ~ N(0, sigma_config[k])  what the crossed effects miss

``delta`` lets a configuration differ from the additive effects (real fleets are not exactly
additive) and gives an unseen configuration its honest extra spread. It is *partially centred*:
where a configuration's own data pin ``log theta[c, k]`` down (stage-1 conditional sd below
``sigma_config``'s prior scale) it is sampled centred, elsewhere non-centred. This per-element
choice removes the funnels that either parametrisation alone has when some coefficients are
measured to 0.5% and others not at all (measured: divergences 95 -> 0 on the test fleet).

``prior_offset`` carries the per-GPU prior overrides of ``priors/`` (log of the overridden median
over the default median). ``relevance[k] ~ Beta(a, b)`` (``ard`` in the prior file) lets the data
shrink a term's contribution towards 0 for every configuration at once.

Likelihood, two interchangeable forms (same posterior up to the quadratic approximation):

* ``method="laplace-hierarchy"`` (default, fast): one quadratic potential per configuration from
  :mod:`.summaries` (stage 1).
* ``method="full"``: every row, Student-t on the log scale (:mod:`.likelihood`), with noise
  scales per (configuration, kind) and dof per kind as free parameters.

Variants for model comparison: ``hierarchy`` (above), ``no_ard`` (relevance fixed at 1),
``complete_pooling`` (no group effects), ``no_pooling`` (independent prior per configuration).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pymc as pm
import pytensor.tensor as pt

from bayes_latency.model.likelihood import WINDOW_KINDS
from bayes_latency.model.summaries import ConfigSummary, feature_columns

VARIANTS = ("hierarchy", "no_ard", "complete_pooling", "no_pooling")


@dataclass
class PriorArrays:
    """Numbers of the prior file laid out on the model's coordinates."""

    mu_mean: np.ndarray  # (K,) log-scale mean of the population coefficient
    mu_sd: np.ndarray  # (K,)
    gpu_offset: np.ndarray  # (G, K)
    sigma_model: float
    sigma_gpu: float
    sigma_tp: float
    sigma_config: float
    ard_a: float
    ard_b: float
    noise_sigma: dict[str, float]
    nu_alpha: float
    nu_beta: float


def _half_scale(entry: object, default: float) -> float:
    if isinstance(entry, dict):
        return float(entry.get("sigma", entry.get("scale", default)))
    return default


def prior_arrays(priors: object, coefs: tuple[str, ...], gpus: list[str]) -> PriorArrays:
    """Lay the prior set out on (coef,) and (gpu, coef) arrays."""
    K = len(coefs)
    mu_mean = np.zeros(K)
    mu_sd = np.zeros(K)
    for k, name in enumerate(coefs):
        mu_mean[k], mu_sd[k] = priors.log_mean_sd(name)
    offset = np.zeros((len(gpus), K))
    for g, gpu in enumerate(gpus):
        for k, name in enumerate(coefs):
            offset[g, k] = priors.log_mean_sd(name, gpu)[0] - mu_mean[k]
    hier = getattr(priors, "hierarchy", {}) or {}
    ard = getattr(priors, "ard", {}) or {}
    noise = getattr(priors, "noise", {}) or {}
    nsig = {k: _half_scale(v.get("sigma") if isinstance(v, dict) else None, 0.5) for k, v in noise.items()}
    nu_entry = next((v.get("nu") for v in noise.values() if isinstance(v, dict) and "nu" in v), {})
    return PriorArrays(
        mu_mean=mu_mean, mu_sd=mu_sd, gpu_offset=offset,
        sigma_model=_half_scale(hier.get("model"), 0.5),
        sigma_gpu=_half_scale(hier.get("gpu"), 0.3),
        sigma_tp=_half_scale(hier.get("tp"), 0.3),
        sigma_config=_half_scale(hier.get("config"), 0.2),
        ard_a=float(ard.get("alpha", 1.0)), ard_b=float(ard.get("beta", 0.5)),
        noise_sigma=nsig,
        nu_alpha=float(nu_entry.get("alpha", 2.0)) if isinstance(nu_entry, dict) else 2.0,
        nu_beta=float(nu_entry.get("beta", 0.1)) if isinstance(nu_entry, dict) else 0.1,
    )


@dataclass
class Design:
    """Coordinates of a fit: coefficients and the configurations with their group levels."""

    coefs: tuple[str, ...]
    beta_terms: tuple[str, ...]
    alpha_terms: tuple[str, ...]
    configs: pd.DataFrame  # index config_id; columns model, gpu, tp

    @property
    def models(self) -> list[str]:
        return sorted(self.configs["model"].unique())

    @property
    def gpus(self) -> list[str]:
        return sorted(self.configs["gpu"].unique())

    @property
    def tps(self) -> list[int]:
        return sorted(int(t) for t in self.configs["tp"].unique())

    def coords(self) -> dict[str, list]:
        return {"coef": list(self.coefs), "term": list(self.beta_terms),
                "alpha_term": list(self.alpha_terms), "config": list(self.configs.index),
                "model": self.models, "gpu": self.gpus, "tp": self.tps}

    def index(self, level: str) -> np.ndarray:
        levels = {"model": self.models, "gpu": self.gpus, "tp": self.tps}[level]
        col = self.configs[level].astype(int) if level == "tp" else self.configs[level]
        return np.asarray([levels.index(v) for v in col])


def _effect(name: str, scale_prior: float, level: str, design: Design) -> pt.TensorVariable:
    """sigma[k] * z[level, k] with zero-sum z (zero when there is one level)."""
    sigma = pm.HalfNormal(f"sigma_{name}", sigma=scale_prior, dims="coef")
    n_levels = len(design.coords()[level])
    if n_levels > 1:
        z = pm.ZeroSumNormal(f"z_{name}", dims=("coef", level))
        eff = pm.Deterministic(f"eff_{name}", (sigma[:, None] * z).T, dims=(level, "coef"))
    else:
        eff = pm.Deterministic(f"eff_{name}", pt.zeros((1, len(design.coefs))), dims=(level, "coef"))
    return eff


def centring_mask(summaries: list[ConfigSummary] | None, design: Design, threshold: float,
                  mode: str = "auto") -> np.ndarray:
    """Which (config, coef) residuals to sample centred: where the data alone pin log theta down.

    ``mode="auto"``: the *marginal* sd of ``log theta[c, k]`` under the configuration's own
    likelihood and a unit-sd log-scale prior (a Laplace approximation in log space,
    ``(D I D + 1)^-1`` with ``D = diag(theta_hat)``) is below ``threshold``. Marginal, not
    conditional: coefficients that are only identified as a sum (``per_layer``, ``per_step`` and
    dense ``weight_loading`` are all constant within one configuration) stay non-centred together.
    ``"none"`` / ``"all"`` force one parametrisation (for experiments).
    """
    C, K = len(design.configs), len(design.coefs)
    if mode == "none" or not summaries:
        return np.zeros((C, K), dtype=bool)
    if mode == "all":
        return np.ones((C, K), dtype=bool)
    mask = np.zeros((C, K), dtype=bool)
    by_id = {s.config_id: s for s in summaries}
    for i, c in enumerate(design.configs.index):
        s = by_id.get(c)
        if s is None:
            continue
        th = np.maximum(s.theta_hat, 1e-12)
        P = th[:, None] * s.info * th[None, :] + np.eye(K)
        msd = np.sqrt(np.clip(np.diag(np.linalg.inv(P)), 0, None))
        mask[i] = (msd < threshold) & (s.theta_hat > 0)
    return mask


def _initval(summaries: list[ConfigSummary] | None, design: Design, centre: np.ndarray) -> np.ndarray:
    """Start centred residuals at the stage-1 estimate (log theta_hat), the others at 0."""
    init = np.zeros(centre.shape)
    if summaries:
        by_id = {s.config_id: s for s in summaries}
        for i, c in enumerate(design.configs.index):
            if c in by_id:
                th = by_id[c].theta_hat
                init[i] = np.where(centre[i], np.log(np.maximum(th, 1e-12)), 0.0)
    return init


def build_model(design: Design, priors: object, *, variant: str = "hierarchy",
                summaries: list[ConfigSummary] | None = None, rows: pd.DataFrame | None = None,
                centre: np.ndarray | None = None, centring: str = "auto") -> pm.Model:
    """The PyMC model of one fit.

    Parameters
    ----------
    design
        Coordinates (coefficients, configurations and their levels).
    priors
        A :class:`bayes_latency.priors.PriorSet`.
    variant
        One of :data:`VARIANTS`.
    summaries, rows
        Per-configuration summaries; with ``rows`` also given, the likelihood is the full row
        likelihood and the summaries only choose the parametrisation and the starting point.
    centre
        ``(config, coef)`` booleans: residuals to sample centred (see :func:`centring_mask`).
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; expected one of {VARIANTS}")
    if summaries is None and rows is None:
        raise ValueError("give summaries= or rows=")
    pa = prior_arrays(priors, design.coefs, design.gpus)
    K = len(design.coefs)
    C = len(design.configs)
    g_idx = design.index("gpu")
    if centre is None:
        centre = centring_mask(summaries, design, pa.sigma_config, centring)
    with pm.Model(coords=design.coords()) as model:
        pm.Data("config_model", design.index("model"), dims="config")
        pm.Data("config_gpu", g_idx, dims="config")
        pm.Data("config_tp", design.index("tp"), dims="config")
        offset = pa.gpu_offset[g_idx]  # (C, K)
        if variant == "no_pooling":
            loc = pt.as_tensor(pa.mu_mean[None, :] + offset)
            scale = pt.as_tensor(np.broadcast_to(pa.mu_sd[None, :], (C, K)))
        else:
            mu = pm.Normal("mu", mu=pa.mu_mean, sigma=pa.mu_sd, dims="coef")
            loc = pt.broadcast_to(mu[None, :] + offset, (C, K))
            if variant != "complete_pooling":
                e_m = _effect("model", pa.sigma_model, "model", design)
                e_g = _effect("gpu", pa.sigma_gpu, "gpu", design)
                e_t = _effect("tp", pa.sigma_tp, "tp", design)
                loc = (loc + e_m[design.index("model")] + e_g[g_idx] + e_t[design.index("tp")])
            if variant != "no_ard":
                rel = pm.Beta("relevance", alpha=pa.ard_a, beta=pa.ard_b, dims="coef")
                loc = loc + pt.log(rel)[None, :]
            sig_c = pm.HalfNormal("sigma_config", sigma=pa.sigma_config, dims="coef")
            scale = pt.broadcast_to(sig_c[None, :], (C, K))
        # partially centred residual: u is log theta where centred, the standard normal elsewhere
        u = pm.Flat("u_config", dims=("config", "coef"), initval=_initval(summaries, design, centre))
        cm = pt.as_tensor(centre)
        log_theta = pt.switch(cm, u, loc + scale * u)
        z = pt.switch(cm, (u - loc) / scale, u)
        pm.Potential("config_residual_prior",
                     pt.sum(-0.5 * z**2) - pt.sum(pt.switch(cm, pt.log(scale), 0.0)))
        theta = pt.exp(log_theta)
        nb = len(design.beta_terms)
        pm.Deterministic("beta", theta[:, :nb], dims=("config", "term"))
        pm.Deterministic("alpha", theta[:, nb:], dims=("config", "alpha_term"))
        if summaries is not None and rows is None:
            _summary_likelihood(theta, design, summaries)
        else:
            _row_likelihood(theta, design, rows, pa)
    return model


def _summary_likelihood(theta: pt.TensorVariable, design: Design,
                        summaries: list[ConfigSummary]) -> None:
    by_id = {s.config_id: s for s in summaries}
    order = [by_id[c] for c in design.configs.index]
    theta_hat = np.stack([s.theta_hat for s in order])
    grad = np.stack([s.grad for s in order])
    info = np.stack([s.info for s in order])
    d = theta - theta_hat
    quad = pt.sum(d * grad) - 0.5 * pt.sum(d[:, :, None] * info * d[:, None, :])
    pm.Potential("loglik_summaries", quad)


def _row_likelihood(theta: pt.TensorVariable, design: Design, rows: pd.DataFrame,
                    pa: PriorArrays) -> None:
    kinds = sorted(rows["kind"].unique())
    cfg_idx = np.asarray([list(design.configs.index).index(c) for c in rows["config_id"]])
    kind_idx = np.searchsorted(kinds, rows["kind"].to_numpy())
    X = rows[feature_columns(design.coefs)].to_numpy(dtype=float)
    n = np.maximum(rows["n_steps"].to_numpy(dtype=float), 1.0)
    model = pm.modelcontext(None)
    model.add_coords({"kind": kinds, "obs": rows["obs_id"].astype(str).to_list()})
    sig_prior = np.asarray([pa.noise_sigma.get(k, 0.5) for k in kinds])
    sigma = pm.HalfNormal("noise_sigma", sigma=sig_prior[None, :] * np.ones((len(design.configs), 1)),
                          dims=("config", "kind"))
    win = np.asarray([k in WINDOW_KINDS for k in kinds], dtype=float)
    tau = pm.HalfNormal("noise_tau", sigma=0.05, dims=("config", "kind"))
    nu = pm.Gamma("noise_nu", alpha=pa.nu_alpha, beta=pa.nu_beta, dims="kind")
    s_sig = sigma[cfg_idx, kind_idx]
    s_tau = tau[cfg_idx, kind_idx] * win[kind_idx]
    scale = pt.sqrt(s_sig**2 / n + s_tau**2 / n**2)
    mu = pt.sum(theta[cfg_idx] * X, axis=1)
    pm.StudentT("obs_log_value", nu=nu[kind_idx], mu=pt.log(mu), sigma=scale,
                observed=np.log(rows["value_us"].to_numpy(dtype=float)), dims="obs")
