"""Fast path (per-configuration summaries under the hierarchy) vs full-data NUTS, in one run.

Usage::

    python benchmarks/fast_vs_full.py [--fleet tiny|small|demo | --obs PATH]
        [--terms prefill_compute,decode_kv,weight_loading,per_request | --terms default]
        [--max-rows-per-config 800] [--configs N] [--draws 1000] [--tune 500] [--seed 0]
        [--out results/benchmarks/fast_vs_full] [--no-noise-diagnostic]

    # the run of results/benchmarks/fast_vs_full.md (~15 min on 2 shared cores)
    python benchmarks/fast_vs_full.py --no-noise-diagnostic
    # an ad-hoc run (a few minutes), written elsewhere
    python benchmarks/fast_vs_full.py --fleet tiny --max-rows-per-config 400 --out /tmp/fvf_tiny

Fits exactly the same rows twice (``LatencyModel(method="laplace-hierarchy")`` then
``LatencyModel(method="full")``, one after the other, never concurrently), times both, prints the
speed ratio and how far apart the posteriors are: for every (configuration, coefficient) element,
beta terms **and** alpha terms, ``z = (mean_fast - mean_full) / sd_full``. The claim checked:
``|z| < 0.1`` for most elements.

Why a term subset by default: with all 11 default beta terms several coefficients are exactly
collinear within one configuration (``weight_loading``, ``per_layer``, ``per_step`` and
``moe_layer`` are constant per step; ``tp_allreduce`` is nearly a combination of the compute
terms), so the explicit per-configuration coefficients of the full path sit on sharp ridges and
full-data NUTS runs at tree depth 10 for tens of minutes. The fast path integrates those
coefficients out and does not care, but the comparison needs a full run that finishes, so the
default subset is one that every configuration identifies (checked and printed: the rank of each
configuration's scaled feature matrix). ``--terms default`` runs the full 11-term set.

Monte Carlo error: each posterior mean carries an MCSE of ``sd / sqrt(ESS)`` on each path, so even
identical posteriors give ``|z| > 0``. The report gives, per element, the MCSE-only spread of z
(``sqrt(mcse_fast^2 + mcse_full^2) / sd_full``), the expected median |z| from Monte Carlo error
alone, and the systematic part of z that remains after subtracting it (RMS).

Diagnostic (third fit, skip with ``--no-noise-diagnostic``): the fast path again, but with each
configuration's summary computed at the noise **fixed** at the full path's posterior means instead
of noise profiled per (configuration, kind). It attributes fast-vs-full differences to the noise
model (the fast path profiles the noise per (configuration, kind) at its posterior mode; the full
path integrates over it with the same priors) rather than to the quadratic expansion
and the closed-form integration.

Outputs (``--out PREFIX``, default ``results/benchmarks/fast_vs_full``, the benchmark's one current
result): ``PREFIX.md`` (report) and ``PREFIX.json`` (all numbers, including the per-element table).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import arviz as az
import numpy as np
import pandas as pd

# this checkout's package, also when the installed one is another worktree's
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bayes_latency.model.definition.summaries import _ConfigProblem, feature_columns, fit_rows
from bayes_latency.model.estimator import LatencyModel
from bayes_latency.physics.basis import DEFAULT_TERMS
from benchmarks._provenance import code_provenance

SUBSET_TERMS = ("prefill_compute", "decode_kv", "weight_loading", "per_request")
#: median of |N(0, 1)|
MEDIAN_ABS_NORMAL = 0.6744897501960817


# ----------------------------------------------------------------------------- data
def observations_for(fleet: str, seed: int) -> pd.DataFrame:
    """Simulate and ingest a synthetic fleet preset; the observation table."""
    from bayes_latency.data.experiment import ingest, load_tables
    from bayes_latency.synth.fleet import simulate_fleet

    tmp = Path(tempfile.mkdtemp(prefix="bl-bench-"))
    folders = simulate_fleet(fleet, tmp / "fleet", seed=seed, progress=False)
    ingest(folders, tmp / "tables")
    return load_tables(tmp / "tables")["observations"]


def select_rows(obs: pd.DataFrame, n_configs: int | None, max_rows: int | None,
                seed: int) -> pd.DataFrame:
    """The fitted rows (roles beta/alpha, valid values), first ``n_configs`` configurations
    (sorted by id, the model's own order), at most ``max_rows`` rows per configuration drawn
    without replacement with a fixed seed. Both paths get this same frame."""
    rows = fit_rows(obs)
    cfgs = sorted(rows["config_id"].unique())
    if n_configs:
        cfgs = cfgs[:n_configs]
    rows = rows[rows["config_id"].isin(cfgs)]
    if max_rows:
        rng = np.random.default_rng(seed)
        keep = []
        for _, idx in sorted(rows.groupby("config_id").indices.items()):
            keep.append(idx if len(idx) <= max_rows else np.sort(rng.choice(idx, max_rows, replace=False)))
        rows = rows.iloc[np.sort(np.concatenate(keep))]
    return rows.copy()


def identifiability(rows: pd.DataFrame, model: LatencyModel) -> list[dict]:
    """Per configuration: active coefficients, the exact rank of the scaled, column-normalised
    feature matrix (``_ConfigProblem``; tolerance 1e-8) and the package's relative-design analysis
    (:mod:`bayes_latency.model.definition.identifiability`: rows / observed value, columns in prior-median
    units; its own flatness threshold) with the smallest/largest singular-value ratio."""
    from bayes_latency.model.definition.identifiability import config_identifiability

    out = []
    scale = model._scale()
    for cid, g in rows.groupby("config_id", sort=True):
        p = _ConfigProblem(g, model.coefs, scale)
        Xa = p.Xs[:, p.active]
        Xn = Xa / np.linalg.norm(Xa, axis=0)
        s = np.linalg.svd(Xn, compute_uv=False)
        rank = int(np.linalg.matrix_rank(Xn, tol=1e-8 * s[0]))
        y = g["value_us"].to_numpy(float)
        rel = np.linalg.svd(Xa / y[:, None], compute_uv=False)
        ci = config_identifiability(p.X, y, model.coefs, scale, str(cid))
        out.append({"config": cid, "rows": int(len(g)),
                    "rows_by_kind": {str(k): int(v) for k, v in g["kind"].value_counts().sort_index().items()},
                    "active": int(p.active.sum()), "rank": rank, "cond": float(s[0] / s[-1]),
                    "rel_rank": int(ci.rank),
                    "rel_sv_min_over_max": float(rel[-1] / rel[0]),
                    "rel_flat_groups": ["+".join(gr) for gr in ci.groups],
                    "prior_only": [c for c, a in zip(model.coefs, p.active, strict=True) if not a]})
    return out


# ----------------------------------------------------------------------------- fitting
def timed_fit(method: str, rows: pd.DataFrame, terms: tuple[str, ...], draws: int, tune: int,
              chains: int, seed: int, target_accept: float | None) -> tuple[LatencyModel, float]:
    m = LatencyModel(method=method, terms=terms)
    kw: dict = {"max_draws": None}  # exactly `draws`, as measured
    if target_accept is not None:
        kw["target_accept"] = target_accept
    t0, c0 = time.perf_counter(), time.process_time()
    m.fit(rows, draws=draws, tune=tune, chains=chains, seed=seed, **kw)
    # CPU seconds of this process (all threads): robust to other jobs sharing the cores
    m.timings["cpu_total_s"] = time.process_time() - c0
    return m, time.perf_counter() - t0


def _sample_stats(m: LatencyModel) -> dict:
    ss = m.result["sample_stats"].to_dataset() if "sample_stats" in m.result else None
    if ss is None:
        return {}
    out = {}
    for name in ("depth", "tree_depth", "n_steps", "step_size"):
        if name in ss:
            v = ss[name].values
            out[f"{name}_mean"] = float(np.mean(v))
            out[f"{name}_max"] = float(np.max(v))
    return out


def _stack(m: LatencyModel) -> dict[str, np.ndarray]:
    """(chain, draw, config, coef) draws of beta and alpha concatenated on coef."""
    post = m.result["posterior"].to_dataset()
    b = post["beta"].transpose("chain", "draw", "config", "term")
    a = post["alpha"].transpose("chain", "draw", "config", "alpha_term")
    return {"configs": [str(c) for c in b["config"].values],
            "theta": np.concatenate([b.values, a.values], axis=-1)}


def _moments(theta: np.ndarray) -> dict[str, np.ndarray]:
    import xarray as xr

    da = xr.Dataset({"t": (("chain", "draw", "config", "coef"), theta)})
    ess_bulk = az.ess(da, method="bulk")["t"].values
    ess_mean = az.ess(da, method="mean")["t"].values
    sd = theta.std(axis=(0, 1), ddof=1)
    return {"mean": theta.mean(axis=(0, 1)), "sd": sd, "ess_bulk": ess_bulk,
            "mcse": sd / np.sqrt(np.maximum(ess_mean, 1.0))}


def _stats(z: np.ndarray, z_mc: np.ndarray, ratio: np.ndarray, mask: np.ndarray) -> dict:
    zz, mc, rr = z[mask], z_mc[mask], ratio[mask]
    ok = np.isfinite(zz)
    zz, mc, rr = zz[ok], mc[ok], rr[ok]
    if zz.size == 0:
        return {"n": 0}
    az_ = np.abs(zz)
    return {
        "n": int(zz.size),
        "median_abs_z": float(np.median(az_)), "max_abs_z": float(np.max(az_)),
        "share_lt_0.1": float(np.mean(az_ < 0.1)), "share_lt_0.2": float(np.mean(az_ < 0.2)),
        "rms_z": float(np.sqrt(np.mean(zz**2))),
        "mean_z": float(np.mean(zz)),
        "expected_median_abs_z_mc": float(MEDIAN_ABS_NORMAL * np.median(mc)),
        "rms_z_mc": float(np.sqrt(np.mean(mc**2))),
        "rms_z_systematic": float(np.sqrt(max(0.0, np.mean(zz**2) - np.mean(mc**2)))),
        "share_abs_z_within_2_mcse": float(np.mean(az_ < 2 * mc)),
        "sd_ratio_median": float(np.median(rr)), "sd_ratio_min": float(np.min(rr)),
        "sd_ratio_max": float(np.max(rr)),
    }


def _elementwise(fast: LatencyModel, full: LatencyModel, rows: pd.DataFrame) -> dict:
    """Per (configuration, coefficient): means, sds, ESS, z, MCSE-z; and the summary statistics."""
    coefs = list(fast.coefs)
    nb = len(fast.terms)
    F, G = _stack(fast), _stack(full)
    if F["configs"] != G["configs"]:
        raise RuntimeError(f"configuration order differs: {F['configs']} vs {G['configs']}")
    cfgs = F["configs"]
    mf, mg = _moments(F["theta"]), _moments(G["theta"])
    # active = the configuration has a non-zero feature for the coefficient in the fitted rows
    X = rows[feature_columns(coefs)].to_numpy(dtype=float) > 0
    cid = rows["config_id"].to_numpy()
    active = np.stack([X[cid == c].any(axis=0) for c in cfgs])
    z = (mf["mean"] - mg["mean"]) / mg["sd"]
    z_mc = np.sqrt(mf["mcse"] ** 2 + mg["mcse"] ** 2) / mg["sd"]
    ratio = mf["sd"] / mg["sd"]
    elements = []
    for i, c in enumerate(cfgs):
        for k, name in enumerate(coefs):
            elements.append({
                "config": c, "coef": name, "block": "beta" if k < nb else "alpha",
                "active": bool(active[i, k]),
                "mean_fast": float(mf["mean"][i, k]), "mean_full": float(mg["mean"][i, k]),
                "sd_fast": float(mf["sd"][i, k]), "sd_full": float(mg["sd"][i, k]),
                "ess_fast": float(mf["ess_bulk"][i, k]), "ess_full": float(mg["ess_bulk"][i, k]),
                "z": float(z[i, k]), "z_mc_sd": float(z_mc[i, k]), "sd_ratio": float(ratio[i, k]),
            })
    beta_mask = np.zeros_like(active)
    beta_mask[:, :nb] = True
    act = [e for e in elements if e["active"] and np.isfinite(e["z"])]
    return {
        "configs": cfgs, "coefs": coefs, "n_beta": nb,
        "all_active": _stats(z, z_mc, ratio, active),
        "beta_active": _stats(z, z_mc, ratio, active & beta_mask),
        "alpha_active": _stats(z, z_mc, ratio, active & ~beta_mask),
        "prior_only": _stats(z, z_mc, ratio, ~active),
        "worst": sorted(act, key=lambda e: -abs(e["z"]))[:10], "elements": elements,
    }


def full_noise_summaries(rows: pd.DataFrame, model: LatencyModel, full: LatencyModel) -> list:
    """Stage-1 summaries with the noise **fixed** at the full path's posterior means (sigma and
    tau, nu per configuration and kind) instead of profiled per configuration and kind:
    maximum likelihood in theta and the information at fixed noise. Diagnostic only: it separates
    what the noise model contributes to fast-vs-full differences from the quadratic expansion and
    the closed-form integration."""
    from bayes_latency.model.definition.likelihood import NoiseParams
    from bayes_latency.model.definition.summaries import summarize_config

    post = full.result["posterior"].to_dataset()
    scale = model._scale()
    out = []
    for cid, g in rows.groupby("config_id", sort=True):
        noise = {str(k): NoiseParams(
            sigma=float(post["noise_sigma"].sel(config=cid, kind=k).mean()),
            tau=float(post["noise_tau"].sel(config=cid, kind=k).mean()),
            nu=float(post["noise_nu"].sel(config=cid, kind=k).mean())) for k in g["kind"].unique()}
        out.append(summarize_config(g, model.coefs, scale, fixed_noise=noise))
    return out


def fast_with_full_noise(rows: pd.DataFrame, terms: tuple[str, ...], full: LatencyModel, draws: int,
                         tune: int, chains: int, seed: int, target_accept: float | None
                         ) -> tuple[LatencyModel, float]:
    """The fast path with :func:`full_noise_summaries` in place of the stage-1 summaries."""
    import bayes_latency.model.inference.build as build

    sums = full_noise_summaries(rows, LatencyModel(terms=terms), full)
    orig = build.summarize
    build.summarize = lambda *a, **k: sums  # noqa: ARG005 - same signature, fixed answer
    try:
        return timed_fit("laplace-hierarchy", rows, terms, draws, tune, chains, seed, target_accept)
    finally:
        build.summarize = orig


def compare(rows: pd.DataFrame, terms: tuple[str, ...], draws: int, tune: int, chains: int,
            seed: int, target_accept: float | None, noise_diagnostic: bool = True) -> dict:
    fast, t_fast = timed_fit("laplace-hierarchy", rows, terms, draws, tune, chains, seed, target_accept)
    print(f"  fast path done in {t_fast:.1f} s", flush=True)
    full, t_full = timed_fit("full", rows, terms, draws, tune, chains, seed, target_accept)
    print(f"  full path done in {t_full:.1f} s", flush=True)
    el = _elementwise(fast, full, rows)
    cfgs, coefs = el["configs"], el["coefs"]
    pop = {}
    pf, pg = fast.result["posterior"].to_dataset(), full.result["posterior"].to_dataset()
    for v in ("mu", "sigma_config"):
        if v in pf and v in pg:
            a, b = pf[v].values, pg[v].values
            sd = b.std(axis=(0, 1), ddof=1)
            pop[v] = {"z": ((a.mean(axis=(0, 1)) - b.mean(axis=(0, 1))) / sd).tolist(),
                      "sd_ratio": (a.std(axis=(0, 1), ddof=1) / sd).tolist(), "coef": coefs}
    noise = []
    for c in cfgs:
        for k, p in sorted(fast._noise.get(c, {}).items()):
            d = {"config": c, "kind": k, "n_rows": int(((rows["config_id"] == c) & (rows["kind"] == k)).sum()),
                 "fast_sigma": p.sigma, "fast_tau": p.tau, "fast_nu": p.nu}
            if "noise_sigma" in pg and k in list(pg["kind"].values):
                d["full_sigma"] = float(pg["noise_sigma"].sel(config=c, kind=k).mean())
                d["full_tau"] = float(pg["noise_tau"].sel(config=c, kind=k).mean())
                d["full_nu"] = float(pg["noise_nu"].sel(config=c, kind=k).mean())
            noise.append(d)
    fast_cpu, full_cpu = fast.timings.pop("cpu_total_s"), full.timings.pop("cpu_total_s")
    fast_t = dict(fast.timings)
    fast_t["other_s"] = t_fast - sum(v for v in fast_t.values())
    full_t = dict(full.timings)
    full_t["other_s"] = t_full - sum(v for v in full_t.values())
    out = {
        "rows": int(len(fast._rows)), "rows_full": int(len(full._rows)),
        "fast_s": t_fast, "full_s": t_full, "ratio": t_full / t_fast,
        "fast_cpu_s": fast_cpu, "full_cpu_s": full_cpu, "cpu_ratio": full_cpu / fast_cpu,
        "load_avg_end": list(os.getloadavg()),
        "sampling_ratio": full.timings["sampling_s"] / fast.timings["sampling_s"],
        "fast_timings": fast_t, "full_timings": full_t,
        "fast_conv": fast.convergence(), "full_conv": full.convergence(),
        "fast_stats": _sample_stats(fast), "full_stats": _sample_stats(full),
        "fast_notes": list(fast.report.notes), "full_notes": list(full.report.notes),
        "population": pop, "noise": noise, **el,
    }
    if noise_diagnostic:
        diag, t_diag = fast_with_full_noise(rows, terms, full, draws, tune, chains, seed, target_accept)
        print(f"  diagnostic (fast path, noise fixed at the full posterior means) done in {t_diag:.1f} s",
              flush=True)
        d = _elementwise(diag, full, rows)
        out["noise_diagnostic"] = {"s": t_diag, "conv": diag.convergence(),
                                   **{k: d[k] for k in ("all_active", "beta_active", "alpha_active",
                                                        "prior_only", "worst", "elements")}}
    return out


# ----------------------------------------------------------------------------- report
def _fmt_stats(name: str, s: dict) -> str:
    if not s.get("n"):
        return f"| {name} | 0 | | | | | | | |"
    return (f"| {name} | {s['n']} | {s['median_abs_z']:.3f} | {s['max_abs_z']:.3f} | "
            f"{s['share_lt_0.1']:.0%} | {s['share_lt_0.2']:.0%} | {s['expected_median_abs_z_mc']:.3f} | "
            f"{s['rms_z']:.3f} / {s['rms_z_mc']:.3f} / {s['rms_z_systematic']:.3f} | "
            f"{s['sd_ratio_median']:.3f} [{s['sd_ratio_min']:.3f}, {s['sd_ratio_max']:.3f}] |")


def _conv_line(name: str, c: dict, st: dict, t: float, timings: dict) -> str:
    split = ", ".join(f"{k[:-2]} {v:.1f}" for k, v in timings.items())
    depth = st.get("depth_mean", st.get("tree_depth_mean"))
    dmax = st.get("depth_max", st.get("tree_depth_max"))
    dtxt = f"{depth:.1f} (max {dmax:.0f})" if depth is not None else "n/a"
    return (f"| {name} | {t:.1f} | {split} | {c['max_rhat']:.4f} | {c['min_ess_bulk']:.0f} | "
            f"{c['divergences']} | {dtxt} | {'yes' if c['passed'] else 'no'} |")


def markdown(r: dict, meta: dict) -> str:
    L = [f"# Fast path vs full-data NUTS ({meta['label']})", "",
         f"Command: `{meta['command']}`", "",
         f"Data: {meta['source']}; {r['rows']:,} fitted rows (both paths: {r['rows']} / "
         f"{r['rows_full']}) over {len(r['configs'])} configurations; at most "
         f"{meta['max_rows_per_config'] or 'all'} rows per configuration (seed {meta['seed']}).",
         f"Coefficients compared: {r['n_beta']} beta terms ({', '.join(r['coefs'][:r['n_beta']])}) and "
         f"{len(r['coefs']) - r['n_beta']} alpha terms ({', '.join(r['coefs'][r['n_beta']:])}), "
         f"per configuration. Sampler nutpie, {meta['chains']} chains x {meta['draws']} draws "
         f"({meta['tune']} tune). Machine: {meta['machine']}; code: {meta['code']}; "
         f"whole script {meta['wall_total_s']:.0f} s.", "",
         "## Identifiability of the chosen terms (scaled feature matrix per configuration)", "",
         "| configuration | rows | rows by kind | active coefs | exact rank | condition | "
         "package identifiability rank | rel. sv min/max | package flat groups | prior-only coefs |",
         "|---|---|---|---|---|---|---|---|---|---|"]
    for d in meta["identifiability"]:
        kinds = ", ".join(f"{k} {v}" for k, v in d["rows_by_kind"].items())
        L.append(f"| {d['config']} | {d['rows']} | {kinds} | {d['active']} | {d['rank']} | "
                 f"{d['cond']:.3g} | {d['rel_rank']} | {d['rel_sv_min_over_max']:.2g} | "
                 f"{', '.join(d['rel_flat_groups']) or '-'} | {', '.join(d['prior_only']) or '-'} |")
    L += ["", "## Time and convergence", "",
          f"Speed ratio full / fast (whole `fit`): **{r['ratio']:.1f}x**; sampling only "
          f"(incl. compile): {r['sampling_ratio']:.1f}x; CPU seconds of the process (all threads, "
          f"robust to other jobs on the machine): fast {r['fast_cpu_s']:.0f}, full "
          f"{r['full_cpu_s']:.0f}, ratio {r['cpu_ratio']:.1f}x. Load average at the end "
          f"(1/5/15 min): {', '.join(f'{x:.1f}' for x in r['load_avg_end'])} on "
          f"{os.cpu_count()} CPUs.", "",
          "| path | wall s | split (s) | max R-hat | min bulk ESS | divergences | tree depth mean | gates passed |",
          "|---|---|---|---|---|---|---|---|",
          _conv_line("fast (laplace-hierarchy)", r["fast_conv"], r["fast_stats"], r["fast_s"], r["fast_timings"]),
          _conv_line("full-data NUTS", r["full_conv"], r["full_stats"], r["full_s"], r["full_timings"]),
          "",
          "(`summaries` = stage-1 per-configuration MLE + information; `sampling` includes model "
          "compilation; `config_draws` = conditional draws of the integrated-out coefficients; "
          "`other` = log-likelihood for LOO and assembling.)", ""]
    for n in r["fast_notes"] + r["full_notes"]:
        L.append(f"Note: {n}")
    L += ["", "## Posterior means: z = (mean_fast - mean_full) / sd_full", "",
          "| elements | n | median abs z | max abs z | share < 0.1 | share < 0.2 | "
          "expected median abs z from MCSE alone | RMS z / RMS MCSE-z / RMS systematic | "
          "sd_fast / sd_full median [range] |",
          "|---|---|---|---|---|---|---|---|---|",
          _fmt_stats("all active", r["all_active"]), _fmt_stats("beta active", r["beta_active"]),
          _fmt_stats("alpha active", r["alpha_active"]),
          _fmt_stats("prior-only (all features 0)", r["prior_only"]), "",
          "MCSE-z of an element = sqrt(mcse_fast^2 + mcse_full^2) / sd_full (mcse = sd / sqrt(ESS "
          "of the mean)); RMS systematic = sqrt(max(0, mean z^2 - mean MCSE-z^2)).", "",
          "### Worst 10 active elements", "",
          "| configuration | coef | mean fast | mean full | sd fast | sd full | ESS fast / full | z | MCSE-z |",
          "|---|---|---|---|---|---|---|---|---|"]
    for e in r["worst"]:
        L.append(f"| {e['config']} | {e['coef']} | {e['mean_fast']:.5g} | {e['mean_full']:.5g} | "
                 f"{e['sd_fast']:.3g} | {e['sd_full']:.3g} | {e['ess_fast']:.0f} / {e['ess_full']:.0f} | "
                 f"{e['z']:+.3f} | {e['z_mc_sd']:.3f} |")
    if r["population"]:
        L += ["", "### Population parameters (z per coefficient)", "",
              "| parameter | " + " | ".join(r["coefs"]) + " |",
              "|---|" + "---|" * len(r["coefs"])]
        for v, d in r["population"].items():
            L.append(f"| {v} z | " + " | ".join(f"{x:+.2f}" for x in d["z"]) + " |")
            L.append(f"| {v} sd ratio | " + " | ".join(f"{x:.2f}" for x in d["sd_ratio"]) + " |")
    nd = r.get("noise_diagnostic")
    if nd:
        c = nd["conv"]
        L += ["", "## Diagnostic: fast path with the noise fixed at the full path's posterior means", "",
              "Same rows, same hierarchy, but each configuration's summary is the maximum likelihood "
              "and information in theta at **fixed** noise (sigma, tau, nu per configuration and kind "
              "= posterior means of the full fit) instead of noise profiled per "
              "(configuration, kind). What remains is the quadratic expansion + closed-form "
              f"integration + plug-in (not integrated) noise. {nd['s']:.1f} s; max R-hat "
              f"{c['max_rhat']:.4f}, min bulk ESS {c['min_ess_bulk']:.0f}, divergences {c['divergences']}.", "",
              "| elements | n | median abs z | max abs z | share < 0.1 | share < 0.2 | "
              "expected median abs z from MCSE alone | RMS z / RMS MCSE-z / RMS systematic | "
              "sd_fast / sd_full median [range] |",
              "|---|---|---|---|---|---|---|---|---|",
              _fmt_stats("all active", nd["all_active"]), _fmt_stats("beta active", nd["beta_active"]),
              _fmt_stats("alpha active", nd["alpha_active"]), "",
              "Worst 5: " + "; ".join(f"{e['config']} {e['coef']} z {e['z']:+.3f}" for e in nd["worst"][:5])]
    if r["noise"]:
        L += ["", "### Noise: profiled MLE (fast, per configuration and kind) vs posterior mean (full: "
              "sigma, tau, nu per configuration and kind with the same priors)", "",
              "| configuration | kind | rows | sigma fast / full | tau fast / full | nu fast / full |",
              "|---|---|---|---|---|---|"]
        for d in r["noise"]:
            tau = (f"{d['fast_tau']:.2g} / {d.get('full_tau', float('nan')):.2g}"
                   if d["kind"] == "step_window" else "-")
            L.append(f"| {d['config']} | {d['kind']} | {d.get('n_rows', '')} | "
                     f"{d['fast_sigma']:.4f} / {d.get('full_sigma', float('nan')):.4f} | {tau} | "
                     f"{d['fast_nu']:.1f} / {d.get('full_nu', float('nan')):.1f} |")
    return "\n".join(L) + "\n"


def _script_path() -> str:
    """This script's path relative to the repository root (as typed when it is elsewhere)."""
    root = Path(__file__).resolve().parents[1]
    try:
        return Path(sys.argv[0]).resolve().relative_to(root).as_posix()
    except ValueError:
        return sys.argv[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--fleet", default="small", choices=("tiny", "small", "demo"))
    src.add_argument("--obs", help="observation table (Parquet) instead of simulating")
    ap.add_argument("--terms", default=",".join(SUBSET_TERMS),
                    help="comma-separated beta terms, or 'default' for all 11 default terms")
    ap.add_argument("--max-rows-per-config", type=int, default=800,
                    help="subsample fitted rows per configuration (fixed seed); 0 = all")
    ap.add_argument("--configs", type=int, default=0, help="keep the first N configurations; 0 = all")
    ap.add_argument("--draws", type=int, default=1000)
    ap.add_argument("--tune", type=int, default=500)
    ap.add_argument("--chains", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target-accept", type=float, default=None,
                    help="NUTS target acceptance (default: the package's)")
    ap.add_argument("--no-noise-diagnostic", action="store_true",
                    help="skip the third fit (fast path with the noise fixed at the full posterior means)")
    ap.add_argument("--out", default="results/benchmarks/fast_vs_full",
                    help="write OUT.md and OUT.json")
    ap.add_argument("--label", default="", help="title suffix in the markdown report")
    a = ap.parse_args()
    terms = tuple(DEFAULT_TERMS) if a.terms == "default" else tuple(t for t in a.terms.split(",") if t)

    t0 = time.perf_counter()
    code = code_provenance()  # at start: the package may be edited while this runs
    if a.obs:
        obs, source = pd.read_parquet(a.obs), f"observation table {a.obs}"
    else:
        obs, source = observations_for(a.fleet, a.seed), f"synthetic fleet `{a.fleet}` (seed {a.seed})"
    rows = select_rows(obs, a.configs or None, a.max_rows_per_config or None, a.seed)
    print(f"data: {source}, {len(rows):,} rows selected in {time.perf_counter() - t0:.1f} s", flush=True)
    ident = identifiability(rows, LatencyModel(terms=terms))
    for d in ident:
        flag = "" if d["rank"] == d["active"] else "  <-- RANK DEFICIENT"
        print(f"  {d['config']:34s} rows {d['rows']:5d} active {d['active']:2d} rank {d['rank']:2d} "
              f"cond {d['cond']:.3g}; relative design rank {d['rel_rank']} sv min/max "
              f"{d['rel_sv_min_over_max']:.2g} flat {d['rel_flat_groups'] or '-'}{flag}")
    r = compare(rows, terms, a.draws, a.tune, a.chains, a.seed, a.target_accept,
                noise_diagnostic=not a.no_noise_diagnostic)
    fc, gc = r["fast_conv"], r["full_conv"]
    print(f"rows fitted: {r['rows']:,} over {len(r['configs'])} configurations; coefficients: "
          f"{r['n_beta']} beta + {len(r['coefs']) - r['n_beta']} alpha")
    print(f"fast (laplace-hierarchy): {r['fast_s']:.1f} s {r['fast_timings']}  R-hat "
          f"{fc['max_rhat']:.3f} ESS {fc['min_ess_bulk']:.0f} div {fc['divergences']}")
    print(f"full-data NUTS:           {r['full_s']:.1f} s {r['full_timings']}  R-hat "
          f"{gc['max_rhat']:.3f} ESS {gc['min_ess_bulk']:.0f} div {gc['divergences']}")
    print(f"speed-up: {r['ratio']:.1f}x (sampling only {r['sampling_ratio']:.1f}x; CPU seconds "
          f"{r['fast_cpu_s']:.0f} vs {r['full_cpu_s']:.0f}, {r['cpu_ratio']:.1f}x)")
    items = [(n, r[n]) for n in ("all_active", "beta_active", "alpha_active", "prior_only")]
    if "noise_diagnostic" in r:
        items.append(("diagnostic, noise fixed at full posterior: all_active",
                      r["noise_diagnostic"]["all_active"]))
    for name, s in items:
        if not s.get("n"):
            print(f"{name}: no elements")
            continue
        print(f"{name}: n {s['n']}, |z| median {s['median_abs_z']:.3f} max {s['max_abs_z']:.3f}, "
              f"< 0.1 sd {s['share_lt_0.1']:.0%}, < 0.2 sd {s['share_lt_0.2']:.0%}; MCSE-only "
              f"expected median |z| {s['expected_median_abs_z_mc']:.3f}; RMS z {s['rms_z']:.3f} "
              f"(MCSE {s['rms_z_mc']:.3f}, systematic {s['rms_z_systematic']:.3f}); sd ratio median "
              f"{s['sd_ratio_median']:.3f} [{s['sd_ratio_min']:.3f}, {s['sd_ratio_max']:.3f}]")
    print("worst elements:")
    for e in r["worst"][:5]:
        print(f"  {e['config']:34s} {e['coef']:20s} z {e['z']:+.3f} (MCSE-z {e['z_mc_sd']:.3f}) "
              f"mean {e['mean_fast']:.5g} vs {e['mean_full']:.5g}, sd {e['sd_fast']:.3g} vs {e['sd_full']:.3g}")
    if a.out:
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        meta = {"command": "python " + " ".join([_script_path(), *sys.argv[1:]]),
                "label": a.label or f"{a.fleet if not a.obs else Path(a.obs).name}, terms {a.terms}",
                "source": source, "max_rows_per_config": a.max_rows_per_config, "configs_arg": a.configs,
                "seed": a.seed,
                "draws": a.draws, "tune": a.tune, "chains": a.chains, "terms": list(terms),
                "machine": f"{platform.machine()}, Python {platform.python_version()}",
                "code": code, "wall_total_s": time.perf_counter() - t0,
                "identifiability": ident}
        out.with_suffix(".md").write_text(markdown(r, meta))
        out.with_suffix(".json").write_text(json.dumps({"meta": meta, "result": r}, indent=1, default=float))
        print(f"wrote {out.with_suffix('.md')} and {out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
