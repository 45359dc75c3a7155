"""Held-out real rows: calibration of the 90% predictive bands at the package's fit defaults.

The goal is calibrated, not just covered: the 90% predictive bands of held-out real iterations
should cover 85-95%. This refits the real-data study's cross-validation splits
(``study.realdata.define_splits``: each holds out one experiment, i.e. one configuration's rows)
exactly as ``bayes-latency fit`` does (the 11 default terms, 2 x 2000 draws after 1000 tuning
steps, sampling on until the convergence gates pass), predicts the held-out rows
(``LatencyModel.sample_posterior_predictive``, 200 draws) and reports:

- per split: rows, MdAPE of the predictive median, share of rows inside the 90% band, the fit's
  convergence, and the held-out rows' median observed / predicted ratio (the configuration's
  whole-step error, which decides most of a split's coverage: its rows share it);
- the mean of the per-split coverages (what ``results/real/README.md`` reports) and the share of
  all held-out iteration rows and of all held-out benchmark rows inside their bands.

It fits the real fleet with its client means without each traced run in turn and predicts the
run's iterations as a new run of its configuration (``benchmarks/heldout_runs.py``).

It also fits the real data without some iterations of the two real vLLM runs, whose
configurations the fit then still sees (:func:`within_run_masks`: blocks of consecutive
iterations, and each run's last third, at a heavier load than any fitted step of the run), and
reports the coverage of their bands by run and phase, and how many held-out iterations lie inside
the 5-95% range of the fitted iterations' own residuals (:func:`training_range_coverage`: what a
noise model that does not change along a run could cover at best, given what the fit saw).

The noise model's load covariate (``bayes_latency.model.definition.likelihood.NOISE_LOADS``) is
``--noise-load`` for every fit above (default: the package default); ``--compare`` fits the two
within-run splits once per listed covariate and writes one table of them side by side
(:func:`compare_noise_loads`): held-out coverage, band width, MdAPE, the held-out rows' log
predictive density, and PSIS-LOO (``arviz_stats.loo``) of each fit's pointwise log-likelihood.

Usage::

    python benchmarks/heldout_real.py [--reuse DIR] [--work DIR] [--out PREFIX]
        [--noise-load NAME] [--compare NAME,NAME,...] [--within-only] [--keep-within]

``--work`` keeps the per-row bands (``held.csv``, ``within_held.csv``, ``loro_held.csv``; the
within-run splits' fitted iterations in ``within_fitted.csv``), the per-split metrics
(``cv.csv``) and the fits'
convergence (``conv.csv``, ``within_conv.csv``); ``--reuse DIR`` renders the report from such a
folder without fitting. Outputs: ``PREFIX.md`` and ``PREFIX.json`` (default
``results/benchmarks/heldout_real``). Needs the real data (``../shared/data/real``); about 40 min
on 2 shared cores (8 within-run fits 16 min, the 2 leave-one-run-out calibrations 12 min, the 8
cross-validation fits 12 min).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bayes_latency.checks.diagnostics import _markdown_table  # noqa: E402
from benchmarks._provenance import machine_line, record_machine  # noqa: E402
from benchmarks.heldout_noise import (  # noqa: E402, F401 - the comparison's pieces re-exported
    CV_LABEL,
    compare_noise_loads,
    cv_metrics,
    fit_scores,
    variant_dir,
    within_metrics,
)
from benchmarks.heldout_runs import report_loro, run_loro  # noqa: E402


def settings_for(noise_load: str) -> object:
    """The CLI fit settings (``study.settings.CLI_FIT``) with the noise load covariate."""
    import dataclasses

    from bayes_latency.study.settings import CLI_FIT

    return dataclasses.replace(CLI_FIT, noise_load=noise_load)


def run(work: Path, noise_load: str, compare: list[str], with_cv: bool = True,
        keep_within: bool = False) -> None:
    from bayes_latency.physics.basis import DEFAULT_TERMS
    from bayes_latency.study.cv import run_cv
    from bayes_latency.study.realdata import define_splits, load_real_data, real_data_dir

    d = real_data_dir()
    if d is None:
        sys.exit("real data not found (../shared/data/real or $BAYES_LATENCY_REAL_DATA)")
    data = load_real_data(d)
    work.mkdir(parents=True, exist_ok=True)
    record_machine(work, "start")
    for v in dict.fromkeys([noise_load, *compare]):
        d = variant_dir(work, v, noise_load)
        if keep_within and (d / "within_held.csv").exists() and (d / "within_conv.csv").exists():
            print(f"[heldout] noise load {v!r}: within-run files kept from {d}", flush=True)
            continue
        run_within(data.observations, d, v)
    (work / "compare.json").write_text(json.dumps({"chosen": noise_load,
                                                   "compare": list(compare)}))
    if not with_cv:
        record_machine(work, "end")
        return
    if not (keep_within and (work / "loro_held.csv").exists()):
        run_loro(data, work)
    cv, held, convs, _ = run_cv(data, define_splits(data.observations),
                                settings_for(noise_load), terms=DEFAULT_TERMS)
    cv.to_csv(work / "cv.csv", index=False)
    held.to_csv(work / "held.csv", index=False)
    pd.DataFrame([{k: v for k, v in c.items() if not isinstance(v, (list, dict))}
                  for c in convs]).to_csv(work / "conv.csv", index=False)
    record_machine(work, "end")


#: Consecutive iterations per block of the ``blocks`` within-run split.
BLOCK = 25
#: Share of a real run's last steps that its last (20 req/s) load stage takes, for the
#: host-bound steps' section.
LATE_SHARE = 0.4


def within_run_masks(obs: pd.DataFrame) -> dict[str, np.ndarray]:
    """Held-out masks of iterations of configurations the fit still sees (both real vLLM runs
    at once; every other row stays in the fit):

    - ``blocks``: every third block of :data:`BLOCK` consecutive iterations of each run
      (held-out steps from the same load stages as the fitted ones);
    - ``later third``: each run's last third of iterations (by step index): the runs raise
      their request rate stage by stage, so this asks for steps under a heavier load than any
      fitted one of the run.
    """
    it = (obs["kind"] == "iteration").to_numpy()
    step = obs["step_first"].to_numpy(dtype=float)
    exp = obs["experiment_id"].to_numpy()
    blocks = np.zeros(len(obs), bool)
    later = np.zeros(len(obs), bool)
    for e in pd.unique(exp[it]):
        m = it & (exp == e)
        idx = np.flatnonzero(m)
        rank = np.argsort(np.argsort(step[idx], kind="stable"), kind="stable")
        blocks[idx] = (rank // BLOCK) % 3 == 2
        later[idx] = step[idx] > np.quantile(step[idx], 2.0 / 3.0)
    return {"blocks": blocks, "later third": later}


def run_within(obs: pd.DataFrame, work: Path, noise_load: str) -> None:
    """Fit without each within-run split's iterations (noise load covariate ``noise_load``)
    and keep their 90% / 50% bands and the fits' scores (:func:`fit_scores`)."""
    from bayes_latency.physics.basis import DEFAULT_TERMS
    from bayes_latency.study.cv import fit_ours, ours_predictions

    work.mkdir(parents=True, exist_ok=True)
    held, fitted, convs = [], [], []
    for name, mask in within_run_masks(obs).items():
        train, test = obs[~mask], obs[mask].reset_index(drop=True)
        print(f"[heldout] within-run split {name!r} (noise load {noise_load!r}): {len(train)} "
              f"training rows, {len(test)} held out", flush=True)
        m, conv = fit_ours(train, settings_for(noise_load), DEFAULT_TERMS)
        conv.update(fit=f"within: {name}", noise_load=noise_load, **fit_scores(m, test))
        convs.append({k: v for k, v in conv.items() if not isinstance(v, (list, dict))})
        cols = ["obs_id", "experiment_id", "config_id", "phase"]
        band = ours_predictions(m, test)
        held.append(pd.concat([test[cols], band], axis=1).assign(
            split=name, observed_us=test["value_us"].to_numpy(),
            batch=test["x_per_request"].to_numpy()))
        # the same runs' fitted iterations, predicted by the same fit: their residuals are what
        # the fit saw of the runs' scatter (:func:`training_range_coverage`)
        seen = train[train["kind"] == "iteration"].reset_index(drop=True)
        fitted.append(pd.concat([seen[cols], ours_predictions(m, seen)], axis=1).assign(
            split=name, observed_us=seen["value_us"].to_numpy(),
            batch=seen["x_per_request"].to_numpy()))
    pd.concat(held).to_csv(work / "within_held.csv", index=False)
    pd.concat(fitted).to_csv(work / "within_fitted.csv", index=False)
    pd.DataFrame(convs).to_csv(work / "within_conv.csv", index=False)


def _with_residuals(t: pd.DataFrame) -> pd.DataFrame:
    """``t`` with ``r = log(observed / predictive median)`` and ``run`` (the configuration's
    model)."""
    return t.assign(r=np.log(t["observed_us"].to_numpy(float)
                             / t["pred_median_us"].to_numpy(float)),
                    run=t["config_id"].str.split("|").str[0])


def training_range_coverage(fitted: pd.DataFrame, held: pd.DataFrame) -> pd.DataFrame:
    """Share of held-out iterations whose residual lies inside the central 90% range of the
    fitted iterations' own residuals, per (split, run, phase).

    Residual: ``log(observed / predictive median)`` of the same fit. The fitted rows' residuals
    are everything the fit saw of a run's step scatter, so their 5-95% range is the band a
    noise model that does not change along the run can at best give (it is what an ideal,
    distribution-free noise model fitted to those rows would give): held-out rows outside it
    scatter more than anything the fit saw of their run and phase.
    """
    f, h = _with_residuals(fitted), _with_residuals(held)
    rows = []
    for (sp, run, ph), hh in h.groupby(["split", "run", "phase"], sort=False):
        ff = f[(f["split"] == sp) & (f["run"] == run) & (f["phase"] == ph)]
        lo, hi = np.quantile(ff["r"], [0.05, 0.95])
        rows.append({"split": sp, "run": run, "phase": ph, "n_fitted": len(ff), "n": len(hh),
                     "fitted_q05": round(float(lo), 4), "fitted_q95": round(float(hi), 4),
                     "inside_fitted_range": round(float(((hh["r"] >= lo)
                                                          & (hh["r"] <= hi)).mean()), 3),
                     "coverage90": round(float(hh["in_90"].mean()), 3),
                     "held_q05": round(float(np.quantile(hh["r"], 0.05)), 4),
                     "held_q95": round(float(np.quantile(hh["r"], 0.95)), 4)})
    return pd.DataFrame(rows)


#: Batch-size bins (requests in the step) of :func:`scatter_by_batch`.
BATCH_BINS = (0, 40, 80, 100, 128)


def scatter_by_batch(fitted: pd.DataFrame, held: pd.DataFrame) -> pd.DataFrame:
    """Scaled MAD of the decode iterations' residuals (``log(observed / predictive median)``)
    by split, run and batch-size bin, fitted rows against held-out rows: whether the held-out
    rows' wider scatter is that of larger batches the fit also saw.

    Rows in the order splits and runs first appear, bins in increasing order; a bin of fewer
    than 5 rows has no MAD.
    """
    from bayes_latency.checks.host_overhead import _mad

    t = pd.concat([_with_residuals(fitted).assign(rows="fitted"),
                   _with_residuals(held).assign(rows="held out")], ignore_index=True)
    t = t[t["phase"] == "decode"]
    t = t.assign(split=pd.Categorical(t["split"], pd.unique(t["split"])),
                 run=pd.Categorical(t["run"], pd.unique(t["run"])),
                 batch=pd.cut(t["batch"], BATCH_BINS))
    g = t.groupby(["split", "run", "batch", "rows"], observed=True)["r"]
    long = pd.DataFrame({"n": g.size(), "scaled_mad": g.agg(
        lambda r: round(_mad(r.to_numpy()), 4) if len(r) >= 5 else np.nan)})
    wide = long.unstack("rows")
    wide.columns = [f"{a}_{b.replace(' ', '_')}" for a, b in wide.columns]
    wide = wide.reset_index()
    wide[["split", "run", "batch"]] = wide[["split", "run", "batch"]].astype(str)
    return wide


def host_lines() -> tuple[dict[str, bool], list[str]]:
    """``obs_id -> host_bound`` of the real iterations and the markdown of their host-overhead
    table (:mod:`bayes_latency.checks.host_overhead`); empty without the real data."""
    from bayes_latency.checks.host_overhead import host_overhead_and_mask
    from bayes_latency.study.real import load_real_data, real_data_dir

    d = real_data_dir()
    if d is None:
        return {}, []
    data = load_real_data(d)
    it = data.iterations
    t, hot = host_overhead_and_mask(it)
    flags = dict(zip(it["obs_id"], hot, strict=True))
    t["run"] = t["experiment_id"].str.split("-", n=2).str[2]
    # where the host-bound steps are: the last LATE_SHARE of each run's steps (its last stage)
    in_late, late_hot, early_hot = [], [], []
    for e in pd.unique(it["experiment_id"]):
        m = (it["experiment_id"] == e).to_numpy()
        step = it["step_id"].to_numpy(dtype=float)[m]
        late = step > np.quantile(step, 1.0 - LATE_SHARE)
        h = hot[m]
        in_late.append(h[late].sum() / max(h.sum(), 1))
        late_hot.append(h[late].mean())
        early_hot.append(h[~late].mean())

    def rng(v: list[float] | pd.Series, scale: float = 100.0, fmt: str = ".0f") -> str:
        lo, hi = float(np.min(v)) * scale, float(np.max(v)) * scale
        return f"{lo:{fmt}}" if f"{lo:{fmt}}" == f"{hi:{fmt}}" else f"{lo:{fmt}}-{hi:{fmt}}"
    cols = ["run", "n_steps", "n_host_bound", "host_bound_fraction", "first_host_bound_step",
            "batch_median_quiet", "batch_median_host_bound", "cpu_ms_median_quiet",
            "cpu_ms_median_host_bound", "cpu_ms_expected_host_bound", "iteration_ms_median_quiet",
            "iteration_ms_median_host_bound", "log_mad_quiet", "log_mad_host_bound"]
    lines = ["## Host-bound steps (`checks/host_overhead.py`)", "",
             "A step is host-bound when its `schedule()` CPU time (`step.duration_us`) is 3x or "
             "more what the run's quiet steps predict for its batch size, and the excess is over "
             f"5% of the iteration. On both real runs {rng(in_late)}% of them are in the last "
             f"{LATE_SHARE:.0%} of the run (the 20 req/s stage; {rng(late_hot)}% of its steps are "
             f"host-bound, {rng(early_hot)}% before): `schedule()` takes "
             f"{rng(t['cpu_ms_median_host_bound'], 1, '.1f')} ms where "
             f"{rng(t['cpu_ms_expected_host_bound'], 1, '.1f')} ms is "
             "expected, and the decode iterations scatter more (`log_mad_*`: scaled MAD of "
             "log iteration time over decode-only steps of the group's middle batch sizes). "
             "They are what the bands cover least (by step class above), but not because they "
             "are slower: at a matched batch size their decode iterations take the same time as "
             "quiet ones (the extra CPU time overlaps the forward pass; `checks/host_overhead.py`), "
             "so they are the heavy-load steps, with a wider spread. The busy host shows in the "
             "time before a request reaches the engine, which BLIS's per-request alphas cannot "
             "follow: the TTFT misses at 20 req/s in `results/real/client/README.md`.", "",
             _markdown_table(t[cols].round(4)), ""]
    return flags, lines


def report_within(work: Path) -> tuple[dict, list[str]]:
    """Summary and markdown lines of the within-run splits (empty without their files)."""
    if not (work / "within_held.csv").exists():
        return {}, []
    h = pd.read_csv(work / "within_held.csv")
    conv = pd.read_csv(work / "within_conv.csv")
    h["run"] = h["config_id"].str.split("|").str[0]
    flags, host_md = host_lines()
    h["host_bound"] = h["obs_id"].map(flags).fillna(False).astype(bool) if flags else False
    res, rows = {}, []
    for sp, g in h.groupby("split", sort=False):
        c = conv[conv["fit"] == f"within: {sp}"].iloc[0]
        res[sp] = {"n": len(g), "coverage90": float(g["in_90"].mean()),
                   "coverage50": float(g["in_50"].mean()),
                   "mdape_pct": float(np.median(np.abs(g["pred_median_us"] / g["observed_us"] - 1))
                                      * 100),
                   "max_rhat": float(c["max_rhat"]), "min_ess_bulk": float(c["min_ess_bulk"]),
                   "divergences": int(c["divergences"])}
        for hb, gg in g.groupby("host_bound"):
            res[sp]["host_bound" if hb else "quiet"] = {
                "n": len(gg), "coverage90": float(gg["in_90"].mean()),
                "coverage50": float(gg["in_50"].mean())}
        for (run, ph), gg in g.groupby(["run", "phase"]):
            rows.append({"split": sp, "run": run, "phase": ph, "n": len(gg),
                         "coverage90": round(float(gg["in_90"].mean()), 3),
                         "coverage50": round(float(gg["in_50"].mean()), 3),
                         "median_obs_over_pred": round(float(np.median(gg["observed_us"]
                                                                       / gg["pred_median_us"])), 3),
                         "median_band_rel_width": round(float(np.median(
                             (gg["q95_us"] - gg["q05_us"]) / gg["pred_median_us"])), 3)})
    lines = ["## Held-out iterations of configurations the fit sees", "",
             "Both real vLLM runs' iterations held out at once, every other row fitted (same fit "
             "settings): `blocks` holds out every third block of "
             f"{BLOCK} consecutive iterations of each run (steps from the load stages the fit "
             "sees); `later third` each run's last third (the runs raise their request rate "
             "stage by stage: steps under a heavier load than any fitted one of the run).", ""]
    for sp, r in res.items():
        lines.append(f"- `{sp}`: **{r['coverage90']:.3f}** of {r['n']} inside their 90% band, "
                     f"{r['coverage50']:.3f} inside their 50% band; MdAPE {r['mdape_pct']:.1f}%; "
                     f"fit R-hat {r['max_rhat']:.4f}, ESS {r['min_ess_bulk']:.0f}, "
                     f"{r['divergences']} divergences.")
        parts = [f"{k} steps {r[k]['coverage90']:.3f} of {r[k]['n']} ({r[k]['coverage50']:.3f} "
                 "in the 50% band)" for k in ("quiet", "host_bound") if k in r]
        if parts:
            lines.append(f"  - 90% coverage by step class: {'; '.join(parts)}.")
    lines += ["", _markdown_table(pd.DataFrame(rows)), ""]
    if (work / "within_fitted.csv").exists():
        fitted = pd.read_csv(work / "within_fitted.csv")
        tr = training_range_coverage(fitted, h)
        for sp, g in tr.groupby("split", sort=False):
            res[sp]["inside_fitted_range"] = float((g["inside_fitted_range"] * g["n"]).sum()
                                                   / g["n"].sum())
        lines += ["### What the fitted rows say of the held-out rows' scatter", "",
                  "Residual: log(observed / predictive median) of the split's fit. "
                  "`inside_fitted_range`: share of the held-out iterations whose residual lies "
                  "within the 5-95% range of the same run's and phase's *fitted* iterations' "
                  "residuals (`fitted_q05`, `fitted_q95`): the band an ideal noise model that "
                  "does not change along the run could give from what the fit saw. "
                  "`held_q05` / `held_q95`: the held-out residuals' own range.", "",
                  *(f"- `{sp}`: {r['inside_fitted_range']:.3f} of the held-out iterations inside "
                    f"the fitted iterations' range (the model's 90% bands: "
                    f"{r['coverage90']:.3f})." for sp, r in res.items()
                    if "inside_fitted_range" in r),
                  "", _markdown_table(tr), ""]
        if "batch" in fitted and "batch" in h:
            lines += ["Decode iterations' residual scatter (scaled MAD) by the number of "
                      "requests in the step, fitted against held-out rows of the same split "
                      "(bins of fewer than 5 rows left blank):", "",
                      _markdown_table(scatter_by_batch(fitted, h)), ""]
    lines += host_md
    return res, lines


def report(work: Path, out: Path) -> dict:
    cv = pd.read_csv(work / "cv.csv")
    held = pd.read_csv(work / "held.csv")
    conv = pd.read_csv(work / "conv.csv")
    ours = cv[(cv["method"] == "ours") & (cv["subset"] == "all")].set_index("split")
    rows = []
    for sp, g in held.groupby("split", sort=False):
        ratio = g["observed_us"] / g["pred_median_us"]
        c = conv[conv["fit"] == f"cv: {sp}"].iloc[0] if "fit" in conv else None
        rows.append({
            "split": sp, "kind": g["kind"].iloc[0], "n": len(g),
            "mdape_pct": float(ours.loc[sp, "mdape_pct"]),
            "coverage90": float(g["in_90"].mean()),
            "coverage50": float(g["in_50"].mean()),
            "median_obs_over_pred": float(np.median(ratio)),
            "median_band_rel_width": float(np.median((g["q95_us"] - g["q05_us"])
                                                     / g["pred_median_us"])),
            "max_rhat": float(c["max_rhat"]) if c is not None else np.nan,
            "min_ess_bulk": float(c["min_ess_bulk"]) if c is not None else np.nan,
            "divergences": int(c["divergences"]) if c is not None else -1,
            "draws": int(c["draws"]) if c is not None and "draws" in c else -1,
        })
    t = pd.DataFrame(rows)
    if (t["draws"] < 0).all():  # a --work folder written before the column existed
        t = t.drop(columns="draws")
    it = held[held["kind"] == "iteration"]
    bench = held[held["kind"] != "iteration"]
    within, within_lines = report_within(work)
    loro, loro_lines = report_loro(work)
    comp, comp_lines = compare_noise_loads(work, host_lines()[0])
    res = {
        "within_run": within,
        "leave_one_run_out": loro,
        "mean_split_coverage90": float(t["coverage90"].mean()),
        "median_split_mdape_pct": float(t["mdape_pct"].median()),
        "pooled_iteration_coverage90": float(it["in_90"].mean()) if len(it) else np.nan,
        "pooled_iteration_coverage50": float(it["in_50"].mean()) if len(it) else np.nan,
        "iteration_rows": len(it),
        "pooled_benchmark_coverage90": float(bench["in_90"].mean()) if len(bench) else np.nan,
        "benchmark_rows": len(bench),
        "pooled_all_coverage90": float(held["in_90"].mean()),
        "all_rows": len(held),
        "fits_passing_gates": int(conv["passed"].sum()) if "passed" in conv else -1,
        "fits": len(conv),
        "splits": t.to_dict(orient="records"),
        "noise_loads_compared": comp.to_dict(orient="records"),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1) + "\n")
    lines = [
        "# Held-out real rows: 90% predictive bands at the fit defaults", "",
        "Regenerate: `python benchmarks/heldout_real.py` (refits the 8 cross-validation splits of "
        "the real-data study as `bayes-latency fit` does: 11 default terms, 2 x 2000 draws after "
        "1000 tuning steps, sampling on until the convergence gates pass; 200 predictive draws "
        "per held-out row).", *(["", machine_line(work)] if machine_line(work) else []), "",
        f"- Fits passing the convergence gates: {res['fits_passing_gates']} of {res['fits']}.",
        f"- Mean of the per-split 90% coverages: **{res['mean_split_coverage90']:.3f}** "
        f"(median per-split MdAPE {res['median_split_mdape_pct']:.1f}%).",
        f"- Held-out **iteration** rows of a held-out configuration (each real vLLM run in turn): "
        f"**{res['pooled_iteration_coverage90']:.3f}** of {res['iteration_rows']} inside their "
        f"90% band ({res['pooled_iteration_coverage50']:.3f} inside their 50% band).",
        f"- Held-out benchmark rows (Splitwise means): {res['pooled_benchmark_coverage90']:.3f} of "
        f"{res['benchmark_rows']}; all rows: {res['pooled_all_coverage90']:.3f} of "
        f"{res['all_rows']}.",
        *(["- One traced run held out, its configuration seen through its other runs' client "
           "means: " + "; ".join(f"`{k}` **{v['coverage90']:.3f}** of {v['n']} iterations inside "
                                 f"their 90% band (median width {v['median_band_rel_width']:.3f})"
                                 for k, v in loro.items() if k not in ("splits", "failed"))
           + (f" (fits that failed the convergence gates left out: {', '.join(loro['failed'])})"
              if loro.get("failed") else "") + "."] if loro else []),
        *(["- Held-out iterations of configurations the fit sees (both runs, see the last "
           "section): " + "; ".join(f"`{k}` **{v['coverage90']:.3f}** of {v['n']} inside their "
                                     f"90% band ({v['coverage50']:.3f} inside their 50% band)"
                                     for k, v in within.items()) + "."] if within else []),
        "", "## One configuration held out", "",
        "Each split holds out one configuration, so its rows share that configuration's "
        "whole-step error (`median_obs_over_pred`): a split's coverage is near 1 when that "
        "error is inside the band and low when it is not. Eight splits are eight draws of that "
        "event: with bands that hold a configuration's error 90% of the time, 2 or more misses "
        "out of 8 happen with probability 19%.", "",
        _markdown_table(t.round(4)), ""]
    low = t[t["coverage90"] < 0.85]
    wide = t[(t["coverage90"] > 0.95) & (t["coverage50"] > 0.7)]
    if len(low) or len(wide):
        lines += ["Where the bands miss the target:", ""]
    for _, r in low.iterrows():
        lines.append(f"- `{r['split']}`: {r['coverage90']:.2f} inside; observed / predicted "
                     f"{r['median_obs_over_pred']:.2f} against a band {r['median_band_rel_width']:.2f}"
                     " of the median wide: too narrow for this configuration's error.")
    for _, r in wide.iterrows():
        lines.append(f"- `{r['split']}`: {r['coverage90']:.2f} inside ({r['coverage50']:.2f} "
                     "inside the 50% band) with a band "
                     f"{r['median_band_rel_width']:.2f} of the median wide, for an observed / "
                     f"predicted ratio of {r['median_obs_over_pred']:.2f}: wider than needed.")
    lines.append("")
    lines += loro_lines + comp_lines + within_lines
    out.with_suffix(".md").write_text("\n".join(lines))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reuse", type=Path, default=None, help="render from a --work folder")
    ap.add_argument("--work", type=Path, default=Path("/tmp/heldout_real"))
    ap.add_argument("--out", type=Path, default=ROOT / "results/benchmarks/heldout_real")
    from bayes_latency.model.definition.likelihood import DEFAULT_NOISE_LOAD, NOISE_LOADS

    ap.add_argument("--noise-load", default=DEFAULT_NOISE_LOAD, choices=sorted(NOISE_LOADS),
                    help="load covariate of the noise scale of every fit (default: the package's)")
    ap.add_argument("--compare", default="none,batch,batch-growth,kv",
                    help="comma-separated covariates the within-run splits are also fitted with "
                         "('' for none)")
    ap.add_argument("--within-only", action="store_true",
                    help="fit the within-run splits only (no cross-validation splits)")
    ap.add_argument("--keep-within", action="store_true",
                    help="keep the within-run files of a covariate already in --work (made by "
                         "this code, e.g. by --within-only) instead of refitting them")
    args = ap.parse_args()
    compare = [c for c in args.compare.split(",") if c]
    for c in compare:
        if c not in NOISE_LOADS:
            ap.error(f"--compare: unknown noise load {c!r}; expected {sorted(NOISE_LOADS)}")
    work = args.reuse or args.work
    if args.reuse is None:
        run(work, args.noise_load, compare, with_cv=not args.within_only,
            keep_within=args.keep_within)
    if not (work / "cv.csv").exists():  # within-run splits only: the comparison
        print(compare_noise_loads(work)[0].round(4).to_string())
        return
    res = report(work, args.out)
    print(json.dumps({k: v for k, v in res.items() if k != "splits"}, indent=1))


if __name__ == "__main__":
    main()
