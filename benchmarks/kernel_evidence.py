"""Kernel evidence in the fit: what vLLM's measured GEMM efficiency changes on each GPU.

Fits the fleet twice as ``bayes-latency fit`` does (the 11 default terms, sampling on until the
convergence gates pass): without and with AIConfigurator's measured GEMM efficiency per GPU
(``fit --kernels``, :mod:`bayes_latency.model.definition.kernels`), and reports:

1. **The A100's multiple of the H100's coefficient** per term (posterior median, 90%): the one
   GPU effect of the fit without kernels (learned from the Splitwise cells, the only A100
   data); with kernels, vLLM's (the GPU effect) and Splitwise's (plus the GPU x stack
   interaction); beside the kernels' own ratio ``exp(log_time[A100] - log_time[H100])``.
2. **Predicted vLLM steps** of Llama-2-70B at TP 4 (decode steps of 8 and 64 requests at 1,000
   tokens of context each; one prefill chunk of 2,048 tokens) on every GPU the kernel tables
   hold, without and with kernels: median and 90% band of a new run. The H100 is traced, the
   A100 is seen only in Splitwise's harness, the L40S and H200 are unseen (with kernels: drawn
   from their population conditioned on their kernels).
3. **What the kernel tables cost**: the time and the peak Python memory of reading them, and
   each fit's wall time and free parameters.
4. One figure, ``PREFIX.png``: per GPU, the kernels' log-time contrast to the H100 against the
   fitted or drawn effect contrast (median, 90%) of ``weight_loading`` and ``prefill_compute``,
   without and with kernels.

Usage::

    python benchmarks/kernel_evidence.py [--fleet PATH|real] [--work DIR] [--out PREFIX] [--quick]

``--fleet`` as ``benchmarks/fewshot_cells.py`` (default: the calibrated real fleet of ``study
client``). ``--work`` (default ``/tmp/kernel_evidence``) keeps the two fits (``none.nc``,
``kernels.nc``), reused when fitted to the same rows with the same settings, evidence and code
(``_provenance.fit_key``), else refitted. Outputs ``PREFIX.md``, ``PREFIX.json`` and ``PREFIX.png``
(default ``results/benchmarks/kernel_evidence``). Needs ``aiconfigurator-core`` (the optional
extra ``kernels``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._provenance import (  # noqa: E402
    fit_key,
    kept_fit_info,
    machine_line,
    record_machine,
)
from benchmarks.fewshot_cells import DEFAULT_FLEET, drop_unphysical, load_fleet  # noqa: E402

#: The fits, in report order.
FITS = ("none", "kernels")
#: Terms of the coefficient table (the kernel-measured ones, then the fixed costs per step).
TABLE_TERMS = ("weight_loading", "decode_kv", "prefill_compute", "per_layer", "per_step")
#: Posterior variables that are sampled coordinates (the rest are deterministics).
SAMPLED = ("z_", "kernel_offset", "sigma_config", "sigma_run", "tau_", "zeta_")
#: The predicted configuration and its steps.
MODEL, TP, CONTEXT = "llama-2-70b", 4, 1000
STEPS = {"decode, 8 requests": (0, 8), "decode, 64 requests": (0, 64),
         "prefill chunk, 2,048 tokens": (2048, 0)}


def step_batches() -> pd.DataFrame:
    """One batch row per step of :data:`STEPS` (decode requests at :data:`CONTEXT` tokens of
    context; a prefill chunk from an empty cache)."""
    from bayes_latency.physics import prefill_chunk_stats

    rows = []
    for p, d in STEPS.values():
        pairs, kv = prefill_chunk_stats([p], [0])
        rows.append({"num_prefill_reqs": int(p > 0), "prefill_tokens": p,
                     "prefill_attn_pairs": pairs, "prefill_kv_tokens": kv,
                     "num_decode_reqs": d, "decode_tokens": d, "decode_ctx_tokens": d * CONTEXT})
    return pd.DataFrame(rows)


def _q(a: np.ndarray) -> dict[str, float]:
    return {"median": float(np.median(a)), "q05": float(np.quantile(a, 0.05)),
            "q95": float(np.quantile(a, 0.95))}


def gpu_ratios(m: Any, ev: Any) -> list[dict[str, Any]]:
    """Per term of :data:`TABLE_TERMS`: the A100's multiple of the H100's coefficient on each
    stack (``exp`` of the effect difference; the stacks differ only with the interaction)."""
    post = m.result["posterior"].to_dataset().stack(sample=("chain", "draw"))
    gpus = [str(g) for g in post["gpu"].values]
    a, h = (next(i for i, g in enumerate(gpus) if g.startswith(p)) for p in ("A100", "H100"))
    out = []
    for term in TABLE_TERMS:
        eff = post["eff_gpu"].sel(coef=term).transpose("gpu", "sample").values
        d = eff[a] - eff[h]
        row = {"term": term, "vllm": _q(np.exp(d))}
        if "eff_gpu_stack" in post:
            gs = post["eff_gpu_stack"].sel(coef=term).fillna(0.0).transpose(
                "gpu", "sample").values  # NaN: no interaction on the term
            row["splitwise"] = _q(np.exp(d + gs[a] - gs[h]))
        if ev is not None and term in ev.terms:
            t = ev.terms.index(term)
            row["kernels"] = float(np.exp(ev.log_time[ev.index_of("A100"), t]
                                          - ev.log_time[ev.index_of("H100"), t]))
        out.append(row)
    return out


def predicted_steps(m: Any, gpus: tuple[str, ...]) -> list[dict[str, Any]]:
    """Median and 90% band (ms) of each step of :data:`STEPS` on each GPU, vLLM, a new run."""
    out = []
    batches = step_batches()
    for gpu in gpus:
        p = m.predict_batches(batches, MODEL, gpu, TP, n_draws=1000, seed=0)
        for i, name in enumerate(STEPS):
            out.append({"gpu": gpu, "step": name, "median_ms": float(p["median_us"].iloc[i]) / 1e3,
                        "q05_ms": float(p["q05_us"].iloc[i]) / 1e3,
                        "q95_ms": float(p["q95_us"].iloc[i]) / 1e3,
                        "unseen": str(p.attrs.get("unseen_levels", ""))})
    return out


def effect_contrasts(m: Any, ev: Any, terms: tuple[str, ...] = ("weight_loading",
                                                                "prefill_compute")
                     ) -> list[dict[str, Any]]:
    """Per GPU of the tables and term: the kernels' log-time contrast to the H100 and the
    effect contrast of the fit (a seen GPU's fitted effect, an unseen one's draw), median and
    90%, for vLLM."""
    from bayes_latency.model.definition.design import prior_arrays
    from bayes_latency.model.posterior.persistence import posterior_with_fixed
    from bayes_latency.model.posterior.unseen import config_log_location

    post = posterior_with_fixed(m.result).stack(sample=("chain", "draw")).transpose(
        ..., "sample")
    rng = np.random.default_rng(0)
    locs = []
    for gpu in ev.gpus:
        pa = prior_arrays(m.priors, m.coefs, [gpu])
        logt, _ = config_log_location(post, pa, MODEL, gpu, TP, "vllm", rng,
                                      design=m.design, variant=m.variant)
        locs.append(logt - pa.gpu_offset[0][None, :])
    h = ev.index_of("H100")
    out = []
    for g, gpu in enumerate(ev.gpus):
        for term in terms:
            k, t = m.coefs.index(term), ev.terms.index(term)
            out.append({"gpu": gpu, "term": term,
                        "kernel_contrast": float(ev.log_time[g, t] - ev.log_time[h, t]),
                        **{f"effect_{q}": v for q, v in _q(locs[g][:, k] - locs[h][:, k]).items()}})
    return out


def _fit(obs: pd.DataFrame, settings: Any, kernels: Any, path: Path) -> tuple[Any, dict]:
    from bayes_latency.model.estimator import LatencyModel
    from bayes_latency.physics.basis import DEFAULT_TERMS
    from bayes_latency.study.cv import fit_ours

    info = path.with_suffix(".json")
    key = fit_key(obs, settings.describe(), kernels.hash if kernels is not None else "")
    row = kept_fit_info(info, key, path)  # the same rows, settings, evidence and code
    if row is not None:
        return LatencyModel.load(path), row
    m, conv = fit_ours(obs, settings, tuple(DEFAULT_TERMS), kernels=kernels)
    post = m.result["posterior"]
    n_free = int(sum(int(np.prod(post[v].shape[2:])) for v in post.data_vars
                     if v.startswith(SAMPLED)))
    row = {"passed": bool(conv["passed"]), "max_rhat": float(conv["max_rhat"]),
           "min_ess_bulk": float(conv["min_ess_bulk"]), "divergences": int(conv["divergences"]),
           "draws": int(conv["draws"]), "wall_s": float(conv["runtime_s"]),
           "free_values": n_free, "key": key}
    m.save(path)
    info.write_text(json.dumps(row))
    return m, row


def _band(r: dict[str, float], fmt: str = ".2f") -> str:
    return f"{r['median']:{fmt}} ({r['q05']:{fmt}}-{r['q95']:{fmt}})"


def render(res: dict[str, Any], machine: str) -> str:
    """The report's markdown."""
    L = ["# Kernel evidence in the fit: vLLM's measured GEMM efficiency per GPU", "",
         "Regenerate: `python benchmarks/kernel_evidence.py`. " + machine, "",
         f"Fleet: {res['fleet']}. Fits: {res['settings']}. Kernel tables: {res['source']}.", "",
         "Without kernels the fleet has one GPU effect per term, shared by every serving stack, "
         "and the A100 appears only in Splitwise's harness. With kernels (`fit --kernels`), "
         "each GPU's vLLM GEMM efficiency measures its vLLM effect on `weight_loading`, "
         "`decode_kv` and `prefill_compute` (log sd `hierarchy.kernel`), and the other stacks "
         "depart from it by a GPU x stack interaction (`hierarchy.gpu_stack`).", "",
         "## The A100's multiple of the H100's coefficient", "",
         "Posterior median (90%). `kernels` is the tables' own ratio of datasheet multiples.",
         "", "| term | without kernels (every stack) | with kernels, vLLM | "
         "with kernels, Splitwise | kernels |", "|---|---|---|---|---|"]
    by = {(r["fit"], r["term"]): r for r in res["ratios"]}
    for term in TABLE_TERMS:
        a, b = by[("none", term)], by[("kernels", term)]
        k = b.get("kernels")
        L.append(f"| `{term}` | {_band(a['vllm'])} | {_band(b['vllm'])} | "
                 f"{_band(b['splitwise']) if 'splitwise' in b else ''} | "
                 f"{'' if k is None else f'{k:.2f}'} |")
    L += ["", f"## Predicted vLLM steps of {MODEL} at TP {TP}", "",
          f"Median (90% band of a new run) in ms; decode requests at {CONTEXT:,} tokens of "
          "context each. `unseen`: the levels the fit did not see (an unseen GPU with kernels "
          "is drawn conditioned on them).", "",
          "| GPU | step | without kernels | with kernels | change | unseen |",
          "|---|---|---|---|---|---|"]
    steps = {(r["fit"], r["gpu"], r["step"]): r for r in res["steps"]}
    for gpu in res["gpus"]:
        for name in STEPS:
            a, b = steps[("none", gpu, name)], steps[("kernels", gpu, name)]
            L.append(f"| {gpu} | {name} | {a['median_ms']:.2f} ({a['q05_ms']:.2f}-"
                     f"{a['q95_ms']:.2f}) | {b['median_ms']:.2f} ({b['q05_ms']:.2f}-"
                     f"{b['q95_ms']:.2f}) | {b['median_ms'] / a['median_ms'] - 1:+.1%} | "
                     f"{b['unseen'] or 'none'} |")
    c = res["cost"]
    L += ["", "## What the kernel tables cost", "",
          f"Reading the tables: {c['read_s']:.1f} s, peak Python memory "
          f"{c['read_peak_mib']:.0f} MiB ({c['gemms']:,} GEMMs); the fit keeps "
          f"{c['numbers']} numbers of them.", "",
          "| fit | passed | max R-hat | min bulk ESS | divergences | draws | wall s | "
          "sampled values |", "|---|---|---|---|---|---|---|---|"]
    for name in FITS:
        f = res["fits"][name]
        L.append(f"| {name} | {f['passed']} | {f['max_rhat']:.4f} | {f['min_ess_bulk']:.0f} | "
                 f"{f['divergences']} | {f['draws']} | {f['wall_s']:.0f} | "
                 f"{f['free_values']} |")
    L += ["", f"![GPU effects against their kernels]({Path(res['figure']).name})", ""]
    return "\n".join(L)


def figure(res: dict[str, Any], path: Path) -> None:
    """Kernel contrast against effect contrast per GPU and term, without and with kernels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    terms = ("weight_loading", "prefill_compute")
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), constrained_layout=True)
    for ax, term in zip(axes, terms, strict=True):
        for fit, dx, color in (("none", -0.006, "tab:gray"), ("kernels", 0.006, "tab:blue")):
            rows = [r for r in res["contrasts"] if r["fit"] == fit and r["term"] == term]
            x = np.asarray([r["kernel_contrast"] for r in rows]) + dx
            y = np.asarray([r["effect_median"] for r in rows])
            lo = y - np.asarray([r["effect_q05"] for r in rows])
            hi = np.asarray([r["effect_q95"] for r in rows]) - y
            ax.errorbar(x, y, yerr=[lo, hi], fmt="o", color=color, capsize=3,
                        label="with kernels" if fit == "kernels" else "without kernels")
            if fit == "kernels":
                for j, (r, xi) in enumerate(zip(rows, x, strict=True)):
                    ax.annotate(r["gpu"], (xi, float(hi[j] + y[j])), textcoords="offset points",
                                xytext=(0, 4 + 10 * (j % 2)), ha="center", fontsize=8)
        xs = np.asarray(ax.get_xlim())
        ax.plot(xs, xs, ":", color="k", lw=0.8, label="effect = kernels")
        ax.axhline(0.0, color="0.8", lw=0.6, zorder=0)
        ax.set_title(f"{term} (vLLM)")
        ax.set_xlabel("kernels: log time multiple, minus the H100's")
        ax.set_ylabel("effect on the log coefficient, minus the H100's")
    axes[0].legend(fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fleet", default=str(DEFAULT_FLEET),
                    help="observations.parquet of `study client`, or 'real'")
    ap.add_argument("--work", type=Path, default=Path("/tmp/kernel_evidence"))
    ap.add_argument("--out", type=Path, default=ROOT / "results/benchmarks/kernel_evidence")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()

    from bayes_latency.data.kernel_evidence import evidence_from_tables
    from bayes_latency.data.kernels import kernel_data_root, read_gemm_tables
    from bayes_latency.io import atomic_write, atomic_write_text, check_output_path
    from bayes_latency.physics.basis import DEFAULT_TERMS
    from bayes_latency.study.settings import CLI_FIT, QUICK

    if kernel_data_root() is None:
        sys.exit("aiconfigurator-core is not installed: pip install 'bayes_latency[kernels]'")
    check_output_path(args.out.with_suffix(".md"), [Path(args.fleet)] if args.fleet != "real"
                      else [], kind="file")
    obs, fleet_text = load_fleet(args.fleet, tuple(DEFAULT_TERMS))
    obs, _ = drop_unphysical(obs)
    settings = QUICK if args.quick else CLI_FIT
    args.work.mkdir(parents=True, exist_ok=True)
    record_machine(args.work, "start")
    tracemalloc.start()
    t0 = time.perf_counter()
    tables = read_gemm_tables()
    ev = evidence_from_tables(tables)
    read_s = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    gemms = len(tables.table)
    fits, models = {}, {}
    for name in FITS:
        models[name], fits[name] = _fit(obs, settings, ev if name == "kernels" else None,
                                        args.work / f"{name}.nc")
        print(f"[fit] {name}: {fits[name]['wall_s']:.0f} s, passed {fits[name]['passed']}")
    record_machine(args.work, "end")
    res: dict[str, Any] = {
        "fleet": fleet_text, "settings": settings.describe(), "source": ev.source,
        "gpus": list(ev.gpus), "fits": fits,
        "cost": {"read_s": read_s, "read_peak_mib": peak / 2**20, "gemms": gemms,
                 "numbers": int(np.size(ev.log_time))},
        "ratios": [], "steps": [], "contrasts": [],
        "figure": str(args.out.with_suffix(".png"))}
    for name in FITS:
        m = models[name]
        res["ratios"] += [{"fit": name, **r} for r in gpu_ratios(m, ev)]
        res["steps"] += [{"fit": name, **r} for r in predicted_steps(m, ev.gpus)]
        res["contrasts"] += [{"fit": name, **r} for r in effect_contrasts(m, ev)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out.with_suffix(".png"), lambda tmp: figure(res, tmp))
    atomic_write_text(args.out.with_suffix(".json"), json.dumps(res, indent=1) + "\n")
    atomic_write_text(args.out.with_suffix(".md"), render(res, machine_line(args.work)))
    print(f"wrote {args.out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
