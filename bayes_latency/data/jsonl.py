"""Streaming JSON Lines input shared by the trace readers (OTLP traces, ``kv_events.jsonl``).

Lines are decoded with msgspec (a C decoder to the same Python values: dict, list, str, int,
float, bool, None); a line msgspec refuses is decoded again with :func:`json.loads`, which decides
what is valid. msgspec refuses a superset of what ``json.loads`` refuses (it rejects ``NaN`` /
``Infinity``, out-of-range floats, lone surrogates, a BOM and UTF-16/32), and where both accept a
line they give equal values, so the result is that of ``json.loads`` on every line. Measured on the
demo fleet's traces (86 MB, 2-core machine with other jobs), MB per CPU-second of decoding alone:
94 with ``json.loads``, 133 with msgspec, 332 with msgspec into typed Structs (the ``typed``
argument of :func:`iter_json_lines`, used by the OTLP reader); ``benchmarks/ingest_scale.py``
reports these and the end-to-end ingest numbers.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from bayes_latency.data.report import IngestReport
from bayes_latency.errors import TraceFormatError

_decode = msgspec.json.Decoder().decode
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_SURROGATE = re.compile("[\ud800-\udfff]")
_REFUSED = object()


def _replace_lone_surrogates(doc: Any) -> tuple[Any, int]:
    """``doc`` with every lone surrogate in its strings (keys too) replaced by U+FFFD.

    JSON allows ``"\\ud800"`` escapes that decode to strings no UTF-8 writer (Parquet, Arrow)
    can encode; valid surrogate pairs were already combined by the decoder.
    """
    count = 0

    def fix(v: Any) -> Any:
        nonlocal count
        if isinstance(v, str):
            new, n = _SURROGATE.subn("\ufffd", v)
            count += n
            return new
        if isinstance(v, list):
            return [fix(x) for x in v]
        if isinstance(v, dict):
            return {fix(k): fix(x) for k, x in v.items()}
        return v

    return fix(doc), count


def iter_json_lines(path: Path, report: IngestReport,
                    typed: Callable[[bytes], Any] | None = None) -> Iterator[tuple[int, Any]]:
    """Yield ``(line number, parsed value)`` of a JSON Lines file, plain or ``.gz``.

    Blank lines and lines read are counted in ``report.read``; a line that is not JSON is a
    counted drop (``malformed_json``, with the first examples as ``file:line`` notes). Memory stays
    flat: one line at a time.

    ``typed``, when given, is a typed msgspec decoder (``msgspec.json.Decoder(T).decode``) tried
    first on every line without a ``\\u`` escape (it could hide a lone surrogate): a line it
    accepts is yielded as its typed value; a line it refuses (any error) is decoded as above.
    The caller tells the two apart by type, and must treat a typed value exactly as the generic
    one.

    Raises
    ------
    TraceFormatError
        When the file cannot be opened or read (missing, a folder, a broken gzip stream).
    """
    for first, _buf, lines in iter_line_chunks(path, 1 << 16):
        for lineno, raw in enumerate(lines, start=first):
            value = decode_line(raw, lineno, path, report, typed)
            if value is not SKIP:
                yield lineno, value


def iter_line_chunks(path: Path, size: int, split: bool = True
                     ) -> Iterator[tuple[int, bytes, list[bytes] | list[int]]]:
    """Yield ``(number of the first line, chunk, its lines)`` of a JSON Lines file (plain or
    ``.gz``): chunks of about ``size`` bytes of whole lines, and the lines without their
    ``\\n``; nothing is counted. With ``split=False`` the lines are not copied out of the
    chunk: the third item is the offset of each line in it (:func:`line_starts`).

    A plain file is read up to the size it had when opened: one that grows past it (a trace
    still being written) is refused, rather than followed for as long as its writer writes.

    Raises
    ------
    TraceFormatError
        When the file cannot be opened or read (missing, a folder, a broken gzip stream), or
        grew while being read.
    """
    path = Path(path)
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as fh:
            size0 = None if path.suffix == ".gz" else os.fstat(fh.fileno()).st_size
            first = 1
            while True:
                buf = fh.read(size)
                if not buf:
                    return
                if not buf.endswith(b"\n"):
                    buf += fh.readline()
                if size0 is not None and fh.tell() > size0:
                    raise TraceFormatError(
                        f"the file grew while being read (from {size0:,} bytes): it is still "
                        f"being written; ingest it once its writer has finished (or a copy)",
                        file=str(path))
                if split:
                    lines = buf.split(b"\n")
                    if buf.endswith(b"\n"):
                        lines.pop()
                else:
                    lines = line_starts(buf)
                yield first, buf, lines
                first += len(lines)
    except (OSError, EOFError) as exc:
        raise TraceFormatError(f"cannot read file: {exc}", file=str(path)) from exc


def line_starts(buf: bytes) -> list[int]:
    """Offset of each line of ``buf`` (the lines of ``buf.split(b"\\n")``, without the empty one
    after a final ``\\n``): one ``bytes.find`` (memchr) per line, where ``split`` copies every
    byte (demo fleet, 2,135 lines in 86 MB: 0.075 s against a few ms)."""
    starts = [0]
    find = buf.find
    i = find(b"\n")
    while i >= 0:
        starts.append(i + 1)
        i = find(b"\n", i + 1)
    if starts[-1] == len(buf):
        starts.pop()
    return starts


#: Returned by :func:`decode_line` for a blank or malformed line (counted).
SKIP = object()


def decode_line(raw: bytes, lineno: int, path: Path, report: IngestReport,
                typed: Callable[[bytes], Any] | None = None) -> Any:
    """One line of :func:`iter_json_lines`: its value (typed when ``typed`` accepts it), or
    :data:`SKIP` for a blank line or a malformed one (both counted in ``report``)."""
    if not raw.strip():
        report.read["blank_lines"] += 1
        return SKIP
    report.read["lines"] += 1
    if typed is not None and b"\\u" not in raw:
        try:
            value = typed(raw)
        except Exception:  # noqa: BLE001 - the generic path below decides
            value = _REFUSED
        if value is not _REFUSED:
            return value
    lenient = False
    try:
        doc = _decode(raw)
    except Exception:  # noqa: BLE001 - json.loads decides (same values, same errors)
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError):
            report.drop_at("malformed_json", f"{path}:{lineno}")
            return SKIP
        # json.loads decodes bytes with "surrogatepass": a surrogate encoded as raw bytes
        # (b"\xed\xa0\x80", invalid UTF-8) reaches its strings as a lone surrogate too
        lenient = True
    if lenient or (b"\\u" in raw and _SURROGATE_ESCAPE.search(raw)):
        try:
            doc, n = _replace_lone_surrogates(doc)
        except RecursionError:
            report.drop_at("malformed_json", f"{path}:{lineno}")
            return SKIP
        if n:
            report.kept["lone_surrogate_repaired"] += n
            if report.kept["lone_surrogate_repaired"] == n:
                report.notes.append(f"lone UTF-16 surrogates replaced by U+FFFD "
                                    f"(first at {path}:{lineno})")
    return doc
