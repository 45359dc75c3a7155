"""Mutations of the fuzz suite (``test_fuzz_cli.py``): damaged traces, configs and lifecycle files.

Each case is ``(name, function(exp, rng), expect)``: the function damages a copy of an
experiment folder in place; ``expect`` is ``"signal"`` (an error, or a counted drop or flag,
must appear), ``"same"`` (the tables equal the base's) or ``"any"``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

from mutate import attr, load_docs, save_docs, scope_list, set_attr, spans, step_summaries

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


def trace_cases() -> list[tuple[str, Callable, str]]:
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


def config_cases() -> list[tuple[str, Callable, str]]:
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
