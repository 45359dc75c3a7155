"""Calibration of the 90% intervals on synthetic recovery (issue 15: target 88-92%).

For posteriors fitted to synthetic fleets (e.g. kept by ``convergence_matrix.py --save``), the
share of (configuration, coefficient) pairs with a non-zero truth inside the 90% posterior
interval, per fit and pooled, and the median interval width relative to the truth.

The pooled share mixes two populations. A pair is *identified* when the data narrow it: the
posterior sd of its log-coefficient is below :data:`IDENTIFIED_RATIO` of the prior's ``sigma`` of
that term (``priors/default.yaml``). Otherwise it is *prior-dominated*: its interval is about as
wide as the prior, and whether it covers the truth says how far the simulator's truths lie from the
prior median in prior units (``|z_prior|``, reported), not whether the model is calibrated: the
synthetic truths are not draws from the prior. Only the identified pairs test calibration.

``expected_90`` (:func:`expected_coverage`): the coverage a calibrated posterior would have for
these truths, given how far each lies from its prior median and how much the prior weighs.

``mean_z`` / ``rms_z``: the truth's distance from the posterior mean of the log-coefficient, in
posterior sd (a calibrated, roughly Gaussian posterior gives mean 0 and RMS 1; the sign says
whether the posterior sits above (negative) or below (positive) the truth).

    python benchmarks/recovery_calibration.py POSTERIOR.nc:FLEET_DIR [...] [--out NAME]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import xarray as xr

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bayes_latency.checks.diagnostics import _markdown_table  # noqa: E402
from bayes_latency.demo import _truth, recovery_table  # noqa: E402
from bayes_latency.priors import load_priors  # noqa: E402

#: Posterior sd of the log-coefficient below this fraction of the prior sigma: identified pair.
IDENTIFIED_RATIO = 0.5


def _log_moments(dt: xr.DataTree, rec: pd.DataFrame, terms: tuple[str, ...]
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Posterior mean and sd of log(coefficient) of every (config_id, coef) row of ``rec``."""
    post = dt["posterior"]
    mean, out = np.full(len(rec), np.nan), np.full(len(rec), np.nan)
    for i, (cid, c) in enumerate(zip(rec["config_id"], rec["coef"], strict=True)):
        v = (post["beta"].sel(config=cid, term=c) if c in terms
             else post["alpha"].sel(config=cid, alpha_term=c)).values.ravel()
        v = v[v > 0]
        if len(v) > 10:
            mean[i], out[i] = float(np.mean(np.log(v))), float(np.std(np.log(v)))
    return mean, out


#: Bins of the posterior / prior sd ratio for the table of coverage against identification.
SD_RATIO_BINS = (0.0, 0.05, 0.15, 0.3, 0.5, 0.9, np.inf)


def expected_coverage(sd_ratio: np.ndarray, z_prior: np.ndarray, level: float = 0.90
                      ) -> np.ndarray:
    """Coverage a calibrated posterior would have for truths at these prior positions.

    Gaussian conjugate approximation on the log scale: a pair whose posterior sd is ``r`` times
    the prior's, with its truth ``d`` prior sigma from the prior median, has a posterior mean
    shrunk towards the prior median by ``r^2``, so ``(truth - posterior mean) / posterior sd ~
    N(r d, 1 - r^2)`` over the data. Averaged over truths drawn from the prior (``d ~ N(0, 1)``)
    this is ``level`` exactly; for fixed truths near the prior median (``|d|`` small) it is
    higher, the more the prior weighs (``r`` near 1). ``r >= 1`` (the hierarchy's prior of a
    configuration is wider than the population prior): covered iff ``|d| < q r``.
    """
    from scipy.stats import norm

    q = norm.ppf(0.5 + level / 2)
    r = np.asarray(sd_ratio, dtype=float)
    d = np.asarray(z_prior, dtype=float)
    rc = np.minimum(r, 1.0 - 1e-9)
    s = np.sqrt(1.0 - rc**2)
    out = norm.cdf((q - rc * d) / s) - norm.cdf((-q - rc * d) / s)
    return np.where(r >= 1.0, (np.abs(d) < q * r).astype(float), out)


def _split(rec: pd.DataFrame, by: str) -> pd.DataFrame:
    out = rec.groupby(by, observed=True).agg(
                              pairs=("covered_90", "size"), coverage_90=("covered_90", "mean"),
                              expected_90=("expected_90", "mean"),
                              median_rel_width=("width_rel", "median"),
                              median_sd_ratio=("sd_ratio", "median"),
                              mean_z=("z_post", "mean"))
    out["rms_z"] = rec.groupby(by, observed=True)["z_post"].apply(lambda z: float(np.sqrt(np.mean(z**2))))
    return out


def _posterior(path: str) -> SimpleNamespace:
    """What :func:`recovery_table` reads, from any model version's posterior file."""
    dt = xr.open_datatree(path, engine="h5netcdf").load()
    terms = tuple(json.loads(dt.attrs["terms"]))
    alpha = tuple(json.loads(dt.attrs["alpha_terms"]))
    configs = pd.DataFrame(index=pd.Index(dt["posterior"]["config"].values.astype(str)))
    return SimpleNamespace(result=dt, design=SimpleNamespace(configs=configs), terms=terms,
                           coefs=terms + alpha, priors=load_priors())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("pairs", nargs="+", help="POSTERIOR.nc:FLEET_DIR")
    ap.add_argument("--out", default="recovery_calibration")
    ap.add_argument("--priors", default=None, help="prior YAML the fits used (default: "
                    "priors/default.yaml)")
    ap.add_argument("--title", default="Recovery calibration of the 90% intervals")
    args = ap.parse_args()
    frames = []
    priors = load_priors(args.priors) if args.priors else load_priors()
    for pair in args.pairs:
        post, fleet = pair.split(":")
        ns = _posterior(post)
        rec = recovery_table(ns, _truth(Path(fleet)))
        rec["fit"] = Path(post).stem
        rec["log_mean"], rec["log_sd"] = _log_moments(ns.result, rec, ns.terms)
        gpus = {c: c.split("|")[1] for c in rec["config_id"]}
        lm = [priors.log_mean_sd(c, gpus[cid]) for cid, c in zip(rec["config_id"], rec["coef"],
                                                                 strict=True)]
        rec["prior_sigma"] = [m[1] for m in lm]
        with np.errstate(divide="ignore", invalid="ignore"):
            rec["z_prior"] = (np.log(rec["truth"]) - [m[0] for m in lm]) / rec["prior_sigma"]
        frames.append(rec)
    rec = pd.concat(frames, ignore_index=True)
    rec = rec[rec["covered_90"].notna()].copy()
    rec["covered_90"] = rec["covered_90"].astype(bool)
    rec["width_rel"] = (rec["q95"] - rec["q05"]) / rec["truth"]
    rec["sd_ratio"] = rec["log_sd"] / rec["prior_sigma"]
    rec["z_post"] = (np.log(rec["truth"]) - rec["log_mean"]) / rec["log_sd"]
    rec["pairs_class"] = np.where(rec["sd_ratio"] < IDENTIFIED_RATIO, "identified",
                                  "prior-dominated")
    rec["expected_90"] = expected_coverage(rec["sd_ratio"], rec["z_prior"])
    rec["sd_ratio_bin"] = pd.cut(rec["sd_ratio"], SD_RATIO_BINS, right=False).astype(str)
    by_fit = _split(rec, "fit")
    by_coef = _split(rec, "coef")
    by_class = _split(rec, "pairs_class")
    by_class["rms_z_prior_of_truth"] = rec.groupby("pairs_class")["z_prior"].apply(
        lambda z: float(np.sqrt(np.mean(z**2))))
    ident = rec[rec["pairs_class"] == "identified"]
    lines = [f"# {args.title}", "",
             f"Pooled: {rec['covered_90'].mean():.1%} of {len(rec)} (configuration, coefficient) "
             "pairs with a non-zero truth inside their 90% interval (target 88-92%).",
             f"Identified pairs (posterior sd of the log-coefficient < {IDENTIFIED_RATIO} x the "
             f"prior sigma): {ident['covered_90'].mean():.1%} of {len(ident)}; prior-dominated: "
             f"{rec.loc[rec['pairs_class'] != 'identified', 'covered_90'].mean():.1%} of "
             f"{int((rec['pairs_class'] != 'identified').sum())}.",
             f"A calibrated posterior would cover {rec['expected_90'].mean():.1%} of these truths "
             "(`expected_90`: Gaussian shrinkage approximation given each pair's sd ratio and "
             "the truth's prior z; 90% for truths drawn from the prior).", "",
             _markdown_table(by_class.reset_index()), "",
             "By posterior / prior sd ratio:", "",
             _markdown_table(_split(rec, "sd_ratio_bin").reset_index()), "",
             _markdown_table(by_fit.reset_index()), "", _markdown_table(by_coef.reset_index()), "",
             "Identified pairs by coefficient:", "",
             _markdown_table(_split(ident, "coef").reset_index()), ""]
    out = ROOT / "results" / "benchmarks" / f"{args.out}.md"
    out.write_text("\n".join(lines))
    rec.drop(columns=["prior_median"], errors="ignore").to_csv(out.with_suffix(".csv"), index=False)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
