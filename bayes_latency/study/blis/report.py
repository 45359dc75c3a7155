"""The report of the BLIS end-to-end study: ``blis_e2e.md`` and ``blis_e2e.csv``.

``bayes-latency study blis`` (:func:`main`) validates its inputs, runs the study
(:func:`bayes_latency.study.blis.e2e.run_study`) and writes its report. :func:`render_markdown`
writes the header (BLIS commit, flags, what was simulated, timing), the median errors per
coefficient source and expansion over the normal runs (:func:`summarize_errors`), one table of
runs per source (one row set per expansion) and the 90% bands of the simulated means;
:func:`write_outputs` writes both files atomically.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bayes_latency.io import atomic_write_text
from bayes_latency.study.blis.e2e import (
    DEFAULT_DRAWS,
    StudyResult,
    check_blis,
    load_sources,
    run_study,
)
from bayes_latency.study.blis.spec import (
    CLIENT_TIMEOUT_S,
    EXPANSIONS,
    FIXED_FLAGS,
    SUFFIX_TOKENS,
    BlisSetupError,
    find_runs,
    real_data_dir,
)
from bayes_latency.study.markdown import signed_pct

__all__ = ["EXPANSION_CHOICES", "METRICS", "main", "parse_expansion", "render_markdown",
           "summarize_errors", "write_outputs"]

#: The client metrics compared, real against simulated.
METRICS = ("e2e_mean", "e2e_p90", "ttft_mean", "ttft_p90", "decode_interval")


#: ``--expansion`` values: one expansion (:data:`EXPANSIONS`) or ``both``.
EXPANSION_CHOICES = (*EXPANSIONS, "both")


def parse_expansion(choice: str) -> tuple[str, ...]:
    """The expansions of a ``--expansion`` value (``both``: all of :data:`EXPANSIONS`)."""
    if choice == "both":
        return EXPANSIONS
    if choice in EXPANSIONS:
        return (choice,)
    raise BlisSetupError(f"--expansion must be one of {', '.join(EXPANSION_CHOICES)}, "
                         f"got {choice!r}")


def _with_expansion(table: pd.DataFrame) -> pd.DataFrame:
    return table if "expansion" in table else table.assign(expansion="prefix")


def summarize_errors(table: pd.DataFrame) -> pd.DataFrame:
    """Median |signed error| over the normal (non-stress) runs, one row per source x expansion
    (a table without an ``expansion`` column is the ``prefix`` expansion)."""
    table = _with_expansion(table)
    normal = table[~table["stress"].astype(bool)]
    out = []
    for (src, ex), g in normal.groupby(["source", "expansion"], sort=False):
        row: dict[str, Any] = {"source": src, "expansion": ex, "runs": len(g)}
        for m in METRICS:
            row[f"median_abs_err_{m}"] = float(np.nanmedian(np.abs(g[f"err_{m}"])))
        if "e2e_mean_in_band" in g and g["e2e_mean_in_band"].notna().any():
            for m in ("e2e_mean", "ttft_mean"):
                row[f"{m}_in_band"] = int(np.nansum(g[f"{m}_in_band"]))
                row[f"median_band_{m}_width"] = float(np.nanmedian(g[f"band_{m}_width"]))
        out.append(row)
    return pd.DataFrame(out)


def _runs_table(g: pd.DataFrame) -> list[str]:
    lines = ["| expansion | run | E2E mean real / sim (s) | err | E2E P90 err | "
             "TTFT mean real / sim (s) | err | TTFT P90 err | decode interval real / sim (ms) | "
             "err |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for _, r in g.iterrows():
        lines.append(
            f"| {r['expansion']} | {r['run']} | "
            f"{r['real_e2e_mean_s']:.3f} / {r['sim_e2e_mean_s']:.3f} | "
            f"{signed_pct(r['err_e2e_mean'])} | {signed_pct(r['err_e2e_p90'])} | "
            f"{r['real_ttft_mean_s']:.3f} / {r['sim_ttft_mean_s']:.3f} | "
            f"{signed_pct(r['err_ttft_mean'])} | {signed_pct(r['err_ttft_p90'])} | "
            f"{1e3 * r['real_decode_interval_s']:.2f} / {1e3 * r['sim_decode_interval_s']:.2f} | "
            f"{signed_pct(r['err_decode_interval'])} |")
    return lines


def render_markdown(res: StudyResult) -> str:
    """``blis_e2e.md``: header (BLIS commit, flags, what was simulated, timing) and tables."""
    t = _with_expansion(res.table)
    secs = np.array(res.invocation_s) if res.invocation_s else np.array([math.nan])
    cpu = float(np.nansum(res.invocation_cpu_s)) if res.invocation_cpu_s else math.nan
    kv = ", ".join(f"{m} TP{tp}: {n:,}" for (m, tp), n in sorted(res.kv_blocks.items()))
    extra = [r.prompt_len_mean - r.system_prompt_len - r.question_len for r in res.runs
             if math.isfinite(r.prompt_len_mean)]
    longer = (f" (the real prompts were {min(extra):.0f} to {max(extra):.0f} tokens longer on "
              "average, chat template and tokenisation)") if extra else ""
    exps = [e for e in EXPANSIONS if e in set(t["expansion"])] or list(res.expansions)
    lines = [
        "# The real runs in BLIS: real client vs simulated",
        "",
        f"BLIS commit `{res.setup.commit}` (`{res.setup.binary.name}`), `blis run "
        + " ".join(FIXED_FLAGS) + " --max-model-len 4096 --tp N --total-kv-blocks K`, "
        "`--timeout -1` (no deadline) on the normal runs and `--timeout "
        f"{CLIENT_TIMEOUT_S}` (the client's timeout: its failed requests all ended at 300-301 s) "
        "on the reasoning runs. "
        "`--cache-signal-delay 0` changes no number with one instance (checked on Llama-2-70B "
        "TP4 general stage 0: identical metrics) and makes BLIS ~20x faster.",
        "",
        "What was simulated: each load stage of each run as its own BLIS run (from an empty "
        "server), under " + (f"each of {len(exps)} expansions of a run into a BLIS workload, "
                             "with the same workload seeds" if len(exps) > 1
                             else f"the `{exps[0]}` expansion of a run into a BLIS workload")
        + ":",
        "",
    ]
    if "prefix" in exps:
        lines.append(
            "- `prefix`: open-loop Poisson arrivals at the rate the real client achieved "
            "(`load_summary.achieved_rate`) with the stage's request count; one client per "
            "(system prompt, user) of the profile, its own prefix group whose cached prefix is "
            f"the whole prompt (`system_prompt_len + question_len - {SUFFIX_TOKENS}`, input "
            f"{SUFFIX_TOKENS} token: each user resends the same prompt, and the real server "
            "computed 2-4 prefill tokens per step, median)" + longer + "; output lengths = the "
            "tokens the server generated: the profile's `output_len` under its "
            "`ignore_eos: true` (the client's `successes.output_len` counts the re-tokenized "
            "text, ~20% short for Llama-2-7B, whose latencies show every request ran the full "
            "length), else the client's distribution (an empirical PDF through its 13 "
            "quantiles, tilted to its mean).")
    if "inference-perf" in exps:
        lines.append(
            "- `inference-perf`: BLIS's own expansion of an `inference_perf:` section holding "
            "the stage's profile `rate` and `duration` and the profile's `shared_prefix` fields "
            "(`enable_multi_turn_chat: true`): one closed-loop session per (system prompt, user) "
            "with `int(rate x duration)` rounds shared evenly, each round `sessions / rate` s "
            "(think time) after the previous one completes, so the offered load is below the "
            "profile's rate and the stage lasts longer than its duration; the users of a "
            "system prompt share its `system_prompt_len`-token cached prefix and every request "
            "prefills `question_len` fresh tokens; output length = the generated mean, rounded "
            "(the section takes a constant only).")
    lines += [
        "",
        "Per-request results of the stages are pooled like the client's summary; "
        "real numbers are successes only, simulated ones completed requests only. Workload seed "
        f"{res.seed} for the point sets" + (
            f" (`export-mean` pools {res.point_seeds} arrival realizations: seed {res.seed} and "
            f"seed + 1000 + k, k = 1..{res.point_seeds - 1}; `blis-published` has the first only)"
            if res.point_seeds > 1 else "") + (", and seed + 1 + i for posterior draw i (each draw "
        "its own arrival realization, so a band also holds the arrivals' scatter)"
        if res.draw_seeds and res.n_draws else "") + f". KV blocks per GPU "
        f"(`--total-kv-blocks`): {kv}.",
        "",
        f"Timing: {res.invocations} BLIS invocations, {res.parallel} at a time, "
        f"{res.wall_s:.0f} s wall in total (per invocation median {np.nanmedian(secs):.1f} s, "
        f"max {np.nanmax(secs):.1f} s); BLIS CPU time {cpu:.0f} s in total "
        f"(wall time also depends on what else the machine ran).",
        "",
        "Errors are signed, `sim / real - 1`; decode interval = (mean E2E - mean TTFT) / (real mean "
        "output length - 1) on both sides.",
        "",
    ]
    if res.exports:
        lines += [f"Exports: `{res.exports}`, mean block and {res.n_draws} posterior draws per run "
                  "(90% band = the order-statistic prediction interval of the draws' simulated "
                  "means, with 20 draws their smallest and largest, which a new exchangeable "
                  "value falls in with probability 19/21 (`blis_metrics.band`); width = "
                  "(hi - lo) / mid).", ""]
    else:
        lines += ["Exports: none given, BLIS's published coefficients only.", ""]
    summ = summarize_errors(t)
    n_normal = int((~t.drop_duplicates("run_id")["stress"].astype(bool)).sum())
    lines += [f"## Median |error| over the {n_normal} normal runs", "",
              "| source | expansion | runs | E2E mean | E2E P90 | TTFT mean | TTFT P90 | "
              "decode interval |",
              "|---|---|---|---|---|---|---|---|"]
    for _, s in summ.iterrows():
        lines.append(f"| {s['source']} | {s['expansion']} | {s['runs']} | "
                     + " | ".join(f"{100 * s[f'median_abs_err_{m}']:.1f}%" for m in METRICS)
                     + " |")
    lines += ["", "Reference (BLIS's published coefficients, open-loop arrivals, "
              "measured outside the project): E2E 16.5%, TTFT 16.8%, decode interval 15.4%.", ""]
    sat = t[~t["stress"].astype(bool) & (t["err_ttft_mean"] > 10)]
    for _, r in sat.iterrows():
        lines.append(f"- {r['source']}, {r['expansion']}, {r['run']}: simulated TTFT {r['sim_ttft_mean_s']:.1f} s vs "
                     f"real {r['real_ttft_mean_s']:.3f} s: BLIS's queue grows, the simulated "
                     "server does not keep up with the offered load at these coefficients.")
    if len(sat):
        lines.append("")
    for src, g in t.groupby("source", sort=False):
        lines += [f"## {src}: normal runs", ""] + _runs_table(g[~g["stress"].astype(bool)])
        st = g[g["stress"].astype(bool)]
        if len(st):
            lines += ["", f"### {src}: stress (overloaded reasoning runs; successes only, "
                      f"{CLIENT_TIMEOUT_S} s deadline in BLIS)", ""] + _runs_table(st)
            lines += ["", "| expansion | run | real successes / sent | sim completed / injected | "
                      "sim timed out |", "|---|---|---|---|---|"]
            for _, r in st.iterrows():
                lines.append(f"| {r['expansion']} | {r['run']} | "
                             f"{r['real_successes']} / {r['real_count']} | "
                             f"{r['sim_completed']} / {r['sim_injected']} | "
                             f"{r['sim_timed_out']} |")
        lines.append("")
    if res.exports and "e2e_mean_in_band" in t:
        b = t[t["source"] == "export-mean"]
        lines += ["## 90% bands of simulated means over posterior draws", "",
                  "| expansion | run | E2E real (s) | band (s) | in | width | TTFT real (s) | "
                  "band (s) | in | width |", "|---|---|---|---|---|---|---|---|---|---|"]
        for _, r in b.iterrows():
            lines.append(
                f"| {r['expansion']} | {r['run']} | {r['real_e2e_mean_s']:.3f} | {r['band_e2e_mean_lo_s']:.3f}-"
                f"{r['band_e2e_mean_hi_s']:.3f} | {'yes' if r['e2e_mean_in_band'] else 'no'} | "
                f"{100 * r['band_e2e_mean_width']:.1f}% | {r['real_ttft_mean_s']:.3f} | "
                f"{r['band_ttft_mean_lo_s']:.3f}-{r['band_ttft_mean_hi_s']:.3f} | "
                f"{'yes' if r['ttft_mean_in_band'] else 'no'} | "
                f"{100 * r['band_ttft_mean_width']:.1f}% |")
        lines.append("")
    return "\n".join(lines)


def write_outputs(res: StudyResult, out: str | Path) -> tuple[Path, Path]:
    """Write ``blis_e2e.md`` and ``blis_e2e.csv`` to ``out`` (temp file + ``os.replace``)."""
    out = Path(out)
    md, csv = out / "blis_e2e.md", out / "blis_e2e.csv"
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(csv, res.table.to_csv(index=False, float_format="%.6g"))
    atomic_write_text(md, render_markdown(res))
    return md, csv


def main(out: str | Path, blis: str | Path | None = None, exports: str | Path | None = None,
         n_draws: int = DEFAULT_DRAWS, runs: str | None = None, data: str | Path | None = None,
         blis_src: str | Path | None = None, parallel: int = 2,
         expansion: str = "both") -> int:
    """``bayes-latency study blis``: validate everything, simulate, write the report

    ``blis`` defaults to ``$BLIS_BIN``; ``expansion`` is ``prefix``, ``inference-perf`` or
    ``both`` (:data:`EXPANSION_CHOICES`). Raises :class:`BlisSetupError` (one line) on bad input.
    """
    expansions = parse_expansion(expansion)
    setup = check_blis(blis or os.environ.get("BLIS_BIN"), blis_src)
    d = real_data_dir(data)
    if d is None:
        raise BlisSetupError("real data not found: pass --data DIR or set BAYES_LATENCY_REAL_DATA")
    found = find_runs(d, runs)
    if n_draws < 0:
        raise BlisSetupError(f"--draws must be >= 0, got {n_draws}")
    load_sources(found, exports, n_draws)  # fail fast, before any simulation

    def say(msg: str) -> None:
        print(f"study blis: {msg}", flush=True)

    say(f"{len(found)} runs, BLIS {setup.commit[:7]}, exports: {exports or 'none'}, "
        f"draws: {n_draws if exports else 0}, expansions: {', '.join(expansions)}")
    res = run_study(setup, found, exports=exports, n_draws=n_draws, parallel=parallel,
                    progress=say, expansions=expansions)
    md, csv = write_outputs(res, out)
    summ = summarize_errors(res.table)
    for _, s in summ.iterrows():
        say(f"{s['source']} ({s['expansion']}): median |err| over {s['runs']} normal runs: E2E "
            f"{100 * s['median_abs_err_e2e_mean']:.1f}%, TTFT "
            f"{100 * s['median_abs_err_ttft_mean']:.1f}%, decode interval "
            f"{100 * s['median_abs_err_decode_interval']:.1f}%")
    say(f"wrote {md} and {csv} in {res.wall_s:.0f} s")
    return 0
