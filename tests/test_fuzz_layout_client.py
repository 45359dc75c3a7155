"""Fuzz the partitioned table layout that ``ingest`` writes and ``calibrate`` on damaged client
results, classifying every outcome (``tests/mutate.py`` :data:`OUTCOMES`).

- **Layout**: each damage of :data:`mutate.LAYOUT_MUTATIONS` (missing, extra, unlisted,
  foreign-column, corrupt, truncated and empty partitions; a garbage, latin-1, wrongly shaped or
  missing ``tables.json``; a manifest listing a ghost experiment or dropping a table; the
  leftovers of two ingests) to each table of a small folder, read by ``fit`` (sampling replaced
  by a sentinel) and by ``check --tables`` (which validates the tables before opening the
  posterior). A run that reads the damaged folder as if whole is a silent loss.
- **Concurrent ingest**: two processes ingest into one ``--out`` at once.
- **calibrate**: vllm bench JSON, inference-perf lifecycle JSON and TraceV2 pairs with damage
  that must stop the calibration or be counted / noted (the loop replaced by a sentinel that
  checks the stages' measured means).

Tracebacks, hangs (a SIGALRM time limit), silent losses and wrong results accepted must be 0;
the counts by class are printed (``pytest -s``).
"""

from __future__ import annotations

import json
import shutil
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
from mutate import Sampled as _Sampled
from mutate import copy_exp, tree_hash
from mutate import one_line_error as _one_line

from bayes_latency.cli.main import main

SEED = 16
ROOT = Path(__file__).resolve().parents[1]
LAYOUT_STATS: Counter = Counter()
EXPS = ("run-a", "run-b", "run-c")


def _layout_base(root: Path) -> Path:
    """A small partitioned table folder: observations (from the physics basis), requests and
    steps of three experiments, and its manifest (what ``ingest`` writes, without a trace)."""
    from obs_factory import make_observations

    from bayes_latency.data.tables import write_manifest, write_partition

    obs, _ = make_observations([("llama-2-7b", "H100", 1)], n_iter=30, n_win=5, n_alpha=10,
                               seed=5)
    n = len(obs) // 3
    d = root / "tables"
    for k, e in enumerate(EXPS):
        part = obs.iloc[k * n:(k + 1) * n].copy()
        part["experiment_id"] = e
        write_partition(d, "observations", e, part)
        write_partition(d, "requests", e, pd.DataFrame(
            {"experiment_id": e, "request_id": [f"{e}-{i}" for i in range(5)],
             "prompt_tokens": np.arange(5) + 10, "e2e_us": np.linspace(1e5, 2e5, 5)}))
        write_partition(d, "steps", e, pd.DataFrame(
            {"experiment_id": e, "step.id": np.arange(4), "step.duration_us": [50.0] * 4}))
    write_manifest(d, list(EXPS), {t: list(EXPS) for t in ("observations", "requests", "steps")})
    return d


def _classify(argv: list, capsys, names: tuple[str, ...], timeout: float = 60.0
              ) -> tuple[str, str]:
    """(outcome, detail) of one in-process run: ``clean_error`` (exit 2, one line naming one
    of ``names``), ``accepted`` (exit 0/1 or the sampling sentinel), ``traceback`` or
    ``hang``; an exit 2 that names none of ``names`` is a ``wrong_accepted`` message."""
    from mutate import Hang, time_limit

    capsys.readouterr()
    try:
        with time_limit(timeout):
            rc = main([str(a) for a in argv])
    except _Sampled:
        return "accepted", "reached the sampler"
    except Hang as exc:
        return "hang", str(exc)
    except BaseException:  # noqa: BLE001 - the point of the suite
        return "traceback", traceback.format_exc()[-1500:]
    out, err = capsys.readouterr()
    if rc == 2:
        msg = _one_line(err, names)
        return ("wrong_accepted", msg) if msg else ("clean_error", err.strip())
    return "accepted", f"exit {rc}"


def test_fuzz_partitioned_layout(tmp_path, capsys, monkeypatch):
    """Every damage of mutate.LAYOUT_MUTATIONS to each table, read by ``fit`` (observations;
    sampling replaced by a sentinel) and by ``check --tables`` (every table, validated before
    the posterior is opened): a clean error naming the table folder, never a subset read."""
    from mutate import BAD_OUTCOMES, LAYOUT_MUTATIONS

    from bayes_latency.model import estimator

    def no_sampling(self, *a, **k):
        raise _Sampled()

    monkeypatch.setattr(estimator.LatencyModel, "fit", no_sampling)
    base = _layout_base(tmp_path / "base")
    outcomes: Counter = Counter()
    problems: list[str] = []
    # the undamaged folder reaches the sampler and passes check's table validation
    kind, detail = _classify(["fit", base, "--out", tmp_path / "p.nc"], capsys, ())
    assert kind == "accepted", detail
    kind, detail = _classify(["check", tmp_path / "none.nc", "--tables", base], capsys,
                             ("none.nc",))
    assert kind == "clean_error" and "none.nc" in detail, detail
    for name, damage in LAYOUT_MUTATIONS.items():
        for table in ("observations", "requests", "steps"):
            work = tmp_path / f"{name}-{table}"
            shutil.copytree(base, work)
            damage(work, table)
            before = tree_hash(work)
            runs = [(["check", tmp_path / "none.nc", "--tables", work], "check")]
            if table == "observations" or name.startswith("manifest"):
                runs.append((["fit", work, "--out", tmp_path / "p.nc"], "fit"))
            for argv, cmd in runs:
                kind, detail = _classify(argv, capsys, (str(work),))
                if kind == "accepted" or (kind == "clean_error" and "none.nc" in detail):
                    kind = "silent_loss"  # the damaged folder was read as if whole
                outcomes[kind] += 1
                if kind in BAD_OUTCOMES:
                    problems.append(f"{name}/{table} ({cmd}): {kind}: {detail}")
            if tree_hash(work) != before:
                problems.append(f"{name}/{table}: input changed")
    LAYOUT_STATS.update(outcomes)
    print(f"\nfuzz partitioned layout: {dict(outcomes)}")
    assert outcomes["clean_error"] > 0
    assert not problems, "\n".join(problems[:20])


def test_fuzz_concurrent_ingest(tiny_fleet_seed5, tmp_path):
    """Two ``ingest`` processes into one --out at once: one writes, the other is refused (or
    they ran one after the other); either way the folder reads whole and consistent."""
    import os
    import subprocess
    import sys

    from bayes_latency.data.tables import MANIFEST, read_table, table_names

    exp = copy_exp(tiny_fleet_seed5, tmp_path / "in")
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "bayes_latency.cli.main", "ingest", str(exp), "--out", str(out)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env) for _ in range(2)]
    res = [(p.wait(timeout=600), *p.communicate()) for p in procs]
    codes = sorted(r[0] for r in res)
    assert codes in ([0, 0], [0, 2]), res
    for rc, _, err in res:
        assert "Traceback" not in err, err
        if rc == 2:
            assert "another run" in err and str(out) in err, err
    assert json.loads((out / MANIFEST).read_text())["experiments"] == [exp.name]
    assert not (out / ".bayes_latency.lock").exists()
    for t in table_names(out):  # partitions and manifest agree (read_table refuses otherwise)
        assert set(read_table(out, t)["experiment_id"].astype(str)) == {exp.name}


def _lifecycle_doc(rng: np.random.Generator, n: int = 40) -> dict:
    """An inference-perf ``summary_lifecycle_metrics.json`` of ``n`` requests."""
    def dist(x: np.ndarray) -> dict:
        q = {"min": 0, "p10": 10, "p25": 25, "median": 50, "p75": 75, "p90": 90, "p99": 99,
             "max": 100}
        return {"mean": float(x.mean()), **{k: float(np.percentile(x, v)) for k, v in q.items()}}

    ttft = rng.uniform(0.02, 0.1, n)
    out_len = rng.integers(50, 200, n)
    tpot = rng.uniform(0.008, 0.012, n)
    e2e = ttft + tpot * (out_len - 1)
    return {"load_summary": {"count": n, "schedule_delay": dist(rng.uniform(0, 1e-3, n)),
                             "requested_rate": 4.0, "achieved_rate": 3.9},
            "successes": {"count": n, "latency": {
                "request_latency": dist(e2e), "time_to_first_token": dist(ttft),
                "time_per_output_token": dist(tpot), "inter_token_latency": dist(tpot),
                "normalized_time_per_output_token": dist(e2e / out_len)},
                "prompt_len": dist(rng.integers(100, 400, n).astype(float)),
                "output_len": dist(out_len.astype(float)),
                "throughput": {"input_tokens_per_sec": 900.0, "output_tokens_per_sec": 500.0,
                               "requests_per_sec": 3.9}},
            "failures": {"count": 0, "request_latency": None, "prompt_len": None}}


def _client_cases() -> list[tuple[str, str, Callable[[dict], object], str]]:
    """(name, format, fn(doc) -> doc or raw text, expect): ``expect`` "error" (must stop
    with an error naming the file) or "signal" (an error, or a drop / note in the report)."""
    def leaf(path: tuple, value: object) -> Callable[[dict], dict]:
        def fn(doc: dict) -> dict:
            d = doc
            for k in path[:-1]:
                d = d[k]
            d[path[-1]] = value
            return doc
        return fn

    def each(key: str, value: object) -> Callable[[dict], dict]:
        def fn(doc: dict) -> dict:
            doc[key] = [value] * len(doc[key])
            return doc
        return fn

    def scale(keys: tuple[str, ...], f: float) -> Callable[[dict], dict]:
        def fn(doc: dict) -> dict:
            for k in list(doc):
                if k in keys or (k.endswith("_ms") and not k.startswith("p")):
                    doc[k] = [v * f for v in doc[k]] if isinstance(doc[k], list) else doc[k] * f
            return doc
        return fn

    lat = ("successes", "latency")
    return [
        ("vllm_ttfts_all_negative", "vllm", each("ttfts", -1), "error"),
        ("vllm_latencies_all_nan", "vllm", each("latencies", float("nan")), "error"),
        ("vllm_output_lens_all_zero", "vllm", each("output_lens", 0), "error"),
        ("vllm_no_e2e_mean", "vllm", lambda d: {k: v for k, v in d.items()
                                               if "e2el" not in k and k != "latencies"},
         "signal"),
        ("vllm_ms_as_s", "vllm", scale(("ttfts", "latencies"), 1000.0), "signal"),
        ("vllm_rate_string", "vllm", leaf(("request_rate",), "fast"), "error"),
        ("vllm_completed_negative", "vllm", leaf(("completed",), -3), "error"),
        ("vllm_bom", "vllm", lambda d: "\ufeff" + json.dumps(d), "signal"),
        ("vllm_latin1", "vllm", lambda d: json.dumps(d).encode("utf-8") + b" \xe9", "error"),
        ("vllm_garbage", "vllm", lambda d: "{oops", "error"),
        ("vllm_deep", "vllm", lambda d: "[" * 5000 + "]" * 5000, "error"),
        ("lifecycle_ttft_nan", "lifecycle", leaf(lat + ("time_to_first_token", "mean"),
                                                 float("nan")), "signal"),
        ("lifecycle_e2e_missing", "lifecycle",
         lambda d: (d["successes"]["latency"].pop("request_latency"), d)[1], "signal"),
        ("lifecycle_x1000", "lifecycle", lambda d: json.loads(json.dumps(d).replace(
            '"mean": 0.', '"mean": 1000.')), "signal"),
        ("lifecycle_negative_count", "lifecycle", leaf(("successes", "count"), -4), "signal"),
        ("lifecycle_no_rate", "lifecycle",
         lambda d: (d["load_summary"].pop("requested_rate"), d["load_summary"].pop(
             "achieved_rate"), d)[2], "error"),
        ("lifecycle_string_leaf", "lifecycle", leaf(lat + ("request_latency", "p90"), "slow"),
         "signal"),
        ("lifecycle_garbage", "lifecycle", lambda d: "{oops", "error"),
        ("lifecycle_latin1", "lifecycle",
         lambda d: json.dumps(d).encode("utf-8") + b"\n\xe9", "error"),
        ("tracev2_all_ttft_negative", "tracev2", "ttft_negative", "signal"),
        ("tracev2_no_rows", "tracev2", "no_rows", "error"),
        ("tracev2_header_bomb", "tracev2", "header_bomb", "error"),
        ("tracev2_header_dup", "tracev2", "header_dup", "error"),
    ]


def _write_client(work: Path, fmt: str, fn: object, rng: np.random.Generator) -> Path:
    from bayes_latency.synth.client_result import synthetic_vllm_bench

    work.mkdir(parents=True)
    if fmt == "tracev2":
        data = ROOT / "tests" / "data"
        hdr = (data / "blis_observe.yaml").read_text(encoding="utf-8")
        rows = (data / "blis_observe.csv").read_text(encoding="utf-8").splitlines()
        if fn == "no_rows":
            rows = rows[:1]
        elif fn == "header_bomb":
            hdr += "".join(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}" if i else '"x"'] * 9)
                           + "]\n" for i in range(10))
        elif fn == "header_dup":
            hdr += "time_unit: microseconds\ntime_unit: seconds\n"
        elif fn == "ttft_negative":
            head = rows[0].split(",")
            cols = [i for i, c in enumerate(head) if "first_chunk" in c or "ttft" in c]
            for r in range(1, len(rows)):
                cells = rows[r].split(",")
                for i in cols:
                    cells[i] = "-5"
                rows[r] = ",".join(cells)
        (work / "obs.yaml").write_text(hdr, encoding="utf-8")
        (work / "obs.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
        return work / "obs.yaml"
    if fmt == "vllm":
        beta = np.array([0.5, 1.0, 0.5, 1.4, 1.5, 15.0, 30.0, 4.0, 120.0, 0.0, 0.0])
        alpha = {"alpha_arrival": 15000.0, "alpha_post_decode": 800.0, "alpha_per_token": 40.0}
        doc = synthetic_vllm_bench("llama-2-7b", "H100", 1, beta, alpha, num_prompts=16,
                                   seed=int(rng.integers(1 << 30)))
        p = work / "bench.json"
    else:
        doc = _lifecycle_doc(rng)
        (work / "results").mkdir()
        p = work / "results" / "summary_lifecycle_metrics.json"
    new = fn(doc)  # type: ignore[operator]
    if isinstance(new, bytes):
        p.write_bytes(new)
    elif isinstance(new, str):
        p.write_text(new, encoding="utf-8")
    else:
        p.write_text(json.dumps(new), encoding="utf-8")
    return p


def test_fuzz_calibrate_client_results(tmp_path, capsys, monkeypatch):
    """``calibrate`` on damaged vllm bench JSON, inference-perf lifecycle and TraceV2 results:
    each stops with an error naming the file, or replays stages whose measured means are finite
    and positive with the damage counted or noted (the calibration loop is replaced by a
    sentinel that checks the stages)."""
    from mutate import BAD_OUTCOMES

    from bayes_latency.calibrate import loop

    seen: dict[str, list] = {}

    def sentinel(base, stages, *a, **k):
        seen["stages"] = list(stages)
        raise _Sampled()

    monkeypatch.setattr(loop, "calibrate", sentinel)
    rng = np.random.default_rng(SEED)
    outcomes: Counter = Counter()
    problems: list[str] = []
    for name, fmt, fn, expect in _client_cases():
        work = tmp_path / name
        path = _write_client(work, fmt, fn, rng)
        before = tree_hash(work)
        seen.clear()
        argv = ["calibrate", path, "--model", "llama-2-7b", "--gpu", "H100", "--tp", "1",
                "--out", tmp_path / f"{name}.nc"]
        kind, detail = _classify(argv, capsys, (path.name, str(work)), timeout=120)
        if kind == "accepted":
            out = detail
            stages = seen.get("stages", [])
            bad = [s for s in stages for k in ("ttft_mean_us", "e2e_mean_us")
                   if not (np.isfinite(s.observed.get(k, np.nan)) and s.observed[k] > 0)]
            from bayes_latency.data.client.read import read_client_results

            _, rep = read_client_results(path if fmt != "lifecycle" else work)
            signal = bool(rep.n_dropped) or any(
                w in " ".join(rep.notes) for w in ("implausible", "malformed", "BOM"))
            if bad or not stages:
                kind, detail = "wrong_accepted", f"stages with missing means: {out}"
            elif expect == "error" or (expect == "signal" and not signal
                                       and name != "vllm_bom"):
                kind, detail = "wrong_accepted", f"accepted without a count or note ({out})"
            elif rep.n_dropped:
                kind = "counted_drop"
        outcomes[kind] += 1
        if kind in BAD_OUTCOMES:
            problems.append(f"{name}: {kind}: {detail}")
        if tree_hash(work) != before:
            problems.append(f"{name}: input changed")
    LAYOUT_STATS.update(outcomes)
    print(f"\nfuzz calibrate: {dict(outcomes)}")
    assert not problems, "\n".join(problems[:20])
