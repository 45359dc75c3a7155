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

Outputs ``OUT.md`` and ``OUT.json`` (one current file per benchmark).
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

REPO = Path(__file__).resolve().parents[1]
MEM_BUDGET_GB = 3.0
TARGET_MB_S_PER_CORE = 50.0


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
    import bayes_latency.model.summaries  # noqa: F401
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
                         and __import__("bayes_latency.model.summaries") and 0.0)
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
    from bayes_latency.model.estimator import LatencyModel
    from bayes_latency.model.hierarchy import prior_arrays
    from bayes_latency.model.summaries import NoisePrior, fit_rows, summarize

    m = LatencyModel()
    rows = fit_rows(obs, coefs=m.coefs)
    configs = sorted(rows["gpu"].unique())
    pa = prior_arrays(m.priors, m.coefs, configs)
    prior = NoisePrior(sigma=dict(pa.noise_sigma), nu_alpha=pa.nu_alpha, nu_beta=pa.nu_beta)
    t0 = time.perf_counter()
    s = summarize(rows, m.coefs, m._scale(), noise_prior=prior, scheduler=scheduler)
    return s, time.perf_counter() - t0, len(rows)


# ------------------------------------------------------------------------------- part 1
def _stage_cpu(demo: list[Path], out: Path, chunk_bytes: int | None = None) -> dict:
    """CPU seconds per ingest stage of an inline ingest of ``demo`` (best of 2 by total);
    ``chunk_bytes`` 0 reads every trace line by line (no columnar path)."""
    import functools
    from collections import defaultdict

    import bayes_latency.data.client.lifecycle as lcm
    import bayes_latency.data.experiment as ex
    import bayes_latency.data.otlp.read as otlp

    acc: dict[str, float] = defaultdict(float)
    patched = []

    def wrap(mod, name: str, label: str) -> None:
        f = getattr(mod, name)

        @functools.wraps(f)
        def g(*a, **k):
            t = time.process_time()
            try:
                return f(*a, **k)
            finally:
                acc[label] += time.process_time() - t

        patched.append((mod, name, f))
        setattr(mod, name, g)

    for mod, name, label in ((otlp, "read_otlp", "read_otlp"),
                             (ex, "reconstruct_batches", "reconstruct"),
                             (ex, "build_observations", "observations"),
                             (ex, "build_iterations", "iterations"),
                             (ex, "write_partition", "write_parquet"),
                             (lcm, "read_lifecycle_dir", "lifecycle")):
        wrap(mod, name, label)
    best: dict = {}
    default_chunk = otlp.CHUNK_BYTES
    if chunk_bytes is not None:
        otlp.CHUNK_BYTES = chunk_bytes
    try:
        ex.ingest(demo[:1], out / "warm", scheduler="inline")
        for k in range(2):
            acc.clear()
            c0 = time.process_time()
            ex.ingest(demo, out / f"stages{k}", scheduler="inline")
            total = time.process_time() - c0
            if not best or total < best["total"]:
                best = {"total": total, **acc, "other": total - sum(acc.values())}
    finally:
        otlp.CHUNK_BYTES = default_chunk
        for mod, name, f in patched:
            setattr(mod, name, f)
    return {k: round(v, 3) for k, v in best.items()}


def json_path(demo: list[Path], work: Path) -> dict:
    """Decoding speeds, ``read_otlp`` on the typed and the generic path, CPU per stage."""
    import msgspec

    import bayes_latency.data.otlp.read as otlp

    files = [f / "traces.jsonl" for f in demo]
    mb = sum(f.stat().st_size for f in files) / 1e6
    res: dict = {"trace_mb": round(mb, 1)}
    lines = [ln for f in files for ln in f.read_bytes().splitlines(keepends=True)]
    # CPU time (process_time) as well as wall time: the machine is shared, and waiting for a
    # core inflates wall time but not CPU time; best of 3
    decoders = [("json.loads", json.loads), ("msgspec", msgspec.json.Decoder().decode),
                ("msgspec typed", otlp._decode_typed)]
    try:  # not a dependency: measured when installed
        import orjson

        decoders.insert(2, ("orjson", orjson.loads))
    except ImportError:
        pass
    for name, fn in decoders:
        best_c = best_w = float("inf")
        for _ in range(3):
            c0, w0 = time.process_time(), time.perf_counter()
            for line in lines:
                fn(line)
            best_c = min(best_c, time.process_time() - c0)
            best_w = min(best_w, time.perf_counter() - w0)
        res[f"decode_mb_per_cpu_s[{name}]"] = round(mb / best_c, 1)
        res[f"decode_mb_s[{name}]"] = round(mb / best_w, 1)
    del lines
    blobs = [f.read_bytes() for f in files]
    # the compiled scanner of the default path (data/otlp/scan.py) over whole files
    import numpy as np

    from bayes_latency.data.otlp import chunks as oc
    from bayes_latency.data.otlp import scan as otlp_scan

    best_c = best_w = float("inf")
    for _ in range(3):
        c0, w0 = time.process_time(), time.perf_counter()
        for b in blobs:
            n = len(b)
            arr = np.frombuffer(b + bytes(8), dtype=np.uint8)
            ws = [np.empty((w, n // d + 1), dtype=np.int64) for w, d in (
                (otlp_scan.SP_WIDTH, 26), (otlp_scan.EV_WIDTH, 11), (otlp_scan.KV_WIDTH, 16),
                (otlp_scan.KV_WIDTH, 16))]
            assert otlp_scan.scan_kernel(arr, n, *ws, np.zeros(4, dtype=np.int64),
                                         *oc._scan_tables(),
                                         np.empty(otlp_scan.MAX_DEPTH, dtype=np.uint8)) > 0
        best_c = min(best_c, time.process_time() - c0)
        best_w = min(best_w, time.perf_counter() - w0)
    res["decode_mb_per_cpu_s[scanner]"] = round(mb / best_c, 1)
    res["decode_mb_s[scanner]"] = round(mb / best_w, 1)
    del blobs

    def refuse(raw: bytes) -> None:
        raise ValueError("generic path")

    tabs = {}
    typed = otlp._decode_typed
    try:
        for name, fn, chunk in (("generic", refuse, 0), ("typed", typed, 0),
                                ("columnar", typed, None)):
            otlp._decode_typed = fn
            best_c = best_w = float("inf")
            for _ in range(2):
                c0, w0 = time.process_time(), time.perf_counter()
                tabs[name] = [otlp.read_otlp(f, chunk_bytes=chunk) for f in files]
                best_c = min(best_c, time.process_time() - c0)
                best_w = min(best_w, time.perf_counter() - w0)
            res[f"read_otlp_mb_per_cpu_s[{name}]"] = round(mb / best_c, 1)
            res[f"read_otlp_mb_s[{name}]"] = round(mb / best_w, 1)
    finally:
        otlp._decode_typed = typed
    for other in ("typed", "columnar"):
        for a, b in zip(tabs["generic"], tabs[other], strict=True):
            for t in ("steps", "journey_events", "requests", "snapshots", "api_spans"):
                pd.testing.assert_frame_equal(getattr(a, t), getattr(b, t), check_exact=True)
            assert a.report.to_dict() == b.report.to_dict()
    res["tables_identical"] = True
    del tabs
    res["stage_cpu_s"] = _stage_cpu(demo, work / "stages")
    res["stage_cpu_s_line_path"] = _stage_cpu(demo, work / "stages_lines", chunk_bytes=0)
    res["parquet"] = parquet_options(demo, work)
    res["numba"] = numba_costs(demo, work)
    res["load_average"] = round(os.getloadavg()[0], 2)
    return res


def _first_experiments_in(pkg: Path, demo: list[Path], out: Path, env: dict) -> dict:
    """CPU seconds of the import, the first and the second experiment's inline ingest in a
    fresh process importing ``bayes_latency`` from ``pkg``."""
    import subprocess

    code = ("import json, sys, time\n"
            "sys.path.insert(0, sys.argv[1])\n"
            "from pathlib import Path\n"
            "c0 = time.process_time()\n"
            "from bayes_latency.data.experiment import ingest\n"
            "import bayes_latency; assert bayes_latency.__file__.startswith(sys.argv[1])\n"
            "demo = [Path(x) for x in json.loads(sys.argv[2])]\n"
            "c1 = time.process_time()\n"
            "ingest(demo[:1], Path(sys.argv[3]) / 'a', scheduler='inline')\n"
            "c2 = time.process_time()\n"
            "ingest(demo[1:2], Path(sys.argv[3]) / 'b', scheduler='inline')\n"
            "c3 = time.process_time()\n"
            "print(json.dumps({'import': round(c1 - c0, 3), 'first': round(c2 - c1, 3), "
            "'second': round(c3 - c2, 3), 'numba': 'numba' in sys.modules}))\n")
    run = subprocess.run([sys.executable, "-c", code, str(pkg),
                          json.dumps([str(d) for d in demo[:2]]), str(out)],
                         capture_output=True, text=True, env=env, cwd=str(pkg), check=True)
    shutil.rmtree(out, ignore_errors=True)
    return json.loads(run.stdout.strip().splitlines()[-1])


def numba_costs(demo: list[Path], work: Path) -> dict:
    """What the compiled batch rebuild (``data/rebuild/kernel.py``) costs a fresh process:
    the first experiment's ingest with an empty numba cache (compilation) and with the cache
    filled (numba's import and start-up, loading the cached code), each in a fresh process; the
    second experiment shows the steady state."""
    cache = work / "numba_cache"
    shutil.rmtree(cache, ignore_errors=True)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache))
    res = {"cold_cache": _first_experiments_in(REPO, demo, work / "nb_cold", env),
           "warm_cache": []}
    for k in range(2):
        res["warm_cache"].append(_first_experiments_in(REPO, demo, work / f"nb_warm{k}", env))
    shutil.rmtree(cache, ignore_errors=True)
    return res


#: Parquet writer options compared by :func:`parquet_options` (``pq.write_table`` keywords; the
#: first is what ``tables._write_parquet`` writes).
PARQUET_VARIANTS = {
    "lz4, no dictionary, no statistics (written)": {"compression": "lz4"},
    "uncompressed": {"compression": "none"},
    "snappy": {"compression": "snappy"},
    "zstd level 1": {"compression": "zstd", "compression_level": 1},
    "zstd level 3": {"compression": "zstd", "compression_level": 3},
    "lz4 + dictionary encoding": {"compression": "lz4", "use_dictionary": True},
    "lz4 + statistics": {"compression": "lz4", "write_statistics": True},
    "lz4, 1M-row write batches and 8 MB pages": {"compression": "lz4", "data_page_size": 8 << 20,
                                                  "write_batch_size": 1 << 20},
    "lz4, one row group per file (2^24 rows)": {"compression": "lz4", "row_group_size": 1 << 24},
    "lz4, no Arrow schema in the file (store_schema=False)": {"compression": "lz4",
                                                              "store_schema": False},
}


def parquet_options(demo: list[Path], work: Path, rounds: int = 3) -> dict:
    """CPU seconds and bytes of writing the demo fleet's partitions (the frames one inline
    ingest writes) with each of :data:`PARQUET_VARIANTS`, best of ``rounds``, and whether every
    file reads back (``pd.read_parquet``) exactly as the written variant's does; the Arrow
    conversion (``tables._arrow_table``, shared by all) separately."""
    import pyarrow.parquet as pq

    from bayes_latency.data import tables as tbl
    from bayes_latency.data.experiment import _inputs, ingest_experiment

    frames = []
    for trace, cfg, folder, eid in _inputs(demo, None):
        tabs, _, _ = ingest_experiment(trace, cfg, experiment_id=eid, folder=folder)
        frames += [df.reset_index(drop=True) for df in tabs.values()
                   if df is not None and len(df)]
    conv = float("inf")
    for _ in range(rounds):
        c0 = time.process_time()
        arrow = [tbl._arrow_table(df) for df in frames]
        conv = min(conv, time.process_time() - c0)
    res: dict = {"files": len(frames), "arrow_conversion_cpu_s": round(conv, 3), "variants": {}}
    ref = None
    for name, kw in PARQUET_VARIANTS.items():
        opts = {"use_dictionary": False, "write_statistics": False, **kw}
        d = work / "parquet_options"
        best = float("inf")
        for _ in range(rounds):
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
            c0 = time.process_time()
            for i, t in enumerate(arrow):
                pq.write_table(t, d / f"{i}.parquet", **opts)
            best = min(best, time.process_time() - c0)
        size = sum((d / f"{i}.parquet").stat().st_size for i in range(len(arrow)))
        back = [pd.read_parquet(d / f"{i}.parquet") for i in range(len(arrow))]
        if ref is None:
            ref = back
        same = True
        for x, y in zip(ref, back, strict=True):
            try:
                pd.testing.assert_frame_equal(x, y, check_exact=True)
            except AssertionError:
                same = False
        res["variants"][name] = {"cpu_s": round(best, 3), "mb": round(size / 1e6, 2),
                                 "reads_back_identical": same}
        del back
    shutil.rmtree(work / "parquet_options", ignore_errors=True)
    res["load_average"] = round(os.getloadavg()[0], 2)
    return res


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


def _markdown(r: dict) -> str:
    j, s, c = r["json"], r["same"], r["scale"]
    r1, r2 = c["runs"]["1_workers"], c["runs"]["2_workers"]
    stages = j["stage_cpu_s"]
    stage_text = (
        "Ingest of the demo fleet inline, CPU per stage (best of 2): with the columnar path "
        "(the default) and with every line read line by line (tables, observations and Parquet "
        "included); MB per CPU-s.")
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
        r["machine"] = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
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
    out.with_suffix(".md").write_text(_markdown(r))
    print(_markdown(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
