"""The machine record of the reports: what PyTensor's compile cache holds."""

from __future__ import annotations

import pytensor.link.numba.cache as pt_cache

from bayes_latency.study.machine import compile_cache_state, machine_line


def test_compile_cache_state_says_empty_then_counts_compiled_functions(tmp_path, monkeypatch):
    monkeypatch.setattr(pt_cache, "NUMBA_CACHE_PATH", tmp_path / "numba")
    assert compile_cache_state().startswith("empty")  # no folder yet
    (tmp_path / "numba").mkdir()
    assert compile_cache_state().startswith("empty")
    for name in ("a-1.py312.nbi", "b-2.py312.nbi", "b-2.py312.1.nbc"):
        (tmp_path / "numba" / name).write_bytes(b"")
    assert compile_cache_state() == "2 compiled functions"


def test_machine_line_names_cores_and_both_loads():
    line = machine_line(1.25, 2.5)
    assert "cores" in line and "1.2 at the start" in line and "2.5 at the end" in line
