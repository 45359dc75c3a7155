"""How much of its datasheet each GPU reaches on GEMMs and all-reduces, from AIConfigurator's
measured tables.

    python benchmarks/kernel_efficiency.py [--framework vllm] [--out results/benchmarks/kernel_efficiency]

Reads the installed ``aiconfigurator-core`` (``pip install 'bayes_latency[kernels]'``) with
:func:`bayes_latency.data.kernels.read_gemm_tables` and writes ``OUT.md`` / ``OUT.json``: per GPU
and dtype the median share of the datasheet peak that compute-bound GEMMs reach and the share of
the datasheet bandwidth that memory-bound ones reach
(:func:`~bayes_latency.data.kernels.roofline_efficiency`), each beside the H100's. The roofline
terms of a serving step (compute at the datasheet peak, weights read at the datasheet bandwidth)
assume the same share on every GPU; the ratio to the H100 is how much faster or slower than the
datasheet ratio the same term runs on another GPU. From the NCCL all-reduce tables
(:func:`~bayes_latency.data.kernels.read_allreduce_tables`), per GPU and TP degree, the
``tp_allreduce`` coefficient of BLIS's basis where bandwidth sets the time, the fixed time of one
call, and the coefficient at step-sized messages
(:func:`~bayes_latency.data.kernels.allreduce_coefficient`), beside the prior file's median.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _provenance import machine  # noqa: E402

from bayes_latency.data.kernels import (  # noqa: E402
    BOUND_RATIO,
    MIN_BANDWIDTH_BYTES,
    MIN_FLOPS,
    MIN_MEMORY_BYTES,
    allreduce_coefficient,
    kernel_data_root,
    read_allreduce_tables,
    read_gemm_tables,
    roofline_efficiency,
)
from bayes_latency.io import atomic_write_text, check_output_path  # noqa: E402
from bayes_latency.priors import load_priors  # noqa: E402

REFERENCE = "H100-SXM"


def allreduce_lines(ar, comm, priors) -> list[str]:
    """The all-reduce section: per GPU and TP degree, the kernel tables' coefficient beside the
    prior file's median of ``tp_allreduce`` for that GPU."""
    lines = [
        "## All-reduce: the `tp_allreduce` coefficient",
        "",
        "NCCL all-reduce tables (`comm/nccl`, newest version per GPU: "
        + ", ".join(f"`{p.parent.parent.parent.parent.name}` {p.parent.name}" for p in comm.files)
        + f"; {len(comm.table):,} half-precision all-reduces read"
        + (", dropped: " + ", ".join(f"{k} {v}" for k, v in comm.dropped.items())
           if comm.dropped else ", none dropped") + "). BLIS charges an all-reduce of `M` bytes "
        "`M 2 (tp - 1) / tp / HBM` µs of feature; over the messages of at least "
        f"{MIN_BANDWIDTH_BYTES / 2**20:.0f} MiB the measured latency is fitted as `per-call "
        "time + coefficient x feature`: the coefficient is the time per µs of feature where "
        "bandwidth sets it (HBM bandwidth over the bus bandwidth NCCL reaches), the per-call "
        "time what the feature cannot carry (two calls per layer: `per_layer`'s share). `at 1 "
        "MiB` / `at 8 MiB`: latency over feature at those message sizes (a decode batch of 64 "
        "and a prefill chunk of 512 tokens of an 8,192-wide model), the coefficient a step "
        "would need without the per-call time. `prior`: `priors/default.yaml`'s median for "
        "the GPU.",
        "",
        "| GPU | TP | coefficient | per-call µs | at 1 MiB | at 8 MiB | prior | coefficient / prior |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (gpu, tp), r in ar.iterrows():
        prior = float(priors.term("tp_allreduce", gpu)["median"])
        lines.append(f"| {gpu} | {tp} | {r['coefficient']:.1f} | {r['latency_call_us']:.0f} | "
                     f"{r['coef_at_1mib']:.1f} | {r['coef_at_8mib']:.1f} | {prior:g} | "
                     f"{r['coefficient'] / prior:.2f} |")
    return lines + [""]


def render(eff, tables, framework: str, mach: dict, version: str,
           extra: list[str] | None = None) -> str:
    """The report's markdown (``extra``: the all-reduce section)."""
    ref = {dt: eff.loc[(REFERENCE, dt)] for dt in eff.loc[REFERENCE].index} \
        if REFERENCE in eff.index.get_level_values(0) else {}
    lines = [
        "# GEMM and all-reduce efficiency per GPU (AIConfigurator's measured tables)",
        "",
        f"Regenerate: `python benchmarks/kernel_efficiency.py --framework {framework}`. "
        f"Data: `aiconfigurator-core` {version}, `gemm/{framework}` tables, newest version per "
        f"GPU: " + ", ".join(f"`{p.parent.parent.parent.parent.name}` {p.parent.name}"
                             for p in tables.files) + f"; {len(tables.table):,} GEMMs read"
        + (", dropped: " + ", ".join(f"{k} {v}" for k, v in tables.dropped.items())
           if tables.dropped else ", none dropped") + ".",
        f"Run on {mach['cpu']}, {mach['cores']} cores, 1-minute load average {mach['load']}; "
        f"code: {mach['code']}.",
        "",
        f"Compute-bound: compute time at the datasheet peak at least {BOUND_RATIO:g}x the memory "
        f"time and at least {MIN_FLOPS:.0e} FLOPs; memory-bound: memory time at the datasheet "
        f"bandwidth (operands read once, result written once) at least {BOUND_RATIO:g}x the "
        f"compute time and at least {MIN_MEMORY_BYTES / 2**20:.0f} MiB moved. Share = datasheet "
        "time / measured latency (median, 10th-90th percentile); `vs H100` = the share over the "
        "H100's for the same dtype (below 1: the GPU runs that term slower than its datasheet "
        "says relative to the H100).",
        "",
        "| GPU | dtype | compute share | q10-q90 | n | vs H100 | memory share | q10-q90 | n | vs H100 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (gpu, dt), r in eff.iterrows():
        rr = ref.get(dt)

        def rel(col: str, rr=rr, r=r) -> str:
            return "" if rr is None or not rr[col] == rr[col] else f"{r[col] / rr[col]:.2f}"

        lines.append(
            f"| {gpu} | {dt} | {r['compute_eff']:.3f} | {r['compute_q10']:.2f}-"
            f"{r['compute_q90']:.2f} | {int(r['n_compute'])} | {rel('compute_eff')} | "
            f"{r['memory_eff']:.3f} | {r['memory_q10']:.2f}-{r['memory_q90']:.2f} | "
            f"{int(r['n_memory'])} | {rel('memory_eff')} |")
    lines += [
        "",
        *(extra or []),
        "What a kernel table can say about a serving step: how close each GPU comes to its "
        "datasheet on the GEMMs that make up a step's compute and weight reads, and what an "
        "all-reduce of a given size costs on its interconnect at each TP degree. What it "
        "cannot: what a step adds around its kernels (scheduling, launches between layers, "
        "attention kernels, the framework's own overhead and its own all-reduce kernels, such "
        "as vLLM's custom all-reduce for small messages), which the step-level coefficients "
        "carry.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--framework", default="vllm")
    ap.add_argument("--out", default=str(ROOT / "results" / "benchmarks" / "kernel_efficiency"),
                    help="output prefix (writes PREFIX.md and PREFIX.json)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    root = kernel_data_root()
    for suffix in (".md", ".json"):  # checked before the tables are read
        check_output_path(out.with_suffix(suffix), [root] if root else [], kind="file")
    tables = read_gemm_tables(framework=args.framework)
    eff = roofline_efficiency(tables.table)
    comm = read_allreduce_tables()
    ar = allreduce_coefficient(comm.table)
    version = metadata.version("aiconfigurator-core")
    atomic_write_text(out.with_suffix(".md"), render(
        eff, tables, args.framework, machine(), version,
        allreduce_lines(ar, comm, load_priors(ROOT / "priors" / "default.yaml"))))
    atomic_write_text(out.with_suffix(".json"), json.dumps({
        "aiconfigurator_core": version, "framework": args.framework,
        "files": [str(p.relative_to(p.parents[5])) for p in tables.files],
        "dropped": tables.dropped,
        "efficiency": [{"gpu": g, "dtype": d, **{k: (None if v != v else v)
                                                  for k, v in r.items()}}
                       for (g, d), r in eff.iterrows()],
        "allreduce_files": [str(p.relative_to(p.parents[5])) for p in comm.files],
        "allreduce_dropped": comm.dropped,
        "allreduce": [{"gpu": g, "tp": int(t), **{k: (None if v != v else v)
                                                   for k, v in r.items()}}
                      for (g, t), r in ar.iterrows()]}, indent=1))
    print(f"wrote {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    from bayes_latency.errors import BayesLatencyError

    try:
        raise SystemExit(main())
    except BayesLatencyError as exc:
        raise SystemExit(f"kernel_efficiency: error: {exc}") from None
