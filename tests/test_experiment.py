"""Ingest orchestration: serving YAML, trace files, experiment folders, end to end on synth."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from bayes_latency.cli.main import main
from bayes_latency.data.experiment import ingest, load_serving_yaml, load_tables, serving_config
from bayes_latency.data.observations.build import observation_columns
from bayes_latency.data.tables import table_files
from bayes_latency.errors import BayesLatencyError, ConfigError
from bayes_latency.physics.basis import INGEST_TERMS

EXAMPLE = "vllm-trace-format.example.jsonl"
ENGINE_COLUMNS = ["num_prefill_reqs", "prefill_tokens", "prefill_attn_pairs", "prefill_kv_tokens",
                  "num_decode_reqs", "decode_tokens", "decode_ctx_tokens"]


def write_yaml(path: Path, doc: dict) -> Path:
    path.write_text(yaml.safe_dump(doc))
    return path


def test_load_serving_yaml_flat_nested_and_exp_config(tmp_path):
    (tmp_path / "m").mkdir()
    cfg_json = tmp_path / "m" / "config.json"
    cfg_json.write_text("{}")
    p = write_yaml(tmp_path / "serving.yaml", {"model": "m/config.json", "gpu": "H100", "tp": 2,
                                               "serving": {"max_num_batched_tokens": 1024},
                                               "prefix_caching": False})
    d = load_serving_yaml(p)
    assert d["model"] == str(cfg_json.resolve()) and d["gpu"] == "H100"
    assert d["experiment_id"] == tmp_path.name and d["workload"] == ""
    sv = serving_config(d)
    assert (sv.tp, sv.max_num_batched_tokens, sv.prefix_caching) == (2, 1024, False)
    e = write_yaml(tmp_path / "exp-config.yaml", {
        "model": "meta-llama/Llama-2-70b-hf", "tensor_parallelism": 4, "max_model_len": 4096,
        "max_num_batched_tokens": 2048, "max_num_seqs": 128, "app": "inference-perf",
        "gpu": "H100"})
    d = load_serving_yaml(e)
    assert d["tp"] == 4 and serving_config(d).tp == 4
    with pytest.raises(ConfigError, match="gpu"):
        load_serving_yaml(write_yaml(tmp_path / "x.yaml", {"model": "llama-2-7b"}))
    with pytest.raises(ConfigError, match="mapping"):
        load_serving_yaml(write_yaml(tmp_path / "y.yaml", [1, 2]))


def test_ingest_spec_example_with_config(specs_dir, tmp_path):
    cfg = write_yaml(tmp_path / "serving.yaml", {
        "experiment_id": "example", "model": "llama-2-7b", "gpu": "H100", "tp": 1,
        "workload": "spec", "max_num_batched_tokens": 2048})
    out = tmp_path / "out"
    report = ingest([specs_dir / EXAMPLE], out, config=cfg)
    t = load_tables(out)
    assert {"steps", "journey_events", "requests", "batches", "iterations",
            "observations"} <= set(t)
    obs = t["observations"]
    assert list(obs.columns) == observation_columns(INGEST_TERMS)
    assert obs["kind"].value_counts().to_dict() == {
        "iteration": 1, "step_window": 2, "request_prefill": 1, "request_decode": 1,
        "alpha_arrival": 1, "alpha_departure": 1, "scheduler_cpu": 2}
    assert (obs["experiment_id"] == "example").all() and (obs["workload"] == "spec").all()
    it = obs[obs["kind"] == "iteration"].iloc[0]
    assert it["value_us"] == pytest.approx(38_500.0) and it["step_first"] == 41
    arr = obs[obs["kind"] == "alpha_arrival"].iloc[0]
    assert arr["value_us"] == pytest.approx(20021.381e6 - 20021.3782e6, abs=1e-3)
    b = t["batches"].set_index("step_id")
    assert b.loc[41, "prefill_tokens"] == 2048 and b.loc[42, "prefill_tokens"] == 552
    assert t["iterations"]["step_id"].tolist() == [41]
    rec = json.loads((out / "reconstruction_report.json").read_text())
    assert rec["example"]["agreement"] == 1.0
    rep = json.loads((out / "ingest_report.json").read_text())
    assert "example" in rep["experiments"]
    assert report.n_dropped == 0


def test_ingest_without_config_writes_no_observations(specs_dir, tmp_path):
    out = tmp_path / "out"
    report = ingest([specs_dir / EXAMPLE], out)
    assert not table_files(out, "observations")
    assert table_files(out, "batches") and table_files(out, "steps")
    assert any("observations not built" in n for n in report.notes)


def test_cli_ingest_and_duplicate_ids(specs_dir, tmp_path, capsys):
    cfg = write_yaml(tmp_path / "s.yaml", {"model": "llama-2-7b", "gpu": "H100"})
    assert main(["ingest", str(specs_dir / EXAMPLE), "--config", str(cfg),
                 "--out", str(tmp_path / "o")]) == 0
    assert "observations" in capsys.readouterr().out
    copy = tmp_path / EXAMPLE
    shutil.copy(specs_dir / EXAMPLE, copy)
    with pytest.raises(ConfigError, match="twice"):
        ingest([specs_dir / EXAMPLE, copy], tmp_path / "o2")
    assert main(["ingest", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o3")]) == 2
    with pytest.raises(BayesLatencyError):
        load_tables(tmp_path / "nothing")


@pytest.fixture(scope="module")
def tiny_fleet(tmp_path_factory):
    try:
        from bayes_latency.synth.fleet import simulate_fleet
    except ImportError as exc:  # pragma: no cover - until the synth module lands
        pytest.skip(f"bayes_latency.synth.fleet not importable yet: {exc}")
    root = tmp_path_factory.mktemp("tiny")
    folders = simulate_fleet("tiny", root / "fleet", seed=0, progress=False)
    out = root / "tables"
    report = ingest(folders, out)
    return folders, out, report


def test_tiny_fleet_end_to_end(tiny_fleet):
    folders, out, report = tiny_fleet
    # the only rows left out are windows over steps whose cached prefix reconstruction guessed
    # (the prefix-cached experiment; data.observations)
    assert all(k.endswith("prefix_guessed") for k, v in report.dropped.items() if v), report.format()
    t = load_tables(out)
    assert {"lifecycle", "observations", "batches", "iterations"} <= set(t)
    obs = t["observations"]
    assert set(obs["experiment_id"]) == {f.name for f in folders}
    for kind in ("iteration", "step_window", "alpha_arrival", "alpha_departure",
                 "request_prefill", "request_decode", "scheduler_cpu"):
        assert (obs["kind"] == kind).any(), kind
    assert np.isfinite(obs.filter(regex="^x_").to_numpy()).all() and (obs["value_us"] > 0).all()
    rec = json.loads((out / "reconstruction_report.json").read_text())
    for f in folders:
        serving = yaml.safe_load((f / "serving.yaml").read_text())
        eng = pd.read_parquet(f / "engine_batches.parquet").set_index("step_id")
        got = t["batches"][t["batches"]["experiment_id"] == f.name].set_index("step_id")
        got = got.reindex(eng.index)
        if serving["prefix_caching"]:
            assert rec[f.name]["agreement"] > 0.9
            continue
        # prefix caching off: 100 % agreement, on every step and every batch column
        assert rec[f.name]["agreement"] == 1.0
        for c in ENGINE_COLUMNS:
            np.testing.assert_allclose(got[c].to_numpy(), eng[c].to_numpy(), err_msg=c)
        # and the step windows sum the true iteration times (within the anchor error)
        ct = np.concatenate([[0.0], np.cumsum(eng["iteration_us"].to_numpy())])
        o = obs[(obs["experiment_id"] == f.name) & obs["kind"].isin(["iteration", "step_window"])]
        s0 = int(eng.index[0])
        true = ct[o["step_last"].to_numpy(int) - s0 + 1] - ct[o["step_first"].to_numpy(int) - s0]
        assert np.abs(o["value_us"].to_numpy() - true).max() < 1000.0


def test_small_input_is_read_line_by_line_and_the_scanner_writes_the_same_tables(
        tiny_fleet, tmp_path, monkeypatch):
    """Below ``SCANNER_MIN_INPUT_BYTES`` of traces ``ingest`` reads every line line by line (the
    byte scanner is never called); above it the scanner reads them, into the same tables."""
    import bayes_latency.data.otlp.chunks as chunks
    import bayes_latency.data.otlp.read as otlp_read

    folders, out, _ = tiny_fleet
    calls: list[int] = []
    real_read_chunk = chunks.read_chunk

    def counting(buf, n):
        calls.append(n)
        return real_read_chunk(buf, n)

    monkeypatch.setattr(chunks, "read_chunk", counting)
    line_out = tmp_path / "line"
    ingest(folders, line_out)
    assert calls == []
    monkeypatch.setattr(otlp_read, "SCANNER_MIN_INPUT_BYTES", 0)
    scan_out = tmp_path / "scan"
    ingest(folders, scan_out)
    assert sum(calls) > 0  # the scanner took the chunks
    a, b = load_tables(line_out), load_tables(scan_out)
    assert set(a) == set(b)
    for name in a:
        key = [c for c in ("experiment_id", "step_id", "request_id", "kind", "t_us") if c in a[name]]
        x = a[name].sort_values(key, kind="stable").reset_index(drop=True)
        y = b[name].sort_values(key, kind="stable").reset_index(drop=True)
        pd.testing.assert_frame_equal(x, y, check_exact=False, rtol=1e-12, obj=name)


@pytest.mark.parametrize("line, field", [("tp: true", "tp"), ("max_num_seqs: -5", "max_num_seqs"),
                                         ("max_num_seqs: .inf", "max_num_seqs")])
def test_bad_serving_knob_names_the_serving_yaml_and_field(tmp_path, line, field):
    p = tmp_path / "serving.yaml"
    p.write_text(f"model: llama-2-7b\ngpu: H100\n{line}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"serving\.yaml: field '{field}'"):
        load_serving_yaml(p)
