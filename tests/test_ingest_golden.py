"""Ingest gives the same tables as the reference implementation.

The fast ingest paths (typed msgspec decoding, numpy table building, one-shot observation
frames) must not change a value, dtype or column order. For the tiny fleet of seed 5,
``tests/golden/ingest_tiny5.json`` holds a fingerprint of every trace file, every table's columns,
dtypes, row count and a SHA-256 of its non-float columns, and every report ingest writes;
``tests/golden/ingest_tiny5_floats.npz`` holds the values of every float column. Non-float
columns and the reports' structure, integers and strings are compared exactly; floats (columns and
report numbers) with ``rtol = 1e-9``, since their last bits depend on how numpy vectorises on the
CPU. When the simulator changes the traces, the fingerprints of the inputs no longer match and the
test skips with a message; regenerate with ``python tests/test_ingest_golden.py --write`` from a
checkout whose ingest is the reference.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

GOLDEN = Path(__file__).resolve().parent / "golden" / "ingest_tiny5.json"
FLOATS = GOLDEN.with_name("ingest_tiny5_floats.npz")
RTOL = 1e-9


def _float_columns(df: pd.DataFrame) -> list[str]:
    return [str(c) for c in df.columns if df[c].dtype.kind == "f"]


def _table_print(df: pd.DataFrame) -> dict[str, Any]:
    """Columns, dtypes, rows and a hash of every non-float value (floats: :func:`_floats`)."""
    fl = set(_float_columns(df))
    exact = df[[c for c in df.columns if str(c) not in fl]]
    h = pd.util.hash_pandas_object(exact, index=False).to_numpy() if len(exact.columns) else []
    return {"columns": list(map(str, df.columns)), "dtypes": [str(t) for t in df.dtypes],
            "rows": len(df), "sha256": hashlib.sha256(bytes(memoryview(h))).hexdigest()
            if len(h) else ""}


def _floats(name: str, df: pd.DataFrame) -> dict[str, np.ndarray]:
    return {f"{name}/{c}": df[c].to_numpy() for c in _float_columns(df)}


def _assert_close(got: Any, want: Any, where: str) -> None:
    """Nested JSON values equal: floats within ``RTOL``, everything else exactly."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), where
        for k in want:
            _assert_close(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _assert_close(g, w, f"{where}[{i}]")
    elif isinstance(want, float) and not isinstance(got, bool) and isinstance(got, int | float):
        assert got == pytest.approx(want, rel=RTOL, nan_ok=True), where
    else:
        assert got == want, where


def fingerprint(fleet: Path, out: Path) -> dict[str, Any]:
    """Ingest every experiment folder of ``fleet`` into ``out`` and fingerprint the result
    (``floats``: the values of every float column, by ``table/column``)."""
    from bayes_latency.data.experiment import ingest
    from bayes_latency.data.tables import read_table, table_names

    folders = sorted(p for p in fleet.iterdir() if p.is_dir())
    inputs = {p.name: hashlib.sha256((p / "traces.jsonl").read_bytes()).hexdigest()
              for p in folders}
    ingest(folders, out, scheduler="inline")
    tables, floats = {}, {}
    for name in sorted(table_names(out)):
        df = read_table(out, name)
        tables[name] = _table_print(df)
        floats.update(_floats(name, df))
    reports = {}
    for name in ("ingest_report.json", "reconstruction_report.json"):
        text = (out / name).read_text().replace(str(out), "OUT").replace(str(fleet), "FLEET")
        reports[name] = json.loads(text)
    return {"inputs": inputs, "tables": tables, "reports": reports, "floats": floats}


@pytest.mark.cpu_sensitive
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
    with np.load(FLOATS) as f:
        want = {k: f[k] for k in f.files}
    assert got["floats"].keys() == want.keys()
    for k, v in want.items():
        np.testing.assert_allclose(got["floats"][k], v, rtol=RTOL, atol=0, err_msg=k)
    _assert_close(got["reports"], golden["reports"], "reports")


if __name__ == "__main__" and "--write" in sys.argv:
    import tempfile

    from bayes_latency.synth.fleet import simulate_fleet

    with tempfile.TemporaryDirectory() as tmp:
        fleet = Path(tmp) / "fleet"
        simulate_fleet("tiny", fleet, seed=5, progress=False)
        res = fingerprint(fleet, Path(tmp) / "tables")
    np.savez_compressed(FLOATS, **res.pop("floats"))
    GOLDEN.write_text(json.dumps(res, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN} and {FLOATS}")
