"""Convergence gates of a fit: R-hat, bulk ESS and divergences, and hints when they fail.

:data:`GATES` holds the default thresholds; :func:`gate_stats` measures a posterior against
them, :func:`convergence` a fitted result (its posterior, divergences, approximation flag and
the sampling extension's record), and :func:`_convergence_hints` says what to do about failing
ones, naming the coefficient groups the identifiability report finds confounded.

Importing this module is light (ArviZ is imported when a fit is checked).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import numpy as np
import xarray as xr

from bayes_latency.errors import BayesLatencyError

if TYPE_CHECKING:  # pragma: no cover
    from bayes_latency.model.definition.identifiability import IdentifiabilityReport

#: Default convergence gates of :func:`convergence` (and of an extended fit's checks).
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


def convergence(result: xr.DataTree | None, identifiability: IdentifiabilityReport | None = None,
                gates: dict | None = None) -> dict:
    """Max R-hat, min bulk ESS, divergences of a fitted ``result`` and whether they pass
    ``gates`` (:data:`GATES`); failing gates come with hints (``identifiability`` names the
    confounded groups), an extended fit with its checks (``extension``)."""
    gates = {**GATES, **(gates or {})}
    if result is None:
        raise BayesLatencyError("the model is not fitted; call fit() or load()")
    post = result["posterior"].to_dataset()
    div = 0
    if "sample_stats" in result and "diverging" in result["sample_stats"]:
        div = int(result["sample_stats"]["diverging"].values.sum())
    approx = result.attrs.get("approximate") == "true"
    stats, rhat, ess = gate_stats(post, div, gates, approximate=approx)
    stats["hints"] = (_convergence_hints(identifiability, rhat, ess, gates)
                      + chain_disagreement(post, rhat) if stats["failures"] else [])
    ext = result.attrs.get("extension")
    if ext:
        stats["extension"] = json.loads(ext)
    return stats


#: R-hat of a coefficient above which :func:`chain_disagreement` names it: the chains sit in
#: different places (the sampler's ``HOPELESS_RHAT``), not only mixing a little slowly.
SPLIT_RHAT = 1.1
#: How :func:`chain_disagreement`'s hint begins, and the advice it ends with (after ``". "``):
#: a report that quotes only where the chains disagree takes the hint without the advice.
DISAGREEMENT_PREFIX = "the chains disagree most on "
DISAGREEMENT_ADVICE = ("If more draws do not bring them together, the posterior has separate "
                       "modes: compare them with what is physical; a tighter prior, or data that "
                       "tell these coefficients apart, removes the wrong one")


def chain_disagreement(post: xr.Dataset, rhat: xr.Dataset, k: int = 3) -> list[str]:
    """One hint naming the ``k`` configuration coefficients (``beta``, ``alpha``) whose chains
    disagree most (R-hat above :data:`SPLIT_RHAT`), with each chain's median: where a short
    run has not mixed yet, or where the posterior has separate modes, so the user can tell
    which one is physical. Empty when no coefficient's R-hat is that high."""
    found: list[tuple[float, str, list[float]]] = []
    for v in ("beta", "alpha"):
        if v not in rhat or v not in post or "chain" not in post[v].dims:
            continue
        r = rhat[v]
        flat = np.nan_to_num(r.values.ravel(), nan=0.0)
        for i in np.argsort(flat)[::-1][:k]:
            if not flat[i] > SPLIT_RHAT:
                break
            at = dict(zip(r.dims, np.unravel_index(i, r.shape), strict=True))
            sel = {d: r[d].values[j] for d, j in at.items()}
            med = post[v].sel(sel).median("draw").values.ravel()
            label = f"{v}[{', '.join(str(x) for x in sel.values())}]"
            found.append((float(flat[i]), label, [float(x) for x in med]))
    if not found:
        return []
    found.sort(key=lambda t: -t[0])
    return [DISAGREEMENT_PREFIX
            + "; ".join(f"{label} (R-hat {r:.2f}, chain medians "
                        + " / ".join(f"{x:.4g}" for x in med) + ")"
                        for r, label, med in found[:k])
            + ". " + DISAGREEMENT_ADVICE]


def _convergence_hints(ident: IdentifiabilityReport | None, rhat: xr.Dataset, ess: xr.Dataset,
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
    groups = ident.involved(sorted(bad)) if ident is not None else []
    if groups:
        hints.append("no configuration of the data separates "
                     + "; ".join("+".join(g) for g in groups)
                     + ": the posterior has corners where one of them carries the sum. Fit "
                     "without all but one of each group (terms=...), or add configurations "
                     "whose batches separate them (see bayes_latency.model.definition.identifiability)")
    else:
        hints.append("raise target_accept (0.99) and draws; check the stage-1 notes of the fit report")
    return hints
