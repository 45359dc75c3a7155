"""Part 1 of ``benchmarks/ingest_scale.py``: where ingest time goes on the demo fleet's traces.

MB per CPU-second of decoding the lines with ``json.loads``, msgspec (to dicts), msgspec into
the typed OTLP Structs of :mod:`bayes_latency.data.otlp.read` and the compiled scanner of
:mod:`bayes_latency.data.otlp.scan`; of :func:`~bayes_latency.data.otlp.read.read_otlp` on its
paths (their tables must be identical); CPU seconds per ingest stage of an inline ingest
(:func:`json_path`); the compiled kernels' start-up costs (:func:`numba_costs`) and the Parquet
writer's options (:func:`parquet_options`). CPU time (``time.process_time``) throughout: the
cores are shared, and waiting for one inflates wall time, not CPU time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]


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
    default_chunk, default_min = otlp.CHUNK_BYTES, otlp.SCANNER_MIN_INPUT_BYTES
    otlp.SCANNER_MIN_INPUT_BYTES = 0  # the path follows CHUNK_BYTES, whatever the input's size
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
        otlp.CHUNK_BYTES, otlp.SCANNER_MIN_INPUT_BYTES = default_chunk, default_min
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
