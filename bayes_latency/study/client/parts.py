"""What made each part of ``bayes-latency study client``: ``OUT/client/parts.json``.

Each part (the calibration, ``insample``, ``loro``, ``lomo``) may run in its own process
(``--parts``, ``--resume``); its record says which model and package version made its tables,
when, in what wall time and on what machine (:func:`part_record`). A reused table is shown only
when its record names this package's model version (:func:`current_part`); the README lists the
records (:func:`parts_lines`).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bayes_latency.io import atomic_write_text
from bayes_latency.study.machine import machine_line

__all__ = ["PARTS_FILE", "current_part", "part_record", "parts_lines", "read_parts",
           "write_part"]

#: Record of what made each part's tables (``OUT/client/parts.json``, :func:`part_record`).
PARTS_FILE = "parts.json"


def part_record(started: float, load_start: float, complete: bool,
                done: int | None = None) -> dict[str, Any]:
    """What made a part's tables: model and package version, when it finished, its wall time
    (s, from ``started``, a :func:`time.perf_counter` reading) and the machine (CPU model, cores,
    1-minute load average at the part's start and now); ``complete`` False while a part that
    writes its tables after each left-out run or model is still running (``done``: how many
    are in its tables)."""
    from bayes_latency import MODEL_VERSION, __version__

    rec: dict[str, Any] = {
        "model_version": MODEL_VERSION, "package": __version__,
        "finished_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "wall_s": round(time.perf_counter() - started, 1), "complete": bool(complete),
        "machine": machine_line(load_start)}
    if done is not None:
        rec["done"] = int(done)
    return rec


def read_parts(out: Path) -> dict[str, dict[str, Any]]:
    """The records of ``out/parts.json`` (empty when absent)."""
    f = Path(out) / PARTS_FILE
    return json.loads(f.read_text(encoding="utf-8")) if f.is_file() else {}


def write_part(out: Path, key: str, record: dict[str, Any]) -> None:
    """Set the record of part ``key`` in ``out/parts.json`` (atomically), keeping the others."""
    parts = read_parts(out)
    parts[key] = record
    atomic_write_text(Path(out) / PARTS_FILE, json.dumps(parts, indent=1, sort_keys=True) + "\n")


def current_part(record: dict[str, Any] | None) -> bool:
    """Whether a part's tables were made by this package's model version (False without a
    record: tables older than the record cannot be told apart)."""
    from bayes_latency import MODEL_VERSION

    return record is not None and str(record.get("model_version")) == MODEL_VERSION


def parts_lines(parts: dict[str, dict[str, Any]], stale: Sequence[str],
                order: Sequence[str]) -> list[str]:
    """The README's table of what made each part (the calibration, then ``order``), and the
    tables left out (``stale``)."""
    lines = []
    if parts:
        lines += ["## Parts", "", "What made each part's tables (`parts.json`).", "",
                  "| part | model version | package | finished (UTC) | wall time | complete | "
                  "machine |", "|---|---|---|---|---|---|---|"]
        for key in ("calibration", *order):
            r = parts.get(key)
            if r is None:
                continue
            done = "yes" if r.get("complete") else f"no ({r.get('done', 0)} left out so far)"
            lines.append(f"| {key} | {r.get('model_version')} | {r.get('package')} | "
                         f"{r.get('finished_utc')} | {float(r.get('wall_s', math.nan)) / 60:.1f} "
                         f"min | {done} | {r.get('machine')} |")
        lines.append("")
    if stale:
        from bayes_latency import MODEL_VERSION

        lines += [f"Tables left out, not made by model version {MODEL_VERSION} (rerun the part "
                  "with `--parts`): " + ", ".join(stale) + ".", ""]
    return lines
