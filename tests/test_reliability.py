"""Reliability: no traceback, no silent loss, no overwritten file, on any input.

One test (or a few) per numbered finding; EXP is the smallest experiment of
``simulate --fleet tiny --seed 5`` (fixtures in ``conftest.py``), damaged by ``tests/mutate.py``.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mutate import (
    clone,
    copy_exp,
    core_event,
    load_docs,
    request_id,
    save_docs,
    scope_list,
    set_attr,
    spans,
    step_summaries,
    tree_hash,
)

from bayes_latency.cli.main import main
from bayes_latency.data.experiment import load_tables as _load_tables
from bayes_latency.errors import UnknownArchitectureError
from bayes_latency.physics.hf_config import architecture_from_config

ROOT = Path(__file__).resolve().parents[1]


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(err: str, *names: str) -> None:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("bayes-latency: error:"), err
    for n in names:
        assert n in lines[0], (n, lines[0])


def ingest(exp: Path, out: Path, capsys) -> tuple[dict, dict[str, pd.DataFrame]]:
    rc, _, err = run(["ingest", exp, "--out", out], capsys)
    assert rc == 0, err
    rep = json.loads((out / "ingest_report.json").read_text())["total"]
    tabs = _load_tables(out)
    return rep, tabs


def check_books(rep: dict) -> None:
    """read = kept + dropped for every balanced record type."""
    from bayes_latency.data.report import IngestReport

    for kind, (r, k) in IngestReport.BALANCES.items():
        assert rep["read"].get(r, 0) == rep["kept"].get(k, 0) + rep["dropped_by_record"].get(
            kind, 0), (kind, rep)


@pytest.fixture()
def exp(tiny_fleet_seed5, tmp_path) -> Path:
    return copy_exp(tiny_fleet_seed5, tmp_path / "in")


# -- 1: lone surrogates -------------------------------------------------------------------------
def test_01_lone_surrogate_in_id_is_replaced(exp, tmp_path, capsys):
    text = (exp / "traces.jsonl").read_text()
    docs = load_docs(exp)
    rid = request_id(next(spans(docs, "vllm.scheduler")))
    text = text.replace(rid, rid.replace("cmpl-", "cmpl-\\ud800-"))
    (exp / "traces.jsonl").write_text(text)
    rep, tabs = ingest(exp, tmp_path / "out", capsys)
    assert rep["kept"]["lone_surrogate_repaired"] >= 1
    assert tabs["requests"]["request_id"].str.contains("\ufffd").sum() == 1
    check_books(rep)


def test_01_surrogate_as_raw_bytes_in_id_is_replaced(exp, tmp_path, capsys):
    """A surrogate encoded as raw bytes (invalid UTF-8 that ``json.loads`` lets through as a
    lone surrogate) in a span's ``traceId`` and ``parentSpanId``: repaired and counted like a
    ``\\ud800`` escape, never a traceback from the table writer."""
    raw = (exp / "traces.jsonl").read_bytes()
    lines = raw.split(b"\n")
    k = next(i for i, ln in enumerate(lines) if b'"parentSpanId":"' in ln)
    ln = re.sub(rb'"traceId":"[0-9a-f]+"', b'"traceId":"\xed\xa0\x80"', lines[k], count=1)
    lines[k] = re.sub(rb'"parentSpanId":"[0-9a-f]+"', b'"parentSpanId":"\xed\xa0\x80"', ln,
                      count=1)
    (exp / "traces.jsonl").write_bytes(b"\n".join(lines))
    rep, _ = ingest(exp, tmp_path / "out", capsys)
    assert rep["kept"]["lone_surrogate_repaired"] >= 2
    check_books(rep)


def test_01_lone_surrogate_in_serving_yaml(exp, tmp_path, capsys):
    y = exp / "serving.yaml"
    y.write_text("experiment_id: \"a\\ud800b\"\n" + y.read_text().split("\n", 1)[1])
    rep, tabs = ingest(exp, tmp_path / "out", capsys)
    assert tabs["requests"]["experiment_id"].iloc[0] == "a\ufffdb"


# -- 2 and 6: output paths, never over an input, atomic -----------------------------------------
def test_02_bad_output_paths_fail_fast(exp, tiny_posterior, tmp_path, capsys):
    tables, post = tiny_posterior
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    a_dir = tmp_path / "a_dir"
    a_dir.mkdir()
    cases = [
        ["ingest", exp, "--out", a_file],
        ["ingest", exp, "--out", a_file / "sub"],
        ["check", post, "--out", a_file],
        ["export", post, "--model", "llama-2-7b", "--gpu", "H100", "--out", a_dir],
        ["fit", tables, "--out", a_dir],
        ["fit", tables, "--out", a_file / "p.nc"],
        ["simulate", "--fleet", "tiny", "--out", a_file, "--quiet"],
        ["demo", "--out", a_file / "results"],
    ]
    for argv in cases:
        t0 = time.perf_counter()
        rc, _, err = run(argv, capsys)
        assert rc == 2, argv
        one_line_error(err, "--out")
        assert time.perf_counter() - t0 < 5, argv  # validated before any long work
    assert a_file.read_text() == "x" and not any(a_dir.iterdir())


def test_06_outputs_never_replace_inputs(tiny_posterior, tmp_path, capsys):
    tables, post = tiny_posterior
    t = tmp_path / "t"
    shutil.copytree(tables, t)
    p = tmp_path / "p.nc"
    shutil.copy(post, p)
    before = tree_hash(t, p)
    rc, _, err = run(["fit", t, "--out", t / "observations.parquet"], capsys)
    assert rc == 2
    one_line_error(err, "observations.parquet", "input")
    rc, _, err = run(["export", p, "--model", "llama-2-7b", "--gpu", "H100", "--out", p], capsys)
    assert rc == 2
    one_line_error(err, "input")
    rc, _, err = run(["ingest", t, "--out", t], capsys)
    assert rc == 2
    assert tree_hash(t, p) == before


def test_06_atomic_write_keeps_old_file_on_failure(tmp_path):
    from bayes_latency.io import atomic_write

    f = tmp_path / "x.json"
    f.write_text("old")

    def boom(tmp: Path) -> None:
        tmp.write_text("half")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        atomic_write(f, boom)
    assert f.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["x.json"]


# -- 3: corrupt parquet ---------------------------------------------------------------------------
def test_03_corrupt_parquet_is_a_clean_error(tmp_path, capsys):
    t = tmp_path / "t"
    t.mkdir()
    (t / "observations.parquet").write_bytes(b"PAR1garbage")
    rc, _, err = run(["fit", t, "--out", tmp_path / "p.nc"], capsys)
    assert rc == 2
    one_line_error(err, "observations.parquet")


# -- 4: sampler arguments ----------------------------------------------------------------------------
@pytest.mark.parametrize("args,opt", [(["--draws", "0", "--tune", "10"], "--draws"),
                                      (["--tune", "-1"], "--tune"), (["--chains", "0"], "--chains"),
                                      (["--target-accept", "1.5"], "--target-accept")])
def test_04_sampler_arguments_validated(tiny_posterior, tmp_path, capsys, args, opt):
    tables, _ = tiny_posterior
    rc, _, err = run(["fit", tables, "--out", tmp_path / "p.nc", *args], capsys)
    assert rc == 2
    one_line_error(err, opt)
    assert not (tmp_path / "p.nc").exists()


# -- 5 and 15: export arguments -------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["json", "blis"])
@pytest.mark.parametrize("extra,name", [(["--draws", "100000000"], "--draws"),
                                        (["--tp", "0"], "--tp"), (["--tp", "-1"], "--tp"),
                                        (["--tp", "3"], "--tp"), (["--tp", "4096"], "--tp")])
def test_05_15_export_arguments_validated(tiny_posterior, tmp_path, capsys, fmt, extra, name):
    _, post = tiny_posterior
    out = tmp_path / "c.out"
    rc, _, err = run(["export", post, "--model", "llama-2-7b", "--gpu", "H100", "--format", fmt,
                      *extra, "--out", out], capsys)
    assert rc == 2
    one_line_error(err, name)
    assert not out.exists()


def test_15_valid_tp_exports(tiny_posterior, tmp_path, capsys):
    _, post = tiny_posterior
    for fmt in ("json", "blis"):
        out = tmp_path / f"c.{fmt}"
        rc, _, err = run(["export", post, "--model", "llama-2-70b", "--gpu", "H100", "--tp", "8",
                          "--format", fmt, "--out", out], capsys)
        assert rc == 0, err
        assert out.stat().st_size > 0


# -- 7: duplicate request ids ---------------------------------------------------------------------
def test_07_duplicate_request_id_is_counted(exp, tmp_path, capsys):
    docs = load_docs(exp)
    base, _ = ingest(exp, tmp_path / "base", capsys)
    core = scope_list(docs, "vllm.scheduler")
    dup = clone(core[0])
    dup["spanId"] = "ffffffffffffffff"
    core.append(dup)
    save_docs(exp, docs)
    rep, tabs = ingest(exp, tmp_path / "out", capsys)
    assert rep["dropped"]["duplicate_request_id"] == 1
    assert rep["dropped"]["duplicate_request_id:events"] == len(dup["events"])
    assert len(tabs["requests"]) == base["kept"]["requests"]
    assert rep["kept"]["journey_events"] == base["kept"]["journey_events"]
    check_books(rep)


# -- 8: unknown finish status ---------------------------------------------------------------------
@pytest.mark.parametrize("status", ["bogus-status", ""])
def test_08_unknown_finish_status_is_counted(exp, tmp_path, capsys, status):
    docs = load_docs(exp)
    sp = next(spans(docs, "vllm.scheduler"))
    set_attr(core_event(sp, "FINISHED")["attributes"], "finish.status", {"stringValue": status})
    save_docs(exp, docs)
    rep, tabs = ingest(exp, tmp_path / "out", capsys)
    assert rep["kept"]["unknown_finish_status"] == 1
    assert any("unknown_finish_status" in n for n in rep["notes"])


# -- 9 and 16: lifecycle fields -------------------------------------------------------------------
def _lifecycle(exp: Path) -> tuple[Path, dict]:
    f = exp / "results" / "summary_lifecycle_metrics.json"
    return f, json.loads(f.read_text())


@pytest.mark.parametrize("mutate,reason", [
    (lambda d: d["successes"]["latency"].__setitem__("request_latency", "fast"),
     "request_latency"),
    (lambda d: d["successes"]["latency"]["time_to_first_token"].__setitem__("mean", "Infinity"),
     "time_to_first_token.mean"),
    (lambda d: d["successes"]["latency"]["time_to_first_token"].__setitem__("mean", "NaN"),
     "time_to_first_token.mean"),
    (lambda d: d["successes"]["latency"]["time_to_first_token"].__setitem__("mean", "1e400"),
     "time_to_first_token.mean"),
    (lambda d: d["successes"]["latency"]["time_to_first_token"].__setitem__("mean", -5),
     "time_to_first_token.mean"),
    (lambda d: d["successes"].__setitem__("count", -3), "successes.count"),
    (lambda d: d.pop("successes"), "missing_section:successes"),
    (lambda d: d.pop("load_summary"), "missing_section:load_summary"),
])
def test_09_16_corrupt_lifecycle_fields_are_counted(exp, tmp_path, capsys, mutate, reason):
    f, doc = _lifecycle(exp)
    mutate(doc)
    text = json.dumps(doc)
    for tok in ("Infinity", "NaN", "1e400"):  # as JSON literals, not strings
        text = text.replace(f'"{tok}"', tok)
    f.write_text(text)
    rep, tabs = ingest(exp, tmp_path / "out", capsys)
    hits = {k: v for k, v in rep["dropped"].items() if k.startswith("lifecycle:") and reason in k}
    assert hits, rep["dropped"]
    lc = tabs["lifecycle"]
    num = lc.select_dtypes("number").to_numpy(dtype=float, na_value=np.nan)
    assert not np.isinf(num).any() and not (num[~np.isnan(num)] < 0).any() or \
        lc["schedule_delay_mean_s"].lt(0).any()
    check_books(rep)


# -- 10 and 11: negative / out-of-range step and journey values -----------------------------------
@pytest.mark.parametrize("key,value,kind", [
    ("step.ts_start_ns", {"intValue": "-40000000000000"}, "intValue"),
    ("batch.decode_tokens", {"intValue": "-3"}, "intValue"),
    ("kv.usage_gpu_ratio", {"doubleValue": -3.0}, "doubleValue"),
    ("kv.usage_gpu_ratio", {"doubleValue": 7.5}, "doubleValue"),
    ("kv.usage_gpu_ratio", {"doubleValue": 1e300}, "doubleValue"),
    ("step.ts_end_ns", {"intValue": "5"}, "intValue"),
])
def test_10_11_out_of_range_step_values_are_dropped(exp, tmp_path, capsys, key, value, kind):
    docs = load_docs(exp)
    set_attr(step_summaries(docs)[3]["attributes"], key, value)
    save_docs(exp, docs)
    rep, tabs = ingest(exp, tmp_path / "out", capsys)
    assert rep["dropped"][f"out_of_range:{key}"] == 1
    st = tabs["steps"]
    assert (st.select_dtypes("number").fillna(0) >= 0).all().all()
    assert st["kv.usage_gpu_ratio"].dropna().between(0, 1).all()
    assert (st["step.ts_end_ns"] >= st["step.ts_start_ns"]).all()
    check_books(rep)


def test_10_negative_journey_counts_never_reach_the_fit(exp, tmp_path, capsys):
    docs = load_docs(exp)
    sp = next(spans(docs, "vllm.scheduler"))
    set_attr(core_event(sp, "FINISHED")["attributes"], "decode.done_tokens", {"intValue": "-100"})
    sp2 = list(spans(docs, "vllm.scheduler"))[1]
    set_attr(core_event(sp2, "QUEUED")["attributes"], "ts.monotonic_ns", {"intValue": "-5"})
    save_docs(exp, docs)
    rep, tabs = ingest(exp, tmp_path / "out", capsys)
    assert rep["dropped"]["out_of_range:decode.done_tokens"] == 1
    assert rep["dropped"]["out_of_range:ts.monotonic_ns"] == 1
    req = tabs["requests"].set_index("request_id")
    assert not req.loc[request_id(sp), "complete"] and not req.loc[request_id(sp2), "complete"]
    obs = tabs["observations"]
    x = obs[[c for c in obs.columns if c.startswith("x_")] + ["value_us"]].to_numpy(float)
    assert np.isfinite(x).all() and (x >= 0).all()


# -- 12: the first SCHEDULED dropped ----------------------------------------------------------------
def test_12_request_losing_first_scheduled_is_incomplete(exp, tmp_path, capsys):
    docs = load_docs(exp)
    sp = next(s for s in spans(docs, "vllm.scheduler")
              if sum(e["name"] == "journey.SCHEDULED" for e in s["events"]) >= 1)
    set_attr(core_event(sp, "SCHEDULED")["attributes"], "scheduler.step",
             {"stringValue": "forty"})
    save_docs(exp, docs)
    rep, tabs = ingest(exp, tmp_path / "out", capsys)
    req = tabs["requests"].set_index("request_id").loc[request_id(sp)]
    assert not req["complete"] and req["status"] == "incomplete"
    assert rep["kept"]["damaged_request"] == 1


# -- 13: max_tokens 0 with output -------------------------------------------------------------------
def test_13_max_tokens_zero_with_a_token_is_not_complete(exp, tmp_path, capsys):
    docs = load_docs(exp)
    sp = next(spans(docs, "vllm.scheduler"))
    for ev in sp["events"]:
        if any(kv["key"] == "decode.max_tokens" for kv in ev["attributes"]):
            set_attr(ev["attributes"], "decode.max_tokens", {"intValue": "0"})
    save_docs(exp, docs)
    rep, tabs = ingest(exp, tmp_path / "out", capsys)
    req = tabs["requests"].set_index("request_id").loc[request_id(sp)]
    assert not req["complete"]
    assert rep["kept"]["inconsistent_request:max_tokens_0"] == 1


# -- 14: inconsistent configs -----------------------------------------------------------------------
def test_14_max_model_len_below_prompts_is_an_error(exp, tmp_path, capsys):
    y = exp / "serving.yaml"
    y.write_text(y.read_text().replace("max_model_len: 4096", "max_model_len: 1"))
    rc, _, err = run(["ingest", exp, "--out", tmp_path / "out"], capsys)
    assert rc == 2
    one_line_error(err, "max_model_len", str(exp))


def test_14_heads_not_dividing_hidden_size():
    cfg = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 7,
           "vocab_size": 32000, "intermediate_size": 11008}
    with pytest.raises(UnknownArchitectureError, match="hidden_size"):
        architecture_from_config(cfg)
    with pytest.raises(UnknownArchitectureError, match="num_key_value_heads"):
        architecture_from_config(dict(cfg, num_attention_heads=32, num_key_value_heads=5))


def test_14_bad_config_json_in_serving_yaml(exp, tmp_path, capsys):
    (exp / "config.json").write_text(json.dumps({
        "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 7,
        "vocab_size": 32000, "intermediate_size": 11008}))
    y = exp / "serving.yaml"
    y.write_text(y.read_text().replace("model: mixtral-8x7b", "model: config.json"))
    rc, _, err = run(["ingest", exp, "--out", tmp_path / "out"], capsys)
    assert rc == 2
    one_line_error(err, "config.json", "hidden_size")


# -- 17: --priors on check and export -----------------------------------------------------------------
def test_17_priors_option_on_check_and_export(tiny_posterior, tmp_path, capsys):
    _, post = tiny_posterior
    default = ROOT / "priors" / "default.yaml"
    rc, _, err = run(["export", post, "--model", "llama-2-7b", "--gpu", "H100", "--priors",
                      default, "--out", tmp_path / "c.json"], capsys)
    assert rc == 0, err
    rc, _, err = run(["check", post, "--priors", default], capsys)
    assert rc in (0, 1), err
    other = tmp_path / "other.yaml"
    other.write_text(default.read_text().replace("median: 2.0", "median: 2.5", 1))
    for argv in (["export", post, "--model", "llama-2-7b", "--gpu", "H100", "--out",
                  tmp_path / "d.json"], ["check", post]):
        rc, _, err = run([*argv, "--priors", other], capsys)  # the option reaches the loader
        assert rc == 2
        one_line_error(err, "priors")


# -- 18: kv_events.jsonl empty or garbage -------------------------------------------------------------
@pytest.mark.parametrize("content", ["", "garbage\nnot json\n"])
def test_18_bad_kv_events_are_skipped_with_a_note(exp, tmp_path, capsys, content):
    (exp / "kv_events.jsonl").write_text(content)
    rep, tabs = ingest(exp, tmp_path / "out", capsys)
    assert rep["dropped"]["kv_events:unreadable"] == 1
    assert any(n.startswith("kv events skipped") for n in rep["notes"])
    assert len(tabs["observations"])


# -- 19: absurd predictions in check --------------------------------------------------------------------
@pytest.mark.parametrize("factor", [1e300, np.inf])
def test_19_absurd_predictions_are_findings_not_plots(tiny_posterior, tmp_path, capsys, factor):
    import xarray as xr

    tables, post = tiny_posterior
    dt = xr.open_datatree(post, engine="h5netcdf").load()
    pst = dt["posterior"].to_dataset()
    pst["beta"] = pst["beta"] * factor
    dt["posterior"] = xr.DataTree(pst)
    bad = tmp_path / "bad.nc"
    dt.to_netcdf(bad, engine="h5netcdf")
    out = tmp_path / "check"
    rc, stdout, err = run(["check", bad, "--tables", tables, "--out", out], capsys)
    assert rc == 1, err
    assert "Findings" in stdout and "e+2" not in stdout.split("Findings")[0].split(
        "mean E2E")[-1]
    findings = json.loads((out / "findings.json").read_text())
    assert findings and not (out / "ppc_iterations.png").exists()


def test_attach_rows_gives_a_loaded_fit_its_rows_and_refuses_others(tiny_posterior) -> None:
    """A loaded fit has no fitted rows (the run-level scales of the client study then fell back
    on the prior's); ``attach_rows`` restores them from the fit's observations, and refuses rows
    whose hash differs from the fit's data hash."""
    from bayes_latency.errors import ModelMismatchError
    from bayes_latency.model.estimator import LatencyModel

    tables, post = tiny_posterior
    obs = pd.read_parquet(post.parent / "small" / "observations.parquet")
    m = LatencyModel.load(post)
    assert getattr(m, "_rows", None) is None
    m.attach_rows(obs)
    assert len(m._rows) > 0 and set(m._rows["config_id"]) == set(m.design.configs.index)
    with pytest.raises(ModelMismatchError, match="not the rows"):
        m.attach_rows(obs.iloc[:-3])
