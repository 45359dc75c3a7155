"""Fits of ours and cross-validation: fit, posterior summaries (coefficients, in-sample check,
R-hat, stack effect, identifiability), held-out predictions and error metrics."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from bayes_latency.data.observations.build import DEFAULT_STACK
from bayes_latency.model.definition.identifiability import identifiability
from bayes_latency.physics.basis import DEFAULT_TERMS, TERMS
from bayes_latency.study.baselines import baseline_predictions
from bayes_latency.study.realdata import RealData, Split
from bayes_latency.study.settings import METHODS, N_PRED_DRAWS, REAL_TERMS, SEED, FitSettings


def error_metrics(observed: np.ndarray, point: np.ndarray, lo: np.ndarray,
                  hi: np.ndarray) -> dict[str, float]:
    """``n``, MdAPE (%) of the point prediction and coverage of the ``[lo, hi]`` band."""
    y = np.asarray(observed, dtype=float)
    ape = np.abs(np.asarray(point, dtype=float) - y) / y * 100.0
    inside = (np.asarray(lo) <= y) & (y <= np.asarray(hi))
    return {"n": int(len(y)), "mdape_pct": float(np.median(ape)) if len(y) else math.nan,
            "coverage90": float(np.mean(inside)) if len(y) else math.nan}


# --------------------------------------------------------------------------------- ours
def fit_ours(observations: pd.DataFrame, settings: FitSettings,
             terms: Sequence[str] = REAL_TERMS, population: Any = None, kernels: Any = None
             ) -> tuple[Any, dict[str, Any]]:
    """Fit ``LatencyModel(terms=terms)`` (under a fleet's ``population`` when given, with
    ``kernels`` evidence when given, or when ``settings.kernels`` and no population) and return
    it with its convergence report and runtime."""
    from bayes_latency.model.estimator import LatencyModel

    t0 = time.perf_counter()
    if kernels is None and settings.kernels and population is None:
        kernels = True
    m = LatencyModel(terms=tuple(terms), population=population,
                     noise_load=settings.noise_load, kernels=kernels).fit(
        observations, draws=settings.draws, tune=settings.tune, chains=settings.chains,
        seed=settings.seed, target_accept=settings.target_accept, max_draws=settings.max_draws)
    conv = m.convergence()
    conv["runtime_s"] = time.perf_counter() - t0
    conv["n_rows"] = len(observations)
    conv["n_configs"] = len(m.design.configs)
    conv["draws"] = int(m.result["posterior"].sizes["draw"])  # kept (more when extended)
    return m, conv


def ours_predictions(model: Any, test: pd.DataFrame) -> pd.DataFrame:
    """Posterior predictive bands of the held-out rows (see ``checks.ppc.band_summary``)."""
    from bayes_latency.checks.ppc import band_summary

    draws = model.sample_posterior_predictive(test, n_draws=N_PRED_DRAWS, seed=SEED)
    return band_summary(draws.values, test["value_us"].to_numpy(float))


def coefficient_table(model: Any, observations: pd.DataFrame) -> pd.DataFrame:
    """Per configuration and coefficient: posterior mean, median, 5% and 95% quantiles.

    ``informed`` says whether the configuration's rows carry information on the coefficient (a
    non-zero feature); otherwise the value comes from the hierarchy / prior alone.
    """
    post = model.result["posterior"].to_dataset()
    rows = []
    for cfg in model.design.configs.index:
        info = model.design.configs.loc[cfg]
        o = observations[observations["config_id"] == cfg]
        for var, dim, names in (("beta", "term", model.terms), ("alpha", "alpha_term",
                                                                 model.alpha_terms)):
            da = post[var].sel(config=cfg).stack(sample=("chain", "draw"))
            for name in names:
                v = da.sel({dim: name}).values
                unit = TERMS[name].unit if name in TERMS else (
                    "us/token" if name == "alpha_per_token" else "us")
                rows.append({
                    "config_id": cfg, "model": info["model"], "gpu": info["gpu"],
                    "tp": int(info["tp"]), "stack": str(info.get("stack", DEFAULT_STACK)),
                    "block": var, "coef": name, "unit": unit,
                    "mean": float(v.mean()), "median": float(np.median(v)),
                    "q05": float(np.quantile(v, 0.05)), "q95": float(np.quantile(v, 0.95)),
                    "informed": bool(len(o) and (o[f"x_{name}"] > 0).any()),
                })
    return pd.DataFrame(rows)


def insample_table(model: Any, observations: pd.DataFrame) -> pd.DataFrame:
    """In-sample posterior predictive check of the all-data fit, per configuration and kind.

    Columns ``config_id, kind, n, mdape_pct, coverage90`` (predictive median and central 90%).
    """
    band = ours_predictions(model, observations)
    t = pd.concat([observations[["config_id", "kind"]].reset_index(drop=True), band], axis=1)
    g = t.groupby(["config_id", "kind"], sort=True)
    return pd.DataFrame({"n": g.size(), "mdape_pct": g["ape"].median(),
                         "coverage90": g["in_90"].mean()}).reset_index()


def worst_rhat(model: Any, k: int = 8) -> pd.DataFrame:
    """The ``k`` (configuration, term) beta coefficients with the largest R-hat."""
    import arviz as az

    post = model.result["posterior"].to_dataset()
    r = az.rhat(post[["beta"]])["beta"].to_series().rename("rhat").reset_index()
    return r.sort_values("rhat", ascending=False).head(k).reset_index(drop=True)


def identifiability_table(observations: pd.DataFrame,
                          term_sets: dict[str, Sequence[str]] | None = None
                          ) -> tuple[pd.DataFrame, dict[str, list[list[str]]]]:
    """Per configuration: which coefficients the fitted rows identify, for each term set.

    Runs :func:`~bayes_latency.model.definition.identifiability.identifiability` on the rows a fit would use
    (``fit_rows``) with the coefficients and prior-median scales of ``LatencyModel(terms=...)``.

    Parameters
    ----------
    observations
        Observation table.
    term_sets
        Label -> terms; default: the 11 default terms and :data:`REAL_TERMS`.

    Returns
    -------
    (table, everywhere)
        ``table``: one row per (term set, configuration) with ``term_set, config_id, n_active,
        rank, flat_groups``; ``everywhere``: per term set, the groups no configuration separates.
    """
    from bayes_latency.model.definition.summaries import fit_rows
    from bayes_latency.model.estimator import LatencyModel

    if term_sets is None:
        term_sets = {f"default ({len(DEFAULT_TERMS)} terms)": DEFAULT_TERMS,
                     f"REAL_TERMS ({len(REAL_TERMS)} terms)": REAL_TERMS}
    frames, everywhere = [], {}
    for label, terms in term_sets.items():
        m = LatencyModel(terms=tuple(terms))
        rep = identifiability(fit_rows(observations, coefs=m.coefs), m.coefs, m._scale())
        frames.append(rep.to_frame().assign(term_set=label))
        everywhere[label] = rep.confounded_everywhere
    t = pd.concat(frames, ignore_index=True)
    return t[["term_set", "config_id", "n_active", "rank", "flat_groups"]], everywhere


def stack_effect(model: Any) -> pd.DataFrame:
    """Posterior of the fitted stack effect: ratio of every coefficient's population value on
    each stack to the vLLM stack, ``exp(eff_stack[s] - eff_stack[vllm])``, per term.

    Empty when the fit has no stack level (one stack in the data).
    """
    post = model.result["posterior"].to_dataset()
    if "eff_stack" not in post or DEFAULT_STACK not in list(post["stack"].values):
        return pd.DataFrame()
    eff = post["eff_stack"].stack(sample=("chain", "draw"))
    base = eff.sel(stack=DEFAULT_STACK)
    rows = []
    for st in post["stack"].values:
        if st == DEFAULT_STACK:
            continue
        r = np.exp(eff.sel(stack=st) - base)
        for term in model.terms:
            v = r.sel(coef=term).values
            rows.append({"stack": str(st), "term": term, "ratio_mean": float(v.mean()),
                         "ratio_median": float(np.median(v)),
                         "ratio_q05": float(np.quantile(v, 0.05)),
                         "ratio_q95": float(np.quantile(v, 0.95))})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------- CV
def run_cv(data: RealData, splits: Sequence[Split], settings: FitSettings,
           log: Any = print, terms: Sequence[str] = REAL_TERMS
           ) -> tuple[pd.DataFrame, pd.DataFrame, list[dict[str, Any]], dict]:
    """Fit ours (``terms``) on each split's training rows, predict the held-out rows, run the
    baselines.

    Returns
    -------
    (cv, heldout, convergence, models)
        ``cv``: one row per (split, method, subset) with ``n, mdape_pct, coverage90, how``;
        ``heldout``: per held-out row, our predictive bands; ``convergence``: one dict per fit;
        ``models``: fitted models by split name.
    """
    obs = data.observations
    cv_rows, held, convs, models = [], [], [], {}
    for sp in splits:
        test_mask = obs["experiment_id"].isin(sp.held_out)
        train, test = obs[~test_mask], obs[test_mask].reset_index(drop=True)
        log(f"[study] split {sp.name!r}: {len(train)} training rows, {len(test)} held out")
        m, conv = fit_ours(train, settings, terms)
        models[sp.name] = m
        conv.update(fit=f"cv: {sp.name}")
        convs.append(conv)
        _log_fit(conv, log)
        band = ours_predictions(m, test)
        cfg = test["config_id"].iloc[0]
        stack = str(test["stack"].iloc[0]) if "stack" in test else DEFAULT_STACK
        unseen = m.coefficients(str(test["model"].iloc[0]), str(test["gpu"].iloc[0]),
                                int(test["tp"].iloc[0]), n_draws=2,
                                stack=stack).attrs["unseen_levels"]
        preds = {"ours": (band["pred_median_us"].to_numpy(), band["q05_us"].to_numpy(),
                          band["q95_us"].to_numpy(),
                          "posterior predictive median; unseen levels: " + (unseen or "none"))}
        for meth in METHODS[1:]:
            preds[meth] = baseline_predictions(train, test, meth)
        held.append(pd.concat([test[["obs_id", "experiment_id", "config_id", "kind", "phase"]],
                               band], axis=1).assign(split=sp.name, family=sp.family))
        y = test["value_us"].to_numpy(float)
        for meth, (pt, lo, hi, how) in preds.items():
            for subset in ("all", "prefill", "decode", "mixed"):
                sel = np.ones(len(test), bool) if subset == "all" else \
                    (test["phase"] == subset).to_numpy()
                if not sel.any():
                    continue
                cv_rows.append({"split": sp.name, "family": sp.family,
                                "held_out": ",".join(sp.held_out), "config_id": cfg,
                                "kind": test["kind"].iloc[0], "subset": subset, "method": meth,
                                **error_metrics(y[sel], pt[sel], lo[sel], hi[sel]), "how": how})
        s = [r for r in cv_rows if r["split"] == sp.name and r["subset"] == "all"]
        log("[study]   MdAPE " + ", ".join(f"{r['method']} {r['mdape_pct']:.1f}%" for r in s))
    return pd.DataFrame(cv_rows), pd.concat(held, ignore_index=True), convs, models


def _log_fit(conv: dict[str, Any], log: Any = print) -> None:
    log(f"[study]   fit {conv['runtime_s']:.0f} s, max R-hat {conv['max_rhat']:.3f}, "
        f"min ESS {conv['min_ess_bulk']:.0f}, divergences {conv['divergences']}")
