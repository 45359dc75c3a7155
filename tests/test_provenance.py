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


def test_regime_blis_refits_a_kept_calibration_of_other_stages(tmp_path, monkeypatch):
    """``benchmarks/regime_blis.py`` reuses a kept calibration only for the same rows and client
    stages: after the stages change (e.g. the output lengths they replay), it refits."""
    import types

    import pandas as pd

    import bayes_latency.calibrate.loop as loop
    import bayes_latency.model.estimator as est
    import bayes_latency.study.client.runs as runs

    rb = load_benchmark("regime_blis")
    calls: list[int] = []

    class Fake:
        report = types.SimpleNamespace(dropped={})

        def convergence(self):
            return {"passed": True, "max_rhat": 1.0, "min_ess_bulk": 500.0, "divergences": 0}

        def save(self, path):
            path.write_text("fit")

    def calibrated_fit(obs, stages, *a, **k):
        calls.append(len(stages))
        return types.SimpleNamespace(model=Fake(), converged=True, replays={})

    monkeypatch.setattr(runs, "calibrated_fit", calibrated_fit)
    monkeypatch.setattr(loop, "client_predictions", lambda *a, **k: pd.DataFrame({"x": [1]}))
    monkeypatch.setattr(est.LatencyModel, "load", classmethod(lambda cls, p: Fake()))
    data = types.SimpleNamespace(observations=pd.DataFrame({"value_us": [1.0, 2.0]}))
    quiet = dict(log=lambda *_: None)
    *_, kept = rb.calibrate_model("additive", data, ["stage A"], tmp_path, **quiet)
    assert not kept and calls == [1]
    *_, kept = rb.calibrate_model("additive", data, ["stage A"], tmp_path, **quiet)
    assert kept and calls == [1]                      # same rows and stages: reused
    *_, kept = rb.calibrate_model("additive", data, ["stage A'"], tmp_path, **quiet)
    assert not kept and calls == [1, 1]               # other stages: refitted
