"""The real runs' client metrics in the fit, measured where it counts: in BLIS.

``bayes-latency study client --blis PATH --out results/real`` (see :func:`main`):

1. **Calibrate** (:func:`bayes_latency.study.client.runs.calibrated_fit`): the real H100 step rows,
   the Splitwise benchmark rows and the client rows of the 12 normal runs (mean TTFT and E2E
   of each of their 20 load stages) in one hierarchical fit, replayed until the rows stop moving.
2. **In-sample**: every real run simulated in BLIS with the fit's exports (posterior mean and
   ``n_draws`` run-level draws, :func:`bayes_latency.calibrate.loop.run_level_coefficients`).
3. **Leave-one-run-out** over the 12 normal runs: the run's client rows out of the fit (rows of
   the others at the calibrated schedule), its configuration exported, the run simulated.
4. **Leave-one-model-out**: every row of one model out (steps, benchmarks, client rows), the
   model's configuration exported from the population, its runs simulated.

Outputs in ``OUT/client/``: ``README.md`` (tables and the study's numbers),
``insample.csv``, ``loro.csv``, ``lomo.csv`` (one row per run x source, as
:mod:`~bayes_latency.study.blis.e2e` writes them), ``calibration.csv`` (iterations),
``package_replay.csv`` (the package's own replayed means at the posterior), ``fits.csv``
(convergence and model version of every fit), ``parts.json`` (what made each part's tables:
:mod:`~bayes_latency.study.client.parts`), ``exports/`` (the in-sample BLIS exports) and
``posterior.nc``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bayes_latency.calibrate.loop import (
    MAX_FIT_ELASTICITY,
    client_predictions,
    run_level_coefficients,
    ttft_alpha_share,
)
from bayes_latency.errors import ConfigError
from bayes_latency.io import atomic_write, atomic_write_text
from bayes_latency.model.inference.convergence import DISAGREEMENT_ADVICE, DISAGREEMENT_PREFIX
from bayes_latency.physics.basis import replay_terms
from bayes_latency.study.blis.spec import Coefficients
from bayes_latency.study.client.parts import (
    current_part,
    part_record,
    parts_lines,
    read_parts,
    write_part,
)
from bayes_latency.study.machine import load_average
from bayes_latency.study.markdown import _md, pct, signed_pct
from bayes_latency.study.settings import CLI_FIT, REAL_TERMS, FitSettings

__all__ = ["main", "sources_for"]

#: Sampler settings of the calibrated fit and of every leave-out refit: those of
#: ``bayes-latency fit`` (2 x 2000 draws after 1000 tuning steps, sampling on until the
#: convergence gates pass, at most 12000 draws). With 2 x 1000 draws after 500 tuning steps
#: (calibrated fit) and 2 x 500 after 500 (refits), every fit of the study failed the gates
#: (R-hat 1.02-1.10, bulk ESS 14-118).
CLIENT_FIT = CLI_FIT
#: The fit that gives the first replay's coefficients.
START_FIT = FitSettings(draws=200, tune=200)
QUICK_FIT = FitSettings(draws=200, tune=200)
#: Every leave-out refit: ``fit``'s defaults, like the calibrated fit. With 2 x 500 draws after
#: 500 tuning steps the refits fail the gates (R-hat 1.03-1.15, bulk ESS 12-191); at the
#: defaults one passes in 48 s (R-hat 1.0021, ESS 469).
CV_FIT = CLI_FIT
N_DRAWS = 20
GPU = "H100"


def sources_for(model: Any, configs: Sequence[tuple[str, int]], n_draws: int = N_DRAWS,
                seed: int = 0, run_level: bool = True, replayed: pd.DataFrame | None = None,
                median: bool = False
                ) -> dict[tuple[str, int], tuple[Any, ...]]:
    """BLIS coefficient sets of ``configs`` from a fit: the posterior mean and ``n_draws`` draws
    (run-level draws by default, see :func:`~bayes_latency.calibrate.loop.run_level_coefficients`),
    and with ``median`` the per-coefficient median of the draws as the extra point set
    ``export-median`` (:func:`~bayes_latency.study.blis.e2e.run_study`).

    ``replayed``: the package's replayed client means of the calibrated fit
    (``package_replay.csv``); its TTFT means give each configuration's alpha share of TTFT
    (:func:`~bayes_latency.calibrate.loop.ttft_alpha_share`), so the run-level draws scatter the
    TTFT by its own fitted scale. Without it the alphas alone carry the TTFT scale."""
    from bayes_latency.export.document import blis_block, blis_draws

    out = {}
    for name, tp in configs:
        cfg = {"model": name, "gpu": GPU, "tp": int(tp)}
        post = model.coefficients(name, GPU, tp, seed=seed)
        blk = blis_block(post, "mean", cfg)["trained_physics_coefficients"]
        mean = Coefficients(tuple(blk["alpha_coeffs"]), tuple(blk["beta_coeffs"]),
                            label="export-mean")
        draws: list[Coefficients] = []
        if n_draws:
            share = 1.0
            if replayed is not None:
                t = replayed[(replayed["model"] == name) & (replayed["tp"] == int(tp))
                             & (replayed["kind"] == "workload_ttft")]
                share = ttft_alpha_share(model, name, GPU, tp, t["mean_us"].to_numpy())
            ds = run_level_coefficients(model, name, GPU, tp, seed=seed,
                                        ttft_alpha_share=share) if run_level else post
            for i, d in enumerate(blis_draws(ds, n_draws, seed, cfg)):
                t = d["trained_physics_coefficients"]
                draws.append(Coefficients(tuple(t["alpha_coeffs"]), tuple(t["beta_coeffs"]),
                                          label=f"draw {i}"))
        if median:
            blk = blis_block(post, "median", cfg)["trained_physics_coefficients"]
            med = Coefficients(tuple(blk["alpha_coeffs"]), tuple(blk["beta_coeffs"]),
                               label="export-median")
            out[(name, int(tp))] = (mean, draws, {"export-median": med})
        else:
            out[(name, int(tp))] = (mean, draws)
    return out


def _conv_row(model: Any, label: str, fit_s: float) -> dict[str, Any]:
    c = model.convergence()
    post = model.result["posterior"]
    return {"fit": label, "model_version": str(model.result.attrs.get("model_version", "")),
            "passed": bool(c.get("passed")), "max_rhat": c.get("max_rhat"),
            "min_ess_bulk": c.get("min_ess_bulk"), "divergences": c.get("divergences"),
            "draws": int(post.sizes["draw"]),
            "target_accept": float(json.loads(model.result.attrs.get("sampler_settings", "{}"))
                                   .get("target_accept", math.nan)),
            "fit_s": fit_s,
            # where the chains of a failed fit disagree (model.inference.convergence.chain_disagreement)
            "chains_disagree": next((h for h in c.get("hints", [])
                                     if h.startswith(DISAGREEMENT_PREFIX)), "")}


def _resumed_conv_row(model: Any, record: dict[str, Any] | None, fit_s: float
                      ) -> dict[str, Any]:
    """The calibrated fit's row of ``fits.csv`` in a ``--resume`` process: the one recorded when
    it was sampled (``parts.json``), else the diagnostics of the saved file, which keeps at most
    800 draws (``LatencyModel.save``: thinned, so its bulk ESS is below the sampled fit's), with
    ``passed`` the sampler's own gate decision when the file records it (attrs ``extension``)."""
    if record is not None and isinstance(record.get("fit"), dict):
        return dict(record["fit"])
    row = _conv_row(model, "calibrated (all)", fit_s)
    thin = int(model.result.attrs.get("thinned_by", 1) or 1)
    if thin > 1:
        row["fit"] = f"calibrated (all; saved file, every {thin}th draw)"
        ext = json.loads(model.result.attrs.get("extension") or "[]")
        if ext:
            row["passed"] = ext[-1].get("decision") == "pass"
    return row


def stage_ttft_table(pred: pd.DataFrame, stages: Sequence[Any]) -> pd.DataFrame:
    """Per load stage: request rate, real mean TTFT and the package replay's error on it at the
    calibrated posterior mean, sorted by rate (from ``package_replay.csv``)."""
    rate = {f"{s.run_id}/stage{s.stage}": float(s.rate) for s in stages}
    t = pred[pred["kind"] == "workload_ttft"].copy()
    t["rate"] = t["experiment_id"].map(rate).round(1)  # achieved rates, to the nominal
    t["real_ttft_ms"] = t["observed_us"] / 1e3
    t["replay_ttft_ms"] = t["mean_us"] / 1e3
    t["error"] = t["replay_ttft_ms"] / t["real_ttft_ms"] - 1.0
    return t.sort_values(["rate", "experiment_id"])[
        ["experiment_id", "rate", "real_ttft_ms", "replay_ttft_ms", "error"]
    ].reset_index(drop=True)


def _host_lines(host: pd.DataFrame | None) -> list[str]:
    """What the real step traces say of the host's CPU (:mod:`bayes_latency.checks.host_overhead`)."""
    if host is None or not len(host):
        return []
    parts = [f"{r.experiment_id.split('-', 2)[-1]}: {r.n_host_bound} of {r.n_steps} steps "
             f"({100 * r.host_bound_fraction:.0f}%), `schedule()` {r.cpu_ms_median_host_bound:.1f} "
             f"ms where its batch of {r.batch_median_host_bound:.0f} predicts "
             f"{r.cpu_ms_expected_host_bound:.1f} ms, iteration {r.iteration_ms_median_host_bound:.1f}"
             f" ms against {r.iteration_ms_median_quiet:.1f} ms on quiet steps"
             for r in host.itertuples(index=False)]
    return ["The step traces of the two general runs (the only runs traced) show the host's CPU "
            "saturating in their 20 req/s stage: host-bound steps (`checks/host_overhead.py`, "
            "`bayes-latency check --tables` reports them) are " + "; ".join(parts) + ". The "
            "contention comes from what shares the host with the engine (API server, "
            "detokenization, streaming) and grows with the load. It does not slow the iterations: "
            "at a matched batch size host-bound steps take the same time as quiet ones "
            "(`checks/host_overhead.py`; host-bound steps are slower only through their larger "
            "batches, which the step time charges), so what grows is the time before a request "
            "reaches the engine, which BLIS's per-request alphas cannot follow.", ""]


def _stage_ttft_lines(t: pd.DataFrame, unfitted: Sequence[str],
                      host: pd.DataFrame | None = None) -> list[str]:
    if t.empty:
        return []
    lines = ["## TTFT by load stage (the package's replay at the calibrated posterior mean)", "",
             "Mean TTFT of every load stage against its request rate. A per-request constant "
             "(BLIS's alphas) cannot follow an overhead that grows with the request rate (e.g. "
             "the API server streaming ~4,000-5,000 tokens/s at 20 req/s); the errors of the "
             "20 req/s stages against the others show how much of the TTFT gap is that.", "",
             *_host_lines(host)]
    for r_, g in t.groupby("rate"):
        e = 100 * g["error"].to_numpy(float)
        lines.append(f"- {r_:g} req/s: {len(g)} stages, TTFT error {e.min():+.1f}% to "
                     f"{e.max():+.1f}% (median {np.median(e):+.1f}%)")
    lines += ["", "| stage | req/s | real TTFT (ms) | replay (ms) | error | fitted |",
              "|---|---|---|---|---|---|"]
    uf = {u.rsplit("/", 1)[0] for u in unfitted}
    for _, r in t.iterrows():
        lines.append(f"| {r['experiment_id']} | {r['rate']:g} | {r['real_ttft_ms']:.1f} | "
                     f"{r['replay_ttft_ms']:.1f} | {signed_pct(r['error'])} | "
                     f"{'no' if r['experiment_id'] in uf else 'yes'} |")
    return lines + [""]


def _round(df: pd.DataFrame) -> pd.DataFrame:
    return df.apply(lambda c: c.map(lambda v: f"{v:.4g}" if isinstance(v, float) else v))


def _mine(t: pd.DataFrame, source: str = "export-mean") -> pd.DataFrame:
    return t[t["source"] == source].reset_index(drop=True)


def error_stats(t: pd.DataFrame, metrics: Sequence[str]) -> dict[str, float]:
    """``median_M`` and ``max_M``: the median and largest |relative error| (``err_M``) over the
    runs of ``t``, for each metric ``M`` (NaN when ``t`` has no runs)."""
    out: dict[str, float] = {}
    for m in metrics:
        e = np.abs(t[f"err_{m}"].to_numpy(float)) if len(t) else np.array([])
        out[f"median_{m}"] = float(np.nanmedian(e)) if e.size else math.nan
        out[f"max_{m}"] = float(np.nanmax(e)) if e.size else math.nan
    return out


def band_stats(t: pd.DataFrame, metrics: Sequence[str] = ("e2e_mean", "ttft_mean")
               ) -> dict[str, float]:
    """For each metric ``M`` with a 90% band: ``in_band_M`` (runs inside), ``cover_M`` (their
    share of the runs with a band) and ``width_M`` (median relative band width)."""
    out: dict[str, float] = {}
    for m in metrics:
        col = f"{m}_in_band"
        if col in t and t[col].notna().any():
            ok = t[col].dropna().astype(float)
            out[f"in_band_{m}"] = float(ok.sum())
            out[f"cover_{m}"] = float(ok.mean())
            out[f"width_{m}"] = float(np.nanmedian(t[f"band_{m}_width"].to_numpy(float)))
    return out


def summary(t: pd.DataFrame) -> dict[str, float]:
    """Median |error| over the normal runs, worst run, and band coverage / width."""
    n = t[~t["stress"].astype(bool)]
    out: dict[str, float] = {"runs": float(len(n)),
                             **error_stats(n, ("e2e_mean", "ttft_mean", "decode_interval",
                                               "e2e_p90", "ttft_p90")),
                             **band_stats(n)}
    for m in ("e2e_mean", "ttft_mean"):
        if f"err_{m}_draw_median" in n and n[f"err_{m}_draw_median"].notna().any():
            e = np.abs(n[f"err_{m}_draw_median"].to_numpy(float))
            out[f"median_{m}_draw_median"] = float(np.nanmedian(e))
            out[f"max_{m}_draw_median"] = float(np.nanmax(e))
    return out


def _run_table(t: pd.DataFrame) -> list[str]:
    cols = ["run", "err_e2e_mean", "err_ttft_mean", "err_decode_interval", "err_e2e_p90",
            "err_ttft_p90"]
    lines = ["| run | E2E mean | TTFT mean | decode interval | E2E P90 | TTFT P90 | E2E in band "
             "(width) | TTFT in band (width) | TTFT seed sd |",
             "|---|---|---|---|---|---|---|---|---|"]
    for _, r in t.iterrows():
        band = []
        for m in ("e2e_mean", "ttft_mean"):
            if f"{m}_in_band" in r and math.isfinite(r.get(f"{m}_in_band", math.nan)):
                band.append(f"{'yes' if r[f'{m}_in_band'] else 'no'} "
                            f"({pct(r[f'band_{m}_width'])})")
            else:
                band.append("n/a")
        stress = " (stress)" if r["stress"] else ""
        sd = pct(float(r.get("ttft_mean_seed_sd", math.nan)))
        lines.append(f"| {r[cols[0]]}{stress} | " + " | ".join(signed_pct(r[c]) for c in cols[1:])
                     + f" | {band[0]} | {band[1]} | {sd} |")
    return lines


def _failed_fit_lines(fits: pd.DataFrame | None, key: str) -> list[str]:
    """The part's fits that failed the convergence gates (the calibrated fit for ``insample``,
    the refits for the leave-out parts): the runs simulated from them come from a posterior that
    did not converge. A fit's ``chains_disagree`` hint, where the table has that column, names
    the coefficients its chains disagree on."""
    if fits is None or not len(fits) or "passed" not in fits:
        return []
    label = fits["fit"].astype(str)
    mine = label.str.startswith(_FIT_PREFIX[key]) if key in _FIT_PREFIX \
        else label.str.startswith("calibrated (all")
    bad = fits[mine & ~fits["passed"].astype(bool)]
    if bad.empty:
        return []
    def where(r: Any) -> str:
        h = getattr(r, "chains_disagree", "")
        return (f"; {h.removesuffix('. ' + DISAGREEMENT_ADVICE)}" if isinstance(h, str) and h
                else "")

    return ["Fits of this part that failed the convergence gates (the numbers of their runs come "
            "from a posterior that did not converge): "
            + "; ".join(f"`{r.fit}` (max R-hat {r.max_rhat:.3g}, min bulk ESS "
                        f"{r.min_ess_bulk:.0f}{where(r)})" for r in bad.itertuples(index=False))
            + "."]


def render(res: dict[str, Any]) -> str:
    """The study's README."""
    cal, hist = res["calibration"], res["history"]
    lines = ["# Client metrics in the fit, measured in BLIS", "",
             f"Generated by `bayes-latency study client{res.get('flags', '')}` "
             + (f"({time.strftime('%Y-%m-%d')}; this README rendered by `--resume` from the "
                "tables listed below, each written by its own `--parts` run)."
                if res.get("reused") else
                f"({time.strftime('%Y-%m-%d')}, {res['runtime_s'] / 60:.0f} min on 2 cores)."),
             "",
             "The fit: real H100 step rows + Splitwise benchmark rows + the **client rows of the "
             "12 normal runs** (mean TTFT and mean E2E of each of their 20 load stages; the 4 "
             "overloaded reasoning runs stay out), one hierarchical fit, terms "
             f"`{', '.join(res['terms'])}`, {res['settings']} (leave-out refits: "
             f"{res['cv_settings']}). Each stage is replayed through the "
             "package's scheduler at the posterior mean until the rows stop moving. BLIS "
             "simulates every run with the exports (posterior mean; bands from "
             f"{res['n_draws']} run-level draws: posterior draws x the run-to-run scatter of "
             "the client rows, pooled over configurations (`calibrate.run_level_sigma`), with "
             "the TTFT scattered by its own scale whatever share of it the alphas make "
             "(`calibrate.ttft_alpha_share`), each draw simulated with its own workload seed so "
             "the band also holds the arrivals' realization: `blis_e2e.draw_seed`), open-loop "
             "arrivals as in `study blis`; the point (`export-mean`) pools "
             f"{res.get('point_seeds', 1)} arrival realizations (workload seed 42 and 1042 + k: "
             "`blis_e2e.point_seed`), so it estimates the expected simulated mean at the exported "
             "coefficients, not one realization's; `TTFT seed sd` is the relative sd of its mean "
             "TTFT over them.", "",
             "## Calibration", "",
             f"{len(hist)} fits; converged: {cal['converged']}; final largest change of a "
             f"replayed client mean: {pct(cal['final_change'])}; largest elasticity of a row "
             f"{hist['max_elasticity'].iloc[-1]:.2f}. Replaying the 20 stages once takes "
             f"{res['replay_s']:.0f} s; the calibration {res['calibrate_s']:.0f} s in all.", "",
             _md(_round(hist)), ""]
    if res.get("unfitted"):
        lines += ["Client means replayed but not fitted (elasticity above "
                  f"{MAX_FIT_ELASTICITY:g}: the stage runs near its capacity, see "
                  "`calibrate.MAX_FIT_ELASTICITY`); their in-sample numbers below are "
                  "predictions: " + ", ".join(f"`{u}`" for u in res["unfitted"]) + ".", ""]
    if res.get("reused"):
        lines += ["Parts read from tables written by another `--parts` process or an earlier run "
                  "(`--resume`; file times): " + ", ".join(res["reused"]) + ".", ""]
    lines += parts_lines(res.get("parts") or {}, res.get("stale") or [], PARTS)
    for key, title in (("insample", "In-sample (all 12 normal runs in the fit)"),
                       ("loro", "Leave-one-run-out (the run's client rows out of the fit)"),
                       ("lomo", "Leave-one-model-out (every row of the model out of the fit)")):
        t = res.get(key)
        if t is None or t.empty:
            continue
        s = summary(_mine(t))
        lines += [f"## {title}", "",
                  f"Over the {int(s['runs'])} normal runs, median |error| (worst run): "
                  f"E2E mean {pct(s['median_e2e_mean'])} ({pct(s['max_e2e_mean'])}), "
                  f"TTFT mean {pct(s['median_ttft_mean'])} ({pct(s['max_ttft_mean'])}), "
                  f"decode interval {pct(s['median_decode_interval'])} "
                  f"({pct(s['max_decode_interval'])}), E2E P90 {pct(s['median_e2e_p90'])}, "
                  f"TTFT P90 {pct(s['median_ttft_p90'])}."]
        if "in_band_e2e_mean" in s:
            lines.append(f"90% bands of the simulated means contain the real mean E2E in "
                         f"{int(s['in_band_e2e_mean'])} of {int(s['runs'])} runs (median width "
                         f"{pct(s['width_e2e_mean'])}) and the real mean TTFT in "
                         f"{int(s['in_band_ttft_mean'])} (median width "
                         f"{pct(s['width_ttft_mean'])}).")
        if "median_ttft_mean_draw_median" in s:
            lines.append("The draws' median (a point over posterior draws, run-to-run scatter and "
                         "arrival realizations) misses by: E2E mean "
                         f"{pct(s['median_e2e_mean_draw_median'])} "
                         f"({pct(s['max_e2e_mean_draw_median'])}), TTFT mean "
                         f"{pct(s['median_ttft_mean_draw_median'])} "
                         f"({pct(s['max_ttft_mean_draw_median'])}).")
        med = _mine(t, "export-median")
        if len(med):
            m_ = summary(med)
            lines.append("The per-coefficient median of the draws as the point instead of "
                         "the mean (`export-median`; the exports carry the mean) misses by: "
                         "E2E mean "
                         f"{pct(m_['median_e2e_mean'])} ({pct(m_['max_e2e_mean'])}), TTFT mean "
                         f"{pct(m_['median_ttft_mean'])} ({pct(m_['max_ttft_mean'])}), decode "
                         f"interval {pct(m_['median_decode_interval'])} "
                         f"({pct(m_['max_decode_interval'])}).")
        pub = t[(t["source"] == "blis-published") & ~t["stress"].astype(bool)]
        if len(pub) and key == "lomo":
            p = summary(pub.reset_index(drop=True))
            lines.append(f"BLIS's published coefficients on the same runs: E2E "
                         f"{pct(p['median_e2e_mean'])} ({pct(p['max_e2e_mean'])}), TTFT "
                         f"{pct(p['median_ttft_mean'])} ({pct(p['max_ttft_mean'])}).")
        if len(pub) and key == "insample":
            p = summary(pub.reset_index(drop=True))
            lines.append(f"BLIS's published coefficients on the same harness: E2E "
                         f"{pct(p['median_e2e_mean'])}, TTFT {pct(p['median_ttft_mean'])}, "
                         f"decode interval {pct(p['median_decode_interval'])}.")
        lines += [*_failed_fit_lines(res.get("fits"), key), "", *_run_table(_mine(t)), ""]
    if res.get("stage_ttft") is not None:
        lines += _stage_ttft_lines(res["stage_ttft"], res.get("unfitted", []), res.get("host"))
    lines += ["## Fits", "", _md(_round(res["fits"])), ""]
    return "\n".join(lines) + "\n"


#: The study's parts after the calibration, in the order they run.
PARTS = ("insample", "loro", "lomo")
#: Label prefix of each part's refits in ``fits.csv``.
_FIT_PREFIX = {"loro": "without run ", "lomo": "without model "}


def main(out: str | Path, blis: str | Path | None = None, quick: bool = False,
         loro: bool = True, lomo: bool = True, n_draws: int = N_DRAWS, resume: bool = False,
         terms: Sequence[str] = REAL_TERMS, log: Callable[[str], None] = print,
         parts: Sequence[str] | None = None, kernels: bool = True) -> int:
    """Run the study (see the module docstring); 0 on success or when data / BLIS are absent,
    1 when a fit it ran failed the convergence gates (after writing every table and the README,
    which names the failed fits in their part's section).

    ``resume``: reuse ``posterior.nc``, ``observations.parquet`` and ``calibration.csv`` of an
    earlier run in ``OUT/client`` instead of calibrating again, and the tables of the parts not
    run this time (``insample.csv`` ..., with their refits' rows in ``fits_<part>.csv``), so
    parts can run in separate processes and the README holds them all.
    ``parts``: which of :data:`PARTS` to run (default: all, minus ``loro`` / ``lomo`` when
    those are False).
    ``kernels`` (default): every fit takes the installed kernel tables as evidence on the GPU
    effects (``fit --kernels``): the exports of GPUs nobody traced follow what their kernels
    reach; without the optional extra the study stops before its first fit.
    """
    if parts is not None and set(parts) - set(PARTS):
        raise ConfigError(f"unknown study parts {sorted(set(parts) - set(PARTS))}; "
                          f"expected some of {PARTS}")
    if parts is None:
        parts = ["insample"] + ["loro"] * loro + ["lomo"] * lomo
    run_parts = tuple(p_ for p_ in PARTS if p_ in parts)
    from bayes_latency.checks.host_overhead import host_overhead
    from bayes_latency.study.blis.e2e import POINT_SEEDS, check_blis, run_study
    from bayes_latency.study.blis.spec import find_runs
    from bayes_latency.study.client.runs import (
        calibrated_fit,
        client_stages,
        drop_model,
        drop_run,
        require_kernels,
    )
    from bayes_latency.study.cv import fit_ours
    from bayes_latency.study.real_exports import REAL_RUN_CONFIGS, export_name, write_real_exports
    from bayes_latency.study.realdata import load_real_data, real_data_dir

    t0 = time.perf_counter()
    data_dir = real_data_dir()
    if data_dir is None:
        log("[client] real data not found: nothing to do")
        return 0
    setup = check_blis(blis) if blis else None
    if kernels:  # before any fit: the tables are an optional extra
        require_kernels()
    out = Path(out) / "client"
    out.mkdir(parents=True, exist_ok=True)
    settings = replace(QUICK_FIT if quick else CLIENT_FIT, kernels=kernels)
    data = load_real_data(data_dir)
    runs = find_runs(data_dir)
    normal = [r for r in runs if not r.stress]
    stages = client_stages(runs)
    log(f"[client] {len(stages)} client stages of {len(normal)} normal runs; "
        f"{len(data.observations)} step and benchmark rows")
    post_path, obs_path = out / "posterior.nc", out / "observations.parquet"
    settings_label = settings.describe()
    resumed = resume and post_path.is_file() and obs_path.is_file() \
        and (out / "calibration.csv").is_file()
    if resumed:
        from bayes_latency.model.estimator import LatencyModel

        log(f"[client] resuming from {post_path}")
        model = LatencyModel.load(post_path)
        observations = pd.read_parquet(obs_path)
        # the fitted rows' counts set the run-level scales (calibrate.run_level_sigma): without
        # them a loaded fit's bands fall back on the prior's scale (3x wider in-sample)
        model.attach_rows(observations)
        history = pd.read_csv(out / "calibration.csv")
        calibrate_s = float(history["fit_s"].sum() + history["replay_s"].sum())
        pred = pd.read_csv(out / "package_replay.csv") \
            if (out / "package_replay.csv").is_file() else None
        unfitted = json.loads((out / "unfitted.json").read_text()) \
            if (out / "unfitted.json").is_file() else []
        converged = bool(history["rows_moving"].iloc[-1] == 0) \
            if "rows_moving" in history else False
    else:
        t, load0 = time.perf_counter(), load_average()
        cal = calibrated_fit(data.observations, stages, settings, terms,
                             start_settings=replace(QUICK_FIT if quick else START_FIT,
                                                    kernels=kernels), log=log)
        calibrate_s = time.perf_counter() - t
        model, observations, history, converged = (cal.model, cal.observations, cal.history,
                                                    cal.converged)
        model.save(post_path)
        atomic_write(obs_path, lambda tmp: observations.to_parquet(tmp, index=False))
        pred = client_predictions(model, stages, cal.replays, replay_terms(terms))
        pred.to_csv(out / "package_replay.csv", index=False, float_format="%.6g")
        history.to_csv(out / "calibration.csv", index=False, float_format="%.6g")
        unfitted = list(cal.unfitted)
        atomic_write_text(out / "unfitted.json", json.dumps(unfitted) + "\n")
    fit_s = float(history["fit_s"].iloc[-1])
    if resumed:
        fits = [_resumed_conv_row(model, read_parts(out).get("calibration"), fit_s)]
    else:
        fits = [_conv_row(model, "calibrated (all)", fit_s)]
        write_part(out, "calibration", {**part_record(t, load0, True), "fit": fits[0]})
    cv_settings = replace(QUICK_FIT if quick else CV_FIT, kernels=kernels)
    if not resumed or not all((out / "exports" / export_name(n, tp)).is_file()
                              for n, tp in REAL_RUN_CONFIGS):
        # a resumed run keeps the exports the calibration wrote: the saved posterior holds
        # thinned draws, whose means differ from the full fit's by Monte-Carlo error, and the
        # tables of the other parts were simulated with the calibration's exports
        write_real_exports(model, out / "exports", posterior_path=post_path)
    res: dict[str, Any] = {"calibration": {"converged": converged,
                                           "final_change": float(history["max_change"].iloc[-1])},
                           "history": history, "terms": list(terms), "n_draws": n_draws,
                           "point_seeds": POINT_SEEDS,
                           "unfitted": unfitted,
                           "settings": settings_label,
                           "flags": "" if kernels else " --no-kernels",
                           "cv_settings": cv_settings.describe(),
                           "replay_s": float(history["replay_s"].iloc[-1]),
                           "calibrate_s": calibrate_s,
                           "stage_ttft": stage_ttft_table(pred, stages) if pred is not None
                           else None,
                           "host": host_overhead(data.iterations)}
    part_fits: dict[str, list[dict[str, Any]]] = {}
    records = read_parts(out)
    shown = {"calibration"} if "calibration" in records else set()
    if resume:  # the tables of parts that ran in another process or an earlier run
        for key in PARTS:
            if key not in run_parts and (out / f"{key}.csv").is_file():
                if not current_part(records.get(key)):
                    v = records.get(key, {}).get("model_version", "not recorded")
                    res.setdefault("stale", []).append(f"`{key}.csv` (model version {v})")
                    log(f"[client] {key}: {out / f'{key}.csv'} left out (model version {v})")
                    continue
                shown.add(key)
                res[key] = pd.read_csv(out / f"{key}.csv")
                f_ = out / f"fits_{key}.csv"
                if key in _FIT_PREFIX and f_.is_file() and f_.stat().st_size > 1:
                    part_fits[key] = pd.read_csv(f_).to_dict(orient="records")
                when = time.gmtime((out / f"{key}.csv").stat().st_mtime)
                res.setdefault("reused", []).append(
                    f"`{key}.csv` ({time.strftime('%Y-%m-%d %H:%M', when)} UTC)")
                log(f"[client] {key}: reusing {out / f'{key}.csv'}")

    def fit(obs: pd.DataFrame) -> tuple[Any, dict[str, Any]]:
        return fit_ours(obs, cv_settings, terms=terms)

    def write_readme() -> None:
        for key, prefix in _FIT_PREFIX.items():
            if key in run_parts:
                part_fits[key] = [f_ for f_ in fits if str(f_["fit"]).startswith(prefix)]
                if part_fits[key]:
                    pd.DataFrame(part_fits[key]).to_csv(out / f"fits_{key}.csv", index=False,
                                                        float_format="%.6g")
        res["fits"] = pd.DataFrame(fits[:1] + [f_ for k in _FIT_PREFIX
                                               for f_ in part_fits.get(k, [])])
        res["fits"].to_csv(out / "fits.csv", index=False, float_format="%.6g")
        res["runtime_s"] = time.perf_counter() - t0
        res["parts"] = {k: v for k, v in read_parts(out).items() if k in shown}
        atomic_write_text(out / "README.md", render(res))

    write_readme()
    configs = sorted({(r.model, r.tp) for r in runs})
    if setup is not None and "insample" in run_parts:
        log("[client] in-sample: all runs in BLIS")
        t, load0 = time.perf_counter(), load_average()
        src = sources_for(model, configs, n_draws, replayed=pred)
        st = run_study(setup, runs, n_draws=n_draws, sources=src, progress=log)
        res["insample"] = st.table
        res["insample"].to_csv(out / "insample.csv", index=False, float_format="%.6g")
        if st.draws is not None:
            st.draws.to_csv(out / "insample_draws.csv", index=False, float_format="%.6g")
        write_part(out, "insample", part_record(t, load0, True))
        shown.add("insample")
        write_readme()
    if setup is not None and "loro" in run_parts:
        parts, draw_parts = [], []
        t_part, load0 = time.perf_counter(), load_average()
        shown.add("loro")
        for r in normal:
            t = time.perf_counter()
            m, _ = fit(drop_run(observations, r.short_id))
            fits.append(_conv_row(m, f"without run {r.short_id}", time.perf_counter() - t))
            src = sources_for(m, [(r.model, r.tp)], n_draws, replayed=pred)
            st = run_study(setup, [r], n_draws=n_draws, sources=src)
            parts.append(st.table)
            if st.draws is not None:
                draw_parts.append(st.draws)
                pd.concat(draw_parts, ignore_index=True).to_csv(
                    out / "loro_draws.csv", index=False, float_format="%.6g")
            res["loro"] = pd.concat(parts, ignore_index=True)
            res["loro"].to_csv(out / "loro.csv", index=False, float_format="%.6g")
            write_part(out, "loro", part_record(t_part, load0, len(parts) == len(normal),
                                                len(parts)))
            write_readme()
            log(f"[client] leave-one-run-out {r.short_id}: done")
    if setup is not None and "lomo" in run_parts:
        parts = []
        models = sorted({r.model for r in runs})
        t_part, load0 = time.perf_counter(), load_average()
        shown.add("lomo")
        for name in models:
            t = time.perf_counter()
            m, _ = fit(drop_model(observations, name))
            fits.append(_conv_row(m, f"without model {name}", time.perf_counter() - t))
            mine = [r for r in runs if r.model == name]
            src = sources_for(m, sorted({(r.model, r.tp) for r in mine}), n_draws,
                              replayed=pred, median=True)
            parts.append(run_study(setup, mine, n_draws=n_draws, sources=src).table)
            res["lomo"] = pd.concat(parts, ignore_index=True)
            res["lomo"].to_csv(out / "lomo.csv", index=False, float_format="%.6g")
            write_part(out, "lomo", part_record(t_part, load0, len(parts) == len(models),
                                                len(parts)))
            write_readme()
            log(f"[client] leave-one-model-out {name}: done")
    write_readme()
    log(f"[client] wrote {out} in {res['runtime_s'] / 60:.1f} min")
    failed = [str(f_["fit"]) for f_ in fits[int(resumed):] if not f_["passed"]]
    if failed:  # the tables are written; a fit that did not converge fails the command
        log(f"[client] fits that failed the convergence gates: {', '.join(failed)}")
        return 1
    return 0
