"""Ingest and stage 1 on Dask distributed: same results, and how they scale.

Three parts, one run:

1. **Where ingest time goes** on the demo fleet's traces: MB per CPU-second of decoding the lines
   with ``json.loads``, msgspec (to dicts), msgspec into the typed OTLP Structs of
   :mod:`bayes_latency.data.otlp.read` and the compiled scanner of
   :mod:`bayes_latency.data.otlp.scan`; of :func:`~bayes_latency.data.otlp.read.read_otlp` on its
   generic, typed and columnar paths (the tables of all three must be identical); and CPU
   seconds per ingest stage (read, rebuild, observations, iterations, lifecycle, Parquet) of an
   inline ingest, with the columnar path and with the line-by-line path.
2. **Same results** on the demo fleet: ingest inline (one process) and on a
   ``LocalCluster(n_workers=2, threads_per_worker=1, processes=True)``: every table identical;
   stage-1 summaries of both equal to 1e-12; the demo fit (its training rows, ``DEMO_FIT``
   settings, ``--draws``) with stage 1 inline and on the cluster gives the same posterior for the
   same seed.
3. **Scale**: a fleet of ``--factor`` (default 20) copies of the demo fleet's experiments under
   new ids (``<id>-rNN``; >= 20x its trace bytes) in ``--work`` (outside the repository, deleted
   afterwards unless ``--keep``), ingested and summarised on a local cluster of 1 worker and of 2
   workers (one process each, one thread), in one run. Reported: wall time, MB/s per core (trace
   MB / wall time / workers), MB per CPU-second of the workers (independent of other jobs on
   the machine), the ratio of per-core throughput 2 workers / 1 worker, and the peak RSS of each
   worker process (psutil, sampled every 0.2 s), against the 3 GB budget.

Usage::

    python benchmarks/ingest_scale.py [--work /work/tmp-scale/bench] [--factor 20] [--seed 0]
        [--draws 1000] [--keep] [--out results/benchmarks/ingest_scale]

Outputs ``OUT.md`` and ``OUT.json`` (one current file per benchmark). Part 1's measurements are
in ``benchmarks/ingest_costs.py``, the report in ``benchmarks/ingest_scale_report.py``
(``python benchmarks/ingest_scale_report.py`` re-renders ``OUT.md`` from ``OUT.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

# this checkout's package, also when the installed one is another worktree's
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.ingest_costs import json_path  # noqa: E402
from benchmarks.ingest_scale_report import MEM_BUDGET_GB, markdown  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


class MemorySampler:
    """Peak RSS of a set of processes, sampled in a thread every ``interval`` seconds."""

    def __init__(self, pids: dict[str, int], interval: float = 0.2) -> None:
        import psutil

        self.procs = {k: psutil.Process(p) for k, p in pids.items()}
        self.peak = dict.fromkeys(pids, 0)
        self.cpu0 = {k: sum(p.cpu_times()[:2]) for k, p in self.procs.items()}
        self.sys0 = {k: p.cpu_times()[1] for k, p in self.procs.items()}
        self.cpu = dict.fromkeys(pids, 0.0)
        self.sys = dict.fromkeys(pids, 0.0)
        self.interval = interval
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for k, p in self.procs.items():
                try:
                    self.peak[k] = max(self.peak[k], p.memory_info().rss)
                except Exception:  # noqa: BLE001 - a vanished worker stops being sampled
                    pass
            self._stop.wait(self.interval)

    def __enter__(self) -> MemorySampler:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        for k, p in self.procs.items():
            try:
                self.cpu[k] = sum(p.cpu_times()[:2]) - self.cpu0[k]
                self.sys[k] = p.cpu_times()[1] - self.sys0[k]
            except Exception:  # noqa: BLE001
                pass


def _warm_worker(folder: str) -> float:
    """Imports and the compiled kernels (numba) loaded in this process, by ingesting the
    experiment ``folder`` in memory; CPU seconds of this process it took."""
    import time as _t
    from pathlib import Path as _P

    c0 = _t.process_time()
    import bayes_latency.model.definition.summaries  # noqa: F401
    from bayes_latency.data.experiment import _inputs, ingest_experiment

    trace, cfg, fold, eid = _inputs([_P(folder)], None)[0]
    ingest_experiment(trace, cfg, experiment_id=eid, folder=fold)
    return _t.process_time() - c0


def _cluster(n: int, warm: Path | None = None):
    """The local cluster ``ingest --scheduler local`` starts (:func:`parallel.local_cluster`),
    its workers warmed: imports, and with ``warm`` (an experiment folder) the compiled kernels
    loaded by ingesting it in memory, so that timings are of the work. Returns the cluster, the
    client and the warm-up (wall seconds, worker CPU seconds)."""
    from distributed import Client

    from bayes_latency.parallel import local_cluster

    cluster = local_cluster(n, memory_limit="6GB")
    client = Client(cluster)
    t0 = time.perf_counter()
    if warm is None:
        cpu = client.run(lambda: __import__("bayes_latency.data.experiment")
                         and __import__("bayes_latency.model.definition.summaries") and 0.0)
    else:
        cpu = client.run(_warm_worker, str(warm))
    cluster.warm_up = {"s": round(time.perf_counter() - t0, 2),
                       "worker_cpu_s": round(sum(cpu.values()), 2)}
    return cluster, client


def _uptime() -> str:
    """``uptime`` output (time and load averages), or the load averages alone."""
    import subprocess

    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def _trace_bytes(folders: list[Path]) -> int:
    return sum((f / "traces.jsonl").stat().st_size for f in folders)


def _compare_tables(a: Path, b: Path) -> dict:
    from bayes_latency.data.tables import read_table, table_names

    out = {}
    names = table_names(a)
    assert names == table_names(b), (names, table_names(b))
    for n in names:
        x, y = read_table(a, n), read_table(b, n)
        pd.testing.assert_frame_equal(x, y, check_exact=True)
        out[n] = len(x)
    return out


def _summary_diff(a: list, b: list) -> float:
    """Max relative difference of theta_hat, grad, info, loglik over configurations."""
    assert [s.config_id for s in a] == [s.config_id for s in b]
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        for f in ("theta_hat", "grad", "info"):
            u, v = getattr(x, f), getattr(y, f)
            den = max(float(np.max(np.abs(u))), 1e-300)
            worst = max(worst, float(np.max(np.abs(u - v))) / den)
        worst = max(worst, abs(x.loglik - y.loglik) / max(abs(x.loglik), 1e-300))
        assert x.noise == y.noise
    return worst


def _stage1(obs: pd.DataFrame, scheduler) -> tuple[list, float, int]:
    from bayes_latency.model.definition.hierarchy import prior_arrays
    from bayes_latency.model.definition.summaries import NoisePrior, fit_rows, summarize
    from bayes_latency.model.estimator import LatencyModel

    m = LatencyModel()
    rows = fit_rows(obs, coefs=m.coefs)
    configs = sorted(rows["gpu"].unique())
    pa = prior_arrays(m.priors, m.coefs, configs)
    prior = NoisePrior(sigma=dict(pa.noise_sigma), nu_alpha=pa.nu_alpha, nu_beta=pa.nu_beta)
    t0 = time.perf_counter()
    s = summarize(rows, m.coefs, m._scale(), noise_prior=prior, scheduler=scheduler)
    return s, time.perf_counter() - t0, len(rows)


# ------------------------------------------------------------------------------- part 2
def same_results(demo: list[Path], work: Path, draws: int, seed: int) -> dict:
    from bayes_latency.data.experiment import ingest
    from bayes_latency.data.observations.build import config_id
    from bayes_latency.data.tables import read_table
    from bayes_latency.model.estimator import LatencyModel
    from bayes_latency.study.demo import DEMO_FIT, HELD_OUT

    res: dict = {}
    t0 = time.perf_counter()
    ingest(demo, work / "demo_inline", scheduler="inline")
    res["ingest_inline_s"] = round(time.perf_counter() - t0, 1)
    cluster, client = _cluster(2)
    try:
        t0 = time.perf_counter()
        ingest(demo, work / "demo_dist", scheduler=client)
        res["ingest_2_workers_s"] = round(time.perf_counter() - t0, 1)
        res["table_rows"] = _compare_tables(work / "demo_inline", work / "demo_dist")
        res["tables_identical"] = True
        obs = read_table(work / "demo_dist", "observations")
        a, ta, n = _stage1(obs, "inline")
        b, tb, _ = _stage1(obs, client)
        res.update(stage1_rows=n, stage1_configs=len(a), stage1_inline_s=round(ta, 2),
                   stage1_2_workers_s=round(tb, 2), stage1_max_rel_diff=_summary_diff(a, b))
        train = obs[obs["config_id"] != config_id(*HELD_OUT)]
        post = {}
        for name, sched in (("inline", "inline"), ("2_workers", client)):
            m = LatencyModel(scheduler=sched)
            t0 = time.perf_counter()
            m.fit(train, draws=draws, seed=seed, **DEMO_FIT)
            conv = m.convergence()
            post[name] = m.result
            res[f"fit_{name}"] = {"s": round(time.perf_counter() - t0, 1),
                                  "max_rhat": round(float(conv["max_rhat"]), 4),
                                  "min_ess_bulk": round(float(conv["min_ess_bulk"]), 0),
                                  "divergences": int(conv["divergences"])}
        diffs = {}
        for v in ("beta", "alpha", "mu", "sigma_config"):
            x = post["inline"]["posterior"][v].values
            y = post["2_workers"]["posterior"][v].values
            diffs[v] = float(np.max(np.abs(x - y)))
        res["posterior_max_abs_diff"] = diffs
        res["posterior_draws"] = f"2 chains x {draws}, seed {seed}"
    finally:
        client.close()
        cluster.close()
    return res


# ------------------------------------------------------------------------------- part 3
def make_scale_fleet(demo: list[Path], dest: Path, factor: int) -> list[Path]:
    """``factor`` copies of every demo experiment under ids ``<id>-rNN`` (traces, serving.yaml,
    results/, profile.yaml)."""
    out = []
    dest.mkdir(parents=True, exist_ok=True)
    for k in range(factor):
        for src in demo:
            d = dest / f"{src.name}-r{k:02d}"
            d.mkdir(exist_ok=True)
            shutil.copyfile(src / "traces.jsonl", d / "traces.jsonl")
            if (src / "results").is_dir():
                shutil.copytree(src / "results", d / "results", dirs_exist_ok=True)
            if (src / "profile.yaml").is_file():
                shutil.copyfile(src / "profile.yaml", d / "profile.yaml")
            doc = yaml.safe_load((src / "serving.yaml").read_text())
            doc["experiment_id"] = d.name
            (d / "serving.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
            out.append(d)
    return out


def dask_defaults_ab(folders: list[Path], work: Path, rounds: int = 2) -> dict:
    """Worker CPU seconds (user + system, and system) of ingesting ``folders`` on one worker
    started with Dask's defaults and with :func:`parallel.local_cluster`'s settings, the two
    alternating ``rounds`` times; the best of each."""
    import dask
    from distributed import Client, LocalCluster

    from bayes_latency.data.experiment import ingest
    from bayes_latency.parallel import _DASK_TRIM, _TRIM

    mb = _trace_bytes(folders) / 1e6
    best: dict[str, dict] = {}
    loads = []
    for _ in range(rounds):
        for name in ("dask_defaults", "local_cluster"):
            if name == "dask_defaults":
                with dask.config.set({f"distributed.nanny.pre-spawn-environ.{_TRIM}": _DASK_TRIM}):
                    cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                           dashboard_address=None, silence_logs=50,
                                           memory_limit="6GB")
                client = Client(cluster)
                client.run(lambda: __import__("bayes_latency.data.experiment"))
            else:
                cluster, client = _cluster(1)
            try:
                pids = client.run(os.getpid)
                out = work / f"ab_tables_{name}"
                with MemorySampler(pids) as mem:
                    ingest(folders, out, scheduler=client)
                cpu, sys_ = sum(mem.cpu.values()), sum(mem.sys.values())
                if name not in best or cpu < best[name]["cpu_s"]:
                    best[name] = {"cpu_s": round(cpu, 2), "system_cpu_s": round(sys_, 2),
                                  "mb_per_cpu_s": round(mb / cpu, 1),
                                  "peak_rss_gb": round(max(mem.peak.values()) / 1e9, 3)}
                shutil.rmtree(out, ignore_errors=True)
            finally:
                client.close()
                cluster.close()
            loads.append(round(os.getloadavg()[0], 2))
    return {"experiments": len(folders), "trace_mb": round(mb, 1), "rounds": rounds, **best,
            "load_average": f"{min(loads)}-{max(loads)}"}


def scale(demo: list[Path], work: Path, factor: int) -> dict:
    from bayes_latency.data.experiment import ingest
    from bayes_latency.data.tables import read_table

    t0 = time.perf_counter()
    folders = make_scale_fleet(demo, work / "scale_fleet", factor)
    demo_mb = _trace_bytes(demo) / 1e6
    mb = _trace_bytes(folders) / 1e6
    res: dict = {"demo_trace_mb": round(demo_mb, 1), "fleet_trace_mb": round(mb, 1),
                 "factor_bytes": round(mb / demo_mb, 2), "experiments": len(folders),
                 "generate_s": round(time.perf_counter() - t0, 1), "runs": {}}
    summaries = {}
    for n in (1, 2):
        cluster, client = _cluster(n, warm=demo[0])
        try:
            pids = client.run(os.getpid)
            load0 = os.getloadavg()[0]
            out = work / f"scale_tables_{n}w"
            with MemorySampler(pids) as mem_i:
                t0, c0 = time.perf_counter(), time.process_time()
                ingest(folders, out, scheduler=client)
                t_ingest = time.perf_counter() - t0
                c_client = time.process_time() - c0
            obs = read_table(out, "observations")
            with MemorySampler(pids) as mem_s:
                s, t_stage1, n_rows = _stage1(obs, client)
            summaries[n] = s
            cpu_i = sum(mem_i.cpu.values())
            res["runs"][f"{n}_workers"] = {
                "ingest_s": round(t_ingest, 1),
                "ingest_mb_s": round(mb / t_ingest, 1),
                "ingest_mb_s_per_core": round(mb / t_ingest / n, 1),
                "ingest_worker_cpu_s": round(cpu_i, 1),
                "ingest_mb_per_cpu_s": round(mb / max(cpu_i, 1e-9), 1),
                "ingest_worker_system_cpu_s": round(sum(mem_i.sys.values()), 1),
                "ingest_client_cpu_s": round(c_client, 1),
                "ingest_idle_core_s": round(n * t_ingest - cpu_i, 1),
                "warm_up": cluster.warm_up,
                "ingest_peak_rss_gb": {k: round(v / 1e9, 3) for k, v in mem_i.peak.items()},
                "observation_rows": len(obs),
                "stage1_rows": n_rows,
                "stage1_configs": len(s),
                "stage1_s": round(t_stage1, 1),
                "stage1_rows_per_s_per_core": round(n_rows / t_stage1 / n),
                "stage1_worker_cpu_s": round(sum(mem_s.cpu.values()), 1),
                "stage1_peak_rss_gb": {k: round(v / 1e9, 3) for k, v in mem_s.peak.items()},
                "load_average_at_start": round(load0, 2),
                "load_average_at_end": round(os.getloadavg()[0], 2),
            }
            del obs
        finally:
            client.close()
            cluster.close()
    r1, r2 = res["runs"]["1_workers"], res["runs"]["2_workers"]
    res["per_core_ratio_2_over_1"] = round(r2["ingest_mb_s_per_core"] / r1["ingest_mb_s_per_core"], 3)
    res["speedup_2_over_1"] = round(r1["ingest_s"] / r2["ingest_s"], 3)
    res["stage1_speedup_2_over_1"] = round(r1["stage1_s"] / r2["stage1_s"], 3)
    res["tables_1w_vs_2w"] = _compare_tables(work / "scale_tables_1w", work / "scale_tables_2w")
    res["stage1_1w_vs_2w_max_rel_diff"] = _summary_diff(summaries[1], summaries[2])
    res["dask_defaults_ab"] = dask_defaults_ab(folders[:5 * len(demo)], work)
    peak = max(max(r["ingest_peak_rss_gb"].values()) for r in res["runs"].values())
    peak = max(peak, max(max(r["stage1_peak_rss_gb"].values()) for r in res["runs"].values()))
    res["peak_rss_per_worker_gb"] = peak
    res["within_memory_budget"] = peak <= MEM_BUDGET_GB
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default="/work/tmp-scale/bench")
    ap.add_argument("--factor", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--draws", type=int, default=1000)
    ap.add_argument("--keep", action="store_true", help="keep the generated fleets and tables")
    ap.add_argument("--out", default=str(REPO / "results" / "benchmarks" / "ingest_scale"))
    ap.add_argument("--parts", default="json,same,scale",
                    help="parts to run (json, same, scale); the others are kept from OUT.json")
    args = ap.parse_args(argv)
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    out = Path(args.out)
    from bayes_latency.study.machine import cpu_model
    from bayes_latency.synth.fleet import simulate_fleet

    work = Path(args.work)
    if work.resolve().is_relative_to(REPO):
        print("--work must be outside the repository", file=sys.stderr)
        return 2
    free_gb = shutil.disk_usage(work.parent if work.parent.exists() else "/").free / 1e9
    need_gb = 0.2 * args.factor + 1
    if free_gb < need_gb:
        print(f"{free_gb:.0f} GB free, need about {need_gb:.0f} GB", file=sys.stderr)
        return 2
    work.mkdir(parents=True, exist_ok=True)
    try:
        t0 = time.perf_counter()
        demo = simulate_fleet("demo", work / "demo_fleet", seed=args.seed, progress=False)
        print(f"demo fleet simulated in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        prev = out.with_suffix(".json")
        r = json.loads(prev.read_text()) if prev.is_file() and parts != {"json", "same", "scale"} \
            else {}
        r["machine"] = (f"{cpu_model()}, {os.cpu_count()} cores, "
                        f"Python {platform.python_version()}")
        stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        r.setdefault("dates", {})
        r["uptime"] = {"start": _uptime()}
        if "json" in parts:
            r["json"] = json_path(demo, work)
            r["dates"]["json"] = stamp
            print("json:", r["json"], file=sys.stderr)
        if "same" in parts:
            r["same"] = same_results(demo, work, args.draws, args.seed)
            r["dates"]["same"] = stamp
            print("same:", r["same"], file=sys.stderr)
        if "scale" in parts:
            r["scale"] = scale(demo, work, args.factor)
            r["dates"]["scale"] = stamp
            print("scale:", json.dumps(r["scale"], indent=1), file=sys.stderr)
        r["uptime"]["end"] = _uptime()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(r, indent=2, default=str))
    out.with_suffix(".md").write_text(markdown(r))
    print(markdown(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
