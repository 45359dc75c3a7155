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


# ---------------------------------------------------------------------------------------------
# Client readers (vllm bench JSON, inference-perf lifecycle JSON, TraceV2 pairs): every outcome
# classified (mutate.OUTCOMES); repeatable (derandomized), a few seconds each
# ---------------------------------------------------------------------------------------------
import os  # noqa: E402
from collections import Counter  # noqa: E402

import numpy as np  # noqa: E402
from mutate import BAD_OUTCOMES, Hang, time_limit  # noqa: E402

from bayes_latency.data.client.read import read_client_results  # noqa: E402
from bayes_latency.errors import BayesLatencyError  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
#: examples per client fuzz test (``BAYES_LATENCY_FUZZ_EXAMPLES`` for a longer run by hand)
CLIENT_EXAMPLES = int(os.environ.get("BAYES_LATENCY_FUZZ_EXAMPLES", "40"))
CLIENT_FUZZ = settings(max_examples=CLIENT_EXAMPLES, deadline=None, database=None,
                       derandomize=True,
                       suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                              HealthCheck.function_scoped_fixture])
CLIENT_STATS: Counter = Counter()
_CLIENT_WEIRD = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
    st.text(max_size=6), st.sampled_from(["", "NaN", "-1", "1e400", "inf", "\ufeff"]),
    st.builds(list), st.builds(dict), st.builds(lambda: [[1.0, None]]))


def _client_outcome(path: Path) -> tuple[str, str]:
    """Read ``path`` with :func:`read_client_results` and classify the result."""
    try:
        with time_limit(20):
            tabs, rep = read_client_results(path)
    except Hang as exc:
        return "hang", str(exc)
    except BayesLatencyError as exc:
        ok = path.name in str(exc) or str(path.parent) in str(exc)
        return ("clean_error", str(exc)) if ok else ("wrong_accepted", f"unnamed: {exc}")
    except Exception:  # noqa: BLE001 - the point of the suite
        import traceback

        return "traceback", traceback.format_exc()[-1500:]
    req = tabs["client_requests"]
    kept = rep.kept["requests_ok"] + rep.kept["requests_failed"]
    if len(tabs["lifecycle"]) != rep.kept["lifecycle_rows"] or len(req) != kept or (
            rep.read["requests"] and rep.read["requests"] != kept + rep.n_dropped):
        return "silent_loss", rep.format()
    ok = req[req["status"] == "ok"]
    for c in ("ttft_s", "e2e_s"):
        v = ok[c].to_numpy(dtype=float)
        if (v[np.isfinite(v)] < 0).any() or np.isinf(v).any():
            return "wrong_accepted", f"{c} out of domain"
    lc = tabs["lifecycle"]
    for c in ("ttft_mean_s", "e2e_mean_s", "decode_interval_s", "prompt_len_mean"):
        v = pd.to_numeric(lc[c], errors="coerce").to_numpy(dtype=float)
        if np.isinf(v).any() or (v[np.isfinite(v)] < 0).any():
            return "wrong_accepted", f"lifecycle {c} out of domain: {v}"
    return ("counted_drop", "") if rep.n_dropped else ("accepted", "")


def _record(kind: str, detail: str) -> None:
    CLIENT_STATS[kind] += 1
    assert kind not in BAD_OUTCOMES, f"{kind}: {detail}"


def _mutate_doc(doc: Any, data: st.DataObject, n_max: int = 4) -> Any:
    """Up to ``n_max`` edits at random paths: a value replaced, a key deleted, a list cut."""
    for _ in range(data.draw(st.integers(1, n_max))):
        paths = _paths(doc)
        if not paths:
            break
        path = data.draw(st.sampled_from(paths))
        parent = _parent(doc, path)
        op = data.draw(st.sampled_from(["replace", "delete", "truncate"]))
        if op == "delete" and isinstance(parent, dict):
            parent.pop(path[-1], None)
        elif op == "truncate" and isinstance(parent[path[-1]], list):
            parent[path[-1]] = parent[path[-1]][: data.draw(st.integers(0, 3))]
        else:
            parent[path[-1]] = data.draw(_CLIENT_WEIRD)
    return doc


def _dump(doc: Any, data: st.DataObject) -> bytes:
    text = json.dumps(doc)
    enc = data.draw(st.sampled_from(["utf-8", "utf-8-sig", "latin-1-tail", "cut"]))
    if enc == "utf-8-sig":
        return text.encode("utf-8-sig")
    if enc == "latin-1-tail":
        return text.encode("utf-8") + " café".encode("latin-1")
    if enc == "cut":
        return text.encode("utf-8")[: data.draw(st.integers(0, len(text)))]
    return text.encode("utf-8")


@CLIENT_FUZZ
@given(data=st.data())
def test_vllm_bench_fuzz_outcomes(tmp_path: Path, data: st.DataObject) -> None:
    doc = _mutate_doc(json.loads((DATA / "vllm_bench_small.json").read_text()), data)
    p = tmp_path / "bench.json"
    p.write_bytes(_dump(doc, data))
    _record(*_client_outcome(p))


def _lifecycle_doc() -> dict:
    dist = {"mean": 0.05, "min": 0.01, "p10": 0.02, "p25": 0.03, "median": 0.05, "p75": 0.06,
            "p90": 0.07, "p99": 0.09, "max": 0.1}
    lat = {k: {q: v * f for q, v in dist.items()} for k, f in (
        ("request_latency", 40.0), ("time_to_first_token", 1.0), ("time_per_output_token", 0.2),
        ("inter_token_latency", 0.2), ("normalized_time_per_output_token", 0.25))}
    return {"load_summary": {"count": 40, "requested_rate": 4.0, "achieved_rate": 3.9,
                             "schedule_delay": dict(dist)},
            "successes": {"count": 40, "latency": lat,
                          "prompt_len": {q: v * 4000 for q, v in dist.items()},
                          "output_len": {q: v * 2000 for q, v in dist.items()},
                          "throughput": {"input_tokens_per_sec": 900.0,
                                         "output_tokens_per_sec": 500.0,
                                         "requests_per_sec": 3.9}},
            "failures": {"count": 0}}


@CLIENT_FUZZ
@given(data=st.data())
def test_lifecycle_fuzz_outcomes(tmp_path: Path, data: st.DataObject) -> None:
    doc = _mutate_doc(_lifecycle_doc(), data)
    p = tmp_path / "summary_lifecycle_metrics.json"
    p.write_bytes(_dump(doc, data))
    _record(*_client_outcome(p))


@CLIENT_FUZZ
@given(data=st.data())
def test_tracev2_fuzz_outcomes(tmp_path: Path, data: st.DataObject) -> None:
    hdr = (DATA / "blis_observe.yaml").read_text(encoding="utf-8")
    rows = [ln.split(",") for ln in (DATA / "blis_observe.csv").read_text().splitlines()]
    for _ in range(data.draw(st.integers(0, 6))):
        r = data.draw(st.integers(0, len(rows) - 1))
        c = data.draw(st.integers(0, len(rows[r]) - 1))
        rows[r][c] = data.draw(st.one_of(
            st.sampled_from(["", "NaN", "-1", "1e400", "abc", "-0", "9223372036854775808"]),
            st.text(max_size=5))).replace(",", ";").replace("\n", " ").replace("\r", " ")
    extra = data.draw(st.sampled_from(["", "time_unit: seconds\n", "trace_version: 1\n",
                                       "x: &a [1]\ny: [*a, *a]\n", "mode: [\n"]))
    (tmp_path / "obs.yaml").write_text(hdr + extra, encoding="utf-8")
    (tmp_path / "obs.csv").write_bytes(
        "\n".join(",".join(r) for r in rows).encode(
            data.draw(st.sampled_from(["utf-8", "utf-8-sig"]))))
    _record(*_client_outcome(tmp_path / "obs.yaml"))


def test_client_fuzz_counts() -> None:
    """The classes seen by the three client fuzz tests above (run in file order): printed with
    ``-s``; every example was classified and none was bad."""
    print(f"\nfuzz client readers: {dict(CLIENT_STATS)}")
    assert not any(CLIENT_STATS[k] for k in BAD_OUTCOMES)
