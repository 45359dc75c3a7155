"""Streaming JSON Lines input shared by the trace readers (OTLP traces, ``kv_events.jsonl``)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bayes_latency.data.report import IngestReport
from bayes_latency.errors import TraceFormatError


def iter_json_lines(path: Path, report: IngestReport) -> Iterator[tuple[int, Any]]:
    """Yield ``(line number, parsed value)`` of a JSON Lines file, plain or ``.gz``.

    Blank lines and lines read are counted in ``report.read``; a line that is not JSON is a
    counted drop (``malformed_json``, with the first examples as ``file:line`` notes). Memory stays
    flat: one line at a time.

    Raises
    ------
    TraceFormatError
        When the file cannot be opened or read (missing, a folder, a broken gzip stream).
    """
    path = Path(path)
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as fh:
            for lineno, raw in enumerate(fh, start=1):
                if not raw.strip():
                    report.read["blank_lines"] += 1
                    continue
                report.read["lines"] += 1
                try:
                    doc = json.loads(raw)
                except (ValueError, RecursionError):
                    report.drop_at("malformed_json", f"{path}:{lineno}")
                    continue
                yield lineno, doc
    except (OSError, EOFError) as exc:
        raise TraceFormatError(f"cannot read file: {exc}", file=str(path)) from exc
