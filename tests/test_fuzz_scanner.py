"""Fuzz target of the compiled byte scanner (``data/otlp/scan.py`` via ``data/otlp/chunks.py``).

Valid chunks of the spec's example lines are mutated at the byte level: byte flips, truncation,
inserted NUL / CR / control characters, a BOM at the start of any line, invalid UTF-8 inside an
ignored field, ``\\u`` escapes and lone surrogates, ``NaN`` / ``Infinity`` / ``1e999`` / ``+1``,
nesting 10,000 deep, numbers of hundreds of digits, repeated keys. On every chunk
:func:`~bayes_latency.data.otlp.chunks.read_chunk` must either refuse it (None: the line path
reads it) or give exactly the tables and report of the line path; it never raises, and every
example ends within the deadline. A hang (the kernel is compiled code that no Python signal
interrupts) ends the test process with a traceback (``faulthandler``) instead of blocking.
"""

from __future__ import annotations

import faulthandler
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_fuzz_readers import EXAMPLE, _assert_same_reading

import bayes_latency.data.otlp.chunks as oc
from bayes_latency.data.otlp.read import read_otlp
from bayes_latency.data.otlp.rows import _Acc
from bayes_latency.data.report import IngestReport
from bayes_latency.errors import TraceFormatError

SCANNER_FUZZ = settings(max_examples=300, deadline=2000, database=None, derandomize=True,
                        suppress_health_check=[HealthCheck.too_slow,
                                               HealthCheck.data_too_large])
#: Seconds after which a single reading counts as a hang.
HANG_SECONDS = 60

_BOM = b"\xef\xbb\xbf"
_DEEP = b"[" * 10_000 + b"]" * 10_000
# values put into fields (the reader's or ignored ones)
_VALUES = [
    b"NaN", b"-NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e999", b"+1", b"1e-999", b"-0",
    b"-0.0", b"01", b"1.", b".5", b"0x10", b"9" * 400, b"-" + b"9" * 400, b"1" + b"0" * 320 + b".5",
    b"1e400", b'"+1"', b'"1e999"', b'"NaN"', b'"9223372036854775808"', b'"-9223372036854775809"',
    b'"' + b"9" * 400 + b'"', b"null", b"true", b"[]", b"{}", b'"x"', _DEEP,
    b"[" * 300 + b"]" * 300, b"{" * 10_000, b'"\\u00e9"', b'"\\ud800"', b'"\\udc00\\ud800"',
    b'"\\ud83d\\ude00"', b'"\xff\xfe"', b'"\xc3\x28"', b'"\xed\xa0\x80"', b'"\xf4\x90\x80\x80"',
    b'"\x00"', b'"a\tb"', b'"\\x"',
    # values the scanner takes where the reader ignores them (and some where it reads them)
    b'"7"', b'"abc"', b"12", b"-3.5e2", b"0", b'""', b"false", b'[1,{"a":[]}]', b'{"k":"v"}',
    b'"\xc3\xa9"',
]
# bytes put into strings (the reader's or ignored ones)
_IN_STRING = [b"\\u00e9", b"\\ud800", b"\\udfff", b"\\ud800\\udc00", b"\\u0000", b"\\/", b"\\\"",
              b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x00", b"\x01", b"\x1f", b"\r", b"\x7f",
              _BOM, b"\xe2\x80\xa8"]
_CONTROL = [bytes([c]) for c in range(32)] + [b"\x7f", b"\r\n", b"\n", b"\n\n"]
_KEY = re.compile(rb'"([A-Za-z_.]+)":')
_NUMBER = re.compile(rb'[:,\[]\s*(-?[0-9][0-9.eE+-]*)')
_STRING = re.compile(rb':\s*"')


@pytest.fixture(scope="module")
def base_chunks(specs_dir: Path) -> list[bytes]:
    """The example's lines as one chunk: compact (the exporters' form) and json.dumps' spaced
    form. The scanner reads them once here, so compiling its kernels (tens of seconds with an
    empty Numba cache) never counts against an example's deadline."""
    docs = [json.loads(ln) for ln in (specs_dir / EXAMPLE).read_text().splitlines()
            if ln.strip()]
    chunks = [("\n".join(json.dumps(d, separators=sep) for d in docs) + "\n").encode()
              for sep in ((",", ":"), (", ", ": "))]
    for chunk in chunks:
        assert oc.read_chunk(chunk, chunk.count(b"\n")) is not None
    return chunks


@pytest.fixture(autouse=True)
def _hang_guard() -> Iterator[None]:
    faulthandler.dump_traceback_later(HANG_SECONDS, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def _ends(pattern: re.Pattern, buf: bytes) -> list[int]:
    return [m.end() for m in pattern.finditer(buf)] or [0]


@st.composite
def _mutation(draw: st.DrawFn, buf: bytes) -> bytes:
    """``buf`` with one byte-level mutation."""
    op = draw(st.sampled_from(["flip", "truncate", "control", "bom", "ignored field", "in string",
                               "value", "number", "duplicate key", "deep"]))
    event(op)
    n = len(buf)
    if not n:  # truncated to nothing
        return draw(st.sampled_from(_CONTROL))
    if op == "flip":
        i = draw(st.integers(0, n - 1))
        byte = draw(st.one_of(st.integers(0x20, 0x7e), st.integers(0, 255)))  # mostly ASCII
        return buf[:i] + bytes([byte]) + buf[i + 1:]
    if op == "truncate":
        return buf[:draw(st.integers(0, n - 1))]
    if op == "control":
        i = draw(st.integers(0, n))
        return buf[:i] + draw(st.sampled_from(_CONTROL)) + buf[i:]
    if op == "bom":
        starts = [0] + [m.end() for m in re.finditer(rb"\n", buf[:-1])]
        i = draw(st.sampled_from(starts))
        return buf[:i] + _BOM + buf[i:]
    if op == "ignored field":  # a new field in any object: ignored unless it shadows a used one
        name = draw(st.sampled_from([b"zz", b"note", b"kind", b"name", b"value"]))
        i = draw(st.sampled_from(_ends(re.compile(rb"\{"), buf)))
        return buf[:i] + b'"' + name + b'":' + draw(st.sampled_from(_VALUES)) + b"," + buf[i:]
    if op == "in string":
        i = draw(st.sampled_from(_ends(_STRING, buf)))
        i += draw(st.integers(0, 3))
        return buf[:i] + draw(st.sampled_from(_IN_STRING)) + buf[i:]
    if op == "value":  # any value of a field replaced
        i = draw(st.sampled_from(_ends(_KEY, buf)))
        i += len(buf[i:]) - len(buf[i:].lstrip(b" "))
        if buf[i:i + 1] in b"{[":
            return buf  # containers keep their value
        j = i
        while j < n and buf[j:j + 1] not in b",}]":
            j += 1
        return buf[:i] + draw(st.sampled_from(_VALUES)) + buf[j:]
    if op == "number":
        spans = [m.span(1) for m in _NUMBER.finditer(buf)]
        if not spans:
            return buf
        i, j = draw(st.sampled_from(spans))
        return buf[:i] + draw(st.sampled_from(_VALUES)) + buf[j:]
    if op == "duplicate key":
        ms = list(_KEY.finditer(buf))
        if not ms:
            return buf
        m = draw(st.sampled_from(ms))
        return buf[:m.start()] + m.group(0) + draw(st.sampled_from(_VALUES)) + b"," + \
            buf[m.start():]
    i = draw(st.integers(0, n))  # "deep": unbalanced or balanced nesting anywhere
    return buf[:i] + draw(st.sampled_from([_DEEP, b"[" * 10_000, b"{" * 300])) + buf[i:]


def _scanner_reading(path: Path, buf: bytes) -> Any:
    """What :func:`read_otlp` makes of ``buf`` read as one chunk by the scanner, or None when
    :func:`read_chunk` refuses it (the chunk loop's steps, without its checks for lines that
    do not start with ``{``, so that the scanner sees every chunk); None also for a chunk of
    blank lines."""
    lines = buf.split(b"\n")
    if buf.endswith(b"\n"):
        lines.pop()
    n_blank = sum(1 for ln in lines if not ln.strip())
    n = len(lines) - n_blank
    cols = oc.read_chunk(buf, n)
    if cols is None:
        return None
    if not n:  # blank lines only (the chunk loop reads them line by line)
        assert cols.read["spans"] == 0
        return None
    rep = IngestReport(source=str(path))
    acc = _Acc(str(path), rep)
    rep.read["lines"] += n
    if n_blank:
        rep.read["blank_lines"] += n_blank
    acc.add_chunk(cols)
    return acc.tables("fuzz")


def _line_reading(path: Path) -> Any:
    try:
        return read_otlp(path, experiment_id="fuzz", chunk_bytes=0)
    except TraceFormatError as exc:
        return str(exc)


def _check(path: Path, buf: bytes) -> bool:
    """The scanner refuses ``buf`` or reads it like the line path; so does :func:`read_otlp` in
    chunks. Returns whether the scanner took it."""
    path.write_bytes(buf)
    ref = _line_reading(path)
    got = _scanner_reading(path, buf)
    if got is not None:
        _assert_same_reading(got, ref)
    try:
        chunked = read_otlp(path, experiment_id="fuzz")
    except TraceFormatError as exc:
        chunked = str(exc)
    _assert_same_reading(chunked, ref)
    return got is not None


@SCANNER_FUZZ
@given(data=st.data())
def test_scanner_refuses_or_reads_like_the_line_path(base_chunks: list[bytes],
                                                     tmp_path_factory: pytest.TempPathFactory,
                                                     data: st.DataObject) -> None:
    buf = data.draw(st.sampled_from(base_chunks))
    for _ in range(data.draw(st.integers(1, 3))):
        buf = data.draw(_mutation(buf))
    took = _check(tmp_path_factory.mktemp("scan") / "traces.jsonl", buf)
    event("taken by the scanner" if took else "refused")


def test_unmutated_chunks_are_taken(base_chunks: list[bytes], tmp_path: Path) -> None:
    for k, buf in enumerate(base_chunks):
        assert _check(tmp_path / f"t{k}.jsonl", buf)


def _probe_deep(buf: bytes) -> bytes:
    """A skipped field nested 10,000 deep (the JSON decoders give up at about 1,000)."""
    return buf.replace(b'"kind":', b'"zz":' + _DEEP + b',"kind":', 1).replace(
        b'"kind": ', b'"zz": ' + _DEEP + b', "kind": ', 1)


def _probe_nul(buf: bytes) -> bytes:
    return buf.replace(b'"name":"', b'"name":"\x00', 1).replace(b'"name": "', b'"name": "\x00', 1)


def _probe_bom_line2(buf: bytes) -> bytes:
    i = buf.index(b"\n") + 1
    return buf[:i] + _BOM + buf[i:]


def _probe_bad_utf8(buf: bytes) -> bytes:
    """Invalid UTF-8 inside a field the reader ignores."""
    return buf.replace(b'"kind":', b'"zz":"\xff\xc3\x28","kind":', 1).replace(
        b'"kind": ', b'"zz": "\xff\xc3\x28", "kind": ', 1)


def _probe_truncated(buf: bytes) -> bytes:
    return buf[:-40]


@pytest.mark.parametrize("probe", [_probe_deep, _probe_nul, _probe_bom_line2, _probe_bad_utf8,
                                   _probe_truncated],
                         ids=["10k deep", "NUL", "BOM on line 2", "invalid UTF-8 ignored",
                              "truncated last line"])
def test_probes_are_refused_and_read_by_the_line_path(base_chunks: list[bytes], tmp_path: Path,
                                                      probe: Any) -> None:
    for k, buf in enumerate(base_chunks):
        bad = probe(buf)
        assert bad != buf
        assert not _check(tmp_path / f"t{k}.jsonl", bad)
