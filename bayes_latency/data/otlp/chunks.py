"""Columns of a chunk of OTLP JSON lines read by the compiled byte scanner.

:func:`read_chunk` hands a chunk of whole lines to :func:`bayes_latency.data.otlp.scan.scan_kernel`
(numba), which writes flat tables of spans, events and attributes (keys, event and scope names
already matched, ``intValue`` strings already parsed), and builds the span, event and attribute
columns from those tables in bulk with numpy (``doubleValue`` texts parsed by a ``pyarrow.compute``
cast). No Python code runs per span, event or attribute.

It only takes chunks that :func:`bayes_latency.data.otlp.read.read_otlp`'s line-by-line path reads
without a single drop, flag or special case, and then gives the same rows (the same values in
the same file order) and the same counts. Anything else returns None and the caller reads the
chunk line by line: a line that is not one JSON object with a ``resourceSpans`` list, a ``\\u``
escape, bytes that are not UTF-8 or a BOM, a carriage return or another control character, a
value nested deeper than :data:`bayes_latency.data.otlp.scan.MAX_DEPTH`, a value of another JSON
type than the reader expects, a known attribute without its usual value type (an ``intValue``
string for integers, a finite ``doubleValue`` for floats, a ``stringValue`` for strings) or given
twice, a negative zero, an unknown scope or event, a repeated span or event, a missing or
out-of-range field, ``droppedEventsCount`` other than 0, a ``journey.*`` event without
``ts.monotonic_ns``, ... The line-by-line path then counts and reports them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bayes_latency.data.otlp import fields as _o
from bayes_latency.data.otlp.rows import _int_column

__all__ = ["ChunkColumns", "read_chunk"]

_SCOPES = (_o._SCOPE_API, _o._SCOPE_CORE, _o._SCOPE_STEP)
# event names -> (kind, index): API events 0-4, journey events 5-9, step summary 10, snapshot 11
_EVENT_NAMES = (*_o._API_EVENTS, *(f"journey.{e}" for e in _o.JOURNEY_EVENTS),
                "step.BATCH_SUMMARY", "step.REQUEST_SNAPSHOT")
_N_API = len(_o._API_EVENTS)
_J0, _SUMMARY, _SNAPSHOT = _N_API, _N_API + len(_o.JOURNEY_EVENTS), _N_API + len(
    _o.JOURNEY_EVENTS) + 1
# scope of the span each event kind may appear in
_EVENT_SCOPE = np.array([0] * _N_API + [1] * len(_o.JOURNEY_EVENTS) + [2, 2], dtype=np.int64)
# attribute spec of each event group: 0 API event, 1 journey, 2 step summary, 3 snapshot
_EVENT_GROUP = np.array([0] * _N_API + [1] * len(_o.JOURNEY_EVENTS) + [2, 3], dtype=np.int64)
_EVENT_SPECS = (_o._API_EVENT_SPEC, _o._JOURNEY_SPEC, _o._STEP_SPEC, _o._SNAPSHOT_SPEC)
_SPAN_SPECS = (_o._API_SPEC, _o._CORE_SPEC, {})


class _Fallback(Exception):
    """Internal: the chunk needs the line-by-line path."""


@dataclass
class ChunkColumns:
    """Columns of one chunk, in file order, typed as :func:`.rows._typed_column` makes them.

    ``steps``, ``snaps``, ``je`` and ``api`` are segments for :meth:`.rows._Acc.add_segment`;
    ``cores`` lists ``(request_id, trace_id, span_id, parent_span_id or None, first journey row,
    end journey row)`` per core span (rows counted within the chunk); ``span_keys`` the
    ``(traceId, spanId)`` of every span; ``read`` the counts for ``report.read``.
    """

    steps: dict[str, Any]
    snaps: dict[str, Any]
    je: dict[str, Any]
    api: dict[str, Any]
    cores: list[tuple]
    span_keys: list[tuple[str, str]]
    read: dict[str, int]


def _spec_keys(specs: tuple[dict[str, int], ...]) -> tuple[str, ...]:
    return tuple(sorted({k for spec in specs for k in spec}))


#: Known attribute keys of every spec: the key codes of the scanner's attribute tables.
_ALL_KEYS = _spec_keys((*_SPAN_SPECS, *_EVENT_SPECS))
_REMAPS: dict[tuple[str, ...], np.ndarray] = {}


def _scan_remap(keys: tuple[str, ...]) -> np.ndarray:
    """Index in ``keys`` of each scanner key code (-1 when not in ``keys``), with one more
    entry -1 at the end for the code -1 (an unknown key)."""
    remap = _REMAPS.get(keys)
    if remap is None:
        remap = np.array([keys.index(k) if k in keys else -1 for k in _ALL_KEYS] + [-1],
                         dtype=np.int64)
        _REMAPS[keys] = remap
    return remap


def _scanned_values(kv: np.ndarray, b: np.ndarray) -> Any:
    """``take(kind, ii)``: the values of kind ``kind`` (int, float or str) of the rows ``ii`` of
    an attribute table of :func:`bayes_latency.data.otlp.scan.scan_kernel` (``b``: the chunk's
    bytes); raises :class:`_Fallback` when one is missing or does not parse."""
    from bayes_latency.data.otlp import scan_attributes as _a

    def take(kind: int, ii: np.ndarray) -> np.ndarray:
        flags = kv[_a.KV_FLAGS][ii]
        if kind == _o._INT:
            want = _a.HAS_INT | _a.INT_OK
            if ((flags & want) != want).any():
                raise _Fallback  # missing, or a text the scanner does not parse
            return kv[_a.KV_INT][ii]
        if kind == _o._FLOAT:
            if not (flags & _a.HAS_DBL).all():
                raise _Fallback
            try:
                return pc.cast(_large_strings(b, kv[_a.KV_DBL_S][ii], kv[_a.KV_DBL_E][ii]),
                               pa.float64()).to_numpy()
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise _Fallback from exc
        if not (flags & _a.HAS_STR).all():
            raise _Fallback
        return _large_strings(b, kv[_a.KV_STR_S][ii], kv[_a.KV_STR_E][ii]).to_numpy(
            zero_copy_only=False)

    return take


def _large_strings(b: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> pa.Array:
    """The byte ranges ``b[starts:ends]`` (UTF-8 text) as an Arrow ``large_string`` array."""
    from bayes_latency.data.otlp.gather import gather

    data, off = gather(b, np.ascontiguousarray(starts), np.ascontiguousarray(ends))
    return pa.Array.from_buffers(pa.large_string(), len(starts),
                                 [None, pa.py_buffer(off), pa.py_buffer(data)])


def _texts(b: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Object array of the str of each byte range."""
    return _large_strings(b, starts, ends).to_numpy(zero_copy_only=False)


class _Attrs:
    """Known attributes of a set of parents (spans or events), one dense column per key.

    ``specs[g]`` is the spec of parents of group ``g``; a parent's attribute with a key outside
    its group's spec is ignored (as the line-by-line path does); every known one must hold its
    usual value type, parse, be finite and appear once, or the chunk is refused.
    """

    def __init__(self, kv: np.ndarray, buf: np.ndarray, group: np.ndarray, n: int,
                 specs: tuple[dict[str, int], ...]) -> None:
        """``kv``: rows of an attribute table of :func:`.scan.scan_kernel`, ``buf``: the
        chunk's bytes; ``group[p]``: the spec group of parent ``p``."""
        from bayes_latency.data.otlp import scan_attributes as _a

        self.n = n
        keys = _spec_keys(specs)
        self.values: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        if not keys or not kv.shape[1]:
            return
        self._build(keys, kv[_a.KV_KEY], _scan_remap(keys),
                    np.ascontiguousarray(kv[_a.KV_PARENT]), group, specs,
                    _scanned_values(kv, buf))

    def _build(self, keys: tuple[str, ...], raw: np.ndarray, remap: np.ndarray,
               parent: np.ndarray, group: np.ndarray, specs: tuple[dict[str, int], ...],
               take: Any) -> None:
        """``raw``: each attribute's key code, ``remap[raw]`` its index in ``keys`` (-1 none)."""
        from bayes_latency.data.otlp.gather import group_by_key

        kinds: dict[str, int] = {}
        for spec in specs:
            for k, t in spec.items():
                if kinds.setdefault(k, t) != t:  # pragma: no cover - specs agree on types
                    raise AssertionError(k)
        known = np.zeros((len(specs), len(keys)), dtype=bool)
        for g, spec in enumerate(specs):
            for k in spec:
                known[g, keys.index(k)] = True
        order, bounds, dup = group_by_key(raw, remap, parent, np.ascontiguousarray(group),
                                          known)
        if not len(order):
            return
        # parents are in increasing order within a key: a key twice in one list is a repeat
        if dup:
            raise _Fallback
        # one take (and one parse) per value type over all keys of that type
        for kind in (_o._INT, _o._FLOAT, _o._STR):
            ks = [k for k in range(len(keys)) if kinds[keys[k]] == kind
                  and bounds[k + 1] > bounds[k]]
            if not ks:
                continue
            ii = np.concatenate([order[bounds[k]:bounds[k + 1]] for k in ks])
            v = take(kind, ii)
            if kind == _o._FLOAT and (not np.isfinite(v).all() or np.signbit(v[v == 0.0]).any()):
                raise _Fallback  # non-finite, or -0 (Python reads JSON -0 as int 0)
            a = 0
            for k in ks:
                b = a + bounds[k + 1] - bounds[k]
                rows = ii[a:b]
                self.values[keys[k]] = (parent[rows], v[a:b])
                a = b

    def get(self, key: str, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(values, present) of ``key`` for every parent (or ``rows``); absent = 0 / None."""
        pp_v = self.values.get(key)
        n = self.n
        if pp_v is None:
            present = np.zeros(n, dtype=bool)
            data = np.zeros(n, dtype=np.int64)
        else:
            pp, v = pp_v
            present = np.zeros(n, dtype=bool)
            present[pp] = True
            if v.dtype == object:
                data = np.full(n, None, dtype=object)
            else:
                data = np.zeros(n, dtype=v.dtype)
            data[pp] = v
        if rows is not None:
            return data[rows], present[rows]
        return data, present


def _int(attrs: _Attrs, key: str, rows: np.ndarray) -> Any:
    data, present = attrs.get(key, rows)
    if data.dtype == object:  # pragma: no cover - integer keys only
        raise _Fallback
    return _int_column(data.astype(np.int64), present)


def _obj(attrs: _Attrs, key: str, rows: np.ndarray) -> np.ndarray:
    data, present = attrs.get(key, rows)
    out = np.full(len(rows), None, dtype=object)
    out[present] = data[present]
    return out


def _float(attrs: _Attrs, key: str, rows: np.ndarray) -> np.ndarray:
    data, present = attrs.get(key, rows)
    return np.where(present, data.astype(float), np.nan)


def _negative(attrs: _Attrs, keys: Any, rows: np.ndarray) -> bool:
    for key in keys:
        data, present = attrs.get(key, rows)
        if data.dtype != object and (present & (data < 0)).any():
            return True
    return False


def read_chunk(buf: bytes, n_lines: int) -> ChunkColumns | None:
    """Columns of a chunk of ``n_lines`` non-blank OTLP JSON lines, or None when the chunk
    holds anything the line-by-line path would drop, flag or treat specially.

    Parameters
    ----------
    buf
        Whole lines (``\\n``-separated; blank lines allowed).
    n_lines
        Number of non-blank lines in ``buf``.
    """
    # (a backslash first: memchr, where the two-byte search takes 0.9 ms per MB)
    if (b"\\" in buf and b"\\u" in buf) or not _utf8_no_bom(buf):
        return None
    try:
        return _scanned_chunk(buf, n_lines)
    except _Fallback:
        return None


def _utf8_no_bom(buf: bytes) -> bool:
    if buf.isascii():
        return True
    try:
        buf.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return b"\xef\xbb\xbf" not in buf


def _scanned_chunk(buf: bytes, n_lines: int) -> ChunkColumns | None:
    """The columns of a chunk read by the compiled scanner (:mod:`.scan`); None when the scanner
    refuses it (raises :class:`_Fallback` when the columns refuse it)."""
    from bayes_latency.data.otlp import scan as _s

    if b"\r" in buf:
        return None
    n = len(buf)
    b, sp, ev, skv, ekv = _workspace(n)
    b[:n] = np.frombuffer(buf, dtype=np.uint8)
    b[n:n + 8] = 0  # zero bytes end every scan
    cnt = np.zeros(4, dtype=np.int64)
    tabs = _scan_tables()
    lines = _s.scan_kernel(b, n, sp, ev, skv, ekv, cnt, *tabs,
                           np.empty(_s.MAX_DEPTH, dtype=np.uint8))
    if lines != n_lines:
        return None
    sp, ev = sp[:, :cnt[0]], ev[:, :cnt[1]]
    skv, ekv = skv[:, :cnt[2]], ekv[:, :cnt[3]]
    n_spans, n_ev = sp.shape[1], ev.shape[1]
    span_scope = sp[_s.SP_SCOPE]
    trace = _texts(b, sp[_s.SP_TRACE_S], sp[_s.SP_TRACE_E])
    span_id = _texts(b, sp[_s.SP_ID_S], sp[_s.SP_ID_E])
    parent = _texts(b, sp[_s.SP_PAR_S], sp[_s.SP_PAR_E])
    code = sp[_s.SP_CODE]
    status_valid = sp[_s.SP_STATUS] == 1
    span_attrs = _Attrs(skv, b, span_scope, n_spans, _SPAN_SPECS)
    ev_span, ev_code = ev[_s.EV_SPAN], ev[_s.EV_NAME]
    if (_EVENT_SCOPE[ev_code] != span_scope[ev_span]).any():
        raise _Fallback  # an event of another scope's span
    ev_attrs = _Attrs(ekv, b, _EVENT_GROUP[ev_code], n_ev, _EVENT_SPECS)
    return _chunk(span_scope, trace, span_id, parent, code, status_valid, span_attrs, ev_span,
                  ev_code, ev_attrs)


_TABLES: list[tuple] = []
_WORK = threading.local()
#: Largest chunk whose scanner workspace is kept for the next chunk of the thread.
_KEEP_BYTES = 16 << 20


def _workspace(n: int) -> tuple[np.ndarray, ...]:
    """The scanner's arrays for a chunk of ``n`` bytes: the bytes (and 8 more), spans, events,
    span and event attributes (rows at most: a span takes 26 bytes or more, an event 11, an
    attribute usually 30; a chunk of more attributes than ``n // 16`` is refused). Kept per
    thread for chunks up to :data:`_KEEP_BYTES` (fresh pages cost a page fault each)."""
    from bayes_latency.data.otlp import scan as _s
    from bayes_latency.data.otlp import scan_attributes as _a

    ws = getattr(_WORK, "ws", None)
    if ws is not None and len(ws[0]) >= n + 8:
        return ws
    cap = max(n, 1 << 20) if n <= _KEEP_BYTES else n
    ws = (np.empty(cap + 8, dtype=np.uint8),
          np.empty((_s.SP_WIDTH, cap // 26 + 1), dtype=np.int64),
          np.empty((_s.EV_WIDTH, cap // 11 + 1), dtype=np.int64),
          np.empty((_a.KV_WIDTH, cap // 16 + 1), dtype=np.int64),
          np.empty((_a.KV_WIDTH, cap // 16 + 1), dtype=np.int64))
    if n <= _KEEP_BYTES:
        _WORK.ws = ws
    return ws


def _scan_tables() -> tuple:
    """Name tables of the scanner: attribute keys, event names, scope names."""
    if not _TABLES:
        from bayes_latency.data.otlp.jsonbytes import names_table

        _TABLES.append((names_table(_ALL_KEYS), names_table(_EVENT_NAMES),
                        names_table(_SCOPES)))
    return _TABLES[0]


def _chunk(span_scope: np.ndarray, trace: np.ndarray, span_id: np.ndarray, parent: np.ndarray,
           code: np.ndarray, status_valid: np.ndarray, span_attrs: _Attrs, ev_span: np.ndarray,
           ev_code: np.ndarray, ev_attrs: _Attrs) -> ChunkColumns:
    """The chunk's columns from its span and event columns (raises :class:`_Fallback`)."""
    n_spans, n_ev = len(span_scope), len(ev_code)
    keys = list(zip(trace.tolist(), span_id.tolist(), strict=True))
    if len(set(keys)) != len(keys):
        raise _Fallback  # a repeated span
    read = {"spans": n_spans, "events": n_ev,
            "api_spans": int((span_scope == 0).sum()), "core_spans": int((span_scope == 1).sum()),
            "step_spans": int((span_scope == 2).sum()),
            "step_summaries": int((ev_code == _SUMMARY).sum())}

    # ---- step summaries ----
    rows = np.flatnonzero(ev_code == _SUMMARY)
    if not ev_attrs.get("step.id", rows)[1].all():
        raise _Fallback  # missing step.id
    if _negative(ev_attrs, _o.STEP_COLUMNS, rows):
        raise _Fallback
    ratio, has_ratio = ev_attrs.get("kv.usage_gpu_ratio", rows)
    if (has_ratio & (ratio > 1.0)).any():
        raise _Fallback
    t0, h0 = ev_attrs.get("step.ts_start_ns", rows)
    t1, h1 = ev_attrs.get("step.ts_end_ns", rows)
    if (h0 & h1 & (t1 < t0)).any():
        raise _Fallback
    steps = {c: (_float(ev_attrs, c, rows) if c == "kv.usage_gpu_ratio"
                 else _int(ev_attrs, c, rows)) for c in _o.STEP_COLUMNS}

    # ---- request snapshots ----
    rows = np.flatnonzero(ev_code == _SNAPSHOT)
    if not (ev_attrs.get("step.id", rows)[1].all() and ev_attrs.get("request.id", rows)[1].all()):
        raise _Fallback
    if _negative(ev_attrs, ("step.id", *_o._SNAPSHOT_ATTRS), rows):
        raise _Fallback
    snaps = {"step_id": _int(ev_attrs, "step.id", rows),
             "request_id": _obj(ev_attrs, "request.id", rows)}
    for c in _o._SNAPSHOT_ATTRS:
        snaps[c] = _obj(ev_attrs, c, rows) if c == "request.phase" else _int(ev_attrs, c, rows)

    # ---- core spans and their journey events ----
    core = np.flatnonzero(span_scope == 1)
    rid, has_rid = span_attrs.get("gen_ai.request.id", core)
    if not has_rid.all():
        raise _Fallback
    rows = np.flatnonzero((ev_code >= _J0) & (ev_code < _SUMMARY))
    ts, has_ts = ev_attrs.get("ts.monotonic_ns", rows)
    if not has_ts.all() or (ts < 0).any() or _negative(ev_attrs, _o._JOURNEY_NONNEG, rows):
        raise _Fallback
    rid_of_span = np.full(n_spans, None, dtype=object)
    rid_of_span[core] = rid
    je = {"request_id": rid_of_span[ev_span[rows]],
          "event": np.asarray(_o.JOURNEY_EVENTS, dtype=object)[ev_code[rows] - _J0],
          "ts_monotonic_ns": ts.astype(np.int64)}
    for attr, col in _o._JOURNEY_MAP:
        je[col] = _int(ev_attrs, attr, rows) if col in _o._JOURNEY_INT else _obj(ev_attrs, attr,
                                                                                rows)
    je = {c: je[c] for c in _o.JOURNEY_COLUMNS if c != "experiment_id"}
    # journey rows of each core span: events are in span order, so one range per span
    per_span = np.bincount(ev_span[rows], minlength=n_spans)
    ends = np.cumsum(per_span)
    starts = ends - per_span
    cores = list(zip(rid.tolist(), trace[core].tolist(), span_id[core].tolist(),
                     [p or None for p in parent[core].tolist()], starts[core].tolist(),
                     ends[core].tolist(), strict=True))

    # ---- API spans ----
    api_sp = np.flatnonzero(span_scope == 0)
    rows = np.flatnonzero(ev_code < _N_API)
    pair = ev_span[rows] * _N_API + ev_code[rows]
    if len(np.unique(pair)) != len(pair):
        raise _Fallback  # an API event twice in a span
    t_ev, has_t = ev_attrs.get("event.ts.monotonic", rows)
    if (has_t & (t_ev < 0)).any():
        raise _Fallback
    api: dict[str, Any] = {
        "api_request_id": _obj(span_attrs, "gen_ai.request.id", api_sp),
        "trace_id": trace[api_sp], "span_id": span_id[api_sp],
        "http_route": _obj(span_attrs, "http.route", api_sp),
        "model": _obj(span_attrs, "gen_ai.response.model", api_sp),
        "prompt_tokens": _int(span_attrs, "gen_ai.usage.prompt_tokens", api_sp),
        "max_tokens": _int(span_attrs, "gen_ai.request.max_tokens", api_sp),
        "n": _int(span_attrs, "gen_ai.request.n", api_sp),
        "temperature": _float(span_attrs, "gen_ai.request.temperature", api_sp),
        "top_p": _float(span_attrs, "gen_ai.request.top_p", api_sp),
    }
    slot = np.full(n_spans, -1, dtype=np.int64)
    slot[api_sp] = np.arange(len(api_sp))
    has_event = {}
    for k, (name, col) in enumerate(zip(_o._API_EVENTS, ("arrival_s", "handoff_s",
                                                         "first_response_s", "departed_s",
                                                         "aborted_s"), strict=True)):
        sel = ev_code[rows] == k
        out = np.full(len(api_sp), np.nan)
        at = slot[ev_span[rows[sel]]]
        out[at] = np.where(has_t[sel], t_ev[sel], np.nan)
        api[col] = out
        has = np.zeros(len(api_sp), dtype=bool)
        has[at] = True
        has_event[name] = (has, at, rows[sel])
    has_ab, at_ab, rows_ab = has_event["api.ABORTED"]
    reason = np.full(len(api_sp), None, dtype=object)
    reason[at_ab] = _obj(ev_attrs, "reason", rows_ab)
    api["abort_reason"] = reason
    valid = status_valid[api_sp]
    api["status_code"] = _int_column(code[api_sp], valid)
    api["aborted"] = (valid & (code[api_sp] == 2)) | has_ab
    return ChunkColumns(steps=steps, snaps=snaps, je=je, api=api, cores=cores, span_keys=keys,
                        read=read)
