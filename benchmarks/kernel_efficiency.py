"""How much of its datasheet each GPU reaches on GEMMs, from AIConfigurator's measured tables.

    python benchmarks/kernel_efficiency.py [--framework vllm] [--out results/benchmarks/kernel_efficiency]

Reads the installed ``aiconfigurator-core`` (``pip install 'bayes_latency[kernels]'``) with
:func:`bayes_latency.data.kernels.read_gemm_tables` and writes ``OUT.md`` / ``OUT.json``: per GPU
and dtype the median share of the datasheet peak that compute-bound GEMMs reach and the share of
the datasheet bandwidth that memory-bound ones reach
(:func:`~bayes_latency.data.kernels.roofline_efficiency`), each beside the H100's. The roofline
terms of a serving step (compute at the datasheet peak, weights read at the datasheet bandwidth)
assume the same share on every GPU; the ratio to the H100 is how much faster or slower than the
datasheet ratio the same term runs on another GPU.
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
    MIN_FLOPS,
    MIN_MEMORY_BYTES,
    kernel_data_root,
    read_gemm_tables,
    roofline_efficiency,
)
from bayes_latency.io import atomic_write_text, check_output_path  # noqa: E402

REFERENCE = "H100-SXM"


def render(eff, tables, framework: str, mach: dict, version: str) -> str:
    """The report's markdown."""
    ref = {dt: eff.loc[(REFERENCE, dt)] for dt in eff.loc[REFERENCE].index} \
        if REFERENCE in eff.index.get_level_values(0) else {}
    lines = [
        "# GEMM efficiency per GPU (AIConfigurator's measured tables)",
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
        "What a kernel table can say about a serving step: how close each GPU comes to its "
        "datasheet on the GEMMs that make up a step's compute and weight reads. What it cannot: "
        "what a step adds around its kernels (scheduling, launches between layers, attention "
        "and communication kernels, the framework's own overhead), which the step-level "
        "coefficients carry.",
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
    version = metadata.version("aiconfigurator-core")
    atomic_write_text(out.with_suffix(".md"), render(eff, tables, args.framework, machine(),
                                                     version))
    atomic_write_text(out.with_suffix(".json"), json.dumps({
        "aiconfigurator_core": version, "framework": args.framework,
        "files": [str(p.relative_to(p.parents[5])) for p in tables.files],
        "dropped": tables.dropped,
        "efficiency": [{"gpu": g, "dtype": d, **{k: (None if v != v else v)
                                                  for k, v in r.items()}}
                       for (g, d), r in eff.iterrows()]}, indent=1))
    print(f"wrote {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    from bayes_latency.errors import BayesLatencyError

    try:
        raise SystemExit(main())
    except BayesLatencyError as exc:
        raise SystemExit(f"kernel_efficiency: error: {exc}") from None
