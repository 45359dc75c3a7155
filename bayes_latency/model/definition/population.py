"""The population level of the hierarchy: population means with the ARD gate, and the crossed
factor effects (model, GPU, TP, serving stack) around them.

Sum-only groups are sampled in their sum's coordinates (:class:`SumGroupTransform`), factors that
split the configurations alike share one joint effect (:func:`_crossed_effects`), two-level
factors have fixed scales (:data:`MIN_LEVELS_FOR_SCALE`); the reasons and measurements are in
the docstrings here and in :mod:`bayes_latency.model.definition.hierarchy`, which assembles the model.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor.tensor as pt
from pymc.logprob.transforms import Transform
from scipy import special

from bayes_latency.model.definition.design import (
    MIN_CONFIGS_FOR_RESIDUAL,
    Design,
    PriorArrays,
    level_dim,
)


def _fixed(name: str, value: object, dims: str | tuple[str, ...] | None = None
           ) -> pt.TensorVariable:
    """A quantity of the model that is the same at every draw (a fixed scale, the zero effects of
    a one-level factor): recorded as ``pm.Data`` tagged ``fixed_quantity``, which is not a
    posterior variable (constant draws give NaN R-hat) but the fit's ``constant_data``
    (:func:`fixed_quantities`); returned as a constant, which the graph uses.

    A constant, not the shared ``pm.Data``, in the log density: PyTensor folds it into the
    expressions around it (``sigma_gpu[gpu]`` of a fixed GPU scale becomes a constant matrix),
    so the logp+gradient graph the sampler compiles has no indexing or broadcasting nodes for
    it. Demo fit: 176 nodes with the shared variable, 172 with the constant; compile times in
    ``CHANGELOG.md``.
    """
    arr = np.asarray(value, dtype=float)
    var = pm.Data(name, arr, dims=dims)
    var.tag.fixed_quantity = True
    return pt.constant(arr, name=name)


#: Elements of a posterior variable that are the same at every draw (the relevance 1 of a term
#: without ARD gate, the zero effect of a factor on the terms of ``hierarchy.<factor>.without``,
#: the fixed residual scale ``sigma_config`` of a coefficient with data in fewer than two
#: configurations) are NaN in the posterior: a constant element has no R-hat (ArviZ warns on
#: it), and NaN says "not sampled" where a number would pass for a draw. The values are those of
#: :data:`~bayes_latency.model.definition.design.FIXED_FILL`, :func:`~bayes_latency.model.definition.design.filled`
#: puts them back.
NAN_FIXED = np.nan


def _effect_deterministic(name: str, eff: pt.TensorVariable, factor: str,
                          keep: np.ndarray | None) -> None:
    """Record ``eff_<name> (level, coef)``: NaN (:data:`NAN_FIXED`) on the terms without the
    factor's effect (``keep == 0``, prior file ``hierarchy.<factor>.without``), zero at every
    draw."""
    if keep is not None and not np.all(keep == 1.0):
        eff = pt.where(np.asarray(keep, dtype=bool)[None, :], eff, NAN_FIXED)
    pm.Deterministic(f"eff_{name}", eff, dims=(level_dim(factor), "coef"))


def fixed_quantities(model: pm.Model) -> dict[str, tuple[tuple[str, ...], np.ndarray]]:
    """``{name: (dims, value)}`` of the fixed quantities of ``model`` (:func:`_fixed`)."""
    out = {}
    for v in model.data_vars:
        if getattr(v.tag, "fixed_quantity", False):
            out[v.name] = (tuple(model.named_vars_to_dims.get(v.name) or ()),
                           np.asarray(v.get_value()))
    return out


class SumGroupTransform(Transform):
    """Sample ``z_pop`` of each sum-only group in the direction its data identify.

    For a group ``G`` of ``n`` coefficients that every configuration sees (nearly) only through
    ``S = sum_k w_k exp(mu_k)`` (``mu_k = m_k + s_k z_k``, the population log-mean without the
    ARD gate; ``w_k`` typical feature ratios, :func:`~bayes_latency.model.definition.identifiability.sum_groups`),
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
    prior; its ``relevance`` is NaN in the posterior, :data:`NAN_FIXED`): the estimator does so for the terms that no configuration identifies on their own
    (:attr:`~bayes_latency.model.definition.identifiability.IdentifiabilityReport.confounded_everywhere`).
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
    rel = pt.exp(log_rel)
    if ard_mask is not None:  # not gated: relevance 1 at every draw, NaN_FIXED in the posterior
        rel = pt.where(np.asarray(ard_mask, dtype=bool), rel, np.nan)
    pm.Deterministic("relevance", rel, dims="coef")
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
    (first factor of the group) holds ``z_joint`` on the lead's level dimension (its levels
    stand for the group's common partition of the configurations), ``z_<other>`` the prior-only
    ``w`` on that factor's own level dimension (``z_tp (coef, tp)``; taken into the lead's level
    order inside the model, which leaves a zero-sum normal's prior unchanged); ``eff_<factor>``
    are the effects as usual, each on its factor's level dimension.
    """
    groups: dict[tuple[int, ...], list[str]] = {}
    total = 0.0
    for f in factors:
        if len(design.levels(f)) <= 1:
            _effect(f, factors[f], f, design, pa.spread[f],  # zero effects, scale from its prior
                    pa.common.get(f), rep, pa.factor_keep(f))
            continue
        groups.setdefault(_partition(design, f), []).append(f)
    for names in groups.values():
        if len(names) == 1:
            f = names[0]
            total = total + _effect(f, factors[f], f, design, pa.spread[f],
                                    pa.common.get(f), rep, pa.factor_keep(f))[design.index(f)]
            continue
        keeps = [pa.factor_keep(f) for f in names]
        sig = pt.stack([_shared(_scale(f, factors[f], pa.spread[f]), rep) * kp
                        for f, kp in zip(names, keeps, strict=True)])  # (n, K)
        lead = names[0]
        S = pt.sqrt(pt.sum(sig**2, axis=0))
        # a term without every factor of the group (hierarchy.<f>.without): S = 0, no effect
        S_div = pt.switch(S > 0, S, 1.0)
        a = pt.set_subtensor(sig[0], pt.switch(S > 0, sig[0], 1.0)) / S_div[None, :]
        v = pt.set_subtensor(a[0], a[0] + 1.0)  # a + e1, never 0 (a[0] > 0)
        vv = pt.sum(v**2, axis=0)
        lead_idx = design.index(lead)
        # per factor, the lead's level of each of its own levels (they coincide)
        perms = {f: np.asarray([lead_idx[np.flatnonzero(design.index(f) == lv)[0]]
                                for lv in range(len(design.levels(f)))]) for f in names}
        z_joint = _shared(pm.ZeroSumNormal(f"z_{lead}", dims=("coef", level_dim(lead))),
                          rep)  # (K, L)
        ws = [_shared(pm.ZeroSumNormal(f"z_{f}", dims=("coef", level_dim(f))),
                      rep)[:, np.argsort(perms[f])] for f in names[1:]]  # in the lead's order
        for i, f in enumerate(names):
            z_f = a[i][:, None] * z_joint
            for j, w in enumerate(ws, start=1):
                h = (1.0 if i == j else 0.0) - 2.0 * v[i] * v[j] / vv  # H[i, j], (K,)
                z_f = z_f + h[:, None] * w
            # levels of f in the order of the lead's levels it coincides with
            own = design.index(f)
            perm = perms[f]
            eff_f = (sig[i][:, None] * z_f).T[perm]
            com = _common(f, pa.common.get(f), design)
            if com is not None:  # on the data only through the sum too, but few parameters
                eff_f = eff_f + com[:, None] * keeps[i][None, :]
                total = total + com[own][:, None] * keeps[i][None, :]
            _effect_deterministic(f, eff_f, f, keeps[i])
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
    return len(pm.modelcontext(None).coords[level_dim(name)])


def _scale(name: str, scale_prior: float, spread: float | None) -> pt.TensorVariable:
    """Per-term effect scales ``sigma_<name>`` (independent, or pooled with ``spread``; fixed at
    ``scale_prior`` for a factor with fewer than :data:`MIN_LEVELS_FOR_SCALE` levels, recorded
    as the fixed quantity ``sigma_<name>``, :func:`_fixed`)."""
    if name in FIXED_SCALE_FACTORS and 1 < _n_levels(name) < MIN_LEVELS_FOR_SCALE:
        K = len(pm.modelcontext(None).coords["coef"])
        return _fixed(f"sigma_{name}", np.full(K, scale_prior), dims="coef")
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
    if scale_prior is None or len(design.levels(name)) <= 1:
        return None
    if name in FIXED_SCALE_FACTORS and len(design.levels(name)) < MIN_LEVELS_FOR_SCALE:
        sc = _fixed(f"sigma_{name}_common", float(scale_prior))
    else:
        sc = pm.HalfNormal(f"sigma_{name}_common", sigma=scale_prior)
    return sc * pm.ZeroSumNormal(f"z_{name}_common", dims=level_dim(name))


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
    sc = _fixed("sigma_config_common", float(scale))
    z = pm.Normal("z_config_common", 0.0, 1.0, dims="config")
    beta = np.asarray([c in design.beta_terms for c in design.coefs], dtype=float)
    return (sc * z)[:, None] * beta[None, :]


def _shared(x: pt.TensorVariable, rep: np.ndarray | None) -> pt.TensorVariable:
    """``x`` (coefficients on the first axis) with each sum-only group's members reading their
    group's first coefficient (see :func:`build_model`, ``sum_groups``)."""
    return x if rep is None else x[rep]


def _effect(name: str, scale_prior: float, level: str, design: Design,
            spread: float | None = None, common: float | None = None,
            rep: np.ndarray | None = None, keep: np.ndarray | None = None) -> pt.TensorVariable:
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

    ``keep`` (:meth:`PriorArrays.factor_keep`): the terms of the prior file's
    ``hierarchy.<factor>.without`` get no effect of this factor (their ``sigma`` and ``z``
    entries are then prior draws).

    Non-centred for every coefficient: centring the effects of well-measured coefficients gave
    106 divergences instead of 1-2 on the demo fleet (few levels per factor make the centred
    form a funnel in ``sigma``).
    """
    sigma = _shared(_scale(name, scale_prior, spread), rep)
    n_levels = len(design.levels(level))
    dim = level_dim(level)
    if n_levels <= 1:
        return _fixed(f"eff_{name}", np.zeros((1, len(design.coefs))), dims=(dim, "coef"))
    z = _shared(pm.ZeroSumNormal(f"z_{name}", dims=("coef", dim)), rep)
    eff = (sigma[:, None] * z).T
    com = _common(name, common, design)
    if com is not None:
        eff = eff + com[:, None]
    if keep is not None and not np.all(keep == 1.0):  # hierarchy.<factor>.without
        eff = eff * keep[None, :]
    _effect_deterministic(name, eff, level, keep)
    return eff
