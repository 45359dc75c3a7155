"""Convergence gates of a fit: R-hat, bulk ESS and divergences, and hints when they fail.

:data:`GATES` holds the default thresholds; :func:`convergence` measures a fitted
:class:`~bayes_latency.model.estimator.LatencyModel` against them (the public entry point is
:meth:`LatencyModel.convergence <bayes_latency.model.estimator.LatencyModel.convergence>`) and
:func:`_convergence_hints` says what to do about failing ones.

Importing this module is light (ArviZ is imported when a fit is checked).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import numpy as np
import xarray as xr

if TYPE_CHECKING:  # pragma: no cover
    from bayes_latency.model.estimator import LatencyModel

#: Convergence gates applied by :meth:`LatencyModel.convergence`.
GATES = {"max_rhat": 1.01, "min_ess_bulk": 400.0, "max_divergences": 0}


#: Posterior variables the gates are measured on (those present with non-zero spread).
GATE_VARS = ("beta", "alpha", "mu", "relevance", "sigma_model", "sigma_gpu", "sigma_tp")


def gate_stats(post: xr.Dataset, divergences: int, gates: dict | None = None,
               approximate: bool = False) -> tuple[dict, xr.Dataset, xr.Dataset]:
    """Max R-hat and min bulk ESS of :data:`GATE_VARS` in ``post``, and which gates fail.

    Returns ``(stats, rhat, ess)``: ``stats`` has ``max_rhat``, ``min_ess_bulk``,
    ``divergences``, ``approximate``, ``passed`` and ``failures`` (one line per failing gate).
    """
    import arviz_stats as azs

    gates = {**GATES, **(gates or {})}
    var_names = [v for v in GATE_VARS if v in post]
    # constants (effect scales fixed for factors with two levels) have no diagnostics
    var_names = [v for v in var_names if float(post[v].std()) > 0]
    with np.errstate(invalid="ignore", divide="ignore"):
        rhat = azs.rhat(post[var_names])
        ess = azs.ess(post[var_names], method="bulk")
    max_rhat = float(max(float(rhat[v].max()) for v in var_names))
    min_ess = float(min(float(ess[v].min()) for v in var_names))
    failures = []
    if not approximate:
        if not max_rhat <= gates["max_rhat"]:
            failures.append(f"max R-hat {max_rhat:.4f} > {gates['max_rhat']}")
        if not min_ess >= gates["min_ess_bulk"]:
            failures.append(f"min bulk ESS {min_ess:.0f} < {gates['min_ess_bulk']:.0f}")
        if divergences > gates["max_divergences"]:
            failures.append(f"{divergences} divergent transitions")
    stats = {"max_rhat": max_rhat, "min_ess_bulk": min_ess, "divergences": int(divergences),
             "approximate": approximate, "passed": not failures, "failures": failures}
    return stats, rhat, ess


def convergence(est: LatencyModel, gates: dict | None = None) -> dict:
    """Max R-hat, min bulk ESS, divergences and whether they pass ``gates`` (:data:`GATES`)."""
    gates = {**GATES, **(gates or {})}
    post = est._post()
    div = 0
    if "sample_stats" in est.result and "diverging" in est.result["sample_stats"]:
        div = int(est.result["sample_stats"]["diverging"].values.sum())
    approx = est.result.attrs.get("approximate") == "true"
    stats, rhat, ess = gate_stats(post, div, gates, approximate=approx)
    stats["hints"] = _convergence_hints(est, rhat, ess, gates) if stats["failures"] else []
    ext = est.result.attrs.get("extension")
    if ext:
        stats["extension"] = json.loads(ext)
    return stats


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
                     "whose batches separate them (see bayes_latency.model.identifiability)")
    else:
        hints.append("raise target_accept (0.99) and draws; check the stage-1 notes of the fit report")
    return hints
