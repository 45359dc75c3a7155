"""Helpers that copy a synthetic experiment folder and damage one thing in it (tests only)."""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BASE_EXPERIMENT = "mixtral-8x7b-h100-tp2-codegen-pc"
"""The smallest experiment of ``simulate --fleet tiny --seed 5`` (19 trace lines)."""


def copy_exp(fleet: Path, dst: Path, name: str = BASE_EXPERIMENT) -> Path:
    """Copy experiment ``name`` of ``fleet`` to ``dst/name`` and return the copy."""
    out = dst / name
    # the simulator's own tables and truth are not inputs of ingest: not copied (faster)
    shutil.copytree(fleet / name, out, ignore=shutil.ignore_patterns("engine_*", "truth.yaml"))
    return out


def load_docs(exp: Path) -> list[dict]:
    with open(exp / "traces.jsonl", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def save_docs(exp: Path, docs: list[Any], raw_lines: list[str] | None = None) -> None:
    lines = [json.dumps(d) for d in docs] + list(raw_lines or [])
    (exp / "traces.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def spans(docs: list[dict], scope: str) -> Iterator[dict]:
    """Spans of ``scope`` (``vllm.api``, ``vllm.scheduler``, ``vllm.scheduler.step``)."""
    for d in docs:
        for rs in d.get("resourceSpans", []):
            for ss in rs.get("scopeSpans", []):
                if ss.get("scope", {}).get("name") == scope:
                    yield from ss.get("spans", [])


def scope_list(docs: list[dict], scope: str) -> list:
    """The ``spans`` list of the first scopeSpans of ``scope`` (to append spans to)."""
    for d in docs:
        for rs in d.get("resourceSpans", []):
            for ss in rs.get("scopeSpans", []):
                if ss.get("scope", {}).get("name") == scope:
                    return ss["spans"]
    raise KeyError(scope)


def attr(attrs: list[dict], key: str) -> dict:
    """The ``value`` dict of attribute ``key``."""
    for kv in attrs:
        if kv["key"] == key:
            return kv["value"]
    raise KeyError(key)


def set_attr(attrs: list[dict], key: str, value: dict) -> None:
    for kv in attrs:
        if kv["key"] == key:
            kv["value"] = value
            return
    attrs.append({"key": key, "value": value})


def core_event(span: dict, event: str, nth: int = 0) -> dict:
    """The ``nth`` ``journey.<event>`` of an ``llm_core`` span."""
    evs = [e for e in span["events"] if e["name"] == f"journey.{event}"]
    return evs[nth]


def step_summaries(docs: list[dict]) -> list[dict]:
    return [e for sp in spans(docs, "vllm.scheduler.step") for e in sp["events"]
            if e["name"] == "step.BATCH_SUMMARY"]


def request_id(span: dict) -> str:
    return attr(span["attributes"], "gen_ai.request.id")["stringValue"]


def clone(obj: Any) -> Any:
    return copy.deepcopy(obj)


def tree_hash(*paths: Path) -> dict[str, str]:
    """SHA-256 of every file below ``paths`` (to prove inputs are never changed)."""
    out = {}
    for root in paths:
        root = Path(root)
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for f in files:
            out[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out
