"""The ``inference-perf`` expansion of the BLIS harness: BLIS's own expansion of a profile.

Spec building, rows and report need neither BLIS nor the real data (a profile dict in the shape
of the real runs' ``profile.yaml``); the run through BLIS skips unless ``BLIS_BIN`` names an
executable.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from bayes_latency.cli.main import build_parser
from bayes_latency.study.blis import e2e as be
from bayes_latency.study.blis import report as br
from bayes_latency.study.blis.spec import (
    EXPANSIONS,
    PUBLISHED,
    BlisSetupError,
    RealRun,
    inference_perf_section,
    inference_perf_spec,
    stage_spec,
    workload_spec,
)
from tests.test_blis_e2e import DATA, blis_bin, tiny_run

# The shape of a real run's profile.yaml (Llama-2-70B TP4 general: two constant-rate stages).
PROFILE: dict[str, Any] = {
    "api": {"streaming": True, "type": "completion"},
    "data": {"shared_prefix": {"enable_multi_turn_chat": True, "num_unique_system_prompts": 9,
                               "num_users_per_system_prompt": 5, "output_len": 248,
                               "question_len": 447, "system_prompt_len": 100},
             "type": "shared_prefix"},
    "load": {"stages": [{"duration": 600, "rate": 8}, {"duration": 600, "rate": 20}],
             "type": "constant"},
    "server": {"ignore_eos": True, "model_name": "meta-llama/Llama-2-70b-hf", "type": "vllm"},
}
#: The fields BLIS's InferencePerfSpec reads (sim/workload/inference_perf.go, lines 15-34).
SHARED_PREFIX_KEYS = {"num_unique_system_prompts", "num_users_per_system_prompt",
                      "system_prompt_len", "question_len", "output_len", "enable_multi_turn_chat"}


def tiny_profile_run(stages: int = 2) -> RealRun:
    """:func:`tiny_run` with the profile document its stages came from (6 users)."""
    run = tiny_run(stages=stages)
    prof = {"data": {"shared_prefix": {"enable_multi_turn_chat": True,
                                       "num_unique_system_prompts": 3,
                                       "num_users_per_system_prompt": 2, "output_len": 60,
                                       "question_len": 200, "system_prompt_len": 64}},
            "load": {"stages": [{"duration": int(s.duration_s), "rate": s.rate}
                                for s in run.stages], "type": "constant"}}
    return dataclasses.replace(run, profile=prof)


def test_section_takes_every_field_from_the_profile(tmp_path: Path) -> None:
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(PROFILE))  # as on disk, then read back
    prof = yaml.safe_load(path.read_text())
    whole = inference_perf_section(prof)
    assert whole["stages"] == [{"rate": 8.0, "duration": 600}, {"rate": 20.0, "duration": 600}]
    assert set(whole) == {"stages", "shared_prefix"}
    assert set(whole["shared_prefix"]) == SHARED_PREFIX_KEYS
    assert whole["shared_prefix"] == {**PROFILE["data"]["shared_prefix"]}
    one = inference_perf_section(prof, stage=1, output_len=201)
    assert one["stages"] == [{"rate": 20.0, "duration": 600}]
    assert one["shared_prefix"]["output_len"] == 201
    assert isinstance(one["stages"][0]["duration"], int)  # BLIS reads an int64
    no_chat = copy.deepcopy(PROFILE)
    del no_chat["data"]["shared_prefix"]["enable_multi_turn_chat"]  # inference-perf's default
    assert inference_perf_section(no_chat)["shared_prefix"]["enable_multi_turn_chat"] is False


@pytest.mark.parametrize(("edit", "match"), [
    (lambda p: p["data"].pop("shared_prefix"), "no data.shared_prefix"),
    (lambda p: p["load"].update(stages=[]), "non-empty"),
    (lambda p: p["load"]["stages"][0].update(duration=600.5), r"stages\[0\].duration"),
    (lambda p: p["load"]["stages"][1].update(rate=0), r"stages\[1\].rate"),
    (lambda p: p["data"]["shared_prefix"].update(num_users_per_system_prompt=0),
     "num_users_per_system_prompt"),
    (lambda p: p["data"]["shared_prefix"].pop("question_len"), "question_len"),
])
def test_section_rejects_bad_profiles(edit: Any, match: str) -> None:
    prof = copy.deepcopy(PROFILE)
    edit(prof)
    with pytest.raises(BlisSetupError, match=match):
        inference_perf_section(prof)


def test_section_rejects_a_missing_stage() -> None:
    with pytest.raises(BlisSetupError, match="no load stage 2"):
        inference_perf_section(PROFILE, stage=2)


def test_spec_is_one_stage_of_the_profile_with_the_real_mean_output() -> None:
    run = tiny_profile_run()
    st = run.stages[1]
    spec = inference_perf_spec(run, st, seed=7)
    assert set(spec) == {"version", "seed", "num_requests", "inference_perf"}
    assert spec["seed"] == 7 and spec["num_requests"] == int(st.rate * st.duration_s) == 80
    ip = spec["inference_perf"]
    assert ip["stages"] == [{"rate": 40.0, "duration": 2}]
    sp = ip["shared_prefix"]
    assert sp["output_len"] == 40  # the stage's real mean, not the profile's 60
    assert (sp["num_unique_system_prompts"], sp["num_users_per_system_prompt"]) == (3, 2)
    assert (sp["system_prompt_len"], sp["question_len"]) == (64, 200)
    assert sp["enable_multi_turn_chat"] is True
    prof = inference_perf_spec(run, st, output_len="profile")
    assert prof["inference_perf"]["shared_prefix"]["output_len"] == 60
    yaml.safe_load(yaml.safe_dump(spec))  # serialisable
    assert workload_spec("inference-perf", run, st, seed=7) == spec
    assert workload_spec("prefix", run, st, seed=7) == stage_spec(run, st, seed=7)
    with pytest.raises(BlisSetupError, match="unknown expansion"):
        workload_spec("closed", run, st)
    with pytest.raises(BlisSetupError, match="output_len"):
        inference_perf_spec(run, st, output_len="p50")
    with pytest.raises(BlisSetupError, match="no profile"):
        inference_perf_spec(tiny_run(), tiny_run().stages[0])


def test_expansion_option() -> None:
    assert br.parse_expansion("both") == EXPANSIONS == ("prefix", "inference-perf")
    assert br.parse_expansion("inference-perf") == ("inference-perf",)
    with pytest.raises(BlisSetupError, match="--expansion"):
        br.parse_expansion("closed-loop")
    args = build_parser().parse_args(["study", "blis", "--expansion", "prefix"])
    assert args.expansion == "prefix"
    assert build_parser().parse_args(["study", "blis"]).expansion == "both"


def test_rows_and_report_pair_the_expansions(tmp_path: Path) -> None:
    """Rows, medians and every table of the report under both expansions (recorded metrics)."""
    rec = be.parse_metrics(DATA / "blis_metrics_small.json")
    runs = [tiny_profile_run(), tiny_run("reasoning")]
    jobs = []
    for ex, scale in (("prefix", 1.0), ("inference-perf", 2.0)):
        for r in runs:
            for src, i in [("blis-published", -1), ("export-mean", -1), ("export-draw", 0),
                           ("export-draw", 1)]:
                for st in r.stages:
                    f = scale * (1.0 + 0.05 * (i + 1))
                    res = be.StageResult(rec.ttft_s * f, rec.e2e_s * f, rec.output_tokens,
                                         rec.injected, rec.completed, rec.timed_out, 0,
                                         seconds=1.0, cpu_seconds=0.5)
                    jobs.append(be._Job(r, src, i, PUBLISHED, st, res, expansion=ex))
    kv = {("llama-2-7b", 1): 6886}
    t = be._table(runs, jobs, kv)
    assert list(t["expansion"]) == ["prefix"] * 4 + ["inference-perf"] * 4
    assert list(t["source"]) == ["blis-published", "export-mean"] * 4
    pre, ip = t.iloc[0], t.iloc[4]
    assert ip["sim_e2e_mean_s"] == pytest.approx(2.0 * pre["sim_e2e_mean_s"])
    assert t.iloc[5]["n_draws"] == 2  # the bands pool each expansion's draws only
    assert t.iloc[5]["band_e2e_mean_lo_s"] == pytest.approx(2 * t.iloc[1]["band_e2e_mean_lo_s"])
    dr = be._draw_table(runs, jobs, seed=42, draw_seeds=True)
    assert len(dr) == 8 and set(dr["expansion"]) == set(EXPANSIONS)
    summ = br.summarize_errors(t)
    assert list(zip(summ["source"], summ["expansion"], strict=True)) == [
        ("blis-published", "prefix"), ("export-mean", "prefix"),
        ("blis-published", "inference-perf"), ("export-mean", "inference-perf")]
    old = br.summarize_errors(t[t["expansion"] == "prefix"].drop(columns="expansion"))
    assert list(old["expansion"]) == ["prefix", "prefix"]  # tables from before the column
    res = be.StudyResult(table=t, runs=runs, setup=be.BlisSetup(Path("b"), Path("d"), Path("h")),
                         kv_blocks=kv, wall_s=1.0, invocations=len(jobs),
                         invocation_s=[1.0] * len(jobs), invocation_cpu_s=[0.5] * len(jobs),
                         n_draws=2, exports="exp", expansions=EXPANSIONS)
    md, _ = br.write_outputs(res, tmp_path)
    text = md.read_text()
    assert "- `prefix`:" in text and "- `inference-perf`:" in text
    assert "| blis-published | inference-perf | 1 |" in text
    for table_head in ("| expansion | run | E2E mean", "| expansion | run | real successes",
                       "| expansion | run | E2E real (s)"):
        assert table_head in text
    for ex in EXPANSIONS:  # every table has a row set per expansion
        assert text.count(f"| {ex} | llama-2-7b-tp1-general |") == 3  # 2 sources + bands
        assert text.count(f"| {ex} | llama-2-7b-tp1-reasoning |") == 5  # 2 x 2 + bands


# ------------------------------------------------------------------------------ with BLIS
def test_blis_expands_the_inference_perf_spec(tmp_path: Path) -> None:
    setup = be.check_blis(blis_bin())
    run = tiny_profile_run()
    both = be.run_study(setup, [run], n_draws=0, point_seeds=1, expansions=EXPANSIONS)
    assert both.invocations == 2 * 2 and both.expansions == EXPANSIONS
    t = both.table
    assert list(t["expansion"]) == list(EXPANSIONS)
    ip = t.iloc[1]
    # every round of every session ran: int(rate x duration) per stage, 40 + 80
    assert ip["sim_injected"] == 120 and ip["sim_completed"] == 120
    assert ip["sim_output_len_mean"] == pytest.approx(40.0)
    assert 0 < ip["sim_ttft_mean_s"] and ip["sim_e2e_mean_s"] > ip["sim_ttft_mean_s"]
    # the prefix numbers do not depend on what else is simulated
    alone = be.run_study(setup, [run], n_draws=0, point_seeds=1).table.iloc[0]
    for col in ("sim_e2e_mean_s", "sim_ttft_mean_s", "sim_e2e_p90_s", "sim_completed"):
        assert t.iloc[0][col] == alone[col]
    with pytest.raises(BlisSetupError, match="unknown expansion"):
        be.run_study(setup, [run], n_draws=0, expansions=("closed",))
