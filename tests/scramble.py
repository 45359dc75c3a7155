"""A copy of an experiment folder whose journey and step timestamps are randomised.

Used by the adequacy gate's tests and ``benchmarks/adequacy_gate.py``: the batches, token counts
and API events stay as they are, but every request's ``journey.*`` timestamps are replaced by
sorted uniform draws over the experiment's engine time range (their order within the request is
kept), and every step summary's ``step.ts_start_ns`` / ``step.ts_end_ns`` by a sorted pair of
uniform draws over the same range. No model of iteration times can explain such data.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np


def _events(doc: dict):
    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for sp in ss.get("spans", []):
                yield sp, sp.get("events", [])


def _attr(ev: dict, key: str) -> dict | None:
    return next((a for a in ev.get("attributes", []) if a["key"] == key), None)


def scramble_experiment(src: str | Path, dst: str | Path, seed: int = 0) -> Path:
    """Copy experiment folder ``src`` to ``dst`` with randomised journey and step timestamps."""
    src, dst = Path(src), Path(dst)
    shutil.copytree(src, dst, dirs_exist_ok=True)
    docs = [json.loads(line) for line in (src / "traces.jsonl").read_text().splitlines() if line]
    ts = [int(_attr(ev, "ts.monotonic_ns")["value"]["intValue"])
          for d in docs for _, evs in _events(d) for ev in evs
          if ev["name"].startswith("journey.") and _attr(ev, "ts.monotonic_ns")]
    lo, hi = min(ts), max(ts)
    rng = np.random.default_rng(seed)
    for d in docs:
        for _, evs in _events(d):
            journey = [ev for ev in evs if ev["name"].startswith("journey.")
                       and _attr(ev, "ts.monotonic_ns")]
            if journey:
                new = np.sort(rng.integers(lo, hi, size=len(journey)))
                for ev, t in zip(journey, new, strict=True):
                    _attr(ev, "ts.monotonic_ns")["value"]["intValue"] = str(int(t))
                    sec = _attr(ev, "ts.monotonic")
                    if sec is not None:
                        sec["value"]["doubleValue"] = float(t) / 1e9
            for ev in evs:
                if ev["name"] != "step.BATCH_SUMMARY":
                    continue
                a, b = _attr(ev, "step.ts_start_ns"), _attr(ev, "step.ts_end_ns")
                if a is None or b is None:
                    continue
                start, end = np.sort(rng.integers(lo, hi, size=2))
                a["value"]["intValue"], b["value"]["intValue"] = str(int(start)), str(int(end))
    (dst / "traces.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    return dst
