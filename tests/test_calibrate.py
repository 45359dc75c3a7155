"""The replay / fit fixed point (calibrate.py) with a stand-in fit: mechanics, not sampling."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from bayes_latency.calibrate.loop import calibrate, client_predictions, run_level_coefficients
from bayes_latency.errors import ConfigError
from bayes_latency.model.definition.likelihood import NoiseParams
from bayes_latency.physics.basis import ALPHA_TERMS, DEFAULT_TERMS
from bayes_latency.physics.hardware import load_gpu
from bayes_latency.physics.models import load_architecture
from bayes_latency.schedule.replay import ClientStage, replay_stage

ARCH, GPU = load_architecture("llama-2-7b"), load_gpu("H100")
BETA = np.array([0.5, 1.0, 0.5, 1.4, 1.5, 15.0, 30.0, 4.0, 120.0, 0.0, 0.0])
ALPHA = {"alpha_arrival": 15000.0, "alpha_post_decode": 800.0, "alpha_per_token": 40.0}


class _Scaled:
    """A stand-in fitted model: beta = c * BETA, the true alphas."""

    def __init__(self, c: float, n_rows: int = 3) -> None:
        from bayes_latency.priors import load_priors

        self.c = c
        self.priors = load_priors()
        cid = f"llama-2-7b|{GPU.name}|tp1"
        self._rows = pd.DataFrame({"config_id": [cid] * (2 * n_rows),
                                   "kind": ["workload_e2e", "workload_ttft"] * n_rows})

    def coefficients(self, name, gpu, tp, n_draws=None, seed=0):
        n = n_draws or 8
        b = np.tile(self.c * BETA, (n, 1))
        a = np.tile([ALPHA[t] for t in ALPHA_TERMS], (n, 1))
        return xr.Dataset({"beta": (("sample", "term"), b),
                           "alpha": (("sample", "alpha_term"), a)},
                          coords={"term": list(DEFAULT_TERMS), "alpha_term": list(ALPHA_TERMS)})

    def noise(self, cfg, kind):
        return NoiseParams(sigma=0.05, tau=0.0, nu=10.0)


def _fit_scale(obs: pd.DataFrame) -> _Scaled:
    """Least squares for one multiplier of BETA from the E2E rows (alphas known)."""
    r = obs[obs["kind"] == "workload_e2e"]
    X = r[[f"x_{t}" for t in DEFAULT_TERMS]].to_numpy() @ BETA
    A = r[[f"x_{a}" for a in ALPHA_TERMS]].to_numpy() @ np.array([ALPHA[a] for a in ALPHA_TERMS])
    y = r["value_us"].to_numpy()
    return _Scaled(float(np.sum(X * (y - A)) / np.sum(X * X)))


def _stage(rate: float, observed: dict) -> ClientStage:
    return ClientStage(run_id="r", stage=0, model="llama-2-7b", gpu="H100", tp=1,
                       observed=observed, kv_blocks=8000, rate=rate, count=600, prompt_len=590,
                       output_pdf={200: 1.0}, system_prompt_len=100, num_groups=11,
                       users_per_group=4)


def _truth(rate: float) -> dict:
    rep = replay_stage(_stage(rate, {}), ARCH, GPU, BETA)
    m = rep.engine_us
    return {"ttft_mean_us": m["workload_ttft"] + ALPHA["alpha_arrival"] + ALPHA["alpha_per_token"],
            "e2e_mean_us": m["workload_e2e"] + 15000 + 800 + 40 * 200, "output_len_mean": 200.0}


@pytest.mark.parametrize("rate, scale", [(4.0, True), (30.0, True), (30.0, False)])
def test_fixed_point_recovers_the_scale(rate, scale):
    """From a start 2x too slow, the loop finds the true scale; at a loaded rate the schedule
    moves with the coefficients and the tangent rows still converge."""
    st = _stage(rate, _truth(rate))
    start = {"llama-2-7b|" + GPU.name + "|tp1": (2.0 * BETA, ALPHA)}
    cal = calibrate(pd.DataFrame(), [st], _fit_scale, start=start, tol=0.002, max_iter=8,
                    log=None, scale=scale, tol_noise=1e-9)
    assert cal.converged, cal.history
    assert cal.model.c == pytest.approx(1.0, abs=0.01)
    assert cal.final_change < 0.002
    assert set(cal.rows["kind"]) == {"workload_ttft", "workload_e2e", "workload_decode"}
    pred = client_predictions(cal.model, [st], cal.replays, DEFAULT_TERMS)
    e2e = pred.set_index("kind").loc["workload_e2e"]
    assert e2e["error"] == pytest.approx(0.0, abs=0.01)
    if rate > 10:   # loaded: the rows are far from the fixed-schedule form
        assert cal.history["max_elasticity"].iloc[0] > 1.05
    if not scale:   # the loop itself did the work
        assert len(cal.history) >= 2


def test_run_level_draws_widen_by_the_pooled_residual():
    m = _Scaled(1.0, n_rows=200)   # many rows: the configuration's own scale dominates
    ds = run_level_coefficients(m, "llama-2-7b", "H100", 1, n_draws=4000)
    ratio = ds["beta"].sel(term="per_step").values / 120.0
    s = ds.attrs["run_level_sigma"]["workload_e2e"]
    assert s == pytest.approx(0.05, rel=0.01)
    assert np.std(np.log(ratio)) == pytest.approx(s, rel=0.1)
    assert ds.attrs["run_level_sigma_source"]["workload_e2e"].startswith("pooled (own 200 rows")
    # one run's rows cannot estimate run-to-run scatter: it moves towards the prior's mean
    # scale (0.08 sqrt(2/pi) = 0.064 for workload_e2e), 2 pseudo-rows of prior, 4 of fleet
    few = run_level_coefficients(_Scaled(1.0, n_rows=1), "llama-2-7b", "H100", 1, n_draws=10)
    fleet = (2 * 0.0638**2 + 0.05**2) / 3
    want = np.sqrt((4 * fleet + 0.05**2) / 5)
    assert few.attrs["run_level_sigma"]["workload_e2e"] == pytest.approx(want, rel=1e-2)
    # no client rows at all: the prior's mean scale
    none = _Scaled(1.0, n_rows=0)
    nd = run_level_coefficients(none, "llama-2-7b", "H100", 1, n_draws=10)
    assert nd.attrs["run_level_sigma_source"] == {"workload_e2e": "prior",
                                                  "workload_ttft": "prior"}
    assert nd.attrs["run_level_sigma"]["workload_e2e"] == pytest.approx(0.08 * 0.7979, rel=1e-3)


def test_run_level_scale_borrows_from_the_fleet():
    """A configuration whose own fitted scale collapsed (2 rows) borrows a wide fleet's."""
    from bayes_latency.calibrate.loop import run_level_sigma

    m = _Scaled(1.0)
    a, b = "llama-2-7b|H100-SXM|tp1", "mixtral-8x7b|H100-SXM|tp2"
    m._rows = pd.DataFrame({"config_id": [a] * 2 + [b] * 20, "kind": ["workload_e2e"] * 22})
    m.noise = lambda cfg, kind: NoiseParams(sigma=0.001 if cfg == a else 0.1, tau=0.0, nu=10.0)
    s_a, src = run_level_sigma(m, a, "workload_e2e")
    s_b, _ = run_level_sigma(m, b, "workload_e2e")
    assert 0.07 < s_a < 0.1 and 0.095 < s_b < 0.1
    assert src == "pooled (own 2 rows, fleet 22 rows in 2 configurations)"


def test_bad_arguments():
    with pytest.raises(ConfigError, match="no client stage"):
        calibrate(pd.DataFrame(), [], _fit_scale)
    with pytest.raises(ConfigError, match="tol"):
        calibrate(pd.DataFrame(), [_stage(4.0, _truth(4.0))], _fit_scale, tol=0)


def test_run_level_ttft_scatters_by_its_own_scale():
    """With the alphas' share of TTFT given, a draw's replayed TTFT scatters by s_ttft even
    when the steps make most of it (here the alphas make about half)."""
    from bayes_latency.calibrate.loop import draw_matrices, ttft_alpha_share

    m = _Scaled(1.0, n_rows=200)
    m.noise = lambda cfg, kind: NoiseParams(sigma=0.2 if kind == "workload_ttft" else 0.02,
                                            tau=0.0, nu=10.0)
    rep = replay_stage(_stage(4.0, {}), ARCH, GPU, BETA)
    x, w = rep.features["workload_ttft"], rep.alpha["workload_ttft"]
    t0 = float(x @ BETA + sum(v * ALPHA[a] for a, v in w.items()))
    f = ttft_alpha_share(m, "llama-2-7b", "H100", 1, [t0])
    assert 0.2 < f < 0.9
    for share, want in ((f, 0.2), (1.0, None)):
        ds = run_level_coefficients(m, "llama-2-7b", "H100", 1, n_draws=4000,
                                    ttft_alpha_share=share)
        B, A = draw_matrices(ds, DEFAULT_TERMS)
        t = B @ x + sum(v * A[a] for a, v in w.items())
        sd = float(np.std(np.log(t / t0)))
        if want:
            assert sd == pytest.approx(want, rel=0.12)
        else:   # alpha alone scaled by exp(s z): TTFT scatters by f * s only
            assert sd < 0.8 * 0.2
    with pytest.raises(ConfigError, match="ttft_alpha_share"):
        run_level_coefficients(m, "llama-2-7b", "H100", 1, n_draws=4, ttft_alpha_share=0.0)


def test_fast_fits_first_then_the_full_fit_decides():
    """Cheap fits move the rows to their fixed point; convergence is declared on a full fit."""
    st = _stage(30.0, _truth(30.0))
    start = {"llama-2-7b|" + GPU.name + "|tp1": (2.0 * BETA, ALPHA)}
    calls = []

    from bayes_latency.model.estimator import _ARVIZ_GROUPS

    def fast(obs):   # a slightly biased cheap fit, as a Laplace mean is to a NUTS mean
        calls.append("fast")
        assert not _ARVIZ_GROUPS.get()  # intermediate fits skip the ArviZ groups
        m = _fit_scale(obs)
        return _Scaled(m.c * 1.003)

    def full(obs):
        calls.append("full")
        assert _ARVIZ_GROUPS.get()
        return _fit_scale(obs)

    cal = calibrate(pd.DataFrame(), [st], full, start=start, tol=0.002, max_iter=4, log=None,
                    scale=False, tol_noise=1e-9, fast_fit=fast)
    assert cal.converged, cal.history
    assert calls[0] == "fast" and calls[-1] == "full"
    assert list(cal.history["fit"]) == calls
    assert cal.model.c == pytest.approx(1.0, abs=0.01)
    assert calls.count("full") <= 2
    tm = cal.timings
    assert set(tm) == {"scale_start_s", "first_replay_s", "total_s"}
    assert 0.0 <= tm["scale_start_s"] + tm["first_replay_s"] <= tm["total_s"]


def test_replay_all_reuses_given_replays():
    from bayes_latency.calibrate.loop import replay_all

    st = [_stage(30.0, _truth(30.0))]
    coefs = {"llama-2-7b|" + GPU.name + "|tp1": (BETA, ALPHA)}
    reps, rows, el = replay_all(st, coefs, DEFAULT_TERMS)
    reps2, rows2, el2 = replay_all(st, coefs, DEFAULT_TERMS, done=reps)
    pd.testing.assert_frame_equal(rows, rows2)
    pd.testing.assert_frame_equal(el, el2)


def test_rows_past_capacity_are_replayed_not_fitted():
    """A TTFT mean 7x as elastic as beta (limit 5 here) leaves the fit for good; the E2E row
    alone carries the stage, and the stop rule ignores the unfitted row."""
    st = _stage(30.0, _truth(30.0))
    start = {"llama-2-7b|" + GPU.name + "|tp1": (2.0 * BETA, ALPHA)}
    cal = calibrate(pd.DataFrame(), [st], _fit_scale, start=start, tol=0.002, max_iter=8,
                    log=None, tol_noise=1e-9, max_fit_elasticity=5.0)
    assert cal.converged, cal.history
    assert cal.unfitted == ("r/stage0/workload_ttft",)
    role = cal.rows.set_index("kind")["role"]
    assert role["workload_ttft"] == "ppc" and role["workload_e2e"] == "workload"
    assert (cal.history["n_unfitted"] == 1).all()
    assert cal.model.c == pytest.approx(1.0, abs=0.01)


def _spec(stages: list[tuple[float, float]]) -> dict:
    return {"system_prompt_len": 100, "question_len": 400, "output_len": 50, "num_groups": 3,
            "users_per_group": 2, "stages": stages, "multi_turn": False}


def test_spec_stages_draw_the_asked_load_bounded_and_refuse_an_empty_stage() -> None:
    from bayes_latency.calibrate.stages import MAX_REPLAY_REQUESTS, spec_stages

    notes: list[str] = []
    st = spec_stages(_spec([(4.0, 30.0), (1000.0, 3600.0)]), "llama-2-7b", "H100", 1, 6886,
                     notes=notes)
    assert [s.count for s in st] == [120, MAX_REPLAY_REQUESTS]  # 3.6 million asked: bounded
    assert len(notes) == 1 and "3,600,000 requests" in notes[0] and "spec stage 1" in notes[0]
    a = st[0]
    assert (a.rate, a.prompt_len, a.system_prompt_len, a.num_groups, a.users_per_group) == (
        4.0, 500, 100, 3, 2)
    assert a.output_pdf == {50: 1.0} and a.prompt_sharing == "system"
    assert np.isnan(a.observed["ttft_mean_us"]) and a.observed["output_len_mean"] == 50.0
    with pytest.raises(ConfigError, match="spec stage 0: rate x duration = 0.5 requests"):
        spec_stages(_spec([(0.5, 1.0)]), "llama-2-7b", "H100", 1, 6886)
