"""The engine and the batch rebuild: same batches, and what each costs.

The synthetic engine (:func:`~bayes_latency.schedule.engine.run_engine`, compiled loop
:mod:`bayes_latency.schedule.loop`) decides admissions, preemptions and chunks; the batch rebuild
(:func:`~bayes_latency.data.rebuild.reconstruct.reconstruct_batches`, compiled kernel
:mod:`bayes_latency.data.rebuild.kernel`) reads admissions and preemptions from the journeys and
only splits prompts into chunks. For engine runs that cover preemption and prefix caching, this
measures, per case: steps, the share of steps whose rebuilt batch equals the engine's in every
batch column (all steps, and the steps the rebuild does not flag ``prefix_ambiguous``), and
steps per CPU-second of the engine and of the rebuild (best of ``--repeat``, after a warm-up
call that compiles or loads both kernels).

Usage::

    python benchmarks/scheduler_share.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from bayes_latency.data.rebuild.reconstruct import reconstruct_batches
from bayes_latency.physics.basis import ALPHA_TERMS, DEFAULT_TERMS, kv_capacity_tokens
from bayes_latency.physics.hardware import load_gpu
from bayes_latency.physics.models import load_architecture
from bayes_latency.physics.serving import ServingConfig
from bayes_latency.schedule import engine as eng
from bayes_latency.schedule.steptime import StepTimeModel
from bayes_latency.synth.truth import true_coefficients
from bayes_latency.synth.workloads import generate_requests, load_workload

COLUMNS = ["num_prefill_reqs", "prefill_tokens", "prefill_attn_pairs", "prefill_kv_tokens",
           "num_decode_reqs", "decode_tokens", "decode_ctx_tokens"]

CASES: dict[str, dict] = {
    "normal": {},
    "overloaded (preemptions)": {"gpu": "A100", "stages": ((12, 8), (8, 20)), "kv_blocks": 300},
    "long (11k steps)": {"stages": ((60, 10), (40, 20)), "max_seqs": 64},
    "prefix cache": {"model": "mixtral-8x7b", "tp": 2, "workload": "codegen",
                     "stages": ((6, 5), (4, 10)), "pc": True},
    "prefix cache + preemptions": {"workload": "codegen", "stages": ((6, 8), (4, 16)),
                                   "pc": True, "kv_blocks": 260},
}


def run_case(model: str = "llama-2-7b", gpu: str = "H100", tp: int = 1,
             stages=((6, 8), (4, 20)), workload: str = "general", kv_blocks: int | None = None,
             pc: bool = False, max_seqs: int = 128, budget: int = 2048):
    """Inputs of one engine run, and a function that runs it."""
    arch, g = load_architecture(model), load_gpu(gpu)
    sv = ServingConfig(tp=tp, prefix_caching=pc, max_num_batched_tokens=budget)
    truth = true_coefficients(model, gpu, tp, DEFAULT_TERMS, ALPHA_TERMS, seed=0)
    stm = StepTimeModel(arch, g, sv, truth.beta_vector(DEFAULT_TERMS))
    w = load_workload(workload).with_stages(list(stages))
    reqs = generate_requests(w, np.random.default_rng(0), max_model_len=4096)
    queued = (20_000_000_000_000 + reqs.send_s * 1e9 + 3e6).astype(np.int64)
    cfg = eng.EngineConfig(max_num_batched_tokens=budget, max_num_seqs=max_seqs, block_size=16,
                           kv_capacity_blocks=kv_blocks or kv_capacity_tokens(arch, g, sv) // 16,
                           prefix_caching=pc)
    pk = reqs.group * w.num_users_per_system_prompt + reqs.user

    def run() -> eng.EngineResult:
        return eng.run_engine(queued, reqs.prompt_len, reqs.max_tokens, reqs.group,
                              reqs.prefix_len, stm, cfg, np.random.default_rng(1), prompt_key=pk)
    return run, reqs, sv


def journeys_of(res: eng.EngineResult, prompt: np.ndarray, maxt: np.ndarray):
    """The engine's journeys and sampled step summaries as ingest tables (also the input of the
    rebuild tests in ``tests/test_reconstruct.py``)."""
    e = res.events
    code = e["code"]
    journeys = pd.DataFrame({
        "experiment_id": "x", "request_id": [f"r{i}" for i in e["req"]],
        "event": [eng.EVENT_NAMES[c] for c in code], "step": e["step"],
        "ts_monotonic_ns": e["ts_ns"], "phase": "", "prefill_done": e["prefill_done"],
        "prefill_total": prompt[e["req"]], "decode_done": e["decode_done"],
        "decode_max": maxt[e["req"]], "num_preemptions": e["num_preemptions"],
        "schedule_kind": np.where(code == eng.EV_SCHED_RESUME, "RESUME", "FIRST"),
        "finish_status": "length"})
    st = res.steps[res.steps["sampled"]]
    steps = pd.DataFrame({
        "experiment_id": "x", "step.id": st["step_id"], "step.ts_start_ns": st["ts_start_ns"],
        "step.duration_us": st["cpu_ns"] // 1000,
        "batch.num_prefill_reqs": st["sum_num_prefill_reqs"],
        "batch.num_decode_reqs": st["sum_num_decode_reqs"],
        "batch.prefill_tokens": st["sum_prefill_tokens"],
        "batch.decode_tokens": st["sum_decode_tokens"]})
    return journeys, steps


def _best(f, repeat: int):
    best, out = np.inf, None
    for _ in range(repeat):
        t = time.process_time()
        out = f()
        best = min(best, time.process_time() - t)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print("| case | steps | preemptions | equal steps | equal unflagged | flagged "
          "| engine steps/CPU-s | rebuild steps/CPU-s | rebuild + members steps/CPU-s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, kw in CASES.items():
        run, reqs, sv = run_case(**kw)
        run()   # compile / load
        t_eng, res = _best(run, args.repeat)
        journeys, steps = journeys_of(res, reqs.prompt_len, reqs.max_tokens)
        reconstruct_batches(journeys, None, sv, steps)
        t_reb, (b, _, rep) = _best(
            lambda j=journeys, s=steps, v=sv: reconstruct_batches(j, None, v, s,
                                                                  with_members=False),
            args.repeat)
        t_mem, _ = _best(lambda j=journeys, s=steps, v=sv: reconstruct_batches(j, None, v, s),
                         args.repeat)
        truth = res.steps.set_index("step_id")
        got = b.set_index("step_id").reindex(truth.index)
        equal = np.ones(len(truth), dtype=bool)
        for c in COLUMNS:
            equal &= np.isclose(got[c].to_numpy(dtype=float), truth[c].to_numpy(dtype=float),
                                rtol=1e-12, atol=0)
        flagged = got["prefix_ambiguous"].fillna(False).to_numpy(dtype=bool)
        n = len(truth)
        print(f"| {name} | {n} | {int(res.requests['num_preemptions'].sum())} "
              f"| {100 * equal.mean():.2f}% | {100 * equal[~flagged].mean():.2f}% "
              f"| {100 * flagged.mean():.1f}% | {n / t_eng:,.0f} | {n / t_reb:,.0f} "
              f"| {n / t_mem:,.0f} |")


if __name__ == "__main__":
    main()
