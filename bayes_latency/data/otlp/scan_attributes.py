"""Compiled reader of one OTLP attribute list: the attribute table of the scanner's fast path.

:func:`_attributes` (numba, ``cache=True``) reads a list of ``{"key": K, "value": {T: V}}``
objects at a byte offset into rows of the attribute table (:data:`KV_WIDTH` columns: the owner,
the key's index among the reader's known keys, flags saying which value types are there, the byte
range of a ``stringValue``, an ``intValue`` string already parsed to int64, the byte range of a
``doubleValue`` number). The compact form ``{"key":"K","value":{"intValue":"1"}}`` (no escapes,
no spaces) takes a fast path (:func:`_compact_kv`); anything else goes through the general one
(:func:`_value`), which reads the same values. It refuses (returns -1) what
:mod:`bayes_latency.data.otlp.scan` refuses. :mod:`bayes_latency.data.otlp.chunks` reads the
table back by these column numbers.
"""

from __future__ import annotations

import numpy as np
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
    starts_with,
)

# attribute table columns (flags: bit 0 stringValue, 1 intValue, 2 intValue parsed, 3 doubleValue)
KV_PARENT, KV_KEY, KV_FLAGS, KV_STR_S, KV_STR_E, KV_INT, KV_DBL_S, KV_DBL_E = range(8)
KV_WIDTH = 8
HAS_STR, HAS_INT, INT_OK, HAS_DBL = 1, 2, 4, 8

_F_KEY = literal("key")
_F_VALUE = literal("value")
_F_STRING = literal("stringValue")
_F_INTV = literal("intValue")
_F_DOUBLE = literal("doubleValue")

# the compact form of an attribute: {"key":"K","value":{"intValue":"1"}} (or stringValue /
# doubleValue), read by a fast path of :func:`_attributes`
_P_KEY = literal('{"key":"')
_P_VALUE = literal('","value":{"')
_P_INT = literal('intValue":"')
_P_STR = literal('stringValue":"')
_P_DBL = literal('doubleValue":')


@njit(cache=True, nogil=True)
def _compact_kv(b, i, kv, row, keys):
    """The attribute at ``i`` if it is in the compact form ``{"key":"K","value":{"T":V}}``
    (one value of type T = intValue / stringValue / doubleValue, no escapes, no spaces) into
    ``kv[row]``: the index after it, or -1 (then read by the general path, which reads the
    same values)."""
    if not starts_with(b, i, _P_KEY):
        return ERR
    ks = i + len(_P_KEY)
    j = ks
    c = b[j]
    h = np.uint64(0)
    while c != 34 and c != 92 and c >= 32:
        h = h * np.uint64(31) + np.uint64(c)
        j += 1
        c = b[j]
    if c != 34 or not starts_with(b, j, _P_VALUE):
        return ERR
    ke = j
    t = j + len(_P_VALUE)
    if starts_with(b, t, _P_INT):
        vs = t + len(_P_INT)
        j = vs
        c = b[j]
        while c != 34 and c != 92 and c >= 32:
            j += 1
            c = b[j]
        if c != 34:
            return ERR
        v, ok = parse_int(b, vs, j)
        flags = HAS_INT | (INT_OK if ok else 0)
        kv[KV_INT, row] = v
        j += 1
    elif starts_with(b, t, _P_STR):
        vs = t + len(_P_STR)
        j = vs
        c = b[j]
        while c != 34 and c != 92 and c >= 32:
            j += 1
            c = b[j]
        if c != 34:
            return ERR
        flags = HAS_STR
        kv[KV_STR_S, row] = vs
        kv[KV_STR_E, row] = j
        j += 1
    elif starts_with(b, t, _P_DBL):
        vs = t + len(_P_DBL)
        c = b[vs]
        if not (c == 45 or 48 <= c <= 57):
            return ERR
        j = scan_number(b, vs)
        if j < 0:
            return ERR
        flags = HAS_DBL
        kv[KV_DBL_S, row] = vs
        kv[KV_DBL_E, row] = j
    else:
        return ERR
    if b[j] != 125 or b[j + 1] != 125:
        return ERR
    kv[KV_KEY, row] = match_name(b, ks, ke, h, keys)
    kv[KV_FLAGS, row] = flags
    return j + 2


@njit(cache=True, nogil=True)
def _value(b, i, kv, row, stack):
    """The ``value`` object of an attribute into ``kv[row]``; index after it or -1."""
    i = skip_ws(b, i + 1)
    if b[i] == 125:
        return i + 1
    seen = 0
    while True:
        s, e, i = read_key(b, i)
        if i < 0:
            return ERR
        if s >= 0 and equals(b, s, e, _F_STRING):
            if seen & 1:
                return ERR
            seen |= 1
            vs, ve, i = plain_string(b, i)
            if i < 0:
                return ERR
            kv[KV_FLAGS, row] |= HAS_STR
            kv[KV_STR_S, row] = vs
            kv[KV_STR_E, row] = ve
        elif s >= 0 and equals(b, s, e, _F_INTV):
            if seen & 2:
                return ERR
            seen |= 2
            vs, ve, i = plain_string(b, i)
            if i < 0:
                return ERR
            v, ok = parse_int(b, vs, ve)
            kv[KV_FLAGS, row] |= HAS_INT | (INT_OK if ok else 0)
            kv[KV_INT, row] = v
        elif s >= 0 and equals(b, s, e, _F_DOUBLE):
            if seen & 4:
                return ERR
            seen |= 4
            c = b[i]
            if not (c == 45 or 48 <= c <= 57):
                return ERR
            j = scan_number(b, i)
            if j < 0:
                return ERR
            kv[KV_FLAGS, row] |= HAS_DBL
            kv[KV_DBL_S, row] = i
            kv[KV_DBL_E, row] = j
            i = j
        else:
            i = skip_value(b, i, stack)
            if i < 0:
                return ERR
        i, end = next_item(b, i, 125)
        if end:
            return i


@njit(cache=True, nogil=True)
def _attributes(b, i, kv, cnt, slot, parent, keys, stack):
    """A list of attributes at ``i`` into ``kv`` (rows counted in ``cnt[slot]``); index after
    it or -1."""
    if b[i] != 91:
        return ERR
    i = skip_ws(b, i + 1)
    if b[i] == 93:
        return i + 1
    while True:
        if b[i] != 123:
            return ERR
        row = cnt[slot]
        if row >= kv.shape[1]:
            return ERR
        cnt[slot] = row + 1
        kv[KV_PARENT, row] = parent
        j = _compact_kv(b, i, kv, row, keys)
        if j >= 0:
            i, end = next_item(b, j, 93)
            if end:
                return i
            continue
        kv[KV_KEY, row] = -1
        kv[KV_FLAGS, row] = 0
        i = skip_ws(b, i + 1)
        if b[i] != 125:
            seen = 0
            while True:
                s, e, i = read_key(b, i)
                if i < 0:
                    return ERR
                if s >= 0 and equals(b, s, e, _F_KEY):
                    if seen & 1:
                        return ERR
                    seen |= 1
                    ks, ke, i = plain_string(b, i)
                    if i < 0:
                        return ERR
                    kv[KV_KEY, row] = match_name(b, ks, ke, hash_of(b, ks, ke), keys)
                elif s >= 0 and equals(b, s, e, _F_VALUE):
                    if seen & 2 or b[i] != 123:
                        return ERR
                    seen |= 2
                    i = _value(b, i, kv, row, stack)
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
        i, end = next_item(b, i, 93)
        if end:
            return i
