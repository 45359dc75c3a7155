"""Helpers that copy a synthetic experiment folder and damage one thing in it (tests only)."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import shutil
import signal
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


# ------------------------------------------------------------------------------------------------
# The partitioned table layout of ``ingest`` (``TABLES/<table>/experiment_id=<id>/part.parquet``
# and ``TABLES/tables.json``): damage that ``read_table`` must refuse with a named error
# ------------------------------------------------------------------------------------------------
def _parts(tables: Path, table: str) -> list[Path]:
    return sorted((tables / table).glob("experiment_id=*/part.parquet"))


def _manifest(tables: Path) -> dict:
    return json.loads((tables / "tables.json").read_text(encoding="utf-8"))


def _save_manifest(tables: Path, doc: Any) -> None:
    (tables / "tables.json").write_text(json.dumps(doc), encoding="utf-8")


def layout_missing_partition(tables: Path, table: str) -> None:
    """Delete the last partition of ``table`` (the manifest still lists it)."""
    shutil.rmtree(_parts(tables, table)[-1].parent)


def layout_extra_partition(tables: Path, table: str) -> None:
    """A copy of a partition under an experiment the manifest does not list."""
    src = _parts(tables, table)[0]
    dst = tables / table / "experiment_id=stray-run" / "part.parquet"
    dst.parent.mkdir(parents=True)
    shutil.copy(src, dst)


def layout_unlisted_partition(tables: Path, table: str) -> None:
    """The manifest lists an experiment, but not its partition of ``table``."""
    man = _manifest(tables)
    man["tables"][table] = man["tables"][table][:-1]
    _save_manifest(tables, man)


def layout_foreign_columns(tables: Path, table: str) -> None:
    """A partition written by another tool: its columns renamed."""
    import pandas as pd

    f = _parts(tables, table)[-1]
    df = pd.read_parquet(f)
    df.rename(columns={c: f"other_{c}" for c in df.columns[: max(1, len(df.columns) // 3)]}
              ).to_parquet(f, index=False)


def layout_corrupt_partition(tables: Path, table: str, content: bytes = b"PAR1garbage") -> None:
    """A partition file that is not Parquet (or truncated, with ``content=None``)."""
    f = _parts(tables, table)[-1]
    f.write_bytes(content if content is not None else f.read_bytes()[:100])


def layout_manifest_text(tables: Path, table: str, text: str) -> None:
    """``tables.json`` replaced by ``text`` (garbage, another shape)."""
    (tables / "tables.json").write_text(text, encoding="utf-8")


def layout_manifest_missing(tables: Path, table: str) -> None:
    (tables / "tables.json").unlink()


def layout_manifest_extra_experiment(tables: Path, table: str) -> None:
    """The manifest lists one more experiment with partitions that do not exist."""
    man = _manifest(tables)
    man["experiments"].append("ghost-run")
    man["tables"][table].append("ghost-run")
    _save_manifest(tables, man)


def layout_manifest_drops_table(tables: Path, table: str) -> None:
    man = _manifest(tables)
    man["tables"].pop(table)
    _save_manifest(tables, man)


def layout_concurrent_leftover(tables: Path, table: str) -> None:
    """What two ingests into one folder left before the lock: the partitions of both runs,
    a manifest of one."""
    for t in [p.name for p in tables.iterdir() if p.is_dir()]:
        layout_extra_partition(tables, t)


LAYOUT_MUTATIONS = {
    "missing_partition": layout_missing_partition,
    "extra_partition": layout_extra_partition,
    "unlisted_partition": layout_unlisted_partition,
    "foreign_columns": layout_foreign_columns,
    "corrupt_partition": layout_corrupt_partition,
    "truncated_partition": lambda t, n: layout_corrupt_partition(t, n, None),
    "empty_partition": lambda t, n: layout_corrupt_partition(t, n, b""),
    "manifest_garbage": lambda t, n: layout_manifest_text(t, n, "{not json"),
    "manifest_list": lambda t, n: layout_manifest_text(t, n, "[1, 2]"),
    "manifest_bad_shape": lambda t, n: layout_manifest_text(
        t, n, '{"experiments": "e1", "tables": []}'),
    "manifest_latin1": lambda t, n: (t / "tables.json").write_bytes(
        (t / "tables.json").read_bytes() + "\n\xe9".encode("latin-1")),
    "manifest_missing": layout_manifest_missing,
    "manifest_extra_experiment": layout_manifest_extra_experiment,
    "manifest_drops_table": layout_manifest_drops_table,
    "concurrent_leftover": layout_concurrent_leftover,
}
"""Name -> ``fn(tables_dir, table)``: every one must make reading ``table`` a named error."""


# ------------------------------------------------------------------------------------------------
# Classifying what a damaged input led to
# ------------------------------------------------------------------------------------------------
#: Outcome classes of a fuzz run. The first three are fine; the fuzz tests assert the last four
#: never happen.
OUTCOMES = ("clean_error", "counted_drop", "accepted", "traceback", "hang", "silent_loss",
            "wrong_accepted")
BAD_OUTCOMES = ("traceback", "hang", "silent_loss", "wrong_accepted")


class Hang(Exception):
    """Raised in the main thread when a run exceeds its time limit."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`Hang` in the block after ``seconds`` (SIGALRM; main thread, POSIX)."""
    def on_alarm(signum: int, frame: Any) -> None:
        raise Hang(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


class Sampled(Exception):
    """Raised instead of sampling (fuzz tests replace the sampler): the input passed validation."""


def one_line_error(err: str, names: tuple[str, ...]) -> str | None:
    """None when ``err`` is one ``bayes-latency: error:`` line naming one of ``names``."""
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    if len(lines) != 1 or not lines[0].startswith("bayes-latency: error:"):
        return f"not one error line: {err!r}"
    if names and not any(n in lines[0] for n in names):
        return f"error does not name any of {names}: {lines[0]!r}"
    return None
