"""Rebuild every engine step's batch from request journeys (the reference scheduling policy).

Step summaries are sampled (about one step in ten), but journeys are complete: every request
reports the step it was first scheduled at, preempted at, resumed at, produced its first token at
and finished at. Between those events the batch composition follows the reference scheduling
policy of ``docs/ARCHITECTURE.md``:

1. every running request whose prefill (or recompute) is complete decodes one token;
2. running partial prefills, in running (admission) order, get ``min(remaining, budget_left)``;
3. requests scheduled at this step (``SCHEDULED`` FIRST or RESUME) get their first chunk the same way.

The journeys fix *when* each request's prefill completes (``FIRST_TOKEN``; for a recompute after a
preemption, the number of tokens produced before the next ``PREEMPTED``/``FINISHED`` event), so
the replay only has to split prompt tokens into chunks. Before its completion step a prefilling
request takes all the budget left to it (it cannot have finished, else it would have produced a
token); at the completion step it takes what is left of its prompt. With prefix caching on, the
cached prefix ``h`` (a multiple of the block size) is unknown: it is chosen at the completion step
among the values that keep the last chunk within the budget, pinned by the step summary when the
step was sampled, and otherwise set to a typical value learned from the pinned requests; steps
whose chunks depend on such a guess are flagged ``prefix_ambiguous``.

Conventions of the rebuilt tables:

- ``members``: one row per (step, request) with tokens in the step: ``tokens`` (chunk size, 1 for
  a decode), ``ctx_offset`` (tokens already in the KV cache before this step, cache hits
  included), ``is_prefill`` (a prefill or recompute chunk), ``is_recompute`` (a chunk of a request
  that already has output tokens: counted as *decode* tokens in ``step.BATCH_SUMMARY``).
- ``batches``: the batch-table columns of :mod:`bayes_latency.physics.basis`, recompute chunks
  counted as prefill chunks (they are attention over a context), decode context = tokens in KV
  plus the token being decoded (``computed + 1 = prompt + outputs``, as ``prefill_kv_tokens``
  counts ``o + c``).

The code is five modules: this one (``reconstruct_batches``, the journey rows of one experiment
sorted and turned into the ``batches`` and ``members`` tables), :mod:`.segments`
(the segments of a journey), :mod:`.replay` (the compiled passes that cut journeys into segments and
replay the steps, splitting prompts into chunks), :mod:`.kernel` (their numba loops) and :mod:`.report` (``ReconstructionReport``,
``summary_convention``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from bayes_latency.data.rebuild.replay import _replay, _segments
from bayes_latency.data.rebuild.report import (
    _COMPARED,
    _SUMMARY_COLS,
    ReconstructionReport,
    summary_convention,
)
from bayes_latency.data.rebuild.segments import _GREEDY, _RANK, _interval_sums

__all__ = [
    "BATCH_COLUMNS",
    "ReconstructionReport",
    "reconstruct_batches",
    "summary_convention",
]

BATCH_COLUMNS = [
    "num_prefill_reqs",
    "prefill_tokens",
    "prefill_attn_pairs",
    "prefill_kv_tokens",
    "prefill_input_pairs",
    "num_decode_reqs",
    "decode_tokens",
    "decode_ctx_tokens",
    "offload_tokens",
]
"""Batch-table columns (see ``physics/basis.py``), in contract order."""



def _name_codes(values: pd.Series, names: list[str]) -> np.ndarray:
    """``pd.Index(names).get_indexer(values)`` for a column of text, by one ``index_in`` of its
    Arrow array (pandas converts the column first: 0.5 ms per experiment); anything but text
    takes pandas' way."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        arr = pa.array(values, from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        arr = None
    if arr is None or not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        return pd.Index(names).get_indexer(values)
    return pc.index_in(arr, value_set=pa.array(names, type=arr.type)).fill_null(-1).to_numpy(
        ).astype(np.intp)


#: Most engine steps one experiment's rebuild may span (its batch table has one row per step id
#: from the first to the last; about 150 bytes of arrays per step). The journeys span at most
#: this many steps and the sampled step summaries at most as many again (2 x 2 million steps:
#: about 0.6 GB); a vLLM engine at 30 ms per step runs 2 million steps in 17 hours.
MAX_STEP_SPAN = 2_000_000


def _step_bound(ev: dict[str, np.ndarray]) -> int:
    """The most steps the journeys can span: every engine step between a request's first and
    last event computes at least one token, so the span is at most the tokens of all requests
    (prompt + outputs + 1, once more per preemption), plus one step per request."""
    req = ev["_req"]
    ok = req >= 0
    if not ok.any():
        return 1
    r = req[ok]
    n_req = int(r.max()) + 1
    prompt = np.zeros(n_req, dtype=np.float64)
    done = np.zeros(n_req, dtype=np.float64)
    np.maximum.at(prompt, r, np.clip(ev["prefill_total"][ok], 0, None).astype(np.float64))
    np.maximum.at(done, r, np.clip(ev["decode_done"][ok], 0, None).astype(np.float64))
    preempt = np.bincount(r, weights=(ev["_rank"][ok] == _RANK["PREEMPTED"]).astype(float),
                          minlength=n_req)
    tokens = float(((prompt + done + 1) * (1 + preempt)).sum()) + n_req
    return int(min(tokens, MAX_STEP_SPAN))


def _within_step_window(ev: dict[str, np.ndarray], sid: np.ndarray, rep: ReconstructionReport
                        ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Keep the journey rows whose step ids lie in the window of :func:`_step_bound` steps that
    holds the most of them (a step id far from the rest, e.g. a corrupt ``scheduler.step``,
    would make the dense batch table span it); the rows outside are a counted issue
    (``step_out_of_range``), as are sampled step ids outside (``summary_step_out_of_range``:
    they are not used for the range).

    Returns
    -------
    ev
        The journey arrays, without the rows outside the window.
    sid
        The sampled step ids inside the window.
    """
    steps = ev["step"]
    if not len(steps):
        return ev, sid
    bound = _step_bound(ev)
    if int(steps.max()) - int(steps.min()) < bound:
        lo, hi = int(steps.min()), int(steps.max())
    else:
        srt = np.sort(steps)
        ends = np.searchsorted(srt, srt + bound, side="right")
        i = int(np.argmax(ends - np.arange(len(srt))))
        lo, hi = int(srt[i]), int(srt[i]) + bound
        keep = (steps >= lo) & (steps <= hi)
        rep.issues["step_out_of_range"] += int((~keep).sum())
        rep.notes.append(f"{int((~keep).sum())} journey event(s) with a step id outside "
                         f"{lo}..{hi} (the most steps the requests' tokens allow) dropped")
        ev = {k: v[keep] for k, v in ev.items()}
    # sampled steps: within the journeys' window widened by what is left of the bound
    slack = max(bound - (hi - lo), 0)
    inside = (sid >= lo - slack) & (sid <= hi + slack)
    if not inside.all():
        rep.issues["summary_step_out_of_range"] += int((~inside).sum())
    return ev, sid[inside]


def _one_experiment(ev: pd.DataFrame, steps: pd.DataFrame | None, serving: Any,
                    experiment_id: str, with_members: bool
                    ) -> tuple[pd.DataFrame, pd.DataFrame | None, ReconstructionReport]:
    rep = ReconstructionReport(experiment_id=experiment_id)
    budget = int(serving.max_num_batched_tokens)
    block = int(getattr(serving, "block_size", 16))
    caching = bool(getattr(serving, "prefix_caching", False))

    # the journey rows as numpy arrays (filtered, typed and sorted with numpy: the pandas
    # copy / map / astype / sort_values chain took a third of the rebuild's time)
    names = list(_RANK)
    code = _name_codes(ev["event"], names)
    known = code >= 0
    if (~known).any():
        rep.issues["unknown_event"] += int((~known).sum())
    step_na = ev["step"].isna().to_numpy(dtype=bool)
    no_step = known & step_na
    if no_step.any():
        rep.issues["event_without_step"] += int(no_step.sum())
    rows = np.flatnonzero(known & ~step_na)
    code = code[rows]
    ptot_na = ev["prefill_total"].isna().to_numpy(dtype=bool)[rows]
    no_prompt = ptot_na & (code == _RANK["SCHEDULED"])
    if no_prompt.any():
        rep.issues["scheduled_without_prompt_length"] += int(no_prompt.sum())
    # request codes in order of first appearance among the kept rows (pd.factorize of them)
    all_codes, all_uniques = pd.factorize(ev["request_id"])
    sub = all_codes[rows]
    req = np.full(len(rows), -1, dtype=np.int64)
    has = sub >= 0
    req[has], first = pd.factorize(sub[has])
    uniques = all_uniques[first]
    rank = np.asarray([_RANK[e] for e in names], dtype=np.int64)[code]
    ts = ev["ts_monotonic_ns"].fillna(0).to_numpy(dtype=np.int64)[rows]
    num = {c: pd.to_numeric(ev[c], errors="coerce").fillna(0).to_numpy(dtype=np.int64)[rows]
           for c in ("prefill_total", "decode_done")}
    step = ev["step"].to_numpy(dtype=np.int64, na_value=0)[rows]
    row = np.arange(len(rows))
    order = np.lexsort((row, ts, rank, step, req))  # = stable sort by all five
    ev = {"_req": req[order], "event": np.asarray(names, dtype=object)[code[order]],
          "step": step[order], "_rank": rank[order], "_ts": ts[order], "_row": row[order],
          "prefill_total": num["prefill_total"][order], "decode_done": num["decode_done"][order]}

    have_steps = steps is not None and len(steps) > 0
    sid = steps["step.id"].to_numpy(dtype=np.int64) if have_steps else np.empty(0, np.int64)
    ev, sid_range = _within_step_window(ev, sid, rep)
    sched = ev["_rank"] != _RANK["QUEUED"]
    lo_candidates = [ev["step"][sched].min() if sched.any() else None,
                     sid_range.min() if sid_range.size else None]
    hi_candidates = [ev["step"].max() if len(ev["step"]) else None,
                     sid_range.max() if sid_range.size else None]
    lo_candidates = [int(x) for x in lo_candidates if x is not None and not pd.isna(x)]
    hi_candidates = [int(x) for x in hi_candidates if x is not None and not pd.isna(x)]
    if not lo_candidates:
        rep.notes.append("no step ids: nothing to rebuild")
        empty = pd.DataFrame({"experiment_id": pd.Series([], dtype=str),
                              "step_id": pd.Series([], dtype="int64")})
        for c in BATCH_COLUMNS:
            empty[c] = pd.Series([], dtype="float64")
        return empty, None, rep
    s0, s1 = max(min(lo_candidates), 1), max(hi_candidates)
    n = s1 - s0 + 1

    seg = _segments(ev, s1, rep.issues)
    # keep segments in admission order: by start step, then the time and row of the (last)
    # SCHEDULED event of the request at that step; a stable sort, ties in journey order
    order = np.lexsort((ev["_row"][seg.sched], ev["_ts"][seg.sched], seg.start))
    for name in ("req", "start", "end", "total", "d_r", "complete"):
        setattr(seg, name, getattr(seg, name)[order])
    n_seg = len(seg.req)
    rep.n_steps, rep.n_requests, rep.n_segments = n, len(uniques), n_seg

    s_arr = {k: np.asarray(getattr(seg, k), dtype=np.int64)
             for k in ("req", "start", "end", "total", "d_r", "complete")}
    known = (s_arr["complete"] != _GREEDY)
    dec_first = s_arr["complete"][known] + 1
    dec_last = s_arr["end"][known]
    ndec_static, _ = _interval_sums(dec_first, dec_last, s_arr["total"][known], s0, n)

    summary_total: dict[int, int] = {}
    if have_steps and caching:
        tot = (steps["batch.prefill_tokens"].astype("float64")
               + steps["batch.decode_tokens"].astype("float64"))
        ok = tot.notna().to_numpy()
        summary_total = dict(zip(sid[ok].tolist(), tot[ok].astype("int64").tolist(), strict=True))

    rp = _replay(seg, s0, s1, ndec_static, budget, block, caching, None, summary_total)
    if caching and len(rp.pinned):
        guess = int(np.median(rp.pinned)) // block * block
        rep.typical_prefix = float(guess)
        rp = _replay(seg, s0, s1, ndec_static, budget, block, caching, guess, summary_total)
        rep.notes.append(f"prefix caching: {len(rp.pinned)} segments pinned by summaries, "
                         f"typical cached prefix {guess} tokens used for ambiguous ones")
    elif caching:
        rep.notes.append("prefix caching: no segment pinned by a summary; ambiguous segments "
                         "use the smallest cached prefix consistent with the journeys")
    rep.issues.update(rp.issues)
    rep.n_prefix_cached = int((rp.h > 0).sum())
    rep.n_prefix_ambiguous = int(rp.ambiguous.sum())
    rep.n_ambiguous_steps = len(rp.amb_steps)

    # decode intervals, including the ones of segments completed by the greedy replay
    comp_all = s_arr["complete"].copy()
    dyn = rp.dyn_complete != _GREEDY
    comp_all[dyn] = rp.dyn_complete[dyn]
    has = comp_all != _GREEDY
    d_first = comp_all[has] + 1
    d_last = s_arr["end"][has]
    # tokens in KV before the first decode = prompt + outputs at schedule time (the recompute /
    # prefill completion produced one more token, not yet in KV); the decode's context counts
    # the token being decoded too (``computed + 1``, as prefill_kv_tokens counts o + c)
    d_base = s_arr["total"][has]
    ndec, dctx = _interval_sums(d_first, d_last, d_base + 1, s0, n)

    m_step = np.asarray(rp.m_step, dtype=np.int64)
    m_seg = np.asarray(rp.m_seg, dtype=np.int64)
    m_tok = np.asarray(rp.m_tok, dtype=np.float64)
    m_off = np.asarray(rp.m_done, dtype=np.float64) + rp.h[m_seg]
    m_rec = s_arr["d_r"][m_seg] > 0
    idx = m_step - s0
    pre_n = np.bincount(idx, minlength=n).astype(np.float64)
    pre_tok = np.bincount(idx, weights=m_tok, minlength=n)
    pairs = np.bincount(idx, weights=m_tok * (m_off + (m_tok + 1) / 2), minlength=n)
    kvt = np.bincount(idx, weights=m_off + m_tok, minlength=n)
    # BLIS's prefill attention: chunk c of a segment that prefills S tokens costs c·(S + c/2)
    m_total = s_arr["total"][m_seg].astype(np.float64)
    in_pairs = np.bincount(idx, weights=m_tok * (m_total + m_tok / 2), minlength=n)
    rec_n = np.bincount(idx, weights=m_rec.astype(np.float64), minlength=n)
    rec_tok = np.bincount(idx, weights=m_tok * m_rec, minlength=n)

    step_ids = np.arange(s0, s1 + 1, dtype=np.int64)
    amb = np.zeros(n, dtype=bool)
    amb[rp.amb_steps - s0] = True
    batches = pd.DataFrame({
        "experiment_id": experiment_id,
        "step_id": step_ids,
        "sampled": np.isin(step_ids, sid),
        "num_prefill_reqs": pre_n,
        "prefill_tokens": pre_tok,
        "prefill_attn_pairs": pairs,
        "prefill_kv_tokens": kvt,
        "prefill_input_pairs": in_pairs,
        "num_decode_reqs": ndec.astype(np.float64),
        "decode_tokens": ndec.astype(np.float64),
        "decode_ctx_tokens": dctx,
        "offload_tokens": 0.0,
        "ctx_approximated": False,
        "prefix_ambiguous": amb,
        "recompute_reqs": rec_n,
        "recompute_tokens": rec_tok,
    })

    # agreement with the sampled summaries
    if have_steps:
        ss = steps.drop_duplicates("step.id").set_index("step.id")
        common = ss.index.intersection(pd.Index(step_ids))
        if len(common):
            # positions instead of .loc (batches hold every step s0..s1, ss unique step ids)
            at_b = common.to_numpy(dtype=np.int64) - s0
            at_s = ss.index.get_indexer(common)
            rr, rt = rec_n[at_b], rec_tok[at_b]
            rb = {"num_prefill_reqs": pre_n[at_b] - rr, "prefill_tokens": pre_tok[at_b] - rt,
                  "num_decode_reqs": ndec.astype(np.float64)[at_b] + rr,
                  "decode_tokens": ndec.astype(np.float64)[at_b] + rt}  # summary_convention
            eq = np.ones(len(common), dtype=bool)
            for c in _COMPARED:
                obs = ss[_SUMMARY_COLS[c]].astype("float64").to_numpy()[at_s]
                d = np.abs(rb[c] - obs)
                rep.mae[c] = float(np.nanmean(d)) if len(d) else 0.0
                eq &= d == 0
            rep.n_compared, rep.n_agree = len(common), int(eq.sum())

    members = None
    if with_members:
        lens = np.maximum(d_last - d_first + 1, 0)
        tot_dec = int(lens.sum())
        rep_seg = np.repeat(np.arange(len(d_first)), lens)
        within = np.arange(tot_dec) - np.repeat(np.cumsum(lens) - lens, lens)
        step_all = np.concatenate([m_step, d_first[rep_seg] + within])
        is_pre = np.concatenate([np.ones(len(m_step), bool), np.zeros(tot_dec, bool)])
        # by step, decodes first (as scheduled); stable radix sort on one integer key
        order = np.argsort(step_all * 2 + is_pre, kind="stable")
        req_all = np.concatenate([s_arr["req"][m_seg], s_arr["req"][has][rep_seg]])
        members = pd.DataFrame({
            "experiment_id": pd.Categorical.from_codes(np.zeros(len(order), dtype=np.int8),
                                                       categories=[experiment_id]),
            "step_id": step_all[order],
            "request_id": pd.Categorical.from_codes(req_all[order],
                                                    categories=pd.Index(uniques).astype(str)),
            "tokens": np.concatenate([m_tok.astype(np.int64),
                                      np.ones(tot_dec, dtype=np.int64)])[order],
            "ctx_offset": np.concatenate([m_off.astype(np.int64),
                                          d_base[rep_seg] + within])[order],
            "is_prefill": is_pre[order],
            "is_recompute": np.concatenate([m_rec, np.zeros(tot_dec, bool)])[order],
        })
    return batches, members, rep


def reconstruct_batches(journey_events: pd.DataFrame, requests: pd.DataFrame | None,
                        serving: Any, steps: pd.DataFrame | None = None, *,
                        with_members: bool = True
                        ) -> tuple[pd.DataFrame, pd.DataFrame | None, ReconstructionReport]:
    """Rebuild the batch of every step id from the journeys (reference scheduling policy).

    Parameters
    ----------
    journey_events
        ``journey_events`` table (one or several experiments; column ``experiment_id`` optional).
    requests
        ``requests`` table; used to fill a missing ``prefill_total`` from ``prompt_tokens``
        (may be None).
    serving
        :class:`~bayes_latency.physics.serving.ServingConfig` (uses ``max_num_batched_tokens``,
        ``block_size``, ``prefix_caching``).
    steps
        Sampled ``steps`` (``step.BATCH_SUMMARY``) of the same experiment(s), or None. Used to
        mark sampled steps, pin cached prefixes and measure agreement.
    with_members
        Also build the per-(step, request) members table (large: one row per decode token).

    Returns
    -------
    batches : pandas.DataFrame
        One row per step id from the first to the last seen: ``experiment_id, step_id, sampled``,
        the batch-table columns, ``ctx_approximated`` (False), ``prefix_ambiguous`` and the
        helper columns ``recompute_reqs, recompute_tokens`` (recompute chunks, included in the
        prefill columns; see :func:`summary_convention`).
    members : pandas.DataFrame or None
        ``experiment_id, step_id, request_id, tokens, ctx_offset, is_prefill, is_recompute``.
    report : ReconstructionReport
        Agreement with the sampled summaries and the inconsistencies met.
    """
    ev = journey_events
    if "experiment_id" not in ev.columns:
        ev = ev.assign(experiment_id="")
    if requests is not None and len(requests) and ev["prefill_total"].isna().any():
        pt = requests.drop_duplicates("request_id").set_index("request_id")["prompt_tokens"]
        ev = ev.assign(prefill_total=ev["prefill_total"].fillna(ev["request_id"].map(pt)))
    ev_eid = ev["experiment_id"].astype(str)
    exp_ids = pd.unique(ev_eid).tolist()  # in order of appearance
    if not exp_ids and steps is not None and len(steps):
        exp_ids = list(dict.fromkeys(steps.get("experiment_id", pd.Series([""])).astype(str)))
    out_b, out_m = [], []
    report: ReconstructionReport | None = None
    for eid in exp_ids or [""]:
        # (a selection of every row is the frame itself: _one_experiment does not modify it)
        mine_ev = (ev_eid == eid).to_numpy(dtype=bool)
        e = ev if mine_ev.all() else ev[mine_ev]
        st = steps
        if st is not None and "experiment_id" in st.columns and len(st):
            mine = st["experiment_id"].astype(str) == eid
            if (mine.any() or len(exp_ids) > 1) and not mine.all():
                st = st[mine]
        b, m, r = _one_experiment(e, st, serving, eid, with_members)
        out_b.append(b)
        if m is not None:
            out_m.append(m)
        report = r if report is None else report.merge(r)
    batches = pd.concat(out_b, ignore_index=True) if len(out_b) > 1 else out_b[0]
    members = None
    if with_members:
        members = pd.concat(out_m, ignore_index=True) if len(out_m) > 1 else (
            out_m[0] if out_m else None)
    assert report is not None
    return batches, members, report
