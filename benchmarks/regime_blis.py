"""The real client runs in BLIS with the additive and the regime step time, each run's exports
projected at its own workload, under both ways of turning a run into a BLIS workload.

Both models are calibrated as ``bayes-latency study client`` calibrates (the real step rows, the
Splitwise benchmark rows and the client means of the 12 normal runs, replayed by the package's
scheduler until the rows stop moving; 2 x 2000 draws after 1000 tuning steps, sampling on until
the convergence gates pass):

- **additive**: the study's terms (``REAL_TERMS``);
- **regime**: the same plus the compute knees ``compute_over_2w``, ``compute_over_6w``.

Each normal run is then simulated in BLIS (:func:`~bayes_latency.study.blis.e2e.run_study`, the
posterior-mean point pooled over 5 arrival realizations, no bands) under each expansion of the
run into a BLIS workload:

- ``prefix``: open-loop arrivals, one prefix group per user caching the whole prompt;
- ``inference-perf``: BLIS's own expansion of the run's inference-perf spec (closed-loop
  sessions, the system prompt shared).

The additive exports are the fit's posterior mean on BLIS's slots (one vector per
configuration, as ``export`` writes it). A regime fit's exports are projected onto BLIS's basis
at the run's own workload (:func:`~bayes_latency.export.projection.project_onto_blis`, what
``export --workload`` does): over the steps of the run's stages replayed by the package's
scheduler with each user's whole prompt cached for ``prefix``, and with only the system prompt
shared for ``inference-perf``. The package's own replay of the runs (no BLIS: the calibrated
client means against the real ones) is reported for both models.

Usage::

    python benchmarks/regime_blis.py [--blis BIN] [--work DIR] [--out PREFIX] [--runs SUBSTR]

``--work`` (default ``/tmp/regime_blis``) keeps the fits and the BLIS tables. A kept fit is reused
only when it was calibrated on the same rows and client stages by the same code
(``_provenance.fit_key``), else refitted and its BLIS rows simulated again; BLIS rows of a
reused fit are not run again. Outputs ``PREFIX.md`` and ``PREFIX.csv`` (default
``results/real/client/regime_blis``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._provenance import (  # noqa: E402
    fit_key,
    kept_fit_info,
    machine_line,
    record_machine,
)

MODELS = ("additive", "regime")
EXPANSION_SHARING = {"prefix": "prompt", "inference-perf": "system"}
POINT_SEEDS = 5
GPU = "H100"


def model_terms(name: str) -> tuple[str, ...]:
    """Terms of the two calibrated fits."""
    from bayes_latency.export.projection import KNEE_TERMS
    from bayes_latency.study.settings import REAL_TERMS

    return tuple(REAL_TERMS) + (KNEE_TERMS if name == "regime" else ())


def calibrate_model(name: str, data: Any, stages: list, work: Path, log: Any = print
                    ) -> tuple[Any, pd.DataFrame, dict, bool]:
    """The calibrated fit of ``name`` (from ``work`` when kept there under the same key), its
    replayed client means, its convergence record and whether it was kept."""
    from bayes_latency.calibrate.loop import client_predictions
    from bayes_latency.model.estimator import LatencyModel
    from bayes_latency.physics.basis import replay_terms
    from bayes_latency.study.client.blis import CLIENT_FIT, START_FIT
    from bayes_latency.study.client.runs import calibrated_fit

    post, pred_path, info_path = (work / f"{name}.nc", work / f"{name}_replay.csv",
                                  work / f"{name}.json")
    terms = model_terms(name)
    # the rows, the client stages (their requests and output lengths), the terms and the code
    key = fit_key(data.observations, name, ",".join(terms), repr(stages))
    info = kept_fit_info(info_path, key, post, pred_path)
    if info is not None:
        log(f"[regime-blis] {name}: kept from {post}")
        return LatencyModel.load(post), pd.read_csv(pred_path), info, True
    if post.exists() and pred_path.exists() and info_path.exists():
        log(f"[regime-blis] {name}: {post} was fitted to other rows, stages or code: refitted")
    t0 = time.perf_counter()
    cal = calibrated_fit(data.observations, stages, CLIENT_FIT, terms, start_settings=START_FIT,
                         log=log)
    conv = cal.model.convergence()
    info = {"terms": list(terms), "passed": bool(conv.get("passed")),
            "max_rhat": float(conv["max_rhat"]), "min_ess_bulk": float(conv["min_ess_bulk"]),
            "divergences": int(conv["divergences"]), "converged": bool(cal.converged),
            "wall_s": time.perf_counter() - t0,
            "dropped": {k: int(v) for k, v in cal.model.report.dropped.items() if v}, "key": key}
    pred = client_predictions(cal.model, stages, cal.replays, replay_terms(terms))
    cal.model.save(post)
    pred.to_csv(pred_path, index=False)
    info_path.write_text(json.dumps(info, indent=1))
    return cal.model, pred, info, False


def point(model: Any, run: Any, stages: list, expansion: str) -> tuple[Any, dict]:
    """The BLIS point (posterior mean) of ``run``'s configuration for ``expansion``: the
    additive fit's mean, or the regime fit's projected at the run's workload."""
    from bayes_latency.export.document import blis_block
    from bayes_latency.export.projection import KNEE_TERMS, project_over_stages
    from bayes_latency.study.blis.spec import Coefficients

    coefs = model.coefficients(run.model, GPU, run.tp, new_run=True)
    info: dict[str, Any] = {}
    if {str(t) for t in coefs["term"].values} & set(KNEE_TERMS):
        sts = [dataclasses.replace(s, prompt_sharing=EXPANSION_SHARING[expansion])
               for s in stages]
        proj, _ = project_over_stages(coefs, sts, run.model, GPU, f"{run.short_id} ({expansion})")
        coefs = proj.coefs
        info = {"projection_steps": proj.n_steps, "projection_prefill_steps":
                proj.n_prefill_steps, "projection_step_mdape_pct": proj.step_mdape_pct,
                "projection_step_p90_pct": proj.step_p90_pct,
                "projection_total_pct": proj.total_error_pct,
                "prefill_compute_before": proj.carrier_mean_before,
                "prefill_compute_after": proj.carrier_mean_after}
    blk = blis_block(coefs, "mean", {"model": run.model, "gpu": GPU, "tp": run.tp})
    t = blk["trained_physics_coefficients"]
    return Coefficients(tuple(t["alpha_coeffs"]), tuple(t["beta_coeffs"]), label="export-mean"), info


def simulate(models: dict[str, Any], runs: list, stages: list, setup: Any, work: Path,
             log: Any = print) -> pd.DataFrame:
    """Every (model, run, expansion) in BLIS; rows kept in ``work/blis.csv`` as they finish."""
    from bayes_latency.study.blis.e2e import run_study

    path = work / "blis.csv"
    done = pd.read_csv(path) if path.exists() else pd.DataFrame()
    parts = [done] if len(done) else []
    for name, m in models.items():
        for r in runs:
            sts = [s for s in stages if s.run_id == r.short_id]
            for ex in EXPANSION_SHARING:
                if len(done) and ((done["fit"] == name) & (done["run"] == r.short_id)
                                  & (done["expansion"] == ex)).any():
                    continue
                c, info = point(m, r, sts, ex)
                st = run_study(setup, [r], n_draws=0, sources={(r.model, r.tp): (c, [])},
                               point_seeds=POINT_SEEDS, expansions=(ex,))
                tab = st.table[st.table["source"] == "export-mean"].assign(
                    fit=name, beta=json.dumps([round(b, 6) for b in c.beta]), **info)
                parts.append(tab)
                pd.concat(parts, ignore_index=True).to_csv(path, index=False)
                log(f"[regime-blis] {name} {r.short_id} {ex}: E2E "
                    f"{float(tab['err_e2e_mean'].iloc[0]):+.1%}, TTFT "
                    f"{float(tab['err_ttft_mean'].iloc[0]):+.1%}")
    return pd.concat(parts, ignore_index=True)


def replay_table(preds: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The package's own replay: per fit and run, the mean over its stages of the replayed
    client means' errors (TTFT, E2E)."""
    out = []
    for name, p in preds.items():
        for run, g in p.groupby("run_id", sort=True):
            row = {"fit": name, "run": run}
            for k, lab in (("workload_ttft", "ttft"), ("workload_e2e", "e2e")):
                h = g[g["kind"] == k]
                row[f"err_{lab}"] = float((h["mean_us"].sum() / h["observed_us"].sum()) - 1.0)
            out.append(row)
    return pd.DataFrame(out)


def render(res: dict[str, Any]) -> str:
    """The markdown report."""
    from bayes_latency.study.markdown import _md

    t = pd.DataFrame(res["blis"])
    rep = pd.DataFrame(res["replay"])
    lines = ["# The real runs in BLIS: additive against regime step time", "",
             "Regenerate: `python benchmarks/regime_blis.py`. " + res["what"], "",
             res["machine"], "", "## Median absolute error over the normal runs", "",
             "| fit | expansion | runs | E2E mean | TTFT mean | decode interval | worst E2E | "
             "worst TTFT |", "|---|---|---|---|---|---|---|---|"]
    for (fit, ex), g in t.groupby(["fit", "expansion"], sort=False):
        e, tt, d = (g["err_e2e_mean"].abs(), g["err_ttft_mean"].abs(),
                    g["err_decode_interval"].abs())
        lines.append(f"| {fit} | {ex} | {len(g)} | {e.median():.1%} | {tt.median():.1%} | "
                     f"{d.median():.1%} | {e.max():.1%} | {tt.max():.1%} |")
    lines += ["", "Under `inference-perf`, BLIS computes every user prompt past the system "
              "prompt, which the real server had cached (its users repeat their whole prompt), "
              "so the simulated TTFT there also carries prefill work the real runs did not do; "
              "under `prefix` the simulated prefills are the real ones.",
              "", "## The package's own replay (no BLIS)", "",
              "Calibrated client means against the real ones, pooled over each run's stages "
              "(each user's whole prompt cached, as the real server did).", "",
              "| fit | runs | median E2E error | worst E2E error | median TTFT error | "
              "worst TTFT error |",
              "|---|---|---|---|---|---|"]
    for fit, g in rep.groupby("fit", sort=False):
        lines.append(f"| {fit} | {len(g)} | {g['err_e2e'].abs().median():.1%} | "
                     f"{g['err_e2e'].abs().max():.1%} | {g['err_ttft'].abs().median():.1%} | "
                     f"{g['err_ttft'].abs().max():.1%} |")
    w = t.pivot_table(index=["expansion", "run"], columns="fit",
                      values=["err_e2e_mean", "err_ttft_mean"]).reset_index()
    w.columns = [" ".join(str(c) for c in col if c).strip() for col in w.columns]
    for c in w.columns[2:]:
        w[c] = w[c].map(lambda v: f"{v:+.1%}")
    w = w.rename(columns=lambda c: c.replace("err_e2e_mean", "E2E").replace("err_ttft_mean",
                                                                           "TTFT"))
    lines += ["", "## Per run (signed error of the mean, sim / real - 1)", "", _md(w), ""]
    proj = t[t["fit"] == "regime"]
    if "prefill_compute_after" in proj:
        pj = proj[["expansion", "run", "projection_steps", "prefill_compute_before",
                   "prefill_compute_after", "projection_step_p90_pct",
                   "projection_total_pct"]].copy()
        for c in ("prefill_compute_before", "prefill_compute_after"):
            pj[c] = pj[c].map(lambda v: f"{v:.4g}")
        for c in ("projection_step_p90_pct", "projection_total_pct"):
            pj[c] = pj[c].map(lambda v: f"{v:.2f}")
        pj["projection_steps"] = pj["projection_steps"].map(lambda v: f"{int(v):,}")
        pj = pj.sort_values(["expansion", "run"], ascending=[False, True])
        lines += ["## The regime exports' projections", "",
                  "Per run and expansion: the replayed steps the projection is made over, "
                  "`prefill_compute` of the regime fit and of its projection (posterior means), "
                  "and the projection's own error on those steps (90th percentile of the per-step "
                  "error, and of the summed time, %).", "", _md(pj), ""]
    fits = pd.DataFrame([{"fit": k, "passed": v["passed"], "max_rhat": f"{v['max_rhat']:.4f}",
                          "min_ess_bulk": f"{v['min_ess_bulk']:.0f}",
                          "divergences": v["divergences"], "calibration converged":
                          v["converged"], "wall_s": f"{v['wall_s']:.0f}"}
                         for k, v in res["fits"].items()])
    lines += ["## Fits", "", _md(fits), ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blis", default=None, help="BLIS binary (default $BLIS_BIN)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/regime_blis"))
    ap.add_argument("--out", type=Path, default=ROOT / "results/real/client/regime_blis")
    ap.add_argument("--runs", default=None, help="only runs whose id contains this")
    args = ap.parse_args()
    import os

    from bayes_latency.io import atomic_write_text
    from bayes_latency.physics.basis import REGIME_TERMS
    from bayes_latency.study.blis.e2e import check_blis
    from bayes_latency.study.blis.spec import find_runs
    from bayes_latency.study.client.runs import client_stages
    from bayes_latency.study.realdata import load_real_data, real_data_dir

    d = real_data_dir()
    blis = args.blis or os.environ.get("BLIS_BIN")
    if d is None or not blis:
        sys.exit("needs the real data (../shared/data/real) and a BLIS binary (--blis, BLIS_BIN)")
    setup = check_blis(blis)
    args.work.mkdir(parents=True, exist_ok=True)
    if not (args.work / "machine.json").exists():
        record_machine(args.work, "start")
    data = load_real_data(d, terms=REGIME_TERMS)
    runs = [r for r in find_runs(d) if not r.stress]
    stages = client_stages(runs)
    models, preds, fits, refit = {}, {}, {}, []
    for name in MODELS:
        models[name], preds[name], fits[name], kept = calibrate_model(name, data, stages,
                                                                      args.work)
        if not kept:
            refit.append(name)
    kept_rows = args.work / "blis.csv"
    if refit and kept_rows.exists():  # simulated with the fits just replaced
        done = pd.read_csv(kept_rows)
        done[~done["fit"].isin(refit)].to_csv(kept_rows, index=False)
    record_machine(args.work, "fits done")
    sim_runs = [r for r in runs if args.runs is None or args.runs in r.short_id]
    table = simulate(models, sim_runs, stages, setup, args.work)
    record_machine(args.work, "end")
    res = {"blis": table.to_dict("records"), "replay": replay_table(preds).to_dict("records"),
           "fits": fits, "machine": machine_line(args.work),
           "what": (f"{len(sim_runs)} normal runs, BLIS commit `{setup.commit}`; each fit "
                    "calibrated "
                    "on the real step rows, the Splitwise rows and the client means of the 12 "
                    "normal runs; terms: additive `" + ", ".join(model_terms("additive"))
                    + "`, regime the same plus `compute_over_2w, compute_over_6w`. The BLIS "
                    f"point is the posterior mean, pooled over {POINT_SEEDS} arrival "
                    "realizations; rows measured faster than the GPU's peak compute are "
                    "dropped by the fits ("
                    + "; ".join(f"{k}: {v}" for k, v in fits['regime']['dropped'].items())
                    + ").")}
    table.to_csv(args.out.with_suffix(".csv"), index=False, float_format="%.6g")
    atomic_write_text(args.out.with_suffix(".md"), render(res))
    print(f"wrote {args.out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
