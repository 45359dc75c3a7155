"""The BLIS end-to-end harness: specs, KV blocks, metric parsing, error maths, exports, CLI.

Fast tests need neither BLIS nor the real data (a recorded metrics JSON is in ``tests/data``);
tests that run BLIS skip unless ``BLIS_BIN`` names an executable; the one end-to-end run of a
real run is ``slow``.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from bayes_latency.cli.main import main as cli_main
from bayes_latency.study.blis import e2e as be
from bayes_latency.study.blis import report as br
from bayes_latency.study.blis.spec import (
    CLIENT_TIMEOUT_S,
    PUBLISHED,
    SUFFIX_TOKENS,
    BlisSetupError,
    Coefficients,
    RealRun,
    StageWorkload,
    empirical_pdf,
    export_path,
    find_runs,
    kv_blocks_per_gpu,
    load_export,
    pdf_mean,
    stage_spec,
    write_perturbed_exports,
)

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"
MODELS = ROOT / "bayes_latency" / "physics" / "data" / "models"

# Llama-2-70B as in its Hugging Face config.json (the fields the KV formula reads).
LLAMA70 = {"hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64,
           "num_key_value_heads": 8, "intermediate_size": 28672, "vocab_size": 32000,
           "hidden_act": "silu", "tie_word_embeddings": False}
MIXTRAL = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000,
           "num_local_experts": 8, "hidden_act": "silu", "tie_word_embeddings": False}
OUTPUT_LEN = {"mean": 193.7, "min": 0.0, "p0.1": 1.0, "p1": 5.0, "p5": 18.0, "p10": 40.0,
              "p25": 160.0, "median": 247.0, "p75": 248.0, "p90": 248.0, "p95": 249.0,
              "p99": 250.0, "p99.9": 251.0, "max": 252.0}


def tiny_run(workload: str = "general", count: int = 40, rate: float = 20.0,
             stages: int = 1) -> RealRun:
    """A small synthetic run of Llama-2-7B TP1 (seconds of simulated time)."""
    sts = tuple(StageWorkload(index=i, duration_s=count / rate, rate=rate * (i + 1),
                              count=count, output_pdf={20: 0.5, 60: 0.5}, output_len_mean=40.0)
                for i in range(stages))
    real = {"e2e_mean_s": 0.5, "e2e_p90_s": 0.8, "ttft_mean_s": 0.03, "ttft_p90_s": 0.04,
            "output_len_mean": 40.0, "decode_interval_s": (0.5 - 0.03) / 39.0,
            "successes": float(count * stages), "count": float(count * stages)}
    return RealRun(run_id=f"tiny-llama-2-7b-tp1-{workload}", path=Path("."), model="llama-2-7b",
                   hf_model="meta-llama/Llama-2-7b-hf", tp=1, workload=workload,
                   system_prompt_len=64, question_len=200, num_groups=3, users_per_group=2,
                   max_model_len=4096, max_num_seqs=128, max_num_batched_tokens=2048,
                   model_config=MODELS / "llama-2-7b.json", stages=sts, real=real)


def blis_bin() -> str:
    b = os.environ.get("BLIS_BIN")
    if not b or not os.path.isfile(b) or not os.access(b, os.X_OK):
        pytest.skip("BLIS_BIN is not set to an executable BLIS binary")
    return b


# ------------------------------------------------------------------------------ spec building
def test_empirical_pdf_matches_quantiles_and_mean() -> None:
    pdf = empirical_pdf(OUTPUT_LEN)
    assert min(pdf) >= 1 and max(pdf) == 252
    assert math.isclose(sum(pdf.values()), 1.0, rel_tol=1e-9)
    assert pdf_mean(pdf) == pytest.approx(193.7, rel=1e-6)  # tilted to the real mean
    no_mean = empirical_pdf({k: v for k, v in OUTPUT_LEN.items() if k != "mean"})
    keys = np.array(sorted(no_mean))
    cdf = np.cumsum([no_mean[k] for k in keys])
    # Untilted: the CDF passes through the reported quantiles (within one integer's mass).
    assert cdf[keys == 160][0] == pytest.approx(0.25, abs=0.01)
    assert cdf[keys == 40][0] == pytest.approx(0.10, abs=0.01)
    assert empirical_pdf({"min": 250, "max": 250}) == {250: 1.0}


def test_empirical_pdf_rejects_bad_quantiles() -> None:
    from bayes_latency.errors import TraceFormatError

    with pytest.raises(TraceFormatError, match="fewer than two"):
        empirical_pdf({"mean": 3.0})
    with pytest.raises(TraceFormatError, match="decrease"):
        empirical_pdf({"min": 10, "median": 5, "max": 20})


def test_stage_spec_is_open_loop_with_real_rate_count_prefix_and_outputs() -> None:
    run = tiny_run(stages=2)
    spec = stage_spec(run, run.stages[1], seed=7)
    assert spec["aggregate_rate"] == 40.0 and spec["num_requests"] == 40 and spec["seed"] == 7
    assert spec["horizon"] == int((2.0 + 1800.0) * 1e6)
    cl = spec["clients"]
    assert len(cl) == 6 and len({c["id"] for c in cl}) == 6
    # each user resends one prompt: its client's prefix group caches the whole prompt
    assert {c["tenant_id"] for c in cl} == {"prompt-0", "prompt-1", "prompt-2"}
    assert {c["prefix_group"] for c in cl} == {c["id"] for c in cl}
    for c in cl:
        assert c["arrival"] == {"process": "poisson"} and c["rate_fraction"] == 1.0
        assert "reasoning" not in c and "closed_loop" not in c and "lifecycle" not in c
        assert c["prefix_length"] == 64 + 200 - SUFFIX_TOKENS
        assert c["input_distribution"] == {"type": "constant",
                                           "params": {"value": float(SUFFIX_TOKENS)}}
        assert c["output_distribution"] == {"type": "empirical",
                                            "params": {"20": 0.5, "60": 0.5}}
    yaml.safe_load(yaml.safe_dump(spec))  # serialisable
    stress = stage_spec(tiny_run("reasoning"), tiny_run("reasoning").stages[0])
    assert stress["horizon"] == int((2.0 + CLIENT_TIMEOUT_S + 60) * 1e6)


def test_kv_blocks_per_gpu_is_blis_auto_value_over_tp() -> None:
    # BLIS's auto value for Llama-2-70B TP4 on H100 is 124,207 (TP x too many); vLLM logged 31,356.
    k = kv_blocks_per_gpu(LLAMA70, 4)
    assert k == 124207 // 4
    assert abs(k / 31356 - 1) < 0.02
    assert kv_blocks_per_gpu(LLAMA70, 8) > k  # more GPUs, more room per GPU after weights
    assert kv_blocks_per_gpu(MIXTRAL, 2) < kv_blocks_per_gpu({**MIXTRAL,
                                                             "num_local_experts": 1}, 2)
    with pytest.raises(BlisSetupError, match="does not fit"):
        kv_blocks_per_gpu(LLAMA70, 1)
    with pytest.raises(BlisSetupError, match="lacks a field"):
        kv_blocks_per_gpu({"hidden_size": 1}, 1)


def test_blis_command_flags(tmp_path: Path) -> None:
    setup = be.BlisSetup(Path("/x/blis"), Path("/x/defaults.yaml"), Path("/x/hw.json"))
    run = tiny_run()
    cmd = be.blis_command(setup, run, PUBLISHED, tmp_path / "s.yaml", tmp_path / "m.json",
                          tmp_path / "model", 1234)

    def flag(name: str, c: list[str] = cmd) -> str:
        return c[c.index(name) + 1]

    assert cmd[:2] == ["/x/blis", "run"]
    assert flag("--total-kv-blocks") == "1234" and flag("--tp") == "1"
    assert flag("--max-num-seqs") == "128" and flag("--max-num-batched-tokens") == "2048"
    assert flag("--block-size-in-tokens") == "16" and flag("--hardware") == "H100"
    assert flag("--timeout") == "-1"
    assert [float(v) for v in flag("--alpha-coeffs").split(",")] == list(PUBLISHED.alpha)
    assert [float(v) for v in flag("--beta-coeffs").split(",")] == list(PUBLISHED.beta)
    stress = be.blis_command(setup, tiny_run("reasoning"), PUBLISHED, tmp_path / "s.yaml",
                             tmp_path / "m.json", tmp_path / "model", 1234)
    assert flag("--timeout", stress) == str(CLIENT_TIMEOUT_S)


# ------------------------------------------------------------------------------ metrics / maths
def test_parse_recorded_metrics_drops_timed_out_requests() -> None:
    # Recorded once with BLIS f90a1e3: 40 requests, 3 s deadline, 21 timed out (e2e_ms == 0).
    res = be.parse_metrics(DATA / "blis_metrics_small.json")
    assert res.injected == 40 and res.completed == 19 and res.timed_out == 21
    assert len(res.e2e_s) == 19 and (res.e2e_s > res.ttft_s).all()
    doc = json.loads((DATA / "blis_metrics_small.json").read_text())
    assert res.e2e_s.mean() * 1e3 == pytest.approx(doc["e2e_mean_ms"], rel=1e-9)
    assert res.ttft_s.max() < 1.0


def test_parse_metrics_errors(tmp_path: Path) -> None:
    with pytest.raises(BlisSetupError, match="BLIS metrics"):
        be.parse_metrics(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text('{"completed_requests": 1}')
    with pytest.raises(BlisSetupError, match="no requests list"):
        be.parse_metrics(tmp_path / "bad.json")


def test_pool_stages_errors_and_bands() -> None:
    a = be.StageResult(np.array([0.1, 0.1]), np.array([1.0, 2.0]), np.array([10.0, 20.0]),
                       2, 2, 0, 0, seconds=1.0)
    b = be.StageResult(np.array([0.4]), np.array([3.0]), np.array([30.0]), 2, 1, 1, 0,
                       seconds=2.0)
    s = be.pool_stages([a, b], real_output_len_mean=21.0)
    assert s.e2e_mean == pytest.approx(2.0) and s.ttft_mean == pytest.approx(0.2)
    assert s.decode_interval == pytest.approx((2.0 - 0.2) / 20.0)
    assert s.e2e_p90 == pytest.approx(np.percentile([1.0, 2.0, 3.0], 90))
    assert (s.completed, s.injected, s.timed_out, s.seconds) == (3, 4, 1, 3.0)
    assert be.rel_err(1.1, 1.0) == pytest.approx(0.1)
    assert be.rel_err(0.8, 1.0) == pytest.approx(-0.2)
    assert math.isnan(be.rel_err(1.0, 0.0)) and math.isnan(be.rel_err(math.nan, 1.0))
    vals = np.linspace(0.9, 1.1, 21)
    bd = be.band(vals, 1.0)  # 21 values: k = floor(22 x 0.05) = 1, the extremes
    assert bd["lo"] == pytest.approx(0.9) and bd["hi"] == pytest.approx(1.1)
    assert bd["inside"] == 1.0 and bd["width"] == pytest.approx(0.2)
    assert bd["nominal"] == pytest.approx(20 / 22)
    assert be.band(vals, 1.2)["inside"] == 0.0
    assert math.isnan(be.band([1.0], 1.0)["lo"])
    # 59 values: k = 3, the 3rd smallest and largest, 90% exactly
    b59 = be.band(np.arange(1.0, 60.0), 30.0)
    assert (b59["lo"], b59["hi"], b59["nominal"]) == (3.0, 57.0, pytest.approx(0.9))


def test_band_covers_a_new_exchangeable_value_at_its_nominal_rate() -> None:
    """20 draws: the band holds a 21st draw of the same distribution 90.5% of the time (the
    interpolated 5%-95% quantiles held it 81%)."""
    rng = np.random.default_rng(0)
    x = rng.lognormal(0.0, 0.2, size=(4000, 21))
    inside = [be.band(r[:20], r[20])["inside"] for r in x]
    assert 0.88 <= np.mean(inside) <= 0.93
    q = np.quantile(x[:, :20], [0.05, 0.95], axis=1)
    assert np.mean((q[0] <= x[:, 20]) & (x[:, 20] <= q[1])) < 0.85


def test_summarize_errors_medians_over_normal_runs_only() -> None:
    rows = []
    for i, err in enumerate([0.1, -0.2, 0.3, 5.0]):
        row = {"source": "blis-published", "stress": i == 3}
        for m in br.METRICS:
            row[f"err_{m}"] = err
        rows.append(row)
    s = br.summarize_errors(pd.DataFrame(rows)).iloc[0]
    assert s["runs"] == 3 and s["median_abs_err_e2e_mean"] == pytest.approx(0.2)


# ------------------------------------------------------------------------------ exports / setup
def test_exports_round_trip_and_validation(tmp_path: Path) -> None:
    (p,) = write_perturbed_exports(tmp_path, [("llama-2-7b", 1)], n_draws=5, sigma=0.1)
    assert p == export_path(tmp_path, "llama-2-7b", 1) and p.name == "llama-2-7b-h100-tp1.yaml"
    mean, draws = load_export(p)
    assert mean.alpha == PUBLISHED.alpha and mean.beta == PUBLISHED.beta and len(draws) == 5
    assert draws[0].beta != PUBLISHED.beta and draws[0].beta[1] == 0.0  # zeros stay zero
    doc = yaml.safe_load(p.read_text())
    doc["trained_physics_coefficients"]["beta_coeffs"] = list(PUBLISHED.beta[:10])
    p.write_text(yaml.safe_dump(doc))
    with pytest.raises(BlisSetupError, match="10 beta_coeffs; BLIS trained-physics wants 3 and 11"):
        load_export(p)
    p.write_text("trained_physics_coefficients: [")
    with pytest.raises(BlisSetupError, match="not readable YAML"):
        load_export(p)
    with pytest.raises(BlisSetupError, match="export missing"):
        load_export(tmp_path / "nope.yaml")
    with pytest.raises(BlisSetupError, match="finite"):
        Coefficients((1.0, 2.0, math.nan), PUBLISHED.beta)


def test_check_blis_rejects_missing_and_non_blis(tmp_path: Path) -> None:
    with pytest.raises(BlisSetupError, match="no BLIS binary"):
        be.check_blis(None)
    with pytest.raises(BlisSetupError, match="not an executable"):
        be.check_blis(tmp_path / "blis")
    fake = tmp_path / "fake"
    fake.write_text("#!/bin/sh\necho usage\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(BlisSetupError, match="is not BLIS"):
        be.check_blis(fake)


def test_cli_one_line_error_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                       ) -> None:
    rc = cli_main(["study", "blis", "--blis", str(tmp_path / "none"), "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "not an executable" in err


def test_real_runs_are_read(real_dir: Path) -> None:
    runs = find_runs(real_dir)
    assert len(runs) == 16 and sum(r.stress for r in runs) == 4
    by = {r.short_id: r for r in runs}
    r = by["llama-2-70b-tp4-general"]
    assert [s.count for s in r.stages] == [4800, 12000]
    assert [round(s.rate) for s in r.stages] == [8, 20]
    assert (r.system_prompt_len, r.question_len, r.num_groups, r.users_per_group) == \
        (100, 447, 9, 5)
    for run in runs:
        for s in run.stages:
            assert pdf_mean(s.output_pdf) == pytest.approx(s.output_len_mean, rel=1e-4)
    assert by["llama-2-7b-tp1-reasoning"].real["successes"] == 732
    assert len(find_runs(real_dir, "mixtral")) == 4


# ------------------------------------------------------------------------------ with BLIS
def test_tiny_run_through_blis_with_fake_exports(tmp_path: Path) -> None:
    setup = be.check_blis(blis_bin())
    runs = [tiny_run(stages=2), tiny_run("reasoning")]
    write_perturbed_exports(tmp_path / "exp", [("llama-2-7b", 1)], n_draws=4, sigma=0.2)
    res = be.run_study(setup, runs, exports=tmp_path / "exp", n_draws=4, parallel=2,
                       point_seeds=1)
    t = res.table
    assert list(t["source"]) == ["blis-published", "export-mean"] * 2
    assert res.invocations == 2 * (1 + 1 + 4) + 1 * (1 + 1 + 4)
    pub, mean = t.iloc[0], t.iloc[1]
    assert pub["sim_injected"] == 80 and pub["sim_completed"] == 80
    # The fake export's mean IS the published block: same simulation, same numbers.
    assert mean["sim_e2e_mean_s"] == pytest.approx(pub["sim_e2e_mean_s"], rel=1e-12)
    assert mean["n_draws"] == 4 and mean["band_e2e_mean_lo_s"] < mean["band_e2e_mean_hi_s"]
    md, csv = br.write_outputs(res, tmp_path / "out")
    assert "90% bands" in md.read_text() and len(pd.read_csv(csv)) == 4
    with pytest.raises(BlisSetupError, match="draws"):
        be.run_study(setup, runs, exports=tmp_path / "exp", n_draws=5)
    # In-memory coefficients (e.g. a fit in a loop) instead of export files.
    # Identical draws: with one workload seed for every set the band is a point; with a seed
    # per draw (the default) it holds the arrivals' scatter.
    src = {("llama-2-7b", 1): (PUBLISHED, [PUBLISHED] * 3)}
    mem = be.run_study(setup, runs[:1], n_draws=2, sources=src, draw_seeds=False,
                       point_seeds=1)
    row = mem.table.iloc[1]
    assert row["n_draws"] == 2 and row["band_e2e_mean_width"] == 0.0
    assert row["sim_e2e_mean_s"] == pytest.approx(pub["sim_e2e_mean_s"], rel=1e-12)
    own = be.run_study(setup, runs[:1], n_draws=2, sources=src, point_seeds=1).table.iloc[1]
    assert own["band_e2e_mean_width"] > 0.0
    assert own["sim_e2e_mean_s"] == pytest.approx(pub["sim_e2e_mean_s"], rel=1e-12)
    # The point over 3 arrival realizations (seeds 42, 1043, 1044) pools their requests: its
    # mean is the mean of the three one-seed points; the published set keeps seed 42 only.
    three = be.run_study(setup, runs[:1], n_draws=0, sources=src, point_seeds=3)
    assert three.invocations == 2 * (1 + 3) and three.point_seeds == 3
    pt3 = three.table.iloc[1]
    assert pt3["point_seeds"] == 3 and pt3["e2e_mean_seed_sd"] > 0.0
    assert pt3["sim_injected"] == pub["sim_injected"]  # counts per realization
    ones = [be.run_study(setup, runs[:1], n_draws=0, sources=src, point_seeds=1,
                         seed=be.point_seed(42, k)).table.iloc[1]["sim_e2e_mean_s"]
            for k in range(3)]
    assert pt3["sim_e2e_mean_s"] == pytest.approx(np.mean(ones), rel=1e-9)
    assert three.table.iloc[0]["sim_e2e_mean_s"] == pytest.approx(pub["sim_e2e_mean_s"],
                                                                   rel=1e-12)
    # An extra labelled point set gets rows of its own, simulated over the point's arrival
    # realizations like export-mean (the same coefficients give the same numbers), no band.
    extra = {("llama-2-7b", 1): (PUBLISHED, [PUBLISHED] * 3, {"export-median": PUBLISHED})}
    both = be.run_study(setup, runs[:1], n_draws=0, sources=extra, point_seeds=3)
    assert list(both.table["source"]) == ["blis-published", "export-mean", "export-median"]
    assert both.invocations == 2 * (1 + 3 + 3)
    med = both.table.iloc[2]
    assert med["point_seeds"] == 3 and "n_draws" not in med.dropna().index
    assert med["sim_e2e_mean_s"] == pytest.approx(pt3["sim_e2e_mean_s"], rel=1e-12)
    for label in ("median", "export-mean", "export-draw"):
        with pytest.raises(BlisSetupError, match="extra point set"):
            be.run_study(setup, runs[:1], n_draws=0, sources={
                ("llama-2-7b", 1): (PUBLISHED, [], {label: PUBLISHED})})


def test_draw_seed() -> None:
    assert be.draw_seed(42, -1) == 42 and be.draw_seed(42, 0) == 43 and be.draw_seed(42, 7) == 50
    assert be.draw_seed(42, 3, draw_seeds=False) == 42
    # the point's realizations: the first shares the published seed, none meets a draw's
    assert be.point_seed(42, 0) == 42 and be.point_seed(42, 2) == 1044
    draws = {be.draw_seed(42, i) for i in range(500)}
    assert not draws & {be.point_seed(42, k) for k in range(1, 50)}


@pytest.mark.slow
def test_one_real_run_end_to_end(real_dir: Path, tmp_path: Path) -> None:
    blis = blis_bin()
    write_perturbed_exports(tmp_path / "exp", [("llama-2-70b", 4)], n_draws=3, sigma=0.05)
    rc = cli_main(["study", "blis", "--blis", blis, "--exports", str(tmp_path / "exp"),
                   "--draws", "3", "--runs", "70b-tp4-general", "--data", str(real_dir),
                   "--out", str(tmp_path / "out")])
    assert rc == 0
    t = pd.read_csv(tmp_path / "out" / "blis_e2e.csv")
    # both expansions (the default): every round of the closed-loop sessions runs too
    assert len(t) == 4 and (t["sim_completed"] == 16800).all()
    assert list(t["expansion"]) == ["prefix"] * 2 + ["inference-perf"] * 2
    pub = t[(t["source"] == "blis-published") & (t["expansion"] == "prefix")].iloc[0]
    # Published coefficients on this run (measured at f90a1e3): E2E within 10%, TTFT ~ -50%.
    assert abs(pub["err_e2e_mean"]) < 0.10 and abs(pub["err_decode_interval"]) < 0.10


def test_table_and_report_from_recorded_metrics(tmp_path: Path) -> None:
    """Rows, bands and the Markdown report without BLIS (every job gets the recorded result)."""
    rec = be.parse_metrics(DATA / "blis_metrics_small.json")
    runs = [tiny_run(stages=2), tiny_run("reasoning")]
    jobs = []
    for r in runs:
        sets = [("blis-published", -1), ("export-mean", -1)] + [("export-draw", i)
                                                                 for i in range(3)]
        for src, i in sets:
            for st in r.stages:
                scale = 1.0 + 0.05 * (i + 1)  # the draws differ from each other
                res = be.StageResult(rec.ttft_s * scale, rec.e2e_s * scale, rec.output_tokens,
                                     rec.injected, rec.completed, rec.timed_out, 0, seconds=1.0,
                                     cpu_seconds=0.5)
                jobs.append(be._Job(r, src, i, PUBLISHED, st, res))
    kv = {("llama-2-7b", 1): 6886}
    t = be._table(runs, jobs, kv)
    assert len(t) == 4 and list(t["source"]) == ["blis-published", "export-mean"] * 2
    m = t.iloc[1]
    assert m["n_draws"] == 3 and m["sim_completed"] == 38 and m["blis_cpu_seconds"] == 4.0
    draws_e2e = [rec.e2e_s.mean() * (1 + 0.05 * (i + 1)) for i in range(3)]
    assert m["band_e2e_mean_lo_s"] == pytest.approx(min(draws_e2e))  # 3 draws: the extremes
    assert m["band_e2e_mean_hi_s"] == pytest.approx(max(draws_e2e))
    dr = be._draw_table(runs, jobs, seed=42, draw_seeds=True)
    assert len(dr) == 6  # 2 runs x 3 draws
    first = dr[dr["run_id"] == m["run_id"]]
    assert list(first["workload_seed"]) == [43, 44, 45]
    assert first["e2e_mean_s"].tolist() == pytest.approx(draws_e2e)
    assert m["e2e_mean_in_band"] == 0.0  # real 0.5 s is outside
    res = be.StudyResult(table=t, runs=runs, setup=be.BlisSetup(Path("b"), Path("d"), Path("h")),
                         kv_blocks=kv, wall_s=1.0, invocations=len(jobs),
                         invocation_s=[1.0] * len(jobs), invocation_cpu_s=[0.5] * len(jobs),
                         n_draws=3, exports="exp")
    md, csv = br.write_outputs(res, tmp_path)
    text = md.read_text()
    assert "Median |error| over the 1 normal runs" in text and "stress" in text
    assert "90% bands" in text and "tiny-llama-2-7b-tp1-general" not in text  # short ids
    assert len(pd.read_csv(csv)) == 4 and not list(tmp_path.glob(".*.tmp"))


def test_cli_keeps_study_real() -> None:
    from bayes_latency.cli.main import build_parser

    args = build_parser().parse_args(["study", "real", "--quick"])
    assert args.name == "real" and args.quick
    args = build_parser().parse_args(["study", "blis", "--draws", "3", "--runs", "70b"])
    assert (args.name, args.draws, args.runs, args.exports) == ("blis", 3, "70b", None)


def test_point_pools_its_arrival_realizations() -> None:
    """The ``export-mean`` row over several workload seeds: requests pooled (the mean of the
    realizations' means), counts per realization, relative sd over them reported."""
    rec = be.parse_metrics(DATA / "blis_metrics_small.json")
    run = tiny_run(stages=2)
    jobs = []
    for src, rep, scale in (("blis-published", 0, 1.0), ("export-mean", 0, 1.0),
                            ("export-mean", 1, 1.3), ("export-mean", 2, 0.7)):
        for st in run.stages:
            res = be.StageResult(rec.ttft_s * scale, rec.e2e_s * scale, rec.output_tokens,
                                 rec.injected, rec.completed, rec.timed_out, 0, seconds=1.0,
                                 cpu_seconds=0.5)
            jobs.append(be._Job(run, src, -1, PUBLISHED, st, res, rep=rep))
    t = be._table([run], jobs, {("llama-2-7b", 1): 6886})
    pub, pt = t.iloc[0], t.iloc[1]
    assert pub["point_seeds"] == 1 and math.isnan(pub["e2e_mean_seed_sd"])
    assert pt["point_seeds"] == 3 and pt["sim_completed"] == pub["sim_completed"]
    assert pt["sim_e2e_mean_s"] == pytest.approx(pub["sim_e2e_mean_s"])  # (1.0 + 1.3 + 0.7) / 3
    assert pt["ttft_mean_seed_sd"] == pytest.approx(0.3)  # sd of (1.0, 1.3, 0.7) over its mean


def test_stage_ttft_table_groups_stages_by_rate() -> None:
    from types import SimpleNamespace

    from bayes_latency.study.client.blis import _stage_ttft_lines, stage_ttft_table

    pred = pd.DataFrame({"experiment_id": ["a/stage0", "a/stage1", "a/stage1"],
                         "kind": ["workload_ttft", "workload_ttft", "workload_e2e"],
                         "observed_us": [20e3, 50e3, 4e6], "mean_us": [21e3, 40e3, 4e6]})
    stages = [SimpleNamespace(run_id="a", stage=0, rate=8.0012),
              SimpleNamespace(run_id="a", stage=1, rate=19.996)]
    t = stage_ttft_table(pred, stages)
    assert list(t["rate"]) == [8.0, 20.0] and t["error"].tolist() == pytest.approx([0.05, -0.2])
    text = "\n".join(_stage_ttft_lines(t, ["a/stage1/workload_ttft"]))
    assert "20 req/s: 1 stages, TTFT error -20.0%" in text
    assert "| a/stage1 | 20 | 50.0 | 40.0 | -20.0% | no |" in text


def test_client_parts_record_their_model_version(tmp_path: Path) -> None:
    import time

    from bayes_latency import MODEL_VERSION
    from bayes_latency.study.client.blis import render
    from bayes_latency.study.client.parts import current_part, part_record, read_parts, write_part

    assert read_parts(tmp_path) == {}
    rec = part_record(time.perf_counter() - 90.0, 1.0, complete=False, done=3)
    assert rec["model_version"] == MODEL_VERSION and rec["done"] == 3
    assert rec["wall_s"] >= 90.0 and " cores, 1-minute load average 1.0 at the start" in rec["machine"]
    write_part(tmp_path, "loro", rec)
    write_part(tmp_path, "lomo", {**rec, "model_version": "0", "complete": True})
    parts = read_parts(tmp_path)
    assert current_part(parts["loro"]) and not current_part(parts["lomo"])
    assert not current_part(None)  # tables without a record are of an unknown version

    hist = pd.DataFrame({"iteration": [1], "max_elasticity": [2.0]})
    res = {"calibration": {"converged": True, "final_change": 0.001}, "history": hist,
           "terms": ["per_step"], "n_draws": 20, "settings": "s", "cv_settings": "s",
           "replay_s": 1.0, "calibrate_s": 10.0, "runtime_s": 60.0,
           "fits": pd.DataFrame({"fit": ["calibrated (all)"], "model_version": [MODEL_VERSION]}),
           "parts": {"loro": parts["loro"]}, "stale": ["`lomo.csv` (model version 0)"]}
    text = render(res)
    assert f"| loro | {MODEL_VERSION} | " in text and "| no (3 left out so far) |" in text
    assert f"not made by model version {MODEL_VERSION}" in text
    assert "`lomo.csv` (model version 0)" in text and "## Leave-one-model-out" not in text


def test_client_readme_names_the_failed_fits_of_a_part() -> None:
    from bayes_latency.study.client.blis import _failed_fit_lines

    fits = pd.DataFrame({"fit": ["calibrated (all)", "without run a", "without run b",
                                 "without model m"],
                         "passed": [True, True, False, False], "max_rhat": [1.0, 1.0, 1.83, 1.2],
                         "min_ess_bulk": [500.0, 480.0, 2.9, 40.0]})
    loro = " ".join(_failed_fit_lines(fits, "loro"))
    assert "`without run b` (max R-hat 1.83, min bulk ESS 3)" in loro and "run a" not in loro
    assert "without model m" in " ".join(_failed_fit_lines(fits, "lomo"))
    assert _failed_fit_lines(fits, "insample") == [] and _failed_fit_lines(None, "loro") == []
    # a table with the chains_disagree column: the line says where the failed fit's chains disagree
    from bayes_latency.model.inference.convergence import DISAGREEMENT_ADVICE

    hint = ("the chains disagree most on alpha[m|H100-SXM|tp2, alpha_per_token] (R-hat 1.83, "
            "chain medians 1.063e+04 / 16.95). " + DISAGREEMENT_ADVICE)
    with_hint = fits.assign(chains_disagree=["", "", hint, ""])
    loro = " ".join(_failed_fit_lines(with_hint, "loro"))
    assert ("`without run b` (max R-hat 1.83, min bulk ESS 3; the chains disagree most on "
            "alpha[m|H100-SXM|tp2, alpha_per_token] (R-hat 1.83, chain medians 1.063e+04 / "
            "16.95))") in loro
    assert "If more draws" not in loro


def test_resumed_calibrated_fit_keeps_the_sampled_fits_gate_decision() -> None:
    from types import SimpleNamespace

    from bayes_latency.study.client.blis import _resumed_conv_row

    class _Result(dict):
        attrs = {"thinned_by": 25, "sampler_settings": '{"target_accept": 0.995}',
                 "extension": '[{"draws": 9000, "decision": "continue"}, '
                              '{"draws": 10000, "decision": "pass"}]'}

    thinned = SimpleNamespace(  # the saved file's own diagnostics fail the ESS gate
        result=_Result(posterior=SimpleNamespace(sizes={"draw": 400})),
        convergence=lambda: {"passed": False, "max_rhat": 1.011, "min_ess_bulk": 329.0,
                             "divergences": 0})
    row = _resumed_conv_row(thinned, None, 161.0)
    assert row["passed"] and row["fit"] == "calibrated (all; saved file, every 25th draw)"
    assert row["min_ess_bulk"] == 329.0 and row["draws"] == 400
    sampled = {"fit": "calibrated (all)", "passed": True, "min_ess_bulk": 407.0}
    assert _resumed_conv_row(thinned, {"fit": sampled}, 161.0) == sampled


def test_sources_for_adds_the_draws_median_as_a_point_set(tiny_posterior) -> None:
    from bayes_latency.export.document import blis_block
    from bayes_latency.model.estimator import LatencyModel
    from bayes_latency.study.client.blis import GPU, sources_for

    m = LatencyModel.load(tiny_posterior[1])
    plain = sources_for(m, [("llama-2-7b", 1)], n_draws=0)
    assert len(plain[("llama-2-7b", 1)]) == 2
    mean, draws, extra = sources_for(m, [("llama-2-7b", 1)], n_draws=0, median=True)[
        ("llama-2-7b", 1)]
    assert draws == [] and list(extra) == ["export-median"] and mean.label == "export-mean"
    cfg = {"model": "llama-2-7b", "gpu": GPU, "tp": 1}
    block = blis_block(m.coefficients("llama-2-7b", GPU, 1, seed=0), "median", cfg)
    med = extra["export-median"]
    np.testing.assert_allclose(med.beta, block["trained_physics_coefficients"]["beta_coeffs"],
                               rtol=1e-12)
    np.testing.assert_allclose(med.alpha, block["trained_physics_coefficients"]["alpha_coeffs"],
                               rtol=1e-12)
    assert med.beta != mean.beta
