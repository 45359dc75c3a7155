"""Prior sensitivity of a posterior: which coefficients the priors dominate and which the data do.

:func:`prior_sensitivity` power-scales the coefficient priors (:data:`COEFFICIENT_PRIORS`) and
the likelihood with :func:`arviz_stats.psense_summary` and gives a verdict per coefficient against
:data:`SENSITIVITY_THRESHOLD`. Informative, never a gate: ``bayes-latency check`` reports it next
to the identifiability analysis (:class:`~bayes_latency.checks.diagnostics.DiagnosticsReport`).
"""

from __future__ import annotations

import warnings

import pandas as pd
import xarray as xr

from bayes_latency.checks.datatree import CELL_VARIABLES, _group

#: Power-scaling sensitivity above which prior or likelihood "matters" (Kallioinen et al. 2024,
#: the default of :func:`arviz_stats.psense_summary`).
SENSITIVITY_THRESHOLD = 0.05


#: Log-prior variables power-scaled by :func:`prior_sensitivity`: the coefficient priors of
#: ``priors/*.yaml`` (roofline medians and ARD, both in ``z_pop``). Power-scaling every prior of a
#: hierarchy (the standardised effects too) moves every coefficient and says little about the
#: priors a user sets; the priorsense authors advise scaling the top-level priors.
COEFFICIENT_PRIORS = ("z_pop", "z_config")


def _verdict(prior: float, lik: float, thr: float) -> str:
    if prior >= thr and lik >= thr:
        return "prior-data conflict"
    if prior >= thr:
        return "prior-dominated"
    if lik >= thr:
        return "data-dominated"
    return "insensitive"


def prior_sensitivity(result: xr.DataTree, var_name: str = "mu",
                      threshold: float = SENSITIVITY_THRESHOLD) -> pd.DataFrame | None:
    """Which coefficients the priors dominate and which the data do (power-scaling).

    Calls :func:`arviz_stats.psense_summary` on the population log-coefficient ``var_name``
    (one value per coefficient; the configurations' ``beta`` / ``alpha`` inherit it) and adds
    the power-scaling sensitivity of ``beta`` / ``alpha`` (largest over configurations). The
    prior power-scaled is that of the coefficients (:data:`COEFFICIENT_PRIORS`: roofline prior
    medians and ARD), the likelihood that of every row in ``log_likelihood``.

    Returns
    -------
    DataFrame or None
        Index ``coef``; columns ``prior``, ``likelihood`` (sensitivities of ``var_name``),
        ``config_prior_max``, ``config_likelihood_max`` and ``verdict`` (``prior-dominated``,
        ``data-dominated``, ``prior-data conflict`` or ``insensitive``). None when the result
        has no ``log_prior`` / ``log_likelihood`` group or no ``var_name``.
    """
    post = _group(result, "posterior")
    if (post is None or var_name not in post or _group(result, "log_prior") is None
            or _group(result, "log_likelihood") is None):
        return None
    import logging

    import arviz_stats as azs

    lp = _group(result, "log_prior")
    prior_vars = [v for v in COEFFICIENT_PRIORS if v in lp.data_vars] or None

    log = logging.getLogger("arviz_stats.psense")
    level = log.level
    log.setLevel(logging.ERROR)  # its "potential issues" warning is what this table reports
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tab = azs.psense_summary(result, var_names=[var_name], threshold=threshold,
                                     prior_var_names=prior_vars, round_to=6)
            cells = {}
            for v in CELL_VARIABLES:
                if v in post:
                    cells[v] = {g: azs.psense(result, var_names=[v], group=g,
                                              group_var_names=prior_vars if g == "prior" else None)[v]
                                for g in ("prior", "likelihood")}
    finally:
        log.setLevel(level)
    coefs = [str(c) for c in post[var_name]["coef"].values] if "coef" in post[var_name].dims \
        else [str(i) for i in range(len(tab))]
    out = pd.DataFrame({"coef": coefs,
                        "prior": tab["prior"].to_numpy(dtype=float),
                        "likelihood": tab["likelihood"].to_numpy(dtype=float)}).set_index("coef")
    for by in cells.values():
        tdim = next(d for d in by["prior"].dims if d != "config")
        for g, col in (("prior", "config_prior_max"), ("likelihood", "config_likelihood_max")):
            mx = by[g].max("config") if "config" in by[g].dims else by[g]
            for t, val in zip(mx[tdim].values, mx.values, strict=True):
                out.loc[str(t), col] = float(val)
    out["verdict"] = [_verdict(p, q, threshold) for p, q in zip(out["prior"], out["likelihood"],
                                                                  strict=True)]
    return out
