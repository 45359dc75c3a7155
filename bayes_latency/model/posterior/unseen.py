"""Coefficient draws of a configuration the fit did not see, from the population.

:func:`~bayes_latency.model.posterior.predict.coefficient_draws` uses the fitted configuration's draws
when it has them; :func:`unseen_config_theta` draws the others: the population mean, the
fitted effects of the levels (model, GPU, TP degree, serving stack) the fit saw, and for each
unseen level an effect drawn from its population, ``N(0, sigma_level^2 (1 + 1/n))``. In a fit
with kernel evidence (:mod:`bayes_latency.model.definition.kernels`) an unseen GPU that the
kernel tables hold is drawn from that population conditioned on its kernels, and a
configuration of a stack other than the tables' adds its GPU x stack interaction.

Importing this module is light (no PyMC or PyTensor).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

from bayes_latency.errors import ConfigError
from bayes_latency.model.definition.design import level_dim


def unseen_config_theta(post: xr.Dataset, pa: Any, model: str, gpu: str, tp: int, stack: str,
                        rng: np.random.Generator, *, design: Any, variant: str
                        ) -> tuple[np.ndarray, list[str]]:
    """``(sample, coef)`` coefficient draws of an unseen configuration and its unseen levels.

    ``post`` is the posterior with the fixed quantities
    (:func:`~bayes_latency.model.posterior.persistence.posterior_with_fixed`) stacked over ``sample``; ``pa`` the prior arrays of ``gpu``
    (:func:`~bayes_latency.model.definition.hierarchy.prior_arrays`); ``design`` the fit's
    :class:`~bayes_latency.model.definition.design.Design` and ``variant`` its model variant. The draws are
    ``theta = exp(log m) (1 + sigma_config eps)`` with ``log m`` of :func:`config_log_location`
    (plus the shift common to a configuration's beta terms when the fit has one).
    """
    S = post.sizes["sample"]
    K = len(design.coefs)
    logt, unseen = config_log_location(post, pa, model, gpu, tp, stack, rng, design=design,
                                       variant=variant)
    unseen.append("config")
    logt = logt + config_common_draws(post, design, rng)
    sc = post["sigma_config"].values.T
    theta = np.maximum(np.exp(logt) * (1.0 + sc * rng.standard_normal((S, K))), 0.0)
    return theta, unseen


def config_common_draws(post: xr.Dataset, design: Any, rng: np.random.Generator) -> np.ndarray:
    """``(sample, coef)`` draws of the log-shift common to a configuration's beta terms
    (``sigma_config_common * z``; zeros when the fit has none)."""
    S, K = post.sizes["sample"], len(design.coefs)
    if "sigma_config_common" not in post:
        return np.zeros((S, K))
    beta = np.asarray([c in design.beta_terms for c in design.coefs], dtype=float)
    sc_cc = post["sigma_config_common"].values.ravel()
    return (sc_cc * rng.standard_normal(S))[:, None] * beta[None, :]


def config_log_location(post: xr.Dataset, pa: Any, model: str, gpu: str, tp: int, stack: str,
                        rng: np.random.Generator, *, design: Any, variant: str,
                        shared: dict[tuple[str, Any], np.ndarray] | None = None
                        ) -> tuple[np.ndarray, list[str]]:
    """``(sample, coef)`` draws of a configuration's population log-location ``log m`` and the
    names of its levels the fit did not see.

    ``log m = mu + prior_offset[gpu] + sum over factors of the level's effect``: a seen level's
    fitted effect, an unseen level's drawn from its population, ``N(0, sigma_level^2 (1 + 1/n))``
    (plus the factor's common shift when the fit has one). ``shared``, a dict the caller keeps,
    holds each unseen level's drawn effects by ``(factor, level)``: configurations drawn with the
    same dict share an unseen level's effect at every draw (two configurations of one new model
    move together), as they do in the hierarchy. ``pa`` holds the prior offset of ``gpu`` in its
    first row.
    """
    S = post.sizes["sample"]
    K = len(design.coefs)
    unseen: list[str] = []
    shared = {} if shared is None else shared
    logt = post["mu"].values.T + pa.gpu_offset[0][None, :]
    if variant == "complete_pooling":
        return logt, unseen
    levels = [("model", model), ("gpu", gpu), ("tp", int(tp))]
    if "eff_stack" in post:
        levels.append(("stack", stack))
    elif stack not in design.stacks:
        raise ConfigError(f"stack {stack!r}: the fit saw only {design.stacks}")
    for level, value in levels:
        eff = post[f"eff_{level}"]
        dim = level_dim(level)  # the LLM's levels are on llm
        if value in list(eff[dim].values):
            logt = logt + eff.sel({dim: value}).values.T
            continue
        unseen.append(level)
        key = (level, value)
        if key not in shared:
            # the fitted effects sum to zero over the n seen levels, so the population mean
            # carries their average: a new level lies N(0, sigma^2 (1 + 1/n)) from it
            inflate = np.sqrt(1.0 + 1.0 / eff.sizes[dim])
            # members of a sum-only group share their group's effect (hierarchy)
            rep = _shared_effects(eff.transpose(dim, "coef", "sample").values)
            sig = post[f"sigma_{level}"].values.T[:, rep] * inflate  # (S, K)
            # terms without this factor's effect (hierarchy.<level>.without): none drawn
            keep = pa.factor_keep(level)[None, :]
            z = rng.standard_normal((S, K))
            common = np.zeros((S, 1))
            if f"sigma_{level}_common" in post:  # plus the shift common to all terms
                sc_c = post[f"sigma_{level}_common"].values.ravel() * inflate
                common = (sc_c * rng.standard_normal(S))[:, None]
            if level == "gpu":
                draw = _kernel_conditioned(post, design, value, sig, z, rep, common)
            else:
                draw = sig * z[:, rep]
            shared[key] = (draw + common) * keep
        logt = logt + shared[key]
    return logt + _gpu_stack_effect(post, design, gpu, stack, rng, pa, shared), unseen


def _kernel_row(post: xr.Dataset, gpu: str) -> int | None:
    """The row of ``gpu`` in the fit's kernel tables (``kernel_gpu``, aliases resolved), or
    None when the fit has no kernel measurement of it."""
    from bayes_latency.data.kernel_evidence import gpu_row

    if "kernel_log_time" not in post or "kernel_offset" not in post:
        return None
    return gpu_row([str(g) for g in post["kernel_gpu"].values], gpu)


def kernel_terms_of(post: xr.Dataset, gpu: str) -> list[str]:
    """The terms on which an unseen ``gpu``'s effect is conditioned on its kernels (the fit's
    kernel tables hold it, :func:`_kernel_conditioned`); empty otherwise."""
    if _kernel_row(post, gpu) is None:
        return []
    return [str(t) for t in post["kernel_term"].values]


def _kernel_conditioned(post: xr.Dataset, design: Any, gpu: str, sig: np.ndarray, z: np.ndarray,
                        rep: np.ndarray, common: np.ndarray) -> np.ndarray:
    """``(sample, coef)`` per-term effects of an unseen GPU: ``sig * z`` (its population), or,
    for the terms whose kernels the fit's tables measured on this GPU
    (:mod:`bayes_latency.model.definition.kernels`), the population conditioned on them per draw:
    with prior variance ``v = sig^2``, the measurement ``r = log_time - kernel_offset - common``
    of sd ``s`` (``kernel_sigma``; several terms of one sum-only group average theirs),

        effect | r ~ N(v / (v + s^2) r, v s^2 / (v + s^2)).

    The GPU's common shift (when the fit has one) is drawn from its population first."""
    draw = sig * z[:, rep]
    row = _kernel_row(post, gpu)
    if row is None:
        return draw
    y = post["kernel_log_time"].isel(kernel_gpu=row).transpose("kernel_term", ...).values
    off = post["kernel_offset"].transpose("kernel_term", ...).values
    s2 = float(np.ravel(post["kernel_sigma"].values)[0]) ** 2
    r = (y - off).reshape(len(off), -1).T - common  # (S, T)
    coefs = list(design.coefs)
    terms = [str(t) for t in post["kernel_term"].values]
    for j in sorted({int(rep[coefs.index(t)]) for t in terms if t in coefs}):
        cols = [i for i, t in enumerate(terms) if t in coefs and rep[coefs.index(t)] == j]
        obs, s2j = r[:, cols].mean(axis=1), s2 / len(cols)
        v = sig[:, j] ** 2
        mean = v / (v + s2j) * obs
        sd = np.sqrt(v * s2j / (v + s2j))
        col = mean + sd * z[:, j]
        draw[:, rep == j] = col[:, None]
    return draw


def _gpu_stack_effect(post: xr.Dataset, design: Any, gpu: str, stack: str,
                      rng: np.random.Generator, pa: Any,
                      shared: dict[tuple[str, Any], np.ndarray]) -> np.ndarray | float:
    """``(sample, coef)`` GPU x stack interaction of a configuration of a stack other than
    the kernel tables' (:mod:`bayes_latency.model.definition.kernels`): the fitted one of a seen
    GPU, a draw from its population (``N(0, sigma_gpu_stack^2 (1 + 1/n))``) for an unseen one;
    0.0 for the tables' stack or a fit without it."""
    if "eff_gpu_stack" not in post or "kernel_stack" not in post:
        return 0.0
    ks = post["kernel_stack"]
    if stack in [str(v) for v in ks["stack"].values] and float(
            np.ravel(ks.sel(stack=stack).values)[0]) == 1.0:
        return 0.0
    eff = post["eff_gpu_stack"].transpose("gpu", "coef", "sample")
    if gpu in [str(g) for g in eff["gpu"].values]:
        return eff.sel(gpu=gpu).values.T
    key = ("gpu_stack", gpu)
    if key not in shared:
        S, K = post.sizes["sample"], len(design.coefs)
        rep = _shared_effects(eff.values)
        sig = post["sigma_gpu_stack"].transpose("coef", "sample").values.T[:, rep]
        inflate = np.sqrt(1.0 + 1.0 / eff.sizes["gpu"])
        shared[key] = sig * inflate * rng.standard_normal((S, K))[:, rep] \
            * pa.factor_keep("gpu")[None, :]
    return shared[key]


def _shared_effects(eff: np.ndarray) -> np.ndarray:
    """For effects ``(level, coef, sample)``, each coefficient's first coefficient with the very
    same non-zero effects (the members of a sum-only group read their group's; see
    :func:`bayes_latency.model.definition.hierarchy.build_model`), else itself."""
    K = eff.shape[1]
    rep = np.arange(K)
    for k in range(1, K):
        if not np.any(eff[:, k]):
            continue
        for j in range(k):
            if rep[j] == j and np.array_equal(eff[:, j], eff[:, k]):
                rep[k] = j
                break
    return rep
