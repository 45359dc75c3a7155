"""Write one synthetic experiment folder in the real formats (``docs/ARCHITECTURE.md``).

``EXP/serving.yaml``, ``traces.jsonl`` (OTLP JSON Lines of the vLLM fork: API ``llm_request``
spans, core ``llm_core`` spans with journey events, ``scheduler_steps_<N>`` spans with sampled
``step.BATCH_SUMMARY`` and rich ``step.REQUEST_SNAPSHOT`` events), ``results/*_lifecycle_metrics.json``
(inference-perf), ``profile.yaml``, ``truth.yaml`` and the engine's own truth tables
``engine_batches.parquet`` / ``engine_chunks.parquet``.

JSON is built with f-strings (one template per record kind); every line is valid JSON
(``tests/test_synth_writer.py`` parses all of them). Spans are written when they end: all spans
are sorted by end time and grouped into export lines per 1-second collector flush (at most
:data:`MAX_SPANS_PER_LINE` spans per line); inside a line the API process's spans come first in
their own ``resourceSpans`` entry, then the engine's (scopes ``vllm.scheduler`` and
``vllm.scheduler.step``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from bayes_latency.schedule.engine import (
    EV_FINISHED,
    EV_FIRST_TOKEN,
    EV_PREEMPTED,
    EV_QUEUED,
    EV_SCHED_FIRST,
    EV_SCHED_RESUME,
    EngineResult,
)

EPOCH_OFFSET_NS = 1_771_340_978_621_800_000
"""Wall clock minus engine monotonic clock (epoch ns = monotonic ns + offset), as in the spec example."""
MAX_SPANS_PER_LINE = 256
FLUSH_NS = 1_000_000_000
SERVICE_NAME = "vllm-inference-perf"
CLOSURE_INTERVAL = 100
PERCENTILES: tuple[tuple[str, float], ...] = (
    ("p0.1", 0.1), ("p1", 1.0), ("p5", 5.0), ("p10", 10.0), ("p25", 25.0), ("median", 50.0),
    ("p75", 75.0), ("p90", 90.0), ("p95", 95.0), ("p99", 99.0), ("p99.9", 99.9),
)

_EVENT_TYPE = {EV_QUEUED: "QUEUED", EV_SCHED_FIRST: "SCHEDULED", EV_SCHED_RESUME: "SCHEDULED",
               EV_FIRST_TOKEN: "FIRST_TOKEN", EV_PREEMPTED: "PREEMPTED", EV_FINISHED: "FINISHED"}


@dataclass(frozen=True)
class RequestTimes:
    """API- and client-side timestamps of each request (engine monotonic ns, input order).

    Attributes
    ----------
    arrived_ns : api.ARRIVED (= client send, same host clock).
    departed_ns : api.DEPARTED.
    client_first_token_ns, client_end_ns : when the client saw the first token / the end.
    """

    arrived_ns: np.ndarray
    departed_ns: np.ndarray
    client_first_token_ns: np.ndarray
    client_end_ns: np.ndarray


@dataclass(frozen=True)
class RequestIds:
    """Identifiers of each request: API id, engine id, trace id, API and core span ids."""

    api_id: list[str]
    engine_id: list[str]
    trace_id: list[str]
    api_span: list[str]
    core_span: list[str]


def make_ids(n: int, rng: np.random.Generator) -> RequestIds:
    """Random but reproducible ids for ``n`` requests (``cmpl-<16hex>``, ``...-0-<8hex>``)."""
    r = rng.integers(0, 2 ** 63, size=(n, 6), dtype=np.int64).tolist()
    api = [f"cmpl-{a:016x}" for a, *_ in r]
    eng = [f"{api[i]}-0-{r[i][1] & 0xFFFFFFFF:08x}" for i in range(n)]
    trace = [f"{x[2]:016x}{x[3]:016x}" for x in r]
    aspan = [f"{x[4]:016x}" for x in r]
    cspan = [f"{x[5]:016x}" for x in r]
    return RequestIds(api, eng, trace, aspan, cspan)


# ----------------------------------------------------------------------------- attribute helpers
def _s(k: str, v: str) -> str:
    return f'{{"key":"{k}","value":{{"stringValue":"{v}"}}}}'


def _i(k: str, v: int) -> str:
    return f'{{"key":"{k}","value":{{"intValue":"{v}"}}}}'


def _d(k: str, v: float) -> str:
    return f'{{"key":"{k}","value":{{"doubleValue":{float(v)!r}}}}}'


# ----------------------------------------------------------------------------- spans
def _request_spans(engine: EngineResult, prompt_len: np.ndarray, max_tokens: np.ndarray,
                   times: RequestTimes, ids: RequestIds, model_name: str,
                   spans: list[tuple[int, int, str]]) -> None:
    """Append ``(end_ns, kind, json)`` of every API (kind 0) and core (kind 1) span."""
    ev = engine.events
    e_req = ev["req"]
    n = len(prompt_len)
    bounds = np.searchsorted(e_req, np.arange(n + 1)).tolist()
    codes, steps, tss = ev["code"].tolist(), ev["step"].tolist(), ev["ts_ns"].tolist()
    pds, dds, nps = ev["prefill_done"].tolist(), ev["decode_done"].tolist(), ev["num_preemptions"].tolist()
    pl, mt = prompt_len.tolist(), max_tokens.tolist()
    arr, dep = times.arrived_ns.tolist(), times.departed_ns.tolist()
    off = EPOCH_OFFSET_NS
    for i in range(n):
        p, m = pl[i], mt[i]
        evs = []
        last = 0
        first = 0
        for j in range(bounds[i], bounds[i + 1]):
            c, ts = codes[j], tss[j]
            if c == EV_QUEUED:
                phase = "WAITING"
            elif c == EV_FIRST_TOKEN or dds[j] > 0:
                phase = "DECODE"
            else:
                phase = "PREFILL"
            et = _EVENT_TYPE[c]
            extra = ""
            if c == EV_SCHED_FIRST:
                extra = "," + _s("schedule.kind", "FIRST")
            elif c == EV_SCHED_RESUME:
                extra = "," + _s("schedule.kind", "RESUME")
            elif c == EV_FINISHED:
                extra = "," + _s("finish.status", "length")
            evs.append(
                f'{{"timeUnixNano":"{ts + off}","name":"journey.{et}","attributes":['
                f'{_s("event.type", et)},{_d("ts.monotonic", ts / 1e9)},{_i("ts.monotonic_ns", ts)},'
                f'{_i("scheduler.step", steps[j])},{_s("phase", phase)},'
                f'{_i("prefill.done_tokens", pds[j])},{_i("prefill.total_tokens", p)},'
                f'{_i("decode.done_tokens", dds[j])},{_i("decode.max_tokens", m)},'
                f'{_i("num_preemptions", nps[j])}{extra}]}}')
            if c == EV_QUEUED:
                first = ts
            last = ts
        core_start = first - 10_000
        core_end = last + 20_000
        core = (f'{{"traceId":"{ids.trace_id[i]}","spanId":"{ids.core_span[i]}",'
                f'"parentSpanId":"{ids.api_span[i]}","name":"llm_core","kind":1,'
                f'"startTimeUnixNano":"{core_start + off}","endTimeUnixNano":"{core_end + off}",'
                f'"attributes":[{_s("gen_ai.request.id", ids.engine_id[i])}],'
                f'"events":[{",".join(evs)}],"status":{{}}}}')
        spans.append((core_end, 1, core))
        a, d = arr[i], dep[i]
        api_start, api_end = a - 10_000, d + 10_000
        api = (f'{{"traceId":"{ids.trace_id[i]}","spanId":"{ids.api_span[i]}","name":"llm_request",'
               f'"kind":2,"startTimeUnixNano":"{api_start + off}","endTimeUnixNano":"{api_end + off}",'
               f'"attributes":[{_s("gen_ai.request.id", ids.api_id[i])},'
               f'{_s("http.route", "/v1/completions")},{_s("gen_ai.response.model", model_name)},'
               f'{_i("gen_ai.usage.prompt_tokens", p)},{_d("gen_ai.request.temperature", 1.0)},'
               f'{_d("gen_ai.request.top_p", 1.0)},{_i("gen_ai.request.max_tokens", m)},'
               f'{_i("gen_ai.request.n", 1)}],'
               f'"events":[{{"timeUnixNano":"{a + off}","name":"api.ARRIVED","attributes":'
               f'[{_d("event.ts.monotonic", a / 1e9)}]}},'
               f'{{"timeUnixNano":"{d + off}","name":"api.DEPARTED","attributes":'
               f'[{_d("event.ts.monotonic", d / 1e9)}]}}],"status":{{}}}}')
        spans.append((api_end, 0, api))


def _step_spans(engine: EngineResult, ids: RequestIds, prompt_len: np.ndarray,
                rng: np.random.Generator, spans: list[tuple[int, int, str]]) -> None:
    """Append the ``scheduler_steps_<N>`` spans (closed every 100 steps when they hold events)."""
    st = engine.steps
    if st.empty:
        return
    sid = st["step_id"].to_numpy()
    t0 = st["ts_start_ns"].to_numpy()
    t1 = t0 + st["cpu_ns"].to_numpy()
    sampled = st["sampled"].to_numpy()
    cols = {c: st[c].to_numpy().tolist() for c in (
        "running_depth", "waiting_depth", "sum_num_prefill_reqs", "sum_num_decode_reqs",
        "sum_prefill_tokens", "sum_decode_tokens", "num_finished", "num_preempted", "blocks_free")}
    total = int(engine.kv_capacity_blocks)
    snaps: dict[int, list[tuple]] = {}
    if not engine.snapshots.empty:
        for row in engine.snapshots.itertuples(index=False):
            snaps.setdefault(int(row.step_id), []).append(tuple(row))
    pl = prompt_len.tolist()
    cache_hit = engine.requests["cache_hit_tokens"].tolist()
    off = EPOCH_OFFSET_NS
    t0l, t1l, sidl, samp = t0.tolist(), t1.tolist(), sid.tolist(), sampled.tolist()
    n = len(sidl)
    seq = 1
    start_k = 0
    events: list[str] = []
    trace_rng = rng.integers(0, 2 ** 63, size=(n // CLOSURE_INTERVAL + 2, 3), dtype=np.int64).tolist()

    def close(k_end: int) -> None:
        nonlocal seq, start_k, events
        tr = trace_rng[seq - 1]
        end = t1l[k_end]
        span = (f'{{"traceId":"{tr[0]:016x}{tr[1]:016x}","spanId":"{tr[2]:016x}",'
                f'"name":"scheduler_steps_{seq}","kind":1,'
                f'"startTimeUnixNano":"{t0l[start_k] + off}","endTimeUnixNano":"{end + off}",'
                f'"attributes":[{_i("scheduler.span_sequence", seq)},'
                f'{_i("scheduler.step_range_start", sidl[start_k])},'
                f'{_i("scheduler.closure_interval", CLOSURE_INTERVAL)},'
                f'{_i("scheduler.step_range_end", sidl[k_end])}],'
                f'"events":[{",".join(events)}],"status":{{}}}}')
        spans.append((end, 2, span))
        seq += 1
        start_k = k_end + 1
        events = []

    for k in range(n):
        if samp[k]:
            s = sidl[k]
            free = cols["blocks_free"][k]
            usage = round(1.0 - free / total, 6) if total else 0.0
            ts = t1l[k] + off
            dur = (t1l[k] - t0l[k]) // 1000
            pre_t, dec_t = cols["sum_prefill_tokens"][k], cols["sum_decode_tokens"][k]
            events.append(
                f'{{"timeUnixNano":"{ts}","name":"step.BATCH_SUMMARY","attributes":['
                f'{_i("step.id", s)},{_i("step.ts_start_ns", t0l[k])},{_i("step.ts_end_ns", t1l[k])},'
                f'{_i("step.duration_us", dur)},{_i("queue.running_depth", cols["running_depth"][k])},'
                f'{_i("queue.waiting_depth", cols["waiting_depth"][k])},'
                f'{_i("batch.num_prefill_reqs", cols["sum_num_prefill_reqs"][k])},'
                f'{_i("batch.num_decode_reqs", cols["sum_num_decode_reqs"][k])},'
                f'{_i("batch.scheduled_tokens", pre_t + dec_t)},'
                f'{_i("batch.prefill_tokens", pre_t)},{_i("batch.decode_tokens", dec_t)},'
                f'{_i("batch.num_finished", cols["num_finished"][k])},'
                f'{_i("batch.num_preempted", cols["num_preempted"][k])},'
                f'{_d("kv.usage_gpu_ratio", usage)},{_i("kv.blocks_total_gpu", total)},'
                f'{_i("kv.blocks_free_gpu", free)}]}}')
            for row in snaps.get(s, ()):
                (_, req, phase, n_prompt, computed, n_out, n_pre, sched, alloc, cached) = row
                events.append(
                    f'{{"timeUnixNano":"{ts}","name":"step.REQUEST_SNAPSHOT","attributes":['
                    f'{_i("step.id", s)},{_s("request.id", ids.engine_id[req])},'
                    f'{_s("request.phase", phase)},{_i("request.num_prompt_tokens", n_prompt)},'
                    f'{_i("request.num_computed_tokens", computed)},'
                    f'{_i("request.num_output_tokens", n_out)},{_i("request.num_preemptions", n_pre)},'
                    f'{_i("request.scheduled_tokens_this_step", sched)},'
                    f'{_i("kv.blocks_allocated_gpu", alloc)},{_i("kv.blocks_cached_gpu", cached)},'
                    f'{_i("request.effective_prompt_len", pl[req] - cache_hit[req])}]}}')
        if sidl[k] % CLOSURE_INTERVAL == 0 and events:
            close(k)
    if start_k < n:
        close(n - 1)


def _export_lines(spans: list[tuple[int, int, str]]) -> list[str]:
    """Group spans ``(end_ns, kind, json)`` into collector export lines.

    ``kind``: 0 API span (scope ``vllm.api``), 1 core span (``vllm.scheduler``), 2 step span
    (``vllm.scheduler.step``).
    """
    spans.sort(key=lambda x: x[0])
    resource = f'{{"attributes":[{_s("service.name", SERVICE_NAME)}]}}'
    lines: list[str] = []
    i, n = 0, len(spans)
    while i < n:
        bucket = spans[i][0] // FLUSH_NS
        j = i
        while j < n and j - i < MAX_SPANS_PER_LINE and spans[j][0] // FLUSH_NS == bucket:
            j += 1
        api = [sp for _, proc, sp in spans[i:j] if proc == 0]
        core = [sp for _, proc, sp in spans[i:j] if proc == 1]
        step = [sp for _, proc, sp in spans[i:j] if proc == 2]
        rs = []
        if api:
            rs.append(f'{{"resource":{resource},"scopeSpans":[{{"scope":{{"name":"vllm.api"}},'
                      f'"spans":[{",".join(api)}]}}]}}')
        if core or step:
            scopes = []
            if core:
                scopes.append(f'{{"scope":{{"name":"vllm.scheduler"}},"spans":[{",".join(core)}]}}')
            if step:
                scopes.append(f'{{"scope":{{"name":"vllm.scheduler.step"}},"spans":[{",".join(step)}]}}')
            rs.append(f'{{"resource":{resource},"scopeSpans":[{",".join(scopes)}]}}')
        lines.append(f'{{"resourceSpans":[{",".join(rs)}]}}')
        i = j
    return lines


def write_traces(path: Path, engine: EngineResult, prompt_len: np.ndarray, max_tokens: np.ndarray,
                 times: RequestTimes, ids: RequestIds, model_name: str,
                 rng: np.random.Generator) -> int:
    """Write ``traces.jsonl``; returns the number of lines."""
    spans: list[tuple[int, int, str]] = []
    _request_spans(engine, prompt_len, max_tokens, times, ids, model_name, spans)
    _step_spans(engine, ids, prompt_len, rng, spans)
    lines = _export_lines(spans)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
        f.write("\n")
    return len(lines)


# ----------------------------------------------------------------------------- lifecycle metrics
def _dist(x: np.ndarray) -> dict[str, float] | None:
    x = np.asarray(x, dtype=float)
    if x.size == 0:
        return None
    out = {"mean": float(x.mean()), "min": float(x.min())}
    q = np.percentile(x, [p for _, p in PERCENTILES])
    out.update({k: float(v) for (k, _), v in zip(PERCENTILES, q, strict=True)})
    out["max"] = float(x.max())
    return {k: out[k] for k in ("mean", "min", *(k for k, _ in PERCENTILES), "max")}


def _weighted_dist(values: np.ndarray, weights: np.ndarray) -> dict[str, float] | None:
    keep = weights > 0
    v, w = np.asarray(values, dtype=float)[keep], np.asarray(weights, dtype=float)[keep]
    if v.size == 0:
        return None
    o = np.argsort(v, kind="stable")
    v, w = v[o], w[o]
    cw = np.cumsum(w)
    tot = cw[-1]
    out = {"mean": float((v * w).sum() / tot), "min": float(v[0])}
    for k, p in PERCENTILES:
        idx = int(np.searchsorted(cw, p / 100.0 * tot, side="left"))
        out[k] = float(v[min(idx, v.size - 1)])
    out["max"] = float(v[-1])
    return {k: out[k] for k in ("mean", "min", *(k for k, _ in PERCENTILES), "max")}


def lifecycle_metrics(engine: EngineResult, times: RequestTimes, prompt_len: np.ndarray,
                      max_tokens: np.ndarray, stage: np.ndarray, schedule_delay_s: np.ndarray,
                      stage_rates: list[float]) -> dict[str, dict[str, Any]]:
    """inference-perf ``summary`` and ``stage_<N>`` lifecycle metrics (spec section 8).

    Returns
    -------
    dict
        ``{"summary": {...}, "stage_0": {...}, ...}``.
    """
    send = times.arrived_ns / 1e9
    ttft = (times.client_first_token_ns - times.arrived_ns) / 1e9
    e2e = (times.client_end_ns - times.arrived_ns) / 1e9
    out_len = max_tokens.astype(float)
    tpot = np.where(out_len > 1, (e2e - ttft) / np.maximum(out_len - 1, 1), 0.0)
    ntpot = e2e / out_len
    it_s = engine.steps["iteration_ns"].to_numpy() / 1e9
    n_steps = it_s.size
    ft = engine.requests["first_token_step"]
    fin = engine.requests["finished_step"]

    def block(sel: np.ndarray, k: int | None) -> dict[str, Any]:
        cnt = int(sel.sum())
        # decode gaps: request decodes once per step from first_token_step + 1 to finished_step
        diff = np.zeros(n_steps + 2)
        np.add.at(diff, ft[sel] + 1, 1.0)
        np.add.at(diff, fin[sel] + 1, -1.0)
        w = np.cumsum(diff)[1:n_steps + 1]
        start = float(send[sel].min()) if cnt else 0.0
        end = float((times.client_end_ns[sel] / 1e9).max()) if cnt else 0.0
        dur = max(end - start, 1e-9)
        load: dict[str, Any] = {"count": cnt, "schedule_delay": _dist(schedule_delay_s[sel])}
        if k is not None:
            sd = float(send[sel].max() - send[sel].min()) if cnt > 1 else 0.0
            load.update({"send_duration": sd, "requested_rate": float(stage_rates[k]),
                         "achieved_rate": float(cnt / sd) if sd > 0 else 0.0})
        return {
            "load_summary": load,
            "successes": {
                "count": cnt,
                "latency": {
                    "request_latency": _dist(e2e[sel]),
                    "normalized_time_per_output_token": _dist(ntpot[sel]),
                    "time_per_output_token": _dist(tpot[sel]),
                    "time_to_first_token": _dist(ttft[sel]),
                    "inter_token_latency": _weighted_dist(it_s, w),
                },
                "throughput": {
                    "input_tokens_per_sec": float(prompt_len[sel].sum() / dur),
                    "output_tokens_per_sec": float(max_tokens[sel].sum() / dur),
                    "total_tokens_per_sec": float((prompt_len[sel].sum() + max_tokens[sel].sum()) / dur),
                    "requests_per_sec": float(cnt / dur),
                },
                "prompt_len": _dist(prompt_len[sel]),
                "output_len": _dist(max_tokens[sel]),
            },
            "failures": {"count": 0, "request_latency": None, "prompt_len": None},
        }

    res = {"summary": block(np.ones(len(send), dtype=bool), None)}
    for k in range(len(stage_rates)):
        res[f"stage_{k}"] = block(stage == k, k)
    return res


# ----------------------------------------------------------------------------- folder
def _yaml_dump(path: Path, doc: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(doc, f, sort_keys=False, default_flow_style=False)


def write_engine_tables(folder: Path, engine: EngineResult, ids: RequestIds) -> None:
    """``engine_batches.parquet`` (per-step truth) and ``engine_chunks.parquet`` (prefill chunks)."""
    bt = engine.batch_table()
    bt.to_parquet(folder / "engine_batches.parquet", index=False)
    ch = engine.chunks.copy()
    ch.insert(2, "request_id", [ids.engine_id[i] for i in ch["req"].tolist()])
    ch.to_parquet(folder / "engine_chunks.parquet", index=False)


def write_experiment(folder: Path, *, serving: dict[str, Any], profile: dict[str, Any],
                     truth: dict[str, Any], engine: EngineResult, times: RequestTimes,
                     ids: RequestIds, prompt_len: np.ndarray, max_tokens: np.ndarray,
                     stage: np.ndarray, schedule_delay_s: np.ndarray, stage_rates: list[float],
                     model_name: str, rng: np.random.Generator) -> dict[str, int]:
    """Write one experiment folder.

    Returns
    -------
    dict
        Counts: ``lines`` of traces.jsonl, ``steps``, ``requests``, ``sampled_steps``.
    """
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results").mkdir(exist_ok=True)
    _yaml_dump(folder / "serving.yaml", serving)
    _yaml_dump(folder / "profile.yaml", profile)
    _yaml_dump(folder / "truth.yaml", truth)
    n_lines = write_traces(folder / "traces.jsonl", engine, prompt_len, max_tokens, times, ids,
                           model_name, rng)
    metrics = lifecycle_metrics(engine, times, prompt_len, max_tokens, stage, schedule_delay_s,
                                stage_rates)
    for name, doc in metrics.items():
        fn = "summary_lifecycle_metrics.json" if name == "summary" else f"{name}_lifecycle_metrics.json"
        with open(folder / "results" / fn, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2)
    write_engine_tables(folder, engine, ids)
    return {"lines": n_lines, "steps": engine.n_steps, "requests": int(len(prompt_len)),
            "sampled_steps": int(engine.steps["sampled"].sum())}


def frame_of_events(engine: EngineResult, ids: RequestIds) -> pd.DataFrame:
    """The engine's journey events as a frame (``request_id, event, step, ts_monotonic_ns, ...``)."""
    ev = engine.events
    return pd.DataFrame({
        "request_id": [ids.engine_id[i] for i in ev["req"].tolist()],
        "event": [_EVENT_TYPE[c] for c in ev["code"].tolist()],
        "schedule_kind": ["FIRST" if c == EV_SCHED_FIRST else "RESUME" if c == EV_SCHED_RESUME else None
                          for c in ev["code"].tolist()],
        "step": ev["step"], "ts_monotonic_ns": ev["ts_ns"], "prefill_done": ev["prefill_done"],
        "decode_done": ev["decode_done"], "num_preemptions": ev["num_preemptions"],
    })


__all__ = ["CLOSURE_INTERVAL", "EPOCH_OFFSET_NS", "RequestIds", "RequestTimes", "frame_of_events",
           "lifecycle_metrics", "make_ids", "write_engine_tables", "write_experiment",
           "write_traces"]
