"""Convergence gates of a fit: R-hat, bulk ESS and divergences, and hints when they fail.

:data:`GATES` holds the default thresholds; :func:`convergence` measures a fitted
:class:`~bayes_latency.model.estimator.LatencyModel` against them (the public entry point is
:meth:`LatencyModel.convergence <bayes_latency.model.estimator.LatencyModel.convergence>`) and
:func:`_convergence_hints` says what to do about failing ones.

Importing this module is light (ArviZ is imported when a fit is checked).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import xarray as xr

if TYPE_CHECKING:  # pragma: no cover
    from bayes_latency.model.estimator import LatencyModel

#: Convergence gates applied by :meth:`LatencyModel.convergence`.
GATES = {"max_rhat": 1.01, "min_ess_bulk": 400.0, "max_divergences": 0}


def convergence(est: LatencyModel, gates: dict | None = None) -> dict:
    """Max R-hat, min bulk ESS, divergences and whether they pass ``gates`` (:data:`GATES`)."""
    import arviz_stats as azs

    gates = {**GATES, **(gates or {})}
    post = est._post()
    var_names = [v for v in ("beta", "alpha", "mu", "relevance", "sigma_model", "sigma_gpu",
                             "sigma_tp") if v in post]
    # constants (effect scales fixed for factors with two levels) have no diagnostics
    var_names = [v for v in var_names if float(post[v].std()) > 0]
    rhat = azs.rhat(post[var_names])
    ess = azs.ess(post[var_names], method="bulk")
    max_rhat = float(max(float(rhat[v].max()) for v in var_names))
    min_ess = float(min(float(ess[v].min()) for v in var_names))
    div = 0
    if "sample_stats" in est.result and "diverging" in est.result["sample_stats"]:
        div = int(est.result["sample_stats"]["diverging"].values.sum())
    approx = est.result.attrs.get("approximate") == "true"
    failures = []
    if not approx:
        if not max_rhat <= gates["max_rhat"]:
            failures.append(f"max R-hat {max_rhat:.4f} > {gates['max_rhat']}")
        if not min_ess >= gates["min_ess_bulk"]:
            failures.append(f"min bulk ESS {min_ess:.0f} < {gates['min_ess_bulk']:.0f}")
        if div > gates["max_divergences"]:
            failures.append(f"{div} divergent transitions")
    hints = _convergence_hints(est, rhat, ess, gates) if failures else []
    return {"max_rhat": max_rhat, "min_ess_bulk": min_ess, "divergences": div,
            "approximate": approx, "passed": not failures, "failures": failures, "hints": hints}


def _convergence_hints(est: LatencyModel, rhat: xr.Dataset, ess: xr.Dataset,
                       gates: dict) -> list[str]:
    """What to do about failing gates: name the coefficients that fail and, when the data
    identify them only jointly with others, say so (the usual cause on real traces)."""
    bad: set[str] = set()
    for v in ("beta", "alpha", "mu", "relevance"):
        if v not in rhat:
            continue
        dim = next(d for d in rhat[v].dims if d in ("term", "alpha_term", "coef"))
        fail = (rhat[v] > gates["max_rhat"]) | (ess[v] < gates["min_ess_bulk"])
        other = [d for d in fail.dims if d != dim]
        fail = fail.any(other) if other else fail
        bad.update(str(c) for c in fail[dim].values[fail.values])
    if not bad:
        return []
    hints = [f"coefficients failing the gates: {', '.join(sorted(bad))}"]
    ident = getattr(est, "identifiability", None)
    groups = ident.involved(sorted(bad)) if ident is not None else []
    if groups:
        hints.append("no configuration of the data separates "
                     + "; ".join("+".join(g) for g in groups)
                     + ": the posterior has corners where one of them carries the sum. Fit "
                     "without all but one of each group (terms=...), or add configurations "
                     "whose batches separate them (see bayes_latency.data.identifiability)")
    else:
        hints.append("raise target_accept (0.99) and draws; check the stage-1 notes of the fit report")
    return hints
