"""Synthetic fleets: many experiment folders with known true coefficients.

:func:`simulate_fleet` (behind ``bayes-latency simulate``) writes one folder per experiment
(configuration x workload) plus a fleet-level ``truth.yaml``. Presets:

``tiny``
    3 experiments, a few hundred requests each, a few seconds: Llama-2-7B H100 (prefix caching off),
    Mixtral H100 TP2 (prefix caching on) and a KV-starved Llama-2-7B A100 run that preempts.
``small``
    6 configurations x ``general``, about 20k steps (< 15 s).
``demo``
    13 configurations (Llama-2-7B, CodeLlama-34B, Llama-2-70B, Mixtral-8x7B on H100 and A100 at
    the TP degrees where they fit) x (``general``, ``codegen``), over 100k steps; prefix caching
    on in two experiments.

Durations of the real profiles are shortened; when a configuration cannot sustain a workload's
real rates (e.g. 70B on A100 without prefix caching), all its stage rates are scaled down together
so the highest stage runs at :data:`TARGET_UTILISATION` of the estimated capacity (written to
``profile.yaml``, which always holds the rates actually used).
"""

from __future__ import annotations

import shutil
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from bayes_latency.errors import ConfigError
from bayes_latency.physics.basis import (
    ACTIVATION_RESERVE,
    ALPHA_TERMS,
    DEFAULT_TERMS,
    kv_capacity_tokens,
    weight_bytes_per_gpu,
)
from bayes_latency.physics.hardware import load_gpu
from bayes_latency.physics.models import load_architecture
from bayes_latency.physics.serving import ServingConfig
from bayes_latency.schedule.engine import EngineConfig, EngineResult, NoiseConfig, run_engine
from bayes_latency.schedule.steptime import StepTimeModel
from bayes_latency.synth.truth import (
    ALPHA_NOISE_SIGMA,
    ConfigTruth,
    config_id,
    population_dict,
    true_coefficients,
)
from bayes_latency.synth.workloads import RequestSet, Workload, generate_requests, load_workload
from bayes_latency.synth.writer import (
    RequestIds,
    RequestTimes,
    make_ids,
    write_experiment,
)

ENGINE_T0_NS = 20_000_000_000_000
"""Engine monotonic clock at the start of every run (20,000 s)."""
FIRST_SEND_NS = 1_000_000_000
"""First client send, 1 s after the engine clock origin."""
TARGET_UTILISATION = 0.85
"""Highest stage rate as a fraction of the estimated capacity when the real rates are too high."""

HF_NAMES: dict[str, str] = {
    "llama-2-7b": "meta-llama/Llama-2-7b-hf",
    "llama-2-70b": "meta-llama/Llama-2-70b-hf",
    "codellama-34b": "codellama/CodeLlama-34b-Instruct-hf",
    "mixtral-8x7b": "mistralai/Mixtral-8x7B-v0.1",
}
"""Served model names (``gen_ai.response.model``, ``profile.yaml``) of the short names."""


@dataclass(frozen=True)
class ExperimentSpec:
    """One synthetic experiment.

    Attributes
    ----------
    model, gpu : str
        Short model name and GPU name (as written in ``serving.yaml``).
    tp : int
    workload : Workload
        Workload with the durations to run (rates may be lowered, see ``auto_rate``).
    prefix_caching : bool
    max_num_batched_tokens, max_num_seqs, max_model_len, block_size : int
    gpu_memory_utilization : float
    kv_tokens : int, optional
        Force a KV capacity (tokens) by lowering ``gpu_memory_utilization`` (stress runs).
    auto_rate : bool
        Scale the stage rates down when the configuration cannot sustain them.
    step_sample_rate, rich_subsample_rate : float
        Step tracing sampling.
    experiment_id : str, optional
        Default ``<model>-<gpu>-tp<N>-<workload>[-pc]``.
    """

    model: str
    gpu: str
    tp: int
    workload: Workload
    prefix_caching: bool = False
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 128
    max_model_len: int = 4096
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    kv_tokens: int | None = None
    auto_rate: bool = True
    step_sample_rate: float = 0.1
    rich_subsample_rate: float = 0.02
    experiment_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def id(self) -> str:
        """The experiment id (folder name)."""
        if self.experiment_id:
            return self.experiment_id
        pc = "-pc" if self.prefix_caching else ""
        return f"{self.model}-{self.gpu.lower()}-tp{self.tp}-{self.workload.name}{pc}"

    @property
    def config_id(self) -> str:
        """``"model|gpu|tpN"``."""
        return config_id(self.model, self.gpu, self.tp)


@dataclass
class ExperimentRun:
    """In-memory result of one simulated experiment (before or after writing)."""

    spec: ExperimentSpec
    workload: Workload
    serving: ServingConfig
    truth: ConfigTruth
    requests: RequestSet
    engine: EngineResult
    times: RequestTimes
    ids: RequestIds
    steptime: StepTimeModel
    writer_rng: np.random.Generator | None = None
    folder: Path | None = None
    counts: dict[str, int] = field(default_factory=dict)


# ----------------------------------------------------------------------------- presets
def _w(name: str, factor: float) -> Workload:
    return load_workload(name).scaled(duration_factor=factor)


DEMO_CONFIGS: tuple[tuple[str, str, int], ...] = (
    ("llama-2-7b", "H100", 1), ("llama-2-7b", "A100", 1), ("llama-2-7b", "H100", 2),
    ("codellama-34b", "H100", 2), ("codellama-34b", "A100", 2),
    ("codellama-34b", "H100", 4), ("codellama-34b", "A100", 4),
    ("llama-2-70b", "H100", 4), ("llama-2-70b", "A100", 4),
    ("mixtral-8x7b", "H100", 2), ("mixtral-8x7b", "A100", 2),
    ("mixtral-8x7b", "H100", 4), ("mixtral-8x7b", "A100", 4),
)
"""(model, gpu, tp) of the demo fleet (Llama-2-70B does not fit TP2 with room for KV)."""

SMALL_CONFIGS: tuple[tuple[str, str, int], ...] = (
    ("llama-2-7b", "H100", 1), ("llama-2-7b", "A100", 1), ("codellama-34b", "H100", 2),
    ("llama-2-70b", "H100", 4), ("mixtral-8x7b", "H100", 2), ("mixtral-8x7b", "A100", 4),
)

DEMO_PREFIX_CACHING: frozenset[tuple[str, str, int, str]] = frozenset({
    ("llama-2-7b", "H100", 1, "general"), ("mixtral-8x7b", "A100", 2, "codegen"),
})

FLEETS = ("tiny", "small", "demo")


def fleet_specs(fleet: str) -> list[ExperimentSpec]:
    """The experiments of a fleet preset (``tiny``, ``small``, ``demo``).

    Raises
    ------
    ConfigError
        Unknown preset.
    """
    if fleet == "tiny":
        return [
            ExperimentSpec("llama-2-7b", "H100", 1, load_workload("general").with_stages([(8, 8), (6, 20)])),
            ExperimentSpec("mixtral-8x7b", "H100", 2,
                           load_workload("codegen").with_stages([(10, 5), (6, 10)]),
                           prefix_caching=True),
            ExperimentSpec("llama-2-7b", "A100", 1, load_workload("general").with_stages([(6, 8), (4, 20)]),
                           kv_tokens=6000, auto_rate=False,
                           experiment_id="llama-2-7b-a100-tp1-general-kvstress"),
        ]
    if fleet == "small":
        return [ExperimentSpec(m, g, tp, _w("general", 1 / 25)) for m, g, tp in SMALL_CONFIGS]
    if fleet == "demo":
        specs = []
        for m, g, tp in DEMO_CONFIGS:
            for wl in ("general", "codegen"):
                specs.append(ExperimentSpec(m, g, tp, _w(wl, 1 / 15),
                                            prefix_caching=(m, g, tp, wl) in DEMO_PREFIX_CACHING))
        return specs
    raise ConfigError(f"unknown fleet {fleet!r}; known: {', '.join(FLEETS)}")


# ----------------------------------------------------------------------------- capacity
def _memory_utilization_for(arch: Any, gpu: Any, serving: ServingConfig, kv_tokens: int) -> float:
    """``gpu_memory_utilization`` giving about ``kv_tokens`` of KV cache."""
    need = weight_bytes_per_gpu(arch, serving) + kv_tokens * arch.kv_bytes_per_token_gpu(serving.tp)
    u = need / (gpu.memory_bytes * (1.0 - ACTIVATION_RESERVE))
    u = float(np.ceil(u * 1e4) / 1e4)
    if not 0 < u <= 1:
        raise ConfigError(f"cannot fit {kv_tokens} KV tokens for {arch.name} on {gpu.name}")
    return u


def _step_time_at(steptime: StepTimeModel, rate: float, p_eff: float, prompt: float, out: float,
                  budget: int) -> tuple[float, float]:
    """Steady-state step time (µs) and decode batch at ``rate`` req/s (fixed point of Little's law).

    Per step of length ``tau``: ``rate * tau`` new requests bring ``rate * tau * p_eff`` prefill
    tokens, and ``rate * out * tau`` requests decode (each request decodes ``out`` steps).
    """
    sl = steptime.slopes
    ctx = prompt + out / 2.0
    h = steptime.table
    grid = np.arange(h.size, dtype=float)
    tau = float(h[1])
    ndec = 0.0
    for _ in range(200):
        per_s = rate * tau / 1e6
        ndec = rate * out * tau / 1e6
        ptok = min(per_s * p_eff, float(budget))
        t_tok = min(ptok + ndec, float(h.size - 1))
        new = (float(np.interp(t_tok, grid, h)) + steptime.c_decode * ndec
               + sl["num_prefill_reqs"] * per_s + sl["prefill_attn_pairs"] * ptok * (prompt - p_eff / 2)
               + sl["prefill_input_pairs"] * ptok * (prompt + p_eff / 2)
               + sl["prefill_kv_tokens"] * per_s * prompt + sl["num_decode_reqs"] * ndec
               + sl["decode_ctx_tokens"] * ndec * ctx)
        if abs(new - tau) < 1e-6 * tau:
            tau = new
            break
        tau = new
        if ndec > 1e5:
            break
    return tau, ndec


def capacity_rate(steptime: StepTimeModel, workload: Workload, max_num_seqs: int,
                  kv_capacity_tokens_: int, prefix_caching: bool) -> float:
    """Estimated highest sustainable request rate (req/s) of one configuration for one workload.

    Bisection on the rate of the steady-state step time (:func:`_step_time_at`): a rate is
    sustainable when the decode batch it implies stays below ``max_num_seqs`` and below what the
    KV cache holds, and the step's prefill tokens fit the token budget.
    """
    w = workload
    prompt = float(w.system_prompt_len + w.question_len + w.template_tokens)
    out = float(w.output_len)
    p_eff = 16.0 if prefix_caching else prompt
    budget = len(steptime.table) - 1
    max_batch = min(float(max_num_seqs), kv_capacity_tokens_ / (prompt + out / 2.0))

    def ok(rate: float) -> bool:
        tau, ndec = _step_time_at(steptime, rate, p_eff, prompt, out, budget)
        return ndec < max_batch and rate * tau / 1e6 * p_eff < budget

    lo, hi = 0.0, 1.0
    while ok(hi) and hi < 1e4:
        lo, hi = hi, hi * 2.0
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return float(lo)


# ----------------------------------------------------------------------------- one experiment
def _rng(seed: int, exp_id: str) -> list[np.random.Generator]:
    ss = np.random.SeedSequence([int(seed), zlib.crc32(exp_id.encode())])
    return [np.random.default_rng(s) for s in ss.spawn(5)]


def run_experiment(spec: ExperimentSpec, seed: int = 0,
                   noise: NoiseConfig | None = None) -> ExperimentRun:
    """Simulate one experiment in memory (no files).

    Parameters
    ----------
    spec : ExperimentSpec
    seed : int
        Fleet seed (true-coefficient effects and all noise).
    noise : NoiseConfig, optional
        Defaults use ``spec``'s sampling rates.
    """
    arch = load_architecture(spec.model)
    gpu = load_gpu(spec.gpu)
    knobs = dict(tp=spec.tp, max_num_batched_tokens=spec.max_num_batched_tokens,
                 max_num_seqs=spec.max_num_seqs, max_model_len=spec.max_model_len,
                 block_size=spec.block_size, prefix_caching=spec.prefix_caching,
                 chunked_prefill=True, gpu_memory_utilization=spec.gpu_memory_utilization)
    serving = ServingConfig(**knobs)
    if spec.kv_tokens is not None:
        serving = serving.replace(gpu_memory_utilization=_memory_utilization_for(
            arch, gpu, serving, spec.kv_tokens))
    cap_tokens = kv_capacity_tokens(arch, gpu, serving)
    if cap_tokens < spec.max_model_len:
        raise ConfigError(f"{spec.model} does not fit on {spec.gpu} at tp={spec.tp} with room for "
                          f"one max_model_len request ({cap_tokens} KV tokens)")
    truth = true_coefficients(spec.model, spec.gpu, spec.tp, DEFAULT_TERMS, ALPHA_TERMS, seed=seed)
    stm = StepTimeModel(arch, gpu, serving, truth.beta_vector(DEFAULT_TERMS), DEFAULT_TERMS)
    w = spec.workload
    if spec.auto_rate:
        cap = capacity_rate(stm, w, spec.max_num_seqs, cap_tokens, spec.prefix_caching)
        top = max(r for _, r in w.stages)
        if top > TARGET_UTILISATION * cap:
            k = TARGET_UTILISATION * cap / top
            w = w.with_stages([(d, float(np.round(r * k, 3))) for d, r in w.stages])
    r_work, r_api, r_engine, r_ids, r_steps = _rng(seed, spec.id)
    reqs = generate_requests(w, r_work, max_model_len=spec.max_model_len)
    n = len(reqs)
    arrived = ENGINE_T0_NS + FIRST_SEND_NS + np.round(reqs.send_s * 1e9).astype(np.int64)
    a_in = truth.alpha["alpha_arrival"] * np.exp(ALPHA_NOISE_SIGMA * r_api.standard_normal(n))
    queued = arrived + np.round(a_in * 1000.0).astype(np.int64)
    nc = noise or NoiseConfig(step_sample_rate=spec.step_sample_rate,
                              rich_subsample_rate=spec.rich_subsample_rate)
    ecfg = EngineConfig(max_num_batched_tokens=spec.max_num_batched_tokens,
                        max_num_seqs=spec.max_num_seqs, block_size=spec.block_size,
                        kv_capacity_blocks=cap_tokens // spec.block_size,
                        prefix_caching=spec.prefix_caching, chunked_prefill=True)
    key = reqs.group * int(w.num_users_per_system_prompt) + reqs.user
    eng = run_engine(queued, reqs.prompt_len, reqs.max_tokens, reqs.group, reqs.prefix_len, stm,
                     ecfg, r_engine, noise=nc, prompt_key=key)
    a_out = ((truth.alpha["alpha_post_decode"] + truth.alpha["alpha_per_token"] * reqs.max_tokens)
             * np.exp(ALPHA_NOISE_SIGMA * r_api.standard_normal(n)))
    departed = eng.requests["finished_ns"] + np.round(a_out * 1000.0).astype(np.int64)
    net1 = r_api.uniform(150e3, 600e3, size=n).astype(np.int64)
    net2 = r_api.uniform(100e3, 400e3, size=n).astype(np.int64)
    times = RequestTimes(arrived_ns=arrived, departed_ns=departed,
                         client_first_token_ns=eng.requests["first_token_ns"] + net1,
                         client_end_ns=departed + net2)
    ids = make_ids(n, r_ids)
    return ExperimentRun(spec=spec, workload=w, serving=serving, truth=truth, requests=reqs,
                         engine=eng, times=times, ids=ids, steptime=stm, writer_rng=r_steps)


def _serving_doc(run: ExperimentRun) -> dict[str, Any]:
    s, sv = run.spec, run.serving
    return {
        "experiment_id": s.id, "model": s.model, "gpu": s.gpu, "tp": int(s.tp),
        "workload": run.workload.name,
        "max_num_batched_tokens": int(sv.max_num_batched_tokens),
        "max_num_seqs": int(sv.max_num_seqs), "max_model_len": int(sv.max_model_len),
        "block_size": int(sv.block_size), "prefix_caching": bool(sv.prefix_caching),
        "chunked_prefill": bool(sv.chunked_prefill), "step_sample_rate": float(s.step_sample_rate),
        "gpu_memory_utilization": float(sv.gpu_memory_utilization),
    }


def _truth_doc(run: ExperimentRun, seed: int, nc: NoiseConfig) -> dict[str, Any]:
    t = run.truth
    eng = run.engine
    return {
        "schema_version": 1,
        "experiment_id": run.spec.id,
        "config_id": t.config_id, "model": t.model, "gpu": t.gpu, "tp": int(t.tp),
        "workload": run.workload.name, "seed": int(seed),
        "terms": list(DEFAULT_TERMS),
        "beta": {k: float(v) for k, v in t.beta.items()},
        "alpha": {k: float(v) for k, v in t.alpha.items()},
        "population": population_dict(DEFAULT_TERMS, ALPHA_TERMS),
        "effects": {f: {k: float(v) for k, v in e.items()} for f, e in t.effects.items()},
        "noise": {
            "iteration": {"dist": "log_student_t", "nu": nc.iteration_nu,
                          "scale": nc.iteration_scale, "clip": nc.iteration_clip},
            "schedule_cpu_us": {"base": nc.cpu_base_us, "per_request": nc.cpu_per_request_us,
                                "sigma": nc.cpu_sigma, "max_fraction_of_iteration": nc.cpu_max_fraction},
            "alpha": {"dist": "lognormal", "sigma": ALPHA_NOISE_SIGMA},
        },
        "engine": {
            "kv_capacity_blocks": int(eng.kv_capacity_blocks),
            "steps": int(eng.n_steps), "requests": len(run.requests),
            "preemptions": int(eng.requests["num_preemptions"].sum()),
            "prefix_cache_hit_requests": int((eng.requests["cache_hit_tokens"] > 0).sum()),
            "stage_rates": [float(r) for _, r in run.workload.stages],
        },
    }


def simulate_experiment(spec: ExperimentSpec, out: Path, seed: int = 0,
                        noise: NoiseConfig | None = None) -> ExperimentRun:
    """Simulate one experiment and write its folder ``out / spec.id``."""
    nc = noise or NoiseConfig(step_sample_rate=spec.step_sample_rate,
                              rich_subsample_rate=spec.rich_subsample_rate)
    run = run_experiment(spec, seed=seed, noise=nc)
    folder = Path(out) / spec.id
    if folder.exists():
        shutil.rmtree(folder)
    model_name = HF_NAMES.get(spec.model, spec.model)
    r = run.requests
    run.counts = write_experiment(
        folder, serving=_serving_doc(run), profile=run.workload.to_profile(model_name),
        truth=_truth_doc(run, seed, nc), engine=run.engine, times=run.times, ids=run.ids,
        prompt_len=r.prompt_len, max_tokens=r.max_tokens, stage=r.stage,
        schedule_delay_s=r.schedule_delay_s, stage_rates=[float(x) for _, x in run.workload.stages],
        model_name=model_name, rng=run.writer_rng or np.random.default_rng(seed))
    run.folder = folder
    return run


def simulate_fleet(fleet: str, out: Path, seed: int = 0, progress: bool = True,
                   specs: list[ExperimentSpec] | None = None) -> list[Path]:
    """Write a synthetic fleet of experiment folders into ``out``.

    Parameters
    ----------
    fleet : str
        Preset: ``tiny``, ``small`` or ``demo``.
    out : Path
        Output folder (created); one sub-folder per experiment and a fleet ``truth.yaml``.
    seed : int
        Same seed -> same bytes.
    progress : bool
        One line per experiment on stderr.
    specs : list of ExperimentSpec, optional
        Custom experiments instead of the preset (``fleet`` is then only a label).

    Returns
    -------
    list of Path
        The experiment folders, in order.
    """
    out = Path(out)
    specs = fleet_specs(fleet) if specs is None else specs
    ids = [s.id for s in specs]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"duplicate experiment ids in fleet {fleet!r}")
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    folders: list[Path] = []
    configs: dict[str, Any] = {}
    experiments: dict[str, Any] = {}
    levels: dict[str, dict[str, Any]] = {"model": {}, "gpu": {}, "tp": {}}
    tot_steps = tot_req = 0
    for k, spec in enumerate(specs, 1):
        t0 = time.perf_counter()
        run = simulate_experiment(spec, out, seed=seed)
        assert run.folder is not None
        folders.append(run.folder)
        t = run.truth
        configs[t.config_id] = {"model": t.model, "gpu": t.gpu, "tp": int(t.tp),
                                "beta": {a: float(b) for a, b in t.beta.items()},
                                "alpha": {a: float(b) for a, b in t.alpha.items()}}
        for f, lvl in (("model", t.model), ("gpu", t.gpu), ("tp", int(t.tp))):
            levels[f][lvl] = {a: float(b) for a, b in t.effects[f].items()}
        experiments[spec.id] = {"config_id": t.config_id, "workload": run.workload.name,
                                "prefix_caching": bool(spec.prefix_caching),
                                "steps": run.counts["steps"], "requests": run.counts["requests"],
                                "preemptions": int(run.engine.requests["num_preemptions"].sum())}
        tot_steps += run.counts["steps"]
        tot_req += run.counts["requests"]
        if progress:
            print(f"[{k}/{len(specs)}] {spec.id}: {run.counts['steps']} steps, "
                  f"{run.counts['requests']} requests, {time.perf_counter() - t0:.1f} s",
                  file=sys.stderr, flush=True)
    doc = {
        "schema_version": 1, "fleet": fleet, "seed": int(seed),
        "terms": list(DEFAULT_TERMS), "alpha_terms": list(ALPHA_TERMS),
        "population": population_dict(DEFAULT_TERMS, ALPHA_TERMS),
        "effects": levels, "configurations": configs, "experiments": experiments,
        "totals": {"experiments": len(specs), "configurations": len(configs),
                   "steps": tot_steps, "requests": tot_req},
    }
    with open(out / "truth.yaml", "w", encoding="utf-8") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
    if progress:
        print(f"fleet {fleet!r}: {len(specs)} experiments, {len(configs)} configurations, "
              f"{tot_steps} steps, {tot_req} requests in {time.perf_counter() - t_start:.1f} s",
              file=sys.stderr, flush=True)
    return folders


__all__ = ["DEMO_CONFIGS", "ENGINE_T0_NS", "ExperimentRun", "ExperimentSpec", "FLEETS", "HF_NAMES",
           "SMALL_CONFIGS", "TARGET_UTILISATION", "capacity_rate", "fleet_specs", "run_experiment",
           "simulate_experiment", "simulate_fleet"]
