"""Tests of the OTLP JSON Lines reader (bayes_latency.data.otlp.read)."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pandas as pd
import pytest

from bayes_latency.data.otlp.read import (
    API_SPAN_COLUMNS,
    JOURNEY_COLUMNS,
    REQUEST_COLUMNS,
    SNAPSHOT_COLUMNS,
    STEP_COLUMNS,
    read_otlp,
)
from bayes_latency.data.report import IngestReport
from bayes_latency.errors import TraceFormatError

EXAMPLE = "vllm-trace-format.example.jsonl"


# ------------------------------------------------------------------------------------------
# builders of OTLP JSON (kept tiny and local: the example file is the reference)
# ------------------------------------------------------------------------------------------
def _attr(key: str, value) -> dict:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    if isinstance(value, float):
        return {"key": key, "value": {"doubleValue": value}}
    return {"key": key, "value": {"stringValue": value}}


def _line(scope: str, *spans: dict) -> str:
    return json.dumps({"resourceSpans": [{"resource": {"attributes": []},
                                          "scopeSpans": [{"scope": {"name": scope},
                                                          "spans": list(spans)}]}]})


def _api_span(trace: str, span: str, api_id: str, arrival: float, departed: float | None,
              aborted: bool = False, prompt: int = 100, max_tokens: int = 4) -> dict:
    events = [{"timeUnixNano": "1", "name": "api.ARRIVED",
               "attributes": [_attr("event.ts.monotonic", arrival)]}]
    if departed is not None:
        events.append({"timeUnixNano": "2", "name": "api.DEPARTED",
                       "attributes": [_attr("event.ts.monotonic", departed)]})
    if aborted:
        events.append({"timeUnixNano": "3", "name": "api.ABORTED",
                       "attributes": [_attr("event.ts.monotonic", arrival + 1.0),
                                      _attr("reason", "client_disconnect")]})
    return {"traceId": trace, "spanId": span, "name": "llm_request", "kind": 2,
            "startTimeUnixNano": "1", "endTimeUnixNano": "2",
            "attributes": [_attr("gen_ai.request.id", api_id),
                           _attr("gen_ai.usage.prompt_tokens", prompt),
                           _attr("gen_ai.request.max_tokens", max_tokens)],
            "events": events,
            "status": {"code": 2, "message": "aborted"} if aborted else {}}


def _jev(etype: str, step: int, ts_ns: int, prompt: int = 100, max_tokens: int = 4,
         done: int = 0, dec: int = 0, npre: int = 0, **extra) -> dict:
    attrs = [_attr("event.type", etype), _attr("ts.monotonic", ts_ns / 1e9),
             _attr("ts.monotonic_ns", ts_ns), _attr("scheduler.step", step),
             _attr("phase", "PREFILL"), _attr("prefill.done_tokens", done),
             _attr("prefill.total_tokens", prompt), _attr("decode.done_tokens", dec),
             _attr("decode.max_tokens", max_tokens), _attr("num_preemptions", npre)]
    attrs += [_attr(k, v) for k, v in extra.items()]
    return {"timeUnixNano": "5", "name": f"journey.{etype}", "attributes": attrs}


def _core_span(trace: str, span: str, parent: str | None, engine_id: str, events: list) -> dict:
    sp = {"traceId": trace, "spanId": span, "name": "llm_core", "kind": 1,
          "startTimeUnixNano": "1", "endTimeUnixNano": "2",
          "attributes": [_attr("gen_ai.request.id", engine_id)], "events": events, "status": {}}
    if parent is not None:
        sp["parentSpanId"] = parent
    return sp


def _full_journey(t0: int = 10_000_000_000, q: int = 1, s: int = 2, f: int = 3,
                  e: int = 5) -> list[dict]:
    return [_jev("QUEUED", q, t0), _jev("SCHEDULED", s, t0 + 1000, **{"schedule.kind": "FIRST"}),
            _jev("FIRST_TOKEN", f, t0 + 2000, done=100, dec=1),
            _jev("FINISHED", e, t0 + 3000, done=100, dec=4, **{"finish.status": "length"})]


def _write(tmp_path: Path, lines: list[str], name: str = "traces.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


def _example_lines(specs_dir: Path) -> list[str]:
    return [ln for ln in (specs_dir / EXAMPLE).read_text().splitlines() if ln.strip()]


def _assert_tables_equal(a, b) -> None:
    for name in ("steps", "journey_events", "requests", "snapshots", "api_spans"):
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name), obj=name)


# ------------------------------------------------------------------------------------------
# the spec's example (section 9)
# ------------------------------------------------------------------------------------------
def test_example_matches_spec_story(specs_dir: Path) -> None:
    t = read_otlp(specs_dir / EXAMPLE, experiment_id="ex")
    assert list(t.steps.columns) == list(STEP_COLUMNS) + ["experiment_id"]
    assert list(t.journey_events.columns) == list(JOURNEY_COLUMNS)
    assert list(t.requests.columns) == list(REQUEST_COLUMNS)
    assert list(t.snapshots.columns) == list(SNAPSHOT_COLUMNS)
    assert list(t.api_spans.columns) == list(API_SPAN_COLUMNS)

    # journey: QUEUED 40, SCHEDULED 41, FIRST_TOKEN 42, FINISHED 44
    je = t.journey_events
    assert je["event"].tolist() == ["QUEUED", "SCHEDULED", "FIRST_TOKEN", "FINISHED"]
    assert je["step"].tolist() == [40, 41, 42, 44]
    assert je["ts_monotonic_ns"].tolist() == [20021381000000, 20021381650000, 20021452000000,
                                              20021484000000]
    assert je["schedule_kind"].tolist()[1] == "FIRST"
    assert je["finish_status"].tolist()[3] == "length"
    assert (je["request_id"] == "cmpl-9dcf4ea42cd9ace2-0-aa4f0692").all()

    # one complete request: prompt 2600, max_tokens 3, joined to its API span
    assert len(t.requests) == 1
    r = t.requests.iloc[0]
    assert r["experiment_id"] == "ex"
    assert r["request_id"] == "cmpl-9dcf4ea42cd9ace2-0-aa4f0692"
    assert r["api_request_id"] == "cmpl-9dcf4ea42cd9ace2"
    assert r["trace_id"] == "5b8aa5a2d2c872e8321cf37308d69df2"
    assert r["arrival_s"] == pytest.approx(20021.3782)
    assert r["departed_s"] == pytest.approx(20021.4851)
    assert (r["queued_step"], r["first_scheduled_step"], r["first_token_step"],
            r["finished_step"]) == (40, 41, 42, 44)
    assert r["queued_ns"] == 20021381000000 and r["finished_ns"] == 20021484000000
    assert r["n_scheduled"] == 1 and r["n_preemptions"] == 0
    assert (r["prompt_tokens"], r["output_tokens"], r["max_tokens"]) == (2600, 3, 3)
    assert r["status"] == "length" and not r["aborted"] and r["complete"]
    assert not r["ts_backwards"]

    # step summaries of sampled steps 41 and 42: chunks 2048 and 552
    s = t.steps
    assert s["step.id"].tolist() == [41, 42]
    assert s["batch.prefill_tokens"].tolist() == [2048, 552]
    assert s["batch.scheduled_tokens"].tolist() == [2048, 552]
    assert s["batch.decode_tokens"].tolist() == [0, 0]
    assert s["step.ts_start_ns"].tolist() == [20021381500000, 20021420000000]
    assert s["step.duration_us"].tolist() == [400, 350]
    assert s["kv.blocks_free_gpu"].tolist() == [31228, 31193]
    assert s["kv.usage_gpu_ratio"].tolist() == pytest.approx([0.004082, 0.005198])
    for c in STEP_COLUMNS:
        assert str(s[c].dtype) == ("float64" if c == "kv.usage_gpu_ratio" else "Int64"), c
    assert len(t.snapshots) == 0

    rep = t.report
    assert rep.read["lines"] == 3 and rep.read["spans"] == 3 and rep.read["events"] == 8
    assert rep.kept["steps"] == 2 and rep.kept["journey_events"] == 4
    assert rep.kept["requests"] == 1 and rep.n_dropped == 0


def test_default_experiment_id(specs_dir: Path, tmp_path: Path) -> None:
    assert read_otlp(specs_dir / EXAMPLE).steps["experiment_id"].iloc[0] == \
        "vllm-trace-format.example"
    exp = tmp_path / "EXP-1"
    exp.mkdir()
    p = _write(exp, _example_lines(specs_dir))
    assert read_otlp(p).requests["experiment_id"].iloc[0] == "EXP-1"


# ------------------------------------------------------------------------------------------
# encodings and order
# ------------------------------------------------------------------------------------------
def _numbers_for_int_strings(obj):
    """Turn every ``intValue`` string into a JSON number."""
    if isinstance(obj, dict):
        return {k: (int(v) if k == "intValue" else _numbers_for_int_strings(v))
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [_numbers_for_int_strings(v) for v in obj]
    return obj


def test_string_and_number_ints_are_equivalent(specs_dir: Path, tmp_path: Path) -> None:
    lines = _example_lines(specs_dir)
    as_numbers = [json.dumps(_numbers_for_int_strings(json.loads(ln))) for ln in lines]
    a = read_otlp(_write(tmp_path, lines, "a.jsonl"), experiment_id="x")
    b = read_otlp(_write(tmp_path, as_numbers, "b.jsonl"), experiment_id="x")
    _assert_tables_equal(a, b)
    assert b.report.n_dropped == 0


def test_integral_doubles_and_number_strings_for_int_fields(specs_dir: Path,
                                                             tmp_path: Path) -> None:
    doc = json.loads(_example_lines(specs_dir)[2])
    attrs = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["events"][0]["attributes"]
    attrs[0]["value"] = {"doubleValue": 41.0}           # step.id as an integral double
    attrs[8]["value"] = {"stringValue": "2048"}         # scheduled tokens as a string value
    t = read_otlp(_write(tmp_path, [json.dumps(doc)]))
    assert t.steps["step.id"].tolist() == [41, 42]
    assert t.steps["batch.scheduled_tokens"].tolist() == [2048, 552]


def test_duplicated_lines_same_tables(specs_dir: Path, tmp_path: Path) -> None:
    lines = _example_lines(specs_dir)
    a = read_otlp(_write(tmp_path, lines, "a.jsonl"), experiment_id="x")
    b = read_otlp(_write(tmp_path, lines + lines + lines[:1], "b.jsonl"), experiment_id="x")
    _assert_tables_equal(a, b)
    assert b.report.dropped["duplicate_span"] == 4
    assert b.report.read["spans"] == 7


def test_shuffled_lines_same_tables(specs_dir: Path, tmp_path: Path) -> None:
    lines = _example_lines(specs_dir)
    ref = read_otlp(_write(tmp_path, lines, "a.jsonl"), experiment_id="x")
    rng = random.Random(3)
    for i in range(4):
        sh = lines[:]
        rng.shuffle(sh)
        _assert_tables_equal(ref, read_otlp(_write(tmp_path, sh, f"s{i}.jsonl"),
                                            experiment_id="x"))


def test_events_shuffled_within_span_same_tables(specs_dir: Path, tmp_path: Path) -> None:
    lines = _example_lines(specs_dir)
    ref = read_otlp(_write(tmp_path, lines, "a.jsonl"), experiment_id="x")
    docs = [json.loads(ln) for ln in lines]
    for d in docs:
        random.Random(1).shuffle(d["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["events"])
    got = read_otlp(_write(tmp_path, [json.dumps(d) for d in docs], "b.jsonl"),
                    experiment_id="x")
    _assert_tables_equal(ref, got)


def test_several_resource_spans_and_scopes_per_line(specs_dir: Path, tmp_path: Path) -> None:
    lines = _example_lines(specs_dir)
    docs = [json.loads(ln) for ln in lines]
    merged = {"resourceSpans": [docs[0]["resourceSpans"][0],
                                {"resource": {}, "scopeSpans": [
                                    docs[1]["resourceSpans"][0]["scopeSpans"][0],
                                    docs[2]["resourceSpans"][0]["scopeSpans"][0]]}]}
    ref = read_otlp(_write(tmp_path, lines, "a.jsonl"), experiment_id="x")
    got = read_otlp(_write(tmp_path, [json.dumps(merged)], "b.jsonl"), experiment_id="x")
    _assert_tables_equal(ref, got)
    assert got.report.read["lines"] == 1


# ------------------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------------------
def test_truncated_and_garbage_lines_are_counted(specs_dir: Path, tmp_path: Path) -> None:
    lines = _example_lines(specs_dir)
    bad = lines + [lines[0][: len(lines[0]) // 2], "garbage ]]", "[1, 2, 3]", '{"foo": 1}',
                   '"just a string"', "", "   "]
    ref = read_otlp(_write(tmp_path, lines, "a.jsonl"), experiment_id="x")
    t = read_otlp(_write(tmp_path, bad, "b.jsonl"), experiment_id="x")
    _assert_tables_equal(ref, t)
    assert t.report.dropped["malformed_json"] == 2
    assert t.report.dropped["not_otlp"] == 3
    assert t.report.read["lines"] == 8
    notes = [n for n in t.report.notes if n.startswith("malformed_json")]
    assert len(notes) == 2 and notes[0].endswith("b.jsonl:4")


def test_examples_in_notes_are_capped(specs_dir: Path, tmp_path: Path) -> None:
    lines = _example_lines(specs_dir) + ["{oops"] * 12
    t = read_otlp(_write(tmp_path, lines))
    assert t.report.dropped["malformed_json"] == 12
    assert len([n for n in t.report.notes if n.startswith("malformed_json")]) == 5


def test_wrong_field_type_drops_record_naming_field(specs_dir: Path, tmp_path: Path) -> None:
    doc = json.loads(_example_lines(specs_dir)[2])
    ev = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["events"]
    ev[0]["attributes"][0]["value"] = {"intValue": "forty-one"}   # step.id
    ev[1]["attributes"][13]["value"] = {"doubleValue": "abc"}     # kv.usage_gpu_ratio
    t = read_otlp(_write(tmp_path, [json.dumps(doc)]))
    assert len(t.steps) == 0
    assert t.report.dropped["bad_field:step.id"] == 1
    assert t.report.dropped["bad_field:kv.usage_gpu_ratio"] == 1


def test_span_level_bad_fields(tmp_path: Path) -> None:
    good = _core_span("t1", "c1", None, "cmpl-a-0-aaaaaaaa", _full_journey())
    bad_trace = dict(good, traceId=123, spanId="c2")
    bad_events = dict(good, spanId="c3", events={"x": 1})
    bad_parent = dict(good, spanId="c4", parentSpanId=7)
    no_id = dict(good, spanId="c5", attributes=[])
    lines = [_line("vllm.scheduler", good, bad_trace, bad_events, bad_parent, no_id),
             _line("vllm.scheduler", "not a span", good)]
    t = read_otlp(_write(tmp_path, lines))
    d = t.report.dropped
    assert d["bad_field:traceId"] == 1 and d["bad_field:events"] == 1
    assert d["bad_field:parentSpanId"] == 1 and d["missing_field:gen_ai.request.id"] == 1
    assert d["bad_field:span"] == 1 and d["duplicate_span"] == 1
    assert len(t.requests) == 1


def test_non_finite_and_out_of_range_values(tmp_path: Path) -> None:
    ev = _full_journey()
    ev[0]["attributes"][2]["value"] = {"intValue": str(2**70)}   # ts.monotonic_ns overflow
    ev[1]["attributes"][1]["value"] = {"doubleValue": float("nan")}
    lines = [_line("vllm.scheduler", _core_span("t", "s", None, "r-0-aaaaaaaa", ev))]
    t = read_otlp(_write(tmp_path, lines))
    assert t.report.dropped["bad_field:ts.monotonic_ns"] == 1
    assert t.report.dropped["bad_field:ts.monotonic"] == 1
    assert len(t.journey_events) == 2
    assert t.requests["status"].tolist() == ["incomplete"]


def test_unreadable_or_empty_file_raises(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="missing.jsonl"):
        read_otlp(tmp_path / "missing.jsonl")
    with pytest.raises(TraceFormatError):
        read_otlp(tmp_path)  # a directory
    empty = _write(tmp_path, [""], "empty.jsonl")
    with pytest.raises(TraceFormatError, match="empty.jsonl"):
        read_otlp(empty)
    junk = _write(tmp_path, ["nope", "[]"], "junk.jsonl")
    with pytest.raises(TraceFormatError) as ei:
        read_otlp(junk)
    assert ei.value.file == str(junk)


def test_gzip_input(specs_dir: Path, tmp_path: Path) -> None:
    import gzip
    p = tmp_path / "traces.jsonl.gz"
    with gzip.open(p, "wt") as fh:
        fh.write((specs_dir / EXAMPLE).read_text())
    assert len(read_otlp(p).requests) == 1


# ------------------------------------------------------------------------------------------
# request semantics
# ------------------------------------------------------------------------------------------
def test_preemption_and_resume(tmp_path: Path) -> None:
    t0 = 5_000_000_000
    events = [_jev("QUEUED", 1, t0), _jev("SCHEDULED", 2, t0 + 10, **{"schedule.kind": "FIRST"}),
              _jev("PREEMPTED", 4, t0 + 30, npre=1),
              _jev("SCHEDULED", 6, t0 + 50, npre=1, **{"schedule.kind": "RESUME"}),
              _jev("PREEMPTED", 7, t0 + 60, npre=2),
              _jev("SCHEDULED", 9, t0 + 80, npre=2, **{"schedule.kind": "RESUME"}),
              _jev("FIRST_TOKEN", 10, t0 + 90, done=100, dec=1, npre=2),
              _jev("FINISHED", 12, t0 + 95, done=100, dec=4, npre=2,
                   **{"finish.status": "length"})]
    lines = [_line("vllm.api", _api_span("t", "a", "cmpl-x", 1.0, 2.0)),
             _line("vllm.scheduler", _core_span("t", "c", "a", "cmpl-x-0-0123abcd", events))]
    t = read_otlp(_write(tmp_path, lines))
    r = t.requests.iloc[0]
    assert r["n_scheduled"] == 3 and r["n_preemptions"] == 2
    assert r["first_scheduled_step"] == 2 and r["first_token_step"] == 10
    assert r["complete"] and r["status"] == "length"
    assert t.journey_events["event"].tolist().count("PREEMPTED") == 2


def test_aborted_request(tmp_path: Path) -> None:
    t0 = 7_000_000_000
    ev = [_jev("QUEUED", 1, t0), _jev("SCHEDULED", 2, t0 + 5),
          _jev("FINISHED", 3, t0 + 9, **{"finish.status": "aborted"})]
    ev2 = [_jev("QUEUED", 1, t0), _jev("SCHEDULED", 2, t0 + 5)]
    lines = [_line("vllm.api", _api_span("t1", "a1", "cmpl-ab", 1.0, None),
                   _api_span("t2", "a2", "cmpl-cd", 1.0, None, aborted=True)),
             _line("vllm.scheduler", _core_span("t1", "c1", "a1", "cmpl-ab-0-0000aaaa", ev),
                   _core_span("t2", "c2", "a2", "cmpl-cd-0-0000bbbb", ev2))]
    t = read_otlp(_write(tmp_path, lines))
    rq = t.requests.set_index("request_id")
    assert rq.loc["cmpl-ab-0-0000aaaa", "status"] == "aborted"
    assert rq.loc["cmpl-cd-0-0000bbbb", "status"] == "aborted"
    assert rq["aborted"].all() and not rq["complete"].any()
    assert t.report.kept["aborted_request"] == 2
    assert t.report.kept.get("incomplete_request", 0) == 0
    api = t.api_spans.set_index("api_request_id")
    assert api.loc["cmpl-cd", "abort_reason"] == "client_disconnect"
    assert api.loc["cmpl-cd", "status_code"] == 2


def test_incomplete_request_kept_and_counted(tmp_path: Path) -> None:
    ev = _full_journey()[:2]
    lines = [_line("vllm.scheduler", _core_span("t", "c", None, "cmpl-q-0-12345678", ev))]
    t = read_otlp(_write(tmp_path, lines))
    r = t.requests.iloc[0]
    assert r["status"] == "incomplete" and not r["complete"]
    assert pd.isna(r["first_token_ns"]) and pd.isna(r["output_tokens"])
    assert t.report.kept["incomplete_request"] == 1
    assert t.report.kept["core_without_api"] == 1


def test_api_only_span_counted(tmp_path: Path) -> None:
    lines = [_line("vllm.api", _api_span("t", "a", "cmpl-rejected", 1.0, 1.5))]
    t = read_otlp(_write(tmp_path, lines))
    assert len(t.requests) == 0 and len(t.api_spans) == 1
    assert pd.isna(t.api_spans["request_id"].iloc[0])
    assert t.report.kept["api_only_span"] == 1


def test_string_fallback_join_completions_and_chat(tmp_path: Path) -> None:
    lines = [_line("vllm.api", _api_span("t1", "a1", "cmpl-abc", 1.0, 2.0),
                   _api_span("t2", "a2", "chatcmpl-xyz", 3.0, 4.0)),
             _line("vllm.scheduler",
                   _core_span("t1", "c1", None, "cmpl-abc-0-deadbeef", _full_journey()),
                   _core_span("t2", "c2", "ffffffffffffffff", "chatcmpl-xyz-cafebabe",
                              _full_journey()))]
    t = read_otlp(_write(tmp_path, lines))
    rq = t.requests.set_index("request_id")
    assert rq.loc["cmpl-abc-0-deadbeef", "api_request_id"] == "cmpl-abc"
    assert rq.loc["cmpl-abc-0-deadbeef", "arrival_s"] == 1.0
    assert rq.loc["chatcmpl-xyz-cafebabe", "api_request_id"] == "chatcmpl-xyz"
    assert rq.loc["chatcmpl-xyz-cafebabe", "departed_s"] == 4.0
    assert t.report.kept.get("api_only_span", 0) == 0


def test_prompt_and_max_tokens_fallback_to_api(tmp_path: Path) -> None:
    ev = _full_journey()
    for e in ev:
        e["attributes"] = [a for a in e["attributes"]
                           if a["key"] not in ("prefill.total_tokens", "decode.max_tokens")]
    lines = [_line("vllm.api", _api_span("t", "a", "cmpl-p", 1.0, 2.0, prompt=321,
                                         max_tokens=9)),
             _line("vllm.scheduler", _core_span("t", "c", "a", "cmpl-p-0-aaaabbbb", ev))]
    r = read_otlp(_write(tmp_path, lines)).requests.iloc[0]
    assert r["prompt_tokens"] == 321 and r["max_tokens"] == 9


def test_timestamps_backwards_flagged(tmp_path: Path) -> None:
    t0 = 9_000_000_000
    ev = [_jev("QUEUED", 1, t0), _jev("SCHEDULED", 2, t0 + 100),
          _jev("FIRST_TOKEN", 3, t0 + 50, done=100, dec=1),     # earlier than SCHEDULED
          _jev("FINISHED", 5, t0 + 300, dec=4, **{"finish.status": "length"})]
    lines = [_line("vllm.scheduler", _core_span("t", "c", None, "r-0-aaaaaaaa", ev),
                   _core_span("t", "d", None, "r-1-aaaaaaaa", _full_journey()))]
    t = read_otlp(_write(tmp_path, lines))
    assert t.requests.set_index("request_id")["ts_backwards"].to_dict() == {
        "r-0-aaaaaaaa": True, "r-1-aaaaaaaa": False}
    assert t.report.kept["ts_backwards"] == 1


def test_duplicate_events_first_kept(tmp_path: Path) -> None:
    ev = _full_journey()
    ev = ev + [copy.deepcopy(ev[0]), copy.deepcopy(ev[3])]
    later_finish = _jev("FINISHED", 8, 10_000_009_000, dec=2, **{"finish.status": "stopped"})
    ev.append(later_finish)
    lines = [_line("vllm.scheduler", _core_span("t", "c", None, "r-0-aaaaaaaa", ev))]
    t = read_otlp(_write(tmp_path, lines))
    assert t.report.dropped["duplicate_event"] == 3
    assert t.journey_events["event"].tolist() == ["QUEUED", "SCHEDULED", "FIRST_TOKEN",
                                                  "FINISHED"]
    r = t.requests.iloc[0]
    assert r["finished_step"] == 5 and r["output_tokens"] == 4 and r["status"] == "length"


def test_empty_steps_kept_and_snapshots(tmp_path: Path) -> None:
    summary = {"name": "step.BATCH_SUMMARY", "timeUnixNano": "1", "attributes": [
        _attr("step.id", 7), _attr("step.ts_start_ns", 1000), _attr("batch.scheduled_tokens", 0),
        _attr("batch.prefill_tokens", 0), _attr("batch.decode_tokens", 0)]}
    snap = {"name": "step.REQUEST_SNAPSHOT", "timeUnixNano": "1", "attributes": [
        _attr("step.id", 7), _attr("request.id", "r-0-aaaaaaaa"), _attr("request.phase", "DECODE"),
        _attr("request.num_prompt_tokens", 50), _attr("request.num_computed_tokens", 52),
        _attr("kv.blocks_allocated_gpu", 4),
        {"key": "request.num_output_tokens", "value": {"arrayValue": {"values": []}}}]}
    other = {"name": "step.SOMETHING_NEW", "attributes": []}
    span = {"traceId": "t", "spanId": "s", "name": "scheduler_steps_1",
            "attributes": [_attr("scheduler.span_sequence", 1)],
            "events": [summary, snap, copy.deepcopy(snap), other]}
    lines = [_line("vllm.scheduler.step", span),
             _line("some.other.scope", {"traceId": "u", "spanId": "v", "name": "x"})]
    t = read_otlp(_write(tmp_path, lines))
    assert t.steps["step.id"].tolist() == [7]
    assert t.steps["batch.scheduled_tokens"].tolist() == [0]
    assert pd.isna(t.steps["queue.running_depth"].iloc[0])
    assert len(t.snapshots) == 1
    sn = t.snapshots.iloc[0]
    assert sn["step_id"] == 7 and sn["request.num_computed_tokens"] == 52
    assert pd.isna(sn["request.num_output_tokens"])
    d = t.report.dropped
    assert d["duplicate_snapshot"] == 1 and d["unknown_event"] == 1
    assert d["unknown_scope"] == 1 and d["non_scalar_attribute"] == 2


def test_report_passed_in_is_filled(specs_dir: Path) -> None:
    rep = IngestReport(source="mine")
    t = read_otlp(specs_dir / EXAMPLE, report=rep)
    assert t.report is rep and rep.source == "mine" and rep.kept["requests"] == 1
