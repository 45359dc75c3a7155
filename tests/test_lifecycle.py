"""Tests of the inference-perf results readers (bayes_latency.data.client.lifecycle)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bayes_latency.data.client.lifecycle import (
    LIFECYCLE_COLUMNS,
    read_exp_config,
    read_lifecycle_dir,
    read_profile,
)
from bayes_latency.errors import TraceFormatError

LIFECYCLE = Path(__file__).resolve().parents[2] / "shared" / "data" / "real" / "h100-lifecycle"
RUNS = sorted(p.name for p in LIFECYCLE.iterdir()) if LIFECYCLE.is_dir() else []


@pytest.mark.real
def test_sixteen_runs_present(real_dir: Path) -> None:
    assert len(RUNS) == 16


@pytest.mark.real
@pytest.mark.parametrize("run", RUNS or ["absent"])
def test_real_run(real_dir: Path, run: str) -> None:
    exp = real_dir / "h100-lifecycle" / run
    if not exp.is_dir():
        pytest.skip("run absent")
    df, rep = read_lifecycle_dir(exp)
    assert list(df.columns) == list(LIFECYCLE_COLUMNS)
    assert df["stage"].iloc[0] == "summary" and df["stage_index"].isna().iloc[0]
    n_stage_files = len(list((exp / "results").glob("stage_*_lifecycle_metrics.json")))
    assert len(df) == 1 + n_stage_files
    assert df["stage_index"].iloc[1:].tolist() == list(range(n_stage_files))
    assert (df["experiment_id"] == run).all()
    assert (df["count"] > 0).all() and (df["successes"] > 0).all()
    assert (df["failures"] >= 0).all()
    assert df["requested_rate"].iloc[1:].gt(0).all()
    for m in ("ttft", "e2e", "tpot", "itl", "ntpot"):
        assert (df[f"{m}_mean_s"] > 0).all(), m
        assert (df[f"{m}_p99_s"] >= df[f"{m}_median_s"]).all(), m
    assert (df["e2e_mean_s"] > df["ttft_mean_s"]).all()
    assert rep.kept["lifecycle_rows"] == len(df) and rep.n_dropped == 0

    cfg = read_exp_config(exp / "exp-config.yaml")
    assert df["tp"].iloc[0] == cfg["tp"] and df["model"].iloc[0] == cfg["model"]
    assert cfg["max_num_batched_tokens"] == 2048
    prof = read_profile(exp / "profile.yaml")
    assert prof["output_len"] > 0 and prof["num_groups"] > 0 and prof["users_per_group"] > 0
    assert len(prof["stages"]) == n_stage_files
    assert all(rate > 0 and dur > 0 for rate, dur in prof["stages"])
    rates = df["requested_rate"].iloc[1:].tolist()
    assert rates == pytest.approx([r for r, _ in prof["stages"]])

    if "reasoning" in run:
        assert df["decode_interval_s"].notna().all()
    else:
        assert df["decode_interval_s"].between(0.005, 0.200).all(), df["decode_interval_s"]
        # the per-token fields are about half the real decode interval in these runs
        ratio = df["decode_interval_s"] / df["tpot_mean_s"]
        assert ratio.between(1.3, 3.0).all(), ratio


def _write_run(tmp_path: Path, summary: object, stages: dict[int, object]) -> Path:
    res = tmp_path / "run-x" / "results"
    res.mkdir(parents=True)
    (res / "summary_lifecycle_metrics.json").write_text(
        summary if isinstance(summary, str) else json.dumps(summary))
    for i, s in stages.items():
        (res / f"stage_{i}_lifecycle_metrics.json").write_text(
            s if isinstance(s, str) else json.dumps(s))
    return tmp_path / "run-x"


def _dist(mean: float) -> dict:
    return {"mean": mean, "median": mean, "p90": mean * 1.5, "p99": mean * 2}


def _doc(ttft: float, e2e: float, out_len: float, rate: float | None = None) -> dict:
    ls = {"count": 10, "schedule_delay": _dist(0.001), "send_duration": 5.0}
    if rate is not None:
        ls.update(requested_rate=rate, achieved_rate=rate * 0.99)
    return {"load_summary": ls,
            "successes": {"count": 10, "latency": {
                "request_latency": _dist(e2e), "time_to_first_token": _dist(ttft),
                "time_per_output_token": _dist(0.01), "inter_token_latency": _dist(0.01),
                "normalized_time_per_output_token": _dist(0.02)},
                "throughput": {"input_tokens_per_sec": 1.0, "output_tokens_per_sec": 2.0,
                               "requests_per_sec": 3.0},
                "prompt_len": _dist(100.0), "output_len": _dist(out_len)},
            "failures": {"count": 0, "request_latency": None, "prompt_len": None}}


def test_constructed_run_values_and_stage_order(tmp_path: Path) -> None:
    exp = _write_run(tmp_path, _doc(0.1, 2.1, 101.0),
                     {10: _doc(0.2, 1.2, 51.0, rate=4.0), 2: _doc(0.1, 1.1, 1.0, rate=2.0)})
    df, rep = read_lifecycle_dir(exp)
    assert df["stage"].tolist() == ["summary", "2", "10"]
    assert df["decode_interval_s"].iloc[0] == pytest.approx(0.02)
    assert df["decode_interval_s"].iloc[2] == pytest.approx(0.02)
    assert np.isnan(df["decode_interval_s"].iloc[1])  # output length 1
    assert np.isnan(df["requested_rate"].iloc[0]) and df["requested_rate"].iloc[2] == 4.0
    assert df["e2e_p99_s"].iloc[0] == pytest.approx(4.2)
    assert df["model"].isna().all() and df["tp"].isna().all()
    assert rep.read["files"] == 3
    # the results folder itself is accepted too
    df2, _ = read_lifecycle_dir(exp / "results")
    assert (df2["experiment_id"] == "run-x").all()


def test_bad_stage_file_counted_and_bad_summary(tmp_path: Path) -> None:
    exp = _write_run(tmp_path, _doc(0.1, 2.1, 101.0), {0: "{not json", 1: "[1, 2]"})
    df, rep = read_lifecycle_dir(exp)
    assert df["stage"].tolist() == ["summary"] and rep.dropped["bad_file"] == 2
    bad = tmp_path / "b"
    bad.mkdir()
    with pytest.raises(TraceFormatError):
        read_lifecycle_dir(bad)
    exp2 = _write_run(tmp_path / "c", "garbage", {})
    with pytest.raises(TraceFormatError):
        read_lifecycle_dir(exp2)


def test_profile_and_config_validation(tmp_path: Path) -> None:
    p = tmp_path / "profile.yaml"
    p.write_text(json.dumps({"data": {"shared_prefix": {
        "system_prompt_len": 100, "question_len": 400, "output_len": 250,
        "num_unique_system_prompts": 9, "num_users_per_system_prompt": 5}},
        "load": {"stages": [{"rate": 8, "duration": 600}, {"rate": 0.5, "duration": 60}]}}))
    prof = read_profile(p)
    assert prof["stages"] == [(8.0, 600.0), (0.5, 60.0)]
    assert (prof["num_groups"], prof["users_per_group"]) == (9, 5)
    p.write_text(json.dumps({"data": {"shared_prefix": {"system_prompt_len": 100}}}))
    with pytest.raises(TraceFormatError, match="question_len"):
        read_profile(p)
    p.write_text("[1, 2")
    with pytest.raises(TraceFormatError):
        read_profile(p)
    c = tmp_path / "exp-config.yaml"
    c.write_text("model: m\ntensor_parallelism: 0\n")
    with pytest.raises(TraceFormatError, match="tensor_parallelism"):
        read_exp_config(c)
    c.write_text("tensor_parallelism: 2\n")
    with pytest.raises(TraceFormatError, match="model"):
        read_exp_config(c)
    c.write_text("model: m\n")
    assert read_exp_config(c)["tp"] == 1


def _spec_fields() -> dict:
    return {"shared_prefix": {"system_prompt_len": 100, "question_len": 447, "output_len": 248,
                              "num_unique_system_prompts": 9,
                              "num_users_per_system_prompt": 5,
                              "enable_multi_turn_chat": True},
            "stages": [{"rate": 8, "duration": 600}, {"rate": 20, "duration": 600}]}


def test_workload_specs_of_both_formats_read_to_the_same_fields(tmp_path: Path) -> None:
    import yaml

    from bayes_latency.data.client.lifecycle import read_workload_spec

    f = _spec_fields()
    prof = tmp_path / "profile.yaml"
    prof.write_text(yaml.safe_dump({"data": {"type": "shared_prefix",
                                             "shared_prefix": f["shared_prefix"]},
                                    "load": {"type": "constant", "stages": f["stages"]}}))
    blis = tmp_path / "blis.yaml"
    blis.write_text(yaml.safe_dump({"version": "2", "seed": 42, "num_requests": 16800,
                                    "inference_perf": f}))
    a, b = read_workload_spec(prof), read_workload_spec(blis)
    assert a["format"] == "inference-perf profile" and b["format"] == "BLIS inference_perf spec"
    keys = ("system_prompt_len", "question_len", "output_len", "num_groups", "users_per_group",
            "stages", "multi_turn")
    assert {k: a[k] for k in keys} == {k: b[k] for k in keys}
    assert a["stages"] == [(8.0, 600.0), (20.0, 600.0)] and a["multi_turn"] is True


def test_workload_spec_errors_name_the_file_and_field(tmp_path: Path) -> None:
    import yaml

    from bayes_latency.data.client.lifecycle import read_workload_spec

    p = tmp_path / "w.yaml"
    f = _spec_fields()
    f["stages"][1]["rate"] = float("nan")
    p.write_text(yaml.safe_dump({"inference_perf": f}))
    with pytest.raises(TraceFormatError, match=r"inference_perf\.stages\[1\]\.rate") as e:
        read_workload_spec(p)
    assert "w.yaml" in str(e.value)
    p.write_text(yaml.safe_dump({"version": "2", "clients": [{"id": "c", "rate_fraction": 1}]}))
    with pytest.raises(TraceFormatError, match="explicit clients"):
        read_workload_spec(p)
    p.write_text(yaml.safe_dump({"model": "m"}))
    with pytest.raises(TraceFormatError, match="not a workload spec"):
        read_workload_spec(p)
    p.write_text(yaml.safe_dump({"inference_perf": {"stages": [], "shared_prefix": {}}}))
    with pytest.raises(TraceFormatError, match="system_prompt_len"):
        read_workload_spec(p)


def test_export_refuses_a_bad_workload_spec_in_one_line(tmp_path: Path, capsys) -> None:
    from bayes_latency.cli.main import main

    base = ["export", "--model", "llama-2-7b", "--gpu", "H100", "--tp", "1", "--format", "blis"]
    out = tmp_path / "coeffs.yaml"
    cases = {"utf16.yaml": (b"\xff\xfe\x00garbage", "UTF-16"),
             "broken.yaml": (b"inference_perf: [1, 2", "not valid YAML"),
             "empty.yaml": (b"", "expected a mapping")}
    for name, (data, needle) in cases.items():
        (tmp_path / name).write_bytes(data)
        assert main([*base, "--workload", str(tmp_path / name), "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and name in err and needle in err, err
    assert not out.exists()
