"""Leave-one-model-out on a synthetic fleet: how well does the fit speak for a model it never saw?

Usage::

    python benchmarks/leave_one_model_out.py [--fleet demo] [--seed 3] [--draws 1000]
        [--priors priors/default.yaml] [--adaptation low_rank] [--work DIR] [--cache DIR]
        [--reuse] [--out PREFIX]

For each model of the fleet: fit on every other model's rows, then predict the held-out model's
iteration times (posterior predictive, with the unseen model's effects drawn from their
population distribution) and report the median absolute percentage error of the predictive
median and the share of observed iterations inside the 90% band. Calibration is a property
over held-out models: one model's realised effect falls inside the population band or not, so
the summary is the mean coverage over folds (target 85-95%) and the median MdAPE (target < 10%),
the thresholds of ``tests/test_model_recovery.py::test_leave_one_model_out``.

Also reported per fold: the posterior mean of each factor's effect scale averaged over the
supported terms, and the median log10 width of the 90% band. Each fold's posterior is saved
under ``--work`` (``<held-out>.nc``); ``--reuse`` evaluates saved posteriors without refitting.

Outputs (``--out PREFIX``, default ``results/benchmarks/leave_one_model_out``, the benchmark's one
current result): ``PREFIX.md`` and ``PREFIX.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

# this checkout's package, also when the installed one is another worktree's
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def fleet_tables(fleet: str, seed: int, work: Path) -> pd.DataFrame:
    """The fleet's observation table (simulated and ingested once, cached under ``work``)."""
    from bayes_latency.data.experiment import ingest, load_tables
    from bayes_latency.data.tables import table_files
    from bayes_latency.synth.fleet import simulate_fleet

    tables = work / f"tables_{fleet}_{seed}"
    if not table_files(tables, "observations"):
        folders = simulate_fleet(fleet, work / f"fleet_{fleet}_{seed}", seed=seed, progress=False)
        ingest(folders, tables)
    return load_tables(tables)["observations"]


def evaluate(m, rows: pd.DataFrame, n_draws: int = 400, seed: int = 0) -> dict:
    """MdAPE of the predictive median and 90% band coverage on ``rows``."""
    from bayes_latency.checks.ppc import band_summary

    y = m.sample_posterior_predictive(rows, n_draws=n_draws, seed=seed).values
    band = band_summary(y, rows["value_us"].to_numpy(float))
    post = m.result["posterior"]
    sig = {f: float(post[f"sigma_{f}"].mean()) for f in ("model", "gpu", "tp")
           if f"sigma_{f}" in post}
    return {"mdape": float(band["ape"].median() / 100.0),
            "coverage_90": float(band["in_90"].mean()),
            "band_log10_width": float(np.median(np.log10(band["q95_us"] / band["q05_us"]))),
            "sigma_mean": sig, "n_rows": len(rows)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fleet", default="demo")
    p.add_argument("--seed", type=int, default=3, help="fleet seed (the slow test's: 3)")
    p.add_argument("--fit-seed", type=int, default=4)
    p.add_argument("--draws", type=int, default=1000)
    p.add_argument("--tune", type=int, default=500)
    p.add_argument("--target-accept", type=float, default=0.99)
    p.add_argument("--adaptation", default="low_rank")
    p.add_argument("--priors", default=None)
    p.add_argument("--work", default="/tmp/bl_lomo", help="posteriors of the folds")
    p.add_argument("--cache", default="/tmp/bl_lomo", help="simulated fleet and its tables")
    p.add_argument("--reuse", action="store_true", help="evaluate saved posteriors, no refit")
    p.add_argument("--out", default="results/benchmarks/leave_one_model_out")
    args = p.parse_args(argv)

    from bayes_latency.model.estimator import LatencyModel

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    obs = fleet_tables(args.fleet, args.seed, Path(args.cache))
    folds: dict[str, dict] = {}
    for held in sorted(obs["model"].unique()):
        path = work / f"{held}.nc"
        t0 = time.perf_counter()
        if args.reuse:
            m = LatencyModel.load(path, priors=args.priors)
        else:
            m = LatencyModel(priors=args.priors).fit(
                obs[obs["model"] != held], draws=args.draws, tune=args.tune, seed=args.fit_seed,
                target_accept=args.target_accept, adaptation=args.adaptation, max_draws=None)
            m.save(path)
        conv = m.convergence()
        rows = obs[(obs["model"] == held) & (obs["kind"] == "iteration")]
        folds[held] = {**evaluate(m, rows), "fit_s": time.perf_counter() - t0,
                       "max_rhat": conv["max_rhat"], "min_ess_bulk": conv["min_ess_bulk"],
                       "divergences": conv["divergences"]}
        print(held, json.dumps(folds[held]), flush=True)
    summary = {"median_mdape": float(np.median([f["mdape"] for f in folds.values()])),
               "mean_coverage_90": float(np.mean([f["coverage_90"] for f in folds.values()]))}
    print("SUMMARY", json.dumps(summary))
    if args.out:
        cmd = " ".join(["python benchmarks/leave_one_model_out.py", *sys.argv[1:]])
        lines = [f"# Leave-one-model-out ({args.fleet} fleet, seed {args.seed})", "",
                 f"Command: `{cmd}`", "",
                 f"Median MdAPE **{summary['median_mdape']:.1%}** (target < 10%); mean 90% band "
                 f"coverage **{summary['mean_coverage_90']:.1%}** (target 85-95%).", "",
                 "| held-out model | MdAPE | 90% coverage | band width (log10) | sigma_model | "
                 "R-hat | ESS | div |", "|---|---|---|---|---|---|---|---|"]
        for k, f in folds.items():
            lines.append(f"| {k} | {f['mdape']:.1%} | {f['coverage_90']:.1%} | "
                         f"{f['band_log10_width']:.3f} | {f['sigma_mean'].get('model', float('nan')):.3f} | "
                         f"{f['max_rhat']:.4f} | {f['min_ess_bulk']:.0f} | {f['divergences']} |")
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out + ".md").write_text("\n".join(lines) + "\n")
        Path(args.out + ".json").write_text(json.dumps({"summary": summary, "folds": folds,
                                                        "args": vars(args)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
