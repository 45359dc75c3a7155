"""Ingest throughput of :func:`bayes_latency.data.otlp.read.read_otlp` on synthetic-but-valid traces.

The spec's example (one request: an API span, an engine span with 4 journey events, a step span
with 2 step summaries) is replicated N times with fresh trace / span / request ids, step numbers
and timestamps, so every copy is a distinct valid request. Spans are written in batches per line
like an OTel Collector does. The script times ``read_otlp`` and prints events per second; the
reader is single-threaded, so that is also events per second per core.

Usage::

    python benchmarks/ingest_throughput.py [--requests 20000] [--spans-per-line 30] [--repeat 1]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
from pathlib import Path

# this checkout's package, also when the installed one is another worktree's
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bayes_latency.data.otlp.read import read_otlp

SPEC = Path(__file__).resolve().parents[2] / "shared" / "specs" / "vllm-trace-format.example.jsonl"
STEPS_PER_REQUEST = 5  # step ids used by one copy of the example (40..44)


def _attr_set(attrs: list[dict], key: str, value: int | float | str) -> None:
    for a in attrs:
        if a["key"] == key:
            kind = next(iter(a["value"]))
            a["value"] = {kind: str(value) if kind == "intValue" else value}
            return


def _attr_get(attrs: list[dict], key: str):
    for a in attrs:
        if a["key"] == key:
            return next(iter(a["value"].values()))
    return None


def generate(path: Path, n_requests: int, spans_per_line: int = 30) -> int:
    """Write ``n_requests`` renumbered copies of the example to ``path``; return the line count."""
    docs = [json.loads(ln) for ln in SPEC.read_text().splitlines() if ln.strip()]
    scope = {d["resourceSpans"][0]["scopeSpans"][0]["scope"]["name"]: d for d in docs}
    api0 = scope["vllm.api"]["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    core0 = scope["vllm.scheduler"]["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    step0 = scope["vllm.scheduler.step"]["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    resource = scope["vllm.api"]["resourceSpans"][0]["resource"]
    pending: dict[str, list[str]] = {"vllm.api": [], "vllm.scheduler": [],
                                     "vllm.scheduler.step": []}
    n_lines = 0

    def flush(fh, name: str) -> None:
        nonlocal n_lines
        if pending[name]:
            fh.write('{"resourceSpans":[{"resource":' + json.dumps(resource)
                     + ',"scopeSpans":[{"scope":{"name":"' + name + '"},"spans":['
                     + ",".join(pending[name]) + "]}]}]}\n")
            pending[name].clear()
            n_lines += 1

    with open(path, "w") as fh:
        for i in range(n_requests):
            dt_ns = i * 50_000_000           # 50 ms between copies
            dstep = i * STEPS_PER_REQUEST
            trace = f"{i:032x}"
            api_id = f"cmpl-{i:016x}"
            api, core, step = copy.deepcopy(api0), copy.deepcopy(core0), copy.deepcopy(step0)
            api["traceId"], api["spanId"] = trace, f"{2 * i:016x}"
            _attr_set(api["attributes"], "gen_ai.request.id", api_id)
            for ev in api["events"]:
                t = _attr_get(ev["attributes"], "event.ts.monotonic")
                _attr_set(ev["attributes"], "event.ts.monotonic", t + dt_ns / 1e9)
            core["traceId"], core["spanId"] = trace, f"{2 * i + 1:016x}"
            core["parentSpanId"] = api["spanId"]
            _attr_set(core["attributes"], "gen_ai.request.id", f"{api_id}-0-{i % 2**32:08x}")
            for ev in core["events"]:
                a = ev["attributes"]
                _attr_set(a, "scheduler.step", int(_attr_get(a, "scheduler.step")) + dstep)
                _attr_set(a, "ts.monotonic_ns", int(_attr_get(a, "ts.monotonic_ns")) + dt_ns)
                _attr_set(a, "ts.monotonic", _attr_get(a, "ts.monotonic") + dt_ns / 1e9)
            step["traceId"], step["spanId"] = f"f{i:031x}", f"f{i:015x}"
            for ev in step["events"]:
                a = ev["attributes"]
                _attr_set(a, "step.id", int(_attr_get(a, "step.id")) + dstep)
                for k in ("step.ts_start_ns", "step.ts_end_ns"):
                    _attr_set(a, k, int(_attr_get(a, k)) + dt_ns)
            pending["vllm.api"].append(json.dumps(api))
            pending["vllm.scheduler"].append(json.dumps(core))
            pending["vllm.scheduler.step"].append(json.dumps(step))
            if len(pending["vllm.api"]) >= spans_per_line:
                for name in pending:
                    flush(fh, name)
        for name in pending:
            flush(fh, name)
    return n_lines


def main(argv: list[str] | None = None) -> int:
    """Generate a synthetic trace, time ``read_otlp`` on it and print the throughput."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--spans-per-line", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=1, help="timed reads (best one is reported)")
    args = ap.parse_args(argv)
    if not SPEC.exists():
        print(f"spec example not found: {SPEC}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "traces.jsonl"
        t0 = time.perf_counter()
        n_lines = generate(path, args.requests, args.spans_per_line)
        gen_s = time.perf_counter() - t0
        size_mb = os.path.getsize(path) / 1e6
        best = float("inf")
        tables = None
        for _ in range(max(1, args.repeat)):
            t0 = time.perf_counter()
            tables = read_otlp(path, experiment_id="bench")
            best = min(best, time.perf_counter() - t0)
    rep = tables.report
    n_events, n_spans = rep.read["events"], rep.read["spans"]
    assert len(tables.requests) == args.requests and rep.n_dropped == 0, rep.format()
    assert tables.requests["complete"].all()
    print(f"generated {args.requests:,} requests: {n_lines:,} lines, {n_spans:,} spans, "
          f"{n_events:,} events, {size_mb:.1f} MB in {gen_s:.1f} s")
    print(f"read_otlp: {best:.2f} s -> {n_events / best:,.0f} events/s per core, "
          f"{n_spans / best:,.0f} spans/s, {size_mb / best:.1f} MB/s "
          f"(1 core; tables: {len(tables.steps):,} steps, "
          f"{len(tables.journey_events):,} journey events, {len(tables.requests):,} requests)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
