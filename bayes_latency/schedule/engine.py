"""A vLLM-v1-like continuous-batching engine implementing the reference scheduling policy.

The policy is the one of ``docs/ARCHITECTURE.md`` ("The reference scheduling policy"), shared with
``data/rebuild/reconstruct.py`` so that a batch rebuilt from journeys equals the engine's own. Per step
``s`` (the ``schedule()`` counter, from 1; no step while idle):

1. **Decodes** of running requests with a complete prefill (>= 1 output token, nothing to
   recompute), in running (admission) order, 1 token each.
2. **Running partial prefills** (chunked prefill in progress, or recompute after a resume), in
   running order: ``min(remaining, budget_left)`` each; a request that gets 0 waits.
3. **Waiting queue FCFS** (preempted requests at the front) while ``budget_left > 0``,
   ``len(running) < max_num_seqs`` and the KV cache has the blocks of the first chunk
   ``min(prompt + output - cached_prefix, budget_left)``. As in vLLM v1, no request is admitted in
   a step that preempted one (the preempted request would only thrash).
4. **KV blocks**: scheduling ``c`` tokens needs ``ceil((computed + c) / block_size)`` blocks. When a
   decode or chunk cannot get its blocks, the last running request is preempted (its blocks freed,
   ``computed = 0``, front of the waiting queue); if it had been scheduled as a decode in this step,
   that decode is withdrawn (a request preempted at ``s`` contributes nothing to ``s``). If the
   victim is the requester itself, it is not scheduled.
5. ``FIRST_TOKEN`` at the step whose chunk completes the prompt; ``FINISHED`` at the step of the
   ``max_tokens``-th output token (status ``length``).
6. **Prefix caching** (optional), at block granularity and in two levels, as inference-perf's
   ``shared_prefix`` data repeats both the group's system prompt and each user's whole prompt:
   the full blocks of a group's system prompt, and the full blocks of a distinct prompt (at most
   ``prompt - 1`` tokens, vLLM always computes the last prompt token) become cached at the end of
   the first step in which a request has computed them. A later request (first schedule or resume)
   counts the longest cached level as computed. Cached blocks belong to the cache, not to the
   requests that hit them, and are never evicted; new prompts stop being cached once the cache
   holds ``cache_fraction`` of the KV blocks (so the cache can never starve the engine).

Batch-table columns (the engine's truth, ``physics/basis.py``): resumed recomputation counts as a
prefill chunk (attention over a context); ``decode_ctx_tokens`` sums ``computed + 1`` (the sequence
length including the token being decoded, consistent with ``prefill_kv_tokens = o + c``). The
``step.BATCH_SUMMARY`` view classifies requests as vLLM does (prefill = no output yet), so a
recompute of a request with output counts as decode tokens there.

Timing: step ``s`` starts at ``t_s``; its ``schedule()`` CPU time ``cpu_s`` is lognormal around
``cpu_base + cpu_per_request * n_scheduled`` and always below the iteration time; the iteration
time is ``mean(batch_s) * exp(eps)`` with ``eps`` a clipped scaled Student-t draw; the next step
starts at ``t_s + iteration_s`` or, when nothing is runnable, shortly after the next arrival.

The per-step loop runs compiled (:mod:`bayes_latency.schedule.loop`, numba over flat
arrays); :func:`run_engine` prepares its inputs and assembles the result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from bayes_latency.schedule.loop import STEP_FLOAT_COLUMNS, STEP_INT_COLUMNS, run_loop
from bayes_latency.schedule.steptime import StepTimeModel

# event codes
EV_QUEUED, EV_SCHED_FIRST, EV_SCHED_RESUME, EV_FIRST_TOKEN, EV_PREEMPTED, EV_FINISHED = range(6)
EVENT_NAMES: tuple[str, ...] = ("QUEUED", "SCHEDULED", "SCHEDULED", "FIRST_TOKEN", "PREEMPTED",
                                "FINISHED")

BATCH_TABLE_COLUMNS: tuple[str, ...] = (
    "num_prefill_reqs", "prefill_tokens", "prefill_attn_pairs", "prefill_kv_tokens",
    "prefill_input_pairs", "num_decode_reqs", "decode_tokens", "decode_ctx_tokens",
)

STEP_COLUMNS: tuple[str, ...] = (
    "ts_start_ns",
    *BATCH_TABLE_COLUMNS,
    "sum_num_prefill_reqs", "sum_num_decode_reqs", "sum_prefill_tokens", "sum_decode_tokens",
    "running_depth", "waiting_depth", "num_finished", "num_preempted", "blocks_free",
    "mean_us", "iteration_ns", "cpu_ns", "sampled", "rich",
)
"""Columns of :attr:`EngineResult.steps` besides ``step_id`` (``sum_*`` = BATCH_SUMMARY view)."""


@dataclass(frozen=True)
class EngineConfig:
    """Scheduler knobs and KV capacity of one engine.

    Attributes
    ----------
    max_num_batched_tokens, max_num_seqs, block_size : int
        vLLM scheduler knobs.
    kv_capacity_blocks : int
        GPU KV-cache blocks (``kv_capacity_tokens // block_size``).
    prefix_caching, chunked_prefill : bool
        vLLM features.
    cache_fraction : float
        Largest fraction of the KV blocks the prefix cache may hold.
    """

    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 128
    block_size: int = 16
    kv_capacity_blocks: int = 10_000
    prefix_caching: bool = False
    chunked_prefill: bool = True
    cache_fraction: float = 0.25

    def __post_init__(self) -> None:
        for k in ("max_num_batched_tokens", "max_num_seqs", "block_size", "kv_capacity_blocks"):
            if int(getattr(self, k)) < 1:
                raise ValueError(f"EngineConfig.{k} must be >= 1")
        if self.max_num_batched_tokens < self.max_num_seqs:
            # as vLLM requires: every running decode gets its token within the budget
            raise ValueError("EngineConfig: max_num_batched_tokens must be >= max_num_seqs")
        if not 0.0 <= self.cache_fraction < 1.0:
            raise ValueError("EngineConfig.cache_fraction must be in [0, 1)")


@dataclass(frozen=True)
class NoiseConfig:
    """Noise and timing constants of the engine.

    Attributes
    ----------
    iteration_nu, iteration_scale, iteration_clip : float
        ``log(iteration / mean) = clip(scale * t_nu, -clip, clip)``.
    cpu_base_us, cpu_per_request_us, cpu_sigma, cpu_max_fraction : float
        ``cpu = (base + per_request * n) * exp(sigma * z)``, capped at ``max_fraction * iteration``.
    wake_min_us, wake_max_us : float
        Delay between an arrival that ends an idle period and the next step start.
    step_sample_rate, rich_subsample_rate : float
        Step-tracing sampling (independent draw per step) and rich-snapshot subsampling.
    """

    iteration_nu: float = 4.0
    iteration_scale: float = 0.06
    iteration_clip: float = 1.0
    cpu_base_us: float = 300.0
    cpu_per_request_us: float = 2.0
    cpu_sigma: float = 0.3
    cpu_max_fraction: float = 0.6
    wake_min_us: float = 20.0
    wake_max_us: float = 150.0
    step_sample_rate: float = 0.1
    rich_subsample_rate: float = 0.02

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (for ``truth.yaml``)."""
        return {k: float(v) for k, v in self.__dict__.items()}


@dataclass
class EngineResult:
    """Everything the engine did, as arrays.

    Attributes
    ----------
    steps : pandas.DataFrame
        One row per step: ``step_id`` + :data:`STEP_COLUMNS`.
    events : dict[str, numpy.ndarray]
        Journey events sorted by (request, time): ``req, code, step, ts_ns, prefill_done,
        decode_done, num_preemptions``.
    chunks : pandas.DataFrame
        Prefill / recompute chunks: ``step_id, req, tokens, offset, recompute``.
    requests : dict[str, numpy.ndarray]
        Per request (input order): ``queued_ns, first_scheduled_step, first_token_step,
        finished_step, num_preemptions, cache_hit_tokens, first_token_ns, finished_ns``.
    snapshots : pandas.DataFrame
        ``step.REQUEST_SNAPSHOT`` rows of rich steps.
    kv_capacity_blocks : int
    """

    steps: pd.DataFrame
    events: dict[str, np.ndarray]
    chunks: pd.DataFrame
    requests: dict[str, np.ndarray]
    snapshots: pd.DataFrame
    kv_capacity_blocks: int
    config: EngineConfig = field(default_factory=EngineConfig)

    @property
    def n_steps(self) -> int:
        """Number of steps."""
        return len(self.steps)

    def batch_table(self) -> pd.DataFrame:
        """``step_id`` + batch-table columns + ``iteration_us`` + ``schedule_cpu_us`` (engine truth)."""
        s = self.steps
        out = s[["step_id", *BATCH_TABLE_COLUMNS]].copy()
        out["iteration_us"] = s["iteration_ns"].to_numpy() / 1000.0
        out["mean_us"] = s["mean_us"].to_numpy()
        out["schedule_cpu_us"] = s["cpu_ns"].to_numpy() / 1000.0
        out["ts_start_ns"] = s["ts_start_ns"].to_numpy()
        out["sampled"] = s["sampled"].to_numpy()
        return out


def run_engine(queued_ns: np.ndarray, prompt_len: np.ndarray, max_tokens: np.ndarray,
               group: np.ndarray, prefix_len: np.ndarray, steptime: StepTimeModel,
               config: EngineConfig, rng: np.random.Generator,
               noise: NoiseConfig | None = None,
               prompt_key: np.ndarray | None = None) -> EngineResult:
    """Run the engine over a set of requests.

    Parameters
    ----------
    queued_ns : ndarray of int
        Engine monotonic time (ns) at which each request reaches the scheduler (journey QUEUED).
    prompt_len, max_tokens : ndarray of int
        Prompt tokens and output tokens of each request (output runs to ``max_tokens``).
    group, prefix_len : ndarray of int
        Shared-prefix group and its length in tokens (used only with prefix caching).
    steptime : StepTimeModel
        True mean step time.
    config : EngineConfig
    rng : numpy.random.Generator
        Noise source.
    noise : NoiseConfig, optional
    prompt_key : ndarray of int, optional
        Id of each distinct prompt (equal ids = identical prompts, cacheable as a whole with
        prefix caching); None = only the group prefixes are shared.

    Returns
    -------
    EngineResult
    """
    nc = noise or NoiseConfig()
    cfg = config
    n = int(len(queued_ns))
    bs = int(cfg.block_size)
    budget_max = int(cfg.max_num_batched_tokens)
    capacity = int(cfg.kv_capacity_blocks)
    pc = bool(cfg.prefix_caching)
    chunked = bool(cfg.chunked_prefill)
    queued_ns = np.asarray(queued_ns, dtype=np.int64)
    prompt_len = np.asarray(prompt_len, dtype=np.int64)
    max_tokens = np.asarray(max_tokens, dtype=np.int64)
    if n and int((prompt_len + max_tokens).max()) > capacity * bs:
        raise ValueError("a request does not fit in the KV cache")
    if n and (prompt_len.min() < 1 or max_tokens.min() < 1):
        raise ValueError("prompt_len and max_tokens must be >= 1")
    if not chunked and n and int(prompt_len.max() + max_tokens.max()) > budget_max:
        raise ValueError("without chunked prefill every prompt (+ output) must fit the token budget")

    order = np.argsort(queued_ns, kind="stable")
    zeros = np.zeros(n, dtype=np.int64)
    # the prefix cache only compares ids: dense ids index its membership arrays
    _, groups = np.unique(np.asarray(group, dtype=np.int64), return_inverse=True)
    pblocks = np.asarray(prefix_len, dtype=np.int64) // bs if pc else zeros
    if pc and prompt_key is not None:
        ublocks = (prompt_len - 1) // bs
        _, keys = np.unique(np.asarray(prompt_key, dtype=np.int64), return_inverse=True)
    else:
        ublocks, keys = zeros, np.full(n, -1, dtype=np.int64)
    sl = steptime.slopes
    (st_i, st_f, ev_arr, ch_arr, sn_arr, first_sched, ft_step, fn_step, cache_hit,
     npre) = run_loop(
        rng, nc, q_sorted=np.ascontiguousarray(queued_ns[order]), arrivals=order.astype(np.int64),
        prompt=prompt_len.copy(), maxt=max_tokens.copy(), group=groups.astype(np.int64),
        pblocks=np.ascontiguousarray(pblocks, dtype=np.int64),
        key=np.ascontiguousarray(keys, dtype=np.int64),
        ublocks=np.ascontiguousarray(ublocks, dtype=np.int64),
        n_groups=int(groups.max()) + 1 if n else 0, n_keys=int(keys.max()) + 1 if n else 0,
        H=np.asarray(steptime.table_list, dtype=np.float64), c_dec=float(steptime.c_decode),
        c_npre=float(sl["num_prefill_reqs"]), c_pairs=float(sl["prefill_attn_pairs"]),
        c_pkv=float(sl["prefill_kv_tokens"]), c_ipairs=float(sl["prefill_input_pairs"]),
        c_ndec=float(sl["num_decode_reqs"]), c_ctx=float(sl["decode_ctx_tokens"]), bs=bs,
        budget_max=budget_max, max_seqs=int(cfg.max_num_seqs), pc=pc, chunked=chunked,
        pool_max=int(cfg.cache_fraction * capacity), capacity=capacity,
        cpu_base=float(nc.cpu_base_us), cpu_per=float(nc.cpu_per_request_us),
        cpu_frac=float(nc.cpu_max_fraction), s_rate=float(nc.step_sample_rate),
        r_rate=float(nc.rich_subsample_rate), wake_lo=float(nc.wake_min_us * 1000.0),
        wake_span=float((nc.wake_max_us - nc.wake_min_us) * 1000.0))

    # ------------------------------------------------------------------ assemble
    if len(st_i):
        cols: dict[str, np.ndarray] = {"step_id": np.arange(1, len(st_i) + 1, dtype=np.int64)}
        for c in STEP_COLUMNS:
            if c in STEP_FLOAT_COLUMNS:
                cols[c] = st_f[:, STEP_FLOAT_COLUMNS.index(c)]
            elif c in ("sampled", "rich"):
                cols[c] = st_i[:, STEP_INT_COLUMNS.index(c)].astype(bool)
            else:
                cols[c] = st_i[:, STEP_INT_COLUMNS.index(c)]
        st = pd.DataFrame(cols)
    else:   # no step: the column types of an empty frame, as before
        st = pd.DataFrame([], columns=list(STEP_COLUMNS))
        st.insert(0, "step_id", np.arange(1, 1, dtype=np.int64))
        for c in st.columns:
            if c not in ("mean_us", "prefill_input_pairs", "sampled", "rich"):
                st[c] = st[c].astype(np.int64)
        st["sampled"] = st["sampled"].astype(bool)
        st["rich"] = st["rich"].astype(bool)
    ts_start = st["ts_start_ns"].to_numpy()
    cpu_arr = st["cpu_ns"].to_numpy()
    it_arr = st["iteration_ns"].to_numpy()

    # QUEUED events: step = last step started at or before the queue time
    q_step = np.searchsorted(ts_start, queued_ns, side="right").astype(np.int64)
    e_req = np.concatenate([np.arange(n, dtype=np.int64), ev_arr[:, 0]])
    e_code = np.concatenate([np.full(n, EV_QUEUED, dtype=np.int64), ev_arr[:, 1]])
    e_step = np.concatenate([q_step, ev_arr[:, 2]])
    e_pd = np.concatenate([np.zeros(n, dtype=np.int64), ev_arr[:, 3]])
    e_dd = np.concatenate([np.zeros(n, dtype=np.int64), ev_arr[:, 4]])
    e_np = np.concatenate([np.zeros(n, dtype=np.int64), ev_arr[:, 5]])
    e_ts = np.empty(e_req.size, dtype=np.int64)
    e_ts[:n] = queued_ns
    if ev_arr.size:
        # engine events: in schedule() (SCHEDULED, PREEMPTED) or after the forward pass
        codes = ev_arr[:, 1]
        stp = ev_arr[:, 2]
        late = (codes == EV_FIRST_TOKEN) | (codes == EV_FINISHED)
        grp = stp * 2 + late
        # events were appended in (step, early/late) order; ordinal within each group
        start = np.r_[0, np.flatnonzero(np.diff(grp)) + 1]
        size = np.diff(np.r_[start, grp.size])
        ordinal = np.arange(grp.size) - np.repeat(start, size)
        count = np.repeat(size, size)
        frac = (ordinal + 1.0) / (count + 1.0)
        si = stp - 1
        early_ts = ts_start[si] + np.floor(cpu_arr[si] * frac).astype(np.int64)
        late_ts = ts_start[si] + it_arr[si] - 100_000 + np.floor(100_000 * frac).astype(np.int64)
        e_ts[n:] = np.where(late, late_ts, early_ts)
    o = np.lexsort((e_code == EV_FINISHED, e_ts, e_req))
    events_out = {"req": e_req[o], "code": e_code[o], "step": e_step[o], "ts_ns": e_ts[o],
                  "prefill_done": e_pd[o], "decode_done": e_dd[o], "num_preemptions": e_np[o]}

    if n and (ft_step.min() < 1 or fn_step.min() < 1):
        raise RuntimeError("engine ended with unfinished requests")
    late_of = {}
    if ev_arr.size:
        m = events_out["code"]
        for code, key in ((EV_FIRST_TOKEN, "first_token_ns"), (EV_FINISHED, "finished_ns")):
            sel = m == code
            arr = np.zeros(n, dtype=np.int64)
            arr[events_out["req"][sel]] = events_out["ts_ns"][sel]
            late_of[key] = arr
    requests = {
        "queued_ns": queued_ns, "queued_step": q_step,
        "first_scheduled_step": first_sched,
        "first_token_step": ft_step, "finished_step": fn_step,
        "num_preemptions": npre,
        "cache_hit_tokens": cache_hit,
        "first_token_ns": late_of.get("first_token_ns", np.zeros(n, dtype=np.int64)),
        "finished_ns": late_of.get("finished_ns", np.zeros(n, dtype=np.int64)),
    }
    chunk_df = pd.DataFrame(ch_arr, columns=["step_id", "req", "tokens", "offset", "recompute"],
                            dtype=np.int64)
    chunk_df["recompute"] = chunk_df["recompute"].astype(bool)
    snap_cols = ["step_id", "req", "phase", "num_prompt_tokens", "num_computed_tokens",
                 "num_output_tokens", "num_preemptions", "scheduled_tokens", "blocks_allocated",
                 "blocks_cached"]
    if len(sn_arr):
        snap_df = pd.DataFrame({c: sn_arr[:, j] for j, c in enumerate(snap_cols)})
        snap_df["phase"] = np.where(sn_arr[:, 2] == 1, "DECODE", "PREFILL").astype(object)
    else:
        snap_df = pd.DataFrame([], columns=snap_cols)
    return EngineResult(steps=st, events=events_out, chunks=chunk_df, requests=requests,
                        snapshots=snap_df, kv_capacity_blocks=capacity, config=cfg)


__all__ = ["BATCH_TABLE_COLUMNS", "EVENT_NAMES", "EV_FINISHED", "EV_FIRST_TOKEN", "EV_PREEMPTED",
           "EV_QUEUED", "EV_SCHED_FIRST", "EV_SCHED_RESUME", "EngineConfig", "EngineResult",
           "NoiseConfig", "STEP_COLUMNS", "run_engine"]
