"""Observation rows: step timeline (iterations + windows), request, alpha, microbenchmark rows."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from test_reconstruct import engine_case, simple

from bayes_latency.data.observations.build import (
    build_observations,
    observation_columns,
    observations_from_iterations,
    observations_from_microbench,
)
from bayes_latency.data.rebuild.reconstruct import BATCH_COLUMNS, reconstruct_batches
from bayes_latency.physics.basis import ALPHA_TERMS, DEFAULT_TERMS, basis_matrix
from bayes_latency.physics.hardware import load_gpu
from bayes_latency.physics.models import load_architecture
from bayes_latency.physics.serving import ServingConfig

ARCH, GPU = load_architecture("llama-2-7b"), load_gpu("H100")
X_COLS = [f"x_{t}" for t in DEFAULT_TERMS]


def requests_from_journeys(ev: pd.DataFrame, api_delay_us: float = 2000.0) -> pd.DataFrame:
    """A ``requests`` table from journeys (API times: arrival 2 ms before QUEUED etc.)."""
    first = ev.sort_values(["request_id", "step", "ts_monotonic_ns"]).drop_duplicates(
        ["request_id", "event"])
    piv = first.pivot(index="request_id", columns="event", values=["ts_monotonic_ns", "step"])
    out = pd.DataFrame({"experiment_id": "x", "request_id": piv.index})
    for ev_name, pre in (("QUEUED", "queued"), ("SCHEDULED", "first_scheduled"),
                         ("FIRST_TOKEN", "first_token"), ("FINISHED", "finished")):
        out[f"{pre}_ns"] = piv[("ts_monotonic_ns", ev_name)].to_numpy(dtype=float)
        out[f"{pre}_step"] = piv[("step", ev_name)].to_numpy(dtype=float)
    fin = first[first["event"] == "FINISHED"].set_index("request_id")["decode_done"]
    out["output_tokens"] = out["request_id"].map(fin).to_numpy(dtype=float)
    out["arrival_s"] = (out["queued_ns"] / 1e3 - api_delay_us) / 1e6
    out["departed_s"] = (out["finished_ns"] / 1e3 + 1000.0 + 10.0 * out["output_tokens"]) / 1e6
    out["complete"] = out[["queued_ns", "first_scheduled_ns", "first_token_ns",
                           "finished_ns"]].notna().all(axis=1)
    out["aborted"] = False
    return out


@pytest.fixture(scope="module")
def engine_obs():
    res, ev, steps, serving = engine_case(3, n=120, cap=400, budget=1024)
    requests = requests_from_journeys(ev)
    batches, _, _ = reconstruct_batches(ev, requests, serving, steps, with_members=False)
    obs, rep = build_observations({"steps": steps, "requests": requests, "journey_events": ev,
                                   "batches": batches}, serving, ARCH, GPU, "x", "synthetic")
    return res, batches, obs, rep, serving


def test_columns_and_roles(engine_obs):
    _, _, obs, rep, _ = engine_obs
    assert list(obs.columns) == observation_columns(DEFAULT_TERMS)
    assert set(obs["kind"]) == {"iteration", "step_window", "request_prefill", "request_decode",
                                "alpha_arrival", "alpha_departure", "scheduler_cpu"}
    roles = obs.groupby("kind")["role"].first().to_dict()
    assert roles == {"iteration": "beta", "step_window": "beta", "request_prefill": "ppc",
                     "request_decode": "ppc", "alpha_arrival": "alpha",
                     "alpha_departure": "alpha", "scheduler_cpu": "aux"}
    assert obs["obs_id"].is_unique
    assert (obs["config_id"] == "llama-2-7b|H100-SXM|tp1").all()
    assert (obs["value_us"] > 0).all()
    assert rep.n_dropped == 0, rep.format()


def test_timeline_partition_no_step_twice(engine_obs):
    res, batches, obs, _, _ = engine_obs
    tl = obs[obs["kind"].isin(["iteration", "step_window"])]
    cover = np.zeros(int(batches["step_id"].max()) + 2, dtype=int)
    for a, b in zip(tl["step_first"], tl["step_last"], strict=True):
        cover[a:b + 1] += 1
    assert cover.max() == 1
    assert (cover[batches["step_id"]] == 1).mean() > 0.97
    assert (tl["n_steps"] == tl["step_last"] - tl["step_first"] + 1).all()
    it = tl[tl["kind"] == "iteration"]
    assert len(it) > 0 and it["anchor_exact"].all() and (it["n_steps"] == 1).all()
    assert not (tl["kind"].eq("step_window") & tl["anchor_exact"] & tl["n_steps"].eq(1)).any()


def test_window_features_are_sums_of_step_basis(engine_obs):
    _, batches, obs, _, serving = engine_obs
    X = basis_matrix(batches[list(BATCH_COLUMNS)], ARCH, GPU, serving)
    cs = np.vstack([np.zeros((1, X.shape[1])), np.cumsum(X, axis=0)])
    s0 = int(batches["step_id"].iloc[0])
    for kind in ("step_window", "iteration", "request_prefill", "request_decode"):
        rows = obs[obs["kind"] == kind]
        a = rows["step_first"].to_numpy(dtype=int) - s0
        b = rows["step_last"].to_numpy(dtype=int) - s0 + 1
        np.testing.assert_allclose(rows[X_COLS].to_numpy(), cs[b] - cs[a], rtol=1e-9, atol=1e-6)
        assert (rows[[f"x_{t}" for t in ALPHA_TERMS]].to_numpy() == 0).all()


def test_window_values_match_true_iteration_times(engine_obs):
    res, _, obs, _, _ = engine_obs
    it_us = res.steps.set_index("step_id")["iteration_ns"].to_numpy() / 1e3
    ct = np.concatenate([[0.0], np.cumsum(it_us)])
    tl = obs[obs["kind"].isin(["iteration", "step_window"])]
    a = tl["step_first"].to_numpy(dtype=int) - 1
    b = tl["step_last"].to_numpy(dtype=int)
    err = tl["value_us"].to_numpy() - (ct[b] - ct[a])
    exact = tl["anchor_exact"].to_numpy()
    np.testing.assert_allclose(err[exact], 0.0, atol=1e-3)
    assert np.median(np.abs(err)) < 100.0 and np.abs(err).max() < 1000.0
    # the stated error bound holds for most windows
    assert (np.abs(err) <= tl["anchor_error_us"].to_numpy() + 1.0).mean() > 0.85


def test_windows_over_guessed_prefix_steps_are_not_fitted():
    """Steps whose prefill chunks rest on a guessed cached prefix (``prefix_ambiguous``) are in no
    iteration or window row, and every row left out for it is counted."""
    res, ev, steps, serving = engine_case(3, n=120, cap=400, budget=1024)
    requests = requests_from_journeys(ev)
    batches, _, _ = reconstruct_batches(ev, requests, serving, steps, with_members=False)
    flagged = batches["step_id"].to_numpy()[5::7]
    batches = batches.assign(prefix_ambiguous=batches["step_id"].isin(flagged))
    tables = {"steps": steps, "requests": requests, "journey_events": ev, "batches": batches}
    obs, rep = build_observations(tables, serving, ARCH, GPU, "x", "synthetic")
    tl = obs[obs["kind"].isin(["iteration", "step_window"])]
    spans = [set(range(a, b + 1)) for a, b in zip(tl["step_first"], tl["step_last"], strict=True)]
    assert not any(s & set(flagged.tolist()) for s in spans)
    guessed = sum(v for k, v in rep.dropped.items() if k.endswith("prefix_guessed"))
    base, _ = build_observations({**tables, "batches": batches.drop(columns="prefix_ambiguous")},
                                 serving, ARCH, GPU, "x", "synthetic")
    n_base = base["kind"].isin(["iteration", "step_window"]).sum()
    assert guessed > 0 and len(tl) == n_base - guessed


def test_scheduler_cpu_rows(engine_obs):
    res, batches, obs, _, serving = engine_obs
    cpu = obs[obs["kind"] == "scheduler_cpu"]
    st = res.steps.set_index("step_id")
    assert len(cpu) == int(st["sampled"].sum())
    np.testing.assert_allclose(cpu["value_us"], st.loc[cpu["step_first"], "cpu_ns"] // 1000)


def test_alpha_rows_values_and_drops():
    req = pd.DataFrame({
        "experiment_id": "x", "request_id": ["a", "b", "c", "d"],
        "arrival_s": [100.0, 100.5, np.nan, 101.0],
        "queued_ns": [100_003_000_000, 100_499_000_000, 100_600_000_000, 101_001_000_000],
        "queued_step": [1, 2, 2, 3],
        "finished_ns": [101_000_000_000, 101_500_000_000, 101_600_000_000, 102_000_000_000],
        "finished_step": [9, 10, 11, 12], "output_tokens": [10, 20, 30, 40],
        "departed_s": [101.002, 101.5015, 101.61, 101.9],
        "aborted": [False, False, False, True],
    })
    from bayes_latency.data.observations.journey import _alpha_rows
    from bayes_latency.data.report import IngestReport

    rep = IngestReport()
    frames = _alpha_rows(req, DEFAULT_TERMS, rep)
    arr, dep = frames
    np.testing.assert_allclose(arr["value_us"], [3000.0, 1000.0])      # b negative, c missing
    assert (arr["x_alpha_arrival"] == 1).all() and (arr[X_COLS].to_numpy() == 0).all()
    np.testing.assert_allclose(dep["value_us"], [2000.0, 1500.0, 10000.0], atol=1e-3)
    assert dep["x_alpha_per_token"].tolist() == [10, 20, 30]
    assert (dep["x_alpha_post_decode"] == 1).all()
    assert rep.dropped == {"alpha_arrival:negative": 1, "alpha_arrival:missing_time": 1,
                           "alpha_departure:aborted": 1}


def test_idle_gap_is_not_in_any_window():
    # two bursts separated by 5 s of idle engine: steps 1..3 then 4..6
    rows = simple("a", 500, 3, 0, 1, 1, 3) + simple("b", 400, 3, 3, 4, 4, 6, t0=5_000_000_000)
    ev = pd.DataFrame(rows)
    # QUEUED of 'b' happens during the idle gap (after a's FINISHED at step 3)
    ev.loc[(ev.request_id == "b") & (ev.event == "QUEUED"), "ts_monotonic_ns"] = 4_000_000_000
    req = requests_from_journeys(ev)
    serving = ServingConfig(prefix_caching=False)
    obs, rep = build_observations({"journey_events": ev, "requests": req, "steps": None},
                                  serving, ARCH, GPU, "x")
    tl = obs[obs["kind"].isin(["iteration", "step_window"])]
    assert tl["value_us"].max() < 1e6                      # no window holds the 5 s gap
    assert set(tl["step_last"]) >= {3, 6}                  # ... yet steps 3 and 6 are covered
    assert rep.n_dropped == 0


def test_without_journeys_iteration_rows_from_summaries():
    steps = pd.DataFrame({
        "experiment_id": "x", "step.id": [10, 11, 12, 20], "step.ts_start_ns": [0, 15_000_000,
                                                                                31_000_000, 99],
        "step.duration_us": [300, 310, 320, 330], "batch.num_prefill_reqs": [1, 0, 1, 0],
        "batch.num_decode_reqs": [10, 11, 11, 5], "batch.prefill_tokens": [500, 0, 100, 0],
        "batch.decode_tokens": [10, 11, 11, 5], "kv.usage_gpu_ratio": [0.1] * 4,
        "kv.blocks_total_gpu": [1000] * 4, "kv.blocks_free_gpu": [900] * 4,
    })
    obs, rep = build_observations({"steps": steps, "journey_events": None, "requests": None},
                                  ServingConfig(), ARCH, GPU, "x")
    assert obs["kind"].tolist() == ["iteration", "iteration"]
    np.testing.assert_allclose(obs["value_us"], [15000.0, 16000.0])
    assert obs["ctx_approximated"].all()
    assert any("no journeys" in n for n in rep.notes)


def test_observations_from_iterations():
    it = pd.DataFrame({
        "experiment_id": ["e1", "e1", "e2"], "step_id": [1, 5, 7], "iteration_us": [9000.0, 0.0, 12000.0],
        "schedule_cpu_us": 300.0, "num_prefill_reqs": [0, 0, 1], "prefill_tokens": [0, 0, 200],
        "prefill_attn_pairs": [0, 0, 20100], "prefill_kv_tokens": [0, 0, 200],
        "num_decode_reqs": [8, 8, 4], "decode_tokens": [8, 8, 4],
        "decode_ctx_tokens": [4000, 4000, 2000], "offload_tokens": 0, "ctx_approximated": True,
    })
    obs = observations_from_iterations(it, ARCH, GPU, ServingConfig())
    assert obs["experiment_id"].tolist() == ["e1", "e2"]          # non-positive time skipped
    X = basis_matrix(it.iloc[[0, 2]][[c for c in BATCH_COLUMNS if c in it]], ARCH, GPU,
                     ServingConfig())
    np.testing.assert_allclose(obs[X_COLS].to_numpy(), X)
    assert list(obs.columns) == observation_columns()


def test_microbench_rows():
    df = pd.DataFrame({
        "model": "llama2-70b", "hardware": "a100-80gb", "tensor_parallel": 4,
        "prompt_size": [512, 512, 1024], "batch_size": [1, 1, 2], "token_size": [128, 128, 64],
        "prompt_time": [200.0, 202.0, 500.0], "token_time": [50.0, 52.0, 60.0],
    })
    obs = observations_from_microbench(df)
    assert (obs["kind"] == "benchmark_mean").all() and (obs["aggregate"] == "mean").all()
    assert (obs["role"] == "beta").all() and (obs["tp"] == 4).all()
    assert len(obs) == 4                                  # 2 prompt points + 2 token points
    arch, gpu = load_architecture("llama-2-70b"), load_gpu("A100")
    sv = ServingConfig(tp=4, max_num_batched_tokens=2048, prefix_caching=False)
    prompt = obs[obs["n_steps"] == 1].sort_values("value_us")
    np.testing.assert_allclose(prompt["value_us"], [201_000.0, 500_000.0])
    pb = pd.DataFrame({"num_prefill_reqs": [1.0], "prefill_tokens": [512.0],
                       "prefill_attn_pairs": [512 * 513 / 2], "prefill_kv_tokens": [512.0],
                       "num_decode_reqs": [0.0], "decode_tokens": [0.0], "decode_ctx_tokens": [0.0]})
    np.testing.assert_allclose(prompt[X_COLS].iloc[0], basis_matrix(pb, arch, gpu, sv)[0])
    tok = obs[obs["n_steps"] == 64].iloc[0]
    db = pd.DataFrame({"num_prefill_reqs": 0.0, "prefill_tokens": 0.0, "prefill_attn_pairs": 0.0,
                       "prefill_kv_tokens": 0.0, "num_decode_reqs": 2.0, "decode_tokens": 2.0,
                       "decode_ctx_tokens": 2.0 * (1024 + np.arange(64))})
    np.testing.assert_allclose(tok[X_COLS].to_numpy(float),
                               basis_matrix(db, arch, gpu, sv).mean(axis=0), rtol=1e-12)
    assert tok["value_us"] == 60_000.0


@pytest.mark.real
def test_microbench_real_file(real_dir):
    from bayes_latency.data.microbench import read_splitwise

    df = read_splitwise(real_dir / "microbench" / "splitwise_perf_model.csv")
    obs = observations_from_microbench(df)
    assert len(obs) > 50 and (obs["value_us"] > 0).all()
    assert set(obs["model"]) == {"llama-2-70b", "bloom-176b"}
    assert np.isfinite(obs[X_COLS].to_numpy()).all()
