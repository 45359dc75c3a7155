"""Row-wise accumulation of the OTLP reader: spans and events walked into column lists.

Part of :mod:`bayes_latency.data.otlp.read`: the accumulator ``_Acc`` that the line-by-line path
fills span by span (typed Structs or plain decoded JSON, with the same checks and counts), that
takes the column segments of chunks read by the byte scanner (:mod:`.chunks`), and whose
``tables`` (:class:`bayes_latency.data.otlp.assemble._Tables`) builds the final tables.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
from pandas.api.types import pandas_dtype

from bayes_latency.data.otlp.assemble import _Tables
from bayes_latency.data.otlp.fields import (
    _API_EVENT_SPEC,
    _API_EVENTS,
    _API_SPEC,
    _CORE_SPEC,
    _EVENT_RANK,
    _INT64_MAX,
    _INT64_MIN,
    _JOURNEY_INT,
    _JOURNEY_MAP,
    _JOURNEY_NONNEG,
    _JOURNEY_SPEC,
    _JOURNEY_STR,
    _SCOPE_API,
    _SCOPE_CORE,
    _SCOPE_STEP,
    _SNAPSHOT_ATTRS,
    _SNAPSHOT_SPEC,
    _STEP_SPEC,
    API_SPAN_COLUMNS,
    JOURNEY_COLUMNS,
    STEP_COLUMNS,
    STEP_INT_COLUMNS,
    _Bad,
    _Event,
    _parse_attrs,
    _Span,
    _status_code,
    _step_in_range,
    _to_int,
)
from bayes_latency.data.report import IngestReport

# dtypes resolved once: a dtype string costs pandas a registry lookup per call (12-22
# microseconds; thousands of calls per demo-fleet ingest)
_INT64 = pandas_dtype("Int64")


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
        return pd.array(values, dtype=_INT64)
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


class _Acc(_Tables):
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
        # columns of chunks read by the byte scanner (data/otlp/chunks.py); one dict per segment
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
        """Add the columns of a chunk read by :func:`bayes_latency.data.otlp.chunks.read_chunk`
        (its spans are new: the caller checked ``seen_spans``)."""
        rep = self.report
        for k, v in cols.read.items():
            # the line path counts each span's events, 0 included: spans without any events
            # still give the report an ``events`` entry
            if v or (k == "events" and cols.read.get("spans")):
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
