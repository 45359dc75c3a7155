"""Table assembly of the OTLP reader: accumulated columns -> sorted, deduplicated tables.

Part of :mod:`bayes_latency.data.otlp.read`: :class:`OtlpTables` and the table-building half of the
accumulator (``_Tables``, the base of :class:`bayes_latency.data.otlp.rows._Acc`). Tables are
built once at the end with numpy (the journey, step, snapshot and API orders by ``np.lexsort``,
per-request facts by scatter), falling back on a pandas sort by every column only for rows that
tie on their keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from pandas.api.types import pandas_dtype

from bayes_latency.data.frames import frame
from bayes_latency.data.otlp.fields import (
    _EVENT_RANK,
    _FINISH_STATUS,
    _JOURNEY_INT,
    _JOURNEY_STR,
    _ONCE_EVENTS,
    _RE_HEX8,
    _RE_INDEX,
    _SNAPSHOT_ATTRS,
    API_SPAN_COLUMNS,
    JOURNEY_COLUMNS,
    JOURNEY_EVENTS,
    REQUEST_COLUMNS,
)
from bayes_latency.data.report import IngestReport

# dtypes resolved once: a dtype string costs pandas a registry lookup per call (12-22
# microseconds; thousands of calls per demo-fleet ingest)
_INT64 = pandas_dtype("Int64")
_STR = pandas_dtype("str")
_OBJECT = pandas_dtype("object")


# ---------------------------------------------------------------------------------------------
# Public result
# ---------------------------------------------------------------------------------------------
@dataclass
class OtlpTables:
    """Tables read from one OTLP JSON Lines trace file.

    Attributes
    ----------
    steps
        One row per ``step.BATCH_SUMMARY``: :data:`STEP_COLUMNS` (nullable ``Int64`` except
        ``kv.usage_gpu_ratio`` float) + ``experiment_id``; sorted by ``step.id``.
    journey_events
        One row per journey event: :data:`JOURNEY_COLUMNS`; sorted by request, step, time.
    requests
        One row per engine request (``llm_core`` span): :data:`REQUEST_COLUMNS`.
    snapshots
        One row per ``step.REQUEST_SNAPSHOT``: :data:`SNAPSHOT_COLUMNS`.
    api_spans
        One row per ``llm_request`` span: :data:`API_SPAN_COLUMNS`.
    report
        Counts of what was read, kept and dropped.
    """

    steps: pd.DataFrame
    journey_events: pd.DataFrame
    requests: pd.DataFrame
    snapshots: pd.DataFrame
    api_spans: pd.DataFrame
    report: IngestReport = field(default_factory=IngestReport)


class _Tables:
    """The table-building methods of :class:`bayes_latency.data.otlp.rows._Acc` (which holds
    the concatenated columns ``steps``, ``snaps``, ``je``, ``api``, the core spans ``cores`` /
    ``core_rows`` and the ``damaged`` requests these methods read)."""

    report: IngestReport
    cores: dict[str, tuple[str, str, str | None]]
    core_rows: list[tuple[str, tuple[str, str], int, int]]
    damaged: set[tuple[str, str, str]]
    _je_row: np.ndarray | None
    _je_rank: np.ndarray | None

    # -- final tables --------------------------------------------------------------------------
    def tables(self, experiment_id: str) -> OtlpTables:
        rep = self.report
        self._concat()
        steps = self._steps_table(experiment_id)
        snaps = self._snapshots_table(experiment_id)
        self._drop_duplicate_request_ids()
        je = self._journey_table(experiment_id)
        api = self._api_table(experiment_id)
        requests = self._requests_table(experiment_id, je, api)
        rep.kept["steps"] += len(steps)
        rep.kept["snapshots"] += len(snaps)
        rep.kept["journey_events"] += len(je)
        rep.kept["requests"] += len(requests)
        rep.kept["api_spans"] += len(api)
        return OtlpTables(steps=steps, journey_events=je, requests=requests, snapshots=snaps,
                          api_spans=api, report=rep)

    def _drop_duplicate_request_ids(self) -> None:
        """Keep one core span per ``gen_ai.request.id`` (the smallest (traceId, spanId), as for
        the requests table); drop the journey events of the others, counted
        ``duplicate_request_id`` (spans) and ``duplicate_request_id:events``."""
        rep = self.report
        extra = [(rid, key, a, b) for rid, key, a, b in self.core_rows
                 if key != self.cores[rid][:2]]
        if not extra:
            return
        rep.drop_record("requests", "duplicate_request_id", len(extra))
        for rid, key, _a, _b in extra[:5]:
            rep.notes.append(f"duplicate_request_id: {rid} (span {key[1]} of trace {key[0]} "
                             f"dropped; one request kept per id)")
        keep = np.ones(len(self.je["event"]), dtype=bool)
        for _rid, _key, a, b in extra:
            keep[a:b] = False
        if (~keep).any():
            rep.drop("duplicate_request_id:events", int((~keep).sum()))
            idx = np.flatnonzero(keep)
            self.je = {c: v[idx] for c, v in self.je.items()}

    def _steps_table(self, experiment_id: str) -> pd.DataFrame:
        cols = dict(self.steps)
        order = _key_order([cols["step.id"]])
        if order is not None:  # no repeated step id: the sort by step.id alone decides
            df = frame({c: v[order] for c, v in cols.items()})
            df["experiment_id"] = _str_repeat(experiment_id, len(df))
            return df
        df = pd.DataFrame(cols)
        df["experiment_id"] = _str_repeat(experiment_id, len(df))
        if len(df):
            df = _sort_all(df, first=["step.id"])
            dup = df.duplicated(subset=["step.id"], keep="first")
            if dup.any():
                self.report.drop_record("steps", "duplicate_step", int(dup.sum()))
                df = df[~dup]
        return df.reset_index(drop=True)

    def _snapshots_table(self, experiment_id: str) -> pd.DataFrame:
        s = self.snaps
        cols: dict[str, Any] = {
            "experiment_id": _str_repeat(experiment_id, len(s["step_id"])),
            "step_id": pd.array(s["step_id"], dtype=_INT64),
            "request_id": _str_series(s["request_id"]),
        }
        for c in _SNAPSHOT_ATTRS:
            cols[c] = (pd.Series(s[c], dtype=_OBJECT) if c == "request.phase"
                       else pd.array(s[c], dtype=_INT64))
        order = _key_order([s["step_id"], s["request_id"]])
        if order is not None:  # no repeated (step, request): sorted by them alone
            return frame({c: (_take_series(v, order) if isinstance(v, pd.Series)
                              else v.take(order)) for c, v in cols.items()})
        df = pd.DataFrame(cols)
        if len(df):
            df = _sort_all(df, first=["step_id", "request_id"])
            dup = df.duplicated(subset=["step_id", "request_id"], keep="first")
            if dup.any():
                self.report.drop("duplicate_snapshot", int(dup.sum()))
                df = df[~dup]
        return df.reset_index(drop=True)

    def _journey_table(self, experiment_id: str) -> pd.DataFrame:
        j = self.je
        n = len(j["event"])
        self._je_row = self._je_rank = None
        fast = self._journey_order(j) if n else None
        if fast is not None:
            order, row, rank = fast
            # the once-per-request events: only the first of each request is kept (with no
            # tie on (request, step, ts, rank), no row repeats (request, event, step, ts))
            key = row * len(JOURNEY_EVENTS) + rank
            once = np.isin(rank, [_EVENT_RANK[e] for e in _ONCE_EVENTS])
            bad = np.zeros(n, dtype=bool)
            if once.any():
                first = np.zeros(int(once.sum()), dtype=bool)
                first[np.unique(key[once], return_index=True)[1]] = True
                bad[np.flatnonzero(once)[~first]] = True
            if bad.any():
                self.report.drop("duplicate_event", int(bad.sum()))
                order, row, rank = order[~bad], row[~bad], rank[~bad]
            self._je_row, self._je_rank = row, rank
            # the columns taken in that order before the frame is built (same frame as
            # building it and taking its rows); the request and event texts are taken from
            # the sorted request ids and the event names by index (no Python strings)
            return _journey_frame({c: v[order] for c, v in j.items() if c not in (
                "request_id", "event")}, experiment_id,
                texts=(sorted(self.cores), row, rank, j, order))
        df = _journey_frame(j, experiment_id)
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

    def _journey_order(self, j: dict[str, list]) -> tuple[np.ndarray, ...] | None:
        """Sort order of the journey rows by (request, step (nulls first), ts, event rank) and
        each sorted row's request index (in ``sorted(self.cores)``) and event rank; None when
        two rows tie on those keys (the pandas sort then orders them by every column)."""
        row = _positions(sorted(self.cores), j["request_id"])
        rank = _positions(JOURNEY_EVENTS, j["event"])
        steps = pd.array(j["step"], dtype=_INT64)
        has_step = ~steps._mask
        step = np.where(has_step, steps._data, 0)
        ts = np.asarray(j["ts_monotonic_ns"], dtype=np.int64)
        order = np.lexsort((rank, ts, step, has_step, row))
        if _has_ties((row, has_step, step, ts, rank), order):
            return None
        return order, row[order], rank[order]

    def _api_table(self, experiment_id: str) -> pd.DataFrame:
        a = self.api
        n = len(a["span_id"])
        cols: dict[str, Any] = {"experiment_id": _str_repeat(experiment_id, n)}
        for c in API_SPAN_COLUMNS[1:-1]:
            v = a[c]
            if c in ("prompt_tokens", "max_tokens", "n", "status_code"):
                cols[c] = pd.array(v, dtype=_INT64)
            elif c in ("temperature", "top_p", "arrival_s", "handoff_s", "first_response_s",
                       "departed_s", "aborted_s"):
                cols[c] = np.asarray(v, dtype=float)
            elif c == "aborted":
                cols[c] = np.asarray(v, dtype=bool)
        cols["request_id"] = pd.Series([None] * n, dtype=_OBJECT)
        order = _key_order([a["trace_id"], a["span_id"]])
        if order is not None:  # (trace, span) are unique: their order is the sort
            # (the rows taken before the columns become Series: the same frame)
            out: dict[str, Any] = {"experiment_id": cols["experiment_id"]}
            for c in API_SPAN_COLUMNS[1:-1]:
                v = a[c]
                if c in ("prompt_tokens", "max_tokens", "n", "status_code"):
                    out[c] = cols[c].take(order)
                elif c in ("temperature", "top_p", "arrival_s", "handoff_s",
                           "first_response_s", "departed_s", "aborted_s", "aborted"):
                    out[c] = cols[c][order]
                else:
                    out[c] = pd.Series(np.asarray(v, dtype=object)[order], dtype=_OBJECT)
            out["request_id"] = cols["request_id"]
            return frame(out)
        for c in API_SPAN_COLUMNS[1:-1]:
            if c not in cols:  # the text columns
                cols[c] = pd.Series(a[c], dtype=_OBJECT)
        df = pd.DataFrame({c: cols[c] for c in API_SPAN_COLUMNS})
        if n:
            df = df.sort_values(["trace_id", "span_id"], kind="stable").reset_index(drop=True)
        return df

    def _requests_table(self, experiment_id: str, je: pd.DataFrame,
                        api: pd.DataFrame) -> pd.DataFrame:
        rep = self.report
        rids = sorted(self.cores)
        n = len(rids)
        # ---- join engine spans to API spans ----
        # by the parent span id (first API span of each span id, with pandas' hash table), then
        # for the requests without one by the request id (Python, usually none)
        api_idx = np.full(n, -1, dtype=np.int64)
        parents = [self.cores[r][2] for r in rids]
        if len(api) and n:
            span_ix = pd.Index(api["span_id"].to_numpy(dtype=object))
            first = ~span_ix.duplicated(keep="first")
            at = np.flatnonzero(first)
            has_parent = np.fromiter((bool(x) and isinstance(x, str) for x in parents),
                                     dtype=bool, count=n)
            if has_parent.any():
                found = span_ix[first].get_indexer(
                    np.asarray(parents, dtype=object)[has_parent])
                api_idx[has_parent] = np.where(found >= 0, at[np.maximum(found, 0)], -1)
        if (api_idx < 0).any():
            api_by_span: dict[str, int] = {}
            api_by_id: dict[str, int] = {}
            for i, (sid, aid) in enumerate(zip(api["span_id"].tolist(),
                                               api["api_request_id"].tolist(), strict=True)):
                api_by_span.setdefault(sid, i)
                if isinstance(aid, str):
                    api_by_id.setdefault(aid, i)
            for k in np.flatnonzero(api_idx < 0).tolist():
                rid, parent = rids[k], parents[k]
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
            api["request_id"] = pd.Series(engine_of_api, dtype=_OBJECT)
            n_api_only = int(pd.isna(api["request_id"]).sum())
            if n_api_only:
                rep.kept["api_only_span"] += n_api_only
        if n - int(joined.sum()):
            rep.kept["core_without_api"] += n - int(joined.sum())

        take = np.where(joined, api_idx, 0)

        def from_api(col: str, default: Any) -> np.ndarray:
            """``api[col]`` of each request's API span, ``default`` without one."""
            vals = api[col].to_numpy(dtype=object) if len(api) else np.array([], dtype=object)
            out = np.full(n, default, dtype=object)
            if len(api):
                out[joined] = vals[take[joined]]
            return out

        def int_from_api(col: str) -> pd.arrays.IntegerArray:
            if not len(api):
                return pd.array([None] * n, dtype=_INT64)
            return api[col].array.take(np.where(joined, api_idx, -1), allow_fill=True)

        def float_from_api(col: str) -> np.ndarray:
            if not len(api):
                return np.full(n, np.nan)
            return np.where(joined, api[col].to_numpy(dtype=float)[take], np.nan)

        # columns collected in a dict, one DataFrame constructor at the end (inserting ~20
        # columns one by one cost more than all the rest of this function)
        out: dict[str, Any] = {
            "experiment_id": _str_repeat(experiment_id, n),
            "request_id": _str_series(rids),
            "api_request_id": pd.Series(from_api("api_request_id", None), dtype=_OBJECT),
            "trace_id": _str_series([self.cores[r][0] for r in rids]),
            "arrival_s": float_from_api("arrival_s"),
            "departed_s": float_from_api("departed_s"),
        }
        api_aborted = (np.where(joined, api["aborted"].to_numpy(dtype=bool)[take], False)
                       if len(api) else np.zeros(n, dtype=bool))
        api_prompt = int_from_api("prompt_tokens")
        api_max = int_from_api("max_tokens")

        # ---- per-request facts from the journey (je is sorted and deduplicated) ----
        if self._je_row is not None and len(self._je_row) == len(je):
            je_row, je_rank = self._je_row, self._je_rank
        else:
            pos = {r: k for k, r in enumerate(rids)}
            je_row = np.fromiter((pos[r] for r in je["request_id"].tolist()), dtype=np.int64,
                                 count=len(je))
            je_rank = np.fromiter((_EVENT_RANK[e] for e in je["event"].tolist()),
                                  dtype=np.int64, count=len(je))
        # first row of each (request, event) in journey order
        first_idx = np.unique(je_row * len(JOURNEY_EVENTS) + je_rank, return_index=True)[1]
        row_of, rank_of = je_row[first_idx], je_rank[first_idx]

        def scatter(rows: np.ndarray, idx: np.ndarray, col: str) -> pd.arrays.IntegerArray:
            """Int64 column of the requests: ``je[col]`` at journey rows ``idx`` for requests
            ``rows``, null elsewhere."""
            data = np.zeros(n, dtype=np.int64)
            mask = np.ones(n, dtype=bool)
            if len(idx):
                src = je[col].array
                if isinstance(src, pd.arrays.IntegerArray):
                    data[rows], mask[rows] = src._data[idx], src._mask[idx]
                else:
                    data[rows], mask[rows] = np.asarray(src, dtype=np.int64)[idx], False
            data[mask] = 0
            return pd.arrays.IntegerArray(data, mask)

        def first_of(event: str, col: str) -> pd.arrays.IntegerArray:
            sel = rank_of == _EVENT_RANK[event]
            return scatter(row_of[sel], first_idx[sel], col)

        for event, prefix in (("QUEUED", "queued"), ("SCHEDULED", "first_scheduled"),
                              ("FIRST_TOKEN", "first_token"), ("FINISHED", "finished")):
            out[f"{prefix}_ns"] = first_of(event, "ts_monotonic_ns")
            out[f"{prefix}_step"] = first_of(event, "step")
        def count_of(event: str) -> np.ndarray:
            return np.bincount(je_row[je_rank == _EVENT_RANK[event]], minlength=n).astype(np.int64)

        n_sched, n_pre_ev = count_of("SCHEDULED"), count_of("PREEMPTED")
        max_pre = np.zeros(n, dtype=np.int64)
        npre = je["num_preemptions"].to_numpy(dtype=float, na_value=np.nan)
        ok = ~np.isnan(npre)
        np.maximum.at(max_pre, je_row[ok], npre[ok].astype(np.int64))
        out["n_scheduled"] = n_sched
        out["n_preemptions"] = np.maximum(n_pre_ev, max_pre)

        def first_non_null(col: str) -> pd.arrays.IntegerArray:
            idx = np.flatnonzero(je[col].notna().to_numpy())
            idx = idx[np.unique(je_row[idx], return_index=True)[1]]
            return scatter(je_row[idx], idx, col)

        prompt = first_non_null("prefill_total")
        out["prompt_tokens"] = pd.array(np.where(prompt.isna(), api_prompt, prompt),
                                        dtype=_INT64)
        out["output_tokens"] = first_of("FINISHED", "decode_done")
        mx = first_non_null("decode_max")
        out["max_tokens"] = pd.array(np.where(mx.isna(), api_max, mx), dtype=_INT64)
        fin_list = np.full(n, None, dtype=object)
        sel = rank_of == _EVENT_RANK["FINISHED"]
        fin_list[row_of[sel]] = je["finish_status"].to_numpy(dtype=object)[first_idx[sel]]
        has = {e: count_of(e) > 0 for e in ("QUEUED", "SCHEDULED", "FIRST_TOKEN", "FINISHED")}
        complete = has["QUEUED"] & has["SCHEDULED"] & has["FIRST_TOKEN"] & has["FINISHED"]
        # a request that lost a journey event to a bad field is not complete: its first
        # SCHEDULED (say) would silently become a later one
        damaged = (np.asarray([(r, *self.cores[r][:2]) in self.damaged for r in rids],
                              dtype=bool) if self.damaged else np.zeros(n, dtype=bool))
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
        status = np.where(aborted, "aborted", "incomplete").astype(object)
        fin_ok = ~aborted & complete
        mapped = [_FINISH_STATUS.get(f) if isinstance(f, str) else None
                  for f in fin_list[fin_ok].tolist()]
        status[fin_ok] = mapped
        for k in np.flatnonzero(fin_ok)[[m is None for m in mapped]].tolist():
            # unknown or missing finish.status: kept as error, counted
            rep.kept["unknown_finish_status"] += 1
            if rep.kept["unknown_finish_status"] <= 5:
                rep.notes.append(f"unknown_finish_status: {fin_list[k]!r} of "
                                 f"{rids[k]} (status set to 'error')")
            status[k] = "error"
        out["status"] = _str_series(status)
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
        return frame({c: out[c] for c in REQUEST_COLUMNS})


def _take_series(s: pd.Series, order: np.ndarray) -> pd.Series:
    """``s.take(order).reset_index(drop=True)`` of a Series with a default index."""
    if isinstance(s.dtype, np.dtype):
        return pd.Series(s.to_numpy()[order], dtype=s.dtype)
    return pd.Series(s.array.take(order), copy=False)


def _str_series(values: Any) -> pd.Series:
    """``pd.Series(values, dtype="str")`` for a list or object array of str (None missing), by
    one pyarrow conversion: pandas' own checks every value in Python first (on the demo fleet
    0.10 of the reader's 1.3 CPU-s). Anything else takes pandas' way."""
    import pyarrow as pa

    try:
        arr = pa.array(values, type=pa.string(), from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, UnicodeError):
        return pd.Series(values, dtype=_STR)
    return pd.Series(pd.array(arr, dtype=_STR), copy=False)


def _str_repeat(value: str, n: int) -> pd.Series:
    """``pd.Series([value] * n, dtype="str")`` without the list."""
    import pyarrow as pa

    return pd.Series(pd.array(pa.repeat(pa.scalar(str(value), pa.string()), n), dtype=_STR),
                     copy=False)


def _journey_frame(j: dict[str, Any], experiment_id: str,
                   texts: tuple | None = None) -> pd.DataFrame:
    """The journey_events frame of typed journey columns, in their order. ``texts``: ``(sorted
    request ids, request index, event rank, unsorted columns, order)`` of sorted rows whose
    ``request_id`` and ``event`` columns ``j`` leaves out."""
    n = len(j["ts_monotonic_ns"])
    cols: dict[str, Any] = {"experiment_id": _str_repeat(experiment_id, n)}
    if texts is not None:
        cols["request_id"], cols["event"] = _taken_texts(*texts)
    else:
        cols["request_id"] = _str_series(j["request_id"])
        cols["event"] = _str_series(j["event"])
    cols["ts_monotonic_ns"] = np.asarray(j["ts_monotonic_ns"], dtype=np.int64)
    for c in _JOURNEY_INT:
        cols[c] = pd.array(j[c], dtype=_INT64)
    for c in _JOURNEY_STR:
        cols[c] = pd.Series(j[c], dtype=_OBJECT)
    # built in the table's column order (a reindex afterwards copied every column)
    return frame({c: cols[c] for c in JOURNEY_COLUMNS})


def _taken_texts(rids: list[str], row: np.ndarray, rank: np.ndarray, j: dict[str, Any],
                 order: np.ndarray) -> tuple[pd.Series, pd.Series]:
    """``request_id`` and ``event`` columns of the sorted journey rows: ``rids[row]`` and
    ``JOURNEY_EVENTS[rank]`` by one Arrow ``take`` each (the values :func:`_str_series` makes
    of ``j[...][order]``, which it falls back on for an index outside the lists or a text
    Arrow refuses)."""
    import pyarrow as pa

    if len(row) and (row.min() < 0 or rank.min() < 0):
        return _str_series(j["request_id"][order]), _str_series(j["event"][order])
    try:
        req = pa.array(rids, type=pa.string()).take(row)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, UnicodeError):
        req = None
    ev = pa.array(JOURNEY_EVENTS, type=pa.string()).take(rank)
    return (pd.Series(pd.array(req, dtype=_STR), copy=False) if req is not None
            else _str_series(j["request_id"][order]),
            pd.Series(pd.array(ev, dtype=_STR), copy=False))


def _positions(keys: Sequence[str], values: np.ndarray) -> np.ndarray:
    """``pd.Index(keys).get_indexer(values)`` (int64; -1 where absent) by a dict: pandas first
    infers and converts the object array (3x the time on the demo fleet's journeys)."""
    pos = {k: i for i, k in enumerate(keys)}
    get = pos.get
    try:
        return np.fromiter((get(v, -1) for v in values.tolist()), dtype=np.int64,
                           count=len(values))
    except TypeError:  # an unhashable value: pandas decides
        return pd.Index(keys).get_indexer(values).astype(np.int64)


def _key_order(keys: list[Any]) -> np.ndarray | None:
    """Ascending order of rows by ``keys`` (Int64 arrays, or object arrays of str), or None when
    a key has a null or two rows tie on all keys (callers then sort with pandas by every
    column). Strings compare by code point, as pandas sorts them."""
    codes = []
    for k in keys:
        if isinstance(k, pd.arrays.IntegerArray):
            if k._mask.any():
                return None
            codes.append(k._data)
        else:
            try:
                codes.append(np.unique(np.asarray(k, dtype=object), return_inverse=True)[1])
            except TypeError:  # None among the strings
                return None
    order = np.lexsort(codes[::-1])
    if _has_ties(codes, order):
        return None
    return order


def _has_ties(keys: Sequence[np.ndarray], order: np.ndarray) -> bool:
    """Whether two rows agree on every key (``order`` sorts the rows by the keys, so such rows
    are adjacent); the callers then fall back to their row-wise path."""
    if len(order) < 2:
        return False
    same = np.ones(len(order) - 1, dtype=bool)
    for k in keys:
        ks = np.asarray(k)[order]
        same &= ks[1:] == ks[:-1]
    return bool(same.any())


def _sort_all(df: pd.DataFrame, first: list[str]) -> pd.DataFrame:
    """Sort by ``first`` then by every other column (deterministic, independent of input order).

    The other columns only matter for rows tied on ``first``, so they are used only when ties
    exist (sorting by many object columns is slow).
    """
    df = df.sort_values(first, kind="stable", na_position="first")
    if df.duplicated(subset=first).any():
        rest = [c for c in df.columns if c not in first]
        df = df.sort_values(first + rest, kind="stable", na_position="first")
    return df
