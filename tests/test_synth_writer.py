"""Synthetic experiment folders are in the real formats (spec: ../shared/specs/vllm-trace-format.md)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from bayes_latency.cli.main import main as cli_main
from bayes_latency.physics.basis import ALPHA_TERMS, DEFAULT_TERMS
from bayes_latency.physics.serving import ServingConfig
from bayes_latency.synth.fleet import fleet_specs, simulate_fleet
from bayes_latency.synth.writer import EPOCH_OFFSET_NS

SERVING_KEYS = {"experiment_id", "model", "gpu", "tp", "workload", "max_num_batched_tokens",
                "max_num_seqs", "max_model_len", "block_size", "prefix_caching", "chunked_prefill",
                "step_sample_rate"}
JOURNEY_ATTRS = {
    "event.type": "stringValue", "ts.monotonic": "doubleValue", "ts.monotonic_ns": "intValue",
    "scheduler.step": "intValue", "phase": "stringValue", "prefill.done_tokens": "intValue",
    "prefill.total_tokens": "intValue", "decode.done_tokens": "intValue",
    "decode.max_tokens": "intValue", "num_preemptions": "intValue",
}
SUMMARY_ATTRS = {k: "intValue" for k in (
    "step.id", "step.ts_start_ns", "step.ts_end_ns", "step.duration_us", "queue.running_depth",
    "queue.waiting_depth", "batch.num_prefill_reqs", "batch.num_decode_reqs",
    "batch.scheduled_tokens", "batch.prefill_tokens", "batch.decode_tokens", "batch.num_finished",
    "batch.num_preempted", "kv.blocks_total_gpu", "kv.blocks_free_gpu")}
SUMMARY_ATTRS["kv.usage_gpu_ratio"] = "doubleValue"
SNAPSHOT_KEYS = {"step.id", "request.id", "request.phase", "request.num_prompt_tokens",
                 "request.num_computed_tokens", "request.num_output_tokens",
                 "request.num_preemptions", "request.scheduled_tokens_this_step",
                 "kv.blocks_allocated_gpu", "kv.blocks_cached_gpu"}
DIST_KEYS = ["mean", "min", "p0.1", "p1", "p5", "p10", "p25", "median", "p75", "p90", "p95",
             "p99", "p99.9", "max"]
HEX32 = re.compile(r"^[0-9a-f]{32}$")
HEX16 = re.compile(r"^[0-9a-f]{16}$")


def _attrs(obj: dict) -> dict[str, tuple[str, object]]:
    out = {}
    for a in obj["attributes"]:
        (t, v), = a["value"].items()
        out[a["key"]] = (t, v)
    return out


def _val(attrs: dict, key: str):
    t, v = attrs[key]
    return int(v) if t == "intValue" else v


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    simulate_fleet("tiny", out, seed=0, progress=False)
    return out


@pytest.fixture(scope="module")
def parsed(fleet) -> dict[str, dict]:
    """Per experiment: every span by kind, plus the raw lines (all json.loads-ed)."""
    res = {}
    for exp in sorted(p for p in fleet.iterdir() if p.is_dir()):
        spans = {"llm_request": [], "llm_core": [], "step": []}
        scopes = []
        ends = []
        with open(exp / "traces.jsonl") as f:
            for line in f:
                d = json.loads(line)                           # every line is valid JSON
                line_ends = []
                for rs in d["resourceSpans"]:
                    assert rs["resource"]["attributes"]
                    for ss in rs["scopeSpans"]:
                        scope = ss["scope"]["name"]
                        for sp in ss["spans"]:
                            scopes.append((scope, sp["name"]))
                            kind = sp["name"] if sp["name"] in spans else "step"
                            spans[kind].append(sp)
                            line_ends.append(int(sp["endTimeUnixNano"]))
                ends.append((min(line_ends), max(line_ends)))
        res[exp.name] = {"spans": spans, "scopes": scopes, "ends": ends, "dir": exp}
    return res


def test_fleet_layout(fleet):
    dirs = sorted(p.name for p in fleet.iterdir() if p.is_dir())
    assert dirs == sorted(s.id for s in fleet_specs("tiny"))
    doc = yaml.safe_load((fleet / "truth.yaml").read_text())
    assert doc["totals"]["experiments"] == 3
    assert set(doc["population"]["beta"]) == set(DEFAULT_TERMS)
    assert set(doc["population"]["alpha"]) == set(ALPHA_TERMS)
    for exp in dirs:
        d = fleet / exp
        for fn in ("serving.yaml", "traces.jsonl", "profile.yaml", "truth.yaml",
                   "engine_batches.parquet", "engine_chunks.parquet",
                   "results/summary_lifecycle_metrics.json"):
            assert (d / fn).is_file(), fn
        sv = yaml.safe_load((d / "serving.yaml").read_text())
        assert SERVING_KEYS <= set(sv)
        assert sv["experiment_id"] == exp
        cfg = ServingConfig.from_dict(sv)      # step_sample_rate is not a knob (not strict)
        assert cfg.tp == sv["tp"]
        truth = yaml.safe_load((d / "truth.yaml").read_text())
        assert list(truth["beta"]) == list(DEFAULT_TERMS)
        assert truth["beta"]["prefill_kv"] == 0.0 and truth["beta"]["decode_compute"] == 0.0
        assert truth["config_id"] == f"{sv['model']}|{sv['gpu']}|tp{sv['tp']}"
        assert doc["configurations"][truth["config_id"]]["beta"] == truth["beta"]
        prof = yaml.safe_load((d / "profile.yaml").read_text())
        assert prof["data"]["type"] == "shared_prefix"
        assert prof["load"]["stages"]


def test_span_structure(parsed):
    for name, p in parsed.items():
        sp = p["spans"]
        allowed = {("vllm.api", "llm_request"), ("vllm.scheduler", "llm_core")}
        for scope, nm in p["scopes"]:
            assert (scope, nm) in allowed or (scope == "vllm.scheduler.step"
                                              and re.fullmatch(r"scheduler_steps_\d+", nm)), (scope, nm)
        for s in sp["llm_request"] + sp["llm_core"] + sp["step"]:
            assert HEX32.match(s["traceId"]) and HEX16.match(s["spanId"])
            assert isinstance(s["startTimeUnixNano"], str) and isinstance(s["endTimeUnixNano"], str)
            assert int(s["startTimeUnixNano"]) <= int(s["endTimeUnixNano"])
            for a in s["attributes"]:
                (t, v), = a["value"].items()
                if t == "intValue":
                    assert isinstance(v, str) and re.fullmatch(r"-?\d+", v)
                elif t == "doubleValue":
                    assert isinstance(v, float | int)
                else:
                    assert t in ("stringValue", "boolValue")
            for e in s["events"]:
                assert isinstance(e["timeUnixNano"], str)
        # lines in export order: spans are written when they end
        ends = p["ends"]
        assert all(ends[i][1] <= ends[i + 1][0] for i in range(len(ends) - 1)), name
        # API and core spans pair up by parentSpanId and engine id
        api = {s["spanId"]: s for s in sp["llm_request"]}
        assert len(api) == len(sp["llm_core"]) > 0
        for c in sp["llm_core"]:
            a = api[c["parentSpanId"]]
            assert a["traceId"] == c["traceId"]
            aid = _attrs(a)["gen_ai.request.id"][1]
            cid = _attrs(c)["gen_ai.request.id"][1]
            assert re.fullmatch(r"cmpl-[0-9a-f]{16}", aid)
            assert re.fullmatch(re.escape(aid) + r"-0-[0-9a-f]{8}", cid)
            assert a["kind"] == 2 and c["kind"] == 1


def test_journey_events(parsed):
    for p in parsed.values():
        truth = yaml.safe_load((p["dir"] / "truth.yaml").read_text())
        api = {s["spanId"]: s for s in p["spans"]["llm_request"]}
        d_in, d_out = [], []
        for c in p["spans"]["llm_core"]:
            names = [e["name"] for e in c["events"]]
            assert names[0] == "journey.QUEUED" and names[1] == "journey.SCHEDULED"
            assert names[-1] == "journey.FINISHED" and names.count("journey.FIRST_TOKEN") == 1
            assert names.count("journey.PREEMPTED") == names.count("journey.SCHEDULED") - 1
            prev_ts = prev_step = -1
            for e in c["events"]:
                at = _attrs(e)
                extra = set(at) - set(JOURNEY_ATTRS)
                for k, t in JOURNEY_ATTRS.items():
                    assert at[k][0] == t, (k, at[k])
                et = _val(at, "event.type")
                assert e["name"] == f"journey.{et}"
                if et == "SCHEDULED":
                    assert extra == {"schedule.kind"}
                elif et == "FINISHED":
                    assert extra == {"finish.status"} and _val(at, "finish.status") == "length"
                    assert _val(at, "decode.done_tokens") == _val(at, "decode.max_tokens")
                else:
                    assert not extra
                ns = _val(at, "ts.monotonic_ns")
                assert int(e["timeUnixNano"]) == ns + EPOCH_OFFSET_NS
                assert abs(_val(at, "ts.monotonic") - ns / 1e9) < 1e-6
                assert ns > prev_ts and _val(at, "scheduler.step") >= prev_step
                prev_ts, prev_step = ns, _val(at, "scheduler.step")
            kinds = [_val(_attrs(e), "schedule.kind") for e in c["events"] if e["name"] == "journey.SCHEDULED"]
            assert kinds[0] == "FIRST" and all(k == "RESUME" for k in kinds[1:])
            a = api[c["parentSpanId"]]
            arrived, departed = (_val(_attrs(e), "event.ts.monotonic") for e in a["events"])
            assert [e["name"] for e in a["events"]] == ["api.ARRIVED", "api.DEPARTED"]
            q = _val(_attrs(c["events"][0]), "ts.monotonic")
            fin = _attrs(c["events"][-1])
            d_in.append((q - arrived) * 1e6)
            d_out.append((departed - _val(fin, "ts.monotonic")) * 1e6
                         - truth["alpha"]["alpha_per_token"] * _val(fin, "decode.max_tokens"))
        assert np.median(d_in) == pytest.approx(truth["alpha"]["alpha_arrival"], rel=0.05)
        assert np.median(d_out) == pytest.approx(truth["alpha"]["alpha_post_decode"], rel=0.5)


def test_step_spans_and_summaries(parsed):
    for p in parsed.values():
        eb = pd.read_parquet(p["dir"] / "engine_batches.parquet")
        truth = yaml.safe_load((p["dir"] / "truth.yaml").read_text())
        rows, snaps = [], 0
        prev_end = 0
        for k, s in enumerate(sorted(p["spans"]["step"], key=lambda s: int(s["startTimeUnixNano"])), 1):
            at = _attrs(s)
            assert s["name"] == f"scheduler_steps_{k}" and _val(at, "scheduler.span_sequence") == k
            assert _val(at, "scheduler.closure_interval") == 100
            start, end = _val(at, "scheduler.step_range_start"), _val(at, "scheduler.step_range_end")
            assert start == prev_end + 1 and (end % 100 == 0 or end == len(eb))
            prev_end = end
            for e in s["events"]:
                ea = _attrs(e)
                if e["name"] == "step.BATCH_SUMMARY":
                    assert {k2: v[0] for k2, v in ea.items()} == SUMMARY_ATTRS
                    sid = _val(ea, "step.id")
                    assert start <= sid <= end
                    rows.append({k2: _val(ea, k2) for k2 in ea})
                else:
                    assert e["name"] == "step.REQUEST_SNAPSHOT"
                    assert SNAPSHOT_KEYS <= set(ea)
                    snaps += 1
        assert prev_end == len(eb)
        st = pd.DataFrame(rows).set_index("step.id").sort_index()
        sampled = eb.loc[eb["sampled"], "step_id"].to_numpy()
        assert (st.index.to_numpy() == sampled).all()
        assert 0.06 < len(st) / len(eb) < 0.14
        e = eb.set_index("step_id").loc[st.index]
        assert (st["step.ts_start_ns"] == e["ts_start_ns"]).all()
        assert (st["step.duration_us"] == (st["step.ts_end_ns"] - st["step.ts_start_ns"]) // 1000).all()
        assert (st["batch.scheduled_tokens"] == e["prefill_tokens"] + e["decode_tokens"]).all()
        assert (st["batch.scheduled_tokens"]
                == st["batch.prefill_tokens"] + st["batch.decode_tokens"]).all()
        assert (st["kv.blocks_total_gpu"] == truth["engine"]["kv_capacity_blocks"]).all()
        assert (st["step.duration_us"] < e["iteration_us"]).all()
        # iteration time = gap between consecutive sampled step starts
        ids = st.index.to_numpy()
        pair = np.flatnonzero(np.diff(ids) == 1)
        gap = (st["step.ts_start_ns"].to_numpy()[pair + 1] - st["step.ts_start_ns"].to_numpy()[pair]) / 1e3
        np.testing.assert_allclose(gap, e["iteration_us"].to_numpy()[pair], atol=1e-3)


def test_preemption_visible_in_traces(parsed):
    p = parsed["llama-2-7b-a100-tp1-general-kvstress"]
    n_pre = sum(e["name"] == "journey.PREEMPTED" for c in p["spans"]["llm_core"] for e in c["events"])
    assert n_pre > 0
    truth = yaml.safe_load((p["dir"] / "truth.yaml").read_text())
    assert truth["engine"]["preemptions"] == n_pre


def test_lifecycle_metrics(fleet):
    for d in (p for p in fleet.iterdir() if p.is_dir()):
        prof = yaml.safe_load((d / "profile.yaml").read_text())
        summ = json.loads((d / "results" / "summary_lifecycle_metrics.json").read_text())
        n_stages = len(prof["load"]["stages"])
        stages = [json.loads((d / "results" / f"stage_{k}_lifecycle_metrics.json").read_text())
                  for k in range(n_stages)]
        assert sum(s["successes"]["count"] for s in stages) == summ["successes"]["count"]
        for k, s in enumerate([summ, *stages]):
            assert set(s) == {"load_summary", "successes", "failures"}
            lat = s["successes"]["latency"]
            assert set(lat) == {"request_latency", "normalized_time_per_output_token",
                                "time_per_output_token", "time_to_first_token", "inter_token_latency"}
            for dist in lat.values():
                assert list(dist) == DIST_KEYS
                assert dist["min"] <= dist["median"] <= dist["max"]
            assert lat["time_to_first_token"]["max"] <= lat["request_latency"]["max"]
            assert lat["time_to_first_token"]["mean"] < lat["request_latency"]["mean"]
            assert s["failures"] == {"count": 0, "request_latency": None, "prompt_len": None}
            assert set(s["successes"]["throughput"]) == {
                "input_tokens_per_sec", "output_tokens_per_sec", "total_tokens_per_sec",
                "requests_per_sec"}
            if k > 0:
                ls = s["load_summary"]
                assert ls["requested_rate"] == prof["load"]["stages"][k - 1]["rate"]
                assert {"send_duration", "achieved_rate"} <= set(ls)


def _hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_seed_same_bytes(fleet, tmp_path):
    out = tmp_path / "again"
    rc = cli_main(["simulate", "--fleet", "tiny", "--out", str(out), "--seed", "0", "--quiet"])
    assert rc == 0
    assert _hashes(out) == _hashes(fleet)


def test_other_seed_other_truth(tmp_path):
    specs = fleet_specs("tiny")[:1]
    simulate_fleet("tiny", tmp_path / "a", seed=1, progress=False, specs=specs)
    simulate_fleet("tiny", tmp_path / "b", seed=2, progress=False, specs=specs)
    ta = yaml.safe_load((tmp_path / "a" / "truth.yaml").read_text())
    tb = yaml.safe_load((tmp_path / "b" / "truth.yaml").read_text())
    assert ta["configurations"] != tb["configurations"]
