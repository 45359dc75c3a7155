"""Field specifications, typed OTLP Structs and value coercion of the OTLP reader.

Part of :mod:`bayes_latency.data.otlp.read` (whose docstring describes the format and the bad-input
policy): the attribute specs and column names of every table, the msgspec Structs a line is first
decoded into (``_Export``), and the coercion of OTLP attribute values (``_parse_attrs``) shared by
the line-by-line path (:mod:`.rows`) and the scanner path (:mod:`.chunks`).
"""

from __future__ import annotations

import math
import re
from typing import Any

import msgspec

from bayes_latency.data.report import IngestReport

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


def _typed_value(raw: Any, kind: int, key: str) -> Any:
    """An attribute's raw OTLP value as the field's type (``_INT``: an int64, ``_FLOAT``: a finite
    float, else a str), the one conversion of :func:`_parse_attrs` and
    :func:`_parse_attrs_typed`.

    Raises
    ------
    _Bad
        With ``key`` when the value does not convert.
    """
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
        return v
    if kind == _FLOAT:
        if t is float and raw - raw == 0.0:  # finite
            return raw
        v = _to_float(raw)
        if v is None:
            raise _Bad(key)
        return v
    if t is str:
        return raw
    raise _Bad(key)


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
        out[key] = _typed_value(raw, kind, key)
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
        out[key] = _typed_value(raw, kind, key)
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
