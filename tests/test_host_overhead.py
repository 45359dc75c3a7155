"""Host CPU overhead of the engine loop (:mod:`bayes_latency.checks.host_overhead`)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from bayes_latency.checks.host_overhead import (
    CPU_FACTOR,
    HOST_CPU_SHARE,
    host_bound_mask,
    host_overhead,
    host_overhead_notes,
    ingest_notes,
)


def _iterations(eid: str, n: int, contended_from: int | None, seed: int = 0) -> pd.DataFrame:
    """Steps whose iteration time and schedule() CPU time are linear in the batch, with a host
    overhead (5 ms of CPU, 3 ms more iteration, 3x the scatter) from step ``contended_from``."""
    rng = np.random.default_rng(seed)
    step = np.arange(n)
    batch = np.where(step < n // 2, rng.integers(20, 40, n), rng.integers(60, 120, n))
    cpu = 200.0 + 3.0 * batch
    gap = (15_000.0 + 30.0 * batch) * np.exp(rng.normal(0, 0.01, n))
    if contended_from is not None:
        hot = step >= contended_from
        cpu = np.where(hot, cpu + 5_000.0, cpu)
        gap = np.where(hot, (gap + 3_000.0) * np.exp(rng.normal(0, 0.02, n)), gap)
    return pd.DataFrame({"experiment_id": eid, "step_id": step, "iteration_us": gap,
                         "schedule_cpu_us": cpu * np.exp(rng.normal(0, 0.05, n)),
                         "num_prefill_reqs": np.zeros(n), "num_decode_reqs": batch.astype(float)})


def test_engine_cost_linear_in_the_batch_is_not_host_bound():
    # schedule() CPU time that grows with the batch (the engine's own per-request cost) is
    # not contention, even where the batch triples
    t = host_overhead(_iterations("quiet", 400, None))
    assert t["n_host_bound"].iloc[0] == 0
    assert host_overhead_notes(t) == []


def test_contended_steps_are_found_and_reported_with_numbers():
    it = pd.concat([_iterations("quiet", 300, None, seed=1),
                    _iterations("busy", 400, contended_from=250, seed=2)], ignore_index=True)
    t = host_overhead(it).set_index("experiment_id")
    busy = t.loc["busy"]
    assert busy["n_host_bound"] == 150 and busy["first_host_bound_step"] == 250
    assert busy["host_bound_fraction"] == pytest.approx(150 / 400)
    assert busy["cpu_ms_median_host_bound"] > CPU_FACTOR * busy["cpu_ms_expected_host_bound"]
    assert busy["log_mad_host_bound"] > 1.5 * busy["log_mad_quiet"]
    assert t.loc["quiet", "n_host_bound"] == 0
    notes = host_overhead_notes(t.reset_index())
    assert len(notes) == 1 and notes[0].startswith("busy: 150 of 400 steps (38%, from step 250)")
    assert "BLIS" in notes[0]


def test_small_excess_is_not_host_bound():
    # 3x the CPU time but an excess far below HOST_CPU_SHARE of the iteration: not reported
    it = _iterations("tiny", 200, None)
    it.loc[150:, "schedule_cpu_us"] *= 4
    it["iteration_us"] *= 100
    t = host_overhead(it)
    assert (it["schedule_cpu_us"] * 4 < HOST_CPU_SHARE * it["iteration_us"]).all()
    assert t["n_host_bound"].iloc[0] == 0


def test_unusable_rows_and_tables():
    it = _iterations("busy", 100, contended_from=50)
    it.loc[:9, "schedule_cpu_us"] = np.nan
    it.loc[10:14, "iteration_us"] = -1.0
    t = host_overhead(it)
    assert t["n_steps"].iloc[0] == 85
    # too few steps, missing column, empty table: an empty frame with the columns
    assert host_overhead(it.head(10)).empty
    no_cpu = host_overhead(it.drop(columns="schedule_cpu_us"))
    assert no_cpu.empty and "host_bound_fraction" in no_cpu.columns
    assert host_overhead_notes(no_cpu) == []
    with pytest.raises(ValueError, match="share"):
        host_overhead(it, share=1.5)


def test_real_h100_runs_are_host_bound_in_their_20_rps_stage(real_dir):
    from bayes_latency.study.realdata import load_real_data

    t = host_overhead(load_real_data(real_dir).iterations)
    assert len(t) == 2
    # both general runs: a third or more of the steps, 5+ ms of schedule() against < 1 expected
    assert (t["host_bound_fraction"] > 0.25).all()
    assert (t["cpu_ms_median_host_bound"] > 4).all()
    assert (t["cpu_ms_expected_host_bound"] < 1).all()
    assert (t["log_mad_host_bound"] > t["log_mad_quiet"]).all()
    assert len(host_overhead_notes(t)) == 2



def test_host_bound_mask_is_aligned_with_the_rows():
    busy = _iterations("busy", 300, contended_from=200, seed=3)
    it = pd.concat([_iterations("quiet", 100, None), busy.iloc[::-1]], ignore_index=True)
    it.loc[0, "iteration_us"] = np.nan
    mask = host_bound_mask(it)
    assert mask.shape == (400,) and not mask[:100].any()
    assert np.array_equal(mask[100:], (busy["step_id"] >= 200).to_numpy()[::-1])
    # a table without schedule() times, or an experiment of too few steps: nothing flagged
    assert not host_bound_mask(it.drop(columns="schedule_cpu_us")).any()
    assert not host_bound_mask(busy.tail(15)).any()


def test_ingest_reports_host_bound_steps(tiny_fleet_seed5, tmp_path):
    """``ingest`` notes host-bound steps from the iterations it has just built (one note per
    experiment, ``host CPU: ...``), and none on the clean synthetic traces."""
    import re
    import shutil

    from bayes_latency.data.experiment import ingest

    name = "llama-2-7b-h100-tp1-general"
    exp = tmp_path / name
    shutil.copytree(tiny_fleet_seed5 / name, exp)
    trace = exp / "traces.jsonl"
    text = trace.read_text()
    pat = re.compile(r'("key":"step\.duration_us","value":\{"intValue":")(\d+)(")')
    n = len(pat.findall(text))
    assert n > 2 * 20
    seen = iter(range(n))

    def busy(m: re.Match) -> str:  # the second half of the steps: +8 ms of schedule() CPU time
        return m.group(1) + str(int(m.group(2)) + (8000 if next(seen) >= n // 2 else 0)) + m.group(3)

    trace.write_text(pat.sub(busy, text))
    busy_notes = ingest([exp], tmp_path / "busy", iteration_notes=ingest_notes).notes
    notes = [x for x in busy_notes if x.startswith("host CPU:")]
    assert len(notes) == 1 and name in notes[0] and "steps" in notes[0]
    clean = ingest([tiny_fleet_seed5 / name], tmp_path / "clean", iteration_notes=ingest_notes).notes
    assert not [x for x in clean if x.startswith("host CPU:")]
