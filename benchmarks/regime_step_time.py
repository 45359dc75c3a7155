"""Additive against regime step time on the real fleet: held-out lpd, in-sample fit, the knees.

The real fleet (:func:`~bayes_latency.study.realdata.load_real_data`: the step rows of the two
real vLLM runs on H100 and the Splitwise benchmark rows of Llama-2-70B and Bloom-176B on A100 and
H100) is fitted twice, as ``bayes-latency fit`` does (2 x 2000 draws after 1000 tuning steps,
sampling on until the convergence gates pass):

- **additive** (``--terms blis``): BLIS's 11 terms;
- **regime** (``--terms regime``): the same plus the compute knees ``compute_over_2w`` and
  ``compute_over_6w`` (``max(C - k W, 0)``: a step's compute past k times its weight read), so
  that a step bends from weight-read-bound to compute-bound; knee coefficients at 0 are the
  additive model.

Reported, side by side:

1. **held-out lpd**: PSIS-LOO expected log predictive density of every fitted row
   (:func:`~bayes_latency.checks.diagnostics.compare_variants`), its difference and standard
   error, and the Pareto k of both fits;
2. **in-sample** per Splitwise cell and phase: MdAPE of the predictive median, 90% band coverage
   and median relative width (200 predictive draws), and the same for the traced step rows;
3. **the knees' posterior** per configuration: ``prefill_compute`` (the slope of a step's compute
   below the first knee), the two knee coefficients and the slope past both knees relative to
   the slope below them (1 is additive);
4. **the prefill knee** (figure): per Splitwise cell, the prefill time of one prompt at batch 1
   against its length, measured points over both models' 90% bands of the expected step time.

Usage::

    python benchmarks/regime_step_time.py [--work DIR] [--out PREFIX]

``--work`` (default ``/tmp/regime_step_time``) keeps the two fits (``fit_<name>.nc``); a fit
found there is not run again. A saved fit keeps 400 draws per chain (``LatencyModel.save``), so
a report made from saved fits differs from a fresh run's by that thinning's Monte Carlo error
(measured: Bloom's additive prefill MdAPE 21.3% fresh, 25.3% from the saved fits). Outputs ``PREFIX.md``, ``PREFIX.json`` and ``PREFIX.png`` (default
``results/benchmarks/regime_step_time``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._provenance import machine_line, record_machine  # noqa: E402

#: The two models, by term set name (:data:`bayes_latency.physics.basis.TERM_SETS`).
MODELS = ("blis", "regime")
LABEL = {"blis": "additive", "regime": "regime"}
#: Predictive draws per row.
N_DRAWS = 200
#: Prompt lengths of the knee figure (tokens, batch 1).
PROMPTS = np.unique(np.geomspace(32, 8192, 48).round()).astype(float)


def _fit(obs: pd.DataFrame, name: str, work: Path, log: Any = print) -> tuple[Any, dict]:
    """The fit of ``name``'s term set, from ``work`` when there."""
    from bayes_latency.model.estimator import LatencyModel
    from bayes_latency.physics.basis import TERM_SETS
    from bayes_latency.study.cv import fit_ours
    from bayes_latency.study.settings import CLI_FIT

    path = work / f"fit_{name}.nc"
    info_path = work / f"fit_{name}.json"
    if path.exists() and info_path.exists():
        log(f"[regime] {name}: kept from {path}")
        return LatencyModel.load(path), json.loads(info_path.read_text())
    log(f"[regime] {name}: fitting {len(obs)} rows")
    t0 = time.perf_counter()
    m, conv = fit_ours(obs, CLI_FIT, TERM_SETS[name])
    info = {"terms": list(TERM_SETS[name]), "passed": bool(conv.get("passed")),
            "max_rhat": float(conv["max_rhat"]), "min_ess_bulk": float(conv["min_ess_bulk"]),
            "divergences": int(conv["divergences"]), "draws": int(conv["draws"]),
            "wall_s": time.perf_counter() - t0,
            "dropped": {k: int(v) for k, v in m.report.dropped.items()},
            "notes": [n for n in m.report.notes if "peak" in n]}
    m.save(path)
    info_path.write_text(json.dumps(info, indent=1))
    return m, info


def _bands(m: Any, rows: pd.DataFrame) -> pd.DataFrame:
    from bayes_latency.study.cv import ours_predictions

    band = ours_predictions(m, rows.reset_index(drop=True))
    return pd.concat([rows.reset_index(drop=True), band.drop(columns=["observed_us"],
                                                             errors="ignore")], axis=1)


def in_sample(models: dict[str, Any], obs: pd.DataFrame) -> pd.DataFrame:
    """Per model, Splitwise cell (or the traced steps) and phase: rows, MdAPE (%), coverage of
    the 90% band and its median relative width."""
    out = []
    from bayes_latency.data.observations.table import without_faster_than_peak

    fitted, _ = without_faster_than_peak(obs)  # the rows both fits keep
    for name, m in models.items():
        b = _bands(m, fitted)
        b["rel_err"] = (b["pred_median_us"] / b["value_us"] - 1.0).abs() * 100.0
        b["width"] = (b["q95_us"] - b["q05_us"]) / b["pred_median_us"]
        b["cell"] = np.where(b["source"] == "steps", "traced steps (H100 vLLM)",
                             b["config_id"].astype(str).str.replace("|", " ", regex=False))
        for (cell, phase), g in b.groupby(["cell", "phase"], sort=True):
            out.append({"model": LABEL[name], "cell": cell, "phase": phase, "rows": len(g),
                        "mdape_pct": float(g["rel_err"].median()),
                        "coverage90": float(g["in_90"].mean()),
                        "band_rel_width": float(g["width"].median())})
    return pd.DataFrame(out)


def knee_table(m: Any) -> pd.DataFrame:
    """Per fitted configuration: posterior median (5-95%) of ``prefill_compute`` and the knee
    coefficients, and of the slope past both knees over the slope below them."""
    post = m.result["posterior"]["beta"]
    rows = []
    for cfg in m.design.configs.index:
        b = post.sel(config=cfg)
        pc = b.sel(term="prefill_compute").values.ravel()
        k2 = b.sel(term="compute_over_2w").values.ravel()
        k6 = b.sel(term="compute_over_6w").values.ravel()
        ratio = (pc + k2 + k6) / pc

        def q(v: np.ndarray) -> str:
            lo, mid, hi = np.quantile(v, [0.05, 0.5, 0.95])
            return f"{mid:.3g} ({lo:.3g}-{hi:.3g})"

        rows.append({"configuration": str(cfg).replace("|", " "), "prefill_compute": q(pc), "compute_over_2w": q(k2),
                     "compute_over_6w": q(k6), "slope past 6W / below 2W": q(ratio),
                     "ratio_median": float(np.median(ratio))})
    return pd.DataFrame(rows)


def knee_curves(models: dict[str, Any], obs: pd.DataFrame, mb: pd.DataFrame) -> pd.DataFrame:
    """Per Splitwise cell: the measured batch-1 prefill points and each model's 90% band of the
    expected prefill time over :data:`PROMPTS` (``predict_batches``, the cell's own stack)."""
    from benchmarks.fewshot_cells_scores import attach_points

    out = []
    bench = obs[obs["kind"] == "benchmark_mean"]
    for cfg, cell in bench.groupby("config_id", sort=True):
        pts = attach_points(cell.reset_index(drop=True), mb)
        pts = pts[(pts["phase"] == "prefill") & (pts["batch_size"] == 1)]
        first = cell.iloc[0]
        for _, r in pts.iterrows():
            out.append({"cell": cfg, "series": "measured", "prompt": float(r["prompt_size"]),
                        "median_us": float(r["value_us"]), "q05_us": np.nan, "q95_us": np.nan})
        batches = pd.DataFrame({
            "num_prefill_reqs": 1.0, "prefill_tokens": PROMPTS,
            "prefill_attn_pairs": PROMPTS * (PROMPTS + 1) / 2, "prefill_kv_tokens": PROMPTS,
            "prefill_input_pairs": PROMPTS * PROMPTS / 2, "num_decode_reqs": 0.0,
            "decode_tokens": 0.0, "decode_ctx_tokens": 0.0})
        for name, m in models.items():
            p = m.predict_batches(batches, str(first["model"]), str(first["gpu"]),
                                  int(first["tp"]), n_draws=N_DRAWS, stack=str(first["stack"]),
                                  max_num_batched_tokens=int(PROMPTS.max()))
            for prompt, r in zip(PROMPTS, p.itertuples(), strict=True):
                out.append({"cell": cfg, "series": LABEL[name], "prompt": float(prompt),
                            "median_us": float(r.median_us), "q05_us": float(r.q05_us),
                            "q95_us": float(r.q95_us)})
    return pd.DataFrame(out)


def plot_knee(curves: pd.DataFrame, path: Path) -> None:
    """The knee figure: one panel per Splitwise cell."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = sorted(curves["cell"].unique())
    ncol = 3
    nrow = int(np.ceil(len(cells) / ncol))
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.3 * nrow), squeeze=False)
    colors = {"additive": "tab:blue", "regime": "tab:orange"}
    for ax, cell in zip(axes.ravel(), cells, strict=False):
        c = curves[curves["cell"] == cell]
        for s, col in colors.items():
            g = c[c["series"] == s].sort_values("prompt")
            ax.fill_between(g["prompt"], g["q05_us"] / 1e3, g["q95_us"] / 1e3, color=col,
                            alpha=0.25, lw=0)
            ax.plot(g["prompt"], g["median_us"] / 1e3, color=col, lw=1.4, label=f"{s} (90% band)")
        pts = c[c["series"] == "measured"]
        ax.plot(pts["prompt"], pts["median_us"] / 1e3, "ko", ms=4, label="measured")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(cell.replace("|splitwise", "").replace("|", " "), fontsize=9)
        ax.set_xlabel("prompt tokens (batch 1)")
        ax.set_ylabel("prefill ms")
        ax.grid(alpha=0.3, which="both", lw=0.4)
    for ax in axes.ravel()[len(cells):]:
        ax.axis("off")
    axes.ravel()[0].legend(fontsize=7, loc="upper left")
    fig.suptitle("Prefill of one prompt on the Splitwise cells: measured, and the expected step "
                 "time of the additive and the regime fit", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


def run(work: Path, out: Path, log: Any = print) -> dict[str, Any]:
    """Fit both models (or reuse ``work``'s fits) and write the report at ``out``."""
    from bayes_latency.checks.diagnostics import Thresholds, _loo_summary, compare_variants
    from bayes_latency.data.microbench import read_splitwise
    from bayes_latency.io import atomic_write_text
    from bayes_latency.physics.basis import REGIME_TERMS
    from bayes_latency.study.realdata import load_real_data, real_data_dir

    d = real_data_dir()
    if d is None:
        sys.exit("real data not found (../shared/data/real or $BAYES_LATENCY_REAL_DATA)")
    work.mkdir(parents=True, exist_ok=True)
    if not (work / "machine.json").exists():
        record_machine(work, "start")
    obs = load_real_data(d, terms=REGIME_TERMS).observations
    mb = read_splitwise(d / "microbench" / "splitwise_perf_model.csv")
    models, fits = {}, {}
    for name in MODELS:
        models[name], fits[name] = _fit(obs, name, work, log)
    record_machine(work, "fits done")
    cmp = compare_variants({LABEL[n]: m.result for n, m in models.items()})
    loo = {LABEL[n]: _loo_summary(m.result, Thresholds()) for n, m in models.items()}
    ins = in_sample(models, obs)
    knees = knee_table(models["regime"])
    curves = knee_curves(models, obs, mb)
    plot_knee(curves, out.with_suffix(".png"))
    record_machine(work, "end")
    res = {"fits": fits, "loo": loo,
           "compare": cmp.reset_index().rename(columns={"index": "model"}).to_dict("records"),
           "in_sample": ins.to_dict("records"), "knees": knees.to_dict("records"),
           "machine": machine_line(work)}
    atomic_write_text(out.with_suffix(".json"), json.dumps(res, indent=1, default=float) + "\n")
    atomic_write_text(out.with_suffix(".md"), render(res, out.with_suffix(".png").name))
    return res


def render(res: dict[str, Any], figure: str) -> str:
    """The markdown report of :func:`run`'s result."""
    from bayes_latency.study.markdown import _md

    ins = pd.DataFrame(res["in_sample"])
    wide = ins.pivot_table(index=["cell", "phase", "rows"], columns="model",
                           values=["mdape_pct", "coverage90", "band_rel_width"]).reset_index()
    wide.columns = [" ".join(str(c) for c in col if c).strip() for col in wide.columns]
    order = ["cell", "phase", "rows"] + [f"{s} {m}" for s in ("mdape_pct", "coverage90",
                                                              "band_rel_width")
                                         for m in ("additive", "regime")]
    wide = wide[order]
    for c in order[3:]:
        wide[c] = wide[c].map(lambda v, c=c: f"{v:.1f}" if c.startswith("mdape") else f"{v:.3f}")
    pre = ins[(ins["phase"] == "prefill")]
    by = pre.groupby("model")["mdape_pct"]
    dec = ins[(ins["phase"] == "decode") & (ins["cell"] != "traced steps (H100 vLLM)")]
    cmp = pd.DataFrame(res["compare"])
    diff = cmp.set_index("model")
    loo = res["loo"]
    knees = pd.DataFrame(res["knees"]).drop(columns=["ratio_median"])
    fits = pd.DataFrame([{"model": LABEL[n], **{k: v for k, v in f.items()
                                                 if k in ("passed", "max_rhat", "min_ess_bulk",
                                                          "divergences", "draws", "wall_s")}}
                         for n, f in res["fits"].items()])
    fits["max_rhat"] = fits["max_rhat"].map(lambda v: f"{v:.4f}")
    fits["min_ess_bulk"] = fits["min_ess_bulk"].map(lambda v: f"{v:.0f}")
    fits["wall_s"] = fits["wall_s"].map(lambda v: f"{v:.0f}")
    best = str(cmp.iloc[0]["model"])
    other = str(cmp.iloc[1]["model"])
    lines = [
        "# Additive against regime step time on the real fleet", "",
        "Regenerate: `python benchmarks/regime_step_time.py`. Fleet: the step rows of the two "
        "real vLLM runs on H100 and the Splitwise benchmark rows (Llama-2-70B, Bloom-176B on "
        "A100-80GB and H100); rows measured faster than the GPU's peak compute are dropped by "
        "the fit (" + "; ".join(f"{k}: {v}" for k, v in res["fits"]["regime"]["dropped"].items() if v)
        + "). Both fits as `bayes-latency fit` (2 chains x 2000 draws after 1000 tuning steps, "
        "sampling on until the convergence gates pass); 200 predictive draws per row.", "",
        res["machine"], "",
        "- **additive** (`--terms blis`): BLIS's 11 terms.",
        "- **regime** (`--terms regime`): the same plus `compute_over_2w` and `compute_over_6w`, "
        "`max(C - k W, 0)` with `C` the step's compute and `W` its weight read (ideal times at "
        "the datasheet's peaks): a step's compute costs `prefill_compute` per µs below twice its "
        "weight read and more past each knee. Knee coefficients at 0 are the additive model.", "",
        "## Held-out lpd (PSIS-LOO)", "",
        f"- **{best}** is ahead by {abs(float(diff.loc[other, 'elpd_diff'])):.1f} "
        f"(standard error of the difference {float(diff.loc[other, 'dse']):.1f}): elpd "
        f"{loo[best]['elpd']:.1f} against {loo[other]['elpd']:.1f} over {loo[best]['n_obs']} rows.",
        f"- Pareto k above 0.7: additive {loo['additive']['n_k_high']} rows (max "
        f"{loo['additive']['max_k']:.2f}), regime {loo['regime']['n_k_high']} (max "
        f"{loo['regime']['max_k']:.2f}).", "",
        "## In-sample, every point in the fit", "",
        f"- Splitwise prefill MdAPE per cell: additive {by.get_group('additive').min():.1f}-"
        f"{by.get_group('additive').max():.1f}% (median "
        f"{by.get_group('additive').median():.1f}%), regime "
        f"{by.get_group('regime').min():.1f}-{by.get_group('regime').max():.1f}% (median "
        f"{by.get_group('regime').median():.1f}%).",
        f"- Splitwise decode MdAPE per cell: additive "
        f"{dec[dec['model'] == 'additive']['mdape_pct'].max():.1f}% at worst, regime "
        f"{dec[dec['model'] == 'regime']['mdape_pct'].max():.1f}%.", "",
        "`mdape_pct`: MdAPE of the predictive median (%); `coverage90`: share of rows inside "
        "the 90% band; `band_rel_width`: median (q95 - q05) / median.", "",
        _md(wide), "",
        "## The knees' posterior", "",
        "Per configuration, posterior median (5-95%). `slope past 6W / below 2W` is "
        "`(prefill_compute + compute_over_2w + compute_over_6w) / prefill_compute`: how much "
        "more a µs of compute costs past both knees than below them (1: additive). The traced "
        "H100 runs' steps seldom pass the first knee (prefix-cached, chunked prefills), so "
        "their knees come from the hierarchy: the Splitwise cells inform them.", "",
        _md(knees), "",
        "## The prefill knee", "",
        f"![prefill knee]({figure})", "",
        "Batch-1 prefills of each Splitwise cell against the prompt length, measured (points) "
        "and each fit's 90% band of the expected step time (coefficients' uncertainty, without "
        "the step noise).", "",
        "## Fits", "",
        _md(fits), "",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/regime_step_time"))
    ap.add_argument("--out", type=Path, default=ROOT / "results/benchmarks/regime_step_time")
    args = ap.parse_args()
    res = run(args.work, args.out)
    failed = [n for n, f in res["fits"].items() if not f["passed"]]
    if failed:
        print(f"fits failing the convergence gates: {failed}", file=sys.stderr)
        sys.exit(1)
    print(f"wrote {args.out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
