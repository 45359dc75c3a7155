"""Compiled scanner of OTLP JSON lines: the parser of the OTLP reader's fast path.

:func:`scan_kernel` (numba, ``cache=True``) walks a chunk of OTLP JSON lines byte by byte and
writes flat tables of what :mod:`bayes_latency.data.otlp.chunks` uses: spans (their scope, the
byte ranges of ``traceId`` / ``spanId`` / ``parentSpanId``, ``status.code``), events (their span
and name) and the attributes of spans and of events (their owner, key, and value: the byte range
of a ``stringValue``, an ``intValue`` string already parsed to int64, the byte range of a
``doubleValue`` number; read by :mod:`~bayes_latency.data.otlp.scan_attributes`). Keys, event
and scope names are matched to the reader's known names in the kernel; every other field is
skipped but checked to be valid JSON.

It is strict: anything but the usual shapes refuses the whole chunk (returns a negative
status), which is then read line by line by :mod:`bayes_latency.data.otlp.read` (msgspec), the
code that applies the bad-input policy and counts what it drops. Refused are any syntax error, a
``null`` or a value of another JSON type in a field the reader uses, a field given twice in one
object, an unknown scope or event name, a missing ``resourceSpans`` / ``scopeSpans`` / scope name
/ ``traceId`` / ``spanId`` / event name, a backslash escape in a string the reader uses,
``droppedEventsCount`` other than 0, a line holding anything after its object, a carriage return
or a control character, nesting deeper than the stack (:data:`MAX_DEPTH`). What it accepts it
reads as the line-by-line path does (a missing ``parentSpanId`` is "", missing lists are empty, a
missing ``status`` is invalid), so :func:`bayes_latency.data.otlp.chunks.read_chunk` builds the
same columns from it. The byte-level JSON primitives are in :mod:`~bayes_latency.data.otlp.jsonbytes`,
the compiled column builders of the chunk reader in :mod:`~bayes_latency.data.otlp.gather`.
"""

from __future__ import annotations

from numba import njit

from bayes_latency.data.otlp.jsonbytes import (
    ERR,
    equals,
    hash_of,
    literal,
    match_name,
    next_item,
    parse_int,
    plain_string,
    read_key,
    scan_number,
    skip_value,
    skip_ws,
)
from bayes_latency.data.otlp.scan_attributes import _attributes

#: Deepest nesting of a skipped value the scanner follows (deeper: the chunk is refused).
MAX_DEPTH = 256

# span table columns
SP_SCOPE, SP_TRACE_S, SP_TRACE_E, SP_ID_S, SP_ID_E, SP_PAR_S, SP_PAR_E, SP_STATUS, SP_CODE = \
    range(9)
SP_WIDTH = 9
# event table columns
EV_SPAN, EV_NAME = 0, 1
EV_WIDTH = 2
# the attribute table's columns: :mod:`bayes_latency.data.otlp.scan_attributes`

_F_RESOURCE_SPANS = literal("resourceSpans")
_F_SCOPE_SPANS = literal("scopeSpans")
_F_SCOPE = literal("scope")
_F_NAME = literal("name")
_F_SPANS = literal("spans")
_F_TRACE_ID = literal("traceId")
_F_SPAN_ID = literal("spanId")
_F_PARENT = literal("parentSpanId")
_F_ATTRIBUTES = literal("attributes")
_F_EVENTS = literal("events")
_F_DROPPED = literal("droppedEventsCount")
_F_STATUS = literal("status")
_F_CODE = literal("code")



@njit(cache=True, nogil=True)
def _events(b, i, ev, ekv, cnt, span, keys, names, stack):
    """A span's list of events at ``i``; index after it or -1."""
    if b[i] != 91:
        return ERR
    i = skip_ws(b, i + 1)
    if b[i] == 93:
        return i + 1
    while True:
        if b[i] != 123:
            return ERR
        row = cnt[1]
        if row >= ev.shape[1]:
            return ERR
        cnt[1] = row + 1
        ev[EV_SPAN, row] = span
        ev[EV_NAME, row] = -1
        i = skip_ws(b, i + 1)
        seen = 0
        if b[i] != 125:
            while True:
                s, e, i = read_key(b, i)
                if i < 0:
                    return ERR
                if s >= 0 and equals(b, s, e, _F_NAME):
                    if seen & 1:
                        return ERR
                    seen |= 1
                    ns, ne, i = plain_string(b, i)
                    if i < 0:
                        return ERR
                    code = match_name(b, ns, ne, hash_of(b, ns, ne), names)
                    if code < 0:
                        return ERR  # an unknown event
                    ev[EV_NAME, row] = code
                elif s >= 0 and equals(b, s, e, _F_ATTRIBUTES):
                    if seen & 2:
                        return ERR
                    seen |= 2
                    i = _attributes(b, i, ekv, cnt, 3, row, keys, stack)
                    if i < 0:
                        return ERR
                else:
                    i = skip_value(b, i, stack)
                    if i < 0:
                        return ERR
                i, end = next_item(b, i, 125)
                if end:
                    break
            if i < 0:
                return ERR
        else:
            i += 1
        if not seen & 1:
            return ERR  # no name
        i, end = next_item(b, i, 93)
        if end:
            return i


@njit(cache=True, nogil=True)
def _span(b, i, sp, ev, skv, ekv, cnt, keys, names, stack):
    """One span object at ``i`` (its row is ``cnt[0]``); index after it or -1."""
    row = cnt[0]
    if row >= sp.shape[1]:
        return ERR
    cnt[0] = row + 1
    for k in range(SP_WIDTH):
        sp[k, row] = 0
    i = skip_ws(b, i + 1)
    if b[i] == 125:
        return ERR  # no traceId
    seen = 0
    while True:
        s, e, i = read_key(b, i)
        if i < 0:
            return ERR
        if s >= 0 and equals(b, s, e, _F_TRACE_ID):
            if seen & 1:
                return ERR
            seen |= 1
            vs, ve, i = plain_string(b, i)
            sp[SP_TRACE_S, row], sp[SP_TRACE_E, row] = vs, ve
        elif s >= 0 and equals(b, s, e, _F_SPAN_ID):
            if seen & 2:
                return ERR
            seen |= 2
            vs, ve, i = plain_string(b, i)
            sp[SP_ID_S, row], sp[SP_ID_E, row] = vs, ve
        elif s >= 0 and equals(b, s, e, _F_PARENT):
            if seen & 4:
                return ERR
            seen |= 4
            vs, ve, i = plain_string(b, i)
            sp[SP_PAR_S, row], sp[SP_PAR_E, row] = vs, ve
        elif s >= 0 and equals(b, s, e, _F_ATTRIBUTES):
            if seen & 8:
                return ERR
            seen |= 8
            i = _attributes(b, i, skv, cnt, 2, row, keys, stack)
        elif s >= 0 and equals(b, s, e, _F_EVENTS):
            if seen & 16:
                return ERR
            seen |= 16
            i = _events(b, i, ev, ekv, cnt, row, keys, names, stack)
        elif s >= 0 and equals(b, s, e, _F_DROPPED):
            if seen & 32:
                return ERR
            seen |= 32
            if b[i] != 48:  # only 0 (anything else is for the line path to count)
                return ERR
            i += 1
        elif s >= 0 and equals(b, s, e, _F_STATUS):
            if seen & 64 or b[i] != 123:
                return ERR
            seen |= 64
            sp[SP_STATUS, row] = 1
            i = skip_ws(b, i + 1)
            if b[i] == 125:
                i += 1
            else:
                seen_code = False
                while True:
                    ks, ke, i = read_key(b, i)
                    if i < 0:
                        return ERR
                    if ks >= 0 and equals(b, ks, ke, _F_CODE):
                        if seen_code:
                            return ERR
                        seen_code = True
                        j = scan_number(b, i)
                        if j < 0:
                            return ERR
                        v, ok = parse_int(b, i, j)
                        if not ok:
                            return ERR
                        sp[SP_CODE, row] = v
                        i = j
                    else:
                        i = skip_value(b, i, stack)
                        if i < 0:
                            return ERR
                    i, end = next_item(b, i, 125)
                    if end:
                        break
        else:
            i = skip_value(b, i, stack)
        if i < 0:
            return ERR
        i, end = next_item(b, i, 125)
        if end:
            break
    if i < 0 or (seen & 3) != 3:
        return ERR  # no traceId or spanId
    return i


@njit(cache=True, nogil=True)
def _list_of(b, i):
    """``b[i]`` opens a non-empty list of objects: index of its first element; or the index
    after ``[]`` as (index, True); -1 on error."""
    if b[i] != 91:
        return ERR, True
    i = skip_ws(b, i + 1)
    if b[i] == 93:
        return i + 1, True
    if b[i] != 123:
        return ERR, True
    return i, False


@njit(cache=True, nogil=True)
def _scope_spans(b, i, sp, ev, skv, ekv, cnt, keys, names, scopes, stack):
    """One scopeSpans object; index after it or -1."""
    first = cnt[0]
    scope = -1
    i = skip_ws(b, i + 1)
    if b[i] == 125:
        return ERR  # no scope
    seen = 0
    while True:
        s, e, i = read_key(b, i)
        if i < 0:
            return ERR
        if s >= 0 and equals(b, s, e, _F_SCOPE):
            if seen & 1 or b[i] != 123:
                return ERR
            seen |= 1
            i = skip_ws(b, i + 1)
            if b[i] != 125:
                seen_name = False
                while True:
                    ks, ke, i = read_key(b, i)
                    if i < 0:
                        return ERR
                    if ks >= 0 and equals(b, ks, ke, _F_NAME):
                        if seen_name:
                            return ERR
                        seen_name = True
                        ns, ne, i = plain_string(b, i)
                        if i < 0:
                            return ERR
                        scope = match_name(b, ns, ne, hash_of(b, ns, ne), scopes)
                    else:
                        i = skip_value(b, i, stack)
                        if i < 0:
                            return ERR
                    i, end = next_item(b, i, 125)
                    if end:
                        break
                if i < 0:
                    return ERR
            else:
                i += 1
        elif s >= 0 and equals(b, s, e, _F_SPANS):
            if seen & 2:
                return ERR
            seen |= 2
            i, empty = _list_of(b, i)
            if i < 0:
                return ERR
            if not empty:
                while True:
                    if b[i] != 123:
                        return ERR
                    i = _span(b, i, sp, ev, skv, ekv, cnt, keys, names, stack)
                    if i < 0:
                        return ERR
                    i, end = next_item(b, i, 93)
                    if end:
                        break
        else:
            i = skip_value(b, i, stack)
        if i < 0:
            return ERR
        i, end = next_item(b, i, 125)
        if end:
            break
    if i < 0 or scope < 0:
        return ERR  # no scope name, or an unknown one
    for r in range(first, cnt[0]):
        sp[SP_SCOPE, r] = scope
    return i


@njit(cache=True, nogil=True)
def _resource_spans(b, i, sp, ev, skv, ekv, cnt, keys, names, scopes, stack):
    """One resourceSpans object (its ``scopeSpans`` list required); index after it or -1."""
    i = skip_ws(b, i + 1)
    if b[i] == 125:
        return ERR
    seen = False
    while True:
        s, e, i = read_key(b, i)
        if i < 0:
            return ERR
        if s >= 0 and equals(b, s, e, _F_SCOPE_SPANS):
            if seen:
                return ERR
            seen = True
            i, empty = _list_of(b, i)
            if i < 0:
                return ERR
            if not empty:
                while True:
                    if b[i] != 123:
                        return ERR
                    i = _scope_spans(b, i, sp, ev, skv, ekv, cnt, keys, names, scopes, stack)
                    if i < 0:
                        return ERR
                    i, end = next_item(b, i, 93)
                    if end:
                        break
        else:
            i = skip_value(b, i, stack)
        if i < 0:
            return ERR
        i, end = next_item(b, i, 125)
        if end:
            break
    if i < 0 or not seen:
        return ERR
    return i


@njit(cache=True, nogil=True)
def _line(b, i, sp, ev, skv, ekv, cnt, keys, names, scopes, stack):
    """The object of one line (its ``resourceSpans`` list required); index after it or -1."""
    i = skip_ws(b, i + 1)
    if b[i] == 125:
        return ERR
    seen = False
    while True:
        s, e, i = read_key(b, i)
        if i < 0:
            return ERR
        if s >= 0 and equals(b, s, e, _F_RESOURCE_SPANS):
            if seen:
                return ERR
            seen = True
            i, empty = _list_of(b, i)
            if i < 0:
                return ERR
            if not empty:
                while True:
                    if b[i] != 123:
                        return ERR
                    i = _resource_spans(b, i, sp, ev, skv, ekv, cnt, keys, names, scopes,
                                        stack)
                    if i < 0:
                        return ERR
                    i, end = next_item(b, i, 93)
                    if end:
                        break
        else:
            i = skip_value(b, i, stack)
        if i < 0:
            return ERR
        i, end = next_item(b, i, 125)
        if end:
            break
    if i < 0 or not seen:
        return ERR
    return i


@njit(cache=True, nogil=True)
def scan_kernel(b, n, sp, ev, skv, ekv, cnt, keys, names, scopes, stack):
    """Scan the ``n`` bytes of lines in ``b`` (followed by zero bytes): the number of
    non-blank lines, or -1 to refuse the chunk. Rows of ``sp`` / ``ev`` / ``skv`` / ``ekv``
    (spans, events, span attributes, event attributes) counted in ``cnt[0:4]``."""
    for k in range(4):
        cnt[k] = 0
    i = 0
    lines = 0
    while True:
        i = skip_ws(b, i)
        if i >= n:
            return lines
        c = b[i]
        if c == 10:
            i += 1
            continue
        if c != 123:
            return ERR
        i = _line(b, i, sp, ev, skv, ekv, cnt, keys, names, scopes, stack)
        if i < 0:
            return ERR
        lines += 1
        i = skip_ws(b, i)
        if i >= n:
            return lines
        if b[i] != 10:
            return ERR
        i += 1
