"""Few-shot calibration that borrows from the fleet, measured in BLIS.

``bayes-latency study fewshot --blis PATH --out results/real`` (see :func:`main`). For each real
model in turn, every row of that model out of the fleet:

* **population**: the fleet without the model (real H100 step rows, Splitwise benchmark rows and
  the client rows of the other models' normal runs, at the schedule the client study
  calibrated: ``OUT/client/observations.parquet`` of ``bayes-latency study client``) is fitted
  and its population kept (:func:`~bayes_latency.model.fleet.population_from_result`);
* **zero-shot**: the model's normal runs predicted from that population alone (its
  configuration's coefficients drawn as an unseen configuration's);
* **one-shot**: the client rows of ONE of its normal runs calibrated under the population
  (:func:`~bayes_latency.study.client.calibrated_fit` with ``population=``), each run in turn,
  and the model's other normal runs predicted;
* **one-shot, roofline priors**: the same run calibrated with the roofline priors alone.

BLIS simulates every predicted run (open loop, as ``study client``: :func:`~bayes_latency.study.
blis.e2e.run_study`), with 90% bands from the run-level draws an export carries
(:func:`~bayes_latency.study.client_blis.sources_for`); BLIS's published coefficients run on
the same harness. Writes ``OUT/client/fewshot.md`` and ``fewshot.csv`` (one row per held-out run
x setting x shot run x source) and ``fewshot_fits.csv`` (every fit's gates and times).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bayes_latency.errors import ConfigError
from bayes_latency.io import atomic_write_text
from bayes_latency.study.markdown import _md
from bayes_latency.study.settings import CLI_FIT, REAL_TERMS, FitSettings

__all__ = ["SETTINGS", "main", "render", "summary_table"]

#: The compared settings, in the report's order.
SETTINGS = ("zero-shot", "one-shot population", "one-shot roofline", "blis-published")
QUICK_FIT = FitSettings(draws=200, tune=200)
N_DRAWS = 20
POP_LABEL = "real H100 fleet: step rows, Splitwise benchmark rows, client rows of the normal runs"


def _summ(t: pd.DataFrame) -> dict[str, float]:
    """Median |error| of the means and band coverage / width over the runs of ``t``."""
    out: dict[str, float] = {"runs": float(len(t))}
    for m in ("e2e_mean", "ttft_mean", "decode_interval"):
        e = np.abs(t[f"err_{m}"].to_numpy(float)) if len(t) else np.array([])
        out[f"median_{m}"] = float(np.nanmedian(e)) if e.size else math.nan
        out[f"max_{m}"] = float(np.nanmax(e)) if e.size else math.nan
    for m in ("e2e_mean", "ttft_mean"):
        col = f"{m}_in_band"
        if col in t and t[col].notna().any():
            ok = t[col].dropna().astype(float)
            out[f"cover_{m}"] = float(ok.mean())
            out[f"width_{m}"] = float(np.nanmedian(t[f"band_{m}_width"].to_numpy(float)))
    return out


def summary_table(table: pd.DataFrame) -> pd.DataFrame:
    """Per setting (and without the general runs, whose 20 req/s stage is host-bound): median
    |error| of mean E2E, TTFT and decode interval over held-out runs, 90% band coverage and
    median width."""
    rows = []
    for setting in SETTINGS:
        t = table[table["setting"] == setting]
        if t.empty:
            continue
        for label, part in (("all", t), ("without general runs", t[t["workload"] != "general"])):
            s = _summ(part)
            rows.append({"setting": setting, "runs": label, "n": int(s["runs"]),
                         "E2E": s["median_e2e_mean"], "TTFT": s["median_ttft_mean"],
                         "decode interval": s["median_decode_interval"],
                         "worst E2E": s["max_e2e_mean"],
                         "E2E coverage": s.get("cover_e2e_mean", math.nan),
                         "E2E band width": s.get("width_e2e_mean", math.nan),
                         "TTFT coverage": s.get("cover_ttft_mean", math.nan),
                         "TTFT band width": s.get("width_ttft_mean", math.nan)})
    return pd.DataFrame(rows)


def _pct(x: float) -> str:
    return "n/a" if not (isinstance(x, float | int) and math.isfinite(x)) else f"{100 * x:.1f}%"


def _shots_text(shots: int | None) -> str:
    """Which normal runs of a model are the one-shot runs."""
    if not shots:
        return "each in turn"
    return "its first normal run" if shots == 1 else f"each of its first {shots} normal runs"


def render(res: dict[str, Any]) -> str:
    """The study's markdown report."""
    t = res["table"]
    s = summary_table(t)
    shown = s.copy()
    for c in ("E2E", "TTFT", "decode interval", "worst E2E", "E2E coverage", "E2E band width",
              "TTFT coverage", "TTFT band width"):
        shown[c] = shown[c].map(_pct)
    lines = ["# Few-shot calibration from the fleet's population, measured in BLIS", "",
             f"Generated by `bayes-latency study fewshot{' --quick' if res['quick'] else ''}` "
             f"({res['date']}, {res['runtime_s'] / 60:.0f} min; {res['machine']}; "
             f"{res['code']}).", "",
             f"Models held out: {', '.join(res['models'])}"
             + (f" (of {', '.join(res['all_models'])}; the others were not run)"
                if res["models"] != res["all_models"] else "") + ". For each, every row of the "
             "model is out of the fleet; the population is fitted on the rest ("
             f"{POP_LABEL}, at the schedule `study client` calibrated), terms "
             f"`{', '.join(res['terms'])}`, {res['settings']}.", "",
             "- **zero-shot**: the model's normal runs predicted from the population alone "
             "(its configuration drawn as an unseen one: the unseen model's effect from the "
             "population's model scale, the GPU / TP / stack effects fitted);",
             "- **one-shot population**: `calibrate` of the client rows of one normal run of the "
             f"model ({_shots_text(res.get('shots'))}) with the population (without the model) "
             "as the prior; the model's other normal runs predicted;",
             "- **one-shot roofline**: the same run calibrated with the roofline priors alone;",
             "- **blis-published**: BLIS's published coefficients on the same harness.", "",
             "BLIS simulates every predicted run open-loop (as `study client`); the point is the "
             "export's posterior mean, the 90% band comes from "
             f"{res['n_draws']} run-level draws of the export (posterior draws x the run-to-run "
             "scatter, each with its own workload seed). Errors are of the simulated mean over "
             "the run's stages against the real one; medians over held-out runs. The general "
             "runs contain a 20 req/s stage where the serving host is the bottleneck (a delay "
             "BLIS's per-request alphas cannot follow); the rows 'without general runs' keep "
             "them apart.", "",
             "## Summary", "", _md(shown), ""]
    timing = res.get("calibrate_s") or []
    if timing:
        lines += [f"`calibrate` with the population, one result (2 load stages) on this machine: "
                  f"median {np.median(timing):.0f} s, range {min(timing):.0f}-{max(timing):.0f} s "
                  f"over {len(timing)} calibrations (the replay/fit loop: replays, fast fits, "
                  "full fits).", ""]
    detail = t[["held_out_model", "setting", "shot_run", "run", "workload", "err_e2e_mean",
                "err_ttft_mean", "err_decode_interval", "e2e_mean_in_band", "band_e2e_mean_width",
                "ttft_mean_in_band", "band_ttft_mean_width"]].copy()
    for c in ("err_e2e_mean", "err_ttft_mean", "err_decode_interval"):
        detail[c] = detail[c].map(lambda v: "n/a" if not math.isfinite(v) else f"{100 * v:+.1f}%")
    for c in ("band_e2e_mean_width", "band_ttft_mean_width"):
        detail[c] = detail[c].map(_pct)
    for c in ("e2e_mean_in_band", "ttft_mean_in_band"):
        detail[c] = detail[c].map(lambda v: "n/a" if not math.isfinite(v) else
                                  ("yes" if v else "no"))
    lines += ["## Every held-out run", "", _md(detail), "", "## Fits", "",
              _md(res["fits"].map(lambda v: f"{v:.4g}" if isinstance(v, float) else v)), ""]
    return "\n".join(lines) + "\n"


def _conv(model: Any, label: str, fit_s: float, extra: dict[str, Any] | None = None
          ) -> dict[str, Any]:
    from bayes_latency.study.client_blis import _conv_row

    return {**_conv_row(model, label, fit_s), **(extra or {})}


def main(out: str | Path, blis: str | Path | None = None, quick: bool = False,
         n_draws: int = N_DRAWS, models: Sequence[str] | None = None,
         shots: int | None = None, terms: Sequence[str] = REAL_TERMS,
         log: Callable[[str], None] = print) -> int:
    """Run the study (see the module docstring); 0 on success or when data / BLIS are absent.

    ``models``: only these held-out models (default: every real model); ``shots``: at most this
    many one-shot runs per model (default: each normal run); ``quick``: short fits, 4 draws, one
    model and one shot unless given.
    """
    from bayes_latency.calibrate.loop import client_predictions
    from bayes_latency.physics.basis import DEFAULT_TERMS
    from bayes_latency.study.blis.e2e import check_blis, run_study
    from bayes_latency.study.blis.spec import find_runs
    from bayes_latency.study.client import calibrated_fit, client_stages, drop_model
    from bayes_latency.study.client_blis import GPU, sources_for
    from bayes_latency.study.cv import fit_ours
    from bayes_latency.study.demo import _Progress
    from bayes_latency.study.realdata import real_data_dir

    t0 = time.perf_counter()
    prog = _Progress()
    data_dir = real_data_dir()
    if data_dir is None:
        log("[fewshot] real data not found: nothing to do")
        return 0
    if blis is None:
        log("[fewshot] no BLIS binary (--blis or $BLIS_BIN): nothing to do")
        return 0
    setup = check_blis(blis)
    out = Path(out) / "client"
    obs_path = out / "observations.parquet"
    if not obs_path.is_file():
        raise ConfigError(f"{obs_path}: run `bayes-latency study client --out {out.parent}` first "
                          "(its calibrated rows are the fleet)")
    observations = pd.read_parquet(obs_path)
    runs = find_runs(data_dir)
    all_models = sorted({r.model for r in runs})
    models = list(models) if models else (all_models[:1] if quick else all_models)
    bad = sorted(set(models) - set(all_models))
    if bad:
        raise ConfigError(f"unknown held-out models {bad}; the real runs have {all_models}")
    shots = shots if shots is not None else (1 if quick else None)
    settings = QUICK_FIT if quick else CLI_FIT
    n_draws = 4 if quick else n_draws
    stages = client_stages(runs)
    parts, fits, cal_s = [], [], []
    from bayes_latency.model.fleet import client_noise, population_from_result

    def simulate(model: Any, mine: list, setting: str, shot: str, replayed: Any) -> None:
        cfgs = sorted({(r.model, r.tp) for r in mine})
        src = sources_for(model, cfgs, n_draws, replayed=replayed)
        st = run_study(setup, mine, n_draws=n_draws, sources=src)
        tab = st.table.copy()
        pub = tab["source"] == "blis-published"
        tab["setting"] = np.where(pub, "blis-published", setting)
        tab["shot_run"] = np.where(pub, "", shot)
        tab["held_out_model"] = mine[0].model
        tab["workload"] = tab["run"].map({r.short_id: r.workload for r in mine})
        keep = (tab["source"] == "export-mean") | (pub & (setting == "zero-shot"))
        parts.append(tab[keep & ~tab["stress"].astype(bool)])

    def write() -> None:
        table = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
        out.mkdir(parents=True, exist_ok=True)
        table.to_csv(out / "fewshot.csv", index=False, float_format="%.6g")
        fit_t = pd.DataFrame(fits)
        fit_t.to_csv(out / "fewshot_fits.csv", index=False, float_format="%.6g")
        if table.empty:
            return
        res = {"table": table, "fits": fit_t, "quick": quick, "models": models,
               "all_models": all_models, "terms": list(terms), "settings": settings.describe(),
               "shots": shots,
               "n_draws": n_draws, "calibrate_s": cal_s, "runtime_s": time.perf_counter() - t0,
               "date": time.strftime("%Y-%m-%d"), "machine": prog.machine(),
               "code": _code()}
        atomic_write_text(out / "fewshot.md", render(res))

    for name in models:
        mine = [r for r in runs if r.model == name and not r.stress]
        t = time.perf_counter()
        m_pop, _ = fit_ours(drop_model(observations, name), settings, terms=terms)
        fits.append(_conv(m_pop, f"population without {name}", time.perf_counter() - t))
        pop = population_from_result(m_pop.result, left_out=f"model={name}", source=POP_LABEL,
                                     noise=client_noise(m_pop))
        log(f"[fewshot] {name}: population fitted ({fits[-1]['fit_s']:.0f} s, passed "
            f"{fits[-1]['passed']}); zero-shot in BLIS")
        simulate(m_pop, mine, "zero-shot", "", None)
        write()
        for shot in mine[: shots or len(mine)]:
            others = [r for r in mine if r is not shot]
            st = [s for s in stages if s.run_id == shot.short_id]
            for setting, prior in (("one-shot population", pop), ("one-shot roofline", None)):
                t = time.perf_counter()
                cal = calibrated_fit(pd.DataFrame(), st, settings, terms, population=prior,
                                     log=None)
                dt = time.perf_counter() - t
                if prior is not None:
                    cal_s.append(dt)
                fits.append(_conv(cal.model, f"{setting}: {shot.short_id}",
                                  float(cal.history["fit_s"].iloc[-1]),
                                  {"calibrate_s": dt, "iterations": cal.iterations,
                                   "calibration_converged": cal.converged,
                                   "final_change": cal.final_change}))
                pred = client_predictions(cal.model, st, cal.replays, DEFAULT_TERMS)
                pred["model"], pred["tp"] = name, shot.tp
                log(f"[fewshot] {name}: {setting} on {shot.short_id} ({dt:.0f} s); "
                    f"{len(others)} other run(s) in BLIS")
                if others:
                    simulate(cal.model, others, setting, shot.short_id, pred)
                write()
    write()
    log(f"[fewshot] wrote {out / 'fewshot.md'} in {(time.perf_counter() - t0) / 60:.1f} min "
        f"(GPU {GPU})")
    return 0


def _code() -> str:
    """The package and model version the study ran as."""
    from bayes_latency import MODEL_VERSION, __version__

    return f"package {__version__}, model version {MODEL_VERSION}"
