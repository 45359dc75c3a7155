"""Fuzz the commands: mutated traces, configs, lifecycle files, priors, tables and posteriors.

From one small synthetic base (the smallest experiment of ``simulate --fleet tiny --seed 5`` and a
Laplace fit of the tiny fleet, ``conftest.py``) a seeded list of mutation functions makes damaged
inputs; each is run through ``bayes_latency.cli.main.main`` in-process. Every run must end in

- exit 0 with books that add up (``read = kept + dropped`` per record type), every numeric column
  of every written Parquet table finite and within its domain, and (for inputs known to be
  invalid) the damage counted in ``ingest_report.json``; or
- exit 2 with one line naming the file (or the option) at fault; or
- exit 1 from ``check`` (a failed gate or a finding);

never an uncaught exception, and no input file may change (hashed before and after). ``fit`` is
fuzzed on its validation only: sampling is replaced by a sentinel, so a damaged table that would
reach the sampler counts as a wrong result accepted.

The counts are printed (``pytest -s``): runs, clean errors, counted drops, tracebacks, silent
losses, wrong results accepted.
"""

from __future__ import annotations

import json
import random
import shutil
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from mutate import Sampled as _Sampled
from mutate import (
    attr,
    copy_exp,
    load_docs,
    save_docs,
    scope_list,
    set_attr,
    spans,
    step_summaries,
    tree_hash,
)
from mutate import one_line_error as _one_line

from bayes_latency.cli.main import main
from bayes_latency.data.experiment import load_tables as _load_tables
from bayes_latency.data.tables import read_table as _read_table

SEED = 16
ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PRIORS = ROOT / "priors" / "default.yaml"
#: numeric columns allowed to be negative (inference-perf's schedule delay is send - planned)
SIGNED = {"schedule_delay_mean_s"}
#: ``kept`` counters that flag records (beside the table counters)
FLAGS = ("incomplete_request", "aborted_request", "ts_backwards", "damaged_request",
         "unknown_finish_status", "lone_surrogate_repaired", "inconsistent_request:max_tokens_0",
         "core_without_api", "api_only_span")

STATS: Counter = Counter()

WEIRD = [{"intValue": "-1"}, {"intValue": str(2**70)}, {"doubleValue": float("nan")},
         {"doubleValue": 1e300}, {"doubleValue": -1e300}, {"stringValue": "\ud800x"},
         {"stringValue": ""}, {"boolValue": True}, {}, {"arrayValue": {"values": []}},
         {"intValue": "abc"}, {"doubleValue": -0.5}, {"intValue": "-9223372036854775808"},
         {"doubleValue": float("inf")}, {"stringValue": "1e400"}, "notadict", None]


# ---------------------------------------------------------------------------------------------
# Trace mutations: (name, function(exp, rng), expect) with expect "signal" (an error or a
# counted drop / flag must appear), "same" (tables identical to the base) or "any"
# ---------------------------------------------------------------------------------------------
def _docs_op(fn: Callable) -> Callable:
    def run(exp: Path, rng: random.Random) -> None:
        docs = load_docs(exp)
        extra = fn(docs, rng)
        save_docs(exp, docs, extra)
    return run


def _rand_event(docs: list, rng: random.Random, scope: str, prefix: str = "") -> dict:
    evs = [e for sp in spans(docs, scope) for e in sp["events"] if e["name"].startswith(prefix)]
    return rng.choice(evs)


def _weird_attr(scope: str, prefix: str = "") -> Callable:
    def fn(docs: list, rng: random.Random) -> None:
        ev = _rand_event(docs, rng, scope, prefix)
        kv = rng.choice(ev["attributes"])
        kv["value"] = rng.choice(WEIRD)
    return fn


def _negate(scope: str, prefix: str, key: str) -> Callable:
    def fn(docs: list, rng: random.Random) -> None:
        ev = _rand_event(docs, rng, scope, prefix)
        set_attr(ev["attributes"], key, {"intValue": str(-rng.randint(1, 10**6))})
    return fn


def _set_step(key: str, value: dict) -> Callable:
    def fn(docs: list, rng: random.Random) -> None:
        set_attr(rng.choice(step_summaries(docs))["attributes"], key, value)
    return fn


def _dup_core(docs: list, rng: random.Random) -> None:
    core = scope_list(docs, "vllm.scheduler")
    sp = json.loads(json.dumps(rng.choice(list(spans(docs, "vllm.scheduler")))))
    sp["spanId"] = f"{rng.getrandbits(64):016x}"
    core.append(sp)


def _status(value: str) -> Callable:
    def fn(docs: list, rng: random.Random) -> None:
        sp = rng.choice(list(spans(docs, "vllm.scheduler")))
        ev = next(e for e in sp["events"] if e["name"] == "journey.FINISHED")
        set_attr(ev["attributes"], "finish.status", {"stringValue": value})
    return fn


def _drop_first_scheduled(docs: list, rng: random.Random) -> None:
    sp = rng.choice(list(spans(docs, "vllm.scheduler")))
    ev = next(e for e in sp["events"] if e["name"] == "journey.SCHEDULED")
    set_attr(ev["attributes"], "ts.monotonic_ns", {"stringValue": "soon"})
    set_attr(ev["attributes"], "ts.monotonic", {"stringValue": "soon"})


def _max_tokens_zero(docs: list, rng: random.Random) -> None:
    sp = rng.choice(list(spans(docs, "vllm.scheduler")))
    for ev in sp["events"]:
        set_attr(ev["attributes"], "decode.max_tokens", {"intValue": "0"})


def _surrogate_id(docs: list, rng: random.Random) -> None:
    sp = rng.choice(list(spans(docs, "vllm.scheduler")))
    v = attr(sp["attributes"], "gen_ai.request.id")
    v["stringValue"] = v["stringValue"].replace("cmpl-", "cmpl-\ud800-")


def _random_times(docs: list, rng: random.Random) -> None:
    """Journey and step timestamps replaced by random ones (the data become nonsense)."""
    for sp in spans(docs, "vllm.scheduler"):
        for e in sp["events"]:
            t = rng.randrange(10**12)
            set_attr(e["attributes"], "ts.monotonic_ns", {"intValue": str(t)})
            set_attr(e["attributes"], "ts.monotonic", {"doubleValue": t / 1e9})
    for e in step_summaries(docs):
        t = rng.randrange(10**12)
        set_attr(e["attributes"], "step.ts_start_ns", {"intValue": str(t)})
        set_attr(e["attributes"], "step.ts_end_ns", {"intValue": str(t + 1000)})


def _raw_text(fn: Callable) -> Callable:
    def run(exp: Path, rng: random.Random) -> None:
        lines = (exp / "traces.jsonl").read_text().splitlines()
        (exp / "traces.jsonl").write_text("\n".join(fn(lines, rng)) + "\n")
    return run


def _trace_cases() -> list[tuple[str, Callable, str]]:
    cases: list[tuple[str, Callable, str]] = []
    for i in range(5):
        cases.append((f"weird_step_attr_{i}", _docs_op(_weird_attr("vllm.scheduler.step",
                                                                   "step.BATCH")), "any"))
        cases.append((f"weird_journey_attr_{i}", _docs_op(_weird_attr("vllm.scheduler")), "any"))
    for i in range(2):
        cases.append((f"weird_api_attr_{i}", _docs_op(_weird_attr("vllm.api")), "any"))
    for key in ("step.ts_start_ns", "batch.decode_tokens", "queue.running_depth"):
        cases.append((f"negative_{key}", _docs_op(_negate("vllm.scheduler.step", "step.BATCH",
                                                          key)), "signal"))
    for key in ("ts.monotonic_ns", "decode.done_tokens", "prefill.total_tokens",
                "scheduler.step"):
        cases.append((f"negative_{key}", _docs_op(_negate("vllm.scheduler", "journey", key)),
                      "signal"))
    for v in (-3.0, 7.5, 1e300):
        cases.append((f"kv_ratio_{v}", _docs_op(_set_step("kv.usage_gpu_ratio",
                                                          {"doubleValue": v})), "signal"))
    cases += [
        ("ts_end_before_start", _docs_op(_set_step("step.ts_end_ns", {"intValue": "1"})),
         "signal"),
        ("duplicate_request_id", _docs_op(_dup_core), "signal"),
        ("finish_status_bogus", _docs_op(_status("bogus-status")), "signal"),
        ("finish_status_empty", _docs_op(_status("")), "signal"),
        ("first_scheduled_bad", _docs_op(_drop_first_scheduled), "signal"),
        ("max_tokens_zero", _docs_op(_max_tokens_zero), "signal"),
        ("lone_surrogate_id", _docs_op(_surrogate_id), "signal"),
        ("random_timestamps", _docs_op(_random_times), "any"),
        ("shuffle_lines", _raw_text(lambda ls, r: r.sample(ls, len(ls))), "same"),
        ("duplicate_line", _raw_text(lambda ls, r: ls + [r.choice(ls)]), "signal"),
        ("truncate_line", _raw_text(lambda ls, r: [ls[0][: len(ls[0]) // 2]] + ls[1:]),
         "signal"),
        ("garbage_line", _raw_text(lambda ls, r: ls + ["\x00\x01garbage{"]), "signal"),
        ("non_otlp_line", _raw_text(lambda ls, r: ls + ['{"hello": 1}', "[1, 2]", "3"]),
         "signal"),
        ("empty_trace", _raw_text(lambda ls, r: []), "signal"),
        ("all_garbage", _raw_text(lambda ls, r: ["nope"] * 3), "signal"),
        ("deep_nesting", _raw_text(lambda ls, r: ls + ["[" * 5000 + "]" * 5000]), "signal"),
        ("journey_step_1e9", _docs_op(_journey_step(10**9)), "signal"),
        ("journey_step_1e7", _docs_op(_journey_step(10**7)), "signal"),
        ("step_over_max_num_seqs", _docs_op(_set_step("batch.num_decode_reqs",
                                                      {"intValue": "100000"})), "signal"),
        ("step_over_max_tokens", _docs_op(_set_step("batch.prefill_tokens",
                                                    {"intValue": "1000000000"})), "signal"),
    ]
    return cases


def _journey_step(value: int) -> Callable:
    def fn(docs: list, rng: random.Random) -> None:
        ev = _rand_event(docs, rng, "vllm.scheduler", "journey")
        set_attr(ev["attributes"], "scheduler.step", {"intValue": str(value)})
    return fn


def _yaml_append(text: str, encoding: str = "utf-8") -> Callable:
    def run(exp: Path, rng: random.Random) -> None:
        y = exp / "serving.yaml"
        y.write_bytes(y.read_bytes() + text.encode(encoding))
    return run


_BOMB = "".join(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}" if i else '"lol"'] * 9) + "]\n"
                for i in range(10))


# -- serving config / config.json / lifecycle / kv-events mutations ----------------------------
def _yaml_edit(old: str, new: str) -> Callable:
    def run(exp: Path, rng: random.Random) -> None:
        y = exp / "serving.yaml"
        text = y.read_text()
        assert old in text
        y.write_text(text.replace(old, new))
    return run


def _write(name: str, content: str | bytes) -> Callable:
    def run(exp: Path, rng: random.Random) -> None:
        p = exp / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)
    return run


def _bad_config_json(cfg: dict) -> Callable:
    def run(exp: Path, rng: random.Random) -> None:
        (exp / "config.json").write_text(json.dumps(cfg))
        y = exp / "serving.yaml"
        y.write_text(y.read_text().replace("model: mixtral-8x7b", "model: config.json"))
    return run


_LLAMA = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
          "vocab_size": 32000, "intermediate_size": 11008}


def _lifecycle(fn: Callable) -> Callable:
    def run(exp: Path, rng: random.Random) -> None:
        files = sorted((exp / "results").glob("*lifecycle_metrics.json"))
        f = rng.choice(files)
        doc = json.loads(f.read_text())
        fn(doc, rng)
        f.write_text(json.dumps(doc))
    return run


def _lc_leaf(value: object) -> Callable:
    def fn(doc: dict, rng: random.Random) -> None:
        lat = doc["successes"]["latency"]
        metric = rng.choice(sorted(lat))
        stat = rng.choice(["mean", "median", "p90", "p99"])
        lat[metric][stat] = value
    return fn


def _config_cases() -> list[tuple[str, Callable, str]]:
    bad = [("tp: 2", "tp: 0"), ("tp: 2", "tp: x"), ("tp: 2", "tp: 3"),
           ("model: mixtral-8x7b", "model: no-such-model"), ("gpu: H100", "gpu: Z9000"),
           ("max_model_len: 4096", "max_model_len: 1"), ("max_num_seqs: 128", "max_num_seqs: -1"),
           ("block_size: 16", "block_size: 0"), ("gpu: H100", "gpu: [1, 2]"),
           ("model: mixtral-8x7b", "model:")]
    cases = [(f"serving_{n.split(':')[0]}_{v.split(':', 1)[1].strip() or 'empty'}",
              _yaml_edit(n, v), "signal") for n, v in bad]
    cases += [
        ("serving_surrogate_id", _yaml_edit("experiment_id: mixtral-8x7b-h100-tp2-codegen-pc",
                                            'experiment_id: "a\\ud800b"'), "any"),
        ("serving_garbage", _write("serving.yaml", "{{{: ["), "signal"),
        ("serving_list", _write("serving.yaml", "- 1\n- 2\n"), "signal"),
        ("serving_empty", _write("serving.yaml", ""), "signal"),
        ("config_json_7_heads", _bad_config_json(dict(_LLAMA, num_attention_heads=7)), "signal"),
        ("config_json_kv_5", _bad_config_json(dict(_LLAMA, num_key_value_heads=5)), "signal"),
        ("config_json_negative", _bad_config_json(dict(_LLAMA, num_hidden_layers=-2)), "signal"),
        ("config_json_garbage", _bad_config_json([1, 2]), "signal"),  # type: ignore[arg-type]
        ("config_json_1e9_layers", _bad_config_json(dict(_LLAMA, num_hidden_layers=10**9)),
         "signal"),
        ("config_json_1e9_experts", _bad_config_json(dict(_LLAMA, num_local_experts=10**9,
                                                          num_experts_per_tok=2)), "signal"),
        ("serving_latin1", _yaml_append("description: café\n", "latin-1"), "signal"),
        ("serving_alias_bomb", _yaml_append(_BOMB), "signal"),
        ("serving_duplicate_key", _yaml_append("tp: 1\n"), "signal"),
        ("serving_tp_true", _yaml_edit("tp: 2", "tp: true"), "signal"),
        ("lifecycle_string", _lifecycle(_lc_leaf("fast")), "signal"),
        ("lifecycle_negative", _lifecycle(_lc_leaf(-5)), "signal"),
        ("lifecycle_inf", _lifecycle(_lc_leaf(float("inf"))), "signal"),
        ("lifecycle_nan", _lifecycle(_lc_leaf(float("nan"))), "signal"),
        ("lifecycle_object", _lifecycle(_lc_leaf({"a": 1})), "signal"),
        ("lifecycle_no_successes", _lifecycle(lambda d, r: d.pop("successes")), "signal"),
        ("lifecycle_no_load_summary", _lifecycle(lambda d, r: d.pop("load_summary")), "signal"),
        ("lifecycle_neg_count", _lifecycle(lambda d, r: d["successes"].__setitem__("count", -3)),
         "signal"),
        ("lifecycle_metric_string",
         _lifecycle(lambda d, r: d["successes"]["latency"].__setitem__("request_latency",
                                                                       "fast")), "signal"),
        ("lifecycle_garbage", _write("results/summary_lifecycle_metrics.json", "{oops"),
         "signal"),
        ("lifecycle_empty", _write("results/stage_0_lifecycle_metrics.json", ""), "signal"),
        ("lifecycle_array", _write("results/stage_1_lifecycle_metrics.json", "[]"), "signal"),
        ("kv_events_empty", _write("kv_events.jsonl", ""), "signal"),
        ("kv_events_garbage", _write("kv_events.jsonl", "garbage\n{]\n"), "signal"),
        ("kv_events_binary", _write("kv_events.jsonl", b"\xff\xfe\x00\x01"), "signal"),
        ("kv_events_weird", _write("kv_events.jsonl",
                                   '[1.5, [["BlockStored", [1], null, [1, 2], -16]], 0, null]\n'
                                   '[-1, [["Bogus"]], "x", null]\n'
                                   '[NaN, [["CacheEviction", "GPU", -3, "lru", 7, []]], 0, 1]\n'),
         "signal"),
    ]
    return cases


# ---------------------------------------------------------------------------------------------
# Checks of one run
# ---------------------------------------------------------------------------------------------
def _table_domain(folder: Path) -> list[str]:
    """Numeric values of written tables outside their domain (non-finite, or negative)."""
    bad = []
    for name, df in (_load_tables(folder) if any(folder.iterdir()) else {}).items():
        for c in df.columns:
            s = df[c]
            if pd.api.types.is_bool_dtype(s) or not pd.api.types.is_numeric_dtype(s):
                continue
            v = s.to_numpy(dtype=float, na_value=np.nan)
            v = v[~np.isnan(v)]
            if np.isinf(v).any() or (c not in SIGNED and (v < 0).any()):
                bad.append(f"{name}:{c}")
    return bad


def _invoke(argv: list, capsys) -> tuple[int | None, str, str]:
    capsys.readouterr()
    try:
        rc = main([str(a) for a in argv])
    except _Sampled:
        rc = None
    except SystemExit as e:  # argparse rejecting an option: a clean usage error
        rc = int(e.code or 0)
    except BaseException:  # noqa: BLE001 - the point of the suite
        STATS["tracebacks"] += 1
        out, err = capsys.readouterr()
        return -1, out, traceback.format_exc()
    out, err = capsys.readouterr()
    return rc, out, err


def _all_finite(doc: object) -> bool:
    if isinstance(doc, dict):
        return all(_all_finite(v) for v in doc.values())
    if isinstance(doc, list):
        return all(_all_finite(v) for v in doc)
    if isinstance(doc, str):
        return doc.strip().lower() not in ("nan", "inf", "-inf", "infinity", "-infinity")
    return not isinstance(doc, float) or bool(np.isfinite(doc))


# ---------------------------------------------------------------------------------------------
# The suites
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def base_ingest(tiny_fleet_seed5, tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzzbase")
    exp = copy_exp(tiny_fleet_seed5, root)
    out = root / "out"
    assert main(["ingest", str(exp), "--out", str(out)]) == 0
    rep = json.loads((out / "ingest_report.json").read_text())["total"]
    tabs = _load_tables(out)
    return rep, tabs


def test_fuzz_ingest(tiny_fleet_seed5, base_ingest, tmp_path, capsys):
    base_rep, base_tabs = base_ingest
    rng = random.Random(SEED)
    problems: list[str] = []
    cases = _trace_cases() + _config_cases()
    for k, (name, mutate, expect) in enumerate(cases):
        work = tmp_path / f"c{k:03d}"
        exp = copy_exp(tiny_fleet_seed5, work)
        mutate(exp, rng)
        before = tree_hash(exp)
        out = work / "out"
        rc, _, err = _invoke(["ingest", exp, "--out", out], capsys)
        STATS["runs"] += 1
        if tree_hash(exp) != before:
            problems.append(f"{name}: input changed")
        if rc == 2:
            STATS["clean_errors"] += 1
            msg = _one_line(err, (exp.name, "traces.jsonl", "serving.yaml", "config.json"))
            if msg:
                problems.append(f"{name}: {msg}")
            continue
        if rc != 0:
            problems.append(f"{name}: exit {rc}: {err[-2000:]}")
            continue
        rep = json.loads((out / "ingest_report.json").read_text())["total"]
        from bayes_latency.data.report import IngestReport

        for kind, (r, kk) in IngestReport.BALANCES.items():
            if rep["read"].get(r, 0) != rep["kept"].get(kk, 0) + rep.get(
                    "dropped_by_record", {}).get(kind, 0):
                STATS["silent_losses"] += 1
                problems.append(f"{name}: {kind} books do not add up: {rep}")
        dom = _table_domain(out)
        if dom:
            STATS["wrong_accepted"] += 1
            problems.append(f"{name}: out-of-domain values in {dom}")
        n_drop = sum(rep["dropped"].values())
        STATS["counted_drops"] += n_drop
        STATS["runs_with_drops"] += bool(n_drop)
        flagged = {f: rep["kept"].get(f, 0) for f in FLAGS}
        signal = n_drop > 0 or flagged != {f: base_rep["kept"].get(f, 0) for f in FLAGS} \
            or len(rep["notes"]) != len(base_rep["notes"])
        if expect == "signal" and not signal:
            STATS["wrong_accepted"] += 1
            problems.append(f"{name}: damaged input accepted without a count or note")
        if expect == "same":
            for t, df in base_tabs.items():
                other = _read_table(out, t)
                if not df.equals(other):
                    problems.append(f"{name}: table {t} differs from the base")
        # lost rows must be accounted for: fewer requests / steps only with counted drops
        for t in ("requests", "steps"):
            n_t = len(_read_table(out, t))
            if n_t < len(base_tabs[t]) and not n_drop and expect != "same":
                if not any(rep["kept"].get(f, 0) for f in FLAGS):
                    STATS["silent_losses"] += 1
                    problems.append(f"{name}: {t} lost rows without a count")
    print(f"\nfuzz ingest: {dict(STATS)}")
    assert not problems, "\n".join(problems[:20])


def _obs_cases() -> list[tuple[str, Callable]]:
    def col(c: str, v: object) -> Callable:
        def fn(df: pd.DataFrame, rng: random.Random) -> pd.DataFrame:
            df = df.copy()
            if c not in df:
                return df
            if isinstance(v, str) and c != "kind":
                df[c] = df[c].astype(str)  # a text column where numbers belong
            df.loc[rng.randrange(len(df)), c] = v
            return df
        return fn

    cases = [(f"obs_{c}_{v}", col(c, v)) for c, v in [
        ("value_us", np.nan), ("value_us", -1.0), ("value_us", np.inf), ("value_us", "fast"),
        ("x_per_step", -3.0), ("x_weight_loading", np.inf), ("x_alpha_per_token", -100.0),
        ("tp", 0), ("x_decode_kv", np.nan)]]
    cases += [
        ("obs_no_value", lambda df, r: df.drop(columns="value_us")),
        ("obs_no_kind", lambda df, r: df.drop(columns="kind")),
        ("obs_no_features", lambda df, r: df[[c for c in df.columns
                                              if not c.startswith("x_")]]),
        ("obs_empty", lambda df, r: df.iloc[:0]),
        ("obs_strings", lambda df, r: df.astype(str)),
    ]
    return cases


def test_fuzz_fit_validation(tiny_posterior, tmp_path, capsys, monkeypatch):
    """fit on damaged tables, priors and arguments: exit 2 before sampling, inputs unchanged."""
    from bayes_latency.model import estimator

    def no_sampling(self, *a, **k):
        raise _Sampled()

    monkeypatch.setattr(estimator.LatencyModel, "fit", no_sampling)
    tables, post = tiny_posterior
    base = _read_table(tables, "observations")
    rng = random.Random(SEED + 1)
    problems: list[str] = []
    runs: list[tuple[str, list, Path, tuple[str, ...]]] = []
    for k, (name, fn) in enumerate(_obs_cases()):
        t = tmp_path / f"t{k:02d}"
        t.mkdir()
        fn(base, rng).to_parquet(t / "observations.parquet")
        runs.append((name, ["fit", t, "--out", tmp_path / f"p{k}.nc"], t,
                     ("observations.parquet",)))
    for k, content in enumerate([b"PAR1garbage", b"", b"\x00" * 100]):
        t = tmp_path / f"g{k}"
        t.mkdir()
        (t / "observations.parquet").write_bytes(content)
        runs.append((f"obs_bytes_{k}", ["fit", t, "--out", tmp_path / "g.nc"], t,
                     ("observations.parquet",)))
    good = tmp_path / "good"
    good.mkdir()
    base.to_parquet(good / "observations.parquet")
    pri = DEFAULT_PRIORS.read_text()
    for k, text in enumerate([pri.replace("sigma: 0.7", "sigma: -0.7", 1),
                              pri.replace("median: 2.0", "median: fast", 1),
                              pri.replace("schema_version: 1", "schema_version: 7"),
                              "{{{", "", "terms: 3\n",
                              pri.replace("dist: lognormal", "dist: cauchy", 1)]):
        f = tmp_path / f"priors{k}.yaml"
        f.write_text(text)
        runs.append((f"priors_{k}", ["fit", good, "--priors", f, "--out", tmp_path / "q.nc"],
                     f, (f.name,)))
    for k, extra in enumerate([["--draws", "0"], ["--draws", "-5"], ["--tune", "-1"],
                               ["--chains", "0"], ["--target-accept", "2"], ["--seed", "-1"],
                               ["--max-rhat", "0.5"], ["--terms", "bogus_term"]]):
        runs.append((f"args_{k}", ["fit", good, "--out", tmp_path / "r.nc", *extra], good,
                     (extra[0], "bogus_term")))
    a_file = tmp_path / "a_file"
    a_file.write_text("keep")
    for k, out in enumerate([good / "observations.parquet", good, a_file / "p.nc", tmp_path]):
        runs.append((f"out_{k}", ["fit", good, "--out", out], good, ("--out",)))
    for name, argv, inp, names in runs:
        before = tree_hash(inp, a_file)
        rc, _, err = _invoke(argv, capsys)
        STATS["runs"] += 1
        if tree_hash(inp, a_file) != before:
            problems.append(f"{name}: input changed")
        if rc == 2:
            STATS["clean_errors"] += 1
            msg = _one_line(err, names)
            if msg:
                problems.append(f"{name}: {msg}")
        elif rc is None:
            STATS["wrong_accepted"] += 1
            problems.append(f"{name}: damaged input reached the sampler")
        else:
            problems.append(f"{name}: exit {rc}: {err[-1500:]}")
    print(f"\nfuzz fit: {dict(STATS)}")
    assert not problems, "\n".join(problems[:20])


def _posterior_cases(post: Path, tmp: Path) -> list[tuple[str, Path]]:
    import xarray as xr

    out = []
    for k, content in enumerate([b"", b"garbage", post.read_bytes()[:2000]]):
        p = tmp / f"bytes{k}.nc"
        p.write_bytes(content)
        out.append((f"post_bytes_{k}", p))
    dt = xr.open_datatree(post, engine="h5netcdf").load()

    def variant(name: str, fn: Callable) -> None:
        d = dt.copy(deep=True)
        fn(d)
        p = tmp / f"{name}.nc"
        d.to_netcdf(p, engine="h5netcdf")
        out.append((name, p))

    def scale(v: str, f: float) -> Callable:
        def fn(d):
            ds = d["posterior"].to_dataset()
            ds[v] = ds[v] * f
            d["posterior"] = xr.DataTree(ds)
        return fn

    variant("post_no_version", lambda d: d.attrs.pop("model_version"))
    variant("post_old_version", lambda d: d.attrs.__setitem__("model_version", -1))
    variant("post_bad_terms", lambda d: d.attrs.__setitem__("terms", "{not json"))
    variant("post_other_priors", lambda d: d.attrs.__setitem__("priors_hash", "0" * 64))
    variant("post_beta_inf", scale("beta", np.inf))
    variant("post_beta_nan", scale("beta", np.nan))
    variant("post_beta_huge", scale("beta", 1e300))
    variant("post_beta_negative", scale("beta", -1.0))
    variant("post_alpha_zero", scale("alpha", 0.0))
    return out


def test_fuzz_check_export(tiny_posterior, tmp_path, capsys):
    """check / export on damaged posteriors, priors and arguments; never a traceback."""
    tables, post = tiny_posterior
    problems: list[str] = []
    runs: list[tuple[str, list, tuple[str, ...], tuple[int, ...]]] = []
    for name, p in _posterior_cases(post, tmp_path):
        out = ["--out", tmp_path / f"ck_{name}"] if name in ("post_beta_inf", "post_bytes_0") \
            else []  # the report and forest plot on two only (plots are slow)
        runs.append((f"check_{name}", ["check", p, *out], (p.name,), (0, 1, 2)))
        for fmt in ("json", "blis"):
            runs.append((f"export_{fmt}_{name}",
                         ["export", p, "--model", "llama-2-7b", "--gpu", "H100", "--format",
                          fmt, "--out", tmp_path / f"e_{name}.{fmt}"], (p.name,), (0, 2)))
    # the predictive checks on the two most damaged posteriors (slower: posterior predictive)
    for name in ("post_beta_huge",):
        p = tmp_path / f"{name}.nc"
        runs.append((f"check_tables_{name}", ["check", p, "--tables", tables, "--out",
                                              tmp_path / f"ckt_{name}"], (p.name,), (1, 2)))
    pri = DEFAULT_PRIORS.read_text()
    for k, text in enumerate(["{{{", pri.replace("median: 2.0", "median: 2.5", 1)]):
        f = tmp_path / f"pr{k}.yaml"
        f.write_text(text)
        runs.append((f"export_priors_{k}", ["export", post, "--model", "llama-2-7b", "--gpu",
                                            "H100", "--priors", f, "--out", tmp_path / "x.json"],
                     (f.name, "priors"), (2,)))
        runs.append((f"check_priors_{k}", ["check", post, "--priors", f], (f.name, "priors"),
                     (2,)))
    for k, extra in enumerate([["--tp", "0"], ["--tp", "-1"], ["--tp", "3"], ["--tp", "4096"],
                               ["--draws", "100000000"], ["--draws", "-1"],
                               ["--model", "no-such-model"], ["--gpu", "Z9000"],
                               ["--out", post], ["--out", tmp_path]]):
        for fmt in ("json", "blis"):
            argv = ["export", post, "--model", "llama-2-7b", "--gpu", "H100", "--format", fmt,
                    "--out", tmp_path / f"a{k}.{fmt}", *extra]
            runs.append((f"export_args_{k}_{fmt}", argv,
                         (extra[0], "model", "GPU", "gpu", "no-such-model", "Z9000"), (2,)))
    for name, argv, names, allowed in runs:
        before = tree_hash(post, tables)
        rc, out, err = _invoke(argv, capsys)
        STATS["runs"] += 1
        if tree_hash(post, tables) != before:
            problems.append(f"{name}: input changed")
        if rc == 2:
            STATS["clean_errors"] += 1
            msg = _one_line(err, names)
            if msg:
                problems.append(f"{name}: {msg}")
        if rc not in allowed:
            if rc == 0:
                STATS["wrong_accepted"] += 1
            problems.append(f"{name}: exit {rc} not in {allowed}: {err[-1500:]}")
        if rc == 0 and argv[0] == "export":
            text = Path(argv[argv.index("--out") + 1]).read_text()
            doc = yaml.safe_load(text)  # JSON is YAML too; .nan / .inf parse as floats
            if not _all_finite(doc):
                STATS["wrong_accepted"] += 1
                problems.append(f"{name}: export wrote non-finite numbers")
    print(f"\nfuzz check/export: {dict(STATS)}")
    assert not problems, "\n".join(p.splitlines()[0] + " ... " + p.splitlines()[-1]
                                    for p in problems[:30])
    shutil.rmtree(tmp_path, ignore_errors=True)
