"""The report of ``benchmarks/ingest_scale.py``: its result dict (``OUT.json``) as markdown.

``python benchmarks/ingest_scale_report.py [OUT]`` renders ``OUT.md`` from ``OUT.json``
(default ``results/benchmarks/ingest_scale``) without measuring anything.
"""

from __future__ import annotations

from pathlib import Path

#: Peak RSS a worker may reach (GB).
MEM_BUDGET_GB = 3.0
#: Ingest throughput goal (MB of traces per second per core).
TARGET_MB_S_PER_CORE = 50.0


def _numba_lines(j: dict) -> list[str]:
    """Section 1's start-up and compile costs of the compiled batch rebuild (when measured)."""
    nb = j.get("numba")
    if not nb:
        return []
    cold, warm = nb["cold_cache"], nb["warm_cache"]

    def rng(runs: list[dict], k: str) -> str:
        lo, hi = f"{min(r[k] for r in runs):.2f}", f"{max(r[k] for r in runs):.2f}"
        return lo if lo == hi else f"{lo}-{hi}"

    return [
        "The batch rebuild's loops (`data/rebuild/kernel.py`) and "
        "the OTLP scanner (`data/otlp/scan.py`) run compiled by numba, "
        "loaded on the first trace read. What that "
        "costs a fresh process, CPU seconds of the import of `data.experiment`, then of the "
        "inline ingest of the first and of the second demo experiment, each in a fresh process "
        "(an empty numba cache: compilation; the cache filled, 2 runs):",
        "",
        "| | import | first experiment | second experiment | numba loaded |",
        "|---|---|---|---|---|",
        f"| empty cache (compiles) | {cold['import']:.2f} | {cold['first']:.2f} | "
        f"{cold['second']:.2f} | {cold['numba']} |",
        f"| cache filled | {rng(warm, 'import')} | {rng(warm, 'first')} | "
        f"{rng(warm, 'second')} | {warm[0]['numba']} |",
        "",
    ]


def _parquet_lines(j: dict) -> list[str]:
    """Section 1's table of Parquet writer options (when measured)."""
    pq_ = j.get("parquet")
    if not pq_:
        return []
    conv = pq_["arrow_conversion_cpu_s"]
    return [
        f"Parquet writer options: the demo fleet's {pq_['files']} partitions written with "
        "`pyarrow.parquet.write_table` (best of 3, CPU seconds; the Arrow conversion "
        f"`tables._arrow_table`, {conv:.3f} CPU-s, is shared by all and not included; load "
        f"average {pq_['load_average']}); MB of traces per CPU-s of conversion + write; "
        "\"reads back identical\": every file read with `pd.read_parquet` equals the written "
        "variant's (exact).",
        "",
        "| options | write CPU s | MB of traces per CPU-s | files MB | reads back identical |",
        "|---|---|---|---|---|",
        *[f"| {name} | {v['cpu_s']:.3f} | {j['trace_mb'] / (conv + v['cpu_s']):.0f} | "
          f"{v['mb']:.2f} | {v['reads_back_identical']} |"
          for name, v in pq_["variants"].items()],
        "",
    ]


def _defaults_lines(c: dict) -> list[str]:
    """Section 3's comparison of Dask's default worker settings with ``local_cluster``'s."""
    ab = c.get("dask_defaults_ab")
    if not ab:
        return []
    d, lc = ab["dask_defaults"], ab["local_cluster"]
    return [
        f"- One worker with Dask's default settings against `parallel.local_cluster`'s (no "
        f"`MALLOC_TRIM_THRESHOLD_`, no profiler), on the first {ab['experiments']} experiments "
        f"({ab['trace_mb']} MB), alternating {ab['rounds']} times, best of each (load average "
        f"{ab['load_average']}): {d['cpu_s']} against {lc['cpu_s']} worker CPU-s "
        f"({d['mb_per_cpu_s']} against {lc['mb_per_cpu_s']} MB per CPU-s), of which system "
        f"{d['system_cpu_s']} against {lc['system_cpu_s']}; peak RSS {d['peak_rss_gb']} against "
        f"{lc['peak_rss_gb']} GB.",
    ]


def _target_lines(c: dict) -> list[str]:
    """Section 3's verdict on the 50 MB/s per core target, for 1 and for 2 workers."""
    r1, r2 = c["runs"]["1_workers"], c["runs"]["2_workers"]
    out = []
    for n, r in ((1, r1), (2, r2)):
        per = r["ingest_mb_s_per_core"]
        warm = r.get("warm_up")
        with_warm = (c["fleet_trace_mb"] / (r["ingest_s"] + warm["s"]) / n) if warm else None
        target_s = c["fleet_trace_mb"] / TARGET_MB_S_PER_CORE / n
        out.append(
            f"- Target {TARGET_MB_S_PER_CORE:.0f} MB/s per core, {n} worker{'s' * (n > 1)} "
            f"({target_s:.1f} s wall): {'met' if per >= TARGET_MB_S_PER_CORE else 'NOT met'} "
            f"({per} MB/s per core in {r['ingest_s']} s"
            + (f"; {with_warm:.1f} counting the warm-up" if with_warm is not None else "")
            + f"; {r['ingest_mb_per_cpu_s']} MB per worker CPU-second; load average "
            f"{r['load_average_at_start']} at the start, {r['load_average_at_end']} at the end).")
    return out


def markdown(r: dict) -> str:
    """The report (``OUT.md``) of a result dict (``OUT.json``)."""
    j, s, c = r["json"], r["same"], r["scale"]
    r1, r2 = c["runs"]["1_workers"], c["runs"]["2_workers"]
    stages = j["stage_cpu_s"]
    stage_text = (
        "Ingest of the demo fleet inline, CPU per stage (best of 2): with the columnar path "
        "(the default for 256 MB of traces or more) and with every line read line by line "
        "(the default below that); tables, observations and Parquet included; MB per CPU-s.")
    lines = [
        "# Ingest and stage 1 on Dask distributed (`benchmarks/ingest_scale.py`)",
        "",
        f"Machine: {r['machine']}. Runs: "
        f"{', '.join(f'{k} {v}' for k, v in r.get('dates', {}).items()) or r.get('date')}; load average "
        f"{r1['load_average_at_start']}-{r2['load_average_at_end']} during the scale runs "
        "(the 2 cores are shared with other jobs, so wall-time figures are pessimistic; "
        "MB per worker CPU-second is not affected by waiting for a core).",
        "",
        *([f"`uptime` at the start of the run: `{r['uptime'].get('start')}`; at the end: "
           f"`{r['uptime'].get('end')}`.", ""] if r.get("uptime") else []),
        "## 1. Where ingest time goes (demo fleet traces, one process)",
        "",
        f"{j['trace_mb']} MB of OTLP JSON Lines; MB per CPU-second of this process (wall-time "
        f"MB/s in brackets); load average {j.get('load_average')} at the end.",
        "",
        "| decoding the lines only (best of 3) | MB per CPU-s (MB/s) |",
        "|---|---|",
        *[f"| {name} | {j[f'decode_mb_per_cpu_s[{name}]']} ({j[f'decode_mb_s[{name}]']}) |"
          for name in ("json.loads", "msgspec", "orjson", "msgspec typed")
          if f"decode_mb_per_cpu_s[{name}]" in j],
        *([f"| compiled scanner of the OTLP fields (`data/otlp/scan.py`, whole files) | "
           f"{j['decode_mb_per_cpu_s[scanner]']} ({j['decode_mb_s[scanner]']}) |"]
          if "decode_mb_per_cpu_s[scanner]" in j else []),
        f"| `read_otlp` end to end, generic path (msgspec to dicts, dict walk) | "
        f"{j['read_otlp_mb_per_cpu_s[generic]']} ({j['read_otlp_mb_s[generic]']}) |",
        f"| `read_otlp` end to end, typed path (msgspec Structs, numpy tables) | "
        f"{j['read_otlp_mb_per_cpu_s[typed]']} ({j['read_otlp_mb_s[typed]']}) |",
        f"| `read_otlp` end to end, columnar path with the compiled scanner (the default) | "
        f"{j['read_otlp_mb_per_cpu_s[columnar]']} ({j['read_otlp_mb_s[columnar]']}) |",
        "",
        f"Tables and reports of the three paths identical: {j['tables_identical']}. "
        "\"msgspec typed\" decodes each line straight into Structs of the OTLP schema; a line "
        "the schema refuses takes the generic path. The columnar path reads 4 MB chunks of "
        "lines with the compiled scanner (numba; spans, events and attributes as flat tables, "
        "keys matched, integers parsed in the scan) and builds the columns with numpy; a "
        "chunk the scanner refuses is read line by line.",
        "",
        stage_text,
        "",
        "| stage | CPU s | share | MB per CPU-s | line by line: CPU s (MB per CPU-s) |",
        "|---|---|---|---|---|",
        *[f"| {k} | {v:.2f} | {100 * v / stages['total']:.0f}% | "
          f"{j['trace_mb'] / v:.1f} | "
          f"{lp:.2f} ({j['trace_mb'] / lp:.1f}) |"
          for k, v in sorted(stages.items(), key=lambda kv: -kv[1]) if v > 0
          for lp in [max(j.get("stage_cpu_s_line_path", {}).get(k, float("nan")), 1e-9)]],
        "",
        *_numba_lines(j),
        *_parquet_lines(j),
        "## 2. Same results (demo fleet)",
        "",
        f"- Ingest inline {s['ingest_inline_s']} s, on LocalCluster(2 workers) "
        f"{s['ingest_2_workers_s']} s (cluster already running); all tables identical "
        f"(`assert_frame_equal`, exact): {s['tables_identical']} "
        f"({', '.join(f'{k} {v:,}' for k, v in s['table_rows'].items())} rows).",
        f"- Stage 1 ({s['stage1_configs']} configurations, {s['stage1_rows']:,} rows): inline "
        f"{s['stage1_inline_s']} s, 2 workers {s['stage1_2_workers_s']} s; largest relative "
        f"difference of theta_hat / grad / info / loglik: {s['stage1_max_rel_diff']:.1e} "
        "(limit 1e-12).",
        f"- Demo fit (training rows, DEMO_FIT settings, {s['posterior_draws']}): stage 1 inline "
        f"{s['fit_inline']} vs on the cluster {s['fit_2_workers']}; largest absolute "
        f"difference of the posterior draws: "
        f"{', '.join(f'{k} {v:.1e}' for k, v in s['posterior_max_abs_diff'].items())} "
        "(the point is equality; the demo itself draws 4000 per chain to pass its gates).",
        "",
        f"## 3. Scale: {c['experiments']} experiments, {c['fleet_trace_mb']:,} MB of traces "
        f"({c['factor_bytes']}x the demo fleet's {c['demo_trace_mb']} MB)",
        "",
        "Copies of the demo fleet's experiments under new ids (`<id>-rNN`), generated in "
        f"{c['generate_s']} s outside the repository and deleted afterwards. One run, a local "
        "cluster of 1 then 2 worker processes (1 thread each); ingest = read + rebuild + "
        "observations + Parquet partitions of every experiment, in tasks of several "
        "experiments (`run_units(batch=True)`: largest first, tasks of decreasing size); "
        "stage 1 = one task per configuration."
        + (" Each cluster's workers were warmed when it started (imports, and the compiled "
           "kernels loaded by ingesting one demo experiment in memory; not in the ingest "
           "times, its cost is the warm-up row)." if "warm_up" in r1 else ""),
        "",
        "| | 1 worker | 2 workers |",
        "|---|---|---|",
        f"| ingest wall time | {r1['ingest_s']} s | {r2['ingest_s']} s |",
        f"| ingest MB/s | {r1['ingest_mb_s']} | {r2['ingest_mb_s']} |",
        f"| ingest MB/s per core | {r1['ingest_mb_s_per_core']} | {r2['ingest_mb_s_per_core']} |",
        f"| ingest MB per worker CPU-second | {r1['ingest_mb_per_cpu_s']} | "
        f"{r2['ingest_mb_per_cpu_s']} |",
        f"| ingest worker CPU-s (of which system) | {r1['ingest_worker_cpu_s']} "
        f"({r1.get('ingest_worker_system_cpu_s', '')}) | {r2['ingest_worker_cpu_s']} "
        f"({r2.get('ingest_worker_system_cpu_s', '')}) |",
        *([f"| ingest CPU-s of the client process (client, scheduler, nannies) | "
           f"{r1['ingest_client_cpu_s']} | {r2['ingest_client_cpu_s']} |",
           f"| ingest idle core-s (workers x wall - worker CPU) | {r1['ingest_idle_core_s']} | "
           f"{r2['ingest_idle_core_s']} |"] if "ingest_client_cpu_s" in r1 else []),
        *([f"| warm-up at cluster start: s (worker CPU-s) | {r1['warm_up']['s']} "
           f"({r1['warm_up']['worker_cpu_s']}) | {r2['warm_up']['s']} "
           f"({r2['warm_up']['worker_cpu_s']}) |",
           f"| ingest MB/s per core, warm-up included | "
           f"{c['fleet_trace_mb'] / (r1['ingest_s'] + r1['warm_up']['s']):.1f} | "
           f"{c['fleet_trace_mb'] / (r2['ingest_s'] + r2['warm_up']['s']) / 2:.1f} |",
           f"| load average at start / end of the ingest | {r1['load_average_at_start']} / "
           f"{r1['load_average_at_end']} | {r2['load_average_at_start']} / "
           f"{r2['load_average_at_end']} |"] if "warm_up" in r1 else []),
        f"| ingest peak RSS per worker (GB) | {max(r1['ingest_peak_rss_gb'].values())} | "
        f"{max(r2['ingest_peak_rss_gb'].values())} |",
        f"| stage 1 ({r1['stage1_configs']} configurations, {r1['stage1_rows']:,} rows) | "
        f"{r1['stage1_s']} s | {r2['stage1_s']} s |",
        f"| stage 1 peak RSS per worker (GB) | {max(r1['stage1_peak_rss_gb'].values())} | "
        f"{max(r2['stage1_peak_rss_gb'].values())} |",
        "",
        f"- Per-core ingest throughput ratio 2 workers / 1 worker: {c['per_core_ratio_2_over_1']} "
        f"(speed-up {c['speedup_2_over_1']}x; stage 1 {c['stage1_speedup_2_over_1']}x).",
        f"- Peak RSS of any worker: {c['peak_rss_per_worker_gb']} GB (budget {MEM_BUDGET_GB} GB: "
        f"{'met' if c['within_memory_budget'] else 'NOT met'}).",
        *_target_lines(c),
        *([f"- Inline against the workers: the demo fleet inline takes {stages['total']:.2f} "
           f"CPU-s (section 1, {j['trace_mb'] / stages['total']:.1f} MB per CPU-s), "
           f"{c['factor_bytes'] * stages['total']:.1f} CPU-s for this fleet's "
           f"{c['factor_bytes']}x the bytes; the workers spent {r1['ingest_worker_cpu_s']} / "
           f"{r2['ingest_worker_cpu_s']} CPU-s, so "
           f"{r1['ingest_worker_cpu_s'] - c['factor_bytes'] * stages['total']:.1f} / "
           f"{r2['ingest_worker_cpu_s'] - c['factor_bytes'] * stages['total']:.1f} CPU-s "
           "(1 / 2 workers) more than inline (a negative figure: less; the workers were "
           "warmed first; CPU time per unit of work also grows with the load of the shared "
           "machine)."]
          if "factor_bytes" in c else []),
        *_defaults_lines(c),
        "- Where the rest goes (section 1, inline): "
        + ", ".join(f"{k} {100 * v / stages['total']:.0f}%"
                    for k, v in sorted(stages.items(), key=lambda kv: -kv[1])
                    if k != "total" and v > 0)
        + (f". The compiled scanner runs at {j['decode_mb_per_cpu_s[scanner]']} MB per CPU-s "
           f"({j['trace_mb'] / j['decode_mb_per_cpu_s[scanner]']:.2f} CPU-s of the "
           f"{stages['total']:.2f}); 50 MB per CPU-s is "
           f"{j['trace_mb'] / TARGET_MB_S_PER_CORE:.2f} CPU-s for the demo fleet."
           if "decode_mb_per_cpu_s[scanner]" in j else "."),
        f"- 1-worker and 2-worker tables identical (exact): "
        f"{', '.join(f'{k} {v:,}' for k, v in c['tables_1w_vs_2w'].items())} rows; stage 1 "
        f"largest relative difference {c['stage1_1w_vs_2w_max_rel_diff']:.1e}.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?", type=Path,
                    default=Path(__file__).resolve().parents[1] / "results" / "benchmarks"
                    / "ingest_scale", help="OUT of the benchmark (reads OUT.json, writes OUT.md)")
    out = ap.parse_args(argv).out
    if not out.with_suffix(".json").is_file():
        ap.error(f"{out.with_suffix('.json')}: no such result file")
    out.with_suffix(".md").write_text(markdown(json.loads(out.with_suffix(".json").read_text())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
