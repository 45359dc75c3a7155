"""The benchmarks' machine line: every load read during a run, and every code it ran on."""

from __future__ import annotations

import json

from benchmark_module import load_benchmark

prov = load_benchmark("_provenance")


def _record(load: float, code: str) -> dict:
    return {"cpu": "AMD EPYC", "cores": 2, "load": load, "code": code}


def test_a_resumed_run_names_its_load_range_and_each_code(tmp_path):
    (tmp_path / "machine.json").write_text(json.dumps({
        "start": _record(1.8, "code A"), "end": _record(2.9, "code A"),
        "resumed 2026-01-01 00:00": _record(0.6, "code B"),
        "in-sample end": _record(1.5, "code B")}))
    line = prov.machine_line(tmp_path)
    assert line == ("Measured on AMD EPYC, 2 cores, 1-minute load average 0.6-2.9 (read during "
                    "the run; the cores are shared with other jobs); code: code A; later parts "
                    "on code B.")


def test_one_code_is_named_once_and_no_record_gives_no_line(tmp_path):
    assert prov.machine_line(tmp_path) == ""
    (tmp_path / "machine.json").write_text(json.dumps({
        "start": _record(1.0, "code A"), "end": _record(1.2, "code A")}))
    assert prov.machine_line(tmp_path).endswith("load average 1.0-1.2 (read during the run; the "
                                                "cores are shared with other jobs); code: code A.")


def test_a_cached_fit_is_keyed_by_its_rows_settings_and_code(tmp_path):
    """``fit_key``: the same rows and settings give the same key; another row value, another
    setting or other code another one (a benchmark then refits instead of reusing)."""
    import pandas as pd

    rows = pd.DataFrame({"value_us": [1.0, 2.0], "kind": ["iteration", "iteration"]})
    (tmp_path / "bayes_latency").mkdir()
    (tmp_path / "bayes_latency" / "a.py").write_text("x = 1\n")
    key = prov.fit_key(rows, "draws 2000", root=tmp_path)
    assert key == prov.fit_key(rows.copy(), "draws 2000", root=tmp_path)
    assert key != prov.fit_key(rows.assign(value_us=[1.0, 2.5]), "draws 2000", root=tmp_path)
    assert key != prov.fit_key(rows, "draws 4000", root=tmp_path)
    (tmp_path / "bayes_latency" / "a.py").write_text("x = 2\n")
    assert key != prov.fit_key(rows, "draws 2000", root=tmp_path)
