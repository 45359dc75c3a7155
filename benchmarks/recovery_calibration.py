"""Calibration of the 90% intervals on synthetic recovery (issue 15: target 88-92%).

For posteriors fitted to synthetic fleets (e.g. kept by ``convergence_matrix.py --save``), the
share of (configuration, coefficient) pairs with a non-zero truth inside the 90% posterior
interval, per fit and pooled, and the median interval width relative to the truth.

    python benchmarks/recovery_calibration.py POSTERIOR.nc:FLEET_DIR [...] [--out NAME]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import xarray as xr

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bayes_latency.checks.diagnostics import _markdown_table  # noqa: E402
from bayes_latency.demo import _truth, recovery_table  # noqa: E402
from bayes_latency.priors import load_priors  # noqa: E402


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
    args = ap.parse_args()
    frames = []
    for pair in args.pairs:
        post, fleet = pair.split(":")
        rec = recovery_table(_posterior(post), _truth(Path(fleet)))
        rec["fit"] = Path(post).stem
        frames.append(rec)
    rec = pd.concat(frames, ignore_index=True)
    rec = rec[rec["covered_90"].notna()].copy()
    rec["covered_90"] = rec["covered_90"].astype(bool)
    rec["width_rel"] = (rec["q95"] - rec["q05"]) / rec["truth"]
    by_fit = rec.groupby("fit").agg(pairs=("covered_90", "size"), coverage_90=("covered_90", "mean"),
                                    median_rel_width=("width_rel", "median"))
    by_coef = rec.groupby("coef").agg(pairs=("covered_90", "size"), coverage_90=("covered_90", "mean"),
                                      median_rel_width=("width_rel", "median"))
    lines = ["# Recovery calibration of the 90% intervals", "",
             f"Pooled: {rec['covered_90'].mean():.1%} of {len(rec)} (configuration, coefficient) "
             "pairs with a non-zero truth inside their 90% interval (target 88-92%).", "",
             _markdown_table(by_fit.reset_index()), "", _markdown_table(by_coef.reset_index()), ""]
    out = ROOT / "results" / "benchmarks" / f"{args.out}.md"
    out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
