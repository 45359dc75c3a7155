"""The journey and requests tables as ingest built them with pandas sorts and group-bys (the reference the numpy versions reproduce).

Verbatim copies of ``_Acc._journey_table`` and ``_Acc._requests_table`` (pandas sorts, group-bys
and ``map`` calls), kept as the reference that the numpy versions in
:mod:`bayes_latency.data.otlp.read` must reproduce exactly (``tests/test_otlp_tables_reference.py``).
"""

# ruff: noqa
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from bayes_latency.data.otlp.assemble import _sort_all
from bayes_latency.data.otlp.fields import (
    _EVENT_RANK, _FINISH_STATUS, _JOURNEY_INT, _JOURNEY_STR, _ONCE_EVENTS, _RE_HEX8, _RE_INDEX,
    JOURNEY_COLUMNS, REQUEST_COLUMNS,
)


def _journey_table(self, experiment_id: str) -> pd.DataFrame:
    j = self.je
    n = len(j["event"])
    cols: dict[str, Any] = {
        "experiment_id": pd.Series([experiment_id] * n, dtype="str"),
        "request_id": pd.Series(j["request_id"], dtype="str"),
        "event": pd.Series(j["event"], dtype="str"),
        "ts_monotonic_ns": np.asarray(j["ts_monotonic_ns"], dtype=np.int64),
    }
    for c in _JOURNEY_INT:
        cols[c] = pd.array(j[c], dtype="Int64")
    for c in _JOURNEY_STR:
        cols[c] = pd.Series(j[c], dtype="object")
    df = pd.DataFrame(cols)[list(JOURNEY_COLUMNS)]
    if n == 0:
        return df
    df["_rank"] = df["event"].map(_EVENT_RANK).astype(np.int64)
    df = _sort_all(df, first=["request_id", "step", "ts_monotonic_ns", "_rank"])
    dup = df.duplicated(subset=["request_id", "event", "step", "ts_monotonic_ns"])
    once = df["event"].isin(_ONCE_EVENTS) & df.duplicated(subset=["request_id", "event"])
    bad = dup | once
    if bad.any():
        self.report.drop("duplicate_event", int(bad.sum()))
        df = df[~bad]
    return df.drop(columns="_rank").reset_index(drop=True)



def _requests_table(self, experiment_id: str, je: pd.DataFrame,
                    api: pd.DataFrame) -> pd.DataFrame:
    rep = self.report
    rids = sorted(self.cores)
    n = len(rids)
    # ---- join engine spans to API spans ----
    api_by_span: dict[str, int] = {}
    api_by_id: dict[str, int] = {}
    for i, (sid, aid) in enumerate(zip(api["span_id"], api["api_request_id"], strict=True)):
        api_by_span.setdefault(sid, i)
        if isinstance(aid, str):
            api_by_id.setdefault(aid, i)
    api_idx = np.full(n, -1, dtype=np.int64)
    for k, rid in enumerate(rids):
        _trace, _span, parent = self.cores[rid]
        i = api_by_span.get(parent, -1) if parent else -1
        if i < 0:
            base = _RE_HEX8.sub("", rid)
            i = api_by_id.get(base, -1)
            if i < 0 and base.startswith("cmpl-"):
                i = api_by_id.get(_RE_INDEX.sub("", base), -1)
        api_idx[k] = i
    joined = api_idx >= 0
    if len(api):
        engine_of_api = np.full(len(api), None, dtype=object)
        for k in np.flatnonzero(joined):
            if engine_of_api[api_idx[k]] is None:
                engine_of_api[api_idx[k]] = rids[k]
        api["request_id"] = pd.Series(engine_of_api, dtype="object")
        n_api_only = int(pd.isna(api["request_id"]).sum())
        if n_api_only:
            rep.kept["api_only_span"] += n_api_only
    if n - int(joined.sum()):
        rep.kept["core_without_api"] += n - int(joined.sum())

    def from_api(col: str, default: Any) -> list:
        vals = api[col].to_numpy(dtype=object) if len(api) else np.array([], dtype=object)
        return [vals[i] if i >= 0 else default for i in api_idx]

    out = pd.DataFrame({
        "experiment_id": pd.Series([experiment_id] * n, dtype="str"),
        "request_id": pd.Series(rids, dtype="str"),
        "api_request_id": pd.Series(from_api("api_request_id", None), dtype="object"),
        "trace_id": pd.Series([self.cores[r][0] for r in rids], dtype="str"),
        "arrival_s": np.asarray(from_api("arrival_s", np.nan), dtype=float),
        "departed_s": np.asarray(from_api("departed_s", np.nan), dtype=float),
    })
    api_aborted = np.asarray(from_api("aborted", False), dtype=bool)
    api_prompt = pd.array(from_api("prompt_tokens", None), dtype="Int64")
    api_max = pd.array(from_api("max_tokens", None), dtype="Int64")

    # ---- per-request facts from the journey (je is sorted and deduplicated) ----
    pos = {r: k for k, r in enumerate(rids)}
    firsts = je.drop_duplicates(subset=["request_id", "event"], keep="first")
    row_of = firsts["request_id"].map(pos).to_numpy(dtype=np.int64)
    ev_of = firsts["event"].to_numpy(dtype=object)

    def first_of(event: str, col: str) -> pd.arrays.IntegerArray:
        sel = ev_of == event
        vals = pd.array([None] * n, dtype="Int64")
        if sel.any():
            vals[row_of[sel]] = firsts.loc[sel, col].astype("Int64").array
        return vals

    for event, prefix in (("QUEUED", "queued"), ("SCHEDULED", "first_scheduled"),
                          ("FIRST_TOKEN", "first_token"), ("FINISHED", "finished")):
        out[f"{prefix}_ns"] = first_of(event, "ts_monotonic_ns")
        out[f"{prefix}_step"] = first_of(event, "step")
    je_row = je["request_id"].map(pos).to_numpy(dtype=np.int64)
    je_ev = je["event"].to_numpy(dtype=object)

    def count_of(event: str) -> np.ndarray:
        return np.bincount(je_row[je_ev == event], minlength=n).astype(np.int64)

    n_sched, n_pre_ev = count_of("SCHEDULED"), count_of("PREEMPTED")
    max_pre = np.zeros(n, dtype=np.int64)
    npre = je["num_preemptions"].to_numpy(dtype=float, na_value=np.nan)
    ok = ~np.isnan(npre)
    np.maximum.at(max_pre, je_row[ok], npre[ok].astype(np.int64))
    out["n_scheduled"] = n_sched
    out["n_preemptions"] = np.maximum(n_pre_ev, max_pre)

    def first_non_null(col: str) -> pd.arrays.IntegerArray:
        sub = je.loc[je[col].notna(), ["request_id", col]].drop_duplicates("request_id")
        vals = pd.array([None] * n, dtype="Int64")
        if len(sub):
            vals[sub["request_id"].map(pos).to_numpy(dtype=np.int64)] = \
                sub[col].astype("Int64").array
        return vals

    prompt = first_non_null("prefill_total")
    out["prompt_tokens"] = pd.array(np.where(prompt.isna(), api_prompt, prompt),
                                    dtype="Int64")
    out["output_tokens"] = first_of("FINISHED", "decode_done")
    mx = first_non_null("decode_max")
    out["max_tokens"] = pd.array(np.where(mx.isna(), api_max, mx), dtype="Int64")
    fin_list = np.full(n, None, dtype=object)
    sel = ev_of == "FINISHED"
    fin_list[row_of[sel]] = firsts.loc[sel, "finish_status"].to_numpy(dtype=object)
    has = {e: count_of(e) > 0 for e in ("QUEUED", "SCHEDULED", "FIRST_TOKEN", "FINISHED")}
    complete = has["QUEUED"] & has["SCHEDULED"] & has["FIRST_TOKEN"] & has["FINISHED"]
    # a request that lost a journey event to a bad field is not complete: its first
    # SCHEDULED (say) would silently become a later one
    damaged = np.asarray([(r, *self.cores[r][:2]) in self.damaged for r in rids], dtype=bool)
    # max_tokens 0 cannot produce a token: the journey contradicts itself
    mx_arr = out["max_tokens"].to_numpy(dtype=float, na_value=np.nan)
    impossible = (mx_arr == 0) & has["FIRST_TOKEN"]
    for name, mask in (("damaged_request", damaged),
                       ("inconsistent_request:max_tokens_0", impossible)):
        if mask.any():
            rep.kept[name] += int(mask.sum())
            rep.notes.append(f"{name}: {int(mask.sum())} request(s) marked incomplete "
                             f"(e.g. {rids[int(np.flatnonzero(mask)[0])]})")
    complete = complete & ~damaged & ~impossible
    aborted = api_aborted | np.asarray([s == "aborted" for s in fin_list], dtype=bool)
    status = []
    for k in range(n):
        if aborted[k]:
            status.append("aborted")
        elif not complete[k]:
            status.append("incomplete")
        else:
            st_k = _FINISH_STATUS.get(fin_list[k]) if isinstance(fin_list[k], str) else None
            if st_k is None:  # unknown or missing finish.status: kept as error, counted
                rep.kept["unknown_finish_status"] += 1
                if rep.kept["unknown_finish_status"] <= 5:
                    rep.notes.append(f"unknown_finish_status: {fin_list[k]!r} of "
                                     f"{rids[k]} (status set to 'error')")
                st_k = "error"
            status.append(st_k)
    out["status"] = pd.Series(status, dtype="str")
    out["aborted"] = aborted
    out["complete"] = complete
    # ---- timestamps going backwards along the (step, ts) order ----
    back = np.zeros(n, dtype=bool)
    if len(je):
        ts = je["ts_monotonic_ns"].to_numpy(dtype=np.int64)
        dec = np.zeros(len(je), dtype=bool)
        dec[1:] = (ts[1:] < ts[:-1]) & (je_row[1:] == je_row[:-1])
        back[je_row[dec]] = True
    out["ts_backwards"] = back
    for name, cnt in (("incomplete_request", int(((~complete) & (~aborted)).sum())),
                      ("aborted_request", int(aborted.sum())),
                      ("ts_backwards", int(back.sum()))):
        if cnt:
            rep.kept[name] += cnt
    return out[list(REQUEST_COLUMNS)]


