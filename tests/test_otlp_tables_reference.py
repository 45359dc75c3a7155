"""The numpy journey and requests tables equal the pandas reference (``tests/otlp_reference.py``).

Accumulator states are drawn directly (requests, journey rows with repeated timestamps, null
steps and repeated once-per-request events, API spans joined by parent span or by id), so ties
and duplicates that real traces rarely hold are exercised; every table, dtype and report count
must be identical.
"""

from __future__ import annotations

import copy
from datetime import timedelta

import otlp_reference as ref
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bayes_latency.data.otlp import rows as otlp_rows
from bayes_latency.data.otlp.fields import JOURNEY_EVENTS
from bayes_latency.data.report import IngestReport

_RIDS = ["r1", "r2", "cmpl-x-0-0123abcd", "cmpl-x-1-0123abcd", "r3-89abcdef", "cmpl-y"]
_INTS = st.sampled_from([None, 0, 1, 5])
_STRS = st.sampled_from([None, "a", "b"])


@st.composite
def _acc(draw: st.DrawFn) -> otlp_rows._Acc:
    acc = otlp_rows._Acc("gen", IngestReport())
    rids = draw(st.lists(st.sampled_from(_RIDS), max_size=5, unique=True))
    for i, rid in enumerate(rids):
        acc.cores[rid] = (draw(st.sampled_from(["t1", "t2"])), f"s{i}",
                          draw(st.sampled_from([None, "", "p1", "p2", "p3"])))
        if draw(st.booleans()) and draw(st.booleans()):
            acc.damaged.add((rid, *acc.cores[rid][:2]))
    je = acc.je
    for _ in range(draw(st.integers(0, 25)) if rids else 0):
        je["request_id"].append(draw(st.sampled_from(rids)))
        je["event"].append(draw(st.sampled_from(JOURNEY_EVENTS)))
        je["step"].append(draw(st.sampled_from([None, 0, 1, 2, 3])))
        je["ts_monotonic_ns"].append(draw(st.integers(0, 4)))
        for c in ("prefill_done", "prefill_total", "decode_done", "decode_max",
                  "num_preemptions"):
            je[c].append(draw(_INTS))
        je["phase"].append(draw(_STRS))
        je["schedule_kind"].append(draw(_STRS))
        je["finish_status"].append(draw(st.sampled_from([None, "stopped", "length", "aborted",
                                                         "ignored", "weird"])))
    a = acc.api
    for _ in range(draw(st.integers(0, 5))):
        a["api_request_id"].append(draw(st.sampled_from([None, "cmpl-x", "cmpl-x-0", "r1",
                                                         "r3", "cmpl-y"])))
        a["trace_id"].append(draw(st.sampled_from(["t1", "t2"])))
        a["span_id"].append(draw(st.sampled_from(["p1", "p2", "p3", "q"])))
        for c in ("http_route", "model", "abort_reason"):
            a[c].append(draw(_STRS))
        for c in ("prompt_tokens", "max_tokens", "n"):
            a[c].append(draw(_INTS))
        for c in ("temperature", "top_p", "arrival_s", "handoff_s", "first_response_s",
                  "departed_s", "aborted_s"):
            a[c].append(draw(st.sampled_from([None, 0.5, 2.0])))
        code = draw(st.sampled_from([None, 0, 2]))
        a["status_code"].append(code)
        a["aborted"].append(code == 2 or draw(st.booleans()))
    return acc


@settings(max_examples=150, deadline=timedelta(seconds=5), database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(acc=_acc())
def test_tables_equal_the_pandas_reference(acc: otlp_rows._Acc) -> None:
    fast_acc, ref_acc = copy.deepcopy(acc), copy.deepcopy(acc)
    fast = fast_acc.tables("e")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(otlp_rows._Acc, "_journey_table", ref._journey_table)
        mp.setattr(otlp_rows._Acc, "_requests_table", ref._requests_table)
        slow = ref_acc.tables("e")
    for name in ("steps", "journey_events", "requests", "snapshots", "api_spans"):
        pd.testing.assert_frame_equal(getattr(fast, name), getattr(slow, name), check_exact=True)
    assert fast.report.to_dict() == slow.report.to_dict()
