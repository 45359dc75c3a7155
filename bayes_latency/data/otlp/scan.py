"""Compiled scanner of OTLP JSON lines: the parser of the OTLP reader's fast path.

:func:`scan_kernel` (numba, ``cache=True``) walks a chunk of OTLP JSON lines byte by byte and
writes flat tables of what :mod:`bayes_latency.data.otlp.chunks` uses: spans (their scope, the
byte ranges of ``traceId`` / ``spanId`` / ``parentSpanId``, ``status.code``), events (their span
and name) and the attributes of spans and of events (their owner, key, and value: the byte range
of a ``stringValue``, an ``intValue`` string already parsed to int64, the byte range of a
``doubleValue`` number). Keys, event and scope names are matched to the reader's known names
in the kernel; every other field is skipped but checked to be valid JSON.

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
same columns from it.
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: Deepest nesting of a skipped value the scanner follows (deeper: the chunk is refused).
MAX_DEPTH = 256

# span table columns
SP_SCOPE, SP_TRACE_S, SP_TRACE_E, SP_ID_S, SP_ID_E, SP_PAR_S, SP_PAR_E, SP_STATUS, SP_CODE = \
    range(9)
SP_WIDTH = 9
# event table columns
EV_SPAN, EV_NAME = 0, 1
EV_WIDTH = 2
# attribute table columns (flags: bit 0 stringValue, 1 intValue, 2 intValue parsed, 3 doubleValue)
KV_PARENT, KV_KEY, KV_FLAGS, KV_STR_S, KV_STR_E, KV_INT, KV_DBL_S, KV_DBL_E = range(8)
KV_WIDTH = 8
HAS_STR, HAS_INT, INT_OK, HAS_DBL = 1, 2, 4, 8


def _lit(s: str) -> np.ndarray:
    return np.frombuffer(s.encode(), dtype=np.uint8).copy()


_F_RESOURCE_SPANS = _lit("resourceSpans")
_F_SCOPE_SPANS = _lit("scopeSpans")
_F_SCOPE = _lit("scope")
_F_NAME = _lit("name")
_F_SPANS = _lit("spans")
_F_TRACE_ID = _lit("traceId")
_F_SPAN_ID = _lit("spanId")
_F_PARENT = _lit("parentSpanId")
_F_ATTRIBUTES = _lit("attributes")
_F_EVENTS = _lit("events")
_F_DROPPED = _lit("droppedEventsCount")
_F_STATUS = _lit("status")
_F_CODE = _lit("code")
_F_KEY = _lit("key")
_F_VALUE = _lit("value")
_F_STRING = _lit("stringValue")
_F_INTV = _lit("intValue")
_F_DOUBLE = _lit("doubleValue")

# the compact form of an attribute: {"key":"K","value":{"intValue":"1"}} (or stringValue /
# doubleValue), read by a fast path of :func:`_attributes`
_P_KEY = _lit('{"key":"')
_P_VALUE = _lit('","value":{"')
_P_INT = _lit('intValue":"')
_P_STR = _lit('stringValue":"')
_P_DBL = _lit('doubleValue":')
_LIM_POS = _lit("9223372036854775807")
_LIM_NEG = _lit("9223372036854775808")

_ERR = -1


def _hash(data: bytes) -> int:
    """:func:`_hash_of` in Python (64-bit wrap-around)."""
    h = 0
    for c in data:
        h = (h * 31 + c) & 0xFFFFFFFFFFFFFFFF
    return h


#: Slots of a :func:`names_table` (a power of two).
_SLOTS = 1024


def names_table(names: tuple[str, ...] | list[str]) -> tuple[np.ndarray, ...]:
    """Lookup table of ``names`` for :func:`_match`: (their concatenated bytes, the offset and
    length of each, the hash slots: the index of the name there or -1, by open addressing)."""
    enc = [n.encode() for n in names]
    cat = np.frombuffer(b"".join(enc) + b"\0", dtype=np.uint8).copy()
    off = np.zeros(len(enc), dtype=np.int64)
    lens = np.array([len(e) for e in enc], dtype=np.int64)
    off[1:] = np.cumsum(lens)[:-1]
    slots = np.full(_SLOTS, -1, dtype=np.int64)
    for k, e in enumerate(enc):
        j = _hash(e) & (_SLOTS - 1)
        while slots[j] >= 0:
            j = (j + 1) & (_SLOTS - 1)
        slots[j] = k
    return cat, off, lens, slots


@njit(cache=True, nogil=True)
def _ws(b, i):
    c = b[i]
    while c == 32 or c == 9:
        i += 1
        c = b[i]
    return i


@njit(cache=True, nogil=True)
def _string(b, i):
    """``b[i]`` is a quote: (index after the closing quote, whether it holds an escape), or
    (-1, ...) for a control character, a ``\\u`` or a bad escape."""
    i += 1
    esc = False
    while True:
        c = b[i]
        if c == 34:
            return i + 1, esc
        if c == 92:
            d = b[i + 1]
            if d == 34 or d == 92 or d == 47 or d == 98 or d == 102 or d == 110 or d == 114 \
                    or d == 116:
                esc = True
                i += 2
                continue
            return _ERR, esc
        if c < 32:  # also the sentinel 0 at the end and a new line
            return _ERR, esc
        i += 1


@njit(cache=True, nogil=True)
def _digits(b, i):
    c = b[i]
    while 48 <= c <= 57:
        i += 1
        c = b[i]
    return i


@njit(cache=True, nogil=True)
def _number(b, i):
    """End of the JSON number at ``i`` (strict grammar), or -1."""
    if b[i] == 45:
        i += 1
    c = b[i]
    if c == 48:
        i += 1
    elif 49 <= c <= 57:
        i = _digits(b, i + 1)
    else:
        return _ERR
    if b[i] == 46:
        if not 48 <= b[i + 1] <= 57:
            return _ERR
        i = _digits(b, i + 1)
    c = b[i]
    if c == 101 or c == 69:
        i += 1
        if b[i] == 43 or b[i] == 45:
            i += 1
        if not 48 <= b[i] <= 57:
            return _ERR
        i = _digits(b, i)
    return i


@njit(cache=True, nogil=True)
def _int_text(b, s, e):
    """(value, ok) of the decimal integer text ``b[s:e]`` (``-?(0|[1-9][0-9]*)`` within int64)."""
    neg = False
    if s < e and b[s] == 45:
        neg = True
        s += 1
    nd = e - s
    if nd < 1 or nd > 19 or (b[s] == 48 and nd > 1):
        return 0, False
    v = np.uint64(0)
    for k in range(s, e):
        c = b[k]
        if not 48 <= c <= 57:
            return 0, False
        v = v * np.uint64(10) + np.uint64(c - 48)
    if nd == 19:  # 19 digits may overflow uint64 arithmetic checks: compare as text
        lim = _LIM_NEG if neg else _LIM_POS
        for k in range(19):
            d = b[s + k]
            m = lim[k]
            if d < m:
                break
            if d > m:
                return 0, False
    if neg:
        if v == np.uint64(9223372036854775808):
            return np.int64(-9223372036854775807) - 1, True
        return -np.int64(v), True
    return np.int64(v), True


@njit(cache=True, nogil=True)
def _skip(b, i, stack):
    """End of the JSON value at ``i`` (checked, not kept), or -1."""
    depth = 0
    while True:
        c = b[i]
        done = True
        if c == 123 or c == 91:
            if depth >= len(stack):
                return _ERR
            stack[depth] = c
            depth += 1
            i = _ws(b, i + 1)
            if (c == 123 and b[i] == 125) or (c == 91 and b[i] == 93):
                i += 1
                depth -= 1
            else:
                if c == 123:
                    if b[i] != 34:
                        return _ERR
                    i, _e = _string(b, i)
                    if i < 0:
                        return _ERR
                    i = _ws(b, i)
                    if b[i] != 58:
                        return _ERR
                    i = _ws(b, i + 1)
                done = False
        elif c == 34:
            i, _e = _string(b, i)
            if i < 0:
                return _ERR
        elif c == 45 or 48 <= c <= 57:
            i = _number(b, i)
            if i < 0:
                return _ERR
        elif c == 116:
            if b[i + 1] != 114 or b[i + 2] != 117 or b[i + 3] != 101:
                return _ERR
            i += 4
        elif c == 102:
            if b[i + 1] != 97 or b[i + 2] != 108 or b[i + 3] != 115 or b[i + 4] != 101:
                return _ERR
            i += 5
        elif c == 110:
            if b[i + 1] != 117 or b[i + 2] != 108 or b[i + 3] != 108:
                return _ERR
            i += 4
        else:
            return _ERR
        if not done:
            continue
        # after a value: close containers, or move to the next element
        while True:
            if depth == 0:
                return i
            i = _ws(b, i)
            top = stack[depth - 1]
            c = b[i]
            if c == 44:
                i = _ws(b, i + 1)
                if top == 123:
                    if b[i] != 34:
                        return _ERR
                    i, _e = _string(b, i)
                    if i < 0:
                        return _ERR
                    i = _ws(b, i)
                    if b[i] != 58:
                        return _ERR
                    i = _ws(b, i + 1)
                break
            if (c == 125 and top == 123) or (c == 93 and top == 91):
                i += 1
                depth -= 1
                continue
            return _ERR


@njit(cache=True, nogil=True)
def _eq(b, s, e, lit):
    if e - s != len(lit):
        return False
    for k in range(len(lit)):
        if b[s + k] != lit[k]:
            return False
    return True


@njit(cache=True, nogil=True)
def _at(b, i, lit):
    """Whether ``lit`` is at ``b[i:]`` (stops at the first difference: the end's zero bytes
    differ from every literal)."""
    for k in range(len(lit)):
        if b[i + k] != lit[k]:
            return False
    return True


@njit(cache=True, nogil=True)
def _compact_kv(b, i, kv, row, keys):
    """The attribute at ``i`` if it is in the compact form ``{"key":"K","value":{"T":V}}``
    (one value of type T = intValue / stringValue / doubleValue, no escapes, no spaces) into
    ``kv[row]``: the index after it, or -1 (then read by the general path, which reads the
    same values)."""
    if not _at(b, i, _P_KEY):
        return _ERR
    ks = i + len(_P_KEY)
    j = ks
    c = b[j]
    h = np.uint64(0)
    while c != 34 and c != 92 and c >= 32:
        h = h * np.uint64(31) + np.uint64(c)
        j += 1
        c = b[j]
    if c != 34 or not _at(b, j, _P_VALUE):
        return _ERR
    ke = j
    t = j + len(_P_VALUE)
    if _at(b, t, _P_INT):
        vs = t + len(_P_INT)
        j = vs
        c = b[j]
        while c != 34 and c != 92 and c >= 32:
            j += 1
            c = b[j]
        if c != 34:
            return _ERR
        v, ok = _int_text(b, vs, j)
        flags = HAS_INT | (INT_OK if ok else 0)
        kv[KV_INT, row] = v
        j += 1
    elif _at(b, t, _P_STR):
        vs = t + len(_P_STR)
        j = vs
        c = b[j]
        while c != 34 and c != 92 and c >= 32:
            j += 1
            c = b[j]
        if c != 34:
            return _ERR
        flags = HAS_STR
        kv[KV_STR_S, row] = vs
        kv[KV_STR_E, row] = j
        j += 1
    elif _at(b, t, _P_DBL):
        vs = t + len(_P_DBL)
        c = b[vs]
        if not (c == 45 or 48 <= c <= 57):
            return _ERR
        j = _number(b, vs)
        if j < 0:
            return _ERR
        flags = HAS_DBL
        kv[KV_DBL_S, row] = vs
        kv[KV_DBL_E, row] = j
    else:
        return _ERR
    if b[j] != 125 or b[j + 1] != 125:
        return _ERR
    kv[KV_KEY, row] = _match(b, ks, ke, h, keys)
    kv[KV_FLAGS, row] = flags
    return j + 2


@njit(cache=True, nogil=True)
def _hash_of(b, s, e):
    h = np.uint64(0)
    for k in range(s, e):
        h = h * np.uint64(31) + np.uint64(b[k])
    return h


@njit(cache=True, nogil=True)
def _match(b, s, e, h, table):
    """Index of the name ``b[s:e]`` (of hash ``h``) in a :func:`names_table`, or -1."""
    cat, off, lens, slots = table
    n = e - s
    j = np.int64(h & np.uint64(len(slots) - 1))
    while True:
        k = slots[j]
        if k < 0:
            return -1
        if lens[k] == n:
            o = off[k]
            same = True
            for q in range(n - 1, -1, -1):
                if b[s + q] != cat[o + q]:
                    same = False
                    break
            if same:
                return k
        j = (j + 1) & (len(slots) - 1)


@njit(cache=True, nogil=True)
def _key(b, i):
    """``b[i]`` opens a key: (start, end of its text, index after the colon and spaces), or
    -1 as the last item on error (an escaped key is returned with start -1: no field)."""
    if b[i] != 34:
        return 0, 0, _ERR
    j, esc = _string(b, i)
    if j < 0:
        return 0, 0, _ERR
    s, e = i + 1, j - 1
    j = _ws(b, j)
    if b[j] != 58:
        return 0, 0, _ERR
    if esc:
        s = -1
    return s, e, _ws(b, j + 1)


@njit(cache=True, nogil=True)
def _next(b, i, close):
    """After a member or element: (index of the next one, False), (index after ``close``,
    True), or (-1, True)."""
    i = _ws(b, i)
    c = b[i]
    if c == 44:
        return _ws(b, i + 1), False
    if c == close:
        return i + 1, True
    return _ERR, True


@njit(cache=True, nogil=True)
def _plain_string(b, i):
    """A string without escapes at ``i``: (start, end of its text, index after it), or -1."""
    if b[i] != 34:
        return 0, 0, _ERR
    j, esc = _string(b, i)
    if j < 0 or esc:
        return 0, 0, _ERR
    return i + 1, j - 1, j


@njit(cache=True, nogil=True)
def _value(b, i, kv, row, stack):
    """The ``value`` object of an attribute into ``kv[row]``; index after it or -1."""
    i = _ws(b, i + 1)
    if b[i] == 125:
        return i + 1
    seen = 0
    while True:
        s, e, i = _key(b, i)
        if i < 0:
            return _ERR
        if s >= 0 and _eq(b, s, e, _F_STRING):
            if seen & 1:
                return _ERR
            seen |= 1
            vs, ve, i = _plain_string(b, i)
            if i < 0:
                return _ERR
            kv[KV_FLAGS, row] |= HAS_STR
            kv[KV_STR_S, row] = vs
            kv[KV_STR_E, row] = ve
        elif s >= 0 and _eq(b, s, e, _F_INTV):
            if seen & 2:
                return _ERR
            seen |= 2
            vs, ve, i = _plain_string(b, i)
            if i < 0:
                return _ERR
            v, ok = _int_text(b, vs, ve)
            kv[KV_FLAGS, row] |= HAS_INT | (INT_OK if ok else 0)
            kv[KV_INT, row] = v
        elif s >= 0 and _eq(b, s, e, _F_DOUBLE):
            if seen & 4:
                return _ERR
            seen |= 4
            c = b[i]
            if not (c == 45 or 48 <= c <= 57):
                return _ERR
            j = _number(b, i)
            if j < 0:
                return _ERR
            kv[KV_FLAGS, row] |= HAS_DBL
            kv[KV_DBL_S, row] = i
            kv[KV_DBL_E, row] = j
            i = j
        else:
            i = _skip(b, i, stack)
            if i < 0:
                return _ERR
        i, end = _next(b, i, 125)
        if end:
            return i


@njit(cache=True, nogil=True)
def _attributes(b, i, kv, cnt, slot, parent, keys, stack):
    """A list of attributes at ``i`` into ``kv`` (rows counted in ``cnt[slot]``); index after
    it or -1."""
    if b[i] != 91:
        return _ERR
    i = _ws(b, i + 1)
    if b[i] == 93:
        return i + 1
    while True:
        if b[i] != 123:
            return _ERR
        row = cnt[slot]
        if row >= kv.shape[1]:
            return _ERR
        cnt[slot] = row + 1
        kv[KV_PARENT, row] = parent
        j = _compact_kv(b, i, kv, row, keys)
        if j >= 0:
            i, end = _next(b, j, 93)
            if end:
                return i
            continue
        kv[KV_KEY, row] = -1
        kv[KV_FLAGS, row] = 0
        i = _ws(b, i + 1)
        if b[i] != 125:
            seen = 0
            while True:
                s, e, i = _key(b, i)
                if i < 0:
                    return _ERR
                if s >= 0 and _eq(b, s, e, _F_KEY):
                    if seen & 1:
                        return _ERR
                    seen |= 1
                    ks, ke, i = _plain_string(b, i)
                    if i < 0:
                        return _ERR
                    kv[KV_KEY, row] = _match(b, ks, ke, _hash_of(b, ks, ke), keys)
                elif s >= 0 and _eq(b, s, e, _F_VALUE):
                    if seen & 2 or b[i] != 123:
                        return _ERR
                    seen |= 2
                    i = _value(b, i, kv, row, stack)
                    if i < 0:
                        return _ERR
                else:
                    i = _skip(b, i, stack)
                    if i < 0:
                        return _ERR
                i, end = _next(b, i, 125)
                if end:
                    break
            if i < 0:
                return _ERR
        else:
            i += 1
        i, end = _next(b, i, 93)
        if end:
            return i


@njit(cache=True, nogil=True)
def _events(b, i, ev, ekv, cnt, span, keys, names, stack):
    """A span's list of events at ``i``; index after it or -1."""
    if b[i] != 91:
        return _ERR
    i = _ws(b, i + 1)
    if b[i] == 93:
        return i + 1
    while True:
        if b[i] != 123:
            return _ERR
        row = cnt[1]
        if row >= ev.shape[1]:
            return _ERR
        cnt[1] = row + 1
        ev[EV_SPAN, row] = span
        ev[EV_NAME, row] = -1
        i = _ws(b, i + 1)
        seen = 0
        if b[i] != 125:
            while True:
                s, e, i = _key(b, i)
                if i < 0:
                    return _ERR
                if s >= 0 and _eq(b, s, e, _F_NAME):
                    if seen & 1:
                        return _ERR
                    seen |= 1
                    ns, ne, i = _plain_string(b, i)
                    if i < 0:
                        return _ERR
                    code = _match(b, ns, ne, _hash_of(b, ns, ne), names)
                    if code < 0:
                        return _ERR  # an unknown event
                    ev[EV_NAME, row] = code
                elif s >= 0 and _eq(b, s, e, _F_ATTRIBUTES):
                    if seen & 2:
                        return _ERR
                    seen |= 2
                    i = _attributes(b, i, ekv, cnt, 3, row, keys, stack)
                    if i < 0:
                        return _ERR
                else:
                    i = _skip(b, i, stack)
                    if i < 0:
                        return _ERR
                i, end = _next(b, i, 125)
                if end:
                    break
            if i < 0:
                return _ERR
        else:
            i += 1
        if not seen & 1:
            return _ERR  # no name
        i, end = _next(b, i, 93)
        if end:
            return i


@njit(cache=True, nogil=True)
def _span(b, i, sp, ev, skv, ekv, cnt, keys, names, stack):
    """One span object at ``i`` (its row is ``cnt[0]``); index after it or -1."""
    row = cnt[0]
    if row >= sp.shape[1]:
        return _ERR
    cnt[0] = row + 1
    for k in range(SP_WIDTH):
        sp[k, row] = 0
    i = _ws(b, i + 1)
    if b[i] == 125:
        return _ERR  # no traceId
    seen = 0
    while True:
        s, e, i = _key(b, i)
        if i < 0:
            return _ERR
        if s >= 0 and _eq(b, s, e, _F_TRACE_ID):
            if seen & 1:
                return _ERR
            seen |= 1
            vs, ve, i = _plain_string(b, i)
            sp[SP_TRACE_S, row], sp[SP_TRACE_E, row] = vs, ve
        elif s >= 0 and _eq(b, s, e, _F_SPAN_ID):
            if seen & 2:
                return _ERR
            seen |= 2
            vs, ve, i = _plain_string(b, i)
            sp[SP_ID_S, row], sp[SP_ID_E, row] = vs, ve
        elif s >= 0 and _eq(b, s, e, _F_PARENT):
            if seen & 4:
                return _ERR
            seen |= 4
            vs, ve, i = _plain_string(b, i)
            sp[SP_PAR_S, row], sp[SP_PAR_E, row] = vs, ve
        elif s >= 0 and _eq(b, s, e, _F_ATTRIBUTES):
            if seen & 8:
                return _ERR
            seen |= 8
            i = _attributes(b, i, skv, cnt, 2, row, keys, stack)
        elif s >= 0 and _eq(b, s, e, _F_EVENTS):
            if seen & 16:
                return _ERR
            seen |= 16
            i = _events(b, i, ev, ekv, cnt, row, keys, names, stack)
        elif s >= 0 and _eq(b, s, e, _F_DROPPED):
            if seen & 32:
                return _ERR
            seen |= 32
            if b[i] != 48:  # only 0 (anything else is for the line path to count)
                return _ERR
            i += 1
        elif s >= 0 and _eq(b, s, e, _F_STATUS):
            if seen & 64 or b[i] != 123:
                return _ERR
            seen |= 64
            sp[SP_STATUS, row] = 1
            i = _ws(b, i + 1)
            if b[i] == 125:
                i += 1
            else:
                seen_code = False
                while True:
                    ks, ke, i = _key(b, i)
                    if i < 0:
                        return _ERR
                    if ks >= 0 and _eq(b, ks, ke, _F_CODE):
                        if seen_code:
                            return _ERR
                        seen_code = True
                        j = _number(b, i)
                        if j < 0:
                            return _ERR
                        v, ok = _int_text(b, i, j)
                        if not ok:
                            return _ERR
                        sp[SP_CODE, row] = v
                        i = j
                    else:
                        i = _skip(b, i, stack)
                        if i < 0:
                            return _ERR
                    i, end = _next(b, i, 125)
                    if end:
                        break
        else:
            i = _skip(b, i, stack)
        if i < 0:
            return _ERR
        i, end = _next(b, i, 125)
        if end:
            break
    if i < 0 or (seen & 3) != 3:
        return _ERR  # no traceId or spanId
    return i


@njit(cache=True, nogil=True)
def _list_of(b, i):
    """``b[i]`` opens a non-empty list of objects: index of its first element; or the index
    after ``[]`` as (index, True); -1 on error."""
    if b[i] != 91:
        return _ERR, True
    i = _ws(b, i + 1)
    if b[i] == 93:
        return i + 1, True
    if b[i] != 123:
        return _ERR, True
    return i, False


@njit(cache=True, nogil=True)
def _scope_spans(b, i, sp, ev, skv, ekv, cnt, keys, names, scopes, stack):
    """One scopeSpans object; index after it or -1."""
    first = cnt[0]
    scope = -1
    i = _ws(b, i + 1)
    if b[i] == 125:
        return _ERR  # no scope
    seen = 0
    while True:
        s, e, i = _key(b, i)
        if i < 0:
            return _ERR
        if s >= 0 and _eq(b, s, e, _F_SCOPE):
            if seen & 1 or b[i] != 123:
                return _ERR
            seen |= 1
            i = _ws(b, i + 1)
            if b[i] != 125:
                seen_name = False
                while True:
                    ks, ke, i = _key(b, i)
                    if i < 0:
                        return _ERR
                    if ks >= 0 and _eq(b, ks, ke, _F_NAME):
                        if seen_name:
                            return _ERR
                        seen_name = True
                        ns, ne, i = _plain_string(b, i)
                        if i < 0:
                            return _ERR
                        scope = _match(b, ns, ne, _hash_of(b, ns, ne), scopes)
                    else:
                        i = _skip(b, i, stack)
                        if i < 0:
                            return _ERR
                    i, end = _next(b, i, 125)
                    if end:
                        break
                if i < 0:
                    return _ERR
            else:
                i += 1
        elif s >= 0 and _eq(b, s, e, _F_SPANS):
            if seen & 2:
                return _ERR
            seen |= 2
            i, empty = _list_of(b, i)
            if i < 0:
                return _ERR
            if not empty:
                while True:
                    if b[i] != 123:
                        return _ERR
                    i = _span(b, i, sp, ev, skv, ekv, cnt, keys, names, stack)
                    if i < 0:
                        return _ERR
                    i, end = _next(b, i, 93)
                    if end:
                        break
        else:
            i = _skip(b, i, stack)
        if i < 0:
            return _ERR
        i, end = _next(b, i, 125)
        if end:
            break
    if i < 0 or scope < 0:
        return _ERR  # no scope name, or an unknown one
    for r in range(first, cnt[0]):
        sp[SP_SCOPE, r] = scope
    return i


@njit(cache=True, nogil=True)
def _resource_spans(b, i, sp, ev, skv, ekv, cnt, keys, names, scopes, stack):
    """One resourceSpans object (its ``scopeSpans`` list required); index after it or -1."""
    i = _ws(b, i + 1)
    if b[i] == 125:
        return _ERR
    seen = False
    while True:
        s, e, i = _key(b, i)
        if i < 0:
            return _ERR
        if s >= 0 and _eq(b, s, e, _F_SCOPE_SPANS):
            if seen:
                return _ERR
            seen = True
            i, empty = _list_of(b, i)
            if i < 0:
                return _ERR
            if not empty:
                while True:
                    if b[i] != 123:
                        return _ERR
                    i = _scope_spans(b, i, sp, ev, skv, ekv, cnt, keys, names, scopes, stack)
                    if i < 0:
                        return _ERR
                    i, end = _next(b, i, 93)
                    if end:
                        break
        else:
            i = _skip(b, i, stack)
        if i < 0:
            return _ERR
        i, end = _next(b, i, 125)
        if end:
            break
    if i < 0 or not seen:
        return _ERR
    return i


@njit(cache=True, nogil=True)
def _line(b, i, sp, ev, skv, ekv, cnt, keys, names, scopes, stack):
    """The object of one line (its ``resourceSpans`` list required); index after it or -1."""
    i = _ws(b, i + 1)
    if b[i] == 125:
        return _ERR
    seen = False
    while True:
        s, e, i = _key(b, i)
        if i < 0:
            return _ERR
        if s >= 0 and _eq(b, s, e, _F_RESOURCE_SPANS):
            if seen:
                return _ERR
            seen = True
            i, empty = _list_of(b, i)
            if i < 0:
                return _ERR
            if not empty:
                while True:
                    if b[i] != 123:
                        return _ERR
                    i = _resource_spans(b, i, sp, ev, skv, ekv, cnt, keys, names, scopes,
                                        stack)
                    if i < 0:
                        return _ERR
                    i, end = _next(b, i, 93)
                    if end:
                        break
        else:
            i = _skip(b, i, stack)
        if i < 0:
            return _ERR
        i, end = _next(b, i, 125)
        if end:
            break
    if i < 0 or not seen:
        return _ERR
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
        i = _ws(b, i)
        if i >= n:
            return lines
        c = b[i]
        if c == 10:
            i += 1
            continue
        if c != 123:
            return _ERR
        i = _line(b, i, sp, ev, skv, ekv, cnt, keys, names, scopes, stack)
        if i < 0:
            return _ERR
        lines += 1
        i = _ws(b, i)
        if i >= n:
            return lines
        if b[i] != 10:
            return _ERR
        i += 1


@njit(cache=True, nogil=True)
def gather(b, starts, ends):
    """The byte ranges ``b[starts[k]:ends[k]]`` one after the other, and their offsets (the
    buffers of an Arrow ``large_string`` array)."""
    m = len(starts)
    off = np.empty(m + 1, dtype=np.int64)
    off[0] = 0
    for k in range(m):
        off[k + 1] = off[k] + (ends[k] - starts[k])
    data = np.empty(max(off[m], 1), dtype=np.uint8)
    for k in range(m):
        o = off[k]
        s = starts[k]
        for j in range(ends[k] - s):
            data[o + j] = b[s + j]
    return data, off


@njit(cache=True, nogil=True)
def group_by_key(raw, remap, parent, group, known):
    """The known attributes grouped by key: attribute ``r`` has key ``remap[raw[r]]`` (-1:
    none; ``remap[-1]`` is -1) and is known when ``known[group[parent[r]], key]``. Returns the
    known rows ordered by key, stably (so by parent within a key), the bounds of each key in
    that order, and whether some parent holds a key twice."""
    m = len(raw)
    n_keys = known.shape[1]
    code = np.empty(m, dtype=np.int64)
    counts = np.zeros(n_keys + 1, dtype=np.int64)
    for r in range(m):
        c = remap[raw[r]]
        if c >= 0 and not known[group[parent[r]], c]:
            c = -1
        code[r] = c
        if c >= 0:
            counts[c + 1] += 1
    bounds = np.cumsum(counts)
    pos = bounds[:-1].copy()
    order = np.empty(bounds[n_keys], dtype=np.int64)
    for r in range(m):
        c = code[r]
        if c >= 0:
            order[pos[c]] = r
            pos[c] += 1
    dup = False
    for k in range(n_keys):
        for q in range(bounds[k] + 1, bounds[k + 1]):
            if parent[order[q]] == parent[order[q - 1]]:
                dup = True
    return order, bounds, dup
