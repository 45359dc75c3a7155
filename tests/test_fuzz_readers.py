"""Property tests: mutated trace files never make the readers raise anything but TraceFormatError.

The OTLP mutations start from the spec's example lines and delete keys, replace values by values
of other types, swap string / number encodings, truncate lines, insert garbage, duplicate and
shuffle lines. Each file is read; the reader must either return tables that agree with their
report, or raise :class:`~bayes_latency.errors.TraceFormatError`.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bayes_latency.data.kvevents import KV_EVENT_COLUMNS, read_kv_events
from bayes_latency.data.otlp.read import JOURNEY_COLUMNS, REQUEST_COLUMNS, read_otlp
from bayes_latency.errors import TraceFormatError

EXAMPLE = "vllm-trace-format.example.jsonl"
FUZZ = settings(max_examples=200, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# values of every JSON type, including edge cases (NaN, int beyond int64, deep nesting)
_WEIRD = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
    st.text(max_size=8), st.sampled_from(["", "41", "4.5", "1e400", "-0", "NaN", "journey.X"]),
    st.just([]), st.just({}), st.just({"intValue": "7"}), st.just({"arrayValue": {"values": []}}),
    st.just([[[[[]]]]]),
)


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    """All paths (tuples of keys / indices) to nodes below ``obj``."""
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.append(prefix + (k,))
            out.extend(_paths(v, prefix + (k,)))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out.append(prefix + (i,))
            out.extend(_paths(v, prefix + (i,)))
    return out


def _parent(doc: Any, path: tuple) -> Any:
    for k in path[:-1]:
        doc = doc[k]
    return doc


def _swap_encoding(v: Any) -> Any:
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            try:
                return float(v)
            except ValueError:
                return v
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, (int, float)):
        return str(v)
    return v


@st.composite
def _mutated_lines(draw: st.DrawFn, base_docs: list[dict]) -> list[str]:
    docs = [copy.deepcopy(d) for d in base_docs]
    paths = [_paths(d) for d in docs]
    for _ in range(draw(st.integers(0, 6))):
        i = draw(st.integers(0, len(docs) - 1))
        if not paths[i]:
            continue
        path = draw(st.sampled_from(paths[i]))
        op = draw(st.sampled_from(["delete", "retype", "swap"]))
        try:
            parent = _parent(docs[i], path)
            key = path[-1]
            if op == "delete":
                del parent[key]
            elif op == "retype":
                parent[key] = copy.deepcopy(draw(_WEIRD))
            else:
                parent[key] = _swap_encoding(parent[key])
        except (KeyError, IndexError, TypeError):
            pass  # an earlier mutation removed or replaced the node
        paths[i] = _paths(docs[i])
    lines = [json.dumps(d) for d in docs]
    for _ in range(draw(st.integers(0, 2))):
        j = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["truncate", "garbage", "duplicate", "delete"]))
        if op == "truncate":
            lines[j] = lines[j][: draw(st.integers(0, max(0, len(lines[j]) - 1)))]
        elif op == "garbage":
            lines.insert(j, draw(st.one_of(st.text(max_size=20),
                                           st.sampled_from(["[]", "{}", "null", "1", '"x"']))))
        elif op == "duplicate":
            lines.append(lines[j])
        elif len(lines) > 1:
            del lines[j]
    return draw(st.permutations(lines))


def _check_otlp(path: Path) -> None:
    try:
        t = read_otlp(path, experiment_id="fuzz")
    except TraceFormatError:
        return
    rep = t.report
    assert list(t.requests.columns) == list(REQUEST_COLUMNS)
    assert list(t.journey_events.columns) == list(JOURNEY_COLUMNS)
    assert rep.kept["requests"] == len(t.requests)
    assert rep.kept["journey_events"] == len(t.journey_events)
    assert rep.kept["steps"] == len(t.steps)
    assert set(t.requests["status"]) <= {"stopped", "length", "aborted", "error", "incomplete"}
    assert not t.requests["request_id"].duplicated().any()
    assert set(t.journey_events["request_id"]) <= set(t.requests["request_id"])
    # nothing is dropped silently: every line is read, kept or counted
    assert rep.read["lines"] >= 1


@pytest.fixture(scope="module")
def example_docs(specs_dir: Path) -> list[dict]:
    return [json.loads(ln) for ln in (specs_dir / EXAMPLE).read_text().splitlines()
            if ln.strip()]


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@FUZZ
@given(data=st.data())
def test_otlp_reader_survives_mutations(example_docs: list[dict], fuzz_dir: Path,
                                        data: st.DataObject) -> None:
    lines = data.draw(_mutated_lines(example_docs))
    p = fuzz_dir / "traces.jsonl"
    p.write_text("\n".join(lines) + "\n")
    _check_otlp(p)


def test_unmutated_example_reads_cleanly(example_docs: list[dict], fuzz_dir: Path) -> None:
    p = fuzz_dir / "clean.jsonl"
    p.write_text("\n".join(json.dumps(d) for d in example_docs) + "\n")
    t = read_otlp(p)
    assert len(t.requests) == 1 and t.report.n_dropped == 0


def test_most_light_mutations_do_not_raise(example_docs: list[dict], fuzz_dir: Path) -> None:
    """One random deletion or retype in one line almost never makes the whole file invalid."""
    import random
    rng = random.Random(0)
    raised = 0
    for k in range(60):
        docs = copy.deepcopy(example_docs)
        i = rng.randrange(len(docs))
        path = rng.choice(_paths(docs[i]))
        parent = _parent(docs[i], path)
        if rng.random() < 0.5:
            del parent[path[-1]]
        else:
            parent[path[-1]] = rng.choice([None, 5, "x", [], {}, 1.5])
        p = fuzz_dir / f"light{k}.jsonl"
        p.write_text("\n".join(json.dumps(d) for d in docs) + "\n")
        try:
            read_otlp(p)
        except TraceFormatError:
            raised += 1
    assert raised == 0


def _read_or_error(path: Path) -> Any:
    try:
        return read_otlp(path, experiment_id="fuzz", chunk_bytes=0)  # the line path
    except TraceFormatError as exc:
        return str(exc)


def _assert_same_reading(a: Any, b: Any) -> None:
    """Two readings of one file: the same error, or the same tables (exact) and report."""
    assert type(a) is type(b)
    if isinstance(a, str):
        assert a == b
        return
    for name in ("steps", "journey_events", "requests", "snapshots", "api_spans"):
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name), check_exact=True)
    assert a.report.to_dict() == b.report.to_dict()


@settings(FUZZ, max_examples=120)
@given(data=st.data())
def test_typed_decoding_reads_like_the_generic_path(example_docs: list[dict], fuzz_dir: Path,
                                                    data: st.DataObject) -> None:
    """Lines decoded into the typed Structs give what the generic dict walk gives (every
    table, dtype and count), whatever the mutation; the generic path is forced by a typed
    decoder that refuses every line."""
    import bayes_latency.data.otlp.read as otlp

    lines = data.draw(_mutated_lines(example_docs))
    p = fuzz_dir / "typed.jsonl"
    p.write_text("\n".join(lines) + "\n")
    fast = _read_or_error(p)

    def refuse(raw: bytes) -> Any:
        raise ValueError("generic path")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(otlp, "_decode_typed", refuse)
        slow = _read_or_error(p)
    _assert_same_reading(fast, slow)


_KV_BASE = [
    [1771361000.0422, [["BlockStored", [8164721311958862131], None, list(range(16)), 16, None,
                        "GPU", None],
                       ["BlockRemoved", [2**64 - 1], "GPU"], ["AllBlocksCleared"]], 0, None],
    [1771361001.0, [["TransferInitiated", 4294967301, "r-0", "GPU", "CPU", 4, 12],
                    ["TransferCompleted", 4294967301, "r-0", "GPU", "CPU", 4, True, 13],
                    ["CacheEviction", "CPU", 3, "lru", 13, None],
                    ["CacheLoadCommitted", "r-1", "CPU", 2, 14]], 1, 7],
]


@FUZZ
@given(data=st.data())
def test_kv_reader_survives_mutations(fuzz_dir: Path, data: st.DataObject) -> None:
    lines = data.draw(_mutated_lines(_KV_BASE))
    p = fuzz_dir / "kv_events.jsonl"
    p.write_text("\n".join(lines) + "\n")
    try:
        df = read_kv_events(p)
    except TraceFormatError:
        return
    assert list(df.columns) == list(KV_EVENT_COLUMNS)
