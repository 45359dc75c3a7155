"""Streaming reader of vLLM journey + step tracing exported as OTLP JSON Lines.

The file format is described in ``shared/specs/vllm-trace-format.md`` (sections 1-6): each line is
one OTLP/JSON ``ExportTraceServiceRequest`` written by an OTel Collector ``file`` exporter. Three
scopes matter:

``vllm.api`` (``llm_request`` spans)
    One per request on the API server: arrival / departure / abort events (API monotonic clock, s).
``vllm.scheduler`` (``llm_core`` spans)
    One per request in the engine: ``journey.*`` events (engine monotonic clock, ns).
``vllm.scheduler.step`` (``scheduler_steps_<N>`` spans)
    ``step.BATCH_SUMMARY`` events of sampled steps and ``step.REQUEST_SNAPSHOT`` events of rich steps.

The reader streams the file in chunks of whole lines (:data:`CHUNK_BYTES`) and accumulates
typed column segments, so memory grows only with the number of output rows. Each chunk is first
tried on the columnar path (:func:`bayes_latency.data.otlp_arrow.read_chunk`: ``pyarrow.json``
with an explicit schema, columns built with ``pyarrow.compute`` / numpy), which takes only chunks
that the line-by-line path below reads without any drop, flag or special case and then gives the
same rows and counts; any other chunk is read line by line. Tables are built once at the end,
with numpy (the journey, step, snapshot and API orders by ``np.lexsort``, per-request facts by
scatter), falling back on a pandas sort by every column only for rows that tie on their keys.

On the line-by-line path each line is first decoded straight into msgspec Structs of the OTLP schema (``_Export``: no
dicts, no garbage-collector tracking; on the demo fleet's traces 330 MB per CPU-second against 130
for msgspec to dicts). The schema accepts only shapes that the generic walk handles without a
special case of its own; any other line (a wrong type anywhere, an attribute value with an unknown
key, a ``\\u`` escape) is decoded to plain values and walked by the generic code. Both paths share
the field checks below and give identical tables and counts (``tests/test_fuzz_readers.py``).

Bad-input policy
----------------
- A line that is not valid JSON: dropped, counted ``malformed_json``; a JSON value that is not an
  object with a ``resourceSpans`` list: dropped, counted ``not_otlp``. Up to five ``file:line``
  examples of each reason go to ``report.notes``.
- A span or event with a field of the wrong type (including an attribute value that cannot be
  converted to the field's type, a non-finite float or an int outside int64) is dropped and counted
  ``bad_field:<field>`` (e.g. ``bad_field:step.id``); a record missing a field it cannot do without
  is dropped and counted ``missing_field:<field>``. Other missing attributes become nulls.
- Array / kvlist / bytes attribute values of known keys are skipped (the field becomes null) and
  counted ``non_scalar_attribute``; unknown attribute keys and unknown span fields are ignored.
- Spans of unknown scopes are counted ``unknown_scope`` (not an error); unknown event names
  ``unknown_event``; repeated spans (same ``traceId``, ``spanId``) ``duplicate_span`` (the first in
  file order is kept); repeated events ``duplicate_event`` (see below); events the OTel SDK said it
  dropped (``droppedEventsCount``) ``sdk_dropped_events``.
- Values that parse but cannot be true are dropped with their record and counted
  ``out_of_range:<field>``: negative counts and times (step summaries, snapshots, journey
  events, API event times), ``kv.usage_gpu_ratio`` above 1, ``step.ts_end_ns < step.ts_start_ns``.
  A request whose journey lost an event this way (or to a ``bad_field``) is kept but not
  ``complete`` (``kept["damaged_request"]``), so that e.g. a dropped first SCHEDULED never turns a
  later RESUME into the first schedule; so is a request with ``decode.max_tokens`` 0 and a
  FIRST_TOKEN (``kept["inconsistent_request:max_tokens_0"]``). An unknown or empty
  ``finish.status`` gives status ``error``, counted ``kept["unknown_finish_status"]``.
- Two ``llm_core`` spans with the same ``gen_ai.request.id``: the one with the smallest
  ``(traceId, spanId)`` is kept; the others are counted ``duplicate_request_id`` and their events
  ``duplicate_request_id:events``.
- The only exception raised is :class:`~bayes_latency.errors.TraceFormatError`, for a file that
  cannot be read at all or that holds no valid OTLP line.

Report counters
---------------
``read``: ``lines`` (non-blank), ``blank_lines``, ``spans``, ``events`` (events of accepted spans),
per kind ``api_spans``, ``core_spans``, ``step_spans``, and ``step_summaries``
(``step.BATCH_SUMMARY`` events). ``report.lost`` counts dropped step summaries and core spans, so
that ``step_summaries = kept steps + lost steps`` and ``core_spans = kept requests + lost
requests`` (:meth:`~bayes_latency.data.report.IngestReport.unbalanced`).
``kept``: one counter per output table (``steps``, ``journey_events``, ``requests``, ``snapshots``,
``api_spans``) plus counts of rows that are kept but flagged: ``incomplete_request`` (not all of
QUEUED/SCHEDULED/FIRST_TOKEN/FINISHED, status ``incomplete`` unless aborted), ``aborted_request``,
``ts_backwards`` (journey timestamps decrease along the (step, ts) order; column ``ts_backwards``),
``api_only_span`` (API span joined to no engine span: engine-rejected or engine side not sampled;
it stays in ``api_spans`` but has no row in ``requests``) and ``core_without_api``.
``dropped``: reasons above.

Journey event order and duplicates
----------------------------------
Events of a request are ordered by ``(step, ts_monotonic_ns, event rank, remaining fields)``, which
makes the tables independent of line order. Exact repeats of ``(request_id, event, step,
ts_monotonic_ns)`` are dropped as ``duplicate_event``; so are second occurrences of the
once-per-request events QUEUED, FIRST_TOKEN and FINISHED (the first in that order is kept).
SCHEDULED and PREEMPTED may legitimately repeat (preemption and resume).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from bayes_latency.data.jsonl import SKIP, decode_line, iter_json_lines, iter_line_chunks
from bayes_latency.data.report import IngestReport
from bayes_latency.errors import TraceFormatError

__all__ = [
    "OtlpTables",
    "read_otlp",
    "STEP_COLUMNS",
    "STEP_INT_COLUMNS",
    "JOURNEY_COLUMNS",
    "REQUEST_COLUMNS",
    "SNAPSHOT_COLUMNS",
    "API_SPAN_COLUMNS",
    "JOURNEY_EVENTS",
]

# ---------------------------------------------------------------------------------------------
# Field specifications
# ---------------------------------------------------------------------------------------------
_INT, _FLOAT, _STR = 0, 1, 2
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_NON_SCALAR = ("arrayValue", "kvlistValue", "bytesValue")
_ABSENT = object()

#: Attributes of ``step.BATCH_SUMMARY`` in the order of the real ``batch_summaries.parquet``.
STEP_COLUMNS: tuple[str, ...] = (
    "step.id", "step.ts_start_ns", "step.ts_end_ns", "step.duration_us",
    "queue.running_depth", "queue.waiting_depth",
    "batch.num_prefill_reqs", "batch.num_decode_reqs", "batch.scheduled_tokens",
    "batch.prefill_tokens", "batch.decode_tokens", "batch.num_finished", "batch.num_preempted",
    "kv.usage_gpu_ratio", "kv.blocks_total_gpu", "kv.blocks_free_gpu",
)
#: Integer (nullable ``Int64``) columns of the steps table.
STEP_INT_COLUMNS: tuple[str, ...] = tuple(c for c in STEP_COLUMNS if c != "kv.usage_gpu_ratio")
_STEP_SPEC = {c: (_FLOAT if c == "kv.usage_gpu_ratio" else _INT) for c in STEP_COLUMNS}

_SNAPSHOT_ATTRS: tuple[str, ...] = (
    "request.phase", "request.num_prompt_tokens", "request.num_computed_tokens",
    "request.num_output_tokens", "request.num_preemptions", "request.scheduled_tokens_this_step",
    "kv.blocks_allocated_gpu", "kv.blocks_cached_gpu", "request.effective_prompt_len",
)
_SNAPSHOT_SPEC = {c: (_STR if c == "request.phase" else _INT) for c in _SNAPSHOT_ATTRS}
_SNAPSHOT_SPEC.update({"step.id": _INT, "request.id": _STR})
#: Columns of the snapshots table.
SNAPSHOT_COLUMNS: tuple[str, ...] = ("experiment_id", "step_id", "request_id") + _SNAPSHOT_ATTRS

#: Journey event types in their within-step rank order.
JOURNEY_EVENTS: tuple[str, ...] = ("QUEUED", "SCHEDULED", "PREEMPTED", "FIRST_TOKEN", "FINISHED")
_EVENT_RANK = {e: i for i, e in enumerate(JOURNEY_EVENTS)}
_ONCE_EVENTS = ("QUEUED", "FIRST_TOKEN", "FINISHED")
_JOURNEY_SPEC = {
    "event.type": _STR, "ts.monotonic": _FLOAT, "ts.monotonic_ns": _INT, "scheduler.step": _INT,
    "phase": _STR, "prefill.done_tokens": _INT, "prefill.total_tokens": _INT,
    "decode.done_tokens": _INT, "decode.max_tokens": _INT, "num_preemptions": _INT,
    "schedule.kind": _STR, "finish.status": _STR,
}
#: Columns of the journey_events table (contract).
JOURNEY_COLUMNS: tuple[str, ...] = (
    "experiment_id", "request_id", "event", "step", "ts_monotonic_ns", "phase", "prefill_done",
    "prefill_total", "decode_done", "decode_max", "num_preemptions", "schedule_kind",
    "finish_status",
)
# attribute -> journey column (besides event / ts)
_JOURNEY_MAP = (
    ("scheduler.step", "step"), ("phase", "phase"), ("prefill.done_tokens", "prefill_done"),
    ("prefill.total_tokens", "prefill_total"), ("decode.done_tokens", "decode_done"),
    ("decode.max_tokens", "decode_max"), ("num_preemptions", "num_preemptions"),
    ("schedule.kind", "schedule_kind"), ("finish.status", "finish_status"),
)
_JOURNEY_INT = ("step", "prefill_done", "prefill_total", "decode_done", "decode_max",
                "num_preemptions")
_JOURNEY_STR = ("phase", "schedule_kind", "finish_status")

_API_SPEC = {
    "gen_ai.request.id": _STR, "http.route": _STR, "gen_ai.response.model": _STR,
    "gen_ai.usage.prompt_tokens": _INT, "gen_ai.request.temperature": _FLOAT,
    "gen_ai.request.top_p": _FLOAT, "gen_ai.request.max_tokens": _INT, "gen_ai.request.n": _INT,
}
_API_EVENT_SPEC = {"event.ts.monotonic": _FLOAT, "reason": _STR, "error": _STR}
_API_EVENTS = ("api.ARRIVED", "api.HANDOFF_TO_CORE", "api.FIRST_RESPONSE_FROM_CORE",
               "api.DEPARTED", "api.ABORTED")
_CORE_SPEC = {"gen_ai.request.id": _STR}

#: Columns of the api_spans table (one row per ``llm_request`` span).
API_SPAN_COLUMNS: tuple[str, ...] = (
    "experiment_id", "api_request_id", "trace_id", "span_id", "http_route", "model",
    "prompt_tokens", "max_tokens", "n", "temperature", "top_p", "arrival_s", "handoff_s",
    "first_response_s", "departed_s", "aborted_s", "abort_reason", "status_code", "aborted",
    "request_id",
)
#: Columns of the requests table (contract, plus ``ts_backwards``).
REQUEST_COLUMNS: tuple[str, ...] = (
    "experiment_id", "request_id", "api_request_id", "trace_id", "arrival_s", "departed_s",
    "queued_ns", "queued_step", "first_scheduled_ns", "first_scheduled_step", "n_scheduled",
    "first_token_ns", "first_token_step", "finished_ns", "finished_step", "n_preemptions",
    "prompt_tokens", "output_tokens", "max_tokens", "status", "aborted", "complete",
    "ts_backwards",
)
_FINISH_STATUS = {"stopped": "stopped", "length": "length", "aborted": "aborted",
                  "error": "error", "ignored": "error"}

_SCOPE_API, _SCOPE_CORE, _SCOPE_STEP = "vllm.api", "vllm.scheduler", "vllm.scheduler.step"
_RE_HEX8 = re.compile(r"-[0-9a-fA-F]{8}$")
_RE_INDEX = re.compile(r"-\d+$")


#: Journey attributes that are counts (never negative).
_JOURNEY_NONNEG = ("scheduler.step", "prefill.done_tokens", "prefill.total_tokens",
                   "decode.done_tokens", "decode.max_tokens", "num_preemptions")


def _step_in_range(ea: dict, rep: IngestReport) -> bool:
    """Whether a parsed ``step.BATCH_SUMMARY`` is physically possible; else count why not.

    Counts and times must be >= 0 (``out_of_range:<field>``), ``kv.usage_gpu_ratio`` within
    [0, 1] (``out_of_range:kv.usage_gpu_ratio``) and the step must not end before it starts
    (``out_of_range:step.ts_end_ns``).
    """
    for k, v in ea.items():
        if v is not None and v < 0:
            rep.drop(f"out_of_range:{k}")
            return False
    ratio = ea.get("kv.usage_gpu_ratio")
    if ratio is not None and ratio > 1.0:
        rep.drop("out_of_range:kv.usage_gpu_ratio")
        return False
    t0, t1 = ea.get("step.ts_start_ns"), ea.get("step.ts_end_ns")
    if t0 is not None and t1 is not None and t1 < t0:
        rep.drop("out_of_range:step.ts_end_ns")
        return False
    return True


class _Bad(Exception):
    """Internal: a record has a field of the wrong type (``args[0]`` = field name)."""


# ---------------------------------------------------------------------------------------------
# Typed decoding (fast path)
# ---------------------------------------------------------------------------------------------
# A line is first decoded straight into these msgspec Structs (no dicts, no GC tracking). The
# schema accepts only the shapes that the generic dict walk below handles without a special
# case of its own (e.g. an attribute value with an unknown key, a span that is not an object,
# ``events`` that is not a list); any other line is refused and takes the generic path, so both
# give the same tables and counts. Fields whose every value the generic code already tells
# apart (span name, ids, status) are typed ``Any`` and checked by the same code.
_UNSET = msgspec.UNSET
_Scalar = str | int | float | bool | None


class _AnyValue(msgspec.Struct, gc=False, forbid_unknown_fields=True):
    stringValue: _Scalar | msgspec.UnsetType = _UNSET
    intValue: _Scalar | msgspec.UnsetType = _UNSET
    doubleValue: _Scalar | msgspec.UnsetType = _UNSET
    boolValue: _Scalar | msgspec.UnsetType = _UNSET
    arrayValue: Any = _UNSET
    kvlistValue: Any = _UNSET
    bytesValue: Any = _UNSET


class _KeyValue(msgspec.Struct, gc=False):
    key: str
    value: _AnyValue | None | msgspec.UnsetType = _UNSET


class _Event(msgspec.Struct, gc=False):
    name: Any = None
    attributes: list[_KeyValue] | None = None


class _Span(msgspec.Struct, gc=False):
    traceId: Any = None
    spanId: Any = None
    parentSpanId: Any = None
    name: Any = None
    attributes: list[_KeyValue] | None = None
    events: list[_Event] | None = None
    droppedEventsCount: Any = 0
    status: Any = None


class _Scope(msgspec.Struct, gc=False):
    name: Any = None


class _ScopeSpans(msgspec.Struct, gc=False):
    scope: _Scope | None = None
    spans: list[_Span] | None = None


class _ResourceSpans(msgspec.Struct, gc=False):
    scopeSpans: list[_ScopeSpans]


class _Export(msgspec.Struct, gc=False):
    resourceSpans: list[_ResourceSpans]


_decode_typed = msgspec.json.Decoder(_Export).decode


# ---------------------------------------------------------------------------------------------
# Value coercion
# ---------------------------------------------------------------------------------------------
_USUAL_TYPE = {_INT: "intValue", _FLOAT: "doubleValue", _STR: "stringValue"}


def _to_int(raw: Any) -> int | None:
    """Coerce an OTLP attribute value to a Python int in int64 range, or None if impossible."""
    t = type(raw)
    if t is int:
        v = raw
    elif t is str:
        try:
            v = int(raw)
        except ValueError:
            try:
                f = float(raw)
            except ValueError:
                return None
            if not math.isfinite(f) or not f.is_integer():
                return None
            v = int(f)
    elif t is float:
        if not math.isfinite(raw) or not raw.is_integer():
            return None
        v = int(raw)
    else:  # bool, None, containers
        return None
    if v < _INT64_MIN or v > _INT64_MAX:
        return None
    return v


def _to_float(raw: Any) -> float | None:
    """Coerce an OTLP attribute value to a finite float, or None if impossible."""
    t = type(raw)
    if t is float or t is int:
        try:
            v = float(raw)
        except OverflowError:
            return None
    elif t is str:
        try:
            v = float(raw)
        except ValueError:
            return None
    else:
        return None
    return v if math.isfinite(v) else None


def _parse_attrs(attrs: Any, spec: dict[str, int], report: IngestReport) -> dict[str, Any]:
    """Extract the attributes named in ``spec`` from an OTLP attribute list.

    Raises
    ------
    _Bad
        With the offending field name when the list or a known attribute has the wrong type.
    """
    out: dict[str, Any] = {}
    if attrs is None:
        return out
    if type(attrs) is not list:
        raise _Bad("attributes")
    if attrs and type(attrs[0]) is _KeyValue:
        return _parse_attrs_typed(attrs, spec, report)
    spec_get = spec.get
    for kv in attrs:
        if type(kv) is not dict:
            raise _Bad("attributes")
        key = kv.get("key")
        kind = spec_get(key) if type(key) is str else None
        if kind is None or key in out:  # unknown key, or repeated key (first one wins)
            continue
        val = kv.get("value")
        if type(val) is not dict:
            raise _Bad(key)
        # fast path: the value type that the field normally has
        raw = val.get(_USUAL_TYPE[kind], _ABSENT)
        if raw is _ABSENT:
            if "intValue" in val:
                raw = val["intValue"]
            elif "doubleValue" in val:
                raw = val["doubleValue"]
            elif "stringValue" in val:
                raw = val["stringValue"]
            elif "boolValue" in val:
                raw = val["boolValue"]
            elif not val:
                continue  # empty AnyValue = unset
            elif any(k in val for k in _NON_SCALAR):
                report.drop("non_scalar_attribute")
                continue
            else:
                raise _Bad(key)
        t = type(raw)
        if kind == _INT:
            if t is str:
                try:
                    v = int(raw)
                except ValueError:
                    v = _to_int(raw)
            elif t is int:
                v = raw
            else:
                v = _to_int(raw)
            if v is None or v < _INT64_MIN or v > _INT64_MAX:
                raise _Bad(key)
        elif kind == _FLOAT:
            if t is float and raw - raw == 0.0:  # finite
                v = raw
            else:
                v = _to_float(raw)
                if v is None:
                    raise _Bad(key)
        elif t is str:
            v = raw
        else:
            raise _Bad(key)
        out[key] = v
    return out


def _parse_attrs_typed(attrs: list[_KeyValue], spec: dict[str, int],
                       report: IngestReport) -> dict[str, Any]:
    """:func:`_parse_attrs` of a typed attribute list (same values, same errors and counts)."""
    out: dict[str, Any] = {}
    spec_get = spec.get
    for kv in attrs:
        key = kv.key
        kind = spec_get(key)
        if kind is None or key in out:
            continue
        val = kv.value
        if type(val) is not _AnyValue:
            raise _Bad(key)
        raw = val.intValue if kind == _INT else (val.doubleValue if kind == _FLOAT
                                                  else val.stringValue)
        if raw is _UNSET:
            if val.intValue is not _UNSET:
                raw = val.intValue
            elif val.doubleValue is not _UNSET:
                raw = val.doubleValue
            elif val.stringValue is not _UNSET:
                raw = val.stringValue
            elif val.boolValue is not _UNSET:
                raw = val.boolValue
            elif val.arrayValue is _UNSET and val.kvlistValue is _UNSET and \
                    val.bytesValue is _UNSET:
                continue  # empty AnyValue = unset
            else:
                report.drop("non_scalar_attribute")
                continue
        t = type(raw)
        if kind == _INT:
            if t is str:
                try:
                    v = int(raw)
                except ValueError:
                    v = _to_int(raw)
            elif t is int:
                v = raw
            else:
                v = _to_int(raw)
            if v is None or v < _INT64_MIN or v > _INT64_MAX:
                raise _Bad(key)
        elif kind == _FLOAT:
            if t is float and raw - raw == 0.0:  # finite
                v = raw
            else:
                v = _to_float(raw)
                if v is None:
                    raise _Bad(key)
        elif t is str:
            v = raw
        else:
            raise _Bad(key)
        out[key] = v
    return out


def _status_code(status: Any) -> int | None:
    """OTLP span status code (``{"code": 2}``, ``"2"`` or ``"STATUS_CODE_ERROR"``), or None."""
    if type(status) is not dict:
        return None
    code = status.get("code")
    if code is None:
        return 0
    if type(code) is str:
        named = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}
        if code in named:
            return named[code]
    return _to_int(code)


# ---------------------------------------------------------------------------------------------
# Public result
# ---------------------------------------------------------------------------------------------
@dataclass
class OtlpTables:
    """Tables read from one OTLP JSON Lines trace file.

    Attributes
    ----------
    steps
        One row per ``step.BATCH_SUMMARY``: :data:`STEP_COLUMNS` (nullable ``Int64`` except
        ``kv.usage_gpu_ratio`` float) + ``experiment_id``; sorted by ``step.id``.
    journey_events
        One row per journey event: :data:`JOURNEY_COLUMNS`; sorted by request, step, time.
    requests
        One row per engine request (``llm_core`` span): :data:`REQUEST_COLUMNS`.
    snapshots
        One row per ``step.REQUEST_SNAPSHOT``: :data:`SNAPSHOT_COLUMNS`.
    api_spans
        One row per ``llm_request`` span: :data:`API_SPAN_COLUMNS`.
    report
        Counts of what was read, kept and dropped.
    """

    steps: pd.DataFrame
    journey_events: pd.DataFrame
    requests: pd.DataFrame
    snapshots: pd.DataFrame
    api_spans: pd.DataFrame
    report: IngestReport = field(default_factory=IngestReport)


# ---------------------------------------------------------------------------------------------
# Accumulator
# ---------------------------------------------------------------------------------------------
def _named_events(events: list, rep: IngestReport) -> Iterator[tuple[Any, str]]:
    """``(attributes, name)`` of the events of a span that are objects with a string name;
    others are counted drops."""
    for ev in events:
        if type(ev) is _Event:
            name = ev.name
            if type(name) is not str:
                rep.drop("bad_field:name")
                continue
            yield ev.attributes, name
            continue
        if type(ev) is not dict:
            rep.drop("bad_field:event")
            continue
        name = ev.get("name")
        if type(name) is not str:
            rep.drop("bad_field:name")
            continue
        yield ev.get("attributes"), name


def _event_attrs(attrs: Any, spec: Any, required: tuple[str, ...],
                 rep: IngestReport) -> dict | None:
    """Parsed attributes of a step event, or None after counting why it was dropped."""
    try:
        ea = _parse_attrs(attrs, spec, rep)
    except _Bad as bad:
        rep.drop(f"bad_field:{bad.args[0]}")
        return None
    for key in required:
        if key not in ea:
            rep.drop(f"missing_field:{key}")
            return None
    return ea


#: Tables the accumulator fills (attribute names of :class:`_Acc`).
_LIST_TABLES = ("steps", "snaps", "je", "api")
_I, _F, _O, _B, _T = "Int64", "float64", "object", "bool", "int64"
#: Kind of each accumulated column: nullable Int64, float64 (NaN = null), object, bool, int64.
_COLUMN_KIND: dict[str, str] = {
    **{c: _I for c in STEP_INT_COLUMNS}, "kv.usage_gpu_ratio": _F,
    **{c: _I for c in _SNAPSHOT_ATTRS}, "request.phase": _O, "step_id": _I, "request_id": _O,
    "event": _O, "ts_monotonic_ns": _T, **{c: _I for c in _JOURNEY_INT},
    **{c: _O for c in _JOURNEY_STR},
    **{c: _O for c in ("api_request_id", "trace_id", "span_id", "http_route", "model",
                       "abort_reason")},
    **{c: _I for c in ("prompt_tokens", "max_tokens", "n", "status_code")},
    **{c: _F for c in ("temperature", "top_p", "arrival_s", "handoff_s", "first_response_s",
                       "departed_s", "aborted_s")},
    "aborted": _B,
}


def _typed_column(kind: str, values: list) -> Any:
    """A column list (None = null) as the typed array the tables are built from: Int64 ->
    ``IntegerArray``, float64 -> ndarray with NaN, object / bool / int64 -> ndarray."""
    if kind == _I:
        return pd.array(values, dtype="Int64")
    if kind == _F:
        return np.asarray([np.nan if x is None else x for x in values], dtype=float)
    if kind == _O:
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out
    return np.asarray(values, dtype=bool if kind == _B else np.int64)


def _int_column(data: np.ndarray, present: np.ndarray) -> pd.arrays.IntegerArray:
    """``IntegerArray`` of int64 ``data`` where ``present`` (null elsewhere; the hidden value
    under the mask is 1, as ``pd.array`` sets it)."""
    data = np.where(present, data, 1).astype(np.int64, copy=False)
    return pd.arrays.IntegerArray(data, ~present)


def _concat_columns(parts: list) -> Any:
    """Concatenation of typed column segments (one kind)."""
    if len(parts) == 1:
        return parts[0]
    if isinstance(parts[0], pd.arrays.IntegerArray):
        return pd.arrays.IntegerArray(np.concatenate([p._data for p in parts]),
                                      np.concatenate([p._mask for p in parts]))
    return np.concatenate(parts)


class _Acc:
    """Column lists filled while streaming; turned into DataFrames by :meth:`tables`."""

    def __init__(self, source: str, report: IngestReport) -> None:
        self.source = source
        self.report = report
        self.seen_spans: set[tuple[str, str]] = set()
        self.steps: dict[str, list] = {c: [] for c in STEP_COLUMNS}
        self.snaps: dict[str, list] = {c: [] for c in ("step_id", "request_id") + _SNAPSHOT_ATTRS}
        self.je: dict[str, list] = {c: [] for c in JOURNEY_COLUMNS if c != "experiment_id"}
        self.api: dict[str, list] = {c: [] for c in API_SPAN_COLUMNS
                                     if c not in ("experiment_id", "request_id")}
        # core spans: request_id -> (span key for ordering, trace_id, span_id, parent_span_id)
        self.cores: dict[str, tuple[str, str, str | None]] = {}
        # journey rows of each core span: (request_id, (trace_id, span_id), first row, end row)
        self.core_rows: list[tuple[str, tuple[str, str], int, int]] = []
        # core spans that lost a journey event to a bad / out-of-range field
        self.damaged: set[tuple[str, str, str]] = set()
        # request index and event rank of each sorted journey row (set by _journey_table)
        self._je_row: np.ndarray | None = None
        self._je_rank: np.ndarray | None = None
        # typed column segments (file order): the lists above flushed by _flush, and the
        # columns of chunks read by the columnar path (data/otlp_arrow.py); one dict per segment
        self._segs: dict[str, list[dict[str, Any]]] = {t: [] for t in _LIST_TABLES}
        self._je_base = 0  # journey rows already in segments (core_rows count from there)

    # -- column segments -----------------------------------------------------------------------
    def _flush(self) -> None:
        """Move the column lists filled so far into typed segments (same values as building
        the tables from the lists)."""
        for name in _LIST_TABLES:
            cols = getattr(self, name)
            n = len(next(iter(cols.values())))
            if not n:
                continue
            self._segs[name].append({c: _typed_column(_COLUMN_KIND[c], v)
                                     for c, v in cols.items()})
            setattr(self, name, {c: [] for c in cols})
            if name == "je":
                self._je_base += n

    def add_segment(self, name: str, cols: dict[str, Any]) -> None:
        """Append typed columns (file order) to table ``name`` (``steps``, ``snaps``, ``je``,
        ``api``); columns as :func:`_typed_column` makes them."""
        self._flush()
        n = len(next(iter(cols.values())))
        if n:
            self._segs[name].append(cols)
            if name == "je":
                self._je_base += n

    def add_chunk(self, cols: Any) -> None:
        """Add the columns of a chunk read by :func:`bayes_latency.data.otlp_arrow.read_chunk`
        (its spans are new: the caller checked ``seen_spans``)."""
        rep = self.report
        for k, v in cols.read.items():
            if v:
                rep.read[k] += v
        self.seen_spans.update(cols.span_keys)
        self._flush()
        base = self._je_base
        for name in _LIST_TABLES:
            self.add_segment(name, getattr(cols, name))
        cores = self.cores
        for rid, trace_id, span_id, parent, a, b in cols.cores:
            prev = cores.get(rid)
            if prev is None or (trace_id, span_id) < (prev[0], prev[1]):
                cores[rid] = (trace_id, span_id, parent)
            self.core_rows.append((rid, (trace_id, span_id), base + a, base + b))

    def _concat(self) -> None:
        """Replace the column lists by the concatenated typed columns of every segment."""
        self._flush()
        for name in _LIST_TABLES:
            segs = self._segs[name]
            cols = getattr(self, name)
            if not segs:
                setattr(self, name, {c: _typed_column(_COLUMN_KIND[c], []) for c in cols})
                continue
            setattr(self, name, {c: _concat_columns([s[c] for s in segs]) for c in cols})
            self._segs[name] = []

    # -- dispatch ----------------------------------------------------------------------------
    def span(self, sp: Any, scope: Any) -> None:
        rep = self.report
        rep.read["spans"] += 1
        if type(sp) is _Span:
            name, trace_id, span_id, events = sp.name, sp.traceId, sp.spanId, sp.events
            span_attrs, parent, status = sp.attributes, sp.parentSpanId, sp.status
            dropped_ev = sp.droppedEventsCount
        elif type(sp) is not dict:
            rep.drop("bad_field:span")
            return
        else:
            name, trace_id, span_id, events = (sp.get("name"), sp.get("traceId"),
                                               sp.get("spanId"), sp.get("events"))
            span_attrs, parent, status = (sp.get("attributes"), sp.get("parentSpanId"),
                                          sp.get("status"))
            dropped_ev = sp.get("droppedEventsCount", 0)
        if type(scope) is not str:
            # no usable scope name: fall back on the span name
            if name == "llm_request":
                scope = _SCOPE_API
            elif name == "llm_core":
                scope = _SCOPE_CORE
            elif type(name) is str and name.startswith("scheduler_steps"):
                scope = _SCOPE_STEP
        if scope not in (_SCOPE_API, _SCOPE_CORE, _SCOPE_STEP):
            rep.drop("unknown_scope")
            return
        if type(trace_id) is not str:
            rep.drop("bad_field:traceId")
            return
        if type(span_id) is not str:
            rep.drop("bad_field:spanId")
            return
        if events is None:
            events = []
        elif type(events) is not list:
            rep.drop("bad_field:events")
            return
        key = (trace_id, span_id)
        if key in self.seen_spans:
            rep.drop("duplicate_span")
            return
        try:
            if scope == _SCOPE_API:
                attrs = _parse_attrs(span_attrs, _API_SPEC, rep)
            elif scope == _SCOPE_CORE:
                attrs = _parse_attrs(span_attrs, _CORE_SPEC, rep)
            else:
                attrs = {}
            if parent is not None and type(parent) is not str:
                raise _Bad("parentSpanId")
        except _Bad as bad:
            rep.drop(f"bad_field:{bad.args[0]}")
            return
        self.seen_spans.add(key)
        dropped_ev = _to_int(dropped_ev)
        if dropped_ev:
            rep.drop("sdk_dropped_events", max(dropped_ev, 0))
        rep.read["events"] += len(events)
        if scope == _SCOPE_API:
            rep.read["api_spans"] += 1
            self._api_span(status, attrs, trace_id, span_id, events)
        elif scope == _SCOPE_CORE:
            rep.read["core_spans"] += 1
            self._core_span(attrs, trace_id, span_id, parent or None, events)
        else:
            rep.read["step_spans"] += 1
            self._step_span(events)

    # -- vllm.api ------------------------------------------------------------------------------
    def _api_span(self, status: Any, attrs: dict, trace_id: str, span_id: str,
                  events: list) -> None:
        rep = self.report
        times: dict[str, float | None] = {}
        reason = None
        for ev_attrs, name in _named_events(events, rep):
            if name not in _API_EVENTS:
                rep.drop("unknown_event")
                continue
            try:
                ea = _parse_attrs(ev_attrs, _API_EVENT_SPEC, rep)
            except _Bad as bad:
                rep.drop(f"bad_field:{bad.args[0]}")
                continue
            if name in times:
                rep.drop("duplicate_event")
                continue
            t_ev = ea.get("event.ts.monotonic")
            if t_ev is not None and t_ev < 0:
                rep.drop("out_of_range:event.ts.monotonic")
                continue
            times[name] = t_ev
            if name == "api.ABORTED":
                reason = ea.get("reason")
        code = _status_code(status)
        a = self.api
        a["api_request_id"].append(attrs.get("gen_ai.request.id"))
        a["trace_id"].append(trace_id)
        a["span_id"].append(span_id)
        a["http_route"].append(attrs.get("http.route"))
        a["model"].append(attrs.get("gen_ai.response.model"))
        a["prompt_tokens"].append(attrs.get("gen_ai.usage.prompt_tokens"))
        a["max_tokens"].append(attrs.get("gen_ai.request.max_tokens"))
        a["n"].append(attrs.get("gen_ai.request.n"))
        a["temperature"].append(attrs.get("gen_ai.request.temperature"))
        a["top_p"].append(attrs.get("gen_ai.request.top_p"))
        a["arrival_s"].append(times.get("api.ARRIVED"))
        a["handoff_s"].append(times.get("api.HANDOFF_TO_CORE"))
        a["first_response_s"].append(times.get("api.FIRST_RESPONSE_FROM_CORE"))
        a["departed_s"].append(times.get("api.DEPARTED"))
        a["aborted_s"].append(times.get("api.ABORTED"))
        a["abort_reason"].append(reason)
        a["status_code"].append(code)
        a["aborted"].append(code == 2 or "api.ABORTED" in times)

    # -- vllm.scheduler ------------------------------------------------------------------------
    def _core_span(self, attrs: dict, trace_id: str, span_id: str, parent: str | None,
                   events: list) -> None:
        rep = self.report
        rid = attrs.get("gen_ai.request.id")
        if rid is None:
            rep.drop_record("requests", "missing_field:gen_ai.request.id")
            return
        prev = self.cores.get(rid)
        if prev is None or (trace_id, span_id) < (prev[0], prev[1]):
            self.cores[rid] = (trace_id, span_id, parent)
        je = self.je
        start = self._je_base + len(je["event"])
        dkey = (rid, trace_id, span_id)
        for ev_attrs, name in _named_events(events, rep):
            try:
                ea = _parse_attrs(ev_attrs, _JOURNEY_SPEC, rep)
            except _Bad as bad:
                rep.drop(f"bad_field:{bad.args[0]}")
                self.damaged.add(dkey)
                continue
            etype = name[8:] if name.startswith("journey.") else ea.get("event.type")
            if etype not in _EVENT_RANK:
                rep.drop("unknown_event")
                continue
            ts = ea.get("ts.monotonic_ns")
            if ts is None:
                sec = ea.get("ts.monotonic")
                if sec is None:
                    rep.drop("missing_field:ts.monotonic_ns")
                    continue
                ts = round(sec * 1e9)
                if ts < _INT64_MIN or ts > _INT64_MAX:
                    rep.drop("bad_field:ts.monotonic")
                    self.damaged.add(dkey)
                    continue
            neg = "ts.monotonic_ns" if ts < 0 else None
            if neg is None:
                for a in _JOURNEY_NONNEG:
                    v = ea.get(a)
                    if v is not None and v < 0:
                        neg = a
                        break
            if neg is not None:
                rep.drop(f"out_of_range:{neg}")
                self.damaged.add(dkey)
                continue
            je["request_id"].append(rid)
            je["event"].append(etype)
            je["ts_monotonic_ns"].append(ts)
            for attr, col in _JOURNEY_MAP:
                je[col].append(ea.get(attr))
        self.core_rows.append((rid, (trace_id, span_id), start,
                               self._je_base + len(je["event"])))

    # -- vllm.scheduler.step ---------------------------------------------------------------------
    def _step_span(self, events: list) -> None:
        rep = self.report
        steps, snaps = self.steps, self.snaps
        for ev_attrs, name in _named_events(events, rep):
            if name == "step.BATCH_SUMMARY":
                rep.read["step_summaries"] += 1
                ea = _event_attrs(ev_attrs, _STEP_SPEC, ("step.id",), rep)
                if ea is None or not _step_in_range(ea, rep):
                    rep.lost["steps"] += 1
                    continue
                for c in STEP_COLUMNS:
                    steps[c].append(ea.get(c))
            elif name == "step.REQUEST_SNAPSHOT":
                ea = _event_attrs(ev_attrs, _SNAPSHOT_SPEC, ("step.id", "request.id"), rep)
                if ea is None:
                    continue
                neg = next((k for k, v in ea.items() if type(v) is int and v < 0), None)
                if neg is not None:
                    rep.drop(f"out_of_range:{neg}")
                    continue
                snaps["step_id"].append(ea["step.id"])
                snaps["request_id"].append(ea["request.id"])
                for c in _SNAPSHOT_ATTRS:
                    snaps[c].append(ea.get(c))
            else:
                rep.drop("unknown_event")

    # -- final tables --------------------------------------------------------------------------
    def tables(self, experiment_id: str) -> OtlpTables:
        rep = self.report
        self._concat()
        steps = self._steps_table(experiment_id)
        snaps = self._snapshots_table(experiment_id)
        self._drop_duplicate_request_ids()
        je = self._journey_table(experiment_id)
        api = self._api_table(experiment_id)
        requests = self._requests_table(experiment_id, je, api)
        rep.kept["steps"] += len(steps)
        rep.kept["snapshots"] += len(snaps)
        rep.kept["journey_events"] += len(je)
        rep.kept["requests"] += len(requests)
        rep.kept["api_spans"] += len(api)
        return OtlpTables(steps=steps, journey_events=je, requests=requests, snapshots=snaps,
                          api_spans=api, report=rep)

    def _drop_duplicate_request_ids(self) -> None:
        """Keep one core span per ``gen_ai.request.id`` (the smallest (traceId, spanId), as for
        the requests table); drop the journey events of the others, counted
        ``duplicate_request_id`` (spans) and ``duplicate_request_id:events``."""
        rep = self.report
        extra = [(rid, key, a, b) for rid, key, a, b in self.core_rows
                 if key != self.cores[rid][:2]]
        if not extra:
            return
        rep.drop_record("requests", "duplicate_request_id", len(extra))
        for rid, key, _a, _b in extra[:5]:
            rep.notes.append(f"duplicate_request_id: {rid} (span {key[1]} of trace {key[0]} "
                             f"dropped; one request kept per id)")
        keep = np.ones(len(self.je["event"]), dtype=bool)
        for _rid, _key, a, b in extra:
            keep[a:b] = False
        if (~keep).any():
            rep.drop("duplicate_request_id:events", int((~keep).sum()))
            idx = np.flatnonzero(keep)
            self.je = {c: v[idx] for c, v in self.je.items()}

    def _steps_table(self, experiment_id: str) -> pd.DataFrame:
        cols = dict(self.steps)
        order = _key_order([cols["step.id"]])
        if order is not None:  # no repeated step id: the sort by step.id alone decides
            df = pd.DataFrame({c: v[order] for c, v in cols.items()})
            df["experiment_id"] = _str_repeat(experiment_id, len(df))
            return df
        df = pd.DataFrame(cols)
        df["experiment_id"] = _str_repeat(experiment_id, len(df))
        if len(df):
            df = _sort_all(df, first=["step.id"])
            dup = df.duplicated(subset=["step.id"], keep="first")
            if dup.any():
                self.report.drop_record("steps", "duplicate_step", int(dup.sum()))
                df = df[~dup]
        return df.reset_index(drop=True)

    def _snapshots_table(self, experiment_id: str) -> pd.DataFrame:
        s = self.snaps
        cols: dict[str, Any] = {
            "experiment_id": _str_repeat(experiment_id, len(s["step_id"])),
            "step_id": pd.array(s["step_id"], dtype="Int64"),
            "request_id": _str_series(s["request_id"]),
        }
        for c in _SNAPSHOT_ATTRS:
            cols[c] = (pd.Series(s[c], dtype="object") if c == "request.phase"
                       else pd.array(s[c], dtype="Int64"))
        order = _key_order([s["step_id"], s["request_id"]])
        if order is not None:  # no repeated (step, request): sorted by them alone
            return pd.DataFrame({c: v.take(order) for c, v in cols.items()}).reset_index(
                drop=True)
        df = pd.DataFrame(cols)
        if len(df):
            df = _sort_all(df, first=["step_id", "request_id"])
            dup = df.duplicated(subset=["step_id", "request_id"], keep="first")
            if dup.any():
                self.report.drop("duplicate_snapshot", int(dup.sum()))
                df = df[~dup]
        return df.reset_index(drop=True)

    def _journey_table(self, experiment_id: str) -> pd.DataFrame:
        j = self.je
        n = len(j["event"])
        self._je_row = self._je_rank = None
        fast = self._journey_order(j) if n else None
        if fast is not None:
            order, row, rank = fast
            # the once-per-request events: only the first of each request is kept (with no
            # tie on (request, step, ts, rank), no row repeats (request, event, step, ts))
            key = row * len(JOURNEY_EVENTS) + rank
            once = np.isin(rank, [_EVENT_RANK[e] for e in _ONCE_EVENTS])
            bad = np.zeros(n, dtype=bool)
            if once.any():
                first = np.zeros(int(once.sum()), dtype=bool)
                first[np.unique(key[once], return_index=True)[1]] = True
                bad[np.flatnonzero(once)[~first]] = True
            if bad.any():
                self.report.drop("duplicate_event", int(bad.sum()))
                order, row, rank = order[~bad], row[~bad], rank[~bad]
            self._je_row, self._je_rank = row, rank
            # the columns taken in that order before the frame is built (same frame as
            # building it and taking its rows)
            return _journey_frame({c: v[order] for c, v in j.items()}, experiment_id)
        df = _journey_frame(j, experiment_id)
        if n == 0:
            return df
        df["_rank"] = df["event"].map(_EVENT_RANK).astype(np.int64)
        df = _sort_all(df, first=["request_id", "step", "ts_monotonic_ns", "_rank"])
        dup = df.duplicated(subset=["request_id", "event", "step", "ts_monotonic_ns"])
        once = df["event"].isin(_ONCE_EVENTS) & df.duplicated(subset=["request_id", "event"])
        bad = dup | once
        if bad.any():
            self.report.drop("duplicate_event", int(bad.sum()))
            df = df[~bad]
        return df.drop(columns="_rank").reset_index(drop=True)

    def _journey_order(self, j: dict[str, list]) -> tuple[np.ndarray, ...] | None:
        """Sort order of the journey rows by (request, step (nulls first), ts, event rank) and
        each sorted row's request index (in ``sorted(self.cores)``) and event rank; None when
        two rows tie on those keys (the pandas sort then orders them by every column)."""
        row = pd.Index(sorted(self.cores)).get_indexer(j["request_id"]).astype(np.int64)
        rank = pd.Index(JOURNEY_EVENTS).get_indexer(j["event"]).astype(np.int64)
        steps = pd.array(j["step"], dtype="Int64")
        has_step = ~steps._mask
        step = np.where(has_step, steps._data, 0)
        ts = np.asarray(j["ts_monotonic_ns"], dtype=np.int64)
        order = np.lexsort((rank, ts, step, has_step, row))
        if _has_ties((row, has_step, step, ts, rank), order):
            return None
        return order, row[order], rank[order]

    def _api_table(self, experiment_id: str) -> pd.DataFrame:
        a = self.api
        n = len(a["span_id"])
        cols: dict[str, Any] = {"experiment_id": _str_repeat(experiment_id, n)}
        for c in API_SPAN_COLUMNS[1:-1]:
            v = a[c]
            if c in ("prompt_tokens", "max_tokens", "n", "status_code"):
                cols[c] = pd.array(v, dtype="Int64")
            elif c in ("temperature", "top_p", "arrival_s", "handoff_s", "first_response_s",
                       "departed_s", "aborted_s"):
                cols[c] = np.asarray(v, dtype=float)
            elif c == "aborted":
                cols[c] = np.asarray(v, dtype=bool)
            else:
                cols[c] = pd.Series(v, dtype="object")
        cols["request_id"] = pd.Series([None] * n, dtype="object")
        order = _key_order([a["trace_id"], a["span_id"]])
        if order is not None:  # (trace, span) are unique: their order is the sort
            return pd.DataFrame({c: v.take(order) for c, v in cols.items()}).reset_index(
                drop=True)
        df = pd.DataFrame(cols)
        if n:
            df = df.sort_values(["trace_id", "span_id"], kind="stable").reset_index(drop=True)
        return df

    def _requests_table(self, experiment_id: str, je: pd.DataFrame,
                        api: pd.DataFrame) -> pd.DataFrame:
        rep = self.report
        rids = sorted(self.cores)
        n = len(rids)
        # ---- join engine spans to API spans ----
        # by the parent span id (first API span of each span id, with pandas' hash table), then
        # for the requests without one by the request id (Python, usually none)
        api_idx = np.full(n, -1, dtype=np.int64)
        parents = [self.cores[r][2] for r in rids]
        if len(api) and n:
            span_ix = pd.Index(api["span_id"].to_numpy(dtype=object))
            first = ~span_ix.duplicated(keep="first")
            at = np.flatnonzero(first)
            has_parent = np.fromiter((bool(x) and isinstance(x, str) for x in parents),
                                     dtype=bool, count=n)
            if has_parent.any():
                found = span_ix[first].get_indexer(
                    np.asarray(parents, dtype=object)[has_parent])
                api_idx[has_parent] = np.where(found >= 0, at[np.maximum(found, 0)], -1)
        if (api_idx < 0).any():
            api_by_span: dict[str, int] = {}
            api_by_id: dict[str, int] = {}
            for i, (sid, aid) in enumerate(zip(api["span_id"].tolist(),
                                               api["api_request_id"].tolist(), strict=True)):
                api_by_span.setdefault(sid, i)
                if isinstance(aid, str):
                    api_by_id.setdefault(aid, i)
            for k in np.flatnonzero(api_idx < 0).tolist():
                rid, parent = rids[k], parents[k]
                i = api_by_span.get(parent, -1) if parent else -1
                if i < 0:
                    base = _RE_HEX8.sub("", rid)
                    i = api_by_id.get(base, -1)
                    if i < 0 and base.startswith("cmpl-"):
                        i = api_by_id.get(_RE_INDEX.sub("", base), -1)
                api_idx[k] = i
        joined = api_idx >= 0
        if len(api):
            engine_of_api = np.full(len(api), None, dtype=object)
            for k in np.flatnonzero(joined):
                if engine_of_api[api_idx[k]] is None:
                    engine_of_api[api_idx[k]] = rids[k]
            api["request_id"] = pd.Series(engine_of_api, dtype="object")
            n_api_only = int(pd.isna(api["request_id"]).sum())
            if n_api_only:
                rep.kept["api_only_span"] += n_api_only
        if n - int(joined.sum()):
            rep.kept["core_without_api"] += n - int(joined.sum())

        take = np.where(joined, api_idx, 0)

        def from_api(col: str, default: Any) -> np.ndarray:
            """``api[col]`` of each request's API span, ``default`` without one."""
            vals = api[col].to_numpy(dtype=object) if len(api) else np.array([], dtype=object)
            out = np.full(n, default, dtype=object)
            if len(api):
                out[joined] = vals[take[joined]]
            return out

        def int_from_api(col: str) -> pd.arrays.IntegerArray:
            if not len(api):
                return pd.array([None] * n, dtype="Int64")
            return api[col].array.take(np.where(joined, api_idx, -1), allow_fill=True)

        def float_from_api(col: str) -> np.ndarray:
            if not len(api):
                return np.full(n, np.nan)
            return np.where(joined, api[col].to_numpy(dtype=float)[take], np.nan)

        # columns collected in a dict, one DataFrame constructor at the end (inserting ~20
        # columns one by one cost more than all the rest of this function)
        out: dict[str, Any] = {
            "experiment_id": _str_repeat(experiment_id, n),
            "request_id": _str_series(rids),
            "api_request_id": pd.Series(from_api("api_request_id", None), dtype="object"),
            "trace_id": _str_series([self.cores[r][0] for r in rids]),
            "arrival_s": float_from_api("arrival_s"),
            "departed_s": float_from_api("departed_s"),
        }
        api_aborted = (np.where(joined, api["aborted"].to_numpy(dtype=bool)[take], False)
                       if len(api) else np.zeros(n, dtype=bool))
        api_prompt = int_from_api("prompt_tokens")
        api_max = int_from_api("max_tokens")

        # ---- per-request facts from the journey (je is sorted and deduplicated) ----
        if self._je_row is not None and len(self._je_row) == len(je):
            je_row, je_rank = self._je_row, self._je_rank
        else:
            pos = {r: k for k, r in enumerate(rids)}
            je_row = np.fromiter((pos[r] for r in je["request_id"].tolist()), dtype=np.int64,
                                 count=len(je))
            je_rank = np.fromiter((_EVENT_RANK[e] for e in je["event"].tolist()),
                                  dtype=np.int64, count=len(je))
        # first row of each (request, event) in journey order
        first_idx = np.unique(je_row * len(JOURNEY_EVENTS) + je_rank, return_index=True)[1]
        row_of, rank_of = je_row[first_idx], je_rank[first_idx]

        def scatter(rows: np.ndarray, idx: np.ndarray, col: str) -> pd.arrays.IntegerArray:
            """Int64 column of the requests: ``je[col]`` at journey rows ``idx`` for requests
            ``rows``, null elsewhere."""
            data = np.zeros(n, dtype=np.int64)
            mask = np.ones(n, dtype=bool)
            if len(idx):
                src = je[col].array
                if isinstance(src, pd.arrays.IntegerArray):
                    data[rows], mask[rows] = src._data[idx], src._mask[idx]
                else:
                    data[rows], mask[rows] = np.asarray(src, dtype=np.int64)[idx], False
            data[mask] = 0
            return pd.arrays.IntegerArray(data, mask)

        def first_of(event: str, col: str) -> pd.arrays.IntegerArray:
            sel = rank_of == _EVENT_RANK[event]
            return scatter(row_of[sel], first_idx[sel], col)

        for event, prefix in (("QUEUED", "queued"), ("SCHEDULED", "first_scheduled"),
                              ("FIRST_TOKEN", "first_token"), ("FINISHED", "finished")):
            out[f"{prefix}_ns"] = first_of(event, "ts_monotonic_ns")
            out[f"{prefix}_step"] = first_of(event, "step")
        def count_of(event: str) -> np.ndarray:
            return np.bincount(je_row[je_rank == _EVENT_RANK[event]], minlength=n).astype(np.int64)

        n_sched, n_pre_ev = count_of("SCHEDULED"), count_of("PREEMPTED")
        max_pre = np.zeros(n, dtype=np.int64)
        npre = je["num_preemptions"].to_numpy(dtype=float, na_value=np.nan)
        ok = ~np.isnan(npre)
        np.maximum.at(max_pre, je_row[ok], npre[ok].astype(np.int64))
        out["n_scheduled"] = n_sched
        out["n_preemptions"] = np.maximum(n_pre_ev, max_pre)

        def first_non_null(col: str) -> pd.arrays.IntegerArray:
            idx = np.flatnonzero(je[col].notna().to_numpy())
            idx = idx[np.unique(je_row[idx], return_index=True)[1]]
            return scatter(je_row[idx], idx, col)

        prompt = first_non_null("prefill_total")
        out["prompt_tokens"] = pd.array(np.where(prompt.isna(), api_prompt, prompt),
                                        dtype="Int64")
        out["output_tokens"] = first_of("FINISHED", "decode_done")
        mx = first_non_null("decode_max")
        out["max_tokens"] = pd.array(np.where(mx.isna(), api_max, mx), dtype="Int64")
        fin_list = np.full(n, None, dtype=object)
        sel = rank_of == _EVENT_RANK["FINISHED"]
        fin_list[row_of[sel]] = je["finish_status"].to_numpy(dtype=object)[first_idx[sel]]
        has = {e: count_of(e) > 0 for e in ("QUEUED", "SCHEDULED", "FIRST_TOKEN", "FINISHED")}
        complete = has["QUEUED"] & has["SCHEDULED"] & has["FIRST_TOKEN"] & has["FINISHED"]
        # a request that lost a journey event to a bad field is not complete: its first
        # SCHEDULED (say) would silently become a later one
        damaged = (np.asarray([(r, *self.cores[r][:2]) in self.damaged for r in rids],
                              dtype=bool) if self.damaged else np.zeros(n, dtype=bool))
        # max_tokens 0 cannot produce a token: the journey contradicts itself
        mx_arr = out["max_tokens"].to_numpy(dtype=float, na_value=np.nan)
        impossible = (mx_arr == 0) & has["FIRST_TOKEN"]
        for name, mask in (("damaged_request", damaged),
                           ("inconsistent_request:max_tokens_0", impossible)):
            if mask.any():
                rep.kept[name] += int(mask.sum())
                rep.notes.append(f"{name}: {int(mask.sum())} request(s) marked incomplete "
                                 f"(e.g. {rids[int(np.flatnonzero(mask)[0])]})")
        complete = complete & ~damaged & ~impossible
        aborted = api_aborted | np.asarray([s == "aborted" for s in fin_list], dtype=bool)
        status = np.where(aborted, "aborted", "incomplete").astype(object)
        fin_ok = ~aborted & complete
        mapped = [_FINISH_STATUS.get(f) if isinstance(f, str) else None
                  for f in fin_list[fin_ok].tolist()]
        status[fin_ok] = mapped
        for k in np.flatnonzero(fin_ok)[[m is None for m in mapped]].tolist():
            # unknown or missing finish.status: kept as error, counted
            rep.kept["unknown_finish_status"] += 1
            if rep.kept["unknown_finish_status"] <= 5:
                rep.notes.append(f"unknown_finish_status: {fin_list[k]!r} of "
                                 f"{rids[k]} (status set to 'error')")
            status[k] = "error"
        out["status"] = _str_series(status)
        out["aborted"] = aborted
        out["complete"] = complete
        # ---- timestamps going backwards along the (step, ts) order ----
        back = np.zeros(n, dtype=bool)
        if len(je):
            ts = je["ts_monotonic_ns"].to_numpy(dtype=np.int64)
            dec = np.zeros(len(je), dtype=bool)
            dec[1:] = (ts[1:] < ts[:-1]) & (je_row[1:] == je_row[:-1])
            back[je_row[dec]] = True
        out["ts_backwards"] = back
        for name, cnt in (("incomplete_request", int(((~complete) & (~aborted)).sum())),
                          ("aborted_request", int(aborted.sum())),
                          ("ts_backwards", int(back.sum()))):
            if cnt:
                rep.kept[name] += cnt
        return pd.DataFrame(out)[list(REQUEST_COLUMNS)]


def _str_series(values: Any) -> pd.Series:
    """``pd.Series(values, dtype="str")`` for a list or object array of str (None missing), by
    one pyarrow conversion: pandas' own checks every value in Python first (on the demo fleet
    0.10 of the reader's 1.3 CPU-s). Anything else takes pandas' way."""
    import pyarrow as pa

    try:
        arr = pa.array(values, type=pa.string(), from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, UnicodeError):
        return pd.Series(values, dtype="str")
    return pd.Series(pd.array(arr, dtype="str"), copy=False)


def _str_repeat(value: str, n: int) -> pd.Series:
    """``pd.Series([value] * n, dtype="str")`` without the list."""
    import pyarrow as pa

    return pd.Series(pd.array(pa.repeat(pa.scalar(str(value), pa.string()), n), dtype="str"),
                     copy=False)


def _journey_frame(j: dict[str, Any], experiment_id: str) -> pd.DataFrame:
    """The journey_events frame of typed journey columns, in their order."""
    n = len(j["event"])
    cols: dict[str, Any] = {
        "experiment_id": _str_repeat(experiment_id, n),
        "request_id": _str_series(j["request_id"]),
        "event": _str_series(j["event"]),
        "ts_monotonic_ns": np.asarray(j["ts_monotonic_ns"], dtype=np.int64),
    }
    for c in _JOURNEY_INT:
        cols[c] = pd.array(j[c], dtype="Int64")
    for c in _JOURNEY_STR:
        cols[c] = pd.Series(j[c], dtype="object")
    return pd.DataFrame(cols)[list(JOURNEY_COLUMNS)]


def _key_order(keys: list[Any]) -> np.ndarray | None:
    """Ascending order of rows by ``keys`` (Int64 arrays, or object arrays of str), or None when
    a key has a null or two rows tie on all keys (callers then sort with pandas by every
    column). Strings compare by code point, as pandas sorts them."""
    codes = []
    for k in keys:
        if isinstance(k, pd.arrays.IntegerArray):
            if k._mask.any():
                return None
            codes.append(k._data)
        else:
            try:
                codes.append(np.unique(np.asarray(k, dtype=object), return_inverse=True)[1])
            except TypeError:  # None among the strings
                return None
    order = np.lexsort(codes[::-1])
    if _has_ties(codes, order):
        return None
    return order


def _has_ties(keys: Sequence[np.ndarray], order: np.ndarray) -> bool:
    """Whether two rows agree on every key (``order`` sorts the rows by the keys, so such rows
    are adjacent); the callers then fall back to their row-wise path."""
    if len(order) < 2:
        return False
    same = np.ones(len(order) - 1, dtype=bool)
    for k in keys:
        ks = np.asarray(k)[order]
        same &= ks[1:] == ks[:-1]
    return bool(same.any())


def _sort_all(df: pd.DataFrame, first: list[str]) -> pd.DataFrame:
    """Sort by ``first`` then by every other column (deterministic, independent of input order).

    The other columns only matter for rows tied on ``first``, so they are used only when ties
    exist (sorting by many object columns is slow).
    """
    df = df.sort_values(first, kind="stable", na_position="first")
    if df.duplicated(subset=first).any():
        rest = [c for c in df.columns if c not in first]
        df = df.sort_values(first + rest, kind="stable", na_position="first")
    return df


def _default_experiment_id(path: Path) -> str:
    """``EXP`` for ``EXP/traces.jsonl`` (experiment folder layout), else the file stem."""
    if path.name.startswith("traces.") and path.parent.name:
        return path.parent.name
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    return Path(name).stem


#: Bytes of whole lines handed to the columnar path (:mod:`bayes_latency.data.otlp_arrow`) at a
#: time, the default of :func:`read_otlp`; 0 turns it off (every line read line by line).
CHUNK_BYTES = 4 << 20


def _iter_docs(path: Path, acc: _Acc, chunk_bytes: int | None) -> Iterator[tuple[int, Any]]:
    """``(line number, decoded line)`` of the lines the line-by-line path reads, and ``(number of
    lines, None)`` for each chunk the columnar path has put into ``acc``."""
    if not chunk_bytes:
        yield from iter_json_lines(path, acc.report, typed=_decode_typed)
        return
    from bayes_latency.data.otlp_arrow import read_chunk

    rep = acc.report
    for first, buf, starts in iter_line_chunks(path, chunk_bytes, split=False):
        n_blank, objects = 0, True
        for k, a in enumerate(starts):
            if buf[a:a + 1] != b"{":
                end = starts[k + 1] - 1 if k + 1 < len(starts) else len(buf)
                stripped = buf[a:end].strip()
                if not stripped:
                    n_blank += 1
                elif stripped[:1] != b"{":
                    objects = False  # e.g. a 'null' line (which pyarrow.json cannot take)
        n = len(starts) - n_blank
        cols = read_chunk(buf, n) if n and objects else None
        if cols is not None and acc.seen_spans.isdisjoint(cols.span_keys):
            rep.read["lines"] += n
            if n_blank:
                rep.read["blank_lines"] += n_blank
            acc.add_chunk(cols)
            yield n, None
            continue
        lines = buf.split(b"\n")
        if buf.endswith(b"\n"):
            lines.pop()
        for lineno, raw in enumerate(lines, start=first):
            doc = decode_line(raw, lineno, path, rep, _decode_typed)
            if doc is not SKIP:
                yield lineno, doc


def read_otlp(path: str | Path, experiment_id: str | None = None,
              report: IngestReport | None = None,
              chunk_bytes: int | None = None) -> OtlpTables:
    """Read an OTLP JSON Lines trace file (journey + step tracing) into tables.

    Parameters
    ----------
    path
        ``traces.jsonl`` / ``traces.json`` (optionally gzip-compressed, ``.gz``).
    experiment_id
        Value of the ``experiment_id`` column; default: the parent folder name for
        ``EXP/traces.*``, else the file stem.
    report
        Report to add counts to (a new one if None); also returned as ``tables.report``.
    chunk_bytes
        Size of the chunks of lines tried on the columnar path (:mod:`.otlp_arrow`; default
        :data:`CHUNK_BYTES`); a chunk it refuses, or every line when 0, is read line by line.
        Same tables and counts either way.

    Returns
    -------
    OtlpTables
        ``steps``, ``journey_events``, ``requests``, ``snapshots``, ``api_spans`` and ``report``.

    Raises
    ------
    TraceFormatError
        If the file cannot be read or holds no valid OTLP line.
    """
    path = Path(path)
    report = report if report is not None else IngestReport(source=str(path))
    if not report.source:
        report.source = str(path)
    exp = experiment_id if experiment_id is not None else _default_experiment_id(path)
    acc = _Acc(str(path), report)
    n_valid = 0
    for lineno, doc in _iter_docs(path, acc, CHUNK_BYTES if chunk_bytes is None else chunk_bytes):
        if doc is None:  # a chunk read by the columnar path
            n_valid += lineno
            continue
        if type(doc) is _Export:  # typed fast path: same walk, no type checks left to do
            n_valid += 1
            for rs in doc.resourceSpans:
                for ss in rs.scopeSpans:
                    spans = ss.spans
                    if spans is None:
                        continue
                    scope_name = ss.scope.name if ss.scope is not None else None
                    for sp in spans:
                        acc.span(sp, scope_name)
            continue
        rss = doc.get("resourceSpans") if type(doc) is dict else None
        if type(rss) is not list:
            report.drop_at("not_otlp", f"{path}:{lineno}")
            continue
        n_valid += 1
        for rs in rss:
            sss = rs.get("scopeSpans") if type(rs) is dict else None
            if type(sss) is not list:
                report.drop("bad_field:resourceSpans")
                continue
            for ss in sss:
                if type(ss) is not dict:
                    report.drop("bad_field:scopeSpans")
                    continue
                scope = ss.get("scope")
                scope_name = scope.get("name") if type(scope) is dict else None
                spans = ss.get("spans")
                if spans is None:
                    continue
                if type(spans) is not list:
                    report.drop("bad_field:spans")
                    continue
                for sp in spans:
                    acc.span(sp, scope_name)
    if n_valid == 0:
        raise TraceFormatError("no valid OTLP JSON line (expected objects with 'resourceSpans')",
                               file=str(path))
    return acc.tables(exp)
