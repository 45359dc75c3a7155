"""Tests of the client-side result readers: vllm bench serve JSON, BLIS TraceV2, the dispatcher.

Fixtures in ``tests/data``: ``vllm_bench_small.json`` (a ``vllm bench serve --save-result
--save-detailed`` result of 12 requests, one failed, with the field names of
``vllm/benchmarks/serve.py``) and ``blis_observe.yaml`` / ``.csv`` (a ``blis observe`` TraceV2 pair
of 20 requests, one failed, columns of ``sim/workload/tracev2.go`` with ``vllm_priority`` and
``x_request_id``).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bayes_latency.data.client.frames import CLIENT_REQUEST_COLUMNS, CLIENT_SUMMARY_COLUMNS
from bayes_latency.data.client.lifecycle import LIFECYCLE_COLUMNS
from bayes_latency.data.client.read import (
    ACCEPTED_FORMATS,
    add_folder_client_results,
    read_client_results,
)
from bayes_latency.data.client.tracev2 import read_tracev2
from bayes_latency.data.client.vllm_bench import read_vllm_bench
from bayes_latency.data.report import IngestReport
from bayes_latency.errors import TraceFormatError

DATA = Path(__file__).resolve().parent / "data"
VLLM = DATA / "vllm_bench_small.json"
T_HDR, T_CSV = DATA / "blis_observe.yaml", DATA / "blis_observe.csv"


def _balanced(rep: IngestReport) -> None:
    """read = kept (ok + failed) + dropped, for requests."""
    assert rep.read["requests"] == (rep.kept["requests_ok"] + rep.kept["requests_failed"]
                                    + rep.n_dropped), rep.format()


def _vdoc() -> dict:
    return json.loads(VLLM.read_text())


def _write(tmp_path: Path, doc: object, name: str = "vllm_bench.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


# --------------------------------------------------------------------------------- vllm bench


def test_vllm_bench_detailed_result() -> None:
    doc = _vdoc()
    tabs, rep = read_vllm_bench(VLLM)
    lc, req = tabs["lifecycle"], tabs["client_requests"]
    assert list(lc.columns) == list(CLIENT_SUMMARY_COLUMNS)
    assert set(LIFECYCLE_COLUMNS) <= set(lc.columns)
    assert list(req.columns) == list(CLIENT_REQUEST_COLUMNS)
    row = lc.iloc[0]
    assert row["source"] == "vllm_bench" and row["stage"] == "summary"
    assert row["experiment_id"] == "vllm_bench_small"
    assert row["model"] == "meta-llama/Llama-2-7b-hf" and row["tp"] == 1  # --metadata tp=1
    assert (row["count"], row["successes"], row["failures"]) == (12, 11, 1)
    assert row["requested_rate"] == 4.0 and math.isnan(row["max_concurrency"])
    # the file's own statistics, ms -> s
    for m, k in (("ttft", "ttft"), ("tpot", "tpot"), ("itl", "itl")):
        assert row[f"{m}_mean_s"] == pytest.approx(doc[f"mean_{k}_ms"] / 1e3)
        assert row[f"{m}_median_s"] == pytest.approx(doc[f"median_{k}_ms"] / 1e3)
        assert row[f"{m}_p99_s"] == pytest.approx(doc[f"p99_{k}_ms"] / 1e3)
    # e2el is not in vLLM's default --percentile-metrics: computed from the per-request lists
    ok = [i for i, e in enumerate(doc["errors"]) if not e]
    assert row["e2e_mean_s"] == pytest.approx(np.mean([doc["latencies"][i] for i in ok]))
    assert any("e2e_mean_s" in n for n in rep.notes)
    assert row["prompt_len_mean"] == pytest.approx(doc["total_input_tokens"] / 11)
    assert row["output_len_mean"] == pytest.approx(doc["total_output_tokens"] / 11)
    assert row["decode_interval_s"] == pytest.approx(row["tpot_mean_s"], rel=0.02)
    assert row["duration_s"] == doc["duration"]
    assert row["schedule_delay_mean_s"] == pytest.approx(np.mean(doc["queue_times"]))
    # per-request rows: 11 ok + 1 failed
    assert len(req) == 12 and (req["status"] == "ok").sum() == 11
    bad = req[req["status"] == "error"].iloc[0]
    assert bad["request_index"] == 7 and "ServerDisconnectedError" in bad["error"]
    assert math.isnan(bad["ttft_s"]) and math.isnan(bad["e2e_s"])
    good = req[req["status"] == "ok"]
    assert good["e2e_s"].tolist() == pytest.approx([doc["latencies"][i] for i in ok])
    assert good["ttft_s"].tolist() == pytest.approx([doc["ttfts"][i] for i in ok])
    assert good["prompt_tokens"].tolist() == [doc["input_lens"][i] for i in ok]
    assert (good["e2e_s"] > good["ttft_s"]).all() and (good["decode_interval_s"] > 0).all()
    assert req["arrival_s"].min() == 0.0 and (req["send_s"] >= req["arrival_s"]).all()
    assert rep.read["requests"] == 12 and rep.kept["requests_ok"] == 11
    assert rep.kept["requests_failed"] == 1 and rep.n_dropped == 0
    _balanced(rep)


def test_vllm_bench_e2e_from_itls_when_latencies_absent(tmp_path: Path) -> None:
    doc = _vdoc()
    del doc["latencies"]
    tabs, rep = read_vllm_bench(_write(tmp_path, doc))
    req = tabs["client_requests"]
    ok = req[req["status"] == "ok"]
    want = [doc["ttfts"][i] + sum(doc["itls"][i]) for i in ok["request_index"]]
    assert ok["e2e_s"].tolist() == pytest.approx(want)
    _balanced(rep)


def test_vllm_bench_summary_only(tmp_path: Path) -> None:
    """Without --save-detailed: no per-request rows; what the file lacks stays NaN."""
    doc = _vdoc()
    for f in ("input_lens", "output_lens", "ttfts", "itls", "start_times", "generated_texts",
              "errors", "latencies", "queue_times"):
        del doc[f]
    doc["mean_e2el_ms"], doc["median_e2el_ms"], doc["p99_e2el_ms"] = 951.6, 940.6, 1067.7
    tabs, rep = read_vllm_bench(_write(tmp_path, doc))
    row = tabs["lifecycle"].iloc[0]
    assert len(tabs["client_requests"]) == 0
    assert list(tabs["client_requests"].columns) == list(CLIENT_REQUEST_COLUMNS)
    assert row["e2e_mean_s"] == pytest.approx(0.9516) and math.isnan(row["e2e_p90_s"])
    assert math.isnan(row["ntpot_mean_s"]) and math.isnan(row["send_duration_s"])
    assert row["decode_interval_s"] == pytest.approx(
        (0.9516 - doc["mean_ttft_ms"] / 1e3) / (doc["total_output_tokens"] / 11 - 1))
    assert rep.read["requests"] == 0 and rep.kept["lifecycle_rows"] == 1


def test_vllm_bench_malformed_requests_are_counted(tmp_path: Path) -> None:
    doc = _vdoc()
    doc["ttfts"][0] = float("nan")          # json.dumps writes NaN, as Python's json does
    doc["output_lens"][1] = -5
    doc["itls"][2][3] = -0.001
    doc["latencies"][3] = None
    doc["input_lens"][4] = "abc"
    doc["latencies"][5] = doc["ttfts"][5] / 2  # E2E before the first token
    tabs, rep = read_vllm_bench(_write(tmp_path, doc))
    assert dict(rep.dropped) == {"malformed:ttfts": 1, "malformed:output_lens": 1,
                                 "malformed:itls": 1, "malformed:latencies": 2,
                                 "malformed:input_lens": 1}
    assert rep.kept["requests_ok"] == 5 and rep.kept["requests_failed"] == 1
    _balanced(rep)
    assert len(tabs["client_requests"]) == 6
    assert any("request 0: ttfts=nan" in n for n in rep.notes)
    # the summary keeps the file's own statistics; per-request gaps come from the kept rows
    assert tabs["lifecycle"].iloc[0]["ttft_mean_s"] == pytest.approx(doc["mean_ttft_ms"] / 1e3)


def test_huge_token_counts_are_malformed(tmp_path: Path) -> None:
    doc = _vdoc()
    doc["input_lens"][0] = 2**70
    _, rep = read_vllm_bench(_write(tmp_path, doc))
    assert rep.dropped["malformed:input_lens"] == 1
    df = _csv()
    df.loc[0, "output_tokens"] = "9223372036854775808"
    df.loc[1, "prefix_length"] = str(2**61)
    _, rep = read_tracev2(_pair(tmp_path, df))
    assert rep.dropped["malformed:output_tokens"] == 1
    assert rep.dropped["malformed:prefix_length"] == 1
    _balanced(rep)


def test_vllm_bench_failed_without_error_text_and_old_format(tmp_path: Path) -> None:
    """Older result files have no 'failed' / 'latencies'; vLLM writes 0 / 0.0 for failures."""
    doc = _vdoc()
    for f in ("failed", "latencies", "queue_times", "start_times"):
        del doc[f]
    doc["errors"][7] = ""
    tabs, rep = read_vllm_bench(_write(tmp_path, doc))
    row = tabs["lifecycle"].iloc[0]
    assert (row["failures"], row["count"]) == (1, 12)
    req = tabs["client_requests"]
    assert req.loc[7, "status"] == "error" and "no error text" in req.loc[7, "error"]
    assert req["arrival_s"].isna().all()
    _balanced(rep)


@pytest.mark.parametrize("field", ["ttfts", "itls", "errors", "output_lens"])
def test_vllm_bench_list_length_mismatch_names_field(tmp_path: Path, field: str) -> None:
    doc = _vdoc()
    doc[field] = doc[field][:-1]
    with pytest.raises(TraceFormatError, match="has 11 entries but input_lens has 12") as ei:
        read_vllm_bench(_write(tmp_path, doc))
    assert ei.value.field == field and ei.value.file.endswith("vllm_bench.json")


@pytest.mark.parametrize("field", ["completed", "duration", "ttfts"])
def test_vllm_bench_missing_field(tmp_path: Path, field: str) -> None:
    doc = _vdoc()
    del doc[field]
    with pytest.raises(TraceFormatError) as ei:
        read_vllm_bench(_write(tmp_path, doc))
    assert ei.value.field == field


@pytest.mark.parametrize(("field", "value"), [("mean_ttft_ms", float("nan")),
                                              ("p99_itl_ms", -3.0),
                                              ("request_throughput", "fast"),
                                              ("duration", float("inf"))])
def test_vllm_bench_bad_summary_value(tmp_path: Path, field: str, value: object) -> None:
    doc = _vdoc()
    doc[field] = value
    with pytest.raises(TraceFormatError) as ei:
        read_vllm_bench(_write(tmp_path, doc))
    assert ei.value.field == field


def test_vllm_bench_per_request_field_not_a_list(tmp_path: Path) -> None:
    doc = _vdoc()
    doc["itls"] = {"0": []}
    with pytest.raises(TraceFormatError, match="expected a list") as ei:
        read_vllm_bench(_write(tmp_path, doc))
    assert ei.value.field == "itls"


def test_vllm_bench_not_json_and_not_a_result(tmp_path: Path) -> None:
    p = tmp_path / "r.json"
    p.write_text('{"completed": 3, "duration": ')
    with pytest.raises(TraceFormatError, match="not valid JSON"):
        read_vllm_bench(p)
    with pytest.raises(TraceFormatError, match="pytorch.json"):
        read_vllm_bench(_write(tmp_path, [{"benchmark": {}}], "r.pytorch.json"))
    with pytest.raises(TraceFormatError) as ei:
        read_vllm_bench(_write(tmp_path, {"duration": 3.0, "mean_ttft_ms": 4.0}))
    assert ei.value.field == "completed"


def test_vllm_bench_append_result_json_lines(tmp_path: Path) -> None:
    a, b = _vdoc(), _vdoc()
    b["request_rate"], b["max_concurrency"] = "inf", 8
    p = tmp_path / "runs.json"
    p.write_text(json.dumps(a) + "\n" + json.dumps(b))
    tabs, rep = read_vllm_bench(p)
    lc = tabs["lifecycle"]
    assert lc["experiment_id"].tolist() == ["runs#0", "runs#1"]
    assert lc["requested_rate"].iloc[1] == math.inf and lc["max_concurrency"].iloc[1] == 8
    assert len(tabs["client_requests"]) == 24 and rep.read["requests"] == 24
    _balanced(rep)


# ------------------------------------------------------------------------------------ TraceV2


def _csv() -> pd.DataFrame:
    return pd.read_csv(T_CSV, keep_default_na=False, dtype=str)


def _pair(tmp_path: Path, df: pd.DataFrame | None = None, header: str | None = None,
          raw: str | None = None) -> Path:
    h = tmp_path / "obs.yaml"
    h.write_text(header if header is not None else T_HDR.read_text())
    if raw is not None:
        (tmp_path / "obs.csv").write_text(raw)
    else:
        (df if df is not None else _csv()).to_csv(tmp_path / "obs.csv", index=False)
    return h


def test_tracev2_observe_pair() -> None:
    tabs, rep = read_tracev2(T_HDR)
    lc, req = tabs["lifecycle"], tabs["client_requests"]
    assert list(lc.columns) == list(CLIENT_SUMMARY_COLUMNS)
    assert list(req.columns) == list(CLIENT_REQUEST_COLUMNS)
    csv = pd.read_csv(T_CSV)
    ok = csv[csv["status"] == "ok"]
    assert len(req) == 20 and (req["status"] == "ok").sum() == 19
    r = req[req["status"] == "ok"]
    assert r["request_id"].tolist() == [str(i) for i in ok["request_id"]]
    assert r["ttft_s"].to_numpy() == pytest.approx(
        ((ok["first_chunk_time_us"] - ok["send_time_us"]) / 1e6).to_numpy())
    assert r["e2e_s"].to_numpy() == pytest.approx(
        ((ok["last_chunk_time_us"] - ok["send_time_us"]) / 1e6).to_numpy())
    assert r["prompt_tokens"].tolist() == ok["server_input_tokens"].tolist()
    failed = req[req["status"] == "error"].iloc[0]
    assert failed["request_id"] == "13" and "503" in failed["error"]
    assert failed["prompt_tokens"] == 256 + csv.loc[csv["request_id"] == 13,
                                                    "input_tokens"].iloc[0]
    assert req["arrival_s"].iloc[0] == 0 and (req["send_s"] >= req["arrival_s"] - 1e-9).all()
    row = lc.iloc[0]
    assert row["source"] == "tracev2" and row["experiment_id"] == "blis_observe"
    assert row["model"] == "meta-llama/Llama-2-7b-hf" and row["tp"] == 1
    assert (row["count"], row["successes"], row["failures"]) == (20, 19, 1)
    assert row["ttft_mean_s"] == pytest.approx(r["ttft_s"].mean())
    assert row["e2e_p90_s"] == pytest.approx(np.percentile(r["e2e_s"], 90))
    itl = ((ok["last_chunk_time_us"] - ok["first_chunk_time_us"]).sum()
           / (ok["num_chunks"] - 1).sum() / 1e6)
    assert row["itl_mean_s"] == pytest.approx(itl) and math.isnan(row["itl_p99_s"])
    assert 0.006 < row["decode_interval_s"] < 0.009
    assert rep.read["requests"] == 20 and rep.n_dropped == 0
    _balanced(rep)


def test_tracev2_warm_up_requests_are_excluded(tmp_path: Path) -> None:
    hdr = T_HDR.read_text().replace("warm_up_requests: 2", "warm_up_requests: 5")
    tabs, rep = read_tracev2(_pair(tmp_path, header=hdr))
    assert rep.dropped["warm_up"] == 3 and len(tabs["client_requests"]) == 17
    _balanced(rep)


def test_tracev2_malformed_rows_are_counted(tmp_path: Path) -> None:
    df = _csv()
    df.loc[0, "send_time_us"] = "abc"
    df.loc[1, "first_chunk_time_us"] = str(int(df.loc[1, "send_time_us"]) - 5)
    df.loc[2, "output_tokens"] = "-4"
    df.loc[3, "arrival_time_us"] = "NaN"
    df.loc[4, "last_chunk_time_us"] = str(int(df.loc[4, "first_chunk_time_us"]) - 1)
    df = pd.concat([df, df.iloc[[6]]], ignore_index=True)  # request 8 twice
    raw = df.to_csv(index=False) + "99,client-0,,standard,1\n"  # a short row
    tabs, rep = read_tracev2(_pair(tmp_path, raw=raw))
    assert dict(rep.dropped) == {"malformed:send_time_us": 1, "first_token_before_send": 1,
                                 "malformed:output_tokens": 1, "malformed:arrival_time_us": 1,
                                 "last_token_before_first": 1, "duplicate_request_id": 1,
                                 "short_row": 1}
    assert rep.read["requests"] == 22 and rep.kept["requests_ok"] == 14
    _balanced(rep)
    assert len(tabs["client_requests"]) == 15
    assert any("line 2 field 'send_time_us'" in n for n in rep.notes)
    assert any("line 3 field 'first_chunk_time_us'" in n for n in rep.notes)


def test_tracev2_strict_raises_with_line_and_field(tmp_path: Path) -> None:
    df = _csv()
    df.loc[3, "first_chunk_time_us"] = str(int(df.loc[3, "send_time_us"]) - 100)
    with pytest.raises(TraceFormatError, match="before send") as ei:
        read_tracev2(_pair(tmp_path, df), strict=True)
    assert (ei.value.line, ei.value.field) == (5, "first_chunk_time_us")
    assert ei.value.file.endswith("obs.csv")
    df = _csv()
    df.loc[0, "last_chunk_time_us"] = "0"
    with pytest.raises(TraceFormatError, match="zero time") as ei:
        read_tracev2(_pair(tmp_path, df), strict=True)
    assert (ei.value.line, ei.value.field) == (2, "last_chunk_time_us")


def test_tracev2_missing_column(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="required column missing") as ei:
        read_tracev2(_pair(tmp_path, _csv().drop(columns=["first_chunk_time_us"])))
    assert (ei.value.line, ei.value.field) == (1, "first_chunk_time_us")


@pytest.mark.parametrize(("edit", "field"), [
    (lambda h: h.replace("trace_version: 3\n", ""), "trace_version"),
    (lambda h: h.replace("time_unit: us", "time_unit: ms"), "time_unit"),
    (lambda h: h.replace("warm_up_requests: 2", "warm_up_requests: -1"), "warm_up_requests"),
    (lambda h: h.replace("network:\n    measured_rtt_ms: 0.35\n", "network: 3\n"), "network"),
])
def test_tracev2_bad_header(tmp_path: Path, edit, field: str) -> None:
    with pytest.raises(TraceFormatError) as ei:
        read_tracev2(_pair(tmp_path, header=edit(T_HDR.read_text())))
    assert ei.value.field == field and ei.value.file.endswith("obs.yaml")


def test_tracev2_unreadable_inputs(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="not valid YAML"):
        read_tracev2(_pair(tmp_path, header="trace_version: [3\n"))
    h = tmp_path / "lone.yaml"
    h.write_text(T_HDR.read_text())
    with pytest.raises(TraceFormatError, match="no TraceV2 data CSV"):
        read_tracev2(h)
    with pytest.raises(TraceFormatError, match="no request rows"):
        read_tracev2(_pair(tmp_path, raw=T_CSV.read_text().splitlines()[0] + "\n"))
    df = _csv()
    df["send_time_us"] = "x"
    with pytest.raises(TraceFormatError, match="all dropped"):
        read_tracev2(_pair(tmp_path, df))


def test_tracev2_unknown_header_field_and_simulated_mode_are_noted(tmp_path: Path) -> None:
    hdr = T_HDR.read_text().replace("mode: real", "mode: generated") + "future_knob: 1\n"
    _, rep = read_tracev2(_pair(tmp_path, header=hdr))
    assert any("future_knob" in n for n in rep.notes)
    assert any("simulated" in n for n in rep.notes)


# --------------------------------------------------------------------------------- dispatcher


def test_dispatch_by_content(tmp_path: Path) -> None:
    renamed = tmp_path / "anything.json"
    shutil.copy(VLLM, renamed)
    tabs, _ = read_client_results(renamed)
    assert tabs["lifecycle"]["source"].tolist() == ["vllm_bench"]
    for p in (T_HDR, T_CSV):
        tabs, _ = read_client_results(p)
        assert tabs["lifecycle"]["source"].tolist() == ["tracev2"]


def test_dispatch_folder_with_several_sources(tmp_path: Path) -> None:
    exp = tmp_path / "exp1"
    (exp / "results").mkdir(parents=True)
    life = {"load_summary": {"count": 10},
            "successes": {"count": 10, "latency": {
                "time_to_first_token": {"mean": 0.03, "median": 0.03, "p90": 0.04, "p99": 0.05},
                "request_latency": {"mean": 1.0, "median": 1.0, "p90": 1.2, "p99": 1.3}},
                "output_len": {"mean": 101.0}}}
    (exp / "results" / "summary_lifecycle_metrics.json").write_text(json.dumps(life))
    shutil.copy(VLLM, exp / "vllm_bench_rate4.json")
    shutil.copy(T_HDR, exp / "obs.yaml")
    shutil.copy(T_CSV, exp / "obs.csv")
    (exp / "profile.yaml").write_text("load: {}\n")  # not a trace header: ignored
    tabs, rep = read_client_results(exp)
    lc = tabs["lifecycle"]
    assert lc["source"].tolist() == ["inference_perf", "vllm_bench", "tracev2"]
    assert lc["experiment_id"].tolist() == ["exp1", "exp1/vllm_bench_rate4", "exp1/obs"]
    assert lc.loc[0, "decode_interval_s"] == pytest.approx(0.0097)
    req = tabs["client_requests"]
    assert len(req) == 32 and set(req["source"]) == {"vllm_bench", "tracev2"}
    assert rep.read["requests"] == 32 and rep.kept["lifecycle_rows"] == 3
    _balanced(rep)
    # a single lifecycle file is accepted too
    one, _ = read_client_results(exp / "results" / "summary_lifecycle_metrics.json")
    assert one["lifecycle"]["experiment_id"].tolist() == ["exp1"]


def test_dispatch_rejects_unknown_inputs(tmp_path: Path) -> None:
    for name, text in (("notes.txt", "hello"), ("x.json", '{"foo": 1}'),
                       ("x.yaml", "load: {}\n"), ("lone.csv", "a,b\n1,2\n")):
        p = tmp_path / name
        p.write_text(text)
        with pytest.raises(TraceFormatError, match="accepted client result formats") as ei:
            read_client_results(p)
        assert ei.value.file == str(p)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TraceFormatError, match="no client results found"):
        read_client_results(empty)
    with pytest.raises(TraceFormatError, match="no such file"):
        read_client_results(tmp_path / "absent")
    assert "vllm bench serve" in ACCEPTED_FORMATS and "TraceV2" in ACCEPTED_FORMATS


def test_add_folder_client_results_for_ingest(tmp_path: Path) -> None:
    shutil.copy(VLLM, tmp_path / "vllm_bench.json")
    (tmp_path / "broken.trace.yaml").write_text("trace_version: 3\ntime_unit: hours\n")
    (tmp_path / "broken.trace.csv").write_text("request_id\n")
    out: dict[str, pd.DataFrame] = {}
    rep = IngestReport()
    add_folder_client_results(out, tmp_path, "exp", rep)
    assert out["lifecycle"]["source"].tolist() == ["vllm_bench"]
    assert out["lifecycle"]["experiment_id"].tolist() == ["exp/vllm_bench"]
    assert rep.dropped["client_results:unreadable"] == 1 and rep.kept["requests_ok"] == 11


@pytest.mark.real
def test_dispatch_real_inference_perf_run(real_dir: Path) -> None:
    runs = sorted((real_dir / "h100-lifecycle").iterdir())
    if not runs:
        pytest.skip("no lifecycle runs")
    tabs, rep = read_client_results(runs[0])
    lc = tabs["lifecycle"]
    assert (lc["source"] == "inference_perf").all() and lc["stage"].iloc[0] == "summary"
    assert (lc["e2e_mean_s"] > lc["ttft_mean_s"]).all() and len(tabs["client_requests"]) == 0
    assert rep.kept["lifecycle_rows"] == len(lc) and rep.n_dropped == 0


def test_ingest_experiment_folder_picks_up_client_results(specs_dir: Path,
                                                          tmp_path: Path) -> None:
    from bayes_latency.data.experiment import ingest, load_tables

    exp = tmp_path / "exp-a"
    exp.mkdir()
    shutil.copy(specs_dir / "vllm-trace-format.example.jsonl", exp / "traces.jsonl")
    shutil.copy(VLLM, exp / "vllm_bench.json")
    report = ingest([exp], tmp_path / "out")
    lc = load_tables(tmp_path / "out")["lifecycle"]
    assert lc["experiment_id"].tolist() == ["exp-a"] and lc["source"].tolist() == ["vllm_bench"]
    assert lc["ttft_mean_s"].iloc[0] == pytest.approx(_vdoc()["mean_ttft_ms"] / 1e3)
    assert report.kept["requests_ok"] == 11 and report.kept["requests_failed"] == 1


def test_tracev2_non_streaming_requests_have_no_ttft(tmp_path: Path) -> None:
    df = _csv()
    df.loc[[0, 1], "streaming"] = "false"
    df.loc[2, "streaming"] = "maybe"
    tabs, rep = read_tracev2(_pair(tmp_path, df))
    req = tabs["client_requests"].set_index("request_id")
    assert req.loc[["2", "3"], "ttft_s"].isna().all() and req.loc[["2", "3"], "e2e_s"].gt(0).all()
    assert rep.dropped["malformed:streaming"] == 1 and any("non-streaming" in n for n in rep.notes)
    _balanced(rep)


def test_vllm_bench_burstiness(tmp_path: Path) -> None:
    doc = _vdoc()
    doc["burstiness"] = float("inf")  # constant inter-arrival times; json writes Infinity
    assert read_vllm_bench(_write(tmp_path, doc))[0]["lifecycle"]["burstiness"].iloc[0] == math.inf
    doc["burstiness"] = 0
    with pytest.raises(TraceFormatError) as ei:
        read_vllm_bench(_write(tmp_path, doc))
    assert ei.value.field == "burstiness"


# ------------------------------------------------------------------------------- fuzzing

_FUZZ = settings(max_examples=30, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                        HealthCheck.function_scoped_fixture])
# containers are built afresh per draw: ``st.just([[1.0, None]])`` handed out one shared list,
# which a later mutation could put inside itself (json.dumps: circular reference) and which kept
# the mutations of earlier examples
_WEIRD = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                   st.floats(allow_nan=True), st.text(max_size=6), st.builds(list),
                   st.builds(dict), st.builds(lambda: [[1.0, None]]))
_CELLS = st.one_of(st.sampled_from(["", "NaN", "-1", "1e400", "3.5", "abc", "-0", "true",
                                    "9223372036854775808", " 7 "]), st.text(max_size=5))


def _check_tables(tabs: dict[str, pd.DataFrame], rep: IngestReport) -> None:
    _balanced(rep)
    req = tabs["client_requests"]
    assert len(req) == rep.kept["requests_ok"] + rep.kept["requests_failed"]
    ok = req[req["status"] == "ok"]
    assert (ok["e2e_s"] >= 0).all() and not (ok["ttft_s"] < 0).any()


@_FUZZ
@given(data=st.data())
def test_vllm_bench_reader_survives_mutations(tmp_path: Path, data: st.DataObject) -> None:
    doc = _vdoc()
    keys = [k for k in doc if k != "generated_texts"]
    for _ in range(data.draw(st.integers(1, 4))):
        key = data.draw(st.sampled_from(keys))
        if isinstance(doc.get(key), list) and doc[key] and data.draw(st.booleans()):
            doc[key][data.draw(st.integers(0, len(doc[key]) - 1))] = data.draw(_WEIRD)
        elif data.draw(st.booleans()):
            doc.pop(key, None)
        else:
            doc[key] = data.draw(_WEIRD)
    try:
        tabs, rep = read_vllm_bench(_write(tmp_path, doc))
    except TraceFormatError:
        return
    _check_tables(tabs, rep)


@_FUZZ
@given(data=st.data())
def test_tracev2_reader_survives_mutations(tmp_path: Path, data: st.DataObject) -> None:
    lines = T_CSV.read_text().splitlines()
    rows = [ln.split(",") for ln in lines]
    for _ in range(data.draw(st.integers(1, 6))):
        r = data.draw(st.integers(0, len(rows) - 1))
        c = data.draw(st.integers(0, len(rows[r]) - 1))
        rows[r][c] = data.draw(_CELLS).replace(",", ";").replace("\n", " ")
    if data.draw(st.booleans()):
        rows.insert(data.draw(st.integers(1, len(rows))), rows[data.draw(st.integers(1, 20))])
    try:
        tabs, rep = read_tracev2(_pair(tmp_path, raw="\n".join(",".join(r) for r in rows)))
    except TraceFormatError:
        return
    _check_tables(tabs, rep)
