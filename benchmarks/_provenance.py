"""The code a benchmark measured: package version, model version and a hash of the sources.

A report names the code it ran as, e.g.,
``package 0.1.0, model version 11, source sha256 0e03ffd72b33``: the installed package's
version, :data:`bayes_latency.MODEL_VERSION` and the first 12 hex digits of a sha256 over the
bytes of every ``bayes_latency/**/*.py`` and ``priors/*.yaml`` file, in sorted path order. The
hash identifies the code exactly, including edits not yet committed, without asking version
control. :func:`record_machine` keeps the machine a long run measured on (CPU model, cores, load
at its start and end) in its work folder, and :func:`machine_line` words it for the report.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def source_sha256(root: Path = ROOT) -> str:
    """First 12 hex digits of the sha256 of the package's Python sources and prior files."""
    h = hashlib.sha256()
    for f in sorted([*root.glob("bayes_latency/**/*.py"), *root.glob("priors/*.yaml")]):
        h.update(f.read_bytes())
    return h.hexdigest()[:12]


def fit_key(rows: object, *parts: str, root: Path = ROOT) -> str:
    """A key of a cached fit: the sha256 of the sources and priors (:func:`source_sha256`), the
    rows' values (``pandas.util.hash_pandas_object``) and ``parts`` (settings, evidence). A
    benchmark reuses a fit of its work folder only under the same key: a fit of another fleet,
    prior or code is refitted, not reported as this one."""
    import pandas as pd

    h = hashlib.sha256(source_sha256(root).encode())
    h.update(pd.util.hash_pandas_object(rows, index=False).to_numpy().tobytes())
    for p in parts:
        h.update(p.encode())
    return h.hexdigest()[:16]


def kept_fit_info(info_path: Path, key: str, *kept: Path) -> dict | None:
    """The record of a fit kept in a work folder (``info_path``, JSON holding ``key``) when it
    and the files ``kept`` exist and it was made under ``key`` (:func:`fit_key`), else None
    (refit)."""
    if not (info_path.exists() and all(p.exists() for p in kept)):
        return None
    info = json.loads(info_path.read_text())
    return info if info.get("key") == key else None


def code_provenance(root: Path = ROOT) -> str:
    """``package VERSION, model version N, source sha256 HEX`` for the code under ``root``."""
    from bayes_latency import MODEL_VERSION, __version__

    return f"package {__version__}, model version {MODEL_VERSION}, source sha256 {source_sha256(root)}"


def machine() -> dict:
    """The machine a run measured on: CPU model, cores, 1-minute load average now, and the code
    (:func:`code_provenance`)."""
    import os

    from bayes_latency.study.machine import cpu_model, load_average

    return {"cpu": cpu_model(), "cores": os.cpu_count(), "load": round(load_average(), 1),
            "code": code_provenance()}


def record_machine(work: Path, when: str) -> None:
    """Add :func:`machine` at ``when`` (``start``, ``end`` or another step of the run) to
    ``work/machine.json``."""
    f = work / "machine.json"
    m = json.loads(f.read_text()) if f.exists() else {}
    m[when] = machine()
    f.write_text(json.dumps(m, indent=1))


def machine_line(work: Path) -> str:
    """The report's line on the machine and the code of the run (empty without a record): the
    loads read, the code at the start and any other code later steps ran on."""
    f = work / "machine.json"
    if not f.exists():
        return ""
    m = json.loads(f.read_text())
    first = m.get("start") or next(iter(m.values()))
    loads = [v["load"] for v in m.values() if isinstance(v, dict) and "load" in v]
    codes = list(dict.fromkeys(v["code"] for v in m.values() if isinstance(v, dict) and "code" in v))
    code = first["code"] + "".join(f"; later parts on {c}" for c in codes if c != first["code"])
    return (f"Measured on {first['cpu']}, {first['cores']} cores, 1-minute load average "
            f"{min(loads)}-{max(loads)} (read during the run; the cores are shared with other "
            f"jobs); code: {code}.")
