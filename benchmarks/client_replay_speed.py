"""Speed of replaying the 16 real runs' workloads (target: <= 60 s on 2 cores).

Replays every load stage of the 16 real lifecycle runs (12 normal, 4 overloaded reasoning runs)
through the package's scheduler (:func:`bayes_latency.schedule.replay.replay_stage`) at the committed
BLIS exports' posterior means (``results/real/exports``), once serially in this process (wall and
CPU time) and once as Dask tasks on a 2-worker local cluster (``calibrate.replay_all`` with
``scheduler="local"``, the way ``calibrate`` can run them). The calibration replays each stage twice
per iteration (at beta and 1.05 beta, for the tangent rows), the 12 normal runs only.

With ``--calibrate``, also the whole calibration of the client study (the real step and benchmark
rows plus the 20 client stages of the 12 normal runs: start fit, short fits, full fit, replays;
``study.client.calibrated_fit`` at the study's settings), wall and CPU time, by phase.

The scheduler loop is compiled with numba (``schedule/loop.py``, cached on disk): the
first call in this process loads the cache; a cold compile is timed in a subprocess with an
empty cache directory.

Writes ``results/benchmarks/client_replay_speed.{md,json}``.

    python benchmarks/client_replay_speed.py [--exports results/real/exports] [--calibrate]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# this checkout's package, also when the installed one is another worktree's
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_TINY = ("import time; t = time.process_time(); import numpy as np; "
         "from bayes_latency.schedule.engine import EngineConfig, run_engine; "
         "from bayes_latency.schedule.steptime import StepTimeModel; "
         "from bayes_latency.physics.architecture import load_architecture; "
         "from bayes_latency.physics.hardware import load_gpu; "
         "from bayes_latency.physics.serving import ServingConfig; "
         "from bayes_latency.physics.basis import DEFAULT_TERMS; "
         "a, g = load_architecture('llama-2-7b'), load_gpu('H100'); "
         "st = StepTimeModel(a, g, ServingConfig(tp=1), np.ones(len(DEFAULT_TERMS)), DEFAULT_TERMS); "
         "c0 = time.process_time(); "
         "run_engine(np.arange(4) * 10**6, np.full(4, 100), np.full(4, 5), np.arange(4), "
         "np.zeros(4, dtype=int), st, EngineConfig(), np.random.default_rng(0)); "
         "print(time.process_time() - c0)")


def _first_call_cpu_s(cache_dir: str | None) -> float:
    """CPU seconds of the first ``run_engine`` call in a fresh process (compile or cache load)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(  # the child imports this checkout's package too
        [str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if cache_dir is not None:
        env["NUMBA_CACHE_DIR"] = cache_dir
    out = subprocess.run([sys.executable, "-c", _TINY], env=env, capture_output=True, text=True,
                         check=True)
    return float(out.stdout.strip().splitlines()[-1])


def _uptime() -> str:
    """``uptime``'s line (the machine's load when measured), or the load averages."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    from bayes_latency.calibrate.loop import replay_all
    from bayes_latency.data.observations.build import config_id
    from bayes_latency.physics.basis import ALPHA_TERMS, DEFAULT_TERMS, get_term
    from bayes_latency.physics.hardware import load_gpu
    from bayes_latency.physics.models import load_architecture
    from bayes_latency.schedule.replay import replay_stage
    from bayes_latency.study.blis.spec import export_path, find_runs, load_export, real_data_dir
    from bayes_latency.study.client.runs import client_stages

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exports", default="results/real/exports")
    ap.add_argument("--out", default="results/benchmarks/client_replay_speed")
    ap.add_argument("--calibrate", action="store_true", help="also time the whole calibration")
    args = ap.parse_args()
    data = real_data_dir()
    if data is None:
        print("real data absent: nothing to measure")
        return 0
    runs = find_runs(data)
    stages = client_stages(runs, include_stress=True)
    gpu = load_gpu("H100")
    coefs = {}
    for r in runs:
        mean, _ = load_export(export_path(args.exports, r.model, r.tp))
        beta = np.array([mean.beta[get_term(t).blis_index] for t in DEFAULT_TERMS])
        coefs[config_id(load_architecture(r.model).name, gpu.name, r.tp)] = (
            beta, dict(zip(ALPHA_TERMS, mean.alpha, strict=True)))
    load0, up0 = os.getloadavg(), _uptime()
    with tempfile.TemporaryDirectory() as tmp:
        cold_s = _first_call_cpu_s(tmp)
    warm_s = _first_call_cpu_s(None)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):   # load the compiled loop here, not in the first stage
        exec(_TINY, {})  # noqa: S102
    t0, c0 = time.perf_counter(), time.process_time()
    per = []
    for s in stages:
        cid = config_id(load_architecture(s.model).name, gpu.name, s.tp)
        t1 = time.perf_counter()
        rep = replay_stage(s, load_architecture(s.model), gpu, coefs[cid][0], DEFAULT_TERMS)
        per.append({"stage": s.experiment_id, "requests": rep.n_requests, "steps": rep.n_steps,
                    "seconds": time.perf_counter() - t1})
    serial_s, serial_cpu = time.perf_counter() - t0, time.process_time() - c0
    t0 = time.perf_counter()
    replay_all(stages, coefs, DEFAULT_TERMS, scheduler="local", bump=0.0)
    dask_s = time.perf_counter() - t0
    cal_res = None
    if args.calibrate:
        from bayes_latency.study.client.blis import CLIENT_FIT, START_FIT
        from bayes_latency.study.client.runs import calibrated_fit
        from bayes_latency.study.realdata import load_real_data
        from bayes_latency.study.settings import REAL_TERMS

        normal = client_stages(runs)
        t0, c0 = time.perf_counter(), time.process_time()
        base = load_real_data(data).observations
        lc0, upc0 = os.getloadavg(), _uptime()
        t0, c0 = time.perf_counter(), time.process_time()
        cal = calibrated_fit(base, normal, CLIENT_FIT, REAL_TERMS, start_settings=START_FIT,
                             log=print)
        h = cal.history
        wall = time.perf_counter() - t0
        tm = cal.timings
        fit_s, rep_s = float(h["fit_s"].sum()), float(h["replay_s"].sum())
        conv = cal.model.convergence()
        ft = cal.model.timings   # the last (full) fit's phases
        ext = json.loads(cal.model.result.attrs.get("extension", "[]") or "[]")
        cal_res = {"wall_s": wall, "cpu_s": time.process_time() - c0,
                   "fits": int(len(h)), "fit_kinds": list(h["fit"]),
                   "fits_s": [float(x) for x in h["fit_s"]], "fit_s": fit_s, "replay_s": rep_s,
                   "compiles_s": [float(x) for x in h.get("compile_s", [])],
                   "groups_s": [float(x) for x in h.get("arviz_groups_s", [])],
                   "start_fit_s": tm.get("start_fit_s", wall - tm["total_s"]),
                   "scale_start_s": tm["scale_start_s"],
                   "first_replay_s": tm["first_replay_s"],
                   "other_s": tm["total_s"] - tm["scale_start_s"] - tm["first_replay_s"]
                   - fit_s - rep_s,
                   "converged": bool(cal.converged), "final_change": float(cal.final_change),
                   "max_change": [float(x) for x in h["max_change"]],
                   "unfitted": list(cal.unfitted), "load_before": lc0,
                   "load_after": os.getloadavg(), "uptime_before": upc0,
                   "uptime_after": _uptime(),
                   "full_fit": {"max_rhat": conv.get("max_rhat"),
                                "min_ess_bulk": conv.get("min_ess_bulk"),
                                "divergences": conv.get("divergences"),
                                "passed": bool(conv.get("passed")),
                                "draws": int(cal.model.result["posterior"].sizes["draw"]),
                                "sampling_s": ft.get("sampling_s"),
                                "sampling_cpu_s": ft.get("sampling_cpu_s"),
                                "gate_checks_s": float(sum(c.get("check_s", 0.0) for c in ext)),
                                "checkpoints": [c.get("draws") for c in ext]}}
    load1, up1 = os.getloadavg(), _uptime()
    res = {"stages": len(stages), "runs": len(runs),
           "requests": int(sum(p["requests"] for p in per)),
           "steps": int(sum(p["steps"] for p in per)),
           "serial_wall_s": serial_s, "serial_cpu_s": serial_cpu,
           "dask_2_workers_wall_s": dask_s, "load_before": load0, "load_after": load1,
           "uptime_before": up0, "uptime_after": up1,
           "engine_first_call_cold_cpu_s": cold_s, "engine_first_call_cached_cpu_s": warm_s,
           "per_stage": per, "calibration": cal_res}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1), encoding="utf-8")
    slow = sorted(per, key=lambda p: -p["seconds"])[:3]
    md = [
        "# Replaying the 16 real runs: speed", "",
        f"{len(stages)} load stages of {len(runs)} runs ({res['requests']:,} requests, "
        f"{res['steps']:,} steps), each replayed once through the package's scheduler at the "
        "committed exports' posterior means.", "",
        "| how | wall (s) | CPU (s) |", "|---|---|---|",
        f"| serial, one process | {serial_s:.1f} | {serial_cpu:.1f} |",
        f"| Dask local cluster, 2 workers (incl. start) | {dask_s:.1f} | |", "",
        f"The compiled scheduler loop's first call in a process: {cold_s:.1f} CPU-s with an empty "
        f"numba cache (compiling, once per environment), {warm_s:.2f} CPU-s from the cache (made "
        "before the serial replays above).", "",
        f"Machine load average {load0[0]:.1f} before, {load1[0]:.1f} after (2 cores, shared); "
        f"`uptime` before: `{up0}`, after: `{up1}`.",
        "Slowest stages: " + ", ".join(f"{p['stage']} {p['seconds']:.1f} s "
                                       f"({p['steps']:,} steps)" for p in slow) + ".", "",
        "A calibration iteration replays the 20 stages of the 12 normal runs twice: at the "
        "posterior mean (the change check, reused as the next rows' schedule when the step is "
        "undamped) and at 1.05 beta (the tangent rows' elasticities).",
    ]
    if cal_res:
        md += ["", "## The whole calibration (goal: <= 3 minutes)", "",
               f"Wall {cal_res['wall_s']:.0f} s, CPU of this process {cal_res['cpu_s']:.0f} s "
               f"(sampler threads included) at load average {cal_res['load_before'][0]:.1f} "
               f"before, {cal_res['load_after'][0]:.1f} after (2 cores, shared: wall grows with "
               f"the load, CPU does not); converged {cal_res['converged']}, final change "
               f"{cal_res['final_change']:.2%}; not fitted: "
               f"{', '.join(cal_res['unfitted']) or 'none'}.", "",
               "| phase | wall (s) |", "|---|---|",
               f"| start fit | {cal_res['start_fit_s']:.1f} |",
               f"| scale_start (replays) | {cal_res['scale_start_s']:.1f} |",
               f"| first rows (2 replays per stage) | {cal_res['first_replay_s']:.1f} |",
               f"| {cal_res['fits']} fits ({', '.join(cal_res['fit_kinds'])}: "
               f"{', '.join(f'{x:.0f}' for x in cal_res['fits_s'])} s; compiling "
               f"{', '.join(f'{x:.1f}' for x in cal_res.get('compiles_s', []))} s, ArviZ groups "
               f"{', '.join(f'{x:.1f}' for x in cal_res.get('groups_s', []))} s) | {cal_res['fit_s']:.1f} |",
               f"| replays after the fits (serial, one process) | {cal_res['replay_s']:.1f} |",
               f"| rest (posterior means, rows) | {cal_res['other_s']:.1f} |", "",
               f"`uptime` before the calibration: `{cal_res['uptime_before']}`; after: "
               f"`{cal_res['uptime_after']}`.", "",
               "The full (last) fit: R-hat {:.4f}, bulk ESS {:.0f}, {} divergences, gates passed: "
               "{}; {} draws per chain kept (gates checked at {}: {:.1f} s of checks); sampling "
               "{:.1f} s wall / {:.1f} CPU-s.".format(
                   cal_res['full_fit']['max_rhat'], cal_res['full_fit']['min_ess_bulk'],
                   cal_res['full_fit']['divergences'], cal_res['full_fit']['passed'],
                   cal_res['full_fit']['draws'],
                   ", ".join(str(x) for x in cal_res['full_fit']['checkpoints']) or "-",
                   cal_res['full_fit']['gate_checks_s'],
                   cal_res['full_fit']['sampling_s'] or float('nan'),
                   cal_res['full_fit']['sampling_cpu_s'] or float('nan'))]
    out.with_suffix(".md").write_text("\n".join(md) + "\n", encoding="utf-8")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
