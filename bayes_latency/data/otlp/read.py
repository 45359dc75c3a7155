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
handed to the compiled byte scanner (:func:`bayes_latency.data.otlp.chunks.read_chunk`: a numba
scan of the used fields into flat tables, columns built from them with numpy), which takes only
chunks that the line-by-line path below reads without any drop, flag or special case, and then
gives the same rows and counts. A chunk it refuses (anything unusual: a ``\\u`` escape, a BOM,
bytes that are not UTF-8, a control character, a truncated line, a non-finite number, deep
nesting, a value of an unexpected type, ...) is read line by line, because the line-by-line path
is the code that applies the bad-input policy below and counts what it drops. The scanner is the
fast path (on the demo fleet, warm caches, 102 MB per CPU-second to the final tables against 42.5
line by line); the line-by-line path is the one that handles every input. Tables are built once
at the end, with numpy (the journey, step, snapshot and API orders by ``np.lexsort``,
per-request facts by scatter), falling back on a pandas sort by every column only for rows that
tie on their keys.

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

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bayes_latency.data.jsonl import SKIP, decode_line, iter_json_lines, iter_line_chunks
from bayes_latency.data.otlp.assemble import OtlpTables
from bayes_latency.data.otlp.fields import (
    API_SPAN_COLUMNS,
    JOURNEY_COLUMNS,
    JOURNEY_EVENTS,
    REQUEST_COLUMNS,
    SNAPSHOT_COLUMNS,
    STEP_COLUMNS,
    STEP_INT_COLUMNS,
    _decode_typed,
    _Export,
)
from bayes_latency.data.otlp.rows import _Acc
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



def _default_experiment_id(path: Path) -> str:
    """``EXP`` for ``EXP/traces.jsonl`` (experiment folder layout), else the file stem."""
    if path.name.startswith("traces.") and path.parent.name:
        return path.parent.name
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    return Path(name).stem


#: Bytes of whole lines handed to the byte scanner (:mod:`bayes_latency.data.otlp.chunks`) at a
#: time, the default of :func:`read_otlp`; 0 turns it off (every line read line by line).
CHUNK_BYTES = 4 << 20
#: Traces in all below which ``ingest`` reads every line line by line (``chunk_bytes=0``) and
#: never loads the byte scanner. Loading it costs a process its Numba compilation on empty caches
#: (a first run on a fresh machine), which the scanner pays back only on large inputs: its MB per
#: CPU-s against the line path's, and the compilation's CPU seconds, are measured in
#: ``results/benchmarks/ingest_scale.md`` (section 1).
SCANNER_MIN_INPUT_BYTES = 256 << 20


def _iter_docs(path: Path, acc: _Acc, chunk_bytes: int | None) -> Iterator[tuple[int, Any]]:
    """``(line number, decoded line)`` of the lines the line-by-line path reads, and ``(number of
    lines, None)`` for each chunk the byte scanner has put into ``acc``."""
    if not chunk_bytes:
        yield from iter_json_lines(path, acc.report, typed=_decode_typed)
        return
    from bayes_latency.data.otlp.chunks import read_chunk

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
                    objects = False  # e.g. a 'null' line: read line by line
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
        Size of the chunks of lines tried on the byte scanner (:mod:`.chunks`; default
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
        if doc is None:  # a chunk read by the byte scanner
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
