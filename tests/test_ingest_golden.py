"""Ingest gives the same tables, bit for bit, as the reference implementation (issue #17).

The fast ingest paths (typed msgspec decoding, numpy table building, one-shot observation
frames) must not change a single value, dtype or column order. ``tests/golden/ingest_tiny5.json``
holds, for the tiny fleet of seed 5, a fingerprint of every trace file and of every table and
report that ingest wrote before those paths existed (commit 9ab4453; regenerated on branch c15,
issue 15, when windows over steps with a guessed cached prefix stopped being observation rows:
only the observation table and the ingest report changed). When the simulator changes
the traces, the fingerprints of the inputs no longer match and the test skips with a message;
regenerate with ``python tests/test_ingest_golden.py --write`` from a checkout whose ingest is
the reference.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

GOLDEN = Path(__file__).resolve().parent / "golden" / "ingest_tiny5.json"


def _table_print(df: pd.DataFrame) -> dict[str, Any]:
    """Columns, dtypes, rows and a hash of every value (exact: floats by their bits)."""
    h = pd.util.hash_pandas_object(df, index=False).to_numpy() if len(df.columns) else []
    return {"columns": list(map(str, df.columns)), "dtypes": [str(t) for t in df.dtypes],
            "rows": len(df), "sha256": hashlib.sha256(bytes(memoryview(h))).hexdigest()
            if len(h) else ""}


def fingerprint(fleet: Path, out: Path) -> dict[str, Any]:
    """Ingest every experiment folder of ``fleet`` into ``out`` and fingerprint the result."""
    from bayes_latency.data.experiment import ingest
    from bayes_latency.data.tables import read_table, table_names

    folders = sorted(p for p in fleet.iterdir() if p.is_dir())
    inputs = {p.name: hashlib.sha256((p / "traces.jsonl").read_bytes()).hexdigest()
              for p in folders}
    ingest(folders, out, scheduler="inline")
    tables = {name: _table_print(read_table(out, name)) for name in sorted(table_names(out))}
    reports = {}
    for name in ("ingest_report.json", "reconstruction_report.json"):
        text = (out / name).read_text().replace(str(out), "OUT").replace(str(fleet), "FLEET")
        reports[name] = json.loads(text)
    return {"inputs": inputs, "tables": tables, "reports": reports}


def test_ingest_matches_reference(tiny_fleet_seed5: Path, tmp_path: Path) -> None:
    golden = json.loads(GOLDEN.read_text())
    inputs = {p.name: hashlib.sha256((p / "traces.jsonl").read_bytes()).hexdigest()
              for p in sorted(tiny_fleet_seed5.iterdir()) if p.is_dir()}
    if inputs != golden["inputs"]:
        pytest.skip("the simulator's tiny fleet changed: regenerate tests/golden/ingest_tiny5.json"
                    " (see the module docstring)")
    got = fingerprint(tiny_fleet_seed5, tmp_path / "tables")
    assert got["tables"].keys() == golden["tables"].keys()
    for name, ref in golden["tables"].items():
        assert got["tables"][name] == ref, name
    assert got["reports"] == golden["reports"]


if __name__ == "__main__" and "--write" in sys.argv:
    import tempfile

    from bayes_latency.synth.fleet import simulate_fleet

    with tempfile.TemporaryDirectory() as tmp:
        fleet = Path(tmp) / "fleet"
        simulate_fleet("tiny", fleet, seed=5, progress=False)
        res = fingerprint(fleet, Path(tmp) / "tables")
    GOLDEN.write_text(json.dumps(res, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
