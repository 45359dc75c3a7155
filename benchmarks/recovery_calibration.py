"""Calibration of the 90% intervals on synthetic recovery (target 88-92%).

For posteriors fitted to synthetic fleets (e.g. kept by ``convergence_matrix.py --save``), the
share of (configuration, coefficient) pairs with a non-zero truth inside the 90% posterior
interval, per fit and pooled, and the median interval width relative to the truth.

The pooled share mixes two populations. A pair is *identified* when the data narrow it: the
posterior sd of its log-coefficient is below :data:`IDENTIFIED_RATIO` of the prior's ``sigma`` of
that term (``priors/default.yaml``). Otherwise it is *prior-dominated*: its interval is about as
wide as the prior, and whether it covers the truth says how far the simulator's truths lie from the
prior median in prior units (``|z_prior|``, reported), not whether the model is calibrated: the
synthetic truths are not draws from the prior. Only the identified pairs test calibration.

``expected_90`` (:func:`bayes_latency.checks.recovery.expected_coverage`): the coverage a
calibrated posterior would have for these truths, given how far each lies from its prior median
and how much the prior weighs.

``mean_z`` / ``rms_z``: the truth's distance from the posterior mean of the log-coefficient, in
posterior sd (a calibrated, roughly Gaussian posterior gives mean 0 and RMS 1; the sign says
whether the posterior sits above (negative) or below (positive) the truth).

    python benchmarks/recovery_calibration.py POSTERIOR.nc:FLEET_DIR [...] [--out NAME]
        [--reference OTHER.csv]
    python benchmarks/recovery_calibration.py --from-csv results/benchmarks/NAME.csv [...]
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
from bayes_latency.checks.recovery import (  # noqa: E402
    IDENTIFIED_RATIO,
    NEAR_PRIOR_SIGMA,
    calibration_summary,
    recovery_table,
    with_calibration,
)
from bayes_latency.priors import load_priors  # noqa: E402
from bayes_latency.study.demo import _truth  # noqa: E402

#: Bins of the posterior / prior sd ratio for the table of coverage against identification.
SD_RATIO_BINS = (0.0, 0.05, 0.15, 0.3, 0.5, 0.9, np.inf)


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


#: Bins of the truth's distance from its prior median, in prior sigmas (``|z_prior|``).
Z_PRIOR_BINS = (0.0, 0.5, 1.0, 1.5, 2.0, np.inf)


def by_prior_distance(rec: pd.DataFrame) -> pd.DataFrame:
    """Coverage by how far the truth lies from its prior median (``|z_prior|`` bins).

    A calibrated posterior covers truths near the prior median more often than 90% and far ones
    less often; only over truths spread as the prior says does it cover 90% in all. So a set of
    truths that sit near the prior medians is covered more than 90% by a calibrated posterior.
    """
    b = pd.cut(rec["z_prior"].abs(), Z_PRIOR_BINS, right=False).rename("abs_z_prior")
    out = rec.groupby(b, observed=True).agg(pairs=("covered_90", "size"),
                                            coverage_90=("covered_90", "mean"),
                                            expected_90=("expected_90", "mean"))
    out.index = out.index.astype(str)
    return out


def build_table(pairs: list[str], priors_path: str | None) -> pd.DataFrame:
    """One row per (fit, configuration, coefficient) with a non-zero truth, from
    ``POSTERIOR.nc:FLEET_DIR`` pairs."""
    frames = []
    priors = load_priors(priors_path) if priors_path else load_priors()
    for pair in pairs:
        post, fleet = pair.split(":")
        ns = _posterior(post)
        rec = with_calibration(recovery_table(ns, _truth(Path(fleet))), ns.result["posterior"],
                               ns.terms, priors)
        rec["fit"] = Path(post).stem
        frames.append(rec)
    rec = pd.concat(frames, ignore_index=True)
    rec["sd_ratio_bin"] = pd.cut(rec["sd_ratio"], SD_RATIO_BINS, right=False).astype(str)
    return rec


def render(rec: pd.DataFrame, title: str, reference: pd.DataFrame | None = None,
           reference_name: str = "") -> list[str]:
    """The report's markdown lines; ``reference``: another set of pairs (e.g. truths drawn from
    the prior) whose coverage by distance from the prior median is shown beside this one's."""
    by_fit = _split(rec, "fit")
    by_coef = _split(rec, "coef")
    by_class = _split(rec, "pairs_class")
    by_class["rms_z_prior_of_truth"] = rec.groupby("pairs_class")["z_prior"].apply(
        lambda z: float(np.sqrt(np.mean(z**2))))
    ident = rec[rec["pairs_class"] == "identified"]
    dist = by_prior_distance(rec)
    dist_lines = ["By the truth's distance from its prior median (`abs_z_prior`, in prior "
                  f"sigmas): {calibration_summary(rec)['near_prior_median']:.0%} of these truths "
                  f"lie within {NEAR_PRIOR_SIGMA} sigma of it."]
    if reference is not None:
        ref = by_prior_distance(reference).add_prefix("reference_")
        dist = dist.join(ref, how="outer")
        dist_lines[0] += (f" Beside them, the same bins of {reference_name} "
                          f"({reference['covered_90'].mean():.1%} of {len(reference)} covered in "
                          "all): a posterior that covers 90% of truths spread as the prior says "
                          "covers more than 90% of truths near the prior medians.")
    lines = [f"# {title}", "",
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
             *dist_lines, "", _markdown_table(dist.reset_index().round(4)), "",
             "By posterior / prior sd ratio:", "",
             _markdown_table(_split(rec, "sd_ratio_bin").reset_index()), "",
             _markdown_table(by_fit.reset_index()), "", _markdown_table(by_coef.reset_index()), "",
             "Identified pairs by coefficient:", "",
             _markdown_table(_split(ident, "coef").reset_index()), ""]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("pairs", nargs="*", help="POSTERIOR.nc:FLEET_DIR")
    ap.add_argument("--from-csv", type=Path, default=None,
                    help="render from a CSV this script wrote before (no posteriors needed)")
    ap.add_argument("--reference", type=Path, default=None,
                    help="a CSV of another set of pairs (e.g. recovery_calibration_prior_truths"
                         ".csv) to show beside this one by distance from the prior median")
    ap.add_argument("--out", default="recovery_calibration")
    ap.add_argument("--priors", default=None, help="prior YAML the fits used (default: "
                    "priors/default.yaml)")
    ap.add_argument("--title", default="Recovery calibration of the 90% intervals")
    args = ap.parse_args()
    if bool(args.pairs) == bool(args.from_csv):
        ap.error("give POSTERIOR.nc:FLEET_DIR pairs or --from-csv, not both")
    if args.from_csv:
        rec = pd.read_csv(args.from_csv)
        rec["covered_90"] = rec["covered_90"].astype(bool)
    else:
        rec = build_table(args.pairs, args.priors)
    reference = None
    if args.reference is not None:
        reference = pd.read_csv(args.reference)
        reference["covered_90"] = reference["covered_90"].astype(bool)
    lines = render(rec, args.title, reference,
                   f"`{args.reference.stem}`" if args.reference is not None else "")
    out = ROOT / "results" / "benchmarks" / f"{args.out}.md"
    out.write_text("\n".join(lines))
    if not args.from_csv:
        rec.drop(columns=["prior_median"], errors="ignore").to_csv(out.with_suffix(".csv"),
                                                                   index=False)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
