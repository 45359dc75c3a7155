"""Reader of BLIS TraceV2 traces (header YAML + data CSV), as recorded by ``blis observe``.

Format: ``sim/workload/tracev2.go`` of the BLIS source (``TraceHeader``, ``TraceRecord``,
``ExportTraceV2``, ``LoadTraceV2``, ``parseTraceRecord``; ``../shared/blis/``).

- **Header** (YAML mapping): ``trace_version`` (int; 3 since goodput SLO targets), ``time_unit``
  (``us`` / ``microseconds``), ``created_at``, ``mode`` (``real`` from ``blis observe``,
  ``generated`` / ``replayed`` from simulation), ``warm_up_requests``, optional
  ``workload_seed``, ``workload_spec``, ``server`` (``type``, ``model``, ``tensor_parallel``,
  ``max_num_seqs``, ``block_size``, ``gpu_memory_utilization``, ``max_model_len``),
  ``network`` (``measured_rtt_ms``), ``goodput_slo_targets``, ``kv_offload``,
  ``observed_kv_metrics``, ``session_context_growth``.
- **Data** (CSV with a header row): ``request_id, client_id, tenant_id, slo_class,
  [vllm_priority,] session_id, round_index, prefix_group, prefix_length, streaming,
  input_tokens, output_tokens, text_tokens, image_tokens, audio_tokens, video_tokens,
  reason_ratio, model, deadline_us, [slo_target_us,] server_input_tokens, arrival_time_us,
  send_time_us, first_chunk_time_us, last_chunk_time_us, num_chunks, status, error_message,
  finish_reason[, x_request_id][, adapter][, think_time_us]``. Times are integer microseconds:
  ``arrival_time_us`` on the workload's clock (from 0), send / first chunk / last chunk as Unix
  time. ``input_tokens`` is the suffix after the shared prefix (``prefix_length``);
  ``server_input_tokens`` the server-reported prompt length (0 = not recorded). ``status`` is
  ``ok``, ``error``, ``timeout`` (``incomplete`` in simulated traces).

Columns are read by name (BLIS reads them by position; the names are the same). As in
``blis calibrate``: TTFT = ``first_chunk - send``, E2E = ``last_chunk - send``, prompt length =
``server_input_tokens`` when > 0 else ``input_tokens + prefix_length``; TTFT is NaN for
non-streaming requests (``streaming=false``: the first chunk is the whole response); requests with
``request_id < warm_up_requests`` are excluded (counted ``warm_up``).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from bayes_latency.data.client.frames import (
    CLIENT_REQUEST_COLUMNS,
    requests_frame,
    summary_frame,
    summary_from_requests,
)
from bayes_latency.data.report import IngestReport
from bayes_latency.errors import TraceFormatError
from bayes_latency.textfiles import load_yaml, read_text, refuse_special

__all__ = ["HEADER_FIELDS", "REQUIRED_COLUMNS", "read_tracev2", "read_tracev2_header"]

#: Top-level keys of ``TraceHeader`` (others are noted, not fatal).
HEADER_FIELDS = ("trace_version", "time_unit", "created_at", "mode", "warm_up_requests",
                 "workload_seed", "workload_spec", "session_context_growth", "server", "network",
                 "goodput_slo_targets", "kv_offload", "observed_kv_metrics")
#: CSV columns this reader needs (a missing one is a TraceFormatError).
REQUIRED_COLUMNS = ("request_id", "input_tokens", "output_tokens", "arrival_time_us",
                    "send_time_us", "first_chunk_time_us", "last_chunk_time_us", "status")
_TIME_UNITS = ("us", "microseconds", "µs", "usec")
#: Go's strconv.ParseBool spellings.
_BOOLS = {"1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True,
          "0": False, "f": False, "F": False, "FALSE": False, "false": False, "False": False}
_INT_COLUMNS = ("input_tokens", "output_tokens", "prefix_length", "server_input_tokens",
                "num_chunks", "arrival_time_us", "send_time_us", "first_chunk_time_us",
                "last_chunk_time_us")


def read_tracev2_header(path: str | Path) -> dict[str, Any]:
    """Read and check a TraceV2 header YAML.

    Returns
    -------
    dict
        The mapping, with ``warm_up_requests`` (int, default 0) and ``unknown_fields`` (list of
        top-level keys that ``TraceHeader`` does not have).

    Raises
    ------
    TraceFormatError
        Unreadable, not YAML, not a mapping, ``trace_version`` missing or not a positive int,
        ``time_unit`` other than microseconds, ``warm_up_requests`` not a non-negative int,
        ``server`` / ``network`` not mappings (names the field).
    """
    path = Path(path)
    try:
        doc = load_yaml(read_text(path, "TraceV2 header", TraceFormatError))
    except OSError as exc:
        raise TraceFormatError(f"cannot read TraceV2 header: {exc}", file=str(path)) from exc
    except yaml.YAMLError as exc:
        raise TraceFormatError(f"TraceV2 header is not valid YAML: {exc}", file=str(path)) from exc
    if not isinstance(doc, dict):
        raise TraceFormatError("TraceV2 header must be a YAML mapping", file=str(path))
    ver = doc.get("trace_version")
    if isinstance(ver, bool) or not isinstance(ver, int) or ver < 1:
        raise TraceFormatError(f"expected a positive integer, got {ver!r}", file=str(path),
                               field="trace_version")
    unit = doc.get("time_unit")
    if unit is not None and str(unit).strip().lower() not in _TIME_UNITS:
        raise TraceFormatError(f"unsupported time unit {unit!r} (the *_us columns are "
                               f"microseconds: expected one of {', '.join(_TIME_UNITS)})",
                               file=str(path), field="time_unit")
    warm = doc.get("warm_up_requests", 0)
    if warm is None:
        warm = 0
    if isinstance(warm, bool) or not isinstance(warm, int) or warm < 0:
        raise TraceFormatError(f"expected a non-negative integer, got {warm!r}", file=str(path),
                               field="warm_up_requests")
    for key in ("server", "network"):
        if doc.get(key) is not None and not isinstance(doc[key], dict):
            raise TraceFormatError("expected a mapping", file=str(path), field=key)
    out = dict(doc)
    out["warm_up_requests"] = warm
    out["unknown_fields"] = sorted(str(k) for k in doc if k not in HEADER_FIELDS)
    return out


def _data_path(header: Path) -> Path:
    cand = header.with_suffix(".csv")
    refuse_special(cand, "TraceV2 data CSV", TraceFormatError)
    if not cand.is_file():
        raise TraceFormatError(f"no TraceV2 data CSV next to the header (expected {cand.name}; "
                               f"pass data= explicitly)", file=str(header))
    return cand


def _int_cell_message(column: str, cell: str) -> str:
    """Why an integer cell of ``column`` is refused: a time (``*_us``) or a token count."""
    v = _parse_int(cell)
    if column.endswith("_us"):
        if v is not None and v < 0:
            return (f"a time in microseconds, and negative ({cell!r}); TraceV2 times are "
                    f"non-negative integers: check the client's clock and the column's units")
        return (f"expected a time in whole microseconds (a non-negative integer below 2**62), "
                f"got {cell!r}")
    if v is not None and v < 0:
        return f"a token count, and negative ({cell!r}); expected an integer >= 0"
    return f"expected a token count (a non-negative integer <= 1e9), got {cell!r}"


def _parse_int(text: str) -> int | None:
    """An integer cell (Go writes %d; '12.0' is accepted); None if not an integer below 2**62."""
    t = text.strip()
    try:
        v: float = int(t)
    except ValueError:
        try:
            v = float(t)
        except ValueError:
            return None
        if not math.isfinite(v) or v != int(v):
            return None
    return int(v) if abs(v) < 2**62 else None


def read_tracev2(header: str | Path, data: str | Path | None = None,
                 experiment_id: str | None = None, strict: bool = False
                 ) -> tuple[dict[str, pd.DataFrame], IngestReport]:
    """Read a BLIS TraceV2 trace: per-request rows and a lifecycle-style summary row.

    Parameters
    ----------
    header
        The header YAML (``blis observe --trace-header``).
    data
        The data CSV (``--trace-data``); default: the header's path with suffix ``.csv``.
    experiment_id
        Id of the run (default: the header's file stem).
    strict
        Raise a :class:`TraceFormatError` (file, line, field) at the first malformed row
        instead of counting it dropped.

    Returns
    -------
    tables : dict[str, pandas.DataFrame]
        ``client_requests`` (:data:`~bayes_latency.data.client.frames.CLIENT_REQUEST_COLUMNS`, one row
        per kept request in file order; ``arrival_s`` / ``send_s`` from the first kept arrival,
        the wall-clock sends aligned to the workload-clock arrivals so that the smallest send
        delay is 0) and ``lifecycle`` (one summary row,
        :data:`~bayes_latency.data.client.frames.CLIENT_SUMMARY_COLUMNS`, ``source="tracev2"``, model
        and tp from ``server.model`` / ``server.tensor_parallel``): TTFT, E2E, TPOT (per-request
        decode interval) and NTPOT statistics over the ok requests; ITL mean only, chunk-weighted
        ``sum(last - first) / sum(num_chunks - 1)``; rates over the span from the first send to
        the last chunk; ``achieved_rate = (n - 1) / send span``; ``requested_rate`` NaN (not in
        the trace).
    report : IngestReport
        ``read["requests"] == kept["requests_ok"] + kept["requests_failed"] + sum(dropped)``;
        drop reasons: ``warm_up``, ``short_row``, ``duplicate_request_id``,
        ``malformed:<column>`` (unparseable or negative number, or a ``streaming`` that is not a
        boolean), ``first_token_before_send``,
        ``last_token_before_first``, ``missing_times`` (an ok request without send / first /
        last chunk time), ``no_output_tokens``.

    Raises
    ------
    TraceFormatError
        Bad header (see :func:`read_tracev2_header`), missing / unreadable CSV, a required
        column missing from the CSV header row (names it, line 1), no request rows, no kept
        request, or any malformed row when ``strict``.
    """
    header = Path(header)
    hdr = read_tracev2_header(header)
    data = Path(data) if data is not None else _data_path(header)
    eid = experiment_id or (header.name[:-len(".trace.yaml")]
                            if header.name.endswith(".trace.yaml") else header.stem)
    report = IngestReport(source=f"{header} + {data.name}")
    report.read["files"] += 2
    if hdr["unknown_fields"]:
        report.notes.append(f"{header.name}: fields unknown to TraceHeader ignored: "
                            f"{', '.join(hdr['unknown_fields'])}")
    if hdr.get("mode") not in (None, "real"):
        report.notes.append(f"{header.name}: mode={hdr.get('mode')!r}: a simulated trace, "
                            f"not a measurement")
    warm = hdr["warm_up_requests"]
    refuse_special(data, "TraceV2 data CSV", TraceFormatError)
    try:
        fh = open(data, encoding="utf-8-sig", newline="")
    except OSError as exc:
        raise TraceFormatError(f"cannot read TraceV2 data: {exc}", file=str(data)) from exc
    with fh:
        reader = csv.reader(fh)
        try:
            cols = next(reader, None)
        except (csv.Error, UnicodeDecodeError) as exc:
            raise TraceFormatError(f"not a CSV: {exc}", file=str(data), line=1) from exc
        if not cols:
            raise TraceFormatError("empty TraceV2 data file (no CSV header row)",
                                   file=str(data), line=1)
        cols = [c.strip() for c in cols]
        for c in REQUIRED_COLUMNS:
            if c not in cols:
                raise TraceFormatError(f"required column missing from the CSV header row "
                                       f"(has: {', '.join(cols[:8])}{' ...' if len(cols) > 8 else ''})",
                                       file=str(data), line=1, field=c)
        idx = {c: i for i, c in enumerate(cols)}
        recs: list[dict[str, Any]] = []
        seen: set[int] = set()

        def bad(reason: str, line: int, field: str | None, msg: str) -> None:
            if strict:
                raise TraceFormatError(msg, file=str(data), line=line, field=field)
            report.drop_at(reason, f"{data.name} line {line}"
                           + (f" field {field!r}" if field else "") + f": {msg}")

        while True:
            try:
                row = next(reader)
            except StopIteration:
                break
            except (csv.Error, UnicodeDecodeError) as exc:
                raise TraceFormatError(f"CSV error: {exc}", file=str(data),
                                       line=reader.line_num) from exc
            line = reader.line_num
            if not row or all(not c.strip() for c in row):
                continue
            report.read["requests"] += 1
            if len(row) < len(cols):
                bad("short_row", line, None, f"{len(row)} cells, header has {len(cols)}")
                continue
            rid = _parse_int(row[idx["request_id"]])
            if rid is None:
                bad("malformed:request_id", line, "request_id",
                    f"not an integer: {row[idx['request_id']]!r}")
                continue
            vals: dict[str, int] = {}
            err = None
            for c in _INT_COLUMNS:
                if c not in idx:
                    vals[c] = 0
                    continue
                v = _parse_int(row[idx[c]])
                if v is None or v < 0 or (v > 10**9 and not c.endswith("_us")):
                    err = c
                    break
                vals[c] = v
            if err is not None:
                bad(f"malformed:{err}", line, err, _int_cell_message(err, row[idx[err]]))
                continue
            if rid in seen:
                bad("duplicate_request_id", line, "request_id", f"request_id {rid} seen before")
                continue
            seen.add(rid)
            if rid < warm:
                report.drop("warm_up")
                continue
            status = row[idx["status"]].strip()
            ok = status == "ok"
            send, first, last = (vals["send_time_us"], vals["first_chunk_time_us"],
                                 vals["last_chunk_time_us"])
            if ok:
                zero = next((c for c in ("send_time_us", "first_chunk_time_us",
                                         "last_chunk_time_us") if vals[c] == 0), None)
                if zero is not None:
                    bad("missing_times", line, zero,
                        f"ok request with a zero time (send={send}, first={first}, last={last})")
                    continue
                if first < send:
                    bad("first_token_before_send", line, "first_chunk_time_us",
                        f"first chunk {first} before send {send}")
                    continue
                if last < first:
                    bad("last_token_before_first", line, "last_chunk_time_us",
                        f"last chunk {last} before first chunk {first}")
                    continue
                if vals["output_tokens"] < 1:
                    bad("no_output_tokens", line, "output_tokens", "ok request with 0 tokens")
                    continue
            streaming = True
            if "streaming" in idx:
                streaming = _BOOLS.get(row[idx["streaming"]].strip())
                if streaming is None:
                    bad("malformed:streaming", line, "streaming",
                        f"expected true / false, got {row[idx['streaming']]!r}")
                    continue
            prompt = vals["server_input_tokens"] or (vals["input_tokens"]
                                                     + vals["prefix_length"])
            msg = row[idx["error_message"]].strip() if "error_message" in idx else ""
            recs.append({"rid": rid, "ok": ok, "status": status, "err": msg,
                         "arrival": vals["arrival_time_us"], "send": send, "first": first,
                         "last": last, "prompt": prompt, "out": vals["output_tokens"],
                         "chunks": vals["num_chunks"], "streaming": streaming})
            report.kept["requests_ok" if ok else "requests_failed"] += 1
    if report.read["requests"] == 0:
        raise TraceFormatError("no request rows in the TraceV2 data", file=str(data))
    if not recs:
        raise TraceFormatError(f"no usable request: {report.read['requests']} read, all "
                               f"dropped ({dict(report.dropped)})", file=str(data))
    n_plain = sum(1 for r in recs if r["ok"] and not r["streaming"])
    if n_plain:
        report.notes.append(f"{data.name}: {n_plain} non-streaming request(s): the first chunk is "
                            f"the whole response, so their TTFT and decode interval are NaN")
    req, itl_mean = _tables(recs, eid)
    row = _summary(req, recs, itl_mean, hdr, eid)
    report.kept["lifecycle_rows"] += 1
    return {"lifecycle": summary_frame([row]), "client_requests": req}, report


def _tables(recs: list[dict[str, Any]], eid: str) -> tuple[pd.DataFrame, float]:
    arr = np.array([r["arrival"] for r in recs], dtype=float)
    sends = np.array([r["send"] if r["send"] > 0 else np.nan for r in recs], dtype=float)
    # arrivals are on the workload clock, sends on the wall clock: align them so that the
    # smallest send delay (send - arrival) is 0
    delay = sends - arr
    t_send0 = arr.min() + np.nanmin(delay) if np.isfinite(delay).any() else np.nan
    cols: dict[str, list[Any]] = {c: [] for c in CLIENT_REQUEST_COLUMNS}
    span_us, gaps = 0.0, 0
    for i, r in enumerate(recs):
        ok = r["ok"]
        ttft = (r["first"] - r["send"]) / 1e6 if ok and r["streaming"] else math.nan
        e2e = (r["last"] - r["send"]) / 1e6 if ok else math.nan
        cols["experiment_id"].append(eid)
        cols["source"].append("tracev2")
        cols["request_index"].append(i)
        cols["request_id"].append(str(r["rid"]))
        cols["arrival_s"].append((arr[i] - arr.min()) / 1e6)
        cols["send_s"].append((sends[i] - t_send0) / 1e6)
        cols["prompt_tokens"].append(r["prompt"])
        cols["output_tokens"].append(r["out"])
        cols["ttft_s"].append(ttft)
        cols["e2e_s"].append(e2e)
        cols["decode_interval_s"].append((e2e - ttft) / (r["out"] - 1)
                                         if ok and r["streaming"] and r["out"] > 1 else math.nan)
        cols["status"].append("ok" if ok else "error")
        cols["error"].append("" if ok else (f"{r['status']}: {r['err']}" if r["err"]
                                            else r["status"] or "no status")[:200])
        if ok and r["streaming"] and r["chunks"] > 1:
            span_us += r["last"] - r["first"]
            gaps += r["chunks"] - 1
    return requests_frame(cols), (span_us / gaps / 1e6 if gaps else math.nan)


def _summary(req: pd.DataFrame, recs: list[dict[str, Any]], itl_mean: float,
             hdr: dict[str, Any], eid: str) -> dict[str, Any]:
    row: dict[str, Any] = summary_from_requests(req)
    row["itl_mean_s"] = itl_mean
    server = hdr.get("server") or {}
    tp = server.get("tensor_parallel")
    model = server.get("model")
    ok = [r for r in recs if r["ok"]]
    sends = np.array([r["send"] for r in recs if r["send"] > 0], dtype=float)
    send_span = (sends.max() - sends.min()) / 1e6 if sends.size else math.nan
    wall = ((max(r["last"] for r in ok) - min(r["send"] for r in ok)) / 1e6) if ok else math.nan
    fail = [(r["last"] - r["send"]) / 1e6 for r in recs
            if not r["ok"] and r["send"] > 0 and r["last"] >= r["send"]]
    row.update({
        "experiment_id": eid, "stage": "summary", "stage_index": None,
        "model": model if isinstance(model, str) and model else None,
        "tp": tp if isinstance(tp, int) and not isinstance(tp, bool) and tp > 0 else None,
        "requested_rate": math.nan,
        "achieved_rate": (sends.size - 1) / send_span if send_span > 0 else math.nan,
        "send_duration_s": send_span, "schedule_delay_mean_s": math.nan,
        "input_tokens_per_sec": sum(r["prompt"] for r in ok) / wall if wall > 0 else math.nan,
        "output_tokens_per_sec": sum(r["out"] for r in ok) / wall if wall > 0 else math.nan,
        "requests_per_sec": len(ok) / wall if wall > 0 else math.nan,
        "failure_latency_mean_s": float(np.mean(fail)) if fail else math.nan,
        "source": "tracev2", "max_concurrency": math.nan, "burstiness": math.nan,
        "duration_s": wall,
    })
    return row
