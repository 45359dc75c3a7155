"""Speed of replaying the 16 real runs' workloads (issue #14: <= 60 s on 2 cores).

Replays every load stage of the 16 real lifecycle runs (12 normal, 4 overloaded reasoning runs)
through the package's scheduler (:func:`bayes_latency.data.replay.replay_stage`) at the committed
BLIS exports' posterior means (``results/real/exports``), once serially in this process (wall and
CPU time) and once as Dask tasks on a 2-worker local cluster (``calibrate.replay_all`` with
``scheduler="local"``, the way ``calibrate`` can run them). The calibration replays each stage twice
per iteration (at beta and 1.05 beta, for the tangent rows), the 12 normal runs only.

With ``--calibrate``, also the whole calibration of issue #14's study (the real step and benchmark
rows plus the 20 client stages of the 12 normal runs: start fit, short fits, full fit, replays;
``study.client.calibrated_fit`` at the study's settings), wall and CPU time.

Writes ``results/benchmarks/client_replay_speed.{md,json}``.

    python benchmarks/client_replay_speed.py [--exports results/real/exports] [--calibrate]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np


def main() -> int:
    from bayes_latency.calibrate import replay_all
    from bayes_latency.data.observations import config_id
    from bayes_latency.data.replay import replay_stage
    from bayes_latency.physics.architecture import load_architecture
    from bayes_latency.physics.basis import ALPHA_TERMS, DEFAULT_TERMS, get_term
    from bayes_latency.physics.hardware import load_gpu
    from bayes_latency.study.blis_spec import export_path, find_runs, load_export, real_data_dir
    from bayes_latency.study.client import client_stages

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
    load0 = os.getloadavg()
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
        from bayes_latency.study.client import calibrated_fit
        from bayes_latency.study.client_blis import CLIENT_FIT, START_FIT
        from bayes_latency.study.realdata import load_real_data
        from bayes_latency.study.settings import REAL_TERMS

        normal = client_stages(runs)
        t0, c0 = time.perf_counter(), time.process_time()
        cal = calibrated_fit(load_real_data(data).observations, normal, CLIENT_FIT, REAL_TERMS,
                             start_settings=START_FIT, log=print)
        h = cal.history
        cal_res = {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
                   "fits": int(len(h)), "fit_kinds": list(h["fit"]),
                   "fit_s": float(h["fit_s"].sum()), "replay_s": float(h["replay_s"].sum()),
                   "converged": bool(cal.converged), "final_change": float(cal.final_change),
                   "unfitted": list(cal.unfitted)}
    load1 = os.getloadavg()
    res = {"stages": len(stages), "runs": len(runs),
           "requests": int(sum(p["requests"] for p in per)),
           "steps": int(sum(p["steps"] for p in per)),
           "serial_wall_s": serial_s, "serial_cpu_s": serial_cpu,
           "dask_2_workers_wall_s": dask_s, "load_before": load0, "load_after": load1,
           "per_stage": per, "calibration": cal_res}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1), encoding="utf-8")
    slow = sorted(per, key=lambda p: -p["seconds"])[:3]
    md = [
        "# Replaying the 16 real runs (issue #14 speed)", "",
        f"{len(stages)} load stages of {len(runs)} runs ({res['requests']:,} requests, "
        f"{res['steps']:,} steps), each replayed once through the package's scheduler at the "
        "committed exports' posterior means.", "",
        "| how | wall (s) | CPU (s) |", "|---|---|---|",
        f"| serial, one process | {serial_s:.1f} | {serial_cpu:.1f} |",
        f"| Dask local cluster, 2 workers (incl. start) | {dask_s:.1f} | |", "",
        f"Machine load average {load0[0]:.1f} before, {load1[0]:.1f} after (2 cores, shared).",
        "Slowest stages: " + ", ".join(f"{p['stage']} {p['seconds']:.1f} s "
                                       f"({p['steps']:,} steps)" for p in slow) + ".", "",
        "A calibration iteration replays the 20 stages of the 12 normal runs twice: at the "
        "posterior mean (the change check, reused as the next rows' schedule when the step is "
        "undamped) and at 1.05 beta (the tangent rows' elasticities).",
    ]
    if cal_res:
        md += ["", "## The whole calibration (issue #14: <= 3 minutes)", "",
               f"Wall {cal_res['wall_s']:.0f} s, CPU of this process {cal_res['cpu_s']:.0f} s "
               f"(sampler threads included): {cal_res['fits']} fits after the start fit "
               f"({', '.join(cal_res['fit_kinds'])}; {cal_res['fit_s']:.0f} s), replays "
               f"{cal_res['replay_s']:.0f} s (serial, one process); converged "
               f"{cal_res['converged']}, final change {cal_res['final_change']:.2%}; not fitted: "
               f"{', '.join(cal_res['unfitted']) or 'none'}."]
    out.with_suffix(".md").write_text("\n".join(md) + "\n", encoding="utf-8")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
