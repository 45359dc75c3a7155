"""Leave one traced run out: a whole real run predicted as a new run of a configuration the fit sees.

Part of ``benchmarks/heldout_real.py``. The two traced real runs (Llama-2-70B TP4 and
CodeLlama-34B TP2, ``general`` workload) are also client runs of the lifecycle data, whose other
runs of the same configuration (``codegen``, ``roleplay``) are client means only. Each split
fits the real step and benchmark rows plus the client rows of the 12 normal runs
(:func:`bayes_latency.study.client.runs.calibrated_fit`, the ``study client`` fit, 6 terms),
without any row of the held-out run (its steps and its client means), then predicts the run's
iterations (``sample_posterior_predictive``, 400 draws) twice:

- ``new run``: the package's prediction for a run it did not fit, the configuration's
  coefficients times the shift of a new run, ``exp(N(0, sigma_run^2 (1 + 1/n)))``
  (:mod:`bayes_latency.model.posterior.shifts`);
- ``configuration``: the configuration's coefficients alone (``run="configuration"``), the bands
  of a model without run effects.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

#: Predictive draws per held-out iteration.
N_DRAWS = 400
#: The two predictions of each split (``run=`` of ``sample_posterior_predictive``) and their labels.
MODES = {"auto": "new run", "configuration": "configuration"}


def traced_runs(obs: pd.DataFrame) -> list[str]:
    """The run ids of the real runs with iteration rows."""
    return sorted(obs.loc[obs["kind"] == "iteration", "run_id"].astype(str).unique())


def run_loro(data: object, work: Path, log: object = print) -> None:
    """Fit without each traced run and keep its iterations' bands (``loro_held.csv``) and the
    fits' convergence and run scale (``loro_conv.csv``)."""
    from bayes_latency.checks.ppc import band_summary
    from bayes_latency.study.blis.spec import find_runs
    from bayes_latency.study.client.blis import START_FIT
    from bayes_latency.study.client.runs import calibrated_fit, client_stages
    from bayes_latency.study.realdata import real_data_dir
    from bayes_latency.study.settings import CLI_FIT, REAL_TERMS

    obs = data.observations
    stages = client_stages(find_runs(real_data_dir()))
    held, convs = [], []
    for rid in traced_runs(obs):
        t0 = time.perf_counter()
        base = obs[obs["run_id"].astype(str) != rid].reset_index(drop=True)
        test = obs[(obs["run_id"].astype(str) == rid)
                   & (obs["kind"] == "iteration")].reset_index(drop=True)
        keep = [s for s in stages if s.run_id != rid]
        log(f"[heldout] run {rid} out: {len(base)} step and benchmark rows, {len(keep)} client "
            f"stages; {len(test)} iterations held out")
        cal = calibrated_fit(base, keep, CLI_FIT, REAL_TERMS, start_settings=START_FIT, log=log)
        m = cal.model
        conv = m.convergence()
        post = m.result["posterior"]
        sig = np.asarray(post["sigma_run"].values).ravel() if "sigma_run" in post else np.zeros(1)
        convs.append({"run": rid, "max_rhat": conv["max_rhat"],
                      "min_ess_bulk": conv["min_ess_bulk"], "divergences": conv["divergences"],
                      "passed": conv["passed"], "sigma_run_mean": float(sig.mean()),
                      "sigma_run_q05": float(np.quantile(sig, 0.05)),
                      "sigma_run_q95": float(np.quantile(sig, 0.95)),
                      "calibration_converged": bool(cal.converged),
                      "wall_s": time.perf_counter() - t0})
        for mode, label in MODES.items():
            draws = m.sample_posterior_predictive(test, n_draws=N_DRAWS, seed=0, run=mode)
            b = band_summary(draws.values, test["value_us"].to_numpy(float))
            held.append(pd.concat([test[["obs_id", "config_id", "phase"]], b], axis=1).assign(
                run=rid, prediction=label, run_status=draws["run_status"].values))
    pd.concat(held).to_csv(work / "loro_held.csv", index=False)
    pd.DataFrame(convs).to_csv(work / "loro_conv.csv", index=False)


def report_loro(work: Path) -> tuple[dict, list[str]]:
    """Summary and markdown lines of the leave-one-run-out splits (empty without their files)."""
    from bayes_latency.checks.diagnostics import _markdown_table

    if not (work / "loro_held.csv").exists():
        return {}, []
    h = pd.read_csv(work / "loro_held.csv")
    conv = pd.read_csv(work / "loro_conv.csv").set_index("run")
    rows = []
    for (run, pred), g in h.groupby(["run", "prediction"], sort=False):
        c = conv.loc[run]
        rows.append({"run": run, "prediction": pred, "n": len(g),
                     "coverage90": round(float(g["in_90"].mean()), 3),
                     "coverage50": round(float(g["in_50"].mean()), 3),
                     "mdape_pct": round(float(g["ape"].median()), 2),
                     "median_band_rel_width": round(float(np.median(
                         (g["q95_us"] - g["q05_us"]) / g["pred_median_us"])), 4),
                     "median_obs_over_pred": round(float(np.median(
                         g["observed_us"] / g["pred_median_us"])), 4),
                     "sigma_run": round(float(c["sigma_run_mean"]), 4),
                     "max_rhat": round(float(c["max_rhat"]), 4),
                     "min_ess_bulk": round(float(c["min_ess_bulk"]), 0)})
    t = pd.DataFrame(rows)
    res = {"splits": t.to_dict(orient="records")}
    failed = [str(r) for r, c in conv.iterrows() if not bool(c["passed"])]
    ok = h[~h["run"].astype(str).isin(failed)]
    for pred, g in ok.groupby("prediction", sort=False):
        res[pred] = {"n": len(g), "coverage90": float(g["in_90"].mean()),
                     "median_band_rel_width": float(np.median(
                         (g["q95_us"] - g["q05_us"]) / g["pred_median_us"]))}
    lines = ["## One traced run held out, predicted as a new run", "",
             "Each split fits the real step and benchmark rows and the client means of the 12 "
             "normal lifecycle runs (the `study client` fit, 6 terms, calibrated) without any row "
             "of one traced run (its iterations and its client means); the configuration stays "
             "in the fit through its other runs' client means. The run's iterations are predicted "
             "as a `new run` (the configuration's coefficients times a new run's shift, "
             "`exp(N(0, sigma_run^2 (1 + 1/n)))`; `sigma_run` is fitted from the other traced "
             "configuration, its traced run against its other runs' client means, which share "
             "one shift: `model.definition.runs.MIN_RUN_ROWS`) and, for comparison, with the `configuration`'s coefficients alone (the "
             "bands of a model without run effects). The fits of the other sections repeat no "
             "configuration (each is one run): they have no `sigma_run`, and their predictions "
             "are the configurations', as without run effects.", ""]
    for pred, r in res.items():
        if pred not in ("splits", "failed"):
            lines.append(f"- `{pred}`: **{r['coverage90']:.3f}** of {r['n']} iterations inside "
                         f"their 90% band, median band width {r['median_band_rel_width']:.3f} "
                         "of the median (splits whose fit passed the convergence gates).")
    if failed:
        res["failed"] = failed
        lines.append("- Fits that failed the convergence gates (their rows of the table come from "
                     "a posterior that did not converge, and are left out above): "
                     + ", ".join(f"without `{r}` (max R-hat {conv.loc[r, 'max_rhat']:.2f}, min "
                                 f"bulk ESS {conv.loc[r, 'min_ess_bulk']:.0f})" for r in failed)
                     + ".")
    sig = conv[["sigma_run_mean", "sigma_run_q05", "sigma_run_q95"]].round(4)
    lines += ["", _markdown_table(t), "",
              "`sigma_run` of each split's fit (posterior mean, 5% and 95%): "
              + "; ".join(f"without {r}: {v['sigma_run_mean']:.4f} ({v['sigma_run_q05']:.4f}-"
                          f"{v['sigma_run_q95']:.4f})" for r, v in sig.iterrows()) + ".", ""]
    return res, lines
