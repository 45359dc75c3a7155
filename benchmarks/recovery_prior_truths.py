"""Recovery calibration with truths drawn from the prior (issue 15; an additional measurement).

``recovery_calibration.py`` scores fleets whose population coefficients are the simulator's fixed
values (``synth/truth.py``), which lie within about 0.4 prior sigma of the prior medians: a pair
the data do not narrow then has a prior-wide interval around a truth near its centre, and covers
it nearly always, whatever the model's calibration. Here, as in simulation-based calibration, each
seed first draws the population value of every non-zero term from its prior in
``priors/default.yaml`` (``median * exp(sigma * z)``, GPU overrides ignored; the simulator's
model / GPU / TP effects and configuration residual then apply as usual), simulates the tiny fleet
with it, ingests it and fits it with the CLI defaults. Terms that are truly zero stay zero.

    python benchmarks/recovery_prior_truths.py [--seeds 0-9] [--work DIR] [--out NAME]

Writes the posteriors to ``WORK`` and the tables of ``recovery_calibration.py`` to
``results/benchmarks/NAME.md`` (default ``recovery_calibration_prior_truths``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bayes_latency.priors import load_priors  # noqa: E402
from bayes_latency.synth import truth as synth_truth  # noqa: E402
from bayes_latency.synth.fleet import simulate_fleet  # noqa: E402

#: Seed offset of the population draw (independent of the simulator's own seed use).
DRAW_SEED = 15_000


def prior_population(seed: int) -> tuple[dict[str, float], dict[str, float]]:
    """Population beta and alpha values drawn from the default priors (non-zero terms only)."""
    pr = load_priors()
    rng = np.random.default_rng(DRAW_SEED + seed)
    beta = dict(synth_truth.POPULATION_BETA)
    alpha = dict(synth_truth.POPULATION_ALPHA)
    for d in (beta, alpha):
        for k in sorted(d):
            if d[k] > 0 and k in pr.terms:
                mu, sd = pr.log_mean_sd(k)
                d[k] = float(np.exp(mu + sd * rng.standard_normal()))
    return beta, alpha


def simulate(seed: int, out: Path, fleet: str) -> None:
    """Simulate ``fleet`` with the population drawn for ``seed`` (module dicts patched in place)."""
    beta, alpha = prior_population(seed)
    saved = dict(synth_truth.POPULATION_BETA), dict(synth_truth.POPULATION_ALPHA)
    synth_truth.POPULATION_BETA.update(beta)
    synth_truth.POPULATION_ALPHA.update(alpha)
    try:
        simulate_fleet(fleet, out, seed=seed, progress=False)
    finally:
        synth_truth.POPULATION_BETA.update(saved[0])
        synth_truth.POPULATION_ALPHA.update(saved[1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0-9")
    ap.add_argument("--fleet", default="tiny")
    ap.add_argument("--work", default="/tmp/recovery_prior_truths")
    ap.add_argument("--out", default="recovery_calibration_prior_truths")
    args = ap.parse_args()
    a, _, b = args.seeds.partition("-")
    seeds = range(int(a), int(b or a) + 1)
    work = Path(args.work)
    cli = [sys.executable, "-m", "bayes_latency.cli"]
    pairs = []
    for s in seeds:
        d = work / f"{args.fleet}_{s}"
        fleet, tables, post = d / "fleet", d / "tables", d / f"{args.fleet}_prior_seed_{s}.nc"
        t0 = time.time()
        if not (fleet / "truth.yaml").exists():
            simulate(s, fleet, args.fleet)
        if not (tables / "tables.json").exists():
            exps = sorted(str(p) for p in fleet.iterdir() if p.is_dir())
            subprocess.run(cli + ["ingest", *exps, "--out", str(tables)], check=True, cwd=ROOT,
                           stdout=subprocess.DEVNULL)
        if not post.exists():
            rc = subprocess.run(cli + ["fit", str(tables), "--out", str(post)], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
            print(f"seed {s}: fit exit {rc} ({time.time() - t0:.0f} s)", flush=True)
        pairs.append(f"{post}:{fleet}")
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "recovery_calibration.py"), *pairs,
                    "--out", args.out], check=True, cwd=ROOT)


if __name__ == "__main__":
    main()
