"""The hierarchical model in PyMC.

For configuration ``c`` = (model ``m``, GPU ``g``, TP degree ``t``) and coefficient ``k`` (the beta
terms, then the alpha terms), the population part is

    log m[c, k] = mu[k] + prior_offset[g, k]                       population mean (priors/),
                  + sigma_model[k] * z_model[m, k]                  with ARD folded into mu
                  + sigma_gpu[k]   * z_gpu[g, k]                    crossed partial pooling,
                  + sigma_tp[k]    * z_tp[t, k]                     non-centred, zero-sum effects

(a factor's effect is zero on the terms of the prior file's ``hierarchy.<factor>.without``: by
default the TP degree on ``weight_loading``, whose feature already divides the weights by TP), and
a configuration's coefficients scatter around it by what the crossed effects miss:

    theta[c, k] ~ N(m[c, k], (m[c, k] * sigma_config[k])^2)        sigma_config ~ 3-21 %

(the Gaussian form of a lognormal residual of ~8%; real fleets are not exactly additive, and an
unseen configuration gets this extra spread). ``prior_offset`` carries the per-GPU prior
overrides of ``priors/``.

The serving stack (a level only when the data mix stacks, e.g. vLLM traces and Splitwise
microbenchmarks) adds ``c[stack] + sigma_stack[k] * z_stack[k, stack]``: a shift common to every
coefficient plus per-term departures (:func:`_common`), both at scales fixed by the prior file
(two levels cannot teach a scale: :data:`MIN_LEVELS_FOR_SCALE`). ``sigma_config`` is bounded
(:data:`SIGMA_CONFIG_MAX`).

ARD: ``mu[k] = m0[k] + s0[k] * z[k] + log relevance[k]`` with
``relevance[k] = sigmoid(sharpness * (z[k] - loc))`` (see :func:`_population`): one parameter per
term, so the relevance cannot trade off against the mean.

Likelihood, two forms:

* ``method="laplace-hierarchy"`` (default, fast): each configuration's likelihood is the quadratic
  summary of :mod:`bayes_latency.model.definition.summaries`; with the Gaussian configuration residual the configuration's
  coefficients are **integrated out in closed form** (:func:`marginal_loglik`), so NUTS moves
  only in the population parameters (tens, not hundreds) and never meets the 0.1%-sharp ridges
  of coefficients that one configuration identifies only as a sum (``per_layer``, ``per_step``
  and dense ``weight_loading`` are all constant within a configuration). The configuration
  coefficients are then drawn exactly from their conditional Gaussian, per posterior draw
  (:func:`config_draws`). Measured on the test fleet: sampling the configuration coefficients
  explicitly gave tree depth 9-10, 40-465 divergences and R-hat up to 1.6 under every
  parametrisation tried (non-centred, partially centred, whitened).
* ``method="full"``: every row, Student-t on the log scale (:mod:`bayes_latency.model.definition.likelihood`), with the
  configuration coefficients sampled explicitly (``theta = m * (1 + sigma_config * eps)``) and
  noise scales and Student-t dof per (configuration, kind) as free parameters: the slow reference.

Sum-only groups (:func:`~bayes_latency.model.definition.identifiability.sum_groups`: coefficients whose
features are proportional on every row of every configuration, e.g. ``per_layer`` + ``per_step``,
real data also ``weight_loading``; the departure pair ``alpha_post_decode`` + ``alpha_per_token``):
every configuration identifies only ``sum_k w_k theta_k``. Sampled per term on the log scale, that
constraint is a curved ridge in the population means and in every factor's effects (measured on
the real data: each configuration's group sum mixed with bulk ESS 1,100-1,500, its split between
the terms with 57-120; R-hat 1.027-1.037). So (1) the population means of a group are sampled in
the coordinates ``(log S, split)`` of :class:`SumGroupTransform` (exact: same prior), and (2) the
factor effects (model, GPU, TP, stack) of a group's terms are one effect shared by the group (that
of its first coefficient, at that coefficient's scale): a factor moves the group's sum, and how a
configuration's sum splits between the terms beyond the population split is left to the
configuration residual (``sigma_config``, integrated out). The other members' ``z_<factor>`` and
``sigma_<factor>`` entries are then unused (prior draws); their ``eff_<factor>`` equal the first
coefficient's. (3) Configurations weigh the terms differently (real data: ``per_step`` /
``weight_loading`` feature ratio 3.0e-5 to 1.0e-4), so the population split still moved each
configuration's sum differently, against the shared effects (a curved ridge: bulk ESS 86-110);
:func:`_sum_shift` puts every configuration's sum on the typical one, so the split is the prior's
and ``log theta_pop`` is ``mu + offset + effects`` plus that shift for a group's members.
Measured (2 x 1000 draws, target_accept 0.95, real all data): (1)+(2) R-hat 1.027 -> 1.0095, bulk
ESS 63 -> 316 (free two-level scales) or 1.013-1.017 / 88-110 (fixed); with (3) 1.0122 / 211.
(4) Near pairs
(:func:`~bayes_latency.model.definition.identifiability.near_pairs`: proportional on every row where both are
non-zero, e.g. ``decode_compute`` + ``per_request``, one token per decoding request) are groups
too. On the real data the pair made the cross-validation split without the Splitwise
llama-2-70b H100 TP-2 benchmark bimodal (one chain put the decode cost on ``per_request``, x20,
the other on ``decode_compute``): R-hat 1.566, ESS 3, 14 divergences; as a group 1.0109 / 259 /
0. Tried on that split and not kept: ARD sharpness 2 (1.0096 / 67 / 1 divergence, but 1.080
without the gate on the groups), no gate on any term (1.057), no gate on the groups alone
(1.102), the pair sampled in its sum's coordinate with its own effects (1.245): the modes are
those of the split under the terms' lognormal priors, so a reparametrisation cannot join them;
sharing the effects (the split is then the population's only) does.

Where each part lives: coordinates and the prior arrays in :mod:`bayes_latency.model.definition.design`; the population level
(ARD, sum-group coordinates, crossed effects and their scales) in :mod:`bayes_latency.model.definition.population`; the
configuration level given the population (stacked stage-1 summaries, conditional draws) in
:mod:`bayes_latency.model.definition.conditional`; this module assembles the model (:func:`build_model`) and its likelihoods.

Variants for model comparison: ``hierarchy`` (above), ``no_ard`` (relevance fixed at 1),
``complete_pooling`` (no group effects), ``no_pooling`` (independent prior per configuration).
The variant ``population`` fits new data under a fitted fleet's population
(:mod:`bayes_latency.model.posterior.fleet`): the configurations' log-locations ``log m`` take the population's joint
multivariate normal prior (:class:`~bayes_latency.model.posterior.fleet.ConfigPrior`), ``sigma_config``
its lognormal one, and the configuration residual and likelihood are those above
(:func:`_population_prior`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pymc as pm
import pytensor.tensor as pt

from bayes_latency.model.definition.conditional import (  # noqa: F401  (re-exported)
    MAX_TILT_SHIFT,
    _stacked,
    bounded_tilt,
    config_draws,
    truncated_normal_positive,
)
from bayes_latency.model.definition.design import (  # noqa: F401  (re-exported)
    MIN_CONFIGS_FOR_RESIDUAL,
    Design,
    PriorArrays,
    prior_arrays,
)
from bayes_latency.model.definition.likelihood import (
    DEFAULT_NOISE_LOAD,
    LOAD_DEV_MAX,
    LOAD_GROWTH_SD,
    WINDOW_KINDS,
    load_deviation,
    load_refs,
    noise_kind,
)
from bayes_latency.model.definition.likelihood import noise_load as noise_load_values
from bayes_latency.model.definition.population import (  # noqa: F401  (re-exported)
    FIXED_SCALE_FACTORS,
    MIN_LEVELS_FOR_SCALE,
    SumGroupTransform,
    _config_common,
    _crossed_effects,
    _effect,
    _fixed,
    _population,
    _sum_shift,
)
from bayes_latency.model.definition.runs import LEVELS, SIGMA_PRIOR, contrast_arrays
from bayes_latency.model.definition.summaries import ConfigSummary, feature_columns

if TYPE_CHECKING:  # pragma: no cover
    from bayes_latency.data.kernel_evidence import KernelEvidence
    from bayes_latency.model.posterior.fleet import ConfigPrior

VARIANTS = ("hierarchy", "no_ard", "complete_pooling", "no_pooling", "population")


def build_model(design: Design, priors: object, *, variant: str = "hierarchy",
                summaries: list[ConfigSummary] | None = None, rows: pd.DataFrame | None = None,
                no_gate: tuple[str, ...] = (), noise_load: str = DEFAULT_NOISE_LOAD,
                sum_groups: list[tuple[list[str], np.ndarray, dict[str, np.ndarray]]] | None = None,
                population_prior: ConfigPrior | None = None,
                kernels: KernelEvidence | None = None) -> pm.Model:
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
        Per-configuration summaries (fast path: configuration coefficients integrated out), or
        the fitted rows (full path: every row in the likelihood).
    no_gate
        Coefficients whose ARD gate is off (see :func:`_population`).
    noise_load
        Load covariate of the noise scale (full path: its growth ``noise_gamma`` per
        (configuration, noise class) is a free parameter; :mod:`bayes_latency.model.definition.likelihood`).
    sum_groups
        ``(coefficient names, typical weights, {config_id: weights})`` of groups the data see
        only as a weighted sum (:func:`bayes_latency.model.definition.identifiability.sum_groups`): their
        population means are sampled in the sum's coordinate (:class:`SumGroupTransform`), their
        factor effects are shared (the first coefficient's) and each configuration's sum follows
        the typical one (:func:`_sum_shift`); see the module docstring.
    population_prior
        The prior of the configurations from a fitted fleet's population (variant
        ``population`` only; :meth:`~bayes_latency.model.posterior.fleet.Population.config_prior`), its
        rows in the order of ``design.configs``.
    kernels
        Measured kernel efficiency per GPU (:mod:`bayes_latency.model.definition.kernels`):
        data on the GPU effects of the tables' stack, and a GPU x stack interaction for the
        other stacks. Variants with crossed effects only.
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; expected one of {VARIANTS}")
    if summaries is None and rows is None:
        raise ValueError("give summaries= or rows=")
    pa = prior_arrays(priors, design.coefs, design.gpus)
    K = len(design.coefs)
    C = len(design.configs)
    g_idx = design.index("gpu")
    with pm.Model(coords=design.coords()) as model:
        pm.Data("config_llm", design.index("model"), dims="config")
        pm.Data("config_gpu", g_idx, dims="config")
        pm.Data("config_tp", design.index("tp"), dims="config")
        offset = pa.gpu_offset[g_idx]  # (C, K)
        if variant == "no_pooling":
            # independent lognormal prior per configuration, coefficients sampled explicitly
            z = pm.Normal("z_config", 0.0, 1.0, dims=("config", "coef"))
            theta = pt.exp(pa.mu_mean[None, :] + offset + pa.mu_sd[None, :] * z)
            _theta_deterministics(theta, design)
            if rows is None:
                _summary_potential(theta, summaries, design, np.exp(pa.mu_mean))
                run_scales(summaries)
            else:
                _row_likelihood(theta, design, rows, pa, noise_load)
            return model
        if variant == "population":
            if population_prior is None:
                raise ValueError("variant 'population' needs population_prior=")
            _population_prior(design, population_prior, summaries, rows, pa, noise_load)
            return model
        # the gate selects basis terms; the alpha overheads are not a selection (and the
        # departure rows give their two terms as a sum, whose corners the gate makes modes of)
        groups = [(np.asarray([design.coefs.index(c) for c in g[0]]), np.asarray(g[1], dtype=float))
                  for g in (sum_groups or []) if all(c in design.coefs for c in g[0])]
        # members of a sum-only group keep their gate unless GATE_SUM_GROUPS is off
        in_group = {design.coefs[i] for idx, _ in groups for i in idx}
        mu = _population(pa, variant, np.asarray([c not in no_gate and c in design.beta_terms
                                                  and (GATE_SUM_GROUPS or c not in in_group)
                                                  for c in design.coefs]), groups)
        loc = pt.broadcast_to(mu[None, :] + offset, (C, K))
        if variant != "complete_pooling":
            factors = {"model": pa.sigma_model, "gpu": pa.sigma_gpu, "tp": pa.sigma_tp}
            if len(design.stacks) > 1:  # serving software (only when the data mix stacks)
                factors["stack"] = pa.sigma_stack
            rep = np.arange(K)
            for idx, _ in groups:
                rep[idx] = idx[0]
            loc = loc + _crossed_effects(factors, design, pa, rep if groups else None)
            if kernels is not None:
                from bayes_latency.model.definition.kernels import kernel_effects

                loc = loc + kernel_effects(kernels, design, pa, rep if groups else None)
        loc = loc + _sum_shift(mu, design, sum_groups or [])
        sig_prior = pm.LogNormal.dist(mu=np.log(pa.sigma_config["median"]),
                                      sigma=pa.sigma_config["sigma"])
        n_act = _n_active(design, summaries, rows)
        if (n_act >= MIN_CONFIGS_FOR_RESIDUAL).all():
            sig_c = pm.Truncated("sigma_config", sig_prior, lower=0.0, upper=SIGMA_CONFIG_MAX,
                                 dims="coef")
        else:  # coefficients of fewer configurations: residual scale fixed at the prior median
            raw = pm.Truncated("sigma_config_free", sig_prior, lower=0.0, upper=SIGMA_CONFIG_MAX,
                               dims="coef")
            pooled = n_act >= MIN_CONFIGS_FOR_RESIDUAL
            fixed = _fixed("sigma_config_fixed", float(pa.sigma_config["median"]))
            sig_c = pt.where(pooled, raw, fixed)
            # NaN where fixed (population.NAN_FIXED; design.filled puts the value back)
            pm.Deterministic("sigma_config", pt.where(pooled, raw, np.nan), dims="coef")
        loc = loc + _config_common(pa.common.get("config"), design)
        m = pm.Deterministic("theta_pop", pt.exp(loc), dims=("config", "coef"))
        if rows is None:
            pm.Potential("loglik_marginal",
                         marginal_loglik(m, sig_c, summaries, design, np.exp(pa.mu_mean)))
            run_scales(summaries)
        else:
            eps = pm.Normal("eps_config", 0.0, 1.0, dims=("config", "coef"))
            theta = pt.maximum(m * (1.0 + sig_c[None, :] * eps), 1e-12)
            _theta_deterministics(theta, design)
            _row_likelihood(theta, design, rows, pa, noise_load)
    return model


def run_scales(summaries: list[ConfigSummary]) -> None:
    """``sigma_run`` (and ``sigma_window`` when the fit has window contrasts,
    :data:`~bayes_latency.model.definition.runs.WINDOWS`; :mod:`bayes_latency.model.definition.runs`),
    half-normal (:data:`~bayes_latency.model.definition.runs.SIGMA_PRIOR`), with the likelihood
    of every configuration's stage-1 contrasts: per level ``z_j ~ N(0, sigma^2 + lam_j)`` in the
    eigenbasis of the contrasts' covariance (:func:`~bayes_latency.model.definition.runs.contrast_arrays`).
    A level that no configuration of the data repeats (one run per configuration) has no scale
    in the model: its predictions are the configuration's, as without run effects. The
    contrasts enter as ``pm.Data`` (``run_contrast_<level>``, ``run_contrast_var_<level>``)."""
    arrays = contrast_arrays([(s.contrast_hat, s.contrast_cov, s.contrast_level)
                              for s in summaries if len(s.contrast_hat)])
    for lv in LEVELS:
        z, lam = arrays[lv]
        if not len(z):  # nothing repeats at this level: no scale in the model
            continue
        sig = pm.HalfNormal(f"sigma_{lv}", sigma=SIGMA_PRIOR[lv])
        zd = pm.Data(f"run_contrast_{lv}", z)
        ld = pm.Data(f"run_contrast_var_{lv}", lam)
        v = sig**2 + ld
        pm.Potential(f"loglik_{lv}", -0.5 * pt.sum(zd * zd / v + pt.log(2 * np.pi * v)))



#: Whether members of a sum-only group (:func:`~bayes_latency.model.definition.identifiability.sum_groups`)
#: keep the ARD gate (``no_gate`` still switches it off). Without it, every configuration
#: identifies only their weighted sum, so which of them is "irrelevant" would be the prior's
#: call; but measured on the real cross-validation splits (with :func:`near_pairs` as groups),
#: gating them converged better: split without bench llama-2-70b A100 TP-4, R-hat 1.0172 / bulk
#: ESS 162 gated against 1.2575 / 6 ungated (``weight_loading``, bloom's model effect); without
#: bench llama-2-70b H100 TP-2, 1.0109 / 259 against 1.0826 / 25 (``tp_allreduce``).
GATE_SUM_GROUPS = True


#: Upper bound of the configuration residual scale ``sigma_config`` (relative sd). The residual
#: ``theta ~ N(m, (m sigma)^2)`` is the Gaussian form of a lognormal residual, which holds only
#: for small ``sigma``: at 0.25 it puts 3e-5 of its mass below 0, at 0.5 already 2%, and there it
#: lets a configuration's coefficient sit at 0 whatever the population says, a move the stage-1
#: tilt of coefficients held at their bound rewards (see :func:`bounded_tilt`). Measured on the
#: real data (11 default terms, all data): unbounded, the two chains inflated ``sigma_config`` of
#: different terms (0.53 for prefill_compute in one, 0.65 for tp_allreduce in the other) so that
#: the two vLLM configurations could put them at 0: two modes, R-hat 1.83. Bounded, a difference
#: that large has to come from the crossed effects (here the serving stack), which are on the log
#: scale. The prior (median 0.08, 97.5% below 0.21) is truncated here, not reshaped.
SIGMA_CONFIG_MAX = 0.25


#: Names of the population prior's arrays as ``pm.Data`` (:func:`_population_prior`): models of
#: the same shape under other populations or configurations reuse one compilation.
POPULATION_DATA = ("population_mean", "population_chol", "population_log_sigma_mu",
                   "population_log_sigma_sd")


def _population_prior(design: Design, prior: ConfigPrior, summaries: list[ConfigSummary] | None,
                      rows: pd.DataFrame | None, pa: PriorArrays,
                      noise_load: str = DEFAULT_NOISE_LOAD) -> None:
    """The configuration level under a population's prior (variant ``population``).

        log m = mean + reshape(L z),  z ~ N(0, 1) over (config, coef),  L L' = Cov
        sigma_config[k] ~ LogNormal(mu_s[k], sd_s[k]) truncated to (0, SIGMA_CONFIG_MAX]
        theta[c, k] ~ N(m[c, k], (m[c, k] sigma_config[k])^2)

    ``theta`` integrated out on the fast path (:func:`marginal_loglik`), sampled on the full
    path, as in the hierarchy; on the full path the noise scale of every class the fleet fitted
    takes the lognormal of the fleet's configurations' scales ``s_f``
    (:attr:`~bayes_latency.model.posterior.fleet.ConfigPrior.noise_prior`):

        noise_sigma[c, k] ~ LogNormal(mean_f log s_f[k], max(sd_f log s_f[k], 0.25))

    the other classes keep the prior file's half-normal.
    """
    if tuple(prior.configs) != tuple(str(c) for c in design.configs.index):
        raise ValueError(f"population prior of configurations {prior.configs}, the design has "
                         f"{list(design.configs.index)}")
    C, K = prior.mean.shape
    mean, chol, ls_mu, ls_sd = (pm.Data(n, np.asarray(a, dtype=float)) for n, a in zip(
        POPULATION_DATA, (prior.mean, prior.chol, *prior.log_sigma_config), strict=True))
    z = pm.Normal("z_config_pop", 0.0, 1.0, dims=("config", "coef"))
    loc = mean + pt.dot(chol, z.flatten()).reshape((C, K))
    m = pm.Deterministic("theta_pop", pt.exp(loc), dims=("config", "coef"))
    sig_c = pm.Truncated("sigma_config", pm.LogNormal.dist(mu=ls_mu, sigma=ls_sd), lower=0.0,
                         upper=SIGMA_CONFIG_MAX, dims="coef")
    if rows is None:
        pm.Potential("loglik_marginal",
                     marginal_loglik(m, sig_c, summaries, design, np.exp(pa.mu_mean)))
        run_scales(summaries)
    else:
        eps = pm.Normal("eps_config", 0.0, 1.0, dims=("config", "coef"))
        theta = pt.maximum(m * (1.0 + sig_c[None, :] * eps), 1e-12)
        _theta_deterministics(theta, design)
        _row_likelihood(theta, design, rows, pa, noise_load, noise_prior=prior.noise_prior)


def _noise_sigma(kinds: list[str], n_configs: int, pa: PriorArrays,
                 noise_prior: dict[str, tuple[float, float]]) -> pt.TensorVariable:
    """``noise_sigma (config, kind)``: ``HalfNormal(pa.noise_sigma[k])`` (0.5 for a class the
    prior file lacks), or ``LogNormal(mu_k, sd_k)`` for a class of ``noise_prior``. Without
    ``noise_prior`` it is one free variable; with it, the half-normal classes
    (``noise_sigma_free``) and the lognormal ones (``noise_sigma_fleet``) are two, assembled in
    the deterministic ``noise_sigma``."""
    ones = np.ones((n_configs, 1))
    hn = [i for i, k in enumerate(kinds) if k not in noise_prior]
    ln = [i for i, k in enumerate(kinds) if k in noise_prior]
    hn_sd = np.asarray([pa.noise_sigma.get(kinds[i], 0.5) for i in hn])
    if not ln:
        return pm.HalfNormal("noise_sigma", sigma=hn_sd[None, :] * ones, dims=("config", "kind"))
    model = pm.modelcontext(None)
    model.add_coords({"fleet_kind": [kinds[i] for i in ln]})
    mu, sd = (np.asarray([noise_prior[kinds[i]][j] for i in ln]) for j in (0, 1))
    out = pt.zeros((n_configs, len(kinds)))
    out = pt.set_subtensor(out[:, ln], pm.LogNormal("noise_sigma_fleet", mu=mu[None, :] * ones,
                                                    sigma=sd[None, :] * ones,
                                                    dims=("config", "fleet_kind")))
    if hn:
        model.add_coords({"free_kind": [kinds[i] for i in hn]})
        out = pt.set_subtensor(out[:, hn], pm.HalfNormal("noise_sigma_free",
                                                         sigma=hn_sd[None, :] * ones,
                                                         dims=("config", "free_kind")))
    return pm.Deterministic("noise_sigma", out, dims=("config", "kind"))


def _n_active(design: Design, summaries: list[ConfigSummary] | None,
              rows: pd.DataFrame | None) -> np.ndarray:
    """Per coefficient, the number of configurations with information on it."""
    if summaries is not None:
        return np.sum([np.diag(s.info) > 0 for s in summaries], axis=0).astype(int)
    X = rows[feature_columns(design.coefs)].to_numpy(dtype=float) != 0
    cfg = rows["config_id"].to_numpy()
    return np.sum([X[cfg == c].any(axis=0) for c in np.unique(cfg)], axis=0).astype(int)


def _theta_deterministics(theta: pt.TensorVariable, design: Design) -> None:
    nb = len(design.beta_terms)
    pm.Deterministic("beta", theta[:, :nb], dims=("config", "term"))
    pm.Deterministic("alpha", theta[:, nb:], dims=("config", "alpha_term"))


def _summary_potential(theta: pt.TensorVariable, summaries: list[ConfigSummary],
                       design: Design, scale: np.ndarray | None = None) -> None:
    theta_hat, grad, info = _stacked(summaries, design, scale)
    d = theta - theta_hat
    pm.Potential("loglik_summaries",
                 pt.sum(d * grad) - 0.5 * pt.sum(d[:, :, None] * info * d[:, None, :]))


def marginal_loglik(m: pt.TensorVariable, sig_c: pt.TensorVariable,
                    summaries: list[ConfigSummary], design: Design,
                    scale: np.ndarray | None = None) -> pt.TensorVariable:
    """Log of the integral over each configuration's coefficients, summed over configurations.

    With ``l(theta) = g.(theta - theta_hat) - 1/2 (theta - theta_hat)' I (theta - theta_hat)``
    and ``theta ~ N(m, D)``, ``D^1/2 = diag(m * sigma_config)``:

        r = I (theta_hat - m) + g,   A = D^1/2 I D^1/2 + 1,   y = A^-1 D^1/2 r,
        theta* = m + D^1/2 y,        log Z = l(theta*) - y'y / 2 - log|A| / 2.

    ``A``'s condition number is the ratio of prior to posterior variance (1e4-1e6 here), so the
    solve is accurate in float64. Computed by one Op with an analytic gradient
    (:mod:`bayes_latency.model.definition.marginal`).

    The summary arrays enter as data (``pm.Data`` :data:`SUMMARY_DATA`), not constants: models
    of the same structure differ only in their values, so a compiled model is reused for new
    data (:func:`bayes_latency.model.inference.compiled.compiled_model`).
    """
    from bayes_latency.model.definition.marginal import marginal_loglik_op

    arrays = _stacked(summaries, design, scale)
    th, g, info = (pm.Data(name, a) for name, a in zip(SUMMARY_DATA, arrays, strict=True))
    return marginal_loglik_op(m, sig_c, th, g, info)


#: Names of the stage-1 summary arrays ``(theta_hat, grad, info)`` as ``pm.Data`` of the
#: marginal likelihood (:func:`marginal_loglik`).
SUMMARY_DATA = ("summary_theta_hat", "summary_grad", "summary_info")


def _row_likelihood(theta: pt.TensorVariable, design: Design, rows: pd.DataFrame,
                    pa: PriorArrays, noise_load: str = DEFAULT_NOISE_LOAD,
                    noise_prior: dict[str, tuple[float, float]] | None = None) -> None:
    """Every row in a Student-t likelihood on the log scale (:mod:`bayes_latency.model.definition.likelihood`), with noise
    ``sigma, tau, nu`` (and the load growth ``gamma``) per (configuration, noise class).

    ``noise_prior``: per noise class, ``(log median, sd)`` of a lognormal prior of its scale (a
    fleet's, :attr:`~bayes_latency.model.posterior.fleet.ConfigPrior.noise_prior`); the other classes
    take ``HalfNormal(pa.noise_sigma[k])``.
    """
    row_kind = noise_kind(rows)  # noise per (configuration, noise class)
    kinds = sorted(set(row_kind))
    cfg_idx = np.asarray([list(design.configs.index).index(c) for c in rows["config_id"]])
    kind_idx = np.searchsorted(kinds, row_kind)
    X = rows[feature_columns(design.coefs)].to_numpy(dtype=float)
    n = np.maximum(rows["n_steps"].to_numpy(dtype=float), 1.0)
    model = pm.modelcontext(None)
    model.add_coords({"kind": kinds, "obs": rows["obs_id"].astype(str).to_list()})
    sigma = _noise_sigma(kinds, len(design.configs), pa, noise_prior or {})
    win = np.asarray([k in WINDOW_KINDS for k in kinds], dtype=float)
    tau = pm.HalfNormal("noise_tau", sigma=0.05, dims=("config", "kind"))
    # dof per (configuration, kind), as stage 1 of the fast path estimates it: the two paths are
    # then the same model (a dof shared per kind left the fast path's beta means up to 0.12
    # posterior sd from this path's)
    nu = pm.Gamma("noise_nu", alpha=pa.nu_alpha, beta=pa.nu_beta, dims=("config", "kind"))
    s_sig = sigma[cfg_idx, kind_idx]
    if noise_load != "none":  # load-dependent scale (.likelihood): log sigma_i grows by gamma dl_i
        refs = load_refs(rows, noise_load)
        dl = load_deviation(noise_load_values(rows, noise_load),
                            np.asarray([refs[(str(c), str(k))] for c, k in
                                        zip(rows["config_id"], row_kind, strict=True)]))
        if noise_load.endswith("-growth"):
            gamma = pm.HalfNormal("noise_gamma", sigma=LOAD_GROWTH_SD, dims=("config", "kind"))
        else:
            gamma = pm.Normal("noise_gamma", 0.0, LOAD_GROWTH_SD, dims=("config", "kind"))
        s_sig = s_sig * pt.exp(pt.clip(gamma[cfg_idx, kind_idx] * dl, -LOAD_DEV_MAX, LOAD_DEV_MAX))
    s_tau = tau[cfg_idx, kind_idx] * win[kind_idx]
    scale = pt.sqrt(s_sig**2 / n + s_tau**2 / n**2)
    mu = pt.sum(theta[cfg_idx] * X, axis=1)
    off = 0.5 * s_sig**2 * (1.0 - 1.0 / n)  # multi-step rows: likelihood.sum_log_offset
    pm.StudentT("obs_log_value", nu=nu[cfg_idx, kind_idx], mu=pt.log(mu) + off, sigma=scale,
                observed=np.log(rows["value_us"].to_numpy(dtype=float)), dims="obs")
