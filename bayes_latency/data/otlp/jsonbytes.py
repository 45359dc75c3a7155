"""Byte-level JSON primitives of the compiled OTLP scanner (numba, ``cache=True``).

Each function reads a ``uint8`` buffer ``b`` (the chunk, followed by zero bytes) at an index and
returns the index after what it read, or :data:`ERR` (-1) on anything that is not valid JSON:
whitespace, strings (with whether they hold a backslash escape), numbers, integers given as text,
any value skipped whole (nesting followed on an explicit stack: deeper refuses), literal matches,
object keys and list/object separators. :func:`names_table` and :func:`match_name` look byte
ranges up among known names by hash. :mod:`bayes_latency.data.otlp.scan` builds the OTLP
structure on them.
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: What a primitive returns for an index when the bytes are not what it reads.
ERR = -1


def literal(s: str) -> np.ndarray:
    """The bytes of ``s`` as a ``uint8`` array (the kernels compare buffers against them)."""
    return np.frombuffer(s.encode(), dtype=np.uint8).copy()


_LIM_POS = literal("9223372036854775807")
_LIM_NEG = literal("9223372036854775808")


def hash_name(data: bytes) -> int:
    """:func:`hash_of` in Python (64-bit wrap-around)."""
    h = 0
    for c in data:
        h = (h * 31 + c) & 0xFFFFFFFFFFFFFFFF
    return h


#: Slots of a :func:`names_table` (a power of two).
_SLOTS = 1024


def names_table(names: tuple[str, ...] | list[str]) -> tuple[np.ndarray, ...]:
    """Lookup table of ``names`` for :func:`match_name`: (their concatenated bytes, the offset and
    length of each, the hash slots: the index of the name there or -1, by open addressing)."""
    enc = [n.encode() for n in names]
    cat = np.frombuffer(b"".join(enc) + b"\0", dtype=np.uint8).copy()
    off = np.zeros(len(enc), dtype=np.int64)
    lens = np.array([len(e) for e in enc], dtype=np.int64)
    off[1:] = np.cumsum(lens)[:-1]
    slots = np.full(_SLOTS, -1, dtype=np.int64)
    for k, e in enumerate(enc):
        j = hash_name(e) & (_SLOTS - 1)
        while slots[j] >= 0:
            j = (j + 1) & (_SLOTS - 1)
        slots[j] = k
    return cat, off, lens, slots


@njit(cache=True, nogil=True)
def skip_ws(b, i):
    c = b[i]
    while c == 32 or c == 9:
        i += 1
        c = b[i]
    return i


@njit(cache=True, nogil=True)
def scan_string(b, i):
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
            return ERR, esc
        if c < 32:  # also the sentinel 0 at the end and a new line
            return ERR, esc
        i += 1


@njit(cache=True, nogil=True)
def scan_digits(b, i):
    c = b[i]
    while 48 <= c <= 57:
        i += 1
        c = b[i]
    return i


@njit(cache=True, nogil=True)
def scan_number(b, i):
    """End of the JSON number at ``i`` (strict grammar), or -1."""
    if b[i] == 45:
        i += 1
    c = b[i]
    if c == 48:
        i += 1
    elif 49 <= c <= 57:
        i = scan_digits(b, i + 1)
    else:
        return ERR
    if b[i] == 46:
        if not 48 <= b[i + 1] <= 57:
            return ERR
        i = scan_digits(b, i + 1)
    c = b[i]
    if c == 101 or c == 69:
        i += 1
        if b[i] == 43 or b[i] == 45:
            i += 1
        if not 48 <= b[i] <= 57:
            return ERR
        i = scan_digits(b, i)
    return i


@njit(cache=True, nogil=True)
def parse_int(b, s, e):
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
def skip_value(b, i, stack):
    """End of the JSON value at ``i`` (checked, not kept), or -1."""
    depth = 0
    while True:
        c = b[i]
        done = True
        if c == 123 or c == 91:
            if depth >= len(stack):
                return ERR
            stack[depth] = c
            depth += 1
            i = skip_ws(b, i + 1)
            if (c == 123 and b[i] == 125) or (c == 91 and b[i] == 93):
                i += 1
                depth -= 1
            else:
                if c == 123:
                    _s, _e, i = read_key(b, i)
                    if i < 0:
                        return ERR
                done = False
        elif c == 34:
            i, _e = scan_string(b, i)
            if i < 0:
                return ERR
        elif c == 45 or 48 <= c <= 57:
            i = scan_number(b, i)
            if i < 0:
                return ERR
        elif c == 116:
            if b[i + 1] != 114 or b[i + 2] != 117 or b[i + 3] != 101:
                return ERR
            i += 4
        elif c == 102:
            if b[i + 1] != 97 or b[i + 2] != 108 or b[i + 3] != 115 or b[i + 4] != 101:
                return ERR
            i += 5
        elif c == 110:
            if b[i + 1] != 117 or b[i + 2] != 108 or b[i + 3] != 108:
                return ERR
            i += 4
        else:
            return ERR
        if not done:
            continue
        # after a value: close containers, or move to the next element
        while True:
            if depth == 0:
                return i
            i = skip_ws(b, i)
            top = stack[depth - 1]
            c = b[i]
            if c == 44:
                i = skip_ws(b, i + 1)
                if top == 123:
                    _s, _e, i = read_key(b, i)
                    if i < 0:
                        return ERR
                break
            if (c == 125 and top == 123) or (c == 93 and top == 91):
                i += 1
                depth -= 1
                continue
            return ERR


@njit(cache=True, nogil=True)
def starts_with(b, i, lit):
    """Whether ``lit`` is at ``b[i:]`` (stops at the first difference: the end's zero bytes
    differ from every literal)."""
    for k in range(len(lit)):
        if b[i + k] != lit[k]:
            return False
    return True


@njit(cache=True, nogil=True)
def equals(b, s, e, lit):
    """Whether ``b[s:e]`` is exactly ``lit``."""
    return e - s == len(lit) and starts_with(b, s, lit)


@njit(cache=True, nogil=True)
def hash_of(b, s, e):
    h = np.uint64(0)
    for k in range(s, e):
        h = h * np.uint64(31) + np.uint64(b[k])
    return h


@njit(cache=True, nogil=True)
def match_name(b, s, e, h, table):
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
def read_key(b, i):
    """``b[i]`` opens a key: (start, end of its text, index after the colon and spaces), or
    -1 as the last item on error (an escaped key is returned with start -1: no field)."""
    if b[i] != 34:
        return 0, 0, ERR
    j, esc = scan_string(b, i)
    if j < 0:
        return 0, 0, ERR
    s, e = i + 1, j - 1
    j = skip_ws(b, j)
    if b[j] != 58:
        return 0, 0, ERR
    if esc:
        s = -1
    return s, e, skip_ws(b, j + 1)


@njit(cache=True, nogil=True)
def next_item(b, i, close):
    """After a member or element: (index of the next one, False), (index after ``close``,
    True), or (-1, True)."""
    i = skip_ws(b, i)
    c = b[i]
    if c == 44:
        return skip_ws(b, i + 1), False
    if c == close:
        return i + 1, True
    return ERR, True


@njit(cache=True, nogil=True)
def plain_string(b, i):
    """A string without escapes at ``i``: (start, end of its text, index after it), or -1."""
    if b[i] != 34:
        return 0, 0, ERR
    j, esc = scan_string(b, i)
    if j < 0 or esc:
        return 0, 0, ERR
    return i + 1, j - 1, j
