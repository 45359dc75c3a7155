"""The synthetic engine follows the reference scheduling policy and keeps its invariants."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pandas as pd
import pytest

from bayes_latency.errors import ConfigError
from bayes_latency.physics.basis import (
    ALPHA_TERMS,
    DEFAULT_TERMS,
    basis_matrix,
    kv_capacity_tokens,
    prefill_chunk_stats,
)
from bayes_latency.physics.hardware import load_gpu
from bayes_latency.physics.models import load_architecture
from bayes_latency.physics.serving import ServingConfig
from bayes_latency.schedule.engine import (
    BATCH_TABLE_COLUMNS,
    EV_FINISHED,
    EV_FIRST_TOKEN,
    EV_PREEMPTED,
    EV_QUEUED,
    EV_SCHED_FIRST,
    EV_SCHED_RESUME,
    EngineConfig,
    EngineResult,
    run_engine,
)
from bayes_latency.schedule.steptime import StepTimeModel
from bayes_latency.synth.truth import POPULATION_BETA, true_coefficients
from bayes_latency.synth.workloads import generate_requests, load_workload

pytestmark = pytest.mark.cpu_sensitive  # float results: .ci/run reruns them without AVX-512

BUDGET = 2048
MAX_SEQS = 128


def _steptime(model: str, gpu: str, tp: int, pc: bool = False) -> tuple[StepTimeModel, int]:
    arch, g = load_architecture(model), load_gpu(gpu)
    sv = ServingConfig(tp=tp, prefix_caching=pc)
    truth = true_coefficients(model, gpu, tp, DEFAULT_TERMS, ALPHA_TERMS, seed=0)
    return StepTimeModel(arch, g, sv, truth.beta_vector(DEFAULT_TERMS)), kv_capacity_tokens(arch, g, sv)


def _run(model: str = "llama-2-7b", gpu: str = "H100", tp: int = 1, stages=((6, 8), (4, 20)),
         workload: str = "general", kv_blocks: int | None = None, pc: bool = False,
         seed: int = 0, max_seqs: int = MAX_SEQS) -> tuple[EngineResult, object, StepTimeModel]:
    stm, cap = _steptime(model, gpu, tp, pc)
    w = load_workload(workload).with_stages(list(stages))
    rng = np.random.default_rng(seed)
    reqs = generate_requests(w, rng, max_model_len=4096)
    queued = (20_000_000_000_000 + reqs.send_s * 1e9 + 3e6).astype(np.int64)
    cfg = EngineConfig(max_num_batched_tokens=BUDGET, max_num_seqs=max_seqs, block_size=16,
                       kv_capacity_blocks=kv_blocks or cap // 16, prefix_caching=pc)
    key = reqs.group * w.num_users_per_system_prompt + reqs.user
    res = run_engine(queued, reqs.prompt_len, reqs.max_tokens, reqs.group, reqs.prefix_len, stm,
                     cfg, rng, prompt_key=key)
    return res, reqs, stm


@pytest.fixture(scope="module")
def normal():
    return _run()


@pytest.fixture(scope="module")
def overloaded():
    # 300 KV blocks (4,800 tokens) for ~30 concurrent 800-token requests: preemption storms
    return _run(gpu="A100", stages=((4, 8), (3, 20)), kv_blocks=300)


@pytest.fixture(scope="module")
def cached():
    return _run(model="mixtral-8x7b", tp=2, workload="codegen", stages=((6, 5), (4, 10)), pc=True)


def _invariants(res: EngineResult, reqs) -> None:
    st = res.steps
    tokens = st["prefill_tokens"] + st["decode_tokens"]
    assert (tokens <= BUDGET).all()
    assert (tokens > 0).all()
    assert (st["running_depth"] <= MAX_SEQS).all()
    assert (st["blocks_free"] >= 0).all() and (st["blocks_free"] <= res.kv_capacity_blocks).all()
    assert (st["step_id"].to_numpy() == np.arange(1, len(st) + 1)).all()
    assert (st["cpu_ns"] < st["iteration_ns"]).all() and (st["cpu_ns"] > 0).all()
    # steps never overlap: the next step starts at or after the end of the forward pass
    start = st["ts_start_ns"].to_numpy()
    assert (np.diff(start) >= st["iteration_ns"].to_numpy()[:-1]).all()
    # BATCH_SUMMARY view is a re-split of the same tokens
    assert ((st["sum_prefill_tokens"] + st["sum_decode_tokens"]) == tokens).all()
    assert ((st["sum_num_prefill_reqs"] + st["sum_num_decode_reqs"])
            == st["num_prefill_reqs"] + st["num_decode_reqs"]).all()
    r = res.requests
    assert (r["finished_step"] >= r["first_token_step"]).all()
    assert (r["first_token_step"] >= r["first_scheduled_step"]).all()
    assert (r["first_scheduled_step"] > r["queued_step"]).all()
    assert (r["first_token_ns"] <= r["finished_ns"]).all()          # TTFT <= E2E
    assert (r["queued_ns"] < r["first_token_ns"]).all()
    ev = pd.DataFrame(res.events)
    fin = ev[ev["code"] == EV_FINISHED].set_index("req")
    assert len(fin) == len(reqs)
    assert (fin["decode_done"].sort_index().to_numpy() == reqs.max_tokens).all()
    # every output token comes from a decode step, except the first one of each request and the
    # one produced when the recomputation of a resumed request (with output) completes
    resumes_with_output = int(((ev["code"] == EV_SCHED_RESUME) & (ev["decode_done"] > 0)).sum())
    assert st["decode_tokens"].sum() + len(reqs) + resumes_with_output == reqs.max_tokens.sum()
    # chunk table matches the batch columns
    ch = res.chunks
    g = ch.groupby("step_id")
    per = pd.DataFrame({"n": g.size(), "tok": g["tokens"].sum()})
    pairs, kv = prefill_chunk_stats(ch["tokens"], ch["offset"], per_chunk=True)
    per["pairs"] = pd.Series(pairs, index=ch.index).groupby(ch["step_id"]).sum()
    per["kv"] = pd.Series(kv, index=ch.index).groupby(ch["step_id"]).sum()
    s2 = st.set_index("step_id").reindex(per.index)
    assert (s2["num_prefill_reqs"] == per["n"]).all()
    assert (s2["prefill_tokens"] == per["tok"]).all()
    np.testing.assert_allclose(s2["prefill_attn_pairs"], per["pairs"], rtol=0, atol=0)
    np.testing.assert_allclose(s2["prefill_kv_tokens"], per["kv"], rtol=0, atol=0)
    assert (st.loc[~st["step_id"].isin(per.index), "prefill_tokens"] == 0).all()


def _event_timing(res: EngineResult) -> None:
    st = res.steps.set_index("step_id")
    ev = pd.DataFrame(res.events)
    eng = ev[ev["code"] != EV_QUEUED]
    t0 = st.loc[eng["step"], "ts_start_ns"].to_numpy()
    cpu = st.loc[eng["step"], "cpu_ns"].to_numpy()
    it = st.loc[eng["step"], "iteration_ns"].to_numpy()
    ts = eng["ts_ns"].to_numpy()
    early = eng["code"].isin([EV_SCHED_FIRST, EV_SCHED_RESUME, EV_PREEMPTED]).to_numpy()
    assert ((ts[early] >= t0[early]) & (ts[early] <= t0[early] + cpu[early])).all()
    end = t0[~early] + it[~early]
    assert ((ts[~early] > end - 100_000) & (ts[~early] < end)).all()
    # QUEUED carries the last step started at or before it
    q = ev[ev["code"] == EV_QUEUED]
    starts = res.steps["ts_start_ns"].to_numpy()
    qs = q["step"].to_numpy()
    has = qs > 0
    assert (starts[qs[has] - 1] <= q["ts_ns"].to_numpy()[has]).all()
    nxt = np.minimum(qs, len(starts) - 1)
    assert ((qs >= len(starts)) | (starts[nxt] > q["ts_ns"].to_numpy())).all()


def test_invariants_normal(normal):
    res, reqs, _ = normal
    _invariants(res, reqs)
    _event_timing(res)
    assert res.requests["num_preemptions"].sum() == 0
    # conservation without preemption or caching: every prompt token is prefilled exactly once
    assert res.steps["prefill_tokens"].sum() == reqs.prompt_len.sum()
    assert res.steps["decode_tokens"].sum() == (reqs.max_tokens - 1).sum()


def test_invariants_overloaded_and_preemption(overloaded):
    res, reqs, _ = overloaded
    _invariants(res, reqs)
    _event_timing(res)
    ev = pd.DataFrame(res.events)
    n_pre = int((ev["code"] == EV_PREEMPTED).sum())
    assert n_pre > 0
    assert res.steps["num_preempted"].sum() == n_pre
    # each PREEMPTED is followed (next event of the request) by a SCHEDULED RESUME, later step
    ev["next_code"] = ev.groupby("req")["code"].shift(-1)
    ev["next_step"] = ev.groupby("req")["step"].shift(-1)
    p = ev[ev["code"] == EV_PREEMPTED]
    assert (p["next_code"] == EV_SCHED_RESUME).all()
    assert (p["next_step"] > p["step"]).all()
    # cumulative preemption counts
    assert (p["num_preemptions"] >= 1).all()
    # no admission in a step that preempted
    sched = ev[ev["code"].isin([EV_SCHED_FIRST, EV_SCHED_RESUME])]
    assert not set(sched["step"]) & set(p["step"])
    # resumed recomputation shows up as decode tokens in the BATCH_SUMMARY view
    st = res.steps
    assert (st["sum_decode_tokens"] > st["decode_tokens"]).any()
    assert (st["blocks_free"] < 16).any()                     # the cache did fill up


def test_prefix_caching(cached):
    res, reqs, _ = cached
    _invariants(res, reqs)
    _event_timing(res)
    hits = res.requests["cache_hit_tokens"]
    assert (hits > 0).mean() > 0.5
    assert (hits % 16 == 0).all() and (hits < reqs.prompt_len).all()
    assert res.steps["prefill_tokens"].sum() == (reqs.prompt_len - hits).sum()
    # SCHEDULED FIRST reports prefill done 0 even with a cache hit
    ev = pd.DataFrame(res.events)
    assert (ev.loc[ev["code"] == EV_SCHED_FIRST, "prefill_done"] == 0).all()
    ft = ev[ev["code"] == EV_FIRST_TOKEN]
    assert (ft["prefill_done"].to_numpy() == reqs.prompt_len[ft["req"].to_numpy()]).all()


def _replay(res: EngineResult, prompt: np.ndarray, max_tokens: np.ndarray) -> pd.DataFrame:
    """Independent re-implementation of the reference policy driven by the journey events only."""
    ev = pd.DataFrame(res.events).sort_values(["step", "ts_ns"], kind="stable")
    pre = defaultdict(set)
    sch = defaultdict(list)
    for r, c, s in zip(ev["req"], ev["code"], ev["step"], strict=True):
        if c == EV_PREEMPTED:
            pre[s].add(r)
        elif c in (EV_SCHED_FIRST, EV_SCHED_RESUME):
            sch[s].append(r)
    n = len(prompt)
    computed = np.zeros(n, dtype=np.int64)
    out = np.zeros(n, dtype=np.int64)
    running: list[int] = []
    rows = []
    for s in range(1, res.n_steps + 1):
        if pre[s]:
            running = [r for r in running if r not in pre[s]]
            for r in pre[s]:
                computed[r] = 0
        budget = BUDGET
        dec = [r for r in running if out[r] >= 1 and computed[r] == prompt[r] + out[r] - 1]
        ds = set(dec)
        budget -= len(dec)
        chunks = []
        for r in running:
            if r in ds:
                continue
            if budget <= 0:
                break
            c = min(prompt[r] + out[r] - computed[r], budget)
            chunks.append((r, c, computed[r], prompt[r] + out[r]))
            budget -= c
        for r in sch[s]:
            running.append(r)
            c = min(prompt[r] + out[r], budget)
            chunks.append((r, c, 0, prompt[r] + out[r]))
            budget -= c
        c_arr = np.array([ch[1] for ch in chunks], dtype=float)
        o_arr = np.array([ch[2] for ch in chunks], dtype=float)
        s_arr = np.array([ch[3] for ch in chunks], dtype=float)
        pairs, kv = prefill_chunk_stats(c_arr, o_arr)
        in_pairs = float((c_arr * (s_arr + c_arr / 2)).sum())   # BLIS: c x (input length + c/2)
        rows.append((len(chunks), int(c_arr.sum()), pairs, kv, in_pairs, len(dec), len(dec),
                     int(sum(computed[r] + 1 for r in dec))))
        for r in dec:
            computed[r] += 1
            out[r] += 1
        for r, c, _, _ in chunks:
            computed[r] += c
            if computed[r] == prompt[r] + out[r]:
                out[r] += 1
        running = [r for r in running if out[r] < max_tokens[r]]
    return pd.DataFrame(rows, columns=list(BATCH_TABLE_COLUMNS))


@pytest.mark.parametrize("case", ["normal", "overloaded"])
def test_batches_rebuild_exactly_from_journeys(case, request):
    res, reqs, _ = request.getfixturevalue(case)
    rebuilt = _replay(res, reqs.prompt_len, reqs.max_tokens)
    mine = res.steps[list(BATCH_TABLE_COLUMNS)].astype(float).reset_index(drop=True)
    pd.testing.assert_frame_equal(rebuilt.astype(float), mine, check_exact=True)


@pytest.mark.parametrize("model,gpu,tp", [("llama-2-7b", "H100", 1), ("mixtral-8x7b", "A100", 2),
                                          ("llama-2-70b", "H100", 4)])
def test_fast_step_time_equals_basis(model, gpu, tp):
    stm, _ = _steptime(model, gpu, tp)
    rng = np.random.default_rng(1)
    n = 500
    npre = rng.integers(0, 6, n)
    ptok = np.where(npre > 0, rng.integers(1, 1500, n), 0)
    ndec = rng.integers(0, 129, n)
    ndec[(npre == 0) & (ndec == 0)] = 1
    off = rng.integers(0, 3000, n)
    df = pd.DataFrame({
        "num_prefill_reqs": npre, "prefill_tokens": ptok,
        "prefill_attn_pairs": ptok * off + ptok * (ptok + 1) // 2,
        "prefill_kv_tokens": np.where(npre > 0, off + ptok, 0),
        "prefill_input_pairs": ptok * (off + 1.5 * ptok),
        "num_decode_reqs": ndec, "decode_tokens": ndec,
        "decode_ctx_tokens": ndec * rng.integers(1, 4000, n),
    })
    ref = basis_matrix(df, stm.arch, stm.gpu, stm.serving, DEFAULT_TERMS) @ stm.beta
    fast = stm.mean_us_array(df)
    np.testing.assert_allclose(fast, ref, rtol=1e-9)
    scalar = np.array([stm.mean_us(*row) for row in df[list(BATCH_TABLE_COLUMNS)].itertuples(index=False)])
    np.testing.assert_allclose(scalar, ref, rtol=1e-9)


def test_engine_step_times_follow_truth(cached):
    res, _, stm = cached
    st = res.steps
    ref = stm.reference_us(st[list(BATCH_TABLE_COLUMNS)])
    np.testing.assert_allclose(st["mean_us"], ref, rtol=1e-9)
    logr = np.log(st["iteration_ns"] / 1000.0 / st["mean_us"])
    assert np.abs(logr).max() <= 1.0 + 1e-6
    assert 0.03 < np.median(np.abs(logr)) < 0.08        # scale 0.06 log-Student-t(4)


def test_determinism():
    a, _, _ = _run(stages=((3, 8),), seed=5)
    b, _, _ = _run(stages=((3, 8),), seed=5)
    c, _, _ = _run(stages=((3, 8),), seed=6)
    pd.testing.assert_frame_equal(a.steps, b.steps)
    for k in a.events:
        assert (a.events[k] == b.events[k]).all()
    assert not a.steps["iteration_ns"].equals(c.steps["iteration_ns"])


def test_idle_gaps_emit_no_steps():
    res, reqs, _ = _run(stages=((20, 0.2),))
    st = res.steps
    gaps = np.diff(st["ts_start_ns"].to_numpy()) - st["iteration_ns"].to_numpy()[:-1]
    assert (gaps > 0).sum() >= len(reqs) - 1        # an idle period before (almost) every request
    assert len(st) < len(reqs) * (reqs.max_tokens.max() + 2)


def test_truth_structure():
    t = true_coefficients("mixtral-8x7b", "A100", 4, DEFAULT_TERMS, ALPHA_TERMS, seed=3)
    for name in DEFAULT_TERMS:
        assert (t.beta[name] == 0.0) == (POPULATION_BETA[name] == 0.0)
    assert t.beta["prefill_kv"] == t.beta["decode_compute"] == t.beta["moe_dispatch"] == 0.0
    assert 0.5 < t.beta["weight_loading"] / POPULATION_BETA["weight_loading"] < 2.0
    t2 = true_coefficients("mixtral-8x7b", "H100", 4, DEFAULT_TERMS, ALPHA_TERMS, seed=3)
    assert t.effects["model"] == t2.effects["model"]            # a level keeps its effect
    assert t.effects["gpu"] != t2.effects["gpu"]
    assert 1000 < t.alpha["alpha_arrival"] < 6000


def test_workload_presets():
    w = load_workload("general")
    assert (w.system_prompt_len, w.question_len, w.output_len) == (100, 447, 248)
    assert (w.num_unique_system_prompts, w.num_users_per_system_prompt) == (9, 5)
    assert w.stages == ((600.0, 8.0), (600.0, 20.0))
    assert load_workload("reasoning").output_len == 1448
    r = generate_requests(w.scaled(0.01), np.random.default_rng(0))
    assert len(r) == 6 * 8 + 6 * 20
    assert (np.diff(r.send_s) >= 0).all()
    assert abs(r.prompt_len.mean() - 575) < 10
    p = generate_requests(load_workload("general", load="poisson").scaled(0.1),
                          np.random.default_rng(0))
    assert 0.7 * 1680 < len(p) < 1.3 * 1680
    with pytest.raises(ConfigError, match="known"):
        load_workload("nope")
