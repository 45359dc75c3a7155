"""Recovery of known coefficients (synthetic fleets): coverage of the 90% intervals, and the
coverage a calibrated posterior would have for the same truths.

Whether a 90% interval contains a fixed truth depends on where that truth lies. A posterior
that covers 90% of truths drawn from its prior covers more than 90% of truths near the prior
median, the more so the more the prior weighs (a coefficient the data hardly constrain keeps an
interval about as wide as its prior). So a synthetic fleet whose coefficients sit near the prior
medians is covered more than 90% of the time by a calibrated posterior, and the number to hold
the observed coverage against is :func:`expected_coverage` of those truths, not 90%.
``benchmarks/recovery_calibration.py`` (fixed truths) and ``benchmarks/recovery_prior_truths.py``
(truths drawn from the model's prior) measure both.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

#: A pair is *identified* when the posterior sd of its log-coefficient is below this fraction of
#: the prior's ``sigma`` of that term; otherwise *prior-dominated*.
IDENTIFIED_RATIO = 0.5
#: Nominal level of the intervals scored here.
LEVEL = 0.90
#: A truth within this many prior sigmas of its prior median counts as near it
#: (:func:`calibration_summary`'s ``near_prior_median``).
NEAR_PRIOR_SIGMA = 0.5


def recovery_table(model: Any, truth: dict[str, dict[str, float]]) -> pd.DataFrame:
    """Per (configuration, coefficient): truth, posterior mean and 90% interval, covered or not.

    Parameters
    ----------
    model
        A fitted :class:`~bayes_latency.model.estimator.LatencyModel` (or anything with its
        ``result``, ``design.configs``, ``coefs``, ``terms`` and ``priors``).
    truth
        ``config_id -> {coefficient: true value}`` (``demo._truth`` reads a fleet's).

    Returns
    -------
    pandas.DataFrame
        ``config_id, coef, truth, mean, q05, q95, covered_90`` (None for a zero truth),
        ``prior_median``.
    """
    post = model.result["posterior"]
    rows = []
    for cid in model.design.configs.index:
        if cid not in truth:
            continue
        for c in model.coefs:
            v = (post["beta"].sel(config=cid, term=c) if c in model.terms
                 else post["alpha"].sel(config=cid, alpha_term=c))
            q05, q95 = v.quantile([0.05, 0.95], dim=("chain", "draw")).values
            t = truth[cid][c]
            rows.append({"config_id": cid, "coef": c, "truth": t, "mean": float(v.mean()),
                         "q05": float(q05), "q95": float(q95),
                         "covered_90": bool(q05 <= t <= q95) if t > 0 else None,
                         "prior_median": model.priors.prior_median(c)})
    return pd.DataFrame(rows)


def log_moments(posterior: Any, rec: pd.DataFrame, terms: tuple[str, ...]
                ) -> tuple[np.ndarray, np.ndarray]:
    """Posterior mean and sd of log(coefficient) of every ``(config_id, coef)`` row of ``rec``
    (NaN where fewer than 11 draws are positive)."""
    mean, sd = np.full(len(rec), np.nan), np.full(len(rec), np.nan)
    for i, (cid, c) in enumerate(zip(rec["config_id"], rec["coef"], strict=True)):
        v = (posterior["beta"].sel(config=cid, term=c) if c in terms
             else posterior["alpha"].sel(config=cid, alpha_term=c)).values.ravel()
        v = v[v > 0]
        if len(v) > 10:
            mean[i], sd[i] = float(np.mean(np.log(v))), float(np.std(np.log(v)))
    return mean, sd


def expected_coverage(sd_ratio: np.ndarray, z_prior: np.ndarray, level: float = LEVEL
                      ) -> np.ndarray:
    """Coverage a calibrated posterior would have for truths at these prior positions.

    Gaussian conjugate approximation on the log scale: a pair whose posterior sd is ``r`` times
    the prior's, with its truth ``d`` prior sigma from the prior median, has a posterior mean
    shrunk towards the prior median by ``r^2``, so ``(truth - posterior mean) / posterior sd ~
    N(r d, 1 - r^2)`` over the data. Averaged over truths drawn from the prior (``d ~ N(0, 1)``)
    this is ``level`` exactly; for fixed truths near the prior median (``|d|`` small) it is
    higher, the more the prior weighs (``r`` near 1). ``r >= 1`` (the hierarchy's prior of a
    configuration is wider than the population prior): covered iff ``|d| < q r``.

    Parameters
    ----------
    sd_ratio
        Posterior sd / prior sigma of each pair's log-coefficient.
    z_prior
        Each truth's distance from its prior median, ``(log truth - prior log-mean) / sigma``.
    level
        Interval level.

    Returns
    -------
    numpy.ndarray
        Probability that each pair's central ``level`` interval contains its truth.
    """
    from scipy.stats import norm

    q = norm.ppf(0.5 + level / 2)
    r = np.asarray(sd_ratio, dtype=float)
    d = np.asarray(z_prior, dtype=float)
    rc = np.minimum(r, 1.0 - 1e-9)
    s = np.sqrt(1.0 - rc**2)
    out = norm.cdf((q - rc * d) / s) - norm.cdf((-q - rc * d) / s)
    return np.where(r >= 1.0, (np.abs(d) < q * r).astype(float), out)


def with_calibration(rec: pd.DataFrame, posterior: Any, terms: tuple[str, ...],
                     priors: Any) -> pd.DataFrame:
    """``rec`` (:func:`recovery_table`) restricted to non-zero truths, with the columns that say
    how far each truth lies from its prior and what a calibrated posterior would cover.

    Added columns: ``log_mean, log_sd`` (posterior of the log-coefficient), ``prior_sigma``,
    ``z_prior`` (the truth's distance from the prior median in prior sigmas), ``width_rel``
    (interval width / truth), ``sd_ratio`` (posterior sd / prior sigma), ``z_post`` ((log truth -
    log_mean) / log_sd), ``pairs_class`` (``identified`` or ``prior-dominated``,
    :data:`IDENTIFIED_RATIO`) and ``expected_90`` (:func:`expected_coverage`).
    """
    rec = rec[rec["covered_90"].notna()].copy()
    rec["covered_90"] = rec["covered_90"].astype(bool)
    rec["log_mean"], rec["log_sd"] = log_moments(posterior, rec, terms)
    lm = [priors.log_mean_sd(c, cid.split("|")[1])
          for cid, c in zip(rec["config_id"], rec["coef"], strict=True)]
    rec["prior_sigma"] = [m[1] for m in lm]
    with np.errstate(divide="ignore", invalid="ignore"):
        rec["z_prior"] = (np.log(rec["truth"]) - [m[0] for m in lm]) / rec["prior_sigma"]
    rec["width_rel"] = (rec["q95"] - rec["q05"]) / rec["truth"]
    rec["sd_ratio"] = rec["log_sd"] / rec["prior_sigma"]
    rec["z_post"] = (np.log(rec["truth"]) - rec["log_mean"]) / rec["log_sd"]
    rec["pairs_class"] = np.where(rec["sd_ratio"] < IDENTIFIED_RATIO, "identified",
                                  "prior-dominated")
    rec["expected_90"] = expected_coverage(rec["sd_ratio"], rec["z_prior"])
    return rec


def calibration_summary(rec: pd.DataFrame) -> dict[str, float]:
    """Pooled numbers of a :func:`with_calibration` table: observed and expected coverage, the
    share of truths within :data:`NEAR_PRIOR_SIGMA` prior sigma of the prior median, and the
    identified pairs' coverage."""
    ident = (rec["pairs_class"] == "identified").to_numpy()
    covered = rec["covered_90"].astype(bool).to_numpy()
    return {"pairs": int(len(rec)), "coverage_90": float(covered.mean()),
            "expected_90": float(rec["expected_90"].mean()),
            "near_prior_median": float((rec["z_prior"].abs() < NEAR_PRIOR_SIGMA).mean()),
            "identified_pairs": int(ident.sum()),
            "identified_coverage_90": float(covered[ident].mean()) if ident.any()
            else float("nan"),
            "identified_expected_90": float(rec.loc[ident, "expected_90"].mean())
            if ident.any() else float("nan")}


__all__ = ["IDENTIFIED_RATIO", "LEVEL", "NEAR_PRIOR_SIGMA", "calibration_summary",
           "expected_coverage", "log_moments", "recovery_table", "with_calibration"]
