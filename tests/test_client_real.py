"""Client rows of the real runs (needs ../shared/data/real): stages, replay and a calibrated fit."""

from __future__ import annotations

import numpy as np
import pytest

from bayes_latency.study.realdata import real_data_dir

DATA = real_data_dir()
pytestmark = pytest.mark.skipif(DATA is None, reason="real data absent (../shared/data/real)")


@pytest.fixture(scope="module")
def runs():
    from bayes_latency.study.blis.spec import find_runs

    return find_runs(DATA)


def test_stages_of_the_normal_runs(runs):
    from bayes_latency.study.client.runs import client_stages

    st = client_stages(runs)
    assert len(st) == 20                      # 12 normal runs, 1-2 load stages each
    assert {s.model for s in st} == {"llama-2-7b", "llama-2-70b", "codellama-34b",
                                     "mixtral-8x7b"}
    for s in st:
        assert 0.015e6 < s.observed["ttft_mean_us"] < 0.2e6
        assert 1e6 < s.observed["e2e_mean_us"] < 10e6
        assert s.num_groups >= 5 and s.users_per_group >= 1
    assert len(client_stages(runs, include_stress=True)) == 24


def test_replay_of_a_real_stage_is_near_the_real_means(runs):
    """At the committed exports' means (fitted on traces + client rows in the study), the
    package's own replay of a light stage lands within 10% of the real E2E."""
    from pathlib import Path

    from bayes_latency.physics.basis import ALPHA_TERMS, DEFAULT_TERMS, get_term
    from bayes_latency.physics.hardware import load_gpu
    from bayes_latency.physics.models import load_architecture
    from bayes_latency.schedule.replay import predicted_means, replay_stage
    from bayes_latency.study.blis.spec import export_path, load_export
    from bayes_latency.study.client.runs import client_stages

    exports = Path(__file__).resolve().parents[1] / "results" / "real" / "exports"
    st = [s for s in client_stages(runs) if s.run_id == "llama-2-70b-tp4-codegen"][0]
    mean, _ = load_export(export_path(exports, "llama-2-70b", 4))
    beta = np.array([mean.beta[get_term(t).blis_index] for t in DEFAULT_TERMS])
    rep = replay_stage(st, load_architecture("llama-2-70b"), load_gpu("H100"), beta)
    p = predicted_means(rep, beta, dict(zip(ALPHA_TERMS, mean.alpha, strict=True)))
    assert p["workload_e2e"] / st.observed["e2e_mean_us"] == pytest.approx(1.0, abs=0.10)


@pytest.mark.slow
def test_calibrated_fit_of_one_configuration(runs):
    """CodeLlama-34B TP2: its H100 step rows and its 3 normal runs' client rows, calibrated:
    every stage's replayed mean E2E within 5% and TTFT within 15% of the real one."""
    from bayes_latency.calibrate.loop import client_predictions
    from bayes_latency.physics.basis import DEFAULT_TERMS
    from bayes_latency.study.client.runs import calibrated_fit, client_stages
    from bayes_latency.study.realdata import load_real_data
    from bayes_latency.study.settings import REAL_TERMS, FitSettings

    data = load_real_data(DATA)
    base = data.observations[data.observations["model"] == "codellama-34b"]
    base = base.reset_index(drop=True)
    st = [s for s in client_stages(runs) if s.model == "codellama-34b"]
    cal = calibrated_fit(base, st, FitSettings(draws=500, tune=500), REAL_TERMS,
                         start_settings=FitSettings(draws=200, tune=200), max_iter=3, log=None)
    pred = client_predictions(cal.model, st, cal.replays, DEFAULT_TERMS).set_index("kind")
    e2e, ttft = pred.loc["workload_e2e"], pred.loc["workload_ttft"]
    assert np.all(np.abs(e2e["error"]) < 0.05), e2e
    assert np.all(np.abs(ttft["error"]) < 0.15), ttft
