"""Client-side results as observations: replay a run's workload, read its means as linear rows.

A client benchmark (inference-perf lifecycle metrics, ``vllm bench serve`` JSON, BLIS TraceV2)
reports per-run or per-stage means of TTFT and E2E. Once the run's schedule is known, each
request's latencies are sums of the iteration times of the steps it waited and ran through,
plus its alpha terms, so every such mean is **linear in the coefficients**:

    TTFT_r = alpha_0 + alpha_2 + sum_s w_rs * x_s . beta                s in [s0_r, FT_r]
    E2E_r  = alpha_0 + alpha_1 + N_r alpha_2 + sum_s w_rs * x_s . beta  s in [s0_r, FIN_r]

with ``x_s`` the basis features of step ``s``, ``s0_r`` the step running when request ``r``
reached the queue (weight ``w`` = the fraction of that step still to run: the request waits for
it), ``FT_r`` / ``FIN_r`` the steps of its first and last token (weight 1), and the alpha terms
with BLIS's meaning (``sim/simulator.go``: alpha_0 delays the queueing, alpha_2 is added to the
first-token time and to every inter-token interval, alpha_1 once at completion). The mean over
requests of a run is then one observation row whose features are the mean path features.

The schedule comes from **replaying** the workload through the package's vLLM scheduler
(:func:`bayes_latency.schedule.engine.run_engine`, the reference scheduling policy, with prefix
caching at two levels as inference-perf's shared-prefix data needs) at given coefficients, with
no noise. The weights ``w`` and the batches depend on the coefficients (slower steps batch more
requests), so a fit iterates: replay at the current coefficients, fit, replay again at the
posterior mean until the rows stop moving (:mod:`bayes_latency.calibrate.loop`).

Kinds of the rows (:data:`WORKLOAD_KINDS`):

- ``workload_ttft`` (fitted): mean TTFT of the stage's successful requests.
- ``workload_e2e`` (fitted): mean E2E.
- ``workload_decode`` (role ``ppc``, checked, not fitted): the mean decode interval
  ``(mean E2E - mean TTFT) / (mean output length - 1)``, the definition the real runs' README
  gives; it is a function of the two fitted means, so fitting it too would count them twice.

Units: µs, like every ``value_us``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from bayes_latency.data.observations.build import DEFAULT_STACK, _finish, _rows, config_id
from bayes_latency.errors import ConfigError
from bayes_latency.physics.architecture import Architecture
from bayes_latency.physics.basis import DEFAULT_TERMS, basis_matrix, term_names
from bayes_latency.physics.hardware import GPU
from bayes_latency.physics.serving import ServingConfig

__all__ = ["MAX_CACHE_FRACTION", "MAX_ELASTICITY", "TTFT_ALPHA", "WORKLOAD_KINDS", "ClientStage",
           "Replay", "cache_fraction", "elasticities",
           "observed_means", "predicted_means", "replay_stage", "stage_requests", "stratified_lengths",
           "workload_rows"]

#: Observation kinds of client-side means (see the module docstring).
WORKLOAD_KINDS: tuple[str, ...] = ("workload_ttft", "workload_e2e", "workload_decode")
#: The alpha terms in a request's TTFT, with their weights (BLIS's ``sim/simulator.go``: the
#: arrival overhead and the first output token's).
TTFT_ALPHA: dict[str, float] = {"alpha_arrival": 1.0, "alpha_per_token": 1.0}
#: A replay's engine wakes this long after an arrival that ends an idle period (ns): the engine
#: needs a positive delay; BLIS starts a step at the queueing time itself.
_WAKE_NS = 1


#: How a stage's prompts share their tokens (:attr:`ClientStage.prompt_sharing`).
PROMPT_SHARING = ("prompt", "system")


@dataclass(frozen=True)
class ClientStage:
    """One load stage of a client run, as much as a replay needs, and what the client measured.

    Either the requests are given (``arrival_s``, ``prompt_tokens``, ``output_tokens``: recorded
    per request, e.g. ``vllm bench serve --save-detailed`` or TraceV2), or they are drawn: ``count``
    Poisson arrivals at ``rate`` req/s, prompts of ``prompt_len`` tokens and output lengths from
    ``output_pdf`` (``{tokens: probability}``, stratified so the sample's distribution is the
    pdf's).

    Prompts: ``num_groups`` shared system prompts of ``system_prompt_len`` tokens, each with
    ``users_per_group`` users whose whole prompt repeats (inference-perf's ``shared_prefix``
    data, ``prompt_sharing = "prompt"``), so with prefix caching a user's later requests compute
    only the prompt's last partial block; ``prompt_sharing = "system"``: only the system prompt
    is shared and every request computes the rest of its prompt (how BLIS's own expansion of an
    inference-perf spec caches). ``num_groups = 0``: every prompt distinct, nothing shared.

    Attributes
    ----------
    run_id, stage
        Names of the run and the stage (the rows' ``experiment_id`` is ``run_id/stage``).
    model, gpu, tp
        The configuration (names as :func:`~bayes_latency.physics.models.load_architecture`
        and :func:`~bayes_latency.physics.hardware.load_gpu` accept them).
    observed
        The client's means in µs: ``ttft_mean_us``, ``e2e_mean_us`` (NaN when not measured) and
        ``output_len_mean`` (tokens; the denominator of the decode interval).
    kv_blocks
        KV-cache blocks of one GPU (vLLM's ``num_gpu_blocks``).
    """

    run_id: str
    stage: int
    model: str
    gpu: str
    tp: int
    observed: Mapping[str, float]
    kv_blocks: int
    rate: float = math.nan
    count: int = 0
    prompt_len: int = 0
    output_pdf: Mapping[int, float] = field(default_factory=dict)
    system_prompt_len: int = 0
    num_groups: int = 0
    users_per_group: int = 1
    arrival_s: tuple[float, ...] | None = None
    prompt_tokens: tuple[int, ...] | None = None
    output_tokens: tuple[int, ...] | None = None
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 128
    block_size: int = 16
    prefix_caching: bool = True
    workload: str = "client"
    weight: float = 1.0
    prompt_sharing: str = "prompt"

    @property
    def experiment_id(self) -> str:
        """``run_id/stage<N>``: the rows' experiment id."""
        return f"{self.run_id}/stage{self.stage}"

    @property
    def arrival_rate(self) -> float:
        """Arrivals per second: ``rate`` for drawn requests; for recorded ones, ``(n - 1)`` over
        the span of their send times (inf when they span no time)."""
        if self.arrival_s is None:
            return float(self.rate)
        span = max(self.arrival_s) - min(self.arrival_s)
        return (len(self.arrival_s) - 1) / span if span > 0 else math.inf

    @property
    def config_id(self) -> str:
        """The configuration key of the rows (canonical model and GPU names)."""
        from bayes_latency.physics.hardware import load_gpu
        from bayes_latency.physics.models import load_architecture

        return config_id(load_architecture(self.model).name, load_gpu(self.gpu).name, self.tp)

    def validate(self) -> None:
        """Raise :class:`~bayes_latency.errors.ConfigError` naming the field that cannot work."""
        where = f"client stage {self.experiment_id}"
        if self.arrival_s is None:
            if not (self.rate > 0 and math.isfinite(self.rate)):
                raise ConfigError(f"{where}: rate must be > 0 req/s (got {self.rate!r})")
            if self.count < 1:
                raise ConfigError(f"{where}: count must be >= 1 (got {self.count!r})")
            if self.prompt_len < 1:
                raise ConfigError(f"{where}: prompt_len must be >= 1 (got {self.prompt_len!r})")
            if not self.output_pdf or min(self.output_pdf) < 1:
                raise ConfigError(f"{where}: output_pdf must give lengths >= 1")
        else:
            n = len(self.arrival_s)
            if n < 1 or self.prompt_tokens is None or self.output_tokens is None \
                    or len(self.prompt_tokens) != n or len(self.output_tokens) != n:
                raise ConfigError(f"{where}: arrival_s, prompt_tokens and output_tokens must have "
                                  "the same length >= 1")
            if min(self.prompt_tokens) < 1 or min(self.output_tokens) < 1:
                raise ConfigError(f"{where}: prompt and output tokens must be >= 1")
        if self.kv_blocks < 1:
            raise ConfigError(f"{where}: kv_blocks must be >= 1")
        if self.prompt_sharing not in PROMPT_SHARING:
            raise ConfigError(f"{where}: prompt_sharing must be one of {PROMPT_SHARING} "
                              f"(got {self.prompt_sharing!r})")
        if self.num_groups and self.system_prompt_len >= self.prompt_len > 0:
            raise ConfigError(f"{where}: system_prompt_len must be below prompt_len")


def stratified_lengths(pdf: Mapping[int, float], n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` lengths whose empirical distribution is ``pdf`` (midpoint quantiles, shuffled)."""
    keys = np.array(sorted(pdf), dtype=np.int64)
    p = np.array([pdf[int(k)] for k in keys], dtype=float)
    cdf = np.cumsum(p / p.sum())
    u = (np.arange(n) + 0.5) / n
    out = keys[np.minimum(np.searchsorted(cdf, u, side="left"), len(keys) - 1)]
    return rng.permutation(out)


def stage_requests(stage: ClientStage, seed: int = 0) -> pd.DataFrame:
    """The stage's requests: ``arrival_ns, prompt_len, max_tokens, group, prefix_len, prompt_key``.

    Recorded requests are used as they are; otherwise they are drawn (seeded, so every replay of a
    stage sees the same requests: common random numbers across coefficient values).
    """
    stage.validate()
    rng = np.random.default_rng([seed, stage.stage, len(stage.run_id)])
    if stage.arrival_s is not None:
        arr = np.asarray(stage.arrival_s, dtype=float)
        arr = arr - np.nanmin(arr)
        prompt = np.asarray(stage.prompt_tokens, dtype=np.int64)
        out = np.asarray(stage.output_tokens, dtype=np.int64)
        n = arr.size
    else:
        n = int(stage.count)
        arr = np.cumsum(rng.exponential(1.0 / stage.rate, size=n))
        arr -= arr[0]
        prompt = np.full(n, int(stage.prompt_len), dtype=np.int64)
        out = stratified_lengths(stage.output_pdf, n, rng)
    if stage.num_groups > 0:
        n_users = int(stage.num_groups) * max(int(stage.users_per_group), 1)
        user = rng.integers(0, n_users, size=n)
        group = user // max(int(stage.users_per_group), 1)
        prefix = np.full(n, int(stage.system_prompt_len), dtype=np.int64)
        # "prompt": a user's whole prompt repeats; "system": every prompt is its own past the
        # shared system prompt
        key = user if stage.prompt_sharing == "prompt" else np.arange(n, dtype=np.int64) + n
    else:
        group = np.arange(n, dtype=np.int64)
        prefix = np.zeros(n, dtype=np.int64)
        key = np.arange(n, dtype=np.int64) + n   # distinct prompts: never a whole-prompt hit
    return pd.DataFrame({"arrival_ns": np.round(arr * 1e9).astype(np.int64),
                         "prompt_len": prompt, "max_tokens": out, "group": group,
                         "prefix_len": prefix, "prompt_key": key})


@dataclass
class Replay:
    """What one replay of a stage gives: mean path features and the engine's own means.

    Attributes
    ----------
    features
        ``{kind: (K,) mean path features}`` over ``terms`` for ``workload_ttft``,
        ``workload_e2e`` and ``workload_decode`` (before alpha terms).
    alpha
        ``{kind: {alpha_term: feature}}``.
    engine_us
        ``{kind: the engine's own mean (µs) at the replayed beta, before alpha}``; equal to
        ``features[kind] . beta`` (a check of the linear form).
    n_requests, n_steps, mean_output
        Size of the replay; mean output tokens of the replayed requests.
    n_preemptions
        Preemptions in the replay (KV pressure).
    steps, step_features
        The replayed steps' batch table (one row per engine step, the columns of
        :data:`~bayes_latency.physics.batches.BATCH_COLUMNS`) and their features over ``terms``
        (steps x terms), kept only on request (``replay_stage(keep_steps=True)``), else None.
    """

    features: dict[str, np.ndarray]
    alpha: dict[str, dict[str, float]]
    engine_us: dict[str, float]
    n_requests: int
    n_steps: int
    mean_output: float
    n_preemptions: int
    terms: tuple[str, ...] = ()
    steps: pd.DataFrame | None = None
    step_features: np.ndarray | None = None


def _config(stage: ClientStage, arch: Architecture) -> ServingConfig:
    return ServingConfig(tp=int(stage.tp), max_num_batched_tokens=int(stage.max_num_batched_tokens),
                         max_num_seqs=int(stage.max_num_seqs), block_size=int(stage.block_size),
                         prefix_caching=bool(stage.prefix_caching))


#: Largest share of the KV blocks a replay's prefix cache may hold (:func:`cache_fraction`).
MAX_CACHE_FRACTION = 0.5


def cache_fraction(req: pd.DataFrame, block_size: int, kv_blocks: int) -> float:
    """Share of the KV blocks the replay's prefix cache may hold: room for every prompt the
    stage sends more than once (its group's prefix blocks and its own), at least the engine's
    default (:class:`~bayes_latency.schedule.engine.EngineConfig`, 0.25) and at most
    :data:`MAX_CACHE_FRACTION`.

    vLLM keeps a finished request's prompt blocks cached in the free blocks and evicts the least
    recently used only when it needs them, so a stage whose repeated prompts fit beside its
    running requests hits the cache on every repeat. The engine's cache never evicts and stops
    caching new prompts at its cap: at the default 0.25, Llama-2-7B TP1 roleplay (50 users x
    786-token prompts, 2,093 blocks of 6,886) left 15 users uncached and the replay computed 133
    prompt tokens per request instead of 6.6 (the real server: median 2-4 prefill tokens per
    step), which the fit then read as prefill cost.
    """
    from bayes_latency.schedule.engine import EngineConfig

    default = float(EngineConfig.cache_fraction)
    if len(req) == 0 or kv_blocks < 1:
        return default
    bs = int(block_size)
    groups = req.drop_duplicates("group")
    need = int((groups["prefix_len"].to_numpy(np.int64) // bs).sum())
    key = req["prompt_key"].to_numpy(np.int64)
    _, first, counts = np.unique(key, return_index=True, return_counts=True)
    rep = first[counts > 1]                       # one request of each repeated prompt
    own = (req["prompt_len"].to_numpy(np.int64)[rep] - 1) // bs \
        - req["prefix_len"].to_numpy(np.int64)[rep] // bs
    need += int(np.maximum(own, 0).sum())
    return float(min(max(default, (need + 1) / kv_blocks), MAX_CACHE_FRACTION))


def replay_stage(stage: ClientStage, arch: Architecture, gpu: GPU, beta: Sequence[float],
                 terms: Sequence[str] = DEFAULT_TERMS, seed: int = 0,
                 keep_steps: bool = False) -> Replay:
    """Replay one stage through the reference scheduler at ``beta`` and read its linear rows.

    Parameters
    ----------
    stage
        The workload and the measured means.
    arch, gpu
        The configuration's architecture and GPU.
    beta
        Coefficients of ``terms`` (µs per feature unit) that time the replayed steps.
    terms
        Term set of ``beta``.
    seed
        Seed of drawn requests (see :func:`stage_requests`).
    keep_steps
        Keep the replayed steps' batch table in :attr:`Replay.steps`.

    Returns
    -------
    Replay
    """
    from bayes_latency.schedule.engine import EngineConfig, NoiseConfig, run_engine
    from bayes_latency.schedule.steptime import StepTimeModel

    terms = tuple(term_names(terms))
    beta = np.asarray(beta, dtype=float)
    if beta.shape != (len(terms),) or not np.all(np.isfinite(beta)) or np.any(beta < 0):
        raise ConfigError(f"client stage {stage.experiment_id}: beta must be {len(terms)} finite "
                          f"values >= 0 (got {beta.tolist()})")
    req = stage_requests(stage, seed)
    serving = _config(stage, arch)
    bs = int(stage.block_size)
    cap_tokens = int(stage.kv_blocks) * bs
    too_long = (req["prompt_len"] + req["max_tokens"]).to_numpy() > cap_tokens
    if too_long.any():
        raise ConfigError(f"client stage {stage.experiment_id}: {int(too_long.sum())} request(s) "
                          f"longer than the KV cache ({cap_tokens} tokens)")
    cfg = EngineConfig(max_num_batched_tokens=int(stage.max_num_batched_tokens),
                       max_num_seqs=int(stage.max_num_seqs), block_size=bs,
                       kv_capacity_blocks=int(stage.kv_blocks),
                       prefix_caching=bool(stage.prefix_caching), chunked_prefill=True,
                       cache_fraction=cache_fraction(req, bs, int(stage.kv_blocks)))
    noise = NoiseConfig(iteration_scale=0.0, iteration_clip=0.0, cpu_base_us=0.0,
                        cpu_per_request_us=0.0, cpu_sigma=0.0,
                        wake_min_us=_WAKE_NS / 1000.0, wake_max_us=_WAKE_NS / 1000.0,
                        step_sample_rate=0.0, rich_subsample_rate=0.0)
    st = StepTimeModel(arch, gpu, serving, beta, terms)
    res = run_engine(req["arrival_ns"].to_numpy(), req["prompt_len"].to_numpy(),
                     req["max_tokens"].to_numpy(), req["group"].to_numpy(),
                     req["prefix_len"].to_numpy(), st, cfg, np.random.default_rng(seed), noise,
                     prompt_key=req["prompt_key"].to_numpy())
    steps = res.steps
    X = basis_matrix(steps, arch, gpu, serving, terms)
    n_steps = len(steps)
    C = np.zeros((n_steps + 1, len(terms)))
    np.cumsum(X, axis=0, out=C[1:])
    t0 = steps["ts_start_ns"].to_numpy(np.int64)
    dur = steps["iteration_ns"].to_numpy(np.int64)
    q = res.requests["queued_ns"].astype(np.int64)
    ft = res.requests["first_token_step"].astype(np.int64)
    fin = res.requests["finished_step"].astype(np.int64)
    # step running when the request reached the queue (1-based; 0 = none started yet)
    s0 = np.searchsorted(t0, q, side="right")
    has = s0 >= 1
    idx = np.maximum(s0 - 1, 0)
    left = np.where(has, t0[idx] + dur[idx] - q, 0)
    frac = np.where(has & (left > 0), left / np.maximum(dur[idx], 1), 0.0)
    base = C[s0]                                    # sum of steps 1..s0 (s0 itself excluded)
    partial = frac[:, None] * X[idx]
    ttft_f = C[ft] - base + partial
    e2e_f = C[fin] - base + partial
    out_n = req["max_tokens"].to_numpy(float)
    mean_out = float(out_n.mean())
    L = float(stage.observed.get("output_len_mean", math.nan))
    if not (L > 1):
        L = mean_out
    f_ttft, f_e2e = ttft_f.mean(axis=0), e2e_f.mean(axis=0)
    f_dec = (f_e2e - f_ttft) / max(L - 1.0, 1e-9)
    ends = (t0 + dur)
    eng_ttft = float(((ends[ft - 1] - q) / 1000.0).mean())
    eng_e2e = float(((ends[fin - 1] - q) / 1000.0).mean())
    alpha = {
        "workload_ttft": dict(TTFT_ALPHA),
        "workload_e2e": {"alpha_arrival": 1.0, "alpha_post_decode": 1.0,
                         "alpha_per_token": mean_out},
        "workload_decode": {"alpha_post_decode": 1.0 / max(L - 1.0, 1e-9),
                            "alpha_per_token": (mean_out - 1.0) / max(L - 1.0, 1e-9)},
    }
    return Replay(features={"workload_ttft": f_ttft, "workload_e2e": f_e2e,
                            "workload_decode": f_dec},
                  alpha=alpha,
                  engine_us={"workload_ttft": eng_ttft, "workload_e2e": eng_e2e,
                             "workload_decode": (eng_e2e - eng_ttft) / max(L - 1.0, 1e-9)},
                  n_requests=int(len(req)), n_steps=int(n_steps), mean_output=mean_out,
                  n_preemptions=int(res.requests["num_preemptions"].sum()), terms=terms,
                  steps=steps.reset_index(drop=True) if keep_steps else None,
                  step_features=X if keep_steps else None)


def observed_means(stage: ClientStage) -> dict[str, float]:
    """The stage's measured means by kind (µs; NaN when not measured): mean TTFT, mean E2E and
    the decode interval ``(E2E - TTFT) / (output_len_mean - 1)``."""
    o = stage.observed
    ttft, e2e = float(o.get("ttft_mean_us", math.nan)), float(o.get("e2e_mean_us", math.nan))
    L = float(o.get("output_len_mean", math.nan))
    dec = (e2e - ttft) / (L - 1.0) if L > 1 and math.isfinite(e2e) and math.isfinite(ttft) \
        else math.nan
    return {"workload_ttft": ttft, "workload_e2e": e2e, "workload_decode": dec}


def elasticities(replay: Replay, bumped: Replay, h: float) -> dict[str, float]:
    """How the engine part of each client mean responds to scaling beta by ``1 + h``.

    ``e = (m(1+h) / m(1) - 1) / h`` of the replayed engine means: 1 when the schedule does not
    move (the mean is then exactly linear), above 1 when slower steps also make requests queue
    longer (near capacity). Clipped to ``[1, MAX_ELASTICITY]``.
    """
    out = {}
    for k in WORKLOAD_KINDS:
        m0, m1 = replay.engine_us[k], bumped.engine_us[k]
        e = (m1 / m0 - 1.0) / h if m0 > 0 and math.isfinite(m1) else 1.0
        out[k] = float(min(max(e, 1.0), MAX_ELASTICITY))
    return out


#: Largest elasticity a tangent row may carry (a stage this sensitive is past its capacity).
MAX_ELASTICITY = 50.0


def workload_rows(stage: ClientStage, replay: Replay, arch: Architecture, gpu: GPU,
                  terms: Sequence[str] = DEFAULT_TERMS,
                  elasticity: Mapping[str, float] | None = None) -> pd.DataFrame:
    """Observation rows of one replayed stage (kinds :data:`WORKLOAD_KINDS`).

    Rows whose measured mean is missing are left out. ``n_steps`` is 1 (the noise of a client
    mean is the kind's own, not a per-step noise), ``aggregate`` is ``"mean"``.

    With ``elasticity`` (:func:`elasticities`), a row is the **tangent** of the mean at the
    replayed coefficients instead of its fixed-schedule form: features ``e * f`` and value
    ``y + (e - 1) * f . beta_r`` (``f . beta_r`` = the replayed engine mean), so that the row
    predicts ``y`` at ``beta_r`` as before and moves ``e`` times faster when beta scales, as the
    replay does when queueing grows with the step time. Near a stage's capacity the
    fixed-schedule rows would let the fit overshoot and the replay/fit loop oscillate.
    """
    terms = tuple(term_names(terms))
    if tuple(replay.terms) != terms:
        raise ConfigError(f"client stage {stage.experiment_id}: replay terms {replay.terms} "
                          f"differ from the rows' terms {terms}")
    obs = observed_means(stage)
    frames = []
    for kind in WORKLOAD_KINDS:
        v = obs[kind]
        if not (math.isfinite(v) and v > 0):
            continue
        e = float((elasticity or {}).get(kind, 1.0))
        frames.append(_rows(kind, np.array([v + (e - 1.0) * replay.engine_us[kind]]),
                            e * replay.features[kind][None, :], terms,
                            n_steps=1, alpha=replay.alpha[kind], aggregate="mean"))
    if not frames:
        return _finish([], terms)
    df = pd.concat(frames, ignore_index=True)
    serving = _config(stage, arch)
    model, gname, tp = str(arch.name), str(gpu.name), int(stage.tp)
    df["experiment_id"], df["workload"] = stage.experiment_id, stage.workload
    df["model"], df["gpu"], df["tp"], df["stack"] = model, gname, tp, DEFAULT_STACK
    df["config_id"] = config_id(model, gname, tp, DEFAULT_STACK)
    df["max_num_batched_tokens"] = int(serving.max_num_batched_tokens)
    df["max_num_seqs"] = int(serving.max_num_seqs)
    df["ep"] = int(serving.ep)
    df["obs_id"] = [f"{stage.experiment_id}/{k}" for k in df["kind"]]
    out = _finish([df], terms)
    out["run_id"] = stage.run_id  # the stages of one run share its run effect (model.definition.runs)
    return out


def predicted_means(replay: Replay, beta: Sequence[float], alpha: Mapping[str, float]
                    ) -> dict[str, float]:
    """The replay's rows evaluated at coefficients (µs): ``features . beta + alpha terms``."""
    b = np.asarray(beta, dtype=float)
    return {k: float(replay.features[k] @ b
                     + sum(v * float(alpha.get(a, 0.0)) for a, v in replay.alpha[k].items()))
            for k in WORKLOAD_KINDS}

