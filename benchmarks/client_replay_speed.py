"""Speed of replaying the 16 real runs' workloads (issue #14: <= 60 s on 2 cores).

Replays every load stage of the 16 real lifecycle runs (12 normal, 4 overloaded reasoning runs)
through the package's scheduler (:func:`bayes_latency.data.replay.replay_stage`) at the committed
BLIS exports' posterior means (``results/real/exports``), once serially in this process (wall and
CPU time) and once as Dask tasks on a 2-worker local cluster (``calibrate.replay_all`` with
``scheduler="local"``, the way ``calibrate`` can run them). The calibration replays each stage twice
per iteration (at beta and 1.05 beta, for the tangent rows), the 12 normal runs only.

Writes ``results/benchmarks/client_replay_speed.{md,json}``.

    python benchmarks/client_replay_speed.py [--exports results/real/exports]
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
    load1 = os.getloadavg()
    res = {"stages": len(stages), "runs": len(runs),
           "requests": int(sum(p["requests"] for p in per)),
           "steps": int(sum(p["steps"] for p in per)),
           "serial_wall_s": serial_s, "serial_cpu_s": serial_cpu,
           "dask_2_workers_wall_s": dask_s, "load_before": load0, "load_after": load1,
           "per_stage": per}
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
        "A calibration iteration replays the 20 stages of the 12 normal runs twice (at beta and "
        "1.05 beta, for the tangent rows) and once more at the posterior mean.",
    ]
    out.with_suffix(".md").write_text("\n".join(md) + "\n", encoding="utf-8")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
