"""The noise load covariates of ``benchmarks/heldout_real.py`` side by side.

Each covariate's within-run splits (and, when fitted, its cross-validation splits) live in a
folder of the benchmark's ``--work`` (:func:`variant_dir`); :func:`fit_scores` scores a fit
(PSIS-LOO, the held-out rows' log predictive density), :func:`within_metrics` and
:func:`cv_metrics` reduce a folder's files, and :func:`compare_noise_loads` writes the table.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from bayes_latency.checks.diagnostics import _markdown_table


def variant_dir(work: Path, noise_load: str, chosen: str) -> Path:
    """Where the within-run files of a compared covariate go (the chosen one's: ``work``)."""
    return work if noise_load == chosen else work / f"noise-{noise_load}"


def fit_scores(m: object, test: pd.DataFrame) -> dict[str, float]:
    """PSIS-LOO of a fit's pointwise log-likelihood (its ``log_likelihood`` group: the fitted
    rows, or the labelled subsample of them) and the held-out rows' log predictive density
    ``sum_i log mean_s p(y_i | theta_s)`` (log of µs densities on the log scale)."""
    import warnings

    import arviz_stats as azs
    from scipy.special import logsumexp

    from bayes_latency.checks.datatree import log_likelihood_tree

    out: dict[str, float] = {}
    tree = log_likelihood_tree(m.result)
    if tree is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loo = azs.loo(tree, pointwise=True)
        k = np.asarray(loo.pareto_k.values, dtype=float).ravel()
        out.update(elpd_loo=float(loo.elpd), elpd_loo_se=float(loo.se), p_loo=float(loo.p),
                   loo_rows=int(k.size), loo_k_high=int((k > 0.7).sum()))
    ll = m.pointwise_loglik(test).values.reshape(-1, len(test)).astype(float)
    out["heldout_lpd"] = float(np.sum(logsumexp(ll, axis=0) - np.log(ll.shape[0])))
    return out


def within_metrics(held: pd.DataFrame, conv: pd.DataFrame, flags: dict[str, bool]) -> list[dict]:
    """Per within-run split: coverage, band width, MdAPE (overall and by step class) of the
    held-out rows, and the fit's convergence and scores (``within_conv.csv``)."""
    hb = held["obs_id"].map(flags).fillna(False).astype(bool) if flags else None
    rows = []
    for sp, g in held.groupby("split", sort=False):
        c = conv[conv["fit"] == f"within: {sp}"].iloc[0]
        r = {"split": sp, "n": len(g), "coverage90": float(g["in_90"].mean()),
             "coverage50": float(g["in_50"].mean()),
             "median_band_rel_width": float(np.median((g["q95_us"] - g["q05_us"])
                                                      / g["pred_median_us"])),
             "mdape_pct": float(np.median(np.abs(g["pred_median_us"] / g["observed_us"] - 1))
                                * 100)}
        if hb is not None:
            for name, sel in (("quiet", ~hb[g.index]), ("host_bound", hb[g.index])):
                r[f"coverage90_{name}"] = float(g.loc[sel, "in_90"].mean()) if sel.any() else np.nan
        for k in ("heldout_lpd", "elpd_loo", "elpd_loo_se", "p_loo", "loo_k_high", "max_rhat",
                  "min_ess_bulk", "divergences", "passed", "runtime_s"):
            if k in c:
                r[k] = c[k]
        rows.append(r)
    return rows


#: The ``split`` label of a covariate's cross-validation summary in :func:`compare_noise_loads`.
CV_LABEL = "one configuration held out"


def cv_metrics(d: Path) -> dict | None:
    """The cross-validation splits of a work folder in one row (None without them): mean of the
    per-split 90% / 50% coverages, median band width and median per-split MdAPE, the fits'
    worst R-hat and ESS, divergences and how many passed the gates."""
    if not all((d / f).exists() for f in ("cv.csv", "held.csv", "conv.csv")):
        return None
    cv, held, conv = (pd.read_csv(d / f) for f in ("cv.csv", "held.csv", "conv.csv"))
    ours = cv[(cv["method"] == "ours") & (cv["subset"] == "all")]
    per = held.groupby("split", sort=False).agg(
        c90=("in_90", "mean"), c50=("in_50", "mean"))
    width = (held["q95_us"] - held["q05_us"]) / held["pred_median_us"]
    return {"split": CV_LABEL, "n": len(held), "coverage90": float(per["c90"].mean()),
            "coverage50": float(per["c50"].mean()), "median_band_rel_width": float(width.median()),
            "mdape_pct": float(ours["mdape_pct"].median()), "max_rhat": float(conv["max_rhat"].max()),
            "min_ess_bulk": float(conv["min_ess_bulk"].min()),
            "divergences": int(conv["divergences"].sum()),
            "passed": f"{int(conv['passed'].sum())} of {len(conv)}"}


def compare_noise_loads(work: Path, flags: dict[str, bool] | None = None
                        ) -> tuple[pd.DataFrame, list[str]]:
    """The within-run splits of every compared noise load covariate side by side (empty without
    a ``compare.json`` in ``work``)."""
    f = work / "compare.json"
    if not f.exists():
        return pd.DataFrame(), []
    spec = json.loads(f.read_text())
    rows = []
    for v in dict.fromkeys([spec["chosen"], *spec["compare"]]):
        d = variant_dir(work, v, spec["chosen"])
        if not (d / "within_held.csv").exists():
            continue
        for r in within_metrics(pd.read_csv(d / "within_held.csv"),
                                pd.read_csv(d / "within_conv.csv"), flags or {}):
            rows.append({"noise_load": v, **r})
        c = cv_metrics(d)
        if c is not None:
            rows.append({"noise_load": v, **c})
    t = pd.DataFrame(rows).sort_values(["split", "noise_load"], kind="stable")
    from bayes_latency.model.definition.likelihood import LOAD_GROWTH_SD, NOISE_LOADS

    lines = ["## Noise load covariates compared", "",
             "The two within-run splits fitted once per load covariate of the noise scale "
             "(`--compare`; `bayes_latency/model/definition/likelihood.py`: `log sigma_i = log sigma + "
             f"gamma (l_i - l_ref)`, `gamma ~ N(0, {LOAD_GROWTH_SD})`, half-normal for the "
             "`-growth` forms): " + "; ".join(f"`{k}`: {v}" for k, v in NOISE_LOADS.items()
                                              if k in set(t["noise_load"])) + ". "
             f"The model of the other sections: `{spec['chosen']}`. `heldout_lpd`: the held-out "
             "rows' summed log predictive density (higher is better); `elpd_loo` (se "
             "`elpd_loo_se`): PSIS-LOO of the fit's pointwise log-likelihood over the rows of "
             "its `log_likelihood` group, with the noise at its stage-1 estimate; "
             "`loo_k_high`: rows with Pareto k above 0.7. Rows `" + CV_LABEL + "`: the "
             "cross-validation splits of the first section for the covariates fitted on them "
             "(mean of the per-split coverages, median of the per-split MdAPE, all fits' worst "
             "convergence).", "",
             _markdown_table(t.round(4)), ""]
    return t, lines
