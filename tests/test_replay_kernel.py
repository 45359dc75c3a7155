"""The compiled replay (``data/rebuild/kernel.py``) against the pure-Python loop it replaced
(``tests/replay_reference.py``): identical chunks, prefixes, flags, pins and issue counts (in
the same first-occurrence order) on drawn segments, with and without prefix caching, guesses
and sampled summaries near and off the replayed totals."""

from __future__ import annotations

import numpy as np
import pytest

from bayes_latency.data.rebuild.replay import _replay
from bayes_latency.data.rebuild.segments import _GREEDY, _Segments
from tests.replay_reference import _replay as _replay_ref

pytestmark = pytest.mark.cpu_sensitive  # float results: .ci/run reruns them without AVX-512


def _draw(rng: np.random.Generator, n_seg: int, s0: int, n_steps: int, block: int
          ) -> tuple[_Segments, int, np.ndarray]:
    s1 = s0 + n_steps - 1
    start = np.sort(rng.integers(s0 - 2, s1 + 3, n_seg))  # a few outside s0..s1
    end = np.minimum(start + rng.integers(0, 40, n_seg), s1)
    end = np.where(rng.random(n_seg) < 0.03, start - 1, end)  # rare end < start
    total = rng.integers(0, 3000, n_seg)
    small = rng.random(n_seg) < 0.1
    total[small] = rng.integers(1, 2 * block + 1, small.sum())
    u = rng.random(n_seg)
    comp = np.where(u < 0.3, _GREEDY, start + rng.integers(0, 6, n_seg))
    comp = np.where((u > 0.9), end + 1, comp)
    seg = _Segments(req=list(range(n_seg)), start=start.tolist(), end=end.tolist(),
                    total=total.tolist(), d_r=[0] * n_seg, complete=comp.tolist())
    ndec = rng.integers(0, 30, n_steps).astype(np.int64)
    return seg, s1, ndec


def _same(a, b) -> None:
    for f in ("m_step", "m_seg", "m_tok", "m_done"):
        np.testing.assert_array_equal(np.asarray(getattr(a, f), dtype=np.int64),
                                      np.asarray(getattr(b, f), dtype=np.int64), err_msg=f)
    np.testing.assert_array_equal(a.h, b.h)
    np.testing.assert_array_equal(a.ambiguous, b.ambiguous)
    assert sorted(a.amb_steps) == b.amb_steps.tolist()
    dyn = np.full(len(a.h), _GREEDY, dtype=np.int64)
    for j, c in a.dyn_complete.items():
        dyn[j] = c
    np.testing.assert_array_equal(dyn, b.dyn_complete)
    assert list(a.pinned) == b.pinned.tolist()
    assert list(a.issues.items()) == list(b.issues.items())


@pytest.mark.parametrize("seed", range(24))
def test_kernel_equals_python_loop(seed: int) -> None:
    rng = np.random.default_rng(seed)
    block = int(rng.choice([1, 16, 32]))
    s0 = int(rng.integers(1, 50))
    seg, s1, ndec = _draw(rng, int(rng.integers(1, 300)), s0, int(rng.integers(1, 400)), block)
    budget = int(rng.choice([24, 64, 512, 2048, 8192]))
    caching = bool(seed % 3)
    guess = None if seed % 2 else int(rng.integers(0, 40)) * block
    # summaries: the replayed totals of some steps, some moved by a few blocks, some off range
    free = _replay_ref(seg, s0, s1, ndec, budget, block, caching, guess, {})
    tot = ndec.copy()
    np.add.at(tot, np.asarray(free.m_step, dtype=np.int64) - s0,
              np.asarray(free.m_tok, dtype=np.int64))
    steps = rng.choice(np.arange(s0 - 3, s1 + 4), size=min(80, s1 - s0 + 7), replace=False)
    summary = {}
    for s in steps.tolist():
        base = int(tot[s - s0]) if s0 <= s <= s1 else 100
        summary[s] = max(base + int(rng.choice([0, 0, 0, -1, 1, -3, 2])) * block
                         + int(rng.integers(0, 3)) * (rng.random() < 0.2), 0)
    for sm in ({}, summary):
        _same(_replay_ref(seg, s0, s1, ndec, budget, block, caching, guess, sm),
              _replay(seg, s0, s1, ndec, budget, block, caching, guess, sm))


def test_kernel_pins_and_issues_are_exercised() -> None:
    """The drawn cases above reach the pinning, refit and every issue kind (else the
    comparison would prove little)."""
    pins = 0
    kinds: set[str] = set()
    for seed in range(24):
        rng = np.random.default_rng(seed)
        block = int(rng.choice([1, 16, 32]))
        s0 = int(rng.integers(1, 50))
        seg, s1, ndec = _draw(rng, int(rng.integers(1, 300)), s0, int(rng.integers(1, 400)),
                              block)
        budget = int(rng.choice([24, 64, 512, 2048, 8192]))
        r = _replay(seg, s0, s1, ndec, budget, block, True, None, {})
        tot = ndec.copy()
        np.add.at(tot, r.m_step - s0, r.m_tok)
        summary = dict(zip(range(s0, s1 + 1), tot.tolist(), strict=True))
        r2 = _replay(seg, s0, s1, ndec, budget, block, True, None, summary)
        pins += len(r2.pinned)
        kinds |= set(r.issues) | set(r2.issues)
    assert pins > 0
    assert kinds == {"completion_late", "chunk_over_budget", "decodes_over_budget"}


def test_empty_and_single_step() -> None:
    seg = _Segments()
    r = _replay(seg, 1, 1, np.zeros(1, np.int64), 10, 16, True, None, {})
    assert len(r.m_step) == 0 and len(r.pinned) == 0 and not r.issues
    seg = _Segments(req=[0], start=[1], end=[1], total=[5], d_r=[0], complete=[1])
    for caching in (False, True):
        _same(_replay_ref(seg, 1, 1, np.array([20]), 10, 16, caching, None, {1: 25}),
              _replay(seg, 1, 1, np.array([20]), 10, 16, caching, None, {1: 25}))


def _journeys(rng: np.random.Generator, n_req: int) -> dict[str, np.ndarray]:
    """Journey rows sorted as ``reconstruct`` sorts them (request, step, rank, time, row), with
    the odd cases: missing or repeated events, orphans, requests without an id (-1)."""
    names = np.array(["QUEUED", "PREEMPTED", "SCHEDULED", "FIRST_TOKEN", "FINISHED"], dtype=object)
    rows = []
    for r in range(-1, n_req):
        s = int(rng.integers(0, 50))
        d = 0
        for _ in range(int(rng.integers(1, 9))):
            k = int(rng.choice(5, p=[0.1, 0.2, 0.35, 0.15, 0.2]))
            s += int(rng.integers(0, 4))
            d += int(rng.integers(0, 5))
            rows.append((r, s, k, int(rng.integers(0, 3)), int(rng.integers(0, 900)), d))
    a = np.array(rows, dtype=np.int64).reshape(-1, 6)
    row = rng.permutation(len(a))
    order = np.lexsort((row, a[:, 3], a[:, 2], a[:, 1], a[:, 0]))
    return {"_req": a[order, 0], "step": a[order, 1], "_rank": a[order, 2],
            "event": names[a[order, 2]], "_ts": a[order, 3], "_row": row[order],
            "prefill_total": a[order, 4], "decode_done": a[order, 5]}


@pytest.mark.parametrize("seed", range(12))
def test_segments_kernel_equals_python_loop(seed: int) -> None:
    from collections import Counter

    from bayes_latency.data.rebuild.replay import _segments
    from tests.replay_reference import _segments as _segments_ref

    rng = np.random.default_rng(seed)
    ev = _journeys(rng, int(rng.integers(0, 200)))
    last = int(ev["step"].max()) - int(rng.integers(0, 5)) if len(ev["step"]) else 0
    ia, ib = Counter(unknown_event=2), Counter(unknown_event=2)
    a = _segments_ref(ev, last, ia)
    no_rank = {k: v for k, v in ev.items() if k != "_rank"}
    b = _segments(ev if seed % 2 else no_rank, last, ib)
    for f in ("req", "start", "end", "total", "d_r", "complete"):
        assert list(getattr(a, f)) == np.asarray(getattr(b, f)).tolist(), f
    assert list(ia.items()) == list(ib.items())
    # admission order: the former dict-and-sorted code against the lexsort on b.sched
    is_sched = ev["_rank"] == 2
    key = list(zip(ev["_req"][is_sched].tolist(), ev["step"][is_sched].tolist(), strict=True))
    key_ts = dict(zip(key, ev["_ts"][is_sched].tolist(), strict=True))
    key_row = dict(zip(key, ev["_row"][is_sched].tolist(), strict=True))
    old = sorted(range(len(a.req)), key=lambda j: (
        a.start[j], key_ts.get((a.req[j], a.start[j]), 0),
        key_row.get((a.req[j], a.start[j]), 0)))
    new = np.lexsort((ev["_row"][b.sched], ev["_ts"][b.sched], b.start))
    assert old == new.tolist()
