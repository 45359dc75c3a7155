"""Coefficient draws of a configuration the fit did not see, from the population.

:func:`~bayes_latency.model.posterior.predict.coefficient_draws` uses the fitted configuration's draws
when it has them; :func:`unseen_config_theta` draws the others: the population mean, the
fitted effects of the levels (model, GPU, TP degree, serving stack) the fit saw, and for each
unseen level an effect drawn from its population, ``N(0, sigma_level^2 (1 + 1/n))``.

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
            draw = sig * rng.standard_normal((S, K))[:, rep] * keep
            if f"sigma_{level}_common" in post:  # plus the shift common to all terms
                sc_c = post[f"sigma_{level}_common"].values.ravel() * inflate
                draw = draw + (sc_c * rng.standard_normal(S))[:, None] * keep
            shared[key] = draw
        logt = logt + shared[key]
    return logt, unseen


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
