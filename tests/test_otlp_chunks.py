"""The OTLP reader's scanner path (``data/otlp/chunks.py``) reads exactly like the line path.

Every comparison reads one file line by line (``chunk_bytes=0``) and in chunks handed to the
compiled byte scanner (``data/otlp/scan.py``; the default chunk size, and a tiny one that splits
the file into chunks some of which the scanner takes and some it refuses, read line by line);
tables (values, dtypes, column order) and reports must be equal.
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fuzz_readers import FUZZ, _assert_same_reading, _mutated_lines

import bayes_latency.data.otlp.chunks as oc
from bayes_latency.data.otlp.read import read_otlp
from bayes_latency.errors import TraceFormatError


@pytest.fixture(scope="module")
def example_docs(specs_dir: Path) -> list[dict]:
    return [json.loads(ln) for ln in (specs_dir / "vllm-trace-format.example.jsonl")
            .read_text().splitlines() if ln.strip()]


def _read(path: Path, chunk_bytes: int | None) -> Any:
    try:
        return read_otlp(path, experiment_id="x", chunk_bytes=chunk_bytes)
    except TraceFormatError as exc:
        return str(exc)


def _same_all_ways(path: Path) -> Any:
    ref = _read(path, 0)
    for cb in (None, 700):
        _assert_same_reading(_read(path, cb), ref)
    return ref


class _Count:
    """Counts the chunks the scanner path takes and refuses."""

    def __init__(self, mp: pytest.MonkeyPatch) -> None:
        self.taken = self.refused = 0
        orig = oc.read_chunk

        def wrapped(buf: bytes, n: int) -> Any:
            out = orig(buf, n)
            if out is None:
                self.refused += 1
            else:
                self.taken += 1
            return out

        mp.setattr(oc, "read_chunk", wrapped)


def _write(path: Path, docs: list[Any]) -> Path:
    path.write_text("\n".join(d if isinstance(d, str) else json.dumps(d) for d in docs) + "\n")
    return path


@settings(FUZZ, max_examples=100)
@given(data=st.data())
def test_scanner_path_reads_like_the_line_path(example_docs: list[dict], tmp_path_factory,
                                               data: st.DataObject) -> None:
    lines = data.draw(_mutated_lines(example_docs))
    p = _write(tmp_path_factory.mktemp("chunks") / "traces.jsonl", lines)
    _same_all_ways(p)


def test_clean_example_takes_the_scanner_path(example_docs: list[dict], tmp_path: Path) -> None:
    p = _write(tmp_path / "traces.jsonl", example_docs * 2 + [""])  # repeats + a blank line
    with pytest.MonkeyPatch.context() as mp:
        count = _Count(mp)
        t = _same_all_ways(p)
    assert count.taken >= 1
    # the repeated spans of the second copy are counted as duplicates, by the line path
    assert t.report.dropped["duplicate_span"] > 0 and len(t.requests) == 1
    single = _write(tmp_path / "one.jsonl", example_docs)
    with pytest.MonkeyPatch.context() as mp:
        count = _Count(mp)
        scanned = []
        orig = oc._scanned_chunk
        mp.setattr(oc, "_scanned_chunk", lambda buf, n: scanned.append(orig(buf, n)) or
                   scanned[-1])
        t = read_otlp(single)
    assert (count.taken, count.refused) == (1, 0) and t.report.n_dropped == 0
    assert len(scanned) == 1 and scanned[0] is not None  # the compiled scanner took it


def _set_values(docs: list[dict], rng: random.Random, how: str) -> None:
    """Give every double attribute a new value (``how``: random 17-digit, tiny, integers as
    JSON ints, negative zero) and every int attribute a random decimal string."""
    for d in docs:
        for rs in d["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for sp in ss["spans"]:
                    for holder in [sp, *sp.get("events", [])]:
                        for kv in holder.get("attributes", []):
                            v = kv["value"]
                            if "doubleValue" in v:
                                v["doubleValue"] = {
                                    "random": rng.random(), "tiny": rng.random() * 1e-300,
                                    "int": rng.randrange(0, 2), "negzero": -0.0,
                                }[how]
                            elif "intValue" in v and how == "random":
                                v["intValue"] = str(rng.randrange(0, 2**62))


@pytest.mark.parametrize("how", ["random", "tiny", "int", "negzero"])
def test_numbers_parse_to_the_same_bits(example_docs: list[dict], tmp_path: Path,
                                        how: str) -> None:
    rng = random.Random(how)
    docs = copy.deepcopy(example_docs)
    _set_values(docs, rng, how)
    lines = [json.dumps(d) for d in docs]
    if how == "int":  # JSON integers where OTLP has doubles (and a JSON -0)
        lines = [ln.replace('"doubleValue": 0}', '"doubleValue": -0}') for ln in lines]
    _same_all_ways(_write(tmp_path / "traces.jsonl", lines))


@pytest.mark.parametrize("bad", ["null", "[]", "7", '"x"', "{}", '{"resourceSpans": null}',
                                 '{"resourceSpans": [null]}', "\ufeff{}", "{} {}"])
def test_odd_lines_fall_back(example_docs: list[dict], tmp_path: Path, bad: str) -> None:
    """Lines the scanner cannot take send their chunk to the line path, which counts them."""
    for pos in (0, len(example_docs)):
        lines = [json.dumps(d) for d in example_docs]
        lines.insert(pos, bad)
        _same_all_ways(_write(tmp_path / f"t{pos}.jsonl", lines))


def test_span_without_events_counts_events_like_the_line_path(tmp_path: Path) -> None:
    # found by the fuzz test: the line path's report has ``events: 0`` for a span without events
    line = {"resourceSpans": [{"scopeSpans": [{"scope": {"name": "vllm.scheduler.step"}, "spans": [
        {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331",
         "name": "scheduler_steps_1", "kind": 1, "startTimeUnixNano": "1771360998521800000",
         "endTimeUnixNano": "1771361001521800000",
         "attributes": [{"key": "scheduler.step_range_start", "value": {"intValue": "1"}}],
         "status": {}}]}]}]}
    ref = _same_all_ways(_write(tmp_path / "traces.jsonl", [line]))
    assert ref.report.read["events"] == 0 and "events" in ref.report.to_dict()["read"]


# byte-level variants of the example's lines (json.dumps never writes them): each is read by the
# compiled scanner, or refused by it and read line by line, always with the line path's tables
# and counts
_EDITS = [
    ("compact", lambda ln: ln.replace(", ", ",").replace(": ", ":")),
    ("tabs", lambda ln: ln.replace(": ", ":\t").replace(", ", " ,\t")),
    ("crlf", lambda ln: ln + "\r"),
    ("escaped key", lambda ln: ln.replace('"key": "step.id"', '"key": "step\\/id"')),
    ("escaped value", lambda ln: ln.replace('"stringValue": "', '"stringValue": "\\t', 1)),
    ("escaped route", lambda ln: ln.replace('"stringValue": "/v1', '"stringValue": "\\/v1')),
    ("escaped skipped", lambda ln: ln.replace('"name": "', '"kind_note": "a\\"b", "name": "', 1)),
    ("bad escape", lambda ln: ln.replace('"name": "', '"kind_note": "a\\qb", "name": "', 1)),
    ("int 007", lambda ln: ln.replace('"intValue": "', '"intValue": "00', 1)),
    ("int -0", lambda ln: ln.replace('{"intValue": "0"}', '{"intValue": "-0"}')),
    ("int 19 digits", lambda ln: ln.replace('{"intValue": "1"}',
                                           '{"intValue": "9223372036854775807"}')),
    ("int 20 digits", lambda ln: ln.replace('{"intValue": "1"}',
                                           '{"intValue": "92233720368547758070"}')),
    ("int as number", lambda ln: ln.replace('{"intValue": "3"}', '{"intValue": 3}')),
    ("double exponent", lambda ln: ln.replace('"doubleValue": 1.0', '"doubleValue": 1e0')),
    ("double 1.", lambda ln: ln.replace('"doubleValue": 1.0', '"doubleValue": 1.')),
    ("double string", lambda ln: ln.replace('"doubleValue": 1.0', '"doubleValue": "1.0"')),
    ("number 01", lambda ln: ln.replace('"kind": ', '"kind": 0')),
    ("literal", lambda ln: ln.replace('"kind": ', '"x": tru, "kind": ', 1)),
    ("literals", lambda ln: ln.replace('"kind": ', '"x": [true, false, null, -1.5e-3, {}], '
                                                    '"kind": ', 1)),
    ("trailing comma", lambda ln: ln.replace("}]}]}", "},]}]}", 1)),
    ("trailing text", lambda ln: ln + " x"),
    ("two objects", lambda ln: ln + " {}"),
    ("duplicate field", lambda ln: ln.replace('"traceId": ', '"traceId": "x", "traceId": ', 1)),
    ("duplicate value", lambda ln: ln.replace('{"intValue": "',
                                              '{"intValue": "5", "intValue": "', 1)),
    ("null parent", lambda ln: ln.replace('"parentSpanId": "', '"parentSpanId": null, "p": "')),
    ("null status", lambda ln: ln.replace('"status": {}', '"status": null')),
    ("status code", lambda ln: ln.replace('"status": {}', '"status": {"code": 2, "m": "x"}')),
    ("status code 1.0", lambda ln: ln.replace('"status": {}', '"status": {"code": 1.0}')),
    ("dropped 0", lambda ln: ln.replace('"status": ', '"droppedEventsCount": 0, "status": ')),
    ("dropped 2", lambda ln: ln.replace('"status": ', '"droppedEventsCount": 2, "status": ')),
    ("scope last", lambda ln: ln.replace('{"scope": {"name": "vllm.api"}, ', '{')[:-5]
     + ', "scope": {"name": "vllm.api"}' + ln[-5:] if '"vllm.api"' in ln else ln),
    ("no spans", lambda ln: ln.replace('"spans": [', '"spanz": [', 1)),
    ("empty key", lambda ln: ln.replace('{"key": "', '{"": 1, "key": "', 1)),
    ("no key", lambda ln: ln.replace('{"key": "http.route", ', '{', 1)),
    ("empty value", lambda ln: ln.replace('"value": {"stringValue": "/v1/completions"}',
                                          '"value": {}', 1)),
    ("bool value", lambda ln: ln.replace('{"intValue": "1"}', '{"boolValue": true}')),
    ("deep", lambda ln: ln.replace('"kind": ', '"x": ' + "[" * 300 + "]" * 300 + ', "kind": ',
                                   1)),
    ("control char", lambda ln: ln.replace('"name": "', '"name": "\x01', 1)),
    ("unknown event", lambda ln: ln.replace('"name": "api.ARRIVED"', '"name": "api.OTHER"')),
    ("unicode", lambda ln: ln.replace('"stringValue": "', '"stringValue": "\u00e9\u4e2d', 1)),
]


@pytest.mark.parametrize("edit", [e for _, e in _EDITS], ids=[n for n, _ in _EDITS])
def test_byte_level_variants_read_like_the_line_path(example_docs: list[dict], tmp_path: Path,
                                                     edit: Any) -> None:
    lines = [edit(json.dumps(d)) for d in example_docs]
    p = tmp_path / "traces.jsonl"
    p.write_bytes(("\n".join(lines) + "\n").encode())
    _same_all_ways(p)


def test_scanner_reads_compact_lines_itself(example_docs: list[dict], tmp_path: Path) -> None:
    """The usual compact lines (and json.dumps' spaced ones) are taken by the scanner; a value
    with an escape is refused by it, and by :func:`read_chunk`, and then read line by line."""
    for sep in ((",", ":"), (", ", ": ")):
        buf = ("\n".join(json.dumps(d, separators=sep) for d in example_docs) + "\n").encode()
        assert oc._scanned_chunk(buf, len(example_docs)) is not None
        assert oc._scanned_chunk(buf, len(example_docs) + 1) is None  # wrong line count
    esc = buf.replace(b'"stringValue": "/v1/', b'"stringValue": "\\/v1/')
    assert esc != buf and oc._scanned_chunk(esc, len(example_docs)) is None
    assert oc.read_chunk(esc, len(example_docs)) is None
    p = tmp_path / "traces.jsonl"
    p.write_bytes(esc)
    with pytest.MonkeyPatch.context() as mp:
        count = _Count(mp)
        t = _same_all_ways(p)
    assert count.refused >= 1  # the chunks holding the escape
    assert t.report.n_dropped == 0 and len(t.requests) == 1  # the line path read it all
    assert t.api_spans["http_route"].tolist() == ["/v1/completions"]
