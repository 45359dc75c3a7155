"""Output lengths a replay runs: what the server generated, not what the client counted."""

from __future__ import annotations

import json
import math

import pytest

from bayes_latency.calibrate.stages import (
    client_stages,
    default_kv_blocks,
    empirical_pdf,
    generated_output_pdf,
    pdf_mean,
)
from bayes_latency.data.client.read import read_client_results

#: inference-perf quantiles of a stage whose model ends most texts early (the client's count).
COUNTED = {"min": 0.0, "p1": 3.0, "p5": 10.0, "p10": 26.0, "p25": 149.0, "median": 247.0,
           "p75": 248.0, "p90": 249.0, "p95": 249.0, "p99": 250.0, "p99.9": 251.0, "max": 251.0,
           "mean": 194.0}


@pytest.mark.parametrize("ignore_eos", [True, False, None])
def test_ignore_eos_runs_the_profiles_output_len(ignore_eos):
    pdf, generated = generated_output_pdf(COUNTED, {"ignore_eos": ignore_eos, "output_len": 247})
    if ignore_eos is True:
        assert (pdf, generated) == ({247: 1.0}, True)
    else:
        assert not generated and pdf == empirical_pdf(COUNTED)
        assert math.isclose(pdf_mean(pdf), 194.0, rel_tol=1e-6)
    assert generated_output_pdf(COUNTED, None) == (empirical_pdf(COUNTED), False)


def _folder(tmp_path, ignore_eos: bool):
    """An inference-perf result folder: one 5 req/s stage, counted outputs :data:`COUNTED`."""
    prof = {"api": {"streaming": True, "type": "completion"},
            "data": {"type": "shared_prefix", "shared_prefix": {
                "num_unique_system_prompts": 4, "num_users_per_system_prompt": 2,
                "system_prompt_len": 100, "question_len": 400, "output_len": 247}},
            "load": {"type": "constant", "stages": [{"rate": 5, "duration": 20}]},
            "server": {"ignore_eos": ignore_eos, "model_name": "meta-llama/Llama-2-7b-hf",
                       "type": "vllm"}}
    (tmp_path / "profile.yaml").write_text(json.dumps(prof), encoding="utf-8")
    res = tmp_path / "results"
    res.mkdir()

    def dist(mean: float) -> dict[str, float]:
        return {k: mean * f for k, f in (("min", 0.9), ("p10", 0.95), ("median", 1.0),
                                         ("p90", 1.05), ("max", 1.1))} | {"mean": mean}

    doc = {"load_summary": {"count": 100, "requested_rate": 5.0, "achieved_rate": 5.0,
                            "send_duration": 20.0},
           "successes": {"count": 100,
                         "latency": {"request_latency": dist(1.8),
                                     "time_to_first_token": dist(0.025)},
                         "prompt_len": dist(500.0), "output_len": COUNTED},
           "failures": {"count": 0}}
    for name in ("stage_0_lifecycle_metrics.json", "summary_lifecycle_metrics.json"):
        (res / name).write_text(json.dumps(doc), encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize("ignore_eos", [True, False])
def test_a_stage_replays_the_generated_lengths_and_says_so(tmp_path, ignore_eos):
    path = _folder(tmp_path, ignore_eos)
    tabs, _ = read_client_results(path)
    notes: list[str] = []
    (st,) = client_stages(tabs, "llama-2-7b", "H100", 1,
                          default_kv_blocks("llama-2-7b", "H100", 1), path=path, notes=notes)
    if ignore_eos:
        assert st.output_pdf == {247: 1.0}
        assert st.observed["output_len_mean"] == 247.0   # the decode interval's denominator
        assert len(notes) == 1 and "ignore_eos" in notes[0] and "194.0" in notes[0]
    else:
        assert math.isclose(pdf_mean(st.output_pdf), 194.0, rel_tol=1e-6)
        assert math.isclose(st.observed["output_len_mean"], 194.0)
        assert not notes


def test_real_short_counts_are_full_length_requests(real_dir):
    """The real Llama-2-7B runs: the client counts 10% of outputs at 26-64 tokens or fewer, yet
    E2E's p10 is within 12% of its median, so no request ended after a few decode steps (the
    profiles set ignore_eos); their stages replay the profile's output_len."""
    from bayes_latency.study.blis.spec import find_runs
    from bayes_latency.study.client.runs import client_stages as study_stages

    runs = [r for r in find_runs(real_dir, "llama-2-7b") if not r.stress]
    assert len(runs) == 3
    for r in runs:
        assert r.profile["server"]["ignore_eos"] is True
        for s in r.stages:
            doc = json.loads((r.path / "results" / f"stage_{s.index}_lifecycle_metrics.json")
                             .read_text(encoding="utf-8"))
            out = doc["successes"]["output_len"]
            e2e = doc["successes"]["latency"]["request_latency"]
            assert out["p10"] < 0.3 * s.output_len_mean
            assert e2e["p10"] > 0.88 * e2e["median"]
            assert s.output_pdf == {int(r.profile["data"]["shared_prefix"]["output_len"]): 1.0}
    for st in study_stages(runs):
        assert st.observed["output_len_mean"] == pdf_mean(st.output_pdf)
