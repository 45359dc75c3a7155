"""Compiled column builders of the OTLP chunk reader (numba, ``cache=True``): the byte ranges
the scanner found copied into Arrow string buffers (:func:`gather`), and the known attributes
grouped by key (:func:`group_by_key`), for :mod:`bayes_latency.data.otlp.chunks`.
"""

from __future__ import annotations

import numpy as np
from numba import njit


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
