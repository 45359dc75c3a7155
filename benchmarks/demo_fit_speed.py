"""Wall time of the demo fit (goal: cold <= 60 s, warm <= 30 s), one fresh process per run.

Usage::

    python benchmarks/demo_fit_speed.py [--tables results/tables] [--seeds 0 1 2 3 4]
        [--draws 2000] [--tune 500] [--target-accept 0.99] [--cold] [--out PREFIX]

    # the two sections of results/benchmarks/demo_fit_speed.md
    python benchmarks/demo_fit_speed.py           # warm caches, seeds 0-4
    python benchmarks/demo_fit_speed.py --cold    # cold caches, seeds 0 1

Each run is ``LatencyModel().fit(...)`` on the demo's training rows (the demo's observation table
minus its held-out configuration), exactly as ``bayes-latency demo`` calls it
(``bayes_latency.study.demo.DEMO_FIT``: diagonal mass-matrix adaptation), in a new Python process,
timed from the observation table to a converged posterior (stage-1 summaries, model build,
nutpie compilation, sampling, conditional draws of the configuration coefficients, assembly).
Imports are not timed; the ArviZ groups (log likelihood, predictive, prior, log prior) are.
CPU time (all threads of the process) is reported next to wall time, with the 1-minute load
average before and after the run: the machine may be shared, and wall time then measures the
neighbours too. The gates are those of ``LatencyModel.convergence`` (max R-hat
<= 1.01, min bulk ESS >= 400, 0 divergences).

``--cold`` points PyTensor's and Numba's on-disk caches at empty temporary directories, so the
run pays every compilation, as the first fit on a fresh machine does; without it the caches of
earlier runs are reused (a user's second and later fits).

Outputs (``--out PREFIX``, default ``results/benchmarks/demo_fit_speed``): ``PREFIX.md`` and
``PREFIX.json``, one file for both modes: a run replaces its own section (``warm`` or ``cold``) and
keeps the other one from ``PREFIX.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

# this checkout's package, also when the installed one is another worktree's
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bayes_latency.study.demo import DEMO_DRAWS, DEMO_FIT
from bayes_latency.study.machine import cpu_model

CHILD = r"""
import json, os, sys, time
import pandas as pd
from bayes_latency.data.observations.build import config_id
from bayes_latency.data.tables import read_table
from bayes_latency.study.demo import DEMO_FIT, HELD_OUT
from bayes_latency.model.estimator import LatencyModel
tables, draws, tune, ta, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
obs = read_table(tables, "observations")
train = obs[obs["config_id"] != config_id(*HELD_OUT)]
m = LatencyModel()
load0 = os.getloadavg()[0]
t0, c0 = time.perf_counter(), time.process_time()
m.fit(train, draws=draws, seed=seed, **{**DEMO_FIT, "tune": tune, "target_accept": ta})
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
c = m.convergence()
ss = m.result["sample_stats"]
print("RESULT " + json.dumps({"seed": seed, "wall_s": wall, "cpu_s": cpu, "timings": m.timings,
    "load_before": load0, "load_after": os.getloadavg()[0],
    "max_rhat": c["max_rhat"], "min_ess_bulk": c["min_ess_bulk"], "divergences": c["divergences"],
    "passed": c["passed"], "mean_leapfrog_steps": float(ss["n_steps"].mean()),
    "configs": len(m.design.configs), "rows": len(m._rows)}))
"""


def run_one(tables: str, draws: int, tune: int, ta: float, seed: int, cold: bool) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(  # the child imports this checkout's package too
        [str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    tmp = None
    if cold:
        tmp = tempfile.TemporaryDirectory(prefix="bl_cold_")
        env["PYTENSOR_FLAGS"] = f"base_compiledir={tmp.name}/pytensor"
        env["NUMBA_CACHE_DIR"] = f"{tmp.name}/numba"
    out = subprocess.run([sys.executable, "-c", CHILD, tables, str(draws), str(tune), str(ta), str(seed)],
                         capture_output=True, text=True, env=env, check=False)
    if tmp is not None:
        tmp.cleanup()
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"run with seed {seed} failed:\n{out.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


SECTIONS = {"warm": "Warm caches", "cold": "Cold caches"}


def section(runs: list[dict], args: argparse.Namespace) -> dict:
    """One mode's results as stored in ``PREFIX.json`` (everything :func:`report` needs)."""
    from benchmarks._provenance import code_provenance

    return {"command": " ".join(["python benchmarks/demo_fit_speed.py", *sys.argv[1:]]),
            "cpus": os.cpu_count(), "cpu_model": cpu_model(), "python": platform.python_version(),
            "code": code_provenance(), "args": vars(args), "runs": runs}


def quote(sec: dict) -> str:
    """One sentence a document can quote: median wall, CPU and idle-estimate seconds of the
    runs, the machine (CPU model, cores) and its load during them, and the code measured."""
    runs = sec["runs"]
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    mode = "cold" if sec["args"]["cold"] else "warm"
    ests = [idle_estimate(r) for r in runs if "sampling_cpu_s" in r["timings"] and "cpu_s" in r]
    loads = [x for r in runs for x in (r.get("load_before"), r.get("load_after")) if x is not None]
    est = f", idle-machine estimate {med(ests):.1f} s" if ests else ""
    load = f"1-minute load average {min(loads):.1f}-{max(loads):.1f}" if loads else "load not recorded"
    cpus = [r["cpu_s"] for r in runs if "cpu_s" in r]
    cpu = f"{med(cpus):.1f} CPU s" if cpus else "CPU time not recorded"
    return (f"Demo fit, {mode} caches, median of {len(runs)} run(s): "
            f"{med([r['wall_s'] for r in runs]):.1f} s wall, {cpu}{est}; "
            f"{sec.get('cpus', '?')} cores ({sec.get('cpu_model', 'CPU not recorded')}), {load}; "
            f"{sec.get('code', 'code not recorded')}.")


def idle_estimate(run: dict) -> float:
    """Wall time the run would take on an idle 2-core machine, from its CPU time.

    Everything but sampling runs on one thread (CPU time = wall time when nothing competes);
    nutpie samples the two chains on two threads, so their CPU time counts half. On a busy
    machine this is the number to hold against the speed goal; on an idle one it matches the
    wall time up to I/O waits.
    """
    t = run["timings"]
    samp_cpu = t.get("sampling_cpu_s", 0.0) - t.get("compile_cpu_s", 0.0)
    return run["cpu_s"] - samp_cpu / 2


def report_section(sec: dict) -> str:
    """Markdown of one mode (``warm`` or ``cold``)."""
    runs, a = sec["runs"], sec["args"]
    lines = [f"## {SECTIONS['cold' if a['cold'] else 'warm']}", "",
             f"Command: `{sec['command']}`", "",
             f"{runs[0]['configs']} configurations, {runs[0]['rows']:,} rows; 2 chains x "
             f"({a['tune']} tune + {a['draws']} draws), target_accept {a['target_accept']}; "
             f"{sec['cpus']} CPUs ({sec.get('cpu_model', 'model not recorded')}), Python "
             f"{sec['python']}; {sec.get('code', '')}.", "",
             "| seed | wall s | CPU s | idle estimate s | load | stage 1 s | compile s (CPU s) | "
             "sampling s (CPU s) | ArviZ groups s | R-hat | ESS | ESS/s sampling | divergences | "
             "leapfrog/draw | gates |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        t = r["timings"]
        samp = t.get("sampling_s", 0.0) - t.get("compile_s", 0.0)
        cpu = f"{r['cpu_s']:.1f}" if "cpu_s" in r else "n/a"
        load = (f"{r['load_before']:.1f}-{r['load_after']:.1f}" if "load_before" in r else "n/a")
        comp, smp, est = f"{t.get('compile_s', 0):.1f}", f"{samp:.1f}", "n/a"
        if "sampling_cpu_s" in t and "cpu_s" in r:
            samp_cpu = t["sampling_cpu_s"] - t.get("compile_cpu_s", 0.0)
            comp += f" ({t.get('compile_cpu_s', 0):.1f})"
            smp += f" ({samp_cpu:.1f})"
            est = f"{idle_estimate(r):.1f}"
        lines.append(f"| {r['seed']} | {r['wall_s']:.1f} | {cpu} | {est} | {load} | "
                     f"{t.get('summaries_s', 0):.1f} | {comp} | {smp} | "
                     f"{t.get('arviz_groups_s', 0):.1f} | {r['max_rhat']:.4f} | "
                     f"{r['min_ess_bulk']:.0f} | {r['min_ess_bulk'] / max(samp, 1e-9):.0f} | "
                     f"{r['divergences']} | {r['mean_leapfrog_steps']:.0f} | "
                     f"{'pass' if r['passed'] else 'FAIL'} |")
    walls = sorted(r["wall_s"] for r in runs)
    cpus = sorted(r["cpu_s"] for r in runs if "cpu_s" in r) or [float("nan")]
    ests = sorted(idle_estimate(r) for r in runs if "sampling_cpu_s" in r["timings"] and "cpu_s" in r)
    est = (f"; idle-machine estimate: median {ests[len(ests) // 2]:.1f} s, max {ests[-1]:.1f} s"
           if ests else "")
    lines += ["", f"Wall time: median {walls[len(walls) // 2]:.1f} s, max {walls[-1]:.1f} s "
              f"(CPU time: median {cpus[len(cpus) // 2]:.1f} s, max {cpus[-1]:.1f} s{est}); "
              f"{sum(r['passed'] for r in runs)} of {len(runs)} runs pass the gates; "
              f"{sum(r['passed'] and r['wall_s'] <= 60 for r in runs)} pass within 60 s of wall time.",
              "", f"Quotable: {quote(sec)}"]
    return "\n".join(lines) + "\n"


def report(doc: dict) -> str:
    """Markdown of ``PREFIX.json``: the warm and the cold section, whichever exist."""
    parts = ["# Demo fit wall time\n",
             "Warm: PyTensor's and Numba's caches filled by earlier runs (a user's second and later "
             "fits); cold: empty caches (the first fit on a fresh machine). Each section is "
             "rewritten by its own run (`--cold` for the cold one).\n",
             "CPU s counts every thread of the fit (the two chains sample on two threads); "
             "'idle estimate' is the wall time the run would take on an idle 2-core machine "
             "(CPU time less half the sampling threads' CPU time): the number to hold against "
             "the goal (cold <= 60 s, warm <= 30 s) when the load column shows a busy machine. "
             "Compile and sampling columns give wall time with CPU time in parentheses. Where "
             "the time goes and what was tried: the note \"Where a fit's time goes\" in "
             "`bayes_latency/model/inference/compiled.py`.\n"]
    parts += [report_section(doc[k]) for k in SECTIONS if k in doc]
    return "\n".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", default="results/tables")
    ap.add_argument("--seeds", type=int, nargs="+", default=None,
                    help="default: 0 1 2 3 4 (warm), 0 1 (cold)")
    ap.add_argument("--draws", type=int, default=DEMO_DRAWS)
    ap.add_argument("--tune", type=int, default=DEMO_FIT["tune"])
    ap.add_argument("--target-accept", type=float, default=DEMO_FIT["target_accept"])
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--out", default="results/benchmarks/demo_fit_speed")
    args = ap.parse_args()
    if args.seeds is None:
        args.seeds = [0, 1] if args.cold else [0, 1, 2, 3, 4]
    from bayes_latency.data.tables import table_files

    if not table_files(args.tables, "observations"):
        print(f"no observations table in {args.tables}: run `bayes-latency demo` first", file=sys.stderr)
        return 2
    runs = []
    for s in args.seeds:
        r = run_one(args.tables, args.draws, args.tune, args.target_accept, s, args.cold)
        print(f"seed {s}: {r['wall_s']:.1f} s, R-hat {r['max_rhat']:.4f}, ESS {r['min_ess_bulk']:.0f}, "
              f"divergences {r['divergences']}, {'pass' if r['passed'] else 'FAIL'}", flush=True)
        runs.append(r)
    out = Path(args.out)
    doc: dict = {}
    if Path(f"{out}.json").exists():
        doc = json.loads(Path(f"{out}.json").read_text())
        doc = {k: v for k, v in doc.items() if k in SECTIONS}  # older files: one mode, no sections
    doc["cold" if args.cold else "warm"] = section(runs, args)
    text = report(doc)
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.md").write_text(text)
    Path(f"{out}.json").write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
