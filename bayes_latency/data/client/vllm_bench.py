"""Reader of ``vllm bench serve --save-result`` JSON (vLLM's ``benchmark_serving`` result file).

Field names follow ``vllm/benchmarks/serve.py`` (``benchmark()`` result dict and ``main``'s
``result_json``) and the older ``benchmarks/benchmark_serving.py`` of vllm-project/vllm:

- setup: ``date``, ``backend`` (``endpoint_type``), ``label``, ``model_id``, ``tokenizer_id``,
  ``num_prompts``, ``request_rate`` (a number or the string ``"inf"``), ``burstiness``,
  ``max_concurrency`` and any ``--metadata KEY=VALUE`` keys (``tp`` /
  ``tensor_parallel_size`` is used when present);
- totals: ``duration`` (s), ``completed``, ``failed`` (newer versions), ``total_input_tokens``,
  ``total_output_tokens`` (successful requests only), ``request_throughput``,
  ``output_throughput``, ``total_token_throughput``;
- statistics in milliseconds: ``mean_<m>_ms``, ``median_<m>_ms``, ``std_<m>_ms`` and
  ``p<q>_<m>_ms`` (``q`` from ``--metric-percentiles``, default 99) for ``m`` in ``ttft``,
  ``tpot``, ``itl``, ``e2el`` (``--percentile-metrics``, default ``ttft,tpot,itl``);
- per-request lists, one entry per request (``--save-detailed``; ``latencies`` and
  ``queue_times`` are written by newer versions even without it): ``input_lens``,
  ``output_lens`` (0 for a failed request), ``ttfts`` (s), ``itls`` (list of s per request),
  ``latencies`` (s), ``start_times`` (s, ``time.perf_counter``), ``queue_times`` (s, client
  semaphore wait), ``generated_texts``, ``errors`` (``""`` on success).

A request is failed when its ``errors`` entry is a non-empty string (or, as vLLM writes for every
failure, its output length and TTFT are both 0). Failed requests are kept as ``status="error"``
rows and counted ``kept["requests_failed"]``; a successful request with a missing, non-numeric,
NaN or negative value (or a TTFT <= 0, an output length < 1, an E2E before the first token) is
dropped and counted ``malformed:<field>``. So ``read["requests"] == kept["requests_ok"] +
kept["requests_failed"] + sum(dropped)``.

vLLM's ``tpot`` is the per-request decode interval ``(latency - ttft) / (output_len - 1)``
(not affected by chunked streaming); its ``itl`` is the interval between streamed chunks.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bayes_latency.data.client.frames import (
    CLIENT_REQUEST_COLUMNS,
    decode_interval,
    requests_frame,
    summary_frame,
    summary_from_requests,
)
from bayes_latency.data.report import IngestReport
from bayes_latency.errors import TraceFormatError
from bayes_latency.textfiles import read_text

__all__ = ["PER_REQUEST_FIELDS", "looks_like_vllm_bench", "read_vllm_bench"]

#: Short metric name of the lifecycle table -> vLLM's metric name in ``<stat>_<name>_ms``.
_METRIC_KEYS = {"ttft": "ttft", "e2e": "e2el", "tpot": "tpot", "itl": "itl"}
_STAT_KEYS = {"mean": "mean", "median": "median", "p90": "p90", "p99": "p99"}
#: Per-request list fields of the result JSON.
PER_REQUEST_FIELDS = ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times",
                      "queue_times", "generated_texts", "errors")
#: Non-negative numeric top-level fields (a NaN, negative or non-numeric value is an error).
_NUMERIC_FIELDS = ("duration", "completed", "failed", "num_prompts", "total_input_tokens",
                   "total_output_tokens", "request_throughput", "output_throughput",
                   "total_token_throughput")
_TP_KEYS = ("tp", "tensor_parallel_size", "tensor_parallelism", "tensor_parallel")


def looks_like_vllm_bench(doc: Any) -> bool:
    """Whether a parsed JSON document is a ``vllm bench serve`` result object."""
    if not isinstance(doc, dict) or "completed" not in doc:
        return False
    return any(k in doc for k in ("mean_ttft_ms", "mean_e2el_ms", "ttfts", "request_throughput",
                                  "total_input_tokens"))


def _load_docs(path: Path) -> list[dict[str, Any]]:
    """The result objects of a file: one, or one per line (``--append-result``)."""
    try:
        text = read_text(path, "vllm bench result", TraceFormatError)
    except OSError as exc:
        raise TraceFormatError(f"cannot read: {exc}", file=str(path)) from exc
    try:
        docs = [json.loads(text)]
    except json.JSONDecodeError as exc:
        if "Extra data" not in str(exc):
            raise TraceFormatError(f"not valid JSON: {exc}", file=str(path)) from exc
        docs = []
        for i, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                docs.append(json.loads(line))
            except json.JSONDecodeError as exc2:
                raise TraceFormatError(f"not valid JSON: {exc2}", file=str(path),
                                       line=i) from exc2
    except RecursionError as exc:
        raise TraceFormatError("not valid JSON: nested too deeply", file=str(path)) from exc
    for d in docs:
        if not isinstance(d, dict):
            raise TraceFormatError(
                f"expected a result object, got a JSON {type(d).__name__} (the '.pytorch.json' "
                f"companion? pass the main result JSON)", file=str(path))
    return docs


def _top_num(doc: dict[str, Any], key: str, path: Path, required: bool = False) -> float:
    """A non-negative finite top-level number; NaN when absent / null (error if required)."""
    if key not in doc or doc[key] is None:
        if required:
            raise TraceFormatError("required field missing", file=str(path), field=key)
        return math.nan
    v = doc[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TraceFormatError(f"expected a number, got {v!r}", file=str(path), field=key)
    v = float(v)
    if not math.isfinite(v) or v < 0:
        raise TraceFormatError(f"expected a finite non-negative number, got {v!r}",
                               file=str(path), field=key)
    return v


def _req_num(v: Any, minimum: float = 0.0, strict: bool = False) -> float | None:
    """A per-request number if finite and >= minimum (> if strict), else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    if not math.isfinite(v) or v < minimum or (strict and v <= minimum):
        return None
    return v


def _tokens(v: Any) -> int | None:
    """A per-request token count: an integral number in [0, 1e9], else None."""
    f = _req_num(v)
    if f is None or f != int(f) or f > 1e9:
        return None
    return int(f)


def _per_request(doc: dict[str, Any], path: Path, eid: str, report: IngestReport
                 ) -> tuple[pd.DataFrame, np.ndarray] | None:
    """The per-request table and all chunk intervals of the ok requests; None if not saved."""
    present = [f for f in PER_REQUEST_FIELDS if f in doc]
    if not {"input_lens", "output_lens", "ttfts"} & set(present):
        return None
    for f in ("input_lens", "output_lens", "ttfts"):
        if f not in doc:
            raise TraceFormatError(f"per-request field missing (the file has "
                                   f"{', '.join(present)})", file=str(path), field=f)
    if "itls" not in doc and "latencies" not in doc:
        raise TraceFormatError("per-request field missing: need 'itls' or 'latencies' for E2E",
                               file=str(path), field="itls")
    lists = {}
    for f in present:
        if not isinstance(doc[f], list):
            raise TraceFormatError(f"expected a list (one entry per request), got "
                                   f"{type(doc[f]).__name__}", file=str(path), field=f)
        lists[f] = doc[f]
    n = len(lists["input_lens"])
    for f, vals in lists.items():
        if len(vals) != n:
            raise TraceFormatError(f"has {len(vals)} entries but input_lens has {n} "
                                   f"(per-request lists must have one entry per request)",
                                   file=str(path), field=f)
    report.read["requests"] += n
    starts = lists.get("start_times")
    queues = lists.get("queue_times")
    errs = lists.get("errors")
    t0 = None  # the run's first arrival (first send when queue_times are absent)
    if starts is not None:
        good = []
        for k, x in enumerate(starts):
            s = _req_num(x, -math.inf)
            q = _req_num(queues[k]) if queues is not None else None
            e = errs[k] if errs is not None else ""
            if s is not None and not (isinstance(e, str) and e.strip()):  # successes' clock
                good.append(s - (q or 0.0))
        t0 = min(good) if good else None
    cols: dict[str, list[Any]] = {c: [] for c in CLIENT_REQUEST_COLUMNS}
    itl_all: list[np.ndarray] = []

    def add(i: int, prompt: Any, out: Any, ttft: float, e2e: float, status: str, err: str,
            send: float, arrival: float) -> None:
        cols["experiment_id"].append(eid)
        cols["source"].append("vllm_bench")
        cols["request_index"].append(i)
        cols["request_id"].append(str(i))
        cols["arrival_s"].append(arrival)
        cols["send_s"].append(send)
        cols["prompt_tokens"].append(prompt)
        cols["output_tokens"].append(out)
        cols["ttft_s"].append(ttft)
        cols["e2e_s"].append(e2e)
        cols["decode_interval_s"].append(
            (e2e - ttft) / (out - 1) if status == "ok" and out is not None and out > 1
            else math.nan)
        cols["status"].append(status)
        cols["error"].append(err[:200])

    for i in range(n):
        send = arrival = math.nan
        if starts is not None and t0 is not None:
            s = _req_num(starts[i], -math.inf)
            if s is not None:
                send = s - t0
                q = _req_num(queues[i]) if queues is not None else None
                arrival = (s - q) - t0 if q is not None else (send if queues is None
                                                                else math.nan)
        err = lists["errors"][i] if "errors" in lists else ""
        err = err if isinstance(err, str) else ("" if err is None else str(err))
        prompt = _tokens(lists["input_lens"][i])
        out = _tokens(lists["output_lens"][i])
        ttft = _req_num(lists["ttfts"][i])
        failed = bool(err.strip()) or (out == 0 and ttft == 0)
        if failed:
            report.kept["requests_failed"] += 1
            add(i, prompt, out, math.nan, math.nan, "error",
                err.strip() or "failed (no error text)", send, arrival)
            continue
        bad = None
        if prompt is None:
            bad = ("input_lens", lists["input_lens"][i])
        elif out is None or out < 1:
            bad = ("output_lens", lists["output_lens"][i])
        elif ttft is None or ttft <= 0:
            bad = ("ttfts", lists["ttfts"][i])
        itl = None
        if bad is None and "itls" in lists:
            raw = lists["itls"][i]
            vals = [_req_num(x) for x in raw] if isinstance(raw, list) else [None]
            if any(v is None for v in vals):
                bad = ("itls", raw if not isinstance(raw, list) else
                       next(x for x, v in zip(raw, vals, strict=True) if v is None))
            else:
                itl = np.asarray(vals, dtype=float)
        e2e = math.nan
        if bad is None:
            if "latencies" in lists:
                lat = _req_num(lists["latencies"][i])
                if lat is None or lat < ttft * (1 - 1e-9):
                    bad = ("latencies", lists["latencies"][i])
                else:
                    e2e = lat
            else:
                e2e = ttft + float(itl.sum())
        if bad is None and starts is not None and math.isnan(send):
            bad = ("start_times", starts[i])
        if bad is None and queues is not None and _req_num(queues[i]) is None:
            bad = ("queue_times", queues[i])
        if bad is not None:
            report.drop_at(f"malformed:{bad[0]}", f"{path.name} request {i}: {bad[0]}={bad[1]!r}")
            continue
        report.kept["requests_ok"] += 1
        if itl is not None:
            itl_all.append(itl)
        add(i, prompt, out, ttft, e2e, "ok", "", send, arrival)
    itls = np.concatenate(itl_all) if itl_all else (np.array([]) if "itls" in lists else None)
    return requests_frame(cols), itls


def _read_doc(doc: dict[str, Any], path: Path, eid: str, report: IngestReport
              ) -> tuple[dict[str, Any], pd.DataFrame | None]:
    if not looks_like_vllm_bench(doc):
        if "completed" not in doc:
            raise TraceFormatError("not a vllm bench serve result (required field missing)",
                                   file=str(path), field="completed")
        raise TraceFormatError("not a vllm bench serve result (no mean_ttft_ms, ttfts, "
                               "request_throughput or total_input_tokens)", file=str(path))
    nums = {k: _top_num(doc, k, path, required=k in ("duration", "completed"))
            for k in _NUMERIC_FIELDS}
    for key in doc:
        if key.endswith("_ms") and key.split("_")[0] in ("mean", "median", "std") or (
                key.endswith("_ms") and key.startswith("p") and key[1:2].isdigit()):
            _top_num(doc, key, path)
    r0, d0 = report.read["requests"], report.n_dropped
    pr = _per_request(doc, path, eid, report)
    req, itls = pr if pr is not None else (None, None)
    n_req, n_dropped = report.read["requests"] - r0, report.n_dropped - d0
    derived = summary_from_requests(req, itls) if req is not None else {}
    completed, failed, duration = nums["completed"], nums["failed"], nums["duration"]
    if math.isnan(failed) and req is not None:  # older versions: no 'failed' field
        failed = max(float(n_req) - completed, 0.0)
    row: dict[str, Any] = {
        "experiment_id": eid, "stage": "summary", "stage_index": None,
        "model": doc.get("model_id") if isinstance(doc.get("model_id"), str) else None,
        "tp": _tp(doc), "count": completed + failed, "successes": completed,
        "failures": failed, "source": "vllm_bench", "duration_s": duration,
        "max_concurrency": _top_num(doc, "max_concurrency", path),
        "burstiness": _burstiness(doc, path),
    }
    rate = doc.get("request_rate")
    if isinstance(rate, str) and rate.strip().lower() in ("inf", "infinity"):
        row["requested_rate"] = math.inf
        report.notes.append(f"{path.name}: request_rate=inf (all requests sent at once, "
                            f"concurrency-limited by max_concurrency)")
    else:
        row["requested_rate"] = _top_num(doc, "request_rate", path)
    derived_used: list[str] = []
    for m, vk in _METRIC_KEYS.items():
        for s, sk in _STAT_KEYS.items():
            v = _top_num(doc, f"{sk}_{vk}_ms", path) / 1000.0
            if math.isnan(v) and not math.isnan(derived.get(f"{m}_{s}_s", math.nan)):
                v = derived[f"{m}_{s}_s"]
                derived_used.append(f"{m}_{s}_s")
            row[f"{m}_{s}_s"] = v
    for s in _STAT_KEYS:
        row[f"ntpot_{s}_s"] = derived.get(f"ntpot_{s}_s", math.nan)
    if completed > 0 and not math.isnan(nums["total_input_tokens"]):
        row["prompt_len_mean"] = nums["total_input_tokens"] / completed
    else:
        row["prompt_len_mean"] = derived.get("prompt_len_mean", math.nan)
    if completed > 0 and not math.isnan(nums["total_output_tokens"]):
        row["output_len_mean"] = nums["total_output_tokens"] / completed
    else:
        row["output_len_mean"] = derived.get("output_len_mean", math.nan)
    row["input_tokens_per_sec"] = (nums["total_input_tokens"] / duration if duration > 0
                                   else math.nan)
    row["output_tokens_per_sec"] = nums["output_throughput"]
    row["requests_per_sec"] = nums["request_throughput"]
    row["achieved_rate"] = row["send_duration_s"] = row["schedule_delay_mean_s"] = math.nan
    if req is not None and req["send_s"].notna().any():
        sends = req["send_s"].to_numpy(dtype=float)
        span = float(np.nanmax(sends) - np.nanmin(sends))
        row["send_duration_s"] = span
        row["achieved_rate"] = (np.isfinite(sends).sum() - 1) / span if span > 0 else math.nan
        delay = (req["send_s"] - req["arrival_s"]).to_numpy(dtype=float)
        if np.isfinite(delay).any():
            row["schedule_delay_mean_s"] = float(np.nanmean(delay))
    row["failure_latency_mean_s"] = math.nan
    row["decode_interval_s"] = decode_interval(row["e2e_mean_s"], row["ttft_mean_s"],
                                               row["output_len_mean"])
    if derived_used:
        report.notes.append(f"{path.name}: computed from the per-request lists (absent from "
                            f"the summary): {', '.join(derived_used)}")
    if req is not None and n_dropped == 0:
        top = row["ttft_mean_s"]
        mine = derived.get("ttft_mean_s", math.nan)
        if "ttft_mean_s" not in derived_used and top > 0 and abs(mine / top - 1) > 0.01:
            report.notes.append(f"{path.name}: mean_ttft_ms ({top * 1e3:.2f} ms) differs from "
                                f"the mean of ttfts ({mine * 1e3:.2f} ms) by > 1%")
        if not math.isnan(completed) and derived.get("successes") != completed:
            report.notes.append(f"{path.name}: completed={completed:g} but the per-request "
                                f"lists hold {derived.get('successes', 0):g} successes")
    report.kept["lifecycle_rows"] += 1
    return row, req


def _burstiness(doc: dict[str, Any], path: Path) -> float:
    """``burstiness`` (gamma shape of the inter-arrival times; 1 = Poisson, may be Infinity)."""
    v = doc.get("burstiness")
    if v is None:
        return math.nan
    if isinstance(v, str) and v.strip().lower() in ("inf", "infinity"):
        return math.inf
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or v <= 0:
        raise TraceFormatError(f"expected a positive number, got {v!r}", file=str(path),
                               field="burstiness")
    return float(v)


def _tp(doc: dict[str, Any]) -> int | None:
    for k in _TP_KEYS:
        v = doc.get(k)
        try:
            t = int(str(v).strip()) if v is not None and not isinstance(v, bool) else None
        except ValueError:
            t = None
        if t is not None and t > 0:
            return t
    return None


def read_vllm_bench(path: str | Path, experiment_id: str | None = None
                    ) -> tuple[dict[str, pd.DataFrame], IngestReport]:
    """Read a ``vllm bench serve --save-result`` JSON file.

    Parameters
    ----------
    path
        The result JSON (one object; or one object per line, as ``--append-result`` writes).
    experiment_id
        Id of the run (default: the file stem); with several runs in one file,
        ``<experiment_id>#<k>`` for the k-th (0-based).

    Returns
    -------
    tables : dict[str, pandas.DataFrame]
        ``lifecycle``: one summary row per run (:data:`~bayes_latency.data.client.frames.CLIENT_SUMMARY_COLUMNS`,
        seconds, ``source="vllm_bench"``, ``stage="summary"``; statistics from the file's
        ``*_ms`` fields, those it lacks — e.g. ``e2el`` when not in ``--percentile-metrics``,
        ``p90`` when not in ``--metric-percentiles``, and ``ntpot`` always — from the
        per-request lists when saved, else NaN). ``client_requests``: one row per request
        (:data:`~bayes_latency.data.client.frames.CLIENT_REQUEST_COLUMNS`; empty without
        ``--save-detailed``); E2E is ``latencies`` when stored, else ``ttft + sum(itls)``.
    report : IngestReport
        ``read["files"]``, ``read["requests"]``, ``kept["requests_ok"]``,
        ``kept["requests_failed"]``, ``kept["lifecycle_rows"]``, ``dropped["malformed:<field>"]``.

    Raises
    ------
    TraceFormatError
        Unreadable or non-JSON file, not a result object, ``completed`` / ``duration`` missing,
        a top-level metric that is not a finite non-negative number, a per-request list that is
        missing (while others are present), not a list, or of another length (names the field).
    """
    path = Path(path)
    report = IngestReport(source=str(path))
    report.read["files"] += 1
    docs = _load_docs(path)
    if not docs:
        raise TraceFormatError("empty file", file=str(path))
    base = experiment_id or path.stem
    rows, reqs = [], []
    for k, doc in enumerate(docs):
        eid = base if len(docs) == 1 else f"{base}#{k}"
        row, req = _read_doc(doc, path, eid, report)
        rows.append(row)
        if req is not None and len(req):
            reqs.append(req)
    req_df = pd.concat(reqs, ignore_index=True) if reqs else requests_frame(
        {c: [] for c in CLIENT_REQUEST_COLUMNS})
    return {"lifecycle": summary_frame(rows), "client_requests": req_df}, report
