"""Wall and CPU time of each phase of ``bayes-latency demo`` (goals: demo <= 150 s, ppc <= 20 s).

Usage::

    python benchmarks/demo_phases_speed.py [--cold] [--out PREFIX] [--demo-out DIR]

Runs ``python -m bayes_latency.cli.main demo --out DIR`` (this checkout's package) in a new
process and reads its progress lines (``[demo  12.0s] simulate: ...``): at each line it records
the wall time of the phase that ended and the CPU time spent in it by the demo process and all
its descendants (worker processes included, read from ``/proc``; Linux only), with the 1-minute
load average. ``--cold`` points PyTensor's and Numba's on-disk caches at empty temporary
directories (a fresh machine's first run; see ``demo_fit_speed.py``).

Outputs (``--out PREFIX``, default ``results/benchmarks/demo_phases_speed``): ``PREFIX.md`` and
``PREFIX.json``, one section per mode (``warm``, ``cold``), each rewritten by its own run. The
Markdown ends with a sentence a document can quote (total and per-phase seconds, CPU model,
cores, load, code).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bayes_latency.study.machine import cpu_model  # noqa: E402
from benchmarks._provenance import code_provenance  # noqa: E402

SECTIONS = {"warm": "Warm caches", "cold": "Cold caches"}
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def tree_cpu_s(pid: int) -> float:
    """CPU s of ``pid``, of its children it has waited for, and of its live descendants."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit() and (f := _stat(int(d))) is not None:
            kids.setdefault(int(f[1]), []).append(int(d))
    total, todo = 0, [pid]
    while todo:
        q = todo.pop()
        f = _stat(q)
        if f is None:
            continue
        total += int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])  # utime stime cutime cstime
        todo += kids.get(q, [])
    return total / TICK


def load1() -> float:
    return os.getloadavg()[0]


def run_demo(demo_out: Path, cold: bool) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    tmp = tempfile.TemporaryDirectory(prefix="bl_cold_") if cold else None
    if tmp is not None:
        env["PYTENSOR_FLAGS"] = f"base_compiledir={tmp.name}/pytensor"
        env["NUMBA_CACHE_DIR"] = f"{tmp.name}/numba"
    l0, t0 = load1(), time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "bayes_latency.cli.main", "demo", "--out",
                          str(demo_out)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    phases, last_w, last_c, cpu = [], 0.0, 0.0, 0.0
    assert p.stderr is not None
    for line in p.stderr:
        if line.startswith("[demo"):
            cpu, w = tree_cpu_s(p.pid), time.perf_counter() - t0
            name = line.split("]", 1)[1].split(":", 1)[0].strip()
            phases.append({"phase": name, "wall_s": w - last_w, "cpu_s": cpu - last_c,
                           "load": load1()})
            last_w, last_c = w, cpu
    rc = p.wait()
    if tmp is not None:
        tmp.cleanup()
    return {"rc": rc, "wall_s": time.perf_counter() - t0, "cpu_s": cpu, "load_before": l0,
            "load_after": load1(), "phases": phases}


def report_section(sec: dict) -> str:
    r = sec["run"]
    lines = [f"## {SECTIONS[sec['mode']]}", "", f"Command: `{sec['command']}`", "",
             f"{sec['cpus']} CPUs ({sec['cpu_model']}); {sec['code']}; exit code {r['rc']}.", "",
             "| phase | wall s | CPU s | load |", "|---|---|---|---|"]
    lines += [f"| {p['phase']} | {p['wall_s']:.1f} | {p['cpu_s']:.1f} | {p['load']:.1f} |"
              for p in r["phases"]]
    lines += [f"| total | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | "
              f"{r['load_before']:.1f}-{r['load_after']:.1f} |", "", f"Quotable: {quote(sec)}", ""]
    return "\n".join(lines)


def quote(sec: dict) -> str:
    r = sec["run"]
    parts = ", ".join(f"{p['phase']} {p['wall_s']:.0f} s ({p['cpu_s']:.0f} CPU s)"
                      for p in r["phases"] if p["wall_s"] >= 0.5)
    return (f"`bayes-latency demo`, {sec['mode']} caches: {r['wall_s']:.0f} s wall, "
            f"{r['cpu_s']:.0f} CPU s ({parts}); {sec['cpus']} cores ({sec['cpu_model']}), 1-minute "
            f"load {r['load_before']:.1f} before, {r['load_after']:.1f} after; {sec['code']}.")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--out", default="results/benchmarks/demo_phases_speed")
    ap.add_argument("--demo-out", default=None, help="demo output folder (default: a temporary one)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bl_demo_") as d:
        run = run_demo(Path(args.demo_out or d), args.cold)
    mode = "cold" if args.cold else "warm"
    sec = {"mode": mode, "command": " ".join(["python benchmarks/demo_phases_speed.py",
                                              *sys.argv[1:]]),
           "cpus": os.cpu_count(), "cpu_model": cpu_model(), "code": code_provenance(),
           "run": run}
    out = Path(args.out)
    doc = json.loads(Path(f"{out}.json").read_text()) if Path(f"{out}.json").exists() else {}
    doc = {k: v for k, v in doc.items() if k in SECTIONS}
    doc[mode] = sec
    text = "\n".join(["# Demo phases: wall and CPU time\n",
                      "CPU s: the demo process and its worker processes. On a shared machine wall "
                      "time also measures the neighbours (see the load column).\n",
                      *[report_section(doc[k]) for k in SECTIONS if k in doc]])
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.md").write_text(text)
    Path(f"{out}.json").write_text(json.dumps(doc, indent=1))
    return 0 if run["rc"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
