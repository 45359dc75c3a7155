"""Batch reconstruction from journeys (reference scheduling policy)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from benchmark_module import load_benchmark

from bayes_latency.data.rebuild.reconstruct import (
    BATCH_COLUMNS,
    ReconstructionReport,
    reconstruct_batches,
    summary_convention,
)
from bayes_latency.physics.serving import ServingConfig

pytestmark = pytest.mark.cpu_sensitive  # float results: .ci/run reruns them without AVX-512

NO_CACHE = ServingConfig(max_num_batched_tokens=2048, prefix_caching=False)
CACHE = ServingConfig(max_num_batched_tokens=2048, prefix_caching=True)
ENGINE_COLUMNS = ["num_prefill_reqs", "prefill_tokens", "prefill_attn_pairs", "prefill_kv_tokens",
                  "num_decode_reqs", "decode_tokens", "decode_ctx_tokens"]


def journey(rid: str, prompt: int, max_tokens: int, events: list[tuple], t0: int = 0) -> list[dict]:
    """Journey rows; ``events`` = (event, step, decode_done[, kind]) in order."""
    rows = []
    for k, e in enumerate(events):
        name, step, dd = e[0], e[1], e[2]
        rows.append({
            "experiment_id": "x", "request_id": rid, "event": name, "step": step,
            "ts_monotonic_ns": t0 + step * 10_000_000 + k, "phase": "",
            "prefill_done": 0, "prefill_total": prompt, "decode_done": dd,
            "decode_max": max_tokens, "num_preemptions": 0,
            "schedule_kind": e[3] if len(e) > 3 else ("FIRST" if name == "SCHEDULED" else None),
            "finish_status": "length" if name == "FINISHED" else None,
        })
    return rows


def simple(rid: str, prompt: int, max_tokens: int, q: int, s: int, ft: int, fin: int,
           t0: int = 0) -> list[dict]:
    return journey(rid, prompt, max_tokens, [("QUEUED", q, 0), ("SCHEDULED", s, 0),
                                             ("FIRST_TOKEN", ft, 1), ("FINISHED", fin, max_tokens)],
                   t0)


def summary(step: int, npre: int, ptok: int, ndec: int, dtok: int) -> dict:
    return {"experiment_id": "x", "step.id": step, "step.ts_start_ns": step * 10_000_000,
            "step.duration_us": 300, "batch.num_prefill_reqs": npre, "batch.prefill_tokens": ptok,
            "batch.num_decode_reqs": ndec, "batch.decode_tokens": dtok}


def by_step(b: pd.DataFrame) -> pd.DataFrame:
    return b.set_index("step_id")


def test_spec_example_chunks_2048_then_552():
    ev = pd.DataFrame(simple("a", 2600, 3, 40, 41, 42, 44))
    b, m, rep = reconstruct_batches(ev, None, NO_CACHE)
    b = by_step(b)
    assert list(b.index) == [41, 42, 43, 44]
    assert b.loc[41, "prefill_tokens"] == 2048 and b.loc[42, "prefill_tokens"] == 552
    assert b.loc[41, "prefill_attn_pairs"] == 2048 * 2049 / 2
    assert b.loc[42, "prefill_attn_pairs"] == 552 * (2048 + 553 / 2)
    assert b.loc[42, "prefill_kv_tokens"] == 2600
    # decodes at 43, 44: one token each, context = tokens in KV + the token decoded
    assert list(b.loc[[43, 44], "num_decode_reqs"]) == [1, 1]
    assert list(b.loc[[43, 44], "decode_ctx_tokens"]) == [2601, 2602]
    assert not b["ctx_approximated"].any() and not b["sampled"].any()
    pre = m[m["is_prefill"]]
    assert list(pre["tokens"]) == [2048, 552] and list(pre["ctx_offset"]) == [0, 2048]
    assert list(m.loc[~m["is_prefill"], "ctx_offset"]) == [2600, 2601]
    assert rep.n_requests == 1 and not rep.issues


def test_greedy_budget_split_and_decodes_first():
    ev = pd.DataFrame(
        simple("old", 100, 10, 0, 1, 1, 10)                      # decoding from step 2
        + simple("big", 3000, 2, 1, 2, 3, 4, t0=1)                # 2047 at 2, 953 at 3
        + simple("late", 1500, 2, 1, 2, 4, 5, t0=2))              # 0 at 2 (waits), 1094 at 3, ...
    b, m, rep = reconstruct_batches(ev, None, NO_CACHE)
    b = by_step(b)
    # step 2: one decode, then the running prefill gets the rest of the budget
    assert b.loc[2, "num_decode_reqs"] == 1
    assert b.loc[2, "prefill_tokens"] == 2047 and b.loc[2, "num_prefill_reqs"] == 1
    # step 3: 'big' completes with 953, 'late' gets min(1500 - 1, 2048 - 1 - 953) = 1094
    chunks = m[m["is_prefill"] & (m["step_id"] == 3)].set_index("request_id")["tokens"]
    assert chunks["big"] == 953 and chunks["late"] == 1094
    # step 4: 'late' completes with the remaining 406 tokens
    assert m[(m["step_id"] == 4) & m["is_prefill"]]["tokens"].tolist() == [406]
    assert not rep.issues


def test_decode_heavy_contexts():
    rows = []
    for k in range(20):
        rows += simple(f"r{k}", 50 + k, 30, 0, 1, 1, 30)
    b, m, _ = reconstruct_batches(pd.DataFrame(rows), None, NO_CACHE)
    b = by_step(b)
    assert b.loc[1, "num_prefill_reqs"] == 20 and b.loc[1, "prefill_tokens"] == sum(50 + k for k in range(20))
    for s in (2, 15, 30):
        assert b.loc[s, "num_decode_reqs"] == 20 and b.loc[s, "decode_tokens"] == 20
        # context at step s = prompt + outputs so far (s - 1), summed
        assert b.loc[s, "decode_ctx_tokens"] == sum(50 + k + s - 1 for k in range(20))
    assert (m.groupby("request_id", observed=True)["tokens"].sum() == [50 + k + 29 for k in range(20)]).all()


def test_preemption_and_resume_recompute():
    # 'v' prefills at 1 (FT at 1), decodes 2..4 (4 tokens), preempted at 5, resumed at 7:
    # recompute of prompt + 4 outputs = 504 tokens at step 7 (yields token 5), decodes 8..10.
    ev = pd.DataFrame(
        simple("keep", 200, 12, 0, 1, 1, 12)
        + journey("v", 500, 8, [("QUEUED", 0, 0), ("SCHEDULED", 1, 0), ("FIRST_TOKEN", 1, 1),
                                ("PREEMPTED", 5, 4), ("SCHEDULED", 7, 4, "RESUME"),
                                ("FINISHED", 10, 8)], t0=1))
    steps = pd.DataFrame([summary(7, 0, 0, 2, 505)])
    b, m, rep = reconstruct_batches(ev, None, NO_CACHE, steps)
    b = by_step(b)
    assert list(b.loc[[2, 3, 4], "num_decode_reqs"]) == [2, 2, 2]
    assert list(b.loc[[5, 6], "num_decode_reqs"]) == [1, 1]      # 'v' is out while preempted
    # the recompute is a prefill chunk in the batch table ...
    assert b.loc[7, "num_prefill_reqs"] == 1 and b.loc[7, "prefill_tokens"] == 504
    assert b.loc[7, "recompute_tokens"] == 504
    # ... and decode tokens in the summary's convention (agreement uses that)
    sc = summary_convention(b.loc[[7]])
    assert sc["num_prefill_reqs"].iloc[0] == 0 and sc["decode_tokens"].iloc[0] == 505
    assert rep.n_compared == 1 and rep.agreement == 1.0
    assert b.loc[8, "num_decode_reqs"] == 2
    # after the recompute the KV holds prompt + 4 outputs; the 5th (made by the recompute step)
    # is decoded at 8, so the batch context counts 504 + 1 for 'v' (and 200 + 6 + 1 for 'keep')
    dec_v = m[(m["request_id"] == "v") & ~m["is_prefill"] & (m["step_id"] == 8)]
    assert dec_v["ctx_offset"].tolist() == [504]
    assert b.loc[8, "decode_ctx_tokens"] == 505 + 207
    assert b.loc[10, "num_decode_reqs"] == 2 and b.loc[11, "num_decode_reqs"] == 1
    assert not rep.issues


def test_disagreement_is_measured():
    ev = pd.DataFrame(simple("a", 2600, 3, 40, 41, 42, 44))
    steps = pd.DataFrame([summary(41, 1, 2048, 0, 0), summary(42, 1, 500, 0, 0)])
    _, _, rep = reconstruct_batches(ev, None, NO_CACHE, steps)
    assert rep.n_compared == 2 and rep.n_agree == 1
    assert rep.mae["prefill_tokens"] == pytest.approx(26.0)
    assert "50.0%" in rep.format()
    d = rep.to_dict()
    assert d["agreement"] == 0.5


def test_prefix_cache_pinned_by_summary():
    # prompt 600 completes in its first step; the summary says 104 tokens were scheduled,
    # so the cached prefix is 496 tokens (31 blocks)
    ev = pd.DataFrame(simple("a", 600, 3, 0, 1, 1, 3))
    steps = pd.DataFrame([summary(1, 1, 104, 0, 0)])
    b, m, rep = reconstruct_batches(ev, None, CACHE, steps)
    b = by_step(b)
    assert b.loc[1, "prefill_tokens"] == 104 and b.loc[1, "prefill_kv_tokens"] == 600
    assert b.loc[1, "prefill_attn_pairs"] == 104 * (496 + 105 / 2)
    assert not b["prefix_ambiguous"].any()
    assert rep.n_prefix_cached == 1 and rep.n_prefix_ambiguous == 0 and rep.agreement == 1.0
    assert m.loc[m["is_prefill"], "ctx_offset"].tolist() == [496]


def test_prefix_cache_constrained_by_budget_and_ambiguous_flag():
    # 3000-token prompt finishing in ONE step under a 2048 budget: at least 952 tokens cached,
    # rounded up to blocks -> 960 (the only feasible values are 960..2992; smallest chosen,
    # no summary pins it -> flagged)
    ev = pd.DataFrame(simple("a", 3000, 2, 0, 1, 1, 2))
    b, _, rep = reconstruct_batches(ev, None, CACHE)
    b = by_step(b)
    assert b.loc[1, "prefill_tokens"] == 3000 - 960
    assert b.loc[1, "prefix_ambiguous"] and not b.loc[2, "prefix_ambiguous"]
    assert rep.n_prefix_ambiguous == 1
    # with prefix caching off the same journey is inconsistent: counted, tokens kept
    b2, _, rep2 = reconstruct_batches(ev, None, NO_CACHE)
    assert rep2.issues["chunk_over_budget"] == 1
    assert by_step(b2).loc[1, "prefill_tokens"] == 3000


def test_aborted_in_prefill_and_unfinished():
    ev = pd.DataFrame(
        journey("ab", 5000, 10, [("QUEUED", 0, 0), ("SCHEDULED", 1, 0), ("FINISHED", 2, 0)])
        + journey("open", 100, 50, [("QUEUED", 0, 0), ("SCHEDULED", 1, 0), ("FIRST_TOKEN", 1, 1)]))
    b, _, rep = reconstruct_batches(ev, None, NO_CACHE)
    b = by_step(b)
    # step 1: 'ab' (admitted first) takes the whole budget: it never completes; 'open' says it
    # produced its first token at 1 anyway -> its 100 tokens are kept and the overflow counted
    assert b.loc[1, "prefill_tokens"] == 2148 and b.loc[1, "num_prefill_reqs"] == 2
    assert rep.issues["chunk_over_budget"] == 1
    # 'ab' keeps taking the budget until its FINISHED (abort) step; 'open' decodes to the end
    assert b.loc[2, "prefill_tokens"] == 2047 and b.loc[2, "num_decode_reqs"] == 1
    assert rep.issues["unfinished_request"] == 1


def test_multiple_experiments_and_report_merge():
    e1 = pd.DataFrame(simple("a", 100, 3, 0, 1, 1, 3))
    e2 = pd.DataFrame(simple("a", 200, 2, 0, 5, 5, 6)).assign(experiment_id="y")
    b, m, rep = reconstruct_batches(pd.concat([e1, e2]), None, NO_CACHE)
    assert set(b["experiment_id"]) == {"x", "y"}
    assert b.groupby("experiment_id")["step_id"].min().to_dict() == {"x": 1, "y": 5}
    assert rep.n_requests == 2 and rep.experiment_id == "x,y"
    assert list(b.columns[:3]) == ["experiment_id", "step_id", "sampled"]
    assert all(c in b.columns for c in BATCH_COLUMNS)
    assert isinstance(rep, ReconstructionReport)


# ----------------------------------------------------------------- against the synthetic engine
def engine_case(seed: int = 0, n: int = 150, cap: int = 300, prefix_caching: bool = False,
                rate: float = 40.0, budget: int = 512):
    """Run the synthetic engine directly; return (engine result, journeys, summaries, serving)."""
    eng = pytest.importorskip("bayes_latency.schedule.engine")
    from bayes_latency.physics.hardware import load_gpu
    from bayes_latency.physics.models import load_architecture
    from bayes_latency.schedule.steptime import StepTimeModel

    rng = np.random.default_rng(seed)
    serving = ServingConfig(max_num_batched_tokens=budget, prefix_caching=prefix_caching)
    stm = StepTimeModel(load_architecture("llama-2-7b"), load_gpu("H100"), serving,
                        [1.5, 1.0, 1.0, 1.3, 1.2, 1.0, 10.0, 5.0, 500.0, 0.0, 0.0])
    q = (np.cumsum(rng.exponential(1 / rate, n)) * 1e9).astype(np.int64) + 10**12
    prompt = rng.integers(20, 2500, n)
    maxt = rng.integers(1, 120, n)
    res = eng.run_engine(q, prompt, maxt, rng.integers(0, 4, n), np.full(n, 200), stm,
                         eng.EngineConfig(max_num_batched_tokens=budget, kv_capacity_blocks=cap,
                                          prefix_caching=prefix_caching), rng,
                         prompt_key=rng.integers(0, 40, n) if prefix_caching else None)
    journeys, steps = load_benchmark("scheduler_share").journeys_of(res, prompt, maxt)
    return res, journeys, steps, serving


@pytest.mark.parametrize("seed", [0, 1])
def test_engine_exact_with_preemption(seed):
    res, journeys, steps, serving = engine_case(seed)
    assert (journeys["event"] == "PREEMPTED").sum() > 20   # the case exercises preemption
    b, m, rep = reconstruct_batches(journeys, None, serving, steps)
    truth = res.steps.set_index("step_id")
    got = b.set_index("step_id").reindex(truth.index)
    for c in ENGINE_COLUMNS:
        np.testing.assert_allclose(got[c].to_numpy(), truth[c].to_numpy(), err_msg=c)
    assert rep.agreement == 1.0 and not rep.issues
    # members: the engine's own chunks, one by one
    ch = res.chunks
    pre = m[m["is_prefill"]]
    assert len(pre) == len(ch)
    assert np.array_equal(np.sort(pre["tokens"].to_numpy()), np.sort(ch["tokens"].to_numpy()))


def test_engine_prefix_caching_flags_every_wrong_step():
    res, journeys, steps, serving = engine_case(0, cap=2000, prefix_caching=True, budget=2048)
    b, _, rep = reconstruct_batches(journeys, None, serving, steps)
    truth = res.steps.set_index("step_id")
    got = b.set_index("step_id").reindex(truth.index)
    wrong = np.zeros(len(truth), dtype=bool)
    for c in ENGINE_COLUMNS:
        wrong |= ~np.isclose(got[c].to_numpy(), truth[c].to_numpy())
    flagged = got["prefix_ambiguous"].to_numpy()
    assert rep.n_prefix_cached > 0
    assert (wrong & ~flagged).sum() <= 0.01 * len(truth)
    # decodes do not depend on the cache and stay exact everywhere
    np.testing.assert_allclose(got["decode_ctx_tokens"], truth["decode_ctx_tokens"])
    assert rep.agreement > 0.9


def test_corrupt_step_id_far_from_the_rest_is_a_counted_drop_not_a_dense_table():
    ev = pd.DataFrame(simple("a", 100, 5, 0, 1, 1, 5) + simple("b", 50, 3, 2, 3, 3, 5, t0=1))
    ev.loc[ev.index[-1], "step"] = 1_000_000_000  # b's FINISHED at step 1e9
    summ = pd.DataFrame([summary(3, 1, 50, 1, 1), summary(2_000_000_000, 0, 0, 1, 1)])
    b, _, rep = reconstruct_batches(ev, None, NO_CACHE, summ, with_members=False)
    assert len(b) <= 10 and int(b["step_id"].max()) <= 10
    assert rep.issues["step_out_of_range"] == 1
    assert rep.issues["summary_step_out_of_range"] == 1
