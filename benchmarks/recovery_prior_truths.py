"""Recovery calibration with truths drawn from the model's prior (simulation-based).

``recovery_calibration.py`` scores fleets whose coefficients are the simulator's fixed values
(``synth/truth.py``), which lie within about 0.4 prior sigma of the prior medians and set three
terms the prior says are almost surely on (``prefill_kv``, ``decode_compute``) to exactly 0. Here,
as in simulation-based calibration (Talts et al. 2018), the truths are a draw from the prior of the
model that is then fitted, so that over seeds a calibrated posterior's 90% intervals cover 90%:

``--draw model`` (default, SBC): every configuration's ``beta`` and ``alpha`` are one draw of the
fitted model's own prior for that fleet (:meth:`LatencyModel.build` on a pilot simulation of the
same fleet and seed, then ``pm.sample_prior_predictive``, as the fit's ``prior`` group does): the
population value of every term with its ARD gate, the per-GPU prior overrides, the crossed model /
GPU / TP effects at the prior's scales and the configuration residual. The structure of that prior
(which terms are gated, the sum-only groups) depends only on the features, which the pilot and the
final fleet share (checked: ``structure_changed`` in the log).

``--draw population`` (the earlier measurement, kept for comparison): only the population value of
every non-zero term is drawn (``median * exp(sigma * z)``, no gate, GPU overrides ignored); the
simulator's own effects and residual apply on top and its truly-zero terms stay 0.

    python benchmarks/recovery_prior_truths.py [--seeds 0-19] [--draw model|population]
        [--priors YAML] [--work DIR] [--out NAME]

Writes the posteriors to ``WORK`` and the tables of ``recovery_calibration.py`` to
``results/benchmarks/NAME.md`` (default ``recovery_calibration_prior_truths``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bayes_latency.priors import load_priors  # noqa: E402
from bayes_latency.synth import fleet as synth_fleet  # noqa: E402
from bayes_latency.synth import truth as synth_truth  # noqa: E402

#: Seed offset of the population draw (independent of the simulator's own seed use).
DRAW_SEED = 15_000

CLI = [sys.executable, "-m", "bayes_latency.cli.main"]
TITLES = {"model": "Recovery calibration of the 90% intervals, truths drawn from the model's prior",
          "population": "Recovery calibration of the 90% intervals, population truths drawn from "
                        "the priors"}


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


def model_prior_truths(tables: Path, seed: int, priors: str | None = None
                       ) -> tuple[dict[str, dict[str, float]], dict]:
    """One draw of the fitted model's prior for the fleet of ``tables``: per configuration id,
    ``{"beta": {term: value}, "alpha": {term: value}}``, and the prior's structure (gated terms,
    sum-only groups) for the check that the final fleet has the same."""
    import pymc as pm
    import pytensor

    from bayes_latency.data.tables import load_observations
    from bayes_latency.model.definition.conditional import truncated_normal_positive
    from bayes_latency.model.estimator import LatencyModel

    m = LatencyModel(priors=load_priors(priors) if priors else None)
    pm_model = m.build(load_observations(tables))
    with warnings.catch_warnings(), pytensor.config.change_flags(cxx=""):
        warnings.filterwarnings("ignore", message=".*Potential.*")
        pr = pm.sample_prior_predictive(draws=1, model=pm_model,
                                        var_names=["theta_pop", "sigma_config"],
                                        random_seed=DRAW_SEED + seed)
    prior = pr["prior"].to_dataset() if hasattr(pr, "children") else pr.prior
    mean = prior["theta_pop"].transpose("chain", "draw", "config", "coef").values[0, 0]
    sc = prior["sigma_config"].transpose("chain", "draw", "coef").values[0, 0]
    rng = np.random.default_rng(DRAW_SEED + 1_000 + seed)
    theta = truncated_normal_positive(mean, np.maximum(mean * sc[None, :], 1e-300), rng)
    nb = len(m.terms)
    out = {}
    for i, cid in enumerate(m.design.configs.index):
        out[str(cid)] = {"beta": dict(zip(m.terms, map(float, theta[i, :nb]), strict=True)),
                         "alpha": dict(zip(m.alpha_terms, map(float, theta[i, nb:]),
                                           strict=True))}
    return out, structure(m)


def structure(m) -> dict:  # noqa: ANN001
    """Beta terms without an ARD gate and the sum-only groups of a built model (what its prior
    depends on; the alpha terms never have a gate)."""
    return {"no_gate": [t for t in m._no_gate() if t in m.terms],
            "sum_groups": sorted(list(g[0]) for g in m._sum_groups())}


def check_structure(d: Path, priors: str | None = None) -> bool:
    """Record the prior structure of the final fleet next to the pilot's (``prior_draw.json``);
    True when they are the same (the draw was from the prior that is fitted)."""
    from bayes_latency.data.tables import load_observations
    from bayes_latency.model.estimator import LatencyModel

    f = d / "prior_draw.json"
    doc = json.loads(f.read_text())
    if "structure_final" not in doc:
        m = LatencyModel(priors=load_priors(priors) if priors else None)
        m.build(load_observations(d / "tables"))
        doc["structure_final"] = structure(m)
        f.write_text(json.dumps(doc, indent=1))
    def gated(st: dict) -> dict:
        return {**st, "no_gate": [t for t in st["no_gate"] if not t.startswith("alpha_")]}

    return gated(doc["structure_final"]) == gated(doc["structure"])


def _simulate_with(truths: dict[str, dict[str, dict[str, float]]], seed: int, out: Path,
                   fleet: str) -> None:
    """Simulate ``fleet`` with the given per-configuration truths (``true_coefficients`` patched)."""
    from bayes_latency.physics.hardware import load_gpu

    orig = synth_fleet.true_coefficients

    def patched(model, gpu, tp, terms, alpha_terms, seed=0):  # noqa: ANN001, ANN202
        t = orig(model, gpu, tp, terms, alpha_terms, seed=seed)
        d = truths[synth_truth.config_id(model, load_gpu(gpu).name, tp)]
        return synth_truth.ConfigTruth(model=t.model, gpu=t.gpu, tp=t.tp,
                                       beta={k: d["beta"][k] for k in terms},
                                       alpha={k: d["alpha"][k] for k in alpha_terms},
                                       effects={f: {} for f in (*synth_truth.FACTORS, "config")})

    synth_fleet.true_coefficients = patched
    try:
        synth_fleet.simulate_fleet(fleet, out, seed=seed, progress=False)
    finally:
        synth_fleet.true_coefficients = orig


def _ingest(fleet: Path, tables: Path) -> None:
    if not (tables / "tables.json").exists():
        exps = sorted(str(p) for p in fleet.iterdir() if p.is_dir())
        subprocess.run(CLI + ["ingest", *exps, "--out", str(tables)], check=True, cwd=ROOT,
                       stdout=subprocess.DEVNULL)


def simulate(seed: int, d: Path, fleet: str, draw: str, priors: str | None = None) -> None:
    """Simulate ``fleet`` into ``d / "fleet"`` with truths drawn as ``draw`` says."""
    out = d / "fleet"
    if draw == "population":
        beta, alpha = prior_population(seed)
        saved = dict(synth_truth.POPULATION_BETA), dict(synth_truth.POPULATION_ALPHA)
        synth_truth.POPULATION_BETA.update(beta)
        synth_truth.POPULATION_ALPHA.update(alpha)
        try:
            synth_fleet.simulate_fleet(fleet, out, seed=seed, progress=False)
        finally:
            synth_truth.POPULATION_BETA.update(saved[0])
            synth_truth.POPULATION_ALPHA.update(saved[1])
        return
    pilot = d / "pilot"
    if not (pilot / "fleet" / "truth.yaml").exists():
        synth_fleet.simulate_fleet(fleet, pilot / "fleet", seed=seed, progress=False)
    _ingest(pilot / "fleet", pilot / "tables")
    truths, struct = model_prior_truths(pilot / "tables", seed, priors)
    (d / "prior_draw.json").write_text(json.dumps({"truths": truths, "structure": struct},
                                                  indent=1))
    _simulate_with(truths, seed, out, fleet)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0-19")
    ap.add_argument("--fleet", default="tiny")
    ap.add_argument("--draw", choices=("model", "population"), default="model")
    ap.add_argument("--work", default="/tmp/recovery_prior_truths")
    ap.add_argument("--out", default="recovery_calibration_prior_truths")
    ap.add_argument("--priors", default=None, help="prior YAML of the draw and the fits "
                    "(default: priors/default.yaml)")
    args = ap.parse_args()
    a, _, b = args.seeds.partition("-")
    seeds = range(int(a), int(b or a) + 1)
    work = Path(args.work)
    pairs = []
    for s in seeds:
        d = work / f"{args.fleet}_{s}"
        fleet, tables, post = d / "fleet", d / "tables", d / f"{args.fleet}_prior_seed_{s}.nc"
        t0 = time.time()
        if not (fleet / "truth.yaml").exists():
            simulate(s, d, args.fleet, args.draw, args.priors)
        _ingest(fleet, tables)
        if args.draw == "model" and not check_structure(d, args.priors):
            print(f"seed {s}: structure_changed (gated terms / sum groups differ from the "
                  "pilot's; see prior_draw.json)", flush=True)
        if not post.exists():
            pri = ["--priors", args.priors] if args.priors else []
            rc = subprocess.run(CLI + ["fit", str(tables), "--out", str(post), *pri], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
            print(f"seed {s}: fit exit {rc} ({time.time() - t0:.0f} s)", flush=True)
        pairs.append(f"{post}:{fleet}")
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "recovery_calibration.py"), *pairs,
                    "--out", args.out, "--title", TITLES[args.draw],
                    *(["--priors", args.priors] if args.priors else [])], check=True, cwd=ROOT)


if __name__ == "__main__":
    main()
