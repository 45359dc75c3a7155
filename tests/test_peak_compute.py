"""Rows no GPU can have measured: faster than their compute at the datasheet peak. Dropped from
``fit``, counted and named in its report (saved with the posterior), and named by ``check``."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from bayes_latency.data.observations.table import (
    faster_than_peak_compute,
    peak_compute_note,
    without_faster_than_peak,
)


def _rows() -> pd.DataFrame:
    return pd.DataFrame({
        "obs_id": [f"e/{i}" for i in range(7)],
        "kind": ["iteration", "benchmark_mean", "scheduler_cpu", "alpha_arrival", "iteration",
                 "workload_e2e", "iteration"],
        "config_id": "m|H100-SXM|tp1",
        "value_us": [50.0, 900.0, 10.0, 10.0, 40.0, 500.0, np.nan],
        "x_prefill_compute": [100.0, 300.0, 100.0, 100.0, 0.0, 400.0, 100.0],
        "x_decode_compute": [0.0, 0.0, 0.0, 0.0, 0.0, 200.0, 0.0]})


def test_rows_faster_than_their_compute_are_found_lowest_ratio_first():
    got = faster_than_peak_compute(_rows())
    # e/0: 50 us for 100 us of compute; e/5: 500 us for 600; not the scheduler's CPU time (e/2),
    # a host overhead (e/3), a row without compute (e/4), a missing value (e/6) or e/1 (3x)
    assert got["obs_id"].tolist() == ["e/0", "e/5"]
    np.testing.assert_allclose(got["compute_floor_us"], [100.0, 600.0])
    np.testing.assert_allclose(got["ratio"], [0.5, 500 / 600], rtol=1e-12)
    assert list(got.columns) == ["obs_id", "kind", "config_id", "value_us", "compute_floor_us",
                                 "ratio"]


def test_a_table_without_compute_features_or_rows_has_none():
    assert faster_than_peak_compute(_rows().drop(columns=["x_prefill_compute",
                                                          "x_decode_compute"])).empty
    assert faster_than_peak_compute(_rows().iloc[:0]).empty
    one = faster_than_peak_compute(_rows().drop(columns=["x_decode_compute"]))
    assert one["obs_id"].tolist() == ["e/0"]  # e/5: 500 us against 400 of prefill alone


def test_the_note_names_the_worst_rows_and_counts_the_rest():
    assert peak_compute_note(faster_than_peak_compute(_rows().iloc[:0])) == ""
    many = pd.concat([_rows().iloc[[0]].assign(obs_id=f"e/{i}", value_us=10.0 + i)
                      for i in range(5)], ignore_index=True)
    note = peak_compute_note(faster_than_peak_compute(many))
    assert note.startswith("5 row(s) measured in less time than their compute takes")
    assert "e/0 (0.10x); e/1 (0.11x); e/2 (0.12x); 2 more." in note and "dropped from the fit" in note


def test_fit_drops_them_and_names_them_in_its_report(tiny_fleet_seed5, tmp_path):
    from bayes_latency.data.experiment import ingest
    from bayes_latency.data.tables import load_observations
    from bayes_latency.model.estimator import LatencyModel

    tables = tmp_path / "tables"
    ingest(sorted(p for p in tiny_fleet_seed5.iterdir() if p.is_dir()), tables)
    obs = load_observations(tables)
    assert faster_than_peak_compute(obs).empty  # the synthetic fleet is physical
    m = LatencyModel()
    m._prepare(obs)
    assert not any("less time than their compute" in n for n in m.report.notes)
    it = obs.index[(obs["kind"] == "iteration") & (obs["x_prefill_compute"] > 0)][0]
    obs.loc[it, "value_us"] = 0.25 * (obs.loc[it, "x_prefill_compute"]
                                      + obs.loc[it, "x_decode_compute"])
    m = LatencyModel()
    m._prepare(obs)
    notes = [n for n in m.report.notes if "less time than their compute" in n]
    assert len(notes) == 1 and f"{obs.loc[it, 'obs_id']} (0.25x)" in notes[0]
    assert "1 row(s)" in notes[0]
    assert m.report.dropped["faster than the GPU's peak compute"] == 1
    assert obs.loc[it, "obs_id"] not in set(m._prepare(obs)["obs_id"])
    # a saved fit's rows come back from the same table (load, attach_rows, study --resume)
    from bayes_latency.errors import ModelMismatchError
    from bayes_latency.model.posterior.persistence import checked_rows, rows_hash

    rows = m._prepare(obs)
    back = checked_rows(obs, m.coefs, rows_hash(rows, m.coefs))
    assert back["obs_id"].tolist() == rows["obs_id"].tolist()
    other = obs.copy()
    other.loc[other.index[(other["kind"] == "iteration")][-1], "value_us"] *= 1.5
    with pytest.raises(ModelMismatchError, match="not the rows the fit was made on"):
        checked_rows(other, m.coefs, rows_hash(rows, m.coefs))


@pytest.mark.parametrize("kind", ["scheduler_cpu", "alpha_departure"])
def test_cpu_time_kinds_are_not_held_to_the_gpu(kind):
    t = _rows().iloc[[0]].assign(kind=kind)
    assert faster_than_peak_compute(t).empty


def test_without_them_is_the_table_less_those_rows():
    kept, fast = without_faster_than_peak(_rows())
    assert fast["obs_id"].tolist() == ["e/0", "e/5"]
    assert kept["obs_id"].tolist() == ["e/1", "e/2", "e/3", "e/4", "e/6"]
    clean = _rows().iloc[[1, 2]]
    kept, fast = without_faster_than_peak(clean)
    assert kept is clean and fast.empty
