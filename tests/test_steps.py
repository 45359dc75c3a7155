"""Tests of step tables and iteration times (bayes_latency.data.steps)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bayes_latency.data.otlp.read import STEP_COLUMNS, read_otlp
from bayes_latency.data.report import IngestReport
from bayes_latency.data.steps import (
    ITERATION_COLUMNS,
    iterations_from_steps,
    load_step_table,
)
from bayes_latency.errors import TraceFormatError


def _table(ids, starts, exp="e1", **over) -> pd.DataFrame:
    n = len(ids)
    d = {c: [0] * n for c in STEP_COLUMNS}
    d.update({"step.id": ids, "step.ts_start_ns": starts, "step.ts_end_ns": [s + 500_000
                                                                            for s in starts],
              "step.duration_us": [500] * n, "batch.num_prefill_reqs": [2] * n,
              "batch.prefill_tokens": [100] * n, "batch.num_decode_reqs": [10] * n,
              "batch.decode_tokens": [10] * n, "batch.scheduled_tokens": [110] * n,
              "kv.usage_gpu_ratio": [0.01] * n, "kv.blocks_total_gpu": [10_000] * n,
              "kv.blocks_free_gpu": [9_900] * n, "experiment_id": [exp] * n})
    d.update(over)
    return pd.DataFrame(d)


# ------------------------------------------------------------------------------------------
# the real step summaries
# ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_steps(real_dir: Path) -> pd.DataFrame:
    p = real_dir / "h100-steps" / "batch_summaries.parquet"
    if not p.exists():
        pytest.skip("batch_summaries.parquet absent")
    return load_step_table(p)


@pytest.mark.real
def test_real_step_table_loads(real_steps: pd.DataFrame) -> None:
    assert list(real_steps.columns[:17]) == list(STEP_COLUMNS) + ["experiment_id"]
    assert set(real_steps["experiment_id"]) == {
        "20260217-202857-llama-2-70b-tp4-general", "20260218-150304-codellama-34b-tp2-general"}
    assert len(real_steps) == 5_992 + 7_441
    assert str(real_steps["step.id"].dtype) == "Int64"


@pytest.mark.real
def test_real_iterations(real_steps: pd.DataFrame) -> None:
    rep = IngestReport()
    it = iterations_from_steps(real_steps, report=rep)
    assert list(it.columns) == list(ITERATION_COLUMNS)
    assert len(it) > 1_000
    per_exp = it.groupby("experiment_id")
    assert (per_exp.size() > 500).all() and per_exp.ngroups == 2
    med = per_exp["iteration_us"].median()
    assert ((med > 10_000) & (med < 30_000)).all()
    # schedule() CPU time is far below the iteration time
    assert (per_exp["schedule_cpu_us"].median() < 0.2 * med).all()
    assert it["ctx_approximated"].all()
    assert (it["decode_ctx_tokens"] >= it["num_decode_reqs"]).all()
    assert rep.kept["iterations"] == len(it)


# ------------------------------------------------------------------------------------------
# constructed tables
# ------------------------------------------------------------------------------------------
def test_iterations_pairs_within_experiment_only() -> None:
    a = _table([1, 2, 4, 5, 6], [0, 10_000_000, 40_000_000, 50_000_000, 65_000_000], "a")
    b = _table([7, 8], [100_000_000, 118_000_000], "b")
    it = iterations_from_steps(pd.concat([a, b]))
    assert it["experiment_id"].tolist() == ["a", "a", "a", "b"]
    assert it["step_id"].tolist() == [1, 4, 5, 7]
    assert it["iteration_us"].tolist() == [10_000.0, 10_000.0, 15_000.0, 18_000.0]
    assert it["schedule_cpu_us"].tolist() == [500.0] * 4


def test_iterations_batch_columns() -> None:
    it = iterations_from_steps(_table([1, 2], [0, 1_000_000]), block_size=16)
    r = it.iloc[0]
    assert r["num_prefill_reqs"] == 2 and r["prefill_tokens"] == 100
    assert r["prefill_kv_tokens"] == 100
    assert r["prefill_attn_pairs"] == pytest.approx(2 * 50 * 51 / 2)
    assert r["num_decode_reqs"] == 10 and r["decode_tokens"] == 10
    assert r["decode_ctx_tokens"] == pytest.approx(0.01 * 10_000 * 16 - 100)
    assert r["offload_tokens"] == 0 and r["ctx_approximated"]


def test_decode_ctx_clipped_and_ratio_fallback() -> None:
    t = _table([1, 2, 3], [0, 1_000, 2_000])
    t["kv.usage_gpu_ratio"] = [0.0, np.nan, 0.0]
    t["kv.blocks_free_gpu"] = [9_900, 9_000, 9_900]
    it = iterations_from_steps(t)
    assert it["decode_ctx_tokens"].tolist() == [10.0, 1_000 * 16 - 100]


def test_non_positive_gaps_dropped_and_counted() -> None:
    t = _table([1, 2, 3, 4], [0, 0, -5, 10])
    rep = IngestReport()
    it = iterations_from_steps(t, report=rep)
    assert it["step_id"].tolist() == [3]
    assert rep.dropped["non_positive_gap"] == 2


def test_otlp_steps_feed_iterations(specs_dir: Path) -> None:
    it = iterations_from_steps(read_otlp(specs_dir / "vllm-trace-format.example.jsonl").steps)
    assert it["step_id"].tolist() == [41]
    assert it["iteration_us"].iloc[0] == pytest.approx((20021420000000 - 20021381500000) / 1000)
    assert it["prefill_tokens"].iloc[0] == 2048


def test_load_csv_and_parquet_agree(tmp_path: Path) -> None:
    t = _table([3, 1, 2], [2_000, 0, 1_000])
    t.to_csv(tmp_path / "s.csv", index=False)
    t.to_parquet(tmp_path / "s.parquet")
    a = load_step_table(tmp_path / "s.csv")
    b = load_step_table(tmp_path / "s.parquet")
    pd.testing.assert_frame_equal(a, b)
    assert a["step.id"].tolist() == [1, 2, 3]


def test_load_validation_drops_are_counted(tmp_path: Path) -> None:
    t = _table([1, 2, 3, 4, 5, 5], [0, 1, 2, 3, 4, 4])
    t["step.ts_start_ns"] = t["step.ts_start_ns"].astype(float)
    t.loc[1, "step.ts_start_ns"] = np.nan
    t.loc[2, "step.duration_us"] = -3
    t["batch.decode_tokens"] = t["batch.decode_tokens"].astype(object)
    t.loc[3, "batch.decode_tokens"] = "lots"
    t = t.drop(columns=["experiment_id", "queue.waiting_depth"])
    t.to_csv(tmp_path / "exp-x.csv", index=False)
    rep = IngestReport()
    df = load_step_table(tmp_path / "exp-x.csv", report=rep)
    assert df["step.id"].tolist() == [1, 5]
    assert set(df["experiment_id"]) == {"exp-x"}
    assert df["queue.waiting_depth"].isna().all()
    assert rep.dropped["bad_value:step.ts_start_ns"] == 1
    assert rep.dropped["bad_value:step.duration_us"] == 1
    assert rep.dropped["bad_value:batch.decode_tokens"] == 1
    assert rep.dropped["duplicate_step"] == 1
    assert rep.read["rows"] == 6 and rep.kept["steps"] == 2


def test_missing_required_column_names_it(tmp_path: Path) -> None:
    _table([1], [0]).drop(columns=["batch.prefill_tokens"]).to_csv(tmp_path / "s.csv",
                                                                   index=False)
    with pytest.raises(TraceFormatError, match="batch.prefill_tokens") as ei:
        load_step_table(tmp_path / "s.csv")
    assert ei.value.field == "batch.prefill_tokens"


def test_unreadable_step_table(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError):
        load_step_table(tmp_path / "nope.parquet")
    (tmp_path / "x.txt").write_text("a")
    with pytest.raises(TraceFormatError):
        load_step_table(tmp_path / "x.txt")
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(TraceFormatError):
        load_step_table(tmp_path / "bad.parquet")


def test_summaries_over_the_serving_limits_are_dropped_and_counted():
    from bayes_latency.data.report import IngestReport
    from bayes_latency.data.steps import drop_over_serving_limits

    steps = pd.DataFrame({"step.id": [1, 2, 3, 4], "batch.num_prefill_reqs": [1, 0, 1, 0],
                          "batch.num_decode_reqs": [5, 100_000, 127, 3],
                          "batch.prefill_tokens": [100, 0, 1e9, 2046],
                          "batch.decode_tokens": [5, 100_000, 127, 3]})
    rep = IngestReport()
    rep.read["step_summaries"] = rep.kept["steps"] = 4
    kept = drop_over_serving_limits(steps, 128, 2048, rep, source="exp")
    assert list(kept["step.id"]) == [1]  # 2: 100,000 requests; 3: 1e9 tokens; 4: 2049 tokens
    assert rep.dropped == {"over_max_num_seqs": 1, "over_max_num_batched_tokens": 2}
    assert not rep.unbalanced()
    assert any("step 2" in n and "max_num_seqs = 128" in n for n in rep.notes)
    # a limit the user did not give is not checked
    rep2 = IngestReport()
    assert len(drop_over_serving_limits(steps, None, None, rep2)) == 4 and not rep2.dropped
