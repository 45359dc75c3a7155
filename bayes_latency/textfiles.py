"""Reading the files the package takes as input: regular files only, UTF-8, and YAML with
bounded expansion.

Every input file (text or binary: Parquet partitions, posteriors, populations) is opened through
:func:`check_regular` or :func:`read_bytes`: a FIFO, a character or block device (``/dev/zero``,
``/dev/stdin`` of a pipe), a socket or a folder where a file is expected is refused with what it
is, before a byte is read (a FIFO is opened without blocking, so no reader waits for a writer
that never comes). A regular file is read up to the size it had when opened: one that grows
while being read (a log still being written) is refused rather than followed without end.

Every text input (serving YAML, priors, GPU datasheets, ``config.json``, client results) is read
with :func:`read_text`: UTF-8, a leading UTF-8 byte-order mark dropped, anything else refused
with the file and the offending byte named. Every YAML input is parsed with :func:`load_yaml`,
a safe loader that also refuses

- a mapping with the same key twice (YAML says keys are unique; PyYAML keeps the last), and
- a document whose aliases add more than :data:`MAX_ALIAS_NODES` nodes when expanded, or that
  refers to itself (an "alias bomb" of nine nested lists of nine aliases is 3.5 billion nodes:
  building the Python object is fast because aliases share it, but any walk over it never
  ends). A document without aliases is never refused for its size.

Both refusals are :class:`yaml.YAMLError` subclasses, so a caller's ``except yaml.YAMLError``
reports them as invalid YAML of its file.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError

from bayes_latency.errors import BayesLatencyError

__all__ = ["MAX_ALIAS_NODES", "NotRegularFileError", "TextEncodingError", "check_regular",
           "check_text_start", "file_kind", "load_yaml", "read_bytes", "read_text",
           "refuse_special"]

#: Most nodes (scalars, lists, mappings) the aliases of a YAML document may add when each use is
#: expanded. The YAML inputs of the package (serving configs, priors, GPU datasheets) use
#: aliases rarely, for a few small mappings.
MAX_ALIAS_NODES = 100_000

_MERGE_TAG = "tag:yaml.org,2002:merge"


class TextEncodingError(BayesLatencyError):
    """A text input that is not UTF-8."""


class NotRegularFileError(BayesLatencyError):
    """An input path that is not a regular file (a FIFO, a device, a socket, a folder)."""


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def file_kind(mode: int) -> str | None:
    """What a file of ``st_mode`` ``mode`` is (``"a FIFO (named pipe)"``), None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _refusal(path: str | Path, what: str, kind: str) -> str:
    todo = ("pass the file itself, not a folder" if kind == "a directory" else
            "pass a regular file (save a stream or a pipe's output to a file first)")
    return f"{path}: {what} is {kind}, not a regular file; {todo}"


def _unreadable(path: str | Path, what: str) -> str:
    return (f"{path}: {what} is not readable by this user (permission denied); make it readable "
            f"(chmod a+r) or pass a readable copy")


def check_regular(path: str | Path, what: str = "file",
                  error: type[BayesLatencyError] = NotRegularFileError) -> os.stat_result:
    """``os.stat(path)`` of a regular file; anything else refused with what it is.

    Symbolic links are followed; a loop of links is refused as such.

    Raises
    ------
    OSError
        When the file does not exist or cannot be read (the caller names it its own way).
    error
        When ``path`` is a FIFO, a device, a socket or a folder (``"... is a FIFO (named pipe),
        not a regular file"``), or a loop of symbolic links.
    """
    try:
        st = os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise error(f"{path}: {what} is a loop of symbolic links; point it at a regular "
                        f"file") from None
        raise
    kind = file_kind(st.st_mode)
    if kind is not None:
        raise error(_refusal(path, what, kind))
    return st


def refuse_special(path: str | Path, what: str = "file",
                   error: type[BayesLatencyError] = NotRegularFileError,
                   folders_ok: bool = True) -> None:
    """Refuse ``path`` when it exists and is not a regular file (nor a folder, when
    ``folders_ok``).

    For the inputs a command checks before its work: a missing path and a dangling symbolic
    link pass (the caller says "no such file" its own way).

    Raises
    ------
    error
        When ``path`` is a FIFO, a device, a socket, a loop of symbolic links, a path too long
        for the file system, or a folder where only a file will do.
    """
    try:
        os.stat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            text = str(path)
            raise error(f"{text[:60]}...: {what}: path of {len(text):,} characters, too long "
                        f"for the file system (a name over 255 bytes, or a path over 4096)"
                        ) from None
        if exc.errno not in (errno.ELOOP,):
            return
    if folders_ok and os.path.isdir(path):
        return
    try:
        check_regular(path, what, error)
    except FileNotFoundError:
        return


def read_bytes(path: str | Path, what: str = "file",
               error: type[BayesLatencyError] = NotRegularFileError) -> bytes:
    """The bytes of the regular file ``path``, as many as it held when opened.

    Raises
    ------
    OSError
        When the file does not exist or cannot be read (the caller names it its own way).
    error
        When ``path`` is not a regular file (see :func:`check_regular`), or grew while read.
    """
    check_regular(path, what, error)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except PermissionError:
        raise error(_unreadable(path, what)) from None
    try:
        st = os.fstat(fd)
        kind = file_kind(st.st_mode)
        if kind is not None:  # replaced between the stat and the open
            raise error(_refusal(path, what, kind))
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(st.st_size + 1)
    finally:
        os.close(fd)
    if len(data) > st.st_size:
        raise error(f"{path}: {what} grew while being read (from {st.st_size:,} bytes); read it "
                    f"once it is complete (copy it, or wait for its writer to finish)")
    return data


#: Leading bytes of encodings and compressed formats a text input is sometimes saved in.
_MAGIC = ((b"\x1f\x8b", "gzip-compressed; decompress it first (gunzip)"),
          (b"\x28\xb5\x2f\xfd", "zstd-compressed; decompress it first (unzstd)"),
          (b"BZh", "bzip2-compressed; decompress it first (bunzip2)"),
          (b"\xfd7zXZ\x00", "xz-compressed; decompress it first (unxz)"),
          (b"PK\x03\x04", "a zip archive; extract the file first (unzip)"),
          (b"\xff\xfe", "UTF-16 text (little-endian byte-order mark); save it as UTF-8"),
          (b"\xfe\xff", "UTF-16 text (big-endian byte-order mark); save it as UTF-8"))


def _packed_as(head: bytes, gzip_ok: bool = False) -> str | None:
    """What the leading bytes ``head`` say a text input was saved as (compressed, UTF-16), with
    what to do (:data:`_MAGIC`); None for anything else (gzip too when ``gzip_ok``)."""
    return next((kind for magic, kind in _MAGIC
                 if head.startswith(magic) and not (gzip_ok and magic == b"\x1f\x8b")), None)


def check_text_start(path: str | Path, what: str = "file",
                     error: type[BayesLatencyError] = TextEncodingError,
                     compressed_ok: bool = False) -> None:
    """Refuse a text input that is empty, compressed or UTF-16, from its first bytes only.

    For readers that stream a file (traces) or try several formats on it (client results),
    before they parse it: the refusal says what the file is and what to do, where a parser
    would report a syntax error. ``compressed_ok``: gzip is read by the caller (a ``.gz``
    name).

    Raises
    ------
    OSError
        When the file cannot be read (the caller names it its own way).
    error
        When ``path`` is not a regular file, is empty, or starts like a compressed file or
        UTF-16 text.
    """
    check_regular(path, what, error)
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
    except PermissionError:
        raise error(_unreadable(path, what)) from None
    if not head:
        raise error(f"{path}: {what} is empty (0 bytes)")
    kind = _packed_as(head, gzip_ok=compressed_ok)
    if kind is not None:
        raise error(f"{path}: {what} is {kind}")


def read_text(path: str | Path, what: str = "file",
              error: type[BayesLatencyError] = TextEncodingError) -> str:
    """The text of the regular file ``path`` as UTF-8 (a leading byte-order mark dropped).

    Parameters
    ----------
    path
        The file.
    what
        What the file is, for the message (``"serving config"``, ``"priors file"``).
    error
        The error class raised when the bytes are not UTF-8.

    Raises
    ------
    OSError
        When the file cannot be read (the caller names it its own way).
    error
        When the file is not a regular file (see :func:`check_regular`); when it is compressed
        or UTF-16 (naming the format and what to do); else naming the first byte that is not
        UTF-8.
    """
    data = read_bytes(path, what, error)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        kind = _packed_as(data[:8])
        if kind is not None:
            raise error(f"{path}: {what} is {kind}") from None
        raise error(f"{path}: {what} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                    f"{exc.start}); save it as UTF-8") from None


def _distinct_nodes(root: yaml.Node) -> int:
    """Nodes of the document, each counted once however many aliases refer to it."""
    seen: set[int] = set()
    todo = [root]
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            todo.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            todo.extend(n for pair in node.value for n in pair)
    return len(seen)


def _expanded_size(root: yaml.Node, limit: int) -> int:
    """Nodes of the document with every alias expanded, counting up to just past ``limit``.

    Raises
    ------
    ConstructorError
        When a collection contains itself.
    """
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise ConstructorError(None, None, "the document refers to itself (recursive alias)",
                                   node.start_mark)
        if isinstance(node, yaml.ScalarNode):
            return 1
        active.add(key)
        total = 1
        children = (node.value if isinstance(node, yaml.SequenceNode)
                    else [n for pair in node.value for n in pair])
        for child in children:
            total += size(child)
            if total > limit:
                break
        active.discard(key)
        sizes[key] = total
        return total

    return size(root)


class _Checks:
    """Loader mixin: expansion bound and duplicate keys (see the module docstring)."""

    def construct_document(self, node: yaml.Node) -> Any:
        distinct = _distinct_nodes(node)
        limit = distinct + MAX_ALIAS_NODES
        if _expanded_size(node, limit) > limit:
            raise ConstructorError(None, None, f"its aliases expand to more than "
                                   f"{MAX_ALIAS_NODES:,} nodes beyond the document's "
                                   f"{distinct:,} (an alias bomb?)", node.start_mark)
        return super().construct_document(node)  # type: ignore[misc]

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, yaml.Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
                    continue
                key = self.construct_object(key_node, deep=False)  # type: ignore[attr-defined]
                try:
                    dup = key in seen
                except TypeError:
                    continue
                if dup:
                    raise ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        f"found duplicate key {key!r} (first at line "
                        f"{seen[key].start_mark.line + 1})", key_node.start_mark)
                seen[key] = key_node
        return super().construct_mapping(node, deep=deep)  # type: ignore[misc]


class SafeLoader(_Checks, yaml.SafeLoader):
    """PyYAML's safe loader with the checks of this module."""


_CSafe = getattr(yaml, "CSafeLoader", None)
CSafeLoader = type("CSafeLoader", (_Checks, _CSafe), {}) if _CSafe is not None else None
_PLAIN = re.compile(r"[\t\n\r\x20-\x7e]*")


def load_yaml(text: str) -> Any:
    """``yaml.safe_load(text)`` with the checks of this module.

    Printable ASCII is parsed with libyaml when PyYAML has it (4x less CPU, same result); any
    other text, and any libyaml refuses, with PyYAML's own parser (its result and messages).

    Raises
    ------
    yaml.YAMLError
        Invalid YAML, a duplicate key or a document that expands too far (line and column given).
    """
    try:
        if CSafeLoader is not None and _PLAIN.fullmatch(text):
            try:
                return yaml.load(text, Loader=CSafeLoader)  # noqa: S506 - a safe loader
            except ConstructorError:
                raise
            except yaml.YAMLError:
                pass
        return yaml.load(text, Loader=SafeLoader)  # noqa: S506 - a safe loader
    except RecursionError:
        raise yaml.YAMLError("collections nested too deeply to read") from None
