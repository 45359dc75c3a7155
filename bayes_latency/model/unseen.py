"""Coefficient draws of a configuration the fit did not see, from the population.

:func:`~bayes_latency.model.predict.coefficient_draws` uses the fitted configuration's draws
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
from bayes_latency.model.design import level_dim


def unseen_config_theta(post: xr.Dataset, pa: Any, model: str, gpu: str, tp: int, stack: str,
                        rng: np.random.Generator, *, design: Any, variant: str
                        ) -> tuple[np.ndarray, list[str]]:
    """``(sample, coef)`` coefficient draws of an unseen configuration and its unseen levels.

    ``post`` is the posterior with the fixed quantities
    (:func:`~bayes_latency.model.persistence.posterior_with_fixed`) stacked over ``sample``; ``pa`` the prior arrays of ``gpu``
    (:func:`~bayes_latency.model.hierarchy.prior_arrays`); ``design`` the fit's
    :class:`~bayes_latency.model.design.Design` and ``variant`` its model variant.
    """
    S = post.sizes["sample"]
    K = len(design.coefs)
    unseen: list[str] = []
    logt = post["mu"].values.T + pa.gpu_offset[0][None, :]
    if variant != "complete_pooling":
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
            else:
                unseen.append(level)
                # the fitted effects sum to zero over the n seen levels, so the
                # population mean carries their average: a new level lies
                # N(0, sigma^2 (1 + 1/n)) from it, not N(0, sigma^2)
                inflate = np.sqrt(1.0 + 1.0 / eff.sizes[dim])
                # members of a sum-only group share their group's effect (hierarchy)
                rep = _shared_effects(eff.transpose(dim, "coef", "sample").values)
                sig = post[f"sigma_{level}"].values.T[:, rep] * inflate  # (S, K)
                # terms without this factor's effect (hierarchy.<level>.without): none drawn
                keep = pa.factor_keep(level)[None, :]
                logt = logt + sig * rng.standard_normal((S, K))[:, rep] * keep
                if f"sigma_{level}_common" in post:  # plus the shift common to all terms
                    sc_c = post[f"sigma_{level}_common"].values.ravel() * inflate
                    logt = logt + (sc_c * rng.standard_normal(S))[:, None] * keep
    unseen.append("config")
    if "sigma_config_common" in post:  # the shift common to a configuration's beta terms
        beta = np.asarray([c in design.beta_terms for c in design.coefs], dtype=float)
        sc_cc = post["sigma_config_common"].values.ravel()
        logt = logt + (sc_cc * rng.standard_normal(S))[:, None] * beta[None, :]
    sc = post["sigma_config"].values.T
    theta = np.maximum(np.exp(logt) * (1.0 + sc * rng.standard_normal((S, K))), 0.0)
    return theta, unseen


def _shared_effects(eff: np.ndarray) -> np.ndarray:
    """For effects ``(level, coef, sample)``, each coefficient's first coefficient with the very
    same non-zero effects (the members of a sum-only group read their group's; see
    :func:`bayes_latency.model.hierarchy.build_model`), else itself."""
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
