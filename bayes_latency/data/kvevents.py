"""Reader of vLLM KV-cache events (``kv_events.jsonl``), spec section 7.

Each line is one msgspec-encoded batch ``[ts, events, data_parallel_rank, scheduler_step]``:
``ts`` epoch seconds, ``events`` a list of tagged arrays ``[Tag, ...]``, the rank an int and the
batch step an int or null (the fork never sets it; per-event ``step`` fields are used instead).

Event layouts (optional fields may be null or absent at the end):

=========================  ==========================================================================
``BlockStored``            hashes, parent, token_ids, block_size, lora_id, medium, lora_name
``BlockRemoved``           hashes, medium
``AllBlocksCleared``       (none)
``TransferInitiated``      transfer_id, request_id, src, dst, block_count, step
``TransferCompleted``      transfer_id, request_id, src, dst, block_count, success, step
``RemoteTransferInitiated`` transfer_id, request_id, connector, src_rank, dst_rank, block_count
``RemoteTransferCompleted`` transfer_id, request_id, connector, src_rank, dst_rank, block_count,
                           success
``CacheLoadCommitted``     request_id, medium, block_count, step (same for ``CacheStoreCommitted``)
``CacheEviction``          medium, n_evicted, reason, step, hashes
=========================  ==========================================================================

Hashes are only counted (``n_hashes``): they can be uint64 beyond int64 or base64 strings.
Transfer events (tags containing ``Transfer``) are deduplicated by ``(tag, transfer_id)`` (the fork
was seen to emit them twice), counted ``duplicate_transfer``.

Bad input: a line that is not JSON → ``malformed_json``; not a ``[ts, events, ...]`` array →
``not_kv_batch``; a batch field of the wrong type → ``bad_field:<name>``; an event that is not a
tagged array → ``bad_field:event``; an unknown tag → ``unknown_event``; an event field of the wrong
type or a required field missing → ``bad_field:<Tag>.<field>``. Up to five ``file:line`` examples
per line-level reason go to ``report.notes``. :class:`~bayes_latency.errors.TraceFormatError` is
raised only for a file that cannot be read or holds no valid line.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bayes_latency.data.jsonl import iter_json_lines
from bayes_latency.data.report import IngestReport
from bayes_latency.errors import TraceFormatError

__all__ = ["KV_EVENT_COLUMNS", "KV_EVENT_TAGS", "read_kv_events"]

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

#: Columns of the kv-events table.
KV_EVENT_COLUMNS: tuple[str, ...] = (
    "ts", "dp_rank", "batch_step", "line", "event", "request_id", "medium", "block_count",
    "n_hashes", "block_size", "n_token_ids", "has_parent", "lora_id", "transfer_id", "src", "dst",
    "connector", "src_rank", "dst_rank", "success", "step", "reason", "n_evicted",
)
_INT_COLS = ("dp_rank", "batch_step", "line", "block_count", "n_hashes", "block_size",
             "n_token_ids", "lora_id", "transfer_id", "src_rank", "dst_rank", "step", "n_evicted")
_BOOL_COLS = ("has_parent", "success")
_STR_COLS = ("event", "request_id", "medium", "src", "dst", "connector", "reason")

# field kinds
_I, _S, _B, _HASHES, _LIST, _ANY, _LOC = "int", "str", "bool", "hashes", "list", "any", "loc"
# tag -> ((field, kind, required), ...) in positional order after the tag
_LAYOUT: dict[str, tuple[tuple[str, str, bool], ...]] = {
    "BlockStored": (("hashes", _HASHES, True), ("parent", _ANY, False),
                    ("token_ids", _LIST, False), ("block_size", _I, False),
                    ("lora_id", _I, False), ("medium", _S, False), ("lora_name", _S, False)),
    "BlockRemoved": (("hashes", _HASHES, True), ("medium", _S, False)),
    "AllBlocksCleared": (),
    "TransferInitiated": (("transfer_id", _I, True), ("request_id", _S, False),
                          ("src", _LOC, False), ("dst", _LOC, False),
                          ("block_count", _I, False), ("step", _I, False)),
    "TransferCompleted": (("transfer_id", _I, True), ("request_id", _S, False),
                          ("src", _LOC, False), ("dst", _LOC, False),
                          ("block_count", _I, False), ("success", _B, False),
                          ("step", _I, False)),
    "RemoteTransferInitiated": (("transfer_id", _I, True), ("request_id", _S, False),
                                ("connector", _S, False), ("src_rank", _I, False),
                                ("dst_rank", _I, False), ("block_count", _I, False)),
    "RemoteTransferCompleted": (("transfer_id", _I, True), ("request_id", _S, False),
                                ("connector", _S, False), ("src_rank", _I, False),
                                ("dst_rank", _I, False), ("block_count", _I, False),
                                ("success", _B, False)),
    "CacheLoadCommitted": (("request_id", _S, False), ("medium", _S, False),
                           ("block_count", _I, False), ("step", _I, False)),
    "CacheStoreCommitted": (("request_id", _S, False), ("medium", _S, False),
                            ("block_count", _I, False), ("step", _I, False)),
    "CacheEviction": (("medium", _S, False), ("n_evicted", _I, False), ("reason", _S, False),
                      ("step", _I, False), ("hashes", _HASHES, False)),
}
#: Event tags understood by the reader.
KV_EVENT_TAGS: tuple[str, ...] = tuple(_LAYOUT)


class _Bad(Exception):
    """Internal: a field has the wrong type (``args[0]`` = field name)."""


def _int(v: Any) -> int | None:
    """An int in int64 range (ints, integral floats, digit strings), else None."""
    if type(v) is int:
        return v if _INT64_MIN <= v <= _INT64_MAX else None
    if type(v) is float and math.isfinite(v) and v.is_integer():
        return _int(int(v))
    if type(v) is str:
        try:
            return _int(int(v))
        except ValueError:
            return None
    return None


def _finite_float(v: Any) -> float | None:
    """A finite float from an int or float (not bool), else None."""
    if type(v) not in (int, float):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def _parse_event(ev: Any) -> dict[str, Any]:
    """Fields of one ``[Tag, ...]`` event (raises _Bad or KeyError for an unknown tag)."""
    if type(ev) is not list or not ev or type(ev[0]) is not str:
        raise _Bad("event")
    tag = ev[0]
    layout = _LAYOUT[tag]  # KeyError: unknown tag
    out: dict[str, Any] = {"event": tag}
    for k, (name, kind, required) in enumerate(layout, start=1):
        v = ev[k] if k < len(ev) else None
        if v is None:
            if required:
                raise _Bad(f"{tag}.{name}")
            continue
        if kind == _I:
            iv = _int(v)
            if iv is None or iv < 0:  # ids, counts and steps are never negative
                raise _Bad(f"{tag}.{name}")
            out[name] = iv
        elif kind == _S:
            if type(v) is not str:
                raise _Bad(f"{tag}.{name}")
            out[name] = v
        elif kind == _LOC:  # a medium name (or an int device id): stored as text
            if type(v) not in (str, int):
                raise _Bad(f"{tag}.{name}")
            out[name] = str(v)
        elif kind == _B:
            if type(v) is not bool:
                raise _Bad(f"{tag}.{name}")
            out[name] = v
        elif kind == _HASHES:
            if type(v) is not list:
                raise _Bad(f"{tag}.{name}")
            out["n_hashes"] = len(v)
        elif kind == _LIST:
            if type(v) is not list:
                raise _Bad(f"{tag}.{name}")
            out["n_token_ids"] = len(v)
        elif name == "parent":
            out["has_parent"] = True
    if tag == "BlockStored":
        out.setdefault("has_parent", False)
    if tag in ("BlockStored", "BlockRemoved"):
        out["block_count"] = out.get("n_hashes")
    return out


def read_kv_events(path: str | Path, report: IngestReport | None = None) -> pd.DataFrame:
    """Read a ``kv_events.jsonl`` file into one row per KV-cache event.

    Parameters
    ----------
    path
        ``kv_events.jsonl`` (optionally ``.gz``).
    report
        Report to add counts to (``read``: lines, batches, events; ``kept``: kv_events; drops
        by reason).

    Returns
    -------
    pandas.DataFrame
        :data:`KV_EVENT_COLUMNS`, in file order (``line`` = 1-based line number): ``ts`` (float,
        epoch s), ``dp_rank``, ``batch_step`` (nullable Int64), ``event`` (tag), ``request_id``,
        ``medium``, ``block_count`` (= number of hashes for BlockStored / BlockRemoved),
        ``n_hashes``, ``block_size``, ``n_token_ids``, ``has_parent`` (BlockStored),
        ``lora_id``, ``transfer_id``, ``src``, ``dst`` (text), ``connector``, ``src_rank``,
        ``dst_rank``, ``success`` (nullable boolean), ``step``, ``reason``, ``n_evicted``.
        Fields an event type does not have are null.

    Raises
    ------
    TraceFormatError
        If the file cannot be read or holds no valid line.
    """
    path = Path(path)
    report = report if report is not None else IngestReport(source=str(path))
    if not report.source:
        report.source = str(path)
    cols: dict[str, list] = {c: [] for c in KV_EVENT_COLUMNS}
    seen_transfers: set[tuple[str, int]] = set()
    n_valid = 0

    def line_drop(reason: str, lineno: int) -> None:
        report.drop_at(reason, f"{path}:{lineno}")

    for lineno, doc in iter_json_lines(path, report):
        if type(doc) is not list or len(doc) < 2 or type(doc[1]) is not list:
            line_drop("not_kv_batch", lineno)
            continue
        ts = _finite_float(doc[0])
        if ts is None or ts < 0:
            line_drop("bad_field:ts", lineno)
            continue
        rank = doc[2] if len(doc) > 2 else None
        bstep = doc[3] if len(doc) > 3 else None
        if rank is not None and (_int(rank) is None or _int(rank) < 0):
            line_drop("bad_field:data_parallel_rank", lineno)
            continue
        if bstep is not None and (_int(bstep) is None or _int(bstep) < 0):
            line_drop("bad_field:scheduler_step", lineno)
            continue
        n_valid += 1
        report.read["batches"] += 1
        for ev in doc[1]:
            report.read["events"] += 1
            try:
                fields = _parse_event(ev)
            except KeyError:
                report.drop("unknown_event")
                continue
            except _Bad as bad:
                report.drop(f"bad_field:{bad.args[0]}")
                continue
            tag = fields["event"]
            if "Transfer" in tag:
                key = (tag, fields["transfer_id"])
                if key in seen_transfers:
                    report.drop("duplicate_transfer")
                    continue
                seen_transfers.add(key)
            fields["ts"] = ts
            fields["dp_rank"] = None if rank is None else _int(rank)
            fields["batch_step"] = None if bstep is None else _int(bstep)
            fields["line"] = lineno
            for c in KV_EVENT_COLUMNS:
                cols[c].append(fields.get(c))
    if n_valid == 0:
        raise TraceFormatError("no valid kv-event batch line ([ts, events, rank, step])",
                               file=str(path))
    data: dict[str, Any] = {"ts": np.asarray(cols["ts"], dtype=float)}
    for c in KV_EVENT_COLUMNS[1:]:
        if c in _INT_COLS:
            data[c] = pd.array(cols[c], dtype="Int64")
        elif c in _BOOL_COLS:
            data[c] = pd.array(cols[c], dtype="boolean")
        else:
            data[c] = pd.Series(cols[c], dtype="object")
    df = pd.DataFrame(data)[list(KV_EVENT_COLUMNS)]
    report.kept["kv_events"] += len(df)
    return df
