"""Tests of the kv_events.jsonl reader (bayes_latency.data.kvevents)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from bayes_latency.data.kvevents import KV_EVENT_COLUMNS, read_kv_events
from bayes_latency.data.report import IngestReport
from bayes_latency.errors import TraceFormatError

# the spec's example line (section 7), verbatim
SPEC_LINE = ('[1771361000.0422,[["BlockStored",[8164721311958862131],null,[1,450,4086,29901,13,'
             '13,1678,29871,29896,29900,29889,29892,306,626,263,1243],16,null,"GPU",null]],0,null]')

BIG = 2**64 - 5  # uint64 hash beyond int64


def _lines() -> list[str]:
    batches = [
        [1771361000.5, [["BlockStored", [BIG, 12], 77, list(range(32)), 16, None, "GPU", None],
                        ["BlockStored", ["q83v", "AAAA"], None, [], 16, None, "CPU", None],
                        ["BlockRemoved", [BIG], "GPU"],
                        ["AllBlocksCleared"]], 0, None],
        [1771361001.0, [["TransferInitiated", (1 << 32) | 5, "cmpl-a-0-aaaaaaaa", "GPU", "CPU",
                         4, 120],
                        ["TransferInitiated", (1 << 32) | 5, "cmpl-a-0-aaaaaaaa", "GPU", "CPU",
                         4, 120],
                        ["TransferCompleted", (1 << 32) | 5, "cmpl-a-0-aaaaaaaa", "GPU", "CPU",
                         4, True, 121],
                        ["CacheStoreCommitted", "cmpl-a-0-aaaaaaaa", "CPU", 4, 121],
                        ["CacheLoadCommitted", "cmpl-b-0-bbbbbbbb", "CPU", 2, 130],
                        ["CacheEviction", "CPU", 3, "lru", 131, None],
                        ["CacheEviction", "GPU", 1, "lru", 132, [1, 2, 3]]], 1, 5],
        [1771361002.0, [["RemoteTransferInitiated", 9, "cmpl-c", "nixl", 0, 1, 8],
                        ["RemoteTransferCompleted", 9, "cmpl-c", "nixl", 0, 1, 8, False],
                        ["TransferCompleted", (1 << 32) | 5, "cmpl-a-0-aaaaaaaa", "GPU", "CPU",
                         4, True, 121]], 0, None],
    ]
    return [json.dumps(b) for b in batches]


def _write(tmp_path: Path, lines: list[str], name: str = "kv_events.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


def test_spec_example_line(tmp_path: Path) -> None:
    df = read_kv_events(_write(tmp_path, [SPEC_LINE]))
    assert list(df.columns) == list(KV_EVENT_COLUMNS)
    assert len(df) == 1
    r = df.iloc[0]
    assert r["event"] == "BlockStored" and r["medium"] == "GPU"
    assert r["n_hashes"] == 1 and r["block_count"] == 1 and r["n_token_ids"] == 16
    assert r["block_size"] == 16 and not r["has_parent"]
    assert r["dp_rank"] == 0 and pd.isna(r["batch_step"])
    assert r["ts"] == pytest.approx(1771361000.0422)


def test_all_tags_and_transfer_dedupe(tmp_path: Path) -> None:
    rep = IngestReport()
    df = read_kv_events(_write(tmp_path, _lines()), report=rep)
    assert df["event"].tolist() == [
        "BlockStored", "BlockStored", "BlockRemoved", "AllBlocksCleared",
        "TransferInitiated", "TransferCompleted", "CacheStoreCommitted", "CacheLoadCommitted",
        "CacheEviction", "CacheEviction", "RemoteTransferInitiated", "RemoteTransferCompleted"]
    assert rep.dropped["duplicate_transfer"] == 2
    assert rep.read["events"] == 14 and rep.kept["kv_events"] == 12
    bs = df.iloc[0]
    assert bs["n_hashes"] == 2 and bs["has_parent"] and bs["n_token_ids"] == 32
    assert df.iloc[1]["medium"] == "CPU" and df.iloc[1]["n_hashes"] == 2
    ti = df[df["event"] == "TransferInitiated"].iloc[0]
    assert ti["transfer_id"] == (1 << 32) | 5 and ti["src"] == "GPU" and ti["dst"] == "CPU"
    assert ti["block_count"] == 4 and ti["step"] == 120 and ti["batch_step"] == 5
    assert ti["dp_rank"] == 1
    tc = df[df["event"] == "TransferCompleted"].iloc[0]
    assert tc["success"] is True or bool(tc["success"]) is True
    ev = df[df["event"] == "CacheEviction"]
    assert ev["n_evicted"].tolist() == [3, 1] and ev["reason"].tolist() == ["lru", "lru"]
    assert ev["n_hashes"].isna().tolist() == [True, False]
    rc = df[df["event"] == "RemoteTransferCompleted"].iloc[0]
    assert rc["connector"] == "nixl" and rc["dst_rank"] == 1 and not rc["success"]
    assert df["line"].tolist()[-1] == 3
    assert str(df["step"].dtype) == "Int64" and str(df["success"].dtype) == "boolean"


def test_malformed_lines_and_events_counted(tmp_path: Path) -> None:
    lines = _lines() + [
        "not json", '{"a": 1}', "[1.0]", '["x", []]', "[1.0, [], 0, 1.5]",
        json.dumps([5.0, [["NewTag", 1], "notalist", [], ["BlockRemoved", "x", "GPU"],
                          ["TransferInitiated", None, "r"], ["CacheEviction", 5, 1],
                          ["BlockRemoved", [1], "GPU"]], 0, None]),
    ]
    rep = IngestReport()
    df = read_kv_events(_write(tmp_path, lines), report=rep)
    d = rep.dropped
    assert d["malformed_json"] == 1 and d["not_kv_batch"] == 2
    assert d["bad_field:ts"] == 1 and d["bad_field:scheduler_step"] == 1
    assert d["unknown_event"] == 1 and d["bad_field:event"] == 2
    assert d["bad_field:BlockRemoved.hashes"] == 1
    assert d["bad_field:TransferInitiated.transfer_id"] == 1
    assert d["bad_field:CacheEviction.medium"] == 1
    assert len(df) == 13
    assert any(n.startswith("malformed_json:") for n in rep.notes)


def test_unreadable_or_empty(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError):
        read_kv_events(tmp_path / "none.jsonl")
    with pytest.raises(TraceFormatError, match="junk.jsonl"):
        read_kv_events(_write(tmp_path, ["junk", "{}"], "junk.jsonl"))
