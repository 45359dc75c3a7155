"""``bayes-latency demo``: the whole path on the built-in synthetic fleet.

simulate (real-format traces with known truth) -> ingest (tables, observation table) -> fit (one
configuration held out) -> check (diagnostics gates) -> posterior predictive checks (step,
request, workload) -> recovery against the truth -> export (JSON + BLIS, every configuration
and the held-out one) -> ``README.md`` summary. Exits 1 when a convergence gate fails.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from bayes_latency import __version__
from bayes_latency.checks.recovery import (
    IDENTIFIED_RATIO,
    NEAR_PRIOR_SIGMA,
    calibration_summary,
    recovery_table,
    with_calibration,
)
from bayes_latency.data.observations.build import config_id
from bayes_latency.model.estimator import LatencyModel
from bayes_latency.physics.basis import ALPHA_TERMS, DEFAULT_TERMS
from bayes_latency.study.machine import compile_cache_state, load_average, machine_line
from bayes_latency.textfiles import load_yaml, read_text

#: Configuration left out of the fit, to show what the posterior says about an unseen one
#: (its model, GPU and TP degree are each seen elsewhere, never together).
HELD_OUT = ("llama-2-70b", "A100-80GB", 4)
#: An architecture absent from the fleet altogether (export only: no data to check against).
UNSEEN_MODEL = ("llama-3.1-8b", "H100-SXM", 1)
#: Sampler settings of the demo's fit (timed as they are by ``benchmarks/demo_fit_speed.py``).
#: Diagonal adaptation: measured 2x fewer leapfrog steps than low-rank on this fleet, whose
#: coefficients every configuration separates (see ``model.inference.sampler.NUTPIE_ADAPTATION``).
DEMO_FIT = {"tune": 500, "chains": 2, "target_accept": 0.99, "adaptation": "diag",
            "max_draws": None}
#: Posterior draws per chain of the demo's fit (``bayes-latency demo --draws``). 2000, not 4000:
#: half the sampling time, and the gates still pass with margin (MODEL_VERSION 7,
#: seeds 0-4 at 2000 draws: min bulk ESS 826, 700, 888, 583, 582, max R-hat <= 1.0056, 0
#: divergences; at 1500 draws ESS fell to 419-427 for two seeds, too close to the gate of 400).
DEMO_DRAWS = 2000


class _Progress:
    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.marks: dict[str, float] = {}
        self._last = self.t0
        self.load_before = load_average()
        self.caches = "not read"

    def machine(self) -> str:
        """The machine a run was measured on: CPU model, cores, 1-minute load before and now."""
        return machine_line(self.load_before)

    def step(self, name: str, msg: str = "") -> None:
        now = time.perf_counter()
        self.marks[name] = now - self._last
        self._last = now
        print(f"[demo {now - self.t0:6.1f}s] {name}: {msg}", file=sys.stderr, flush=True)

    @property
    def total(self) -> float:
        return time.perf_counter() - self.t0


def _truth(fleet_dir: Path) -> dict[str, dict[str, float]]:
    """True coefficients per configuration id (canonical GPU names, as in the observations)."""
    from bayes_latency.physics.hardware import load_gpu

    out = {}
    for f in sorted(fleet_dir.glob("*/truth.yaml")):
        d = load_yaml(read_text(f, "truth file"))
        cid = config_id(d["model"], load_gpu(d["gpu"]).name, int(d["tp"]))
        out[cid] = {**d["beta"], **d["alpha"]}
    return out


def _export_all(model: LatencyModel, posterior: Path, out: Path,
                configs: list[tuple[str, str, int]]) -> list[Path]:
    from bayes_latency.export.document import (
        blis_yaml,
        export_document,
        provenance,
        step_noise_of,
    )

    out.mkdir(parents=True, exist_ok=True)
    prov = provenance(model.result.attrs, posterior)
    written = []
    for m, g, t in configs:
        coefs = model.coefficients(m, g, t, new_run=True)  # as `bayes-latency export`
        cfg = {"model": m, "gpu": g, "tp": t}
        name = f"{m}_{g}_tp{t}"
        doc = export_document(coefs, cfg, prov, n_draws=0,
                              step_noise=step_noise_of(model, coefs))
        p = out / f"{name}.json"
        p.write_text(json.dumps(doc, indent=2, default=float))
        q = out / f"{name}.blis.yaml"
        q.write_text(blis_yaml(coefs, cfg, prov, n_draws=20))
        written += [p, q]
    return written


def _fmt_pct(x: float) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{x:+.1f}%"


def run_demo(out: Path, fleet: str = "demo", seed: int = 0, draws: int | None = None,
             shown: Path | None = None) -> int:
    """Run the demo into ``out`` (see module docstring); 0 when every gate passes, else 1.

    ``draws`` per chain default to :data:`DEMO_DRAWS`; ``shown``: the folder named in messages
    and the README (default ``out``; the command line writes into a staging folder).
    """
    draws = DEMO_DRAWS if draws is None else int(draws)
    from bayes_latency.checks.diagnostics import diagnose
    from bayes_latency.checks.host_overhead import ingest_notes
    from bayes_latency.checks.ppc import FixedCoefficientModel, request_ppc, workload_ppc
    from bayes_latency.checks.run import run_checks
    from bayes_latency.data.experiment import ingest, load_tables
    from bayes_latency.synth.fleet import simulate_fleet

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    show = Path(shown) if shown is not None else out
    pr = _Progress()
    folders = simulate_fleet(fleet, out / "fleet", seed=seed, progress=False)
    pr.step("simulate", f"{len(folders)} experiments written to {show / 'fleet'}")
    report = ingest(folders, out / "tables", iteration_notes=ingest_notes)
    if show != out:  # the report names the experiment folders where they end up
        from bayes_latency.io import atomic_write_text

        rep = out / "tables" / "ingest_report.json"
        atomic_write_text(rep, rep.read_text().replace(str(out), str(show)))
    tables = load_tables(out / "tables")
    obs = tables["observations"]
    pr.step("ingest", f"{len(obs):,} observation rows, {report.n_dropped} records dropped")

    held = config_id(*HELD_OUT)
    train = obs[obs["config_id"] != held]
    model = LatencyModel()
    # read inside the fit step: it imports PyTensor, which the fit imports anyway (simulate and
    # ingest neither import it nor touch its cache)
    pr.caches = compile_cache_state()
    model.fit(train, draws=draws, seed=seed, progress=sys.stderr.isatty(), **DEMO_FIT)
    posterior = model.save(out / "posterior.nc")
    conv = model.convergence()
    pr.step("fit", f"{len(model.design.configs)} configurations, {len(model._rows):,} rows; "
                   f"R-hat {conv['max_rhat']:.4f}, ESS {conv['min_ess_bulk']:.0f}, "
                   f"divergences {conv['divergences']} ({'pass' if conv['passed'] else 'FAIL'})")

    diag = diagnose(model.result)
    (out / "diagnostics.md").write_text(diag.to_markdown())
    pr.step("check", f"diagnostics {'pass' if diag.passed else 'FAIL: ' + '; '.join(diag.failures)}")

    checks = run_checks(model, out / "tables", out / "checks", seed=seed)
    pr.step("ppc", f"{len(checks)} check files in {show / 'checks'}")

    truth = _truth(out / "fleet")
    rec = recovery_table(model, truth)
    cal = with_calibration(rec, model.result["posterior"], model.terms, model.priors)
    rec = rec.merge(cal[["config_id", "coef", "z_prior", "sd_ratio", "pairs_class",
                         "expected_90"]], on=["config_id", "coef"], how="left")
    rec.to_csv(out / "recovery.csv", index=False)
    # workload means under the true coefficients, computed the same way as the predictions
    # the simulator's step time is BLIS's 11 terms: the tables' other features are not in it
    true_req = request_ppc(FixedCoefficientModel(truth, terms=DEFAULT_TERMS + ALPHA_TERMS), obs,
                           tables["requests"], noise=False)
    req = request_ppc(model, obs, tables["requests"], seed=seed)
    wl = workload_ppc(req, truth=true_req.expected())
    wl.to_csv(out / "workload_vs_truth.csv", index=False)
    pr.step("recovery", f"coverage of 90% intervals {rec['covered_90'].dropna().mean():.1%}")

    fleet_cfgs = sorted({(r.model, r.gpu, int(r.tp)) for r in obs[["model", "gpu", "tp"]].drop_duplicates().itertuples()})
    exports = _export_all(model, posterior, out / "exports", fleet_cfgs + [UNSEEN_MODEL])
    pr.step("export", f"{len(exports)} files in {show / 'exports'}")

    _write_readme(out, model, conv, diag, rec, wl, obs, held, pr, report, show)
    pr.step("readme", f"{show / 'README.md'} (total {pr.total:.0f} s)")
    return 0 if conv["passed"] and diag.passed else 1


def _write_readme(out: Path, model: LatencyModel, conv: dict, diag, rec: pd.DataFrame,  # noqa: ANN001
                  wl: pd.DataFrame, obs: pd.DataFrame, held: str, pr: _Progress,
                  report, shown: Path | None = None) -> None:  # noqa: ANN001
    kinds = obs.groupby("kind").size().to_dict()
    nz = rec[rec["truth"] > 0]
    cs = calibration_summary(nz.dropna(subset=["expected_90"]))
    zero = rec[rec["truth"] == 0].groupby("coef")[["mean", "q95", "prior_median"]].mean()
    e2e = wl[wl["metric"] == "e2e_mean"]
    lines = [
        "# Demo results",
        "",
        f"Generated by `bayes-latency demo --out {shown or out}` (bayes_latency {__version__}) in "
        f"{pr.total:.0f} s on {pr.machine()}; PyTensor's cache of compiled model code before "
        f"the fit: {pr.caches}. Large intermediate files (`fleet/`, `tables/`, "
        "`posterior.nc`) are regenerated by the command and not committed.",
        "",
        "## Steps and timings",
        "",
        "| step | seconds |",
        "|---|---|",
        *[f"| {k} | {v:.1f} |" for k, v in pr.marks.items()],
        "",
        "## Data",
        "",
        f"{len(obs):,} observation rows: " + ", ".join(f"{k} {v:,}" for k, v in sorted(kinds.items()))
        + f". Records dropped at ingest: {report.n_dropped}.",
        f"Held out of the fit: `{held}` (its model, GPU and TP degree are seen elsewhere).",
        "",
        "## Convergence",
        "",
        f"- max R-hat {conv['max_rhat']:.4f} (gate 1.01), min bulk ESS {conv['min_ess_bulk']:.0f} "
        f"(gate 400), divergences {conv['divergences']} (gate 0): "
        f"**{'pass' if conv['passed'] else 'FAIL'}**",
        "- fit timings: " + ", ".join(f"{k} {v:.1f}" for k, v in model.timings.items()),
        f"- full diagnostics (ESS tail, E-BFMI, tree depth, PSIS-LOO): [diagnostics.md](diagnostics.md)"
        f" — {'pass' if diag.passed else 'FAIL'}",
        "",
        "## Recovery of the true coefficients",
        "",
        f"- 90% credible intervals containing the truth: {nz['covered_90'].mean():.1%} of "
        f"{len(nz)} (configuration, coefficient) pairs with a non-zero truth. A calibrated "
        f"posterior would contain {cs['expected_90']:.1%} of these truths, not 90%: "
        f"{cs['near_prior_median']:.0%} of them lie within {NEAR_PRIOR_SIGMA} prior sigma of "
        "their prior median, and an interval the prior still weighs on covers such a truth more often than "
        "90% (`bayes_latency/checks/recovery.py`; for truths drawn from the prior, "
        "`results/benchmarks/recovery_calibration_prior_truths.md`)",
        f"- pairs the data identify (posterior sd below {IDENTIFIED_RATIO} prior sigma): "
        f"{cs['identified_coverage_90']:.1%} of {cs['identified_pairs']} "
        f"(calibrated: {cs['identified_expected_90']:.1%})",
        "- truly-zero terms (posterior mean, averaged over configurations, vs prior median):",
        "",
        "| term | posterior mean | posterior 95% quantile | prior median |",
        "|---|---|---|---|",
        *[f"| {c} | {r['mean']:.4g} | {r['q95']:.4g} | {r['prior_median']:.4g} |"
          for c, r in zero.iterrows()],
        "",
        "(`moe_dispatch` has no data in this fleet, EP = 1 everywhere: its posterior is its prior.)",
        "Per pair: [recovery.csv](recovery.csv).",
        "",
        "## Workload level: mean E2E per experiment",
        "",
        "| experiment | observed (ms) | predicted (ms) | 90% band (ms) | error | truth error |",
        "|---|---|---|---|---|---|",
        *[f"| {r.experiment_id}{' (held out)' if r.config_id == held else ''} | "
          f"{r.observed_us / 1e3:.1f} | {r.pred_median_us / 1e3:.1f} | {r.q05_us / 1e3:.1f}-{r.q95_us / 1e3:.1f} | "
          f"{_fmt_pct(r.error_pct)} | {_fmt_pct(getattr(r, 'truth_error_pct', np.nan))} |"
          for r in e2e[e2e["stage"] == "all"].itertuples()],
        "",
        f"Max |error| of mean E2E: {e2e['error_pct'].abs().max():.1f}% (target < 10%). "
        "All metrics and stages: [workload_vs_truth.csv](workload_vs_truth.csv).",
        "",
        "## Files",
        "",
        "- `checks/`: step-level PPC (`step_ppc.csv`, `ppc_iterations.png`, `pit.png`, "
        "`calibration.png`, `step_observed_vs_predicted.png`), request level (`request_ppc.csv`), "
        "workload level (`workload_ppc.csv`, `workload_observed_vs_predicted.png`)",
        "- `exports/`: JSON documents and BLIS `trained-physics` YAML blocks (with 20 posterior "
        "draws) for every configuration of the fleet, the held-out one and an unseen model",
        "- `diagnostics.md`, `recovery.csv`, `workload_vs_truth.csv`",
        "",
    ]
    (out / "README.md").write_text("\n".join(lines))
