"""The hierarchical model in PyMC.

For configuration ``c`` = (model ``m``, GPU ``g``, TP degree ``t``) and coefficient ``k`` (the beta
terms, then the alpha terms), the population part is

    log m[c, k] = mu[k] + prior_offset[g, k]                       population mean (priors/),
                  + sigma_model[k] * z_model[m, k]                  with ARD folded into mu
                  + sigma_gpu[k]   * z_gpu[g, k]                    crossed partial pooling,
                  + sigma_tp[k]    * z_tp[t, k]                     non-centred, zero-sum effects

and a configuration's coefficients scatter around it by what the crossed effects miss:

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
  summary of :mod:`.summaries`; with the Gaussian configuration residual the configuration's
  coefficients are **integrated out in closed form** (:func:`marginal_loglik`), so NUTS moves
  only in the population parameters (tens, not hundreds) and never meets the 0.1%-sharp ridges
  of coefficients that one configuration identifies only as a sum (``per_layer``, ``per_step``
  and dense ``weight_loading`` are all constant within a configuration). The configuration
  coefficients are then drawn exactly from their conditional Gaussian, per posterior draw
  (:func:`config_draws`). Measured on the test fleet: sampling the configuration coefficients
  explicitly gave tree depth 9-10, 40-465 divergences and R-hat up to 1.6 under every
  parametrisation tried (non-centred, partially centred, whitened).
* ``method="full"``: every row, Student-t on the log scale (:mod:`.likelihood`), with the
  configuration coefficients sampled explicitly (``theta = m * (1 + sigma_config * eps)``) and
  noise scales and Student-t dof per (configuration, kind) as free parameters: the slow reference.

Sum-only groups (:func:`~bayes_latency.data.identifiability.sum_groups`: coefficients whose
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
(:func:`~bayes_latency.data.identifiability.near_pairs`: proportional on every row where both are
non-zero, e.g. ``decode_compute`` + ``per_request``, one token per decoding request) are groups
too. On the real data the pair made the cross-validation split without the Splitwise
llama-2-70b H100 TP-2 benchmark bimodal (one chain put the decode cost on ``per_request``, x20,
the other on ``decode_compute``): R-hat 1.566, ESS 3, 14 divergences; as a group 1.0109 / 259 /
0. Tried on that split and not kept: ARD sharpness 2 (1.0096 / 67 / 1 divergence, but 1.080
without the gate on the groups), no gate on any term (1.057), no gate on the groups alone
(1.102), the pair sampled in its sum's coordinate with its own effects (1.245): the modes are
those of the split under the terms' lognormal priors, so a reparametrisation cannot join them;
sharing the effects (the split is then the population's only) does.

Variants for model comparison: ``hierarchy`` (above), ``no_ard`` (relevance fixed at 1),
``complete_pooling`` (no group effects), ``no_pooling`` (independent prior per configuration).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pymc as pm
import pytensor.tensor as pt
from pymc.logprob.transforms import Transform
from scipy import special

from bayes_latency.data.observations import DEFAULT_STACK
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
    sigma_stack: float
    spread: dict[str, float | None]
    sigma_config: dict
    ard: dict
    noise_sigma: dict[str, float]
    nu_alpha: float
    nu_beta: float
    #: per factor, the scale of an effect common to every coefficient (``hierarchy.<f>_common``)
    common: dict[str, float | None] = field(default_factory=dict)


def _half_scale(entry: object, default: float) -> float:
    if isinstance(entry, dict):
        return float(entry.get("sigma", entry.get("scale", default)))
    return default


def _config_scale(entry: object) -> dict:
    """Prior of the configuration residual scale: lognormal, bounded away from 0."""
    if isinstance(entry, dict) and entry.get("dist") == "lognormal":
        return {"median": float(entry["median"]), "sigma": float(entry["sigma"])}
    return {"median": 0.08, "sigma": 0.5}


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
        sigma_stack=_half_scale(hier.get("stack"), 0.5),
        spread={f: (float(hier[f]["spread"]) if isinstance(hier.get(f), dict) and "spread" in hier[f]
                    else None) for f in ("model", "gpu", "tp", "stack")},
        sigma_config=_config_scale(hier.get("config")),
        ard=dict(ard) or {"dist": "logistic_gate", "loc": -1.5, "scale": 1.0, "sharpness": 4.0},
        noise_sigma=nsig,
        nu_alpha=float(nu_entry.get("alpha", 2.0)) if isinstance(nu_entry, dict) else 2.0,
        nu_beta=float(nu_entry.get("beta", 0.1)) if isinstance(nu_entry, dict) else 0.1,
        common={f: (_half_scale(hier[f"{f}_common"], 1.0) if f"{f}_common" in hier else None)
                for f in ("model", "gpu", "tp", "stack", "config")},
    )


@dataclass
class Design:
    """Coordinates of a fit: coefficients and the configurations with their group levels."""

    coefs: tuple[str, ...]
    beta_terms: tuple[str, ...]
    alpha_terms: tuple[str, ...]
    configs: pd.DataFrame  # index config_id; columns model, gpu, tp, stack (default: vLLM)

    def __post_init__(self) -> None:
        if "stack" not in self.configs:
            self.configs = self.configs.assign(stack=DEFAULT_STACK)

    @property
    def models(self) -> list[str]:
        return sorted(self.configs["model"].unique())

    @property
    def gpus(self) -> list[str]:
        return sorted(self.configs["gpu"].unique())

    @property
    def tps(self) -> list[int]:
        return sorted(int(t) for t in self.configs["tp"].unique())

    @property
    def stacks(self) -> list[str]:
        return sorted(self.configs["stack"].unique())

    def coords(self) -> dict[str, list]:
        return {"coef": list(self.coefs), "term": list(self.beta_terms),
                "alpha_term": list(self.alpha_terms), "config": list(self.configs.index),
                "model": self.models, "gpu": self.gpus, "tp": self.tps, "stack": self.stacks}

    def index(self, level: str) -> np.ndarray:
        levels = {"model": self.models, "gpu": self.gpus, "tp": self.tps, "stack": self.stacks}[level]
        col = self.configs[level].astype(int) if level == "tp" else self.configs[level]
        return np.asarray([levels.index(v) for v in col])


class SumGroupTransform(Transform):
    """Sample ``z_pop`` of each sum-only group in the direction its data identify.

    For a group ``G`` of ``n`` coefficients that every configuration sees (nearly) only through
    ``S = sum_k w_k exp(mu_k)`` (``mu_k = m_k + s_k z_k``, the population log-mean without the
    ARD gate; ``w_k`` typical feature ratios, :func:`~bayes_latency.data.identifiability.sum_groups`),
    the unconstrained coordinates are ``(log S, eta_1 .. eta_{n-1})`` with

        mu_k = log S + eta_k - logsumexp(eta_1 .. eta_{n-1}, 0) - log w_k      (eta_n = 0),

    each standardised (``log S`` around its value at the prior centre, by the largest ``s_k``;
    ``eta_k`` by ``sqrt(s_k^2 + s_n^2)``) so that initial-point jitter stays on the prior's scale.
    ``d mu / d(log S, eta)`` has ``|det| = 1`` (add ``p_j`` times the first column to column
    ``j``), so the log-Jacobian is a constant and the prior of ``z_pop`` is unchanged: the model
    is the same, only the sampler's coordinates differ. The data then act (almost) only on
    ``log S``; the split ``eta`` is the prior's and straight, where per-term ``z`` made the
    constraint ``sum_k w_k exp(mu_k) = const`` a curved ridge (low ESS, and chains at different
    places along it). Coefficients outside the groups keep the identity.
    """

    name = "sumgroups"  # no underscore: PyMC recovers the variable name up to the last one

    def __init__(self, groups: list[tuple[np.ndarray, np.ndarray]], m: np.ndarray,
                 s: np.ndarray) -> None:
        self.groups = []
        for idx, w in groups:
            idx = np.asarray(idx, dtype=int)
            lw = np.log(np.asarray(w, dtype=float))
            a0 = m[idx] + lw
            log_s0 = float(special.logsumexp(a0))
            sd_s = float(np.max(s[idx]))
            eta0 = a0[:-1] - a0[-1]
            sd_eta = np.sqrt(s[idx[:-1]] ** 2 + s[idx[-1]] ** 2)
            self.groups.append((idx, lw, log_s0, sd_s, eta0, sd_eta))
        self.m, self.s = np.asarray(m, dtype=float), np.asarray(s, dtype=float)

    def backward(self, value: pt.TensorVariable, *inputs: object) -> pt.TensorVariable:
        z = value
        for idx, lw, log_s0, sd_s, eta0, sd_eta in self.groups:
            log_s = log_s0 + sd_s * value[..., idx[0]]
            eta = eta0 + sd_eta * value[..., idx[1:]]
            eta = pt.concatenate([eta, pt.zeros_like(eta[..., :1])], axis=-1)
            lse = pt.logsumexp(eta, axis=-1, keepdims=True)
            mu = log_s[..., None] + eta - lse - lw
            z = pt.set_subtensor(z[..., idx], (mu - self.m[idx]) / self.s[idx])
        return z

    def forward(self, value: pt.TensorVariable, *inputs: object) -> pt.TensorVariable:
        u = value
        for idx, lw, log_s0, sd_s, eta0, sd_eta in self.groups:
            a = self.m[idx] + self.s[idx] * value[..., idx] + lw
            log_s = pt.logsumexp(a, axis=-1)
            eta = a[..., :-1] - a[..., -1:]
            u = pt.set_subtensor(u[..., idx[0]], (log_s - log_s0) / sd_s)
            u = pt.set_subtensor(u[..., idx[1:]], (eta - eta0) / sd_eta)
        return u

    def log_jac_det(self, value: pt.TensorVariable, *inputs: object) -> pt.TensorVariable:
        # constant: |d mu / d(log S, eta)| = 1, times the standardisations of both sides
        out = np.zeros(len(self.m))
        for idx, _, _, sd_s, _, sd_eta in self.groups:
            out[idx[0]] += np.log(sd_s)
            out[idx[1:]] += np.log(sd_eta)
            out[idx] -= np.log(self.s[idx])
        return pt.zeros_like(value) + out


def _population(pa: PriorArrays, variant: str, ard_mask: np.ndarray | None = None,
                sum_groups: list[tuple[np.ndarray, np.ndarray]] | None = None
                ) -> pt.TensorVariable:
    """Population log-coefficient per coef, with ARD folded into the same parameter.

    ``z[k] ~ N(0, 1)``;  ``log theta_pop[k] = m[k] + s[k] * z[k] + log relevance[k]`` with
    ``relevance[k] = sigmoid(sharpness * (z[k] - loc))``. Terms the data support sit in the slab
    (relevance ~ 1, log-mean ``m + s z``); terms the data push to zero move into the left tail,
    where relevance falls exponentially (``z = -3``: relevance ~ e^-(sharpness * (3 + loc))).
    One parameter per term, so the ARD scale cannot trade off against the mean: a separate
    relevance parameter (Beta or logistic gate) gave R-hat 1.5-1.7 on the same data.

    ``ard_mask[k] = 0`` switches the gate off for term ``k`` (relevance 1, the plain lognormal
    prior): the estimator does so for the terms that no configuration identifies on their own
    (:attr:`~bayes_latency.data.identifiability.IdentifiabilityReport.confounded_everywhere`).
    Their data give only a sum, so whether one of them is "irrelevant" is the prior's call, and
    the gate's heavy left tail makes every corner of the sum (one term carrying it, the others
    gated off) a mode of the posterior; the gate's kink at ``loc`` (slope ``s`` -> ``s +
    sharpness``) also changes the likelihood's curvature in ``z`` up to 45-fold, a divergence
    source (tiny fleet seed 1: 7 divergences with the gate on every term, 0 with none).

    ``sum_groups`` (``(indices, weights)`` per group of coefficients the data see only as a
    weighted sum) samples ``z_pop`` of each group in the coordinates of
    :class:`SumGroupTransform`; the prior and the gate are unchanged.
    """
    transform = SumGroupTransform(sum_groups, pa.mu_mean, pa.mu_sd) if sum_groups else None
    z = pm.Normal("z_pop", 0.0, 1.0, dims="coef", default_transform=transform)
    base = pa.mu_mean + pa.mu_sd * z
    if variant == "no_ard":
        pm.Deterministic("mu", base, dims="coef")
        return base
    a = pa.ard
    log_rel = -pt.softplus(-a["sharpness"] * (z - a["loc"]))
    if ard_mask is not None:  # terms no configuration identifies on their own: no gate
        log_rel = log_rel * np.asarray(ard_mask, dtype=float)
    pm.Deterministic("relevance", pt.exp(log_rel), dims="coef")
    pm.Deterministic("mu", base + log_rel, dims="coef")
    return base + log_rel


def _partition(design: Design, level: str) -> tuple[int, ...]:
    """How a factor splits the configurations, with levels relabelled by first appearance."""
    first: dict[int, int] = {}
    return tuple(first.setdefault(int(i), len(first)) for i in design.index(level))


def _crossed_effects(factors: dict[str, float], design: Design, pa: PriorArrays,
                     rep: np.ndarray | None = None) -> pt.TensorVariable:
    """Sum over factors of each configuration's crossed effects, ``(config, coef)``.

    Factors that split the configurations identically (e.g. in a fleet where every Mixtral runs
    at TP 2 and every Llama at TP 1, or in a table of two configurations that differ in model,
    GPU and TP at once) act on the data only through the sum of their effects. Sampled one by
    one, that sum is a ridge of products ``sigma_f * z_f`` (a funnel where one scale is small);
    instead such a group is sampled in the direction the data identify and the rest is left to
    the prior, exactly: with ``S = |sigma|`` over the group and ``a = sigma / S``,

        z_joint ~ ZeroSumNormal,  w_j ~ ZeroSumNormal (j = 2..n; prior only),
        (z_1, ..., z_n) = a z_joint + sum_j H[:, j] w_j,

    ``H`` the Householder reflection that maps the first axis to ``-a``; this is an orthogonal
    transform of independent standard normals, so ``z_f`` have their usual prior, and
    ``sum_f sigma_f z_f = S z_joint``: the data see only ``S z_joint``. The variable ``z_<lead>``
    (first factor of the group) holds ``z_joint``, ``z_<other>`` the prior-only ``w``;
    ``eff_<factor>`` are the effects as usual.
    """
    groups: dict[tuple[int, ...], list[str]] = {}
    total = 0.0
    for f in factors:
        if len(design.coords()[f]) <= 1:
            _effect(f, factors[f], f, design, pa.spread[f],  # zero effects, scale from its prior
                    pa.common.get(f), rep)
            continue
        groups.setdefault(_partition(design, f), []).append(f)
    for names in groups.values():
        if len(names) == 1:
            f = names[0]
            total = total + _effect(f, factors[f], f, design, pa.spread[f],
                                    pa.common.get(f), rep)[design.index(f)]
            continue
        sig = pt.stack([_shared(_scale(f, factors[f], pa.spread[f]), rep)
                        for f in names])  # (n, K)
        lead = names[0]
        S = pt.sqrt(pt.sum(sig**2, axis=0))
        a = sig / S[None, :]
        v = pt.set_subtensor(a[0], a[0] + 1.0)  # a + e1, never 0 (a[0] > 0)
        vv = pt.sum(v**2, axis=0)
        z_joint = _shared(pm.ZeroSumNormal(f"z_{lead}", dims=("coef", lead)), rep)  # (K, L)
        ws = [_shared(pm.ZeroSumNormal(f"z_{f}", dims=("coef", lead)), rep) for f in names[1:]]
        lead_idx = design.index(lead)
        for i, f in enumerate(names):
            z_f = a[i][:, None] * z_joint
            for j, w in enumerate(ws, start=1):
                h = (1.0 if i == j else 0.0) - 2.0 * v[i] * v[j] / vv  # H[i, j], (K,)
                z_f = z_f + h[:, None] * w
            # levels of f in the order of the lead's levels it coincides with
            own = design.index(f)
            perm = np.asarray([lead_idx[np.flatnonzero(own == lv)[0]]
                               for lv in range(len(design.coords()[f]))])
            eff_f = (sig[i][:, None] * z_f).T[perm]
            com = _common(f, pa.common.get(f), design)
            if com is not None:  # on the data only through the sum too, but few parameters
                eff_f = eff_f + com[:, None]
                total = total + com[own][:, None]
            pm.Deterministic(f"eff_{f}", eff_f, dims=(f, "coef"))
        total = total + (S[:, None] * z_joint).T[lead_idx]
    return total


#: A factor of :data:`FIXED_SCALE_FACTORS` with fewer levels than this has its effect scales
#: fixed at the prior's scale instead of sampled: two levels give one difference per term, from
#: which a scale cannot be learned, and the non-centred ``sigma * z`` of an effect the data fix is
#: a hyperbolic ridge (a funnel towards small ``sigma``). Fixed, the effects' prior is Gaussian
#: with the prior's variance. Measured on the real data (all of it, 11 default terms, with the
#: common stack shift): stack scales sampled, 247 divergences in one chain, R-hat 1.13, ESS 11;
#: fixed, 0 divergences, R-hat 1.037, ESS 95. Fixing the two-level GPU / model / TP scales too
#: made the tiny fleet worse while the sum-only ridges dominated (seeds 0-5: R-hat up to 1.040,
#: ESS 127-282); with those sampled in their own coordinates (:class:`SumGroupTransform`) the
#: funnels of the two-level scales were what was left (tiny fleet, every factor at two levels,
#: worst variables ``sigma_tp`` / ``sigma_model`` of ``prefill_compute`` and ``decode_kv``: seeds
#: 1 / 3 / 6 / 7 at 1.0121/362, 1.0105/291, 1.0062/79, 1.0327/27 with 4 divergences), and fixing
#: them gave 1.0054/526, 1.0029/411, 1.0053/481 (pass) and 1.0103/116 (``tp_allreduce``, a term
#: of one configuration, left). So every factor's scales are fixed when it has two levels.
MIN_LEVELS_FOR_SCALE = 3
FIXED_SCALE_FACTORS = ("stack", "model", "gpu", "tp")


def _n_levels(name: str) -> int:
    return len(pm.modelcontext(None).coords[name])


def _scale(name: str, scale_prior: float, spread: float | None) -> pt.TensorVariable:
    """Per-term effect scales ``sigma_<name>`` (independent, or pooled with ``spread``; fixed at
    ``scale_prior`` for a factor with fewer than :data:`MIN_LEVELS_FOR_SCALE` levels, recorded
    as a constant ``sigma_<name>``)."""
    if name in FIXED_SCALE_FACTORS and 1 < _n_levels(name) < MIN_LEVELS_FOR_SCALE:
        K = len(pm.modelcontext(None).coords["coef"])
        return pm.Deterministic(f"sigma_{name}", pt.as_tensor_variable(np.full(K, scale_prior)),
                                dims="coef")
    if spread is None:
        return pm.HalfNormal(f"sigma_{name}", sigma=scale_prior, dims="coef")
    tau = pm.HalfNormal(f"tau_{name}", sigma=scale_prior)
    zeta = pm.Normal(f"zeta_{name}", 0.0, 1.0, dims="coef")
    return pm.Deterministic(f"sigma_{name}", tau * pt.exp(spread * zeta), dims="coef")


def _common(name: str, scale_prior: float | None, design: Design) -> pt.TensorVariable | None:
    """Zero-sum effect of a factor common to every coefficient, ``(level,)``, or None.

    With ``hierarchy.<factor>_common`` in the prior file, a factor's effect on the
    log-coefficients is ``c[level] + sigma[k] z[level, k]``: a shift shared by every term (one
    serving stack runs everything ~50% slower) plus per-term departures at the factor's own,
    smaller scale. Without it each term's effect is free on its own, and a factor with few
    levels and data that give only sums of terms lets any one of them carry the whole
    difference. Measured on the real data (11 default terms, all data; the Splitwise harness
    against vLLM, 2 stack levels, ``stack`` halfnormal 1.0): one chain put the Splitwise decode
    difference on ``decode_compute`` (x3), the other on ``per_request`` (x12): two modes, R-hat
    1.85.
    """
    if scale_prior is None or len(design.coords()[name]) <= 1:
        return None
    if name in FIXED_SCALE_FACTORS and len(design.coords()[name]) < MIN_LEVELS_FOR_SCALE:
        sc = pm.Deterministic(f"sigma_{name}_common", pt.as_tensor_variable(float(scale_prior)))
    else:
        sc = pm.HalfNormal(f"sigma_{name}_common", sigma=scale_prior)
    return sc * pm.ZeroSumNormal(f"z_{name}_common", dims=name)


def _sum_shift(mu: pt.TensorVariable, design: Design, sum_groups: list) -> pt.TensorVariable:
    """``(config, coef)`` shifts that make each configuration's group sum depend on the population
    only through the group's typical sum.

    For a group with typical weights ``w`` and a configuration's own weights ``w_c``, the group's
    members in ``c`` are shifted by ``log sum_k w_k e^{mu_k} - log sum_k w_ck e^{mu_k}``: the
    configuration's sum ``sum_k w_ck theta_pop[c, k]`` is then ``S e^{E_c}`` (``S`` the typical sum,
    ``E_c`` the group's shared effects), whatever the population split between the terms, which is
    thereby left to the prior (the data's weak cross-configuration information on it made a
    curved ridge with the shared effects). Zero when ``w_c`` is proportional to ``w``.
    """
    cfgs = list(design.configs.index)
    out = pt.zeros((len(cfgs), len(design.coefs)))
    for g in sum_groups:
        if len(g) < 3 or not g[2] or not all(c in design.coefs for c in g[0]):
            continue
        idx = np.asarray([design.coefs.index(c) for c in g[0]])
        rows = [i for i, c in enumerate(cfgs) if c in g[2]]
        if not rows:
            continue
        lw = np.log(np.asarray(g[1], dtype=float))
        lwc = np.log(np.stack([np.asarray(g[2][cfgs[i]], dtype=float) for i in rows]))  # (R, n)
        mu_g = mu[idx]
        shift = pt.logsumexp(mu_g + lw) - pt.logsumexp(mu_g[None, :] + lwc, axis=1)  # (R,)
        out = pt.set_subtensor(out[np.ix_(rows, idx)], pt.broadcast_to(shift[:, None],
                                                                       (len(rows), len(idx))))
    return out


def _config_common(scale: float | None, design: Design) -> pt.TensorVariable | float:
    """``(config, coef)`` log-shift common to every beta term of a configuration, or 0.

    With ``hierarchy.config_common`` (a halfnormal's ``sigma``) in the prior file, each
    configuration's beta terms move together by ``sigma_config_common * z_config_common[c]``
    beyond the crossed effects, at the scale the prior file gives (fixed, not sampled; a sampled
    scale was not tried). The per-term residual ``sigma_config`` is independent between terms,
    so in a prediction (a sum of terms) it averages out; a configuration that runs faster or
    slower as a whole (an interaction of model, GPU and TP the additive effects miss) needs this
    shift, and an unseen configuration draws it
    (:meth:`~bayes_latency.model.estimator.LatencyModel.coefficients`). Off in the default prior
    file. Measured on the real data's 8 cross-validation splits (``REAL_TERMS``, default sampler
    settings, 90% predictive bands of the held-out rows): without it coverage 0.686 on average
    (codellama-34b run 0.088, the two TP-8 benchmarks 0.25 and 0.25); with sigma 0.3, 0.905
    (0.996, 0.31, 1.0), but the fits converged worse (max R-hat up to 1.092, 1-2 divergences
    in 6 of 8 splits; without: up to 1.039, 3 divergences in 2 splits) and the benchmark splits'
    MdAPE rose (e.g. llama-2-70b A100 TP-2 7.2% -> 48%) while the runs' fell (45.8% -> 16.8%).
    """
    if scale is None or len(design.configs) < MIN_CONFIGS_FOR_RESIDUAL:
        return 0.0
    sc = pm.Deterministic("sigma_config_common", pt.as_tensor_variable(float(scale)))
    z = pm.Normal("z_config_common", 0.0, 1.0, dims="config")
    beta = np.asarray([c in design.beta_terms for c in design.coefs], dtype=float)
    return (sc * z)[:, None] * beta[None, :]


def _shared(x: pt.TensorVariable, rep: np.ndarray | None) -> pt.TensorVariable:
    """``x`` (coefficients on the first axis) with each sum-only group's members reading their
    group's first coefficient (see :func:`build_model`, ``sum_groups``)."""
    return x if rep is None else x[rep]


def _effect(name: str, scale_prior: float, level: str, design: Design,
            spread: float | None = None, common: float | None = None,
            rep: np.ndarray | None = None) -> pt.TensorVariable:
    """Zero-sum effects ``e[level, k] = sigma[k] * z[level, k]`` (zero when there is one level).

    ``sigma[k] ~ HalfNormal(scale_prior)`` independently per term (default), or, with ``spread``
    (the prior file's ``hierarchy.<factor>.spread``), pooled over the terms:
    ``sigma[k] = tau * exp(spread * zeta[k])``, ``tau ~ HalfNormal(scale_prior)``,
    ``zeta[k] ~ N(0, 1)``. A factor with few levels says little about each term's scale on its
    own; pooled, the terms inform one common scale. Measured on the demo fleet (true model-effect
    sd 0.15), leaving each of its 4 models out in turn: pooled scales are learned at 0.07-0.12
    and the held-out models' 90% bands cover 82.3% of their iterations on average
    (llama-2-70b 35%) against 90.5-93.6% with independent scales under the default
    ``HalfNormal(0.25)`` (``benchmarks/leave_one_model_out.py``); so the default prior file
    leaves pooling off.

    Non-centred for every coefficient: centring the effects of well-measured coefficients gave
    106 divergences instead of 1-2 on the demo fleet (few levels per factor make the centred
    form a funnel in ``sigma``).
    """
    sigma = _shared(_scale(name, scale_prior, spread), rep)
    n_levels = len(design.coords()[level])
    if n_levels <= 1:
        return pm.Deterministic(f"eff_{name}", pt.zeros((1, len(design.coefs))), dims=(level, "coef"))
    z = _shared(pm.ZeroSumNormal(f"z_{name}", dims=("coef", level)), rep)
    eff = (sigma[:, None] * z).T
    com = _common(name, common, design)
    if com is not None:
        eff = eff + com[:, None]
    return pm.Deterministic(f"eff_{name}", eff, dims=(level, "coef"))


def build_model(design: Design, priors: object, *, variant: str = "hierarchy",
                summaries: list[ConfigSummary] | None = None, rows: pd.DataFrame | None = None,
                no_gate: tuple[str, ...] = (),
                sum_groups: list[tuple[list[str], np.ndarray, dict[str, np.ndarray]]] | None = None
                ) -> pm.Model:
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
    sum_groups
        ``(coefficient names, typical weights, {config_id: weights})`` of groups the data see
        only as a weighted sum (:func:`bayes_latency.data.identifiability.sum_groups`): their
        population means are sampled in the sum's coordinate (:class:`SumGroupTransform`), their
        factor effects are shared (the first coefficient's) and each configuration's sum follows
        the typical one (:func:`_sum_shift`); see the module docstring.
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
        pm.Data("config_model", design.index("model"), dims="config")
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
            else:
                _row_likelihood(theta, design, rows, pa)
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
            sig_c = pm.Deterministic(
                "sigma_config", pt.where(n_act >= MIN_CONFIGS_FOR_RESIDUAL, raw,
                                         pa.sigma_config["median"]), dims="coef")
        loc = loc + _config_common(pa.common.get("config"), design)
        m = pm.Deterministic("theta_pop", pt.exp(loc), dims=("config", "coef"))
        if rows is None:
            pm.Potential("loglik_marginal",
                         marginal_loglik(m, sig_c, summaries, design, np.exp(pa.mu_mean)))
        else:
            eps = pm.Normal("eps_config", 0.0, 1.0, dims=("config", "coef"))
            theta = pt.maximum(m * (1.0 + sig_c[None, :] * eps), 1e-12)
            _theta_deterministics(theta, design)
            _row_likelihood(theta, design, rows, pa)
    return model


#: Whether members of a sum-only group (:func:`~bayes_latency.data.identifiability.sum_groups`)
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


#: A coefficient with information in fewer configurations than this has its residual scale
#: ``sigma_config`` fixed at the prior median (in the posterior as ``sigma_config``; the free
#: variable ``sigma_config_free`` then holds prior draws for it): one configuration cannot teach
#: how configurations scatter, and with the scale free, the configuration's coefficient pinned
#: by its data made a funnel with the population mean (tiny fleet seed 7, ``tp_allreduce`` and
#: ``moe_layer``, active only on Mixtral: bulk ESS 116 and 324, R-hat 1.0103 and 1.0094).
MIN_CONFIGS_FOR_RESIDUAL = 2


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


#: Largest shift (in prior medians of each coefficient) that a stage-1 gradient at the bound may
#: imply along any direction of the quadratic summary (see :func:`bounded_tilt`).
MAX_TILT_SHIFT = 1.0


def bounded_tilt(grad: np.ndarray, info: np.ndarray, scale: np.ndarray,
                 max_shift: float = MAX_TILT_SHIFT) -> np.ndarray:
    """The stage-1 gradient with its tilt bounded along weakly informed directions.

    At a coefficient held at its bound ``theta = 0`` the gradient ``g`` says the likelihood still
    rises towards negative values. The quadratic summary ``g.d - d'I d/2`` then rises without
    bound along directions with a gradient component ``g_v`` but little curvature ``lambda_v``
    (coefficients the data give only as a sum): its maximum lies ``g_v / lambda_v`` away, and
    integrated against the configuration residual it grows like ``(g_v d)^2 / 2`` as the residual
    scale ``d`` grows. Measured on the real data (default terms): the chains ran to
    ``sigma_config`` of 3.8-6,000 with log densities of 2e5-2e6 and step sizes of 1e-13. The true
    likelihood stops at the bound (theta >= 0), so in the eigenbasis of the information (in
    units of ``scale``, the prior medians) the component is clipped to
    ``|g_v| <= max_shift * lambda_v``: the summary's maximum lies at most ``max_shift`` prior
    medians beyond the bound, and directions without curvature carry no tilt.
    """
    g = np.array(grad, dtype=float)
    act = np.diag(info) > 0
    if not act.any():
        return g
    s = scale[act]
    Is = info[np.ix_(act, act)] * np.outer(s, s)
    lam, V = np.linalg.eigh(0.5 * (Is + Is.T))
    lam = np.maximum(lam, 0.0)
    gv = V.T @ (g[act] * s)
    gv = np.clip(gv, -max_shift * lam, max_shift * lam)
    g[act] = (V @ gv) / s
    return g


def _stacked(summaries: list[ConfigSummary], design: Design, scale: np.ndarray | None = None
             ) -> tuple[np.ndarray, ...]:
    """``(theta_hat, grad, info)`` stacked over the design's configurations; with ``scale`` (prior
    medians) the gradients are bounded by :func:`bounded_tilt`."""
    by_id = {s.config_id: s for s in summaries}
    order = [by_id[c] for c in design.configs.index]
    grad = [s.grad if scale is None else bounded_tilt(s.grad, s.info, scale) for s in order]
    return (np.stack([s.theta_hat for s in order]), np.stack(grad),
            np.stack([s.info for s in order]))


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
    (:mod:`.marginal`).

    The summary arrays enter as data (``pm.Data`` :data:`SUMMARY_DATA`), not constants: models
    of the same structure differ only in their values, so a compiled model is reused for new
    data (:func:`bayes_latency.model.sampler.compiled_model`).
    """
    from bayes_latency.model.marginal import marginal_loglik_op

    arrays = _stacked(summaries, design, scale)
    th, g, info = (pm.Data(name, a) for name, a in zip(SUMMARY_DATA, arrays, strict=True))
    return marginal_loglik_op(m, sig_c, th, g, info)


#: Names of the stage-1 summary arrays ``(theta_hat, grad, info)`` as ``pm.Data`` of the
#: marginal likelihood (:func:`marginal_loglik`).
SUMMARY_DATA = ("summary_theta_hat", "summary_grad", "summary_info")


def truncated_normal_positive(mean: np.ndarray, sd: np.ndarray,
                               rng: np.random.Generator) -> np.ndarray:
    """Draws of ``N(mean, sd^2)`` restricted to ``x >= 0``, elementwise, by inversion in log space.

    ``x = mean + sd * z`` with ``z`` above ``a = -mean / sd``: ``z = -Phi^-1(v * Phi(-a))``,
    ``v ~ U(0, 1)``, computed as ``-ndtri_exp(log v + log_ndtr(-a))`` so that deep tails (``a`` in
    the hundreds) neither underflow nor lose the bound. Vectorised: one call per Gibbs coordinate
    instead of ``scipy.stats.truncnorm.rvs`` (which took 2-8 s of a demo fit).
    """
    a = -mean / sd
    v = rng.uniform(size=np.shape(mean))
    z = -special.ndtri_exp(np.log(v) + special.log_ndtr(-a))
    return np.maximum(mean + sd * np.maximum(z, a), 0.0)


def config_draws(theta_pop: np.ndarray, sigma_config: np.ndarray,
                 summaries: list[ConfigSummary], design: Design,
                 rng: np.random.Generator, sweeps: int = 30,
                 scale: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """Draws of every configuration's coefficients given the population draws, ``theta >= 0``.

    The conditional of ``theta_c`` given the population and the data is ``N(theta*, P^-1)`` with
    ``P = I + D^-1`` (see :func:`marginal_loglik`), restricted to ``theta >= 0`` (coefficients are
    physical rates). A draw from the Gaussian that is already non-negative is kept (exact);
    otherwise it is replaced by a coordinate-wise Gibbs chain on the truncated Gaussian started
    at the clipped draw. Clipping alone breaks the sums that collinear coefficients are measured
    by (measured on the real data: in-sample error 370% clipped vs 1.3% truncated).

    Parameters
    ----------
    theta_pop
        ``(S, C, K)`` population-implied means ``m``.
    sigma_config
        ``(S, K)``.

    Returns
    -------
    theta : np.ndarray
        ``(S, C, K)`` non-negative draws.
    n_truncated : int
        Number of (draw, configuration) pairs that needed the truncated sampler.
    """
    theta_hat, grad, info = _stacked(summaries, design, scale)
    S, C, K = theta_pop.shape
    out = np.empty_like(theta_pop)
    eye = np.eye(K)
    n_trunc = 0
    for c in range(C):
        m = theta_pop[:, c, :]
        d = np.maximum(m * sigma_config, 1e-300)
        r = (theta_hat[c][None, :] - m) @ info[c].T + grad[c][None, :]
        A = d[:, :, None] * info[c][None] * d[:, None, :] + eye[None]
        L = np.linalg.cholesky(A)
        y = np.linalg.solve(A, (d * r)[:, :, None])[:, :, 0]
        mean = m + d * y
        eps = np.linalg.solve(np.swapaxes(L, 1, 2), rng.standard_normal((S, K, 1)))[:, :, 0]
        th = mean + d * eps
        bad = (th < 0).any(axis=1)
        if bad.any():
            n_trunc += int(bad.sum())
            idx = np.flatnonzero(bad)
            P = info[c][None] + np.einsum("sk,kl->skl", 1.0 / d[idx] ** 2, eye)
            mu_b, x = mean[idx], np.maximum(th[idx], 0.0)
            for _ in range(sweeps):
                for k in range(K):
                    pkk = P[:, k, k]
                    resid = x - mu_b
                    resid[:, k] = 0.0
                    cm = mu_b[:, k] - np.einsum("sj,sj->s", P[:, k, :], resid) / pkk
                    x[:, k] = truncated_normal_positive(cm, 1.0 / np.sqrt(pkk), rng)
            th[idx] = x
        out[:, c, :] = th
    return out, n_trunc


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
    # dof per (configuration, kind), as stage 1 of the fast path estimates it: the two paths are
    # then the same model (a dof shared per kind left the fast path's beta means up to 0.12
    # posterior sd from this path's)
    nu = pm.Gamma("noise_nu", alpha=pa.nu_alpha, beta=pa.nu_beta, dims=("config", "kind"))
    s_sig = sigma[cfg_idx, kind_idx]
    s_tau = tau[cfg_idx, kind_idx] * win[kind_idx]
    scale = pt.sqrt(s_sig**2 / n + s_tau**2 / n**2)
    mu = pt.sum(theta[cfg_idx] * X, axis=1)
    off = 0.5 * s_sig**2 * (1.0 - 1.0 / n)  # multi-step rows: likelihood.sum_log_offset
    pm.StudentT("obs_log_value", nu=nu[cfg_idx, kind_idx], mu=pt.log(mu) + off, sigma=scale,
                observed=np.log(rows["value_us"].to_numpy(dtype=float)), dims="obs")
