"""The 16 real runs as BLIS experiments: real side, workload specs, KV blocks, coefficient files.

Half of the BLIS end-to-end harness (:mod:`bayes_latency.study.blis.e2e` runs and reports):

- :func:`find_runs` reads each run of ``h100-lifecycle/`` (``exp-config.yaml``, ``profile.yaml``,
  the summary and stage lifecycle metrics) into a :class:`RealRun`: the real client's numbers
  (successes only) and what BLIS needs to replay the run.
- :func:`stage_spec` writes one BLIS workload spec per load stage: explicit clients (one per
  system prompt x user, as inference-perf's shared-prefix generator), OPEN-LOOP Poisson arrivals
  at the rate the real client achieved in that stage, exactly the stage's request count, the
  profile's prompt length (each user's whole prompt is its client's cached prefix, as the real
  server cached it: :data:`SUFFIX_TOKENS`) and the output lengths the server generated
  (:func:`~bayes_latency.calibrate.stages.generated_output_pdf`: every run's profile sets
  ``ignore_eos``, so each request ran the profile's ``output_len`` tokens, whatever the client
  counted): the ``prefix`` expansion.
- :func:`inference_perf_spec` writes one BLIS workload spec per load stage whose
  ``inference_perf:`` section carries the run's own ``profile.yaml`` fields, for BLIS's own
  expansion (``sim/workload/inference_perf.go``: closed-loop sessions, the system prompt shared
  by a prompt's users, the question computed afresh for every request): the ``inference-perf``
  expansion. :func:`workload_spec` picks one of the two by name (:data:`EXPANSIONS`).
- :func:`kv_blocks_per_gpu` is BLIS's KV capacity formula (``sim/latency/kv_capacity.go``) with
  the result divided by TP: BLIS's auto value sums all GPUs' memory but divides by per-GPU block
  bytes, TP x too many blocks. On the two real runs that logged it, vLLM reported 31,356 blocks
  (Llama-2-70B TP4; this function: 31,051) and 26,602 (CodeLlama-34B TP2; 25,411).
- :func:`load_export` reads and validates a ``trained_physics_coefficients`` export (3 alphas,
  11 betas in BLIS's slot order, plus ``draws:``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from bayes_latency.calibrate.stages import (  # noqa: F401  (moved there; re-exported)
    QUANTILE_LEVELS,
    _tilt,
    empirical_pdf,
    generated_output_pdf,
    pdf_mean,
)
from bayes_latency.data.client.lifecycle import read_exp_config, read_lifecycle_dir, read_profile
from bayes_latency.errors import BayesLatencyError, TraceFormatError
from bayes_latency.physics.models import resolve_name
from bayes_latency.textfiles import load_yaml, read_text

__all__ = [
    "EXPORT_MODELS", "FIXED_FLAGS", "N_ALPHA", "N_BETA", "PUBLISHED", "QUANTILE_LEVELS", "CLIENT_TIMEOUT_S",
    "BlisSetupError", "Coefficients", "RealRun", "StageWorkload", "blis_flags",
    "empirical_pdf", "export_path", "find_runs", "kv_blocks_per_gpu", "load_export",
    "EXPANSIONS", "SUFFIX_TOKENS", "inference_perf_section", "inference_perf_spec", "pdf_mean",
    "real_data_dir", "stage_spec", "workload_spec", "write_perturbed_exports",
]

#: Scheduler / cache flags of the real servers (``exp-config.yaml``) and of every invocation.
FIXED_FLAGS: tuple[str, ...] = ("--latency-model", "trained-physics", "--hardware", "H100",
                                "--max-num-seqs", "128", "--max-num-batched-tokens", "2048",
                                "--block-size-in-tokens", "16", "--cache-signal-delay", "0",
                                "--log", "error")
#: Number of ``alpha_coeffs`` / ``beta_coeffs`` BLIS's trained-physics model reads.
N_ALPHA, N_BETA = 3, 11
#: Models of the 16 real runs, by their export name (``<model>-h100-tp<N>.yaml``).
EXPORT_MODELS: tuple[str, ...] = ("llama-2-7b", "llama-2-70b", "codellama-34b", "mixtral-8x7b")
#: The real client's per-request timeout (s): the profiles do not state it, but every failed
#: request of the 4 reasoning runs ended between 300.0 and 301.0 s (``failures.request_latency``)
#: and no success took longer than 300.4 s. Passed to BLIS as ``--timeout``.
CLIENT_TIMEOUT_S = 300
ENV_DATA = "BAYES_LATENCY_REAL_DATA"


class BlisSetupError(BayesLatencyError):
    """The BLIS binary, its data files, an export or the real data cannot be used."""


@dataclass(frozen=True)
class Coefficients:
    """One ``trained_physics_coefficients`` block: 3 alphas (µs) and 11 betas, BLIS's order."""

    alpha: tuple[float, ...]
    beta: tuple[float, ...]
    label: str = ""

    def __post_init__(self) -> None:
        if len(self.alpha) != N_ALPHA or len(self.beta) != N_BETA:
            raise BlisSetupError(
                f"{self.label or 'coefficients'}: {len(self.alpha)} alpha_coeffs and "
                f"{len(self.beta)} beta_coeffs; BLIS trained-physics wants {N_ALPHA} and {N_BETA}")
        bad = [v for v in (*self.alpha, *self.beta) if not math.isfinite(v) or v < 0]
        if bad:
            raise BlisSetupError(f"{self.label or 'coefficients'}: coefficients must be finite "
                                 f"and >= 0, got {bad[0]!r}")


#: BLIS's published ``trained_physics_coefficients`` (``defaults.yaml``, iter29).
PUBLISHED = Coefficients(
    alpha=(15563.199579, 777.3455, 45.907545),
    beta=(0.152128, 0.0, 1.36252915, 0.752037, 32.09546717, 4.41684444, 126.024825,
          481.8613888, 0.0, 1.94710771, 0.752037),
    label="blis-published")


def blis_flags(c: Coefficients) -> list[str]:
    """``--alpha-coeffs A,B,C --beta-coeffs ...`` with full float precision (``repr``)."""
    return ["--alpha-coeffs", ",".join(repr(float(v)) for v in c.alpha),
            "--beta-coeffs", ",".join(repr(float(v)) for v in c.beta)]


# ------------------------------------------------------------------------------ real side
@dataclass(frozen=True)
class StageWorkload:
    """One constant-rate load stage as the real client ran it.

    Attributes
    ----------
    index, duration_s
        Stage number and its duration in the profile (s).
    rate
        Arrival rate the real client achieved (``load_summary.achieved_rate``, req/s).
    count
        Requests sent in the stage (``load_summary.count``; successes + failures).
    output_pdf
        Output lengths the server generated for the stage's successes as ``{tokens:
        probability}`` (:func:`~bayes_latency.calibrate.stages.generated_output_pdf`: the
        profile's ``output_len`` under ``ignore_eos``, else the client's counts through
        :func:`empirical_pdf`).
    output_len_mean
        Their mean.
    """

    index: int
    duration_s: float
    rate: float
    count: int
    output_pdf: dict[int, float]
    output_len_mean: float


@dataclass(frozen=True)
class RealRun:
    """One real run: what the client measured (successes only) and what BLIS needs to replay it.

    ``real`` holds the summary over all stages: ``e2e_mean_s, e2e_p90_s, ttft_mean_s,
    ttft_p90_s, output_len_mean, decode_interval_s, successes, count`` (seconds, tokens).
    ``profile`` is the run's ``profile.yaml`` document as written (empty when unknown).
    """

    run_id: str
    path: Path
    model: str
    hf_model: str
    tp: int
    workload: str
    system_prompt_len: int
    question_len: int
    num_groups: int
    users_per_group: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    model_config: Path
    stages: tuple[StageWorkload, ...]
    real: dict[str, float] = field(default_factory=dict)
    prompt_len_mean: float = math.nan
    profile: Mapping[str, Any] = field(default_factory=dict)

    @property
    def stress(self) -> bool:
        """The overloaded reasoning runs (many timeouts): stress cases, successes only."""
        return self.workload == "reasoning"

    @property
    def short_id(self) -> str:
        """``<model>-tp<N>-<workload>``."""
        return f"{self.model}-tp{self.tp}-{self.workload}"


def real_data_dir(explicit: str | Path | None = None) -> Path | None:
    """The real-data folder (holding ``h100-lifecycle/``), or None when absent.

    Looks at ``explicit``, ``$BAYES_LATENCY_REAL_DATA``, ``<repo>/../shared/data/real`` and
    ``./../shared/data/real``.
    """
    import os

    cands = [Path(explicit)] if explicit else []
    if os.environ.get(ENV_DATA):
        cands.append(Path(os.environ[ENV_DATA]))
    cands.append(Path(__file__).resolve().parents[4] / "shared" / "data" / "real")
    cands.append(Path.cwd().parent / "shared" / "data" / "real")
    for c in cands:
        if (c / "h100-lifecycle").is_dir():
            return c
    return None


def _load_json(path: Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError) as exc:
        raise TraceFormatError(f"cannot read lifecycle metrics: {exc}", file=str(path)) from exc
    if not isinstance(doc, dict):
        raise TraceFormatError("not a JSON object", file=str(path))
    return doc


_WORKLOAD_RE = re.compile(r"-(general|codegen|roleplay|reasoning)(?:-\d+)?$")


def _read_run(run_dir: Path, model_configs: Path) -> RealRun:
    cfg = read_exp_config(run_dir / "exp-config.yaml")
    prof = read_profile(run_dir / "profile.yaml")
    table, _ = read_lifecycle_dir(run_dir)
    summary = table[table["stage"] == "summary"]
    stage_rows = table[table["stage"] != "summary"].sort_values("stage_index")
    if summary.empty or stage_rows.empty:
        raise TraceFormatError("needs summary and stage lifecycle metrics", file=str(run_dir))
    if len(stage_rows) != len(prof["stages"]):
        raise TraceFormatError(f"{len(stage_rows)} stage files for {len(prof['stages'])} profile "
                               "stages", file=str(run_dir))
    stages = []
    for (_, row), (_, duration) in zip(stage_rows.iterrows(), prof["stages"], strict=True):
        i = int(row["stage_index"])
        path = run_dir / "results" / f"stage_{i}_lifecycle_metrics.json"
        doc = _load_json(path)
        out = (doc.get("successes") or {}).get("output_len") or {}
        rate, count = float(row["achieved_rate"]), row["count"]
        if not (rate > 0 and math.isfinite(count) and count >= 1):
            raise TraceFormatError("stage without achieved_rate / count", file=str(path))
        pdf, generated = generated_output_pdf(out, prof)
        stages.append(StageWorkload(index=i, duration_s=float(duration), rate=rate,
                                    count=int(count), output_pdf=pdf,
                                    output_len_mean=pdf_mean(pdf) if generated
                                    else float(row["output_len_mean"])))
    s = summary.iloc[0]
    real = {"e2e_mean_s": s["e2e_mean_s"], "e2e_p90_s": s["e2e_p90_s"],
            "ttft_mean_s": s["ttft_mean_s"], "ttft_p90_s": s["ttft_p90_s"],
            "output_len_mean": s["output_len_mean"], "decode_interval_s": s["decode_interval_s"],
            "successes": s["successes"], "count": s["count"]}
    real = {k: float(v) for k, v in real.items()}
    short = resolve_name(cfg["model"])
    if short is None:
        raise BlisSetupError(f"{run_dir.name}: unknown model {cfg['model']!r}")
    mc = model_configs / f"{cfg['model'].split('/')[-1].lower()}.json"
    if not mc.is_file():
        raise BlisSetupError(f"{run_dir.name}: no model config {mc}")
    m = _WORKLOAD_RE.search(run_dir.name)
    return RealRun(
        run_id=run_dir.name, path=run_dir, model=short, hf_model=cfg["model"], tp=int(cfg["tp"]),
        workload=m.group(1) if m else "unknown",
        system_prompt_len=prof["system_prompt_len"], question_len=prof["question_len"],
        num_groups=prof["num_groups"], users_per_group=prof["users_per_group"],
        max_model_len=int(cfg.get("max_model_len", 4096)),
        max_num_seqs=int(cfg.get("max_num_seqs", 128)),
        max_num_batched_tokens=int(cfg.get("max_num_batched_tokens", 2048)),
        model_config=mc, stages=tuple(stages), real=real,
        profile=load_yaml(read_text(run_dir / "profile.yaml", "profile", TraceFormatError)),
        prompt_len_mean=float(_load_json(run_dir / "results" / "summary_lifecycle_metrics.json")
                              .get("successes", {}).get("prompt_len", {}).get("mean") or math.nan))


def find_runs(data_dir: str | Path, substring: str | None = None) -> list[RealRun]:
    """The real runs under ``data_dir/h100-lifecycle`` (sorted by name), optionally filtered.

    Parameters
    ----------
    data_dir
        The real-data folder (holding ``h100-lifecycle/`` and ``model-configs/``).
    substring
        Keep only runs whose folder name contains it (case-insensitive).

    Raises
    ------
    BlisSetupError
        When the folder has no run, or no run matches ``substring``.
    TraceFormatError
        When a run's files do not follow the inference-perf format.
    """
    root = Path(data_dir) / "h100-lifecycle"
    if not root.is_dir():
        raise BlisSetupError(f"no h100-lifecycle folder in {data_dir}")
    dirs = sorted(p for p in root.iterdir() if (p / "profile.yaml").is_file())
    if substring:
        dirs = [p for p in dirs if substring.lower() in p.name.lower()]
    if not dirs:
        raise BlisSetupError(f"no real run under {root}"
                             + (f" matches {substring!r}" if substring else ""))
    return [_read_run(p, Path(data_dir) / "model-configs") for p in dirs]


# ------------------------------------------------------------------------------ KV blocks
def kv_blocks_per_gpu(config: Mapping[str, Any], tp: int, memory_gib: float = 80.0,
                      gpu_memory_utilization: float = 0.9, block_size: int = 16,
                      bytes_per_param: float = 2.0) -> int:
    """:func:`bayes_latency.physics.blis.kv_blocks_per_gpu` (moved there), raising
    :class:`BlisSetupError` when the config lacks a field or the model does not fit."""
    from bayes_latency.errors import ConfigError
    from bayes_latency.physics.blis import kv_blocks_per_gpu as _kv

    try:
        return _kv(config, tp, memory_gib=memory_gib,
                   gpu_memory_utilization=gpu_memory_utilization, block_size=block_size,
                   bytes_per_param=bytes_per_param)
    except ConfigError as exc:
        raise BlisSetupError(str(exc)) from exc


# ------------------------------------------------------------------------------ workload
#: Prompt tokens of a BLIS request outside its client's cached prefix (:func:`stage_spec`): the
#: real server, whose users resend the same prompt, computed a few tokens per request.
SUFFIX_TOKENS = 1


def stage_spec(run: RealRun, stage: StageWorkload, seed: int = 42,
               drain_s: float | None = None) -> dict[str, Any]:
    """BLIS workload spec (a YAML-able dict) of one load stage of a real run.

    One client per (system prompt, user) as inference-perf's shared-prefix data generator, all
    always-on with equal ``rate_fraction``; ``aggregate_rate`` is the rate the real client
    achieved and ``num_requests`` the stage's request count, so arrivals are open-loop Poisson
    (the profile's ``enable_multi_turn_chat: true`` would make BLIS run closed-loop sessions,
    which offers less load than the real open-loop client). ``horizon`` covers the stage plus
    ``drain_s`` (default: the client timeout + 60 s for stress runs, 1800 s otherwise).

    Prompts: inference-perf draws each user's question once and sends that user the same
    prompt (system prompt + question) every time, so the real server hits its prefix cache for
    the whole prompt and computes only its last partial block (the real H100 step traces:
    median 2-4 prefill tokens per step with prefill, 90% <= 16). BLIS draws a client's
    ``input_distribution`` tokens afresh for every request and caches only the ``prefix_group``'s
    prefix, so each client is its own prefix group whose prefix is the whole prompt
    (``system_prompt_len + question_len - SUFFIX_TOKENS``) and the input the last
    :data:`SUFFIX_TOKENS`. With the system prompt as the prefix and the question as fresh input
    (before), BLIS computed 447-934 prompt tokens per request that the real server did not, and
    the exported ``prefill_compute``, which the client rows (cached prompts) leave nearly
    free, set the simulated TTFT: Llama-2-7B codegen left out of the fit (``prefill_compute``
    3.16) went from +21.0% E2E / +78.9% TTFT to -8.9% / -15.1%, the package replay's own
    prediction of the same rows (-8% / -9% to -13%).
    """
    if drain_s is None:
        drain_s = CLIENT_TIMEOUT_S + 60.0 if run.stress else 1800.0
    out_dist = {"type": "empirical", "params": {str(k): float(v)
                                                for k, v in stage.output_pdf.items()}}
    clients = []
    for p in range(run.num_groups):
        for u in range(run.users_per_group):
            clients.append({
                "id": f"prompt-{p}-user-{u}", "tenant_id": f"prompt-{p}",
                "slo_class": "standard", "rate_fraction": 1.0,
                "arrival": {"process": "poisson"},
                "input_distribution": {"type": "constant",
                                       "params": {"value": float(SUFFIX_TOKENS)}},
                "output_distribution": out_dist,
                "prefix_group": f"prompt-{p}-user-{u}",
                "prefix_length": int(run.system_prompt_len + run.question_len - SUFFIX_TOKENS),
                "streaming": True,
            })
    return {
        "version": "2", "seed": int(seed), "category": "language",
        "aggregate_rate": float(stage.rate),
        "num_requests": int(stage.count),
        "horizon": int(round((stage.duration_s + drain_s) * 1e6)),
        "clients": clients,
    }


#: The two ways a real run becomes BLIS workloads: ``prefix`` (:func:`stage_spec`) and
#: ``inference-perf`` (:func:`inference_perf_spec`).
EXPANSIONS: tuple[str, ...] = ("prefix", "inference-perf")


def _count(value: Any, where: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value != int(value) or value < minimum:
        raise BlisSetupError(f"profile: {where} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def inference_perf_section(profile: Mapping[str, Any], stage: int | None = None,
                           output_len: int | None = None) -> dict[str, Any]:
    """The ``inference_perf:`` section of a BLIS workload spec from an inference-perf profile.

    Parameters
    ----------
    profile
        An inference-perf ``profile.yaml`` document (``data.shared_prefix``, ``load.stages``).
    stage
        Keep only this load stage (index into ``load.stages``); None: every stage.
    output_len
        Output tokens of every request; None: the profile's ``data.shared_prefix.output_len``.

    Returns
    -------
    dict
        ``stages`` (``rate`` in req/s; ``duration`` in s as an integer, BLIS reads an
        ``int64``) and ``shared_prefix`` (``num_unique_system_prompts``,
        ``num_users_per_system_prompt``, ``system_prompt_len``, ``question_len``,
        ``output_len``, ``enable_multi_turn_chat``, false when absent as in inference-perf):
        every field BLIS's ``InferencePerfSpec`` reads.

    Raises
    ------
    BlisSetupError
        When a field is missing or not a valid count or rate, or ``stage`` is out of range.
    """
    data = profile.get("data") if isinstance(profile, Mapping) else None
    sp = data.get("shared_prefix") if isinstance(data, Mapping) else None
    load = profile.get("load") if isinstance(profile, Mapping) else None
    stages = load.get("stages") if isinstance(load, Mapping) else None
    if not isinstance(sp, Mapping):
        raise BlisSetupError("profile: no data.shared_prefix")
    if not isinstance(stages, list) or not stages:
        raise BlisSetupError("profile: load.stages must be a non-empty list")
    if stage is not None and not 0 <= stage < len(stages):
        raise BlisSetupError(f"profile: no load stage {stage} ({len(stages)} stages)")
    out_stages = []
    for i in range(len(stages)) if stage is None else [stage]:
        st = stages[i] if isinstance(stages[i], Mapping) else {}
        rate = st.get("rate")
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) \
                or not math.isfinite(rate) or rate <= 0:
            raise BlisSetupError(f"profile: load.stages[{i}].rate must be a positive number, "
                                 f"got {rate!r}")
        out_stages.append({"rate": float(rate),
                           "duration": _count(st.get("duration"),
                                              f"load.stages[{i}].duration", 1)})

    def n(key: str, minimum: int = 0) -> int:
        return _count(sp.get(key), f"data.shared_prefix.{key}", minimum)

    return {
        "stages": out_stages,
        "shared_prefix": {
            "num_unique_system_prompts": n("num_unique_system_prompts", 1),
            "num_users_per_system_prompt": n("num_users_per_system_prompt", 1),
            "system_prompt_len": n("system_prompt_len"),
            "question_len": n("question_len"),
            "output_len": n("output_len") if output_len is None
            else _count(output_len, "output_len"),
            "enable_multi_turn_chat": bool(sp.get("enable_multi_turn_chat", False)),
        },
    }


def inference_perf_spec(run: RealRun, stage: StageWorkload, seed: int = 42,
                        output_len: str = "real-mean") -> dict[str, Any]:
    """BLIS workload spec (a YAML-able dict) of one load stage, for BLIS's own expansion.

    The spec holds ``seed``, ``num_requests`` and an ``inference_perf:`` section
    (:func:`inference_perf_section`) with the stage's ``rate`` and ``duration`` and the
    ``shared_prefix`` fields of the run's ``profile.yaml``; BLIS expands it
    (``ExpandInferencePerfSpec``, ``sim/workload/inference_perf.go``) as follows:

    - ``num_unique_system_prompts`` x ``num_users_per_system_prompt`` clients
      ``prompt-<p>-user-<u>``; the users of prompt ``p`` share prefix group ``prompt-<p>`` of
      ``system_prompt_len`` tokens (lines 129-147), so only the system prompt is cached;
      ``question_len`` is a constant input distribution (line 93), fresh random tokens for
      every request, so every request prefills ``question_len`` tokens. ``output_len`` is a
      constant output distribution (line 94): the section cannot hold a distribution.
    - ``enable_multi_turn_chat: true``: category ``reasoning`` and, per client, one closed-loop
      session (``SingleSession``) of ``int(rate x duration)`` rounds shared evenly among the
      clients (lines 117-126, 377-394), its first round at the client's first Poisson arrival
      (rate ``rate / clients``: mean ``clients / rate`` s); each later round arrives
      ``clients / rate`` s (``ThinkTimeUs``, whole µs) after the previous one completes (lines
      343-357), with the same prompt lengths (no context growth). The offered load is
      ``clients / (clients / rate + E2E)``, below ``rate``, and the stage runs longer than
      ``duration``. With ``false``: open-loop arrivals, exactly ``int(rate x duration)``
      requests over ``duration`` (lines 150-209).
    - One stage: all clients always on (lines 104-210). Several stages: a cohort of clients
      per stage, active in the stage's window (``stagesToWindows``, lines 212-298, 312-327).

    One spec per stage (``stage`` only, single-stage path) rather than the whole profile: each
    stage is one BLIS invocation from an empty server, as in :func:`stage_spec`, so the stages
    pool the same way and the two expansions differ in the expansion only. The whole
    two-stage profile in one spec (the multi-stage path) lets the first stage's closed-loop
    sessions outlast their window: on Llama-2-70B TP4 general 2,105 of stage 0's 4,800 rounds
    arrive after 600 s, into stage 1. Measured with BLIS's published coefficients (seed 42,
    output length the run's real mean) on the 8 two-stage runs, the whole profile gives a mean
    E2E +0.8% to +8.0% above the per-stage pool (median +1.9%) and a mean TTFT -3.0% to +8.1%
    (median +1.6%).

    Parameters
    ----------
    run, stage
        The real run (its ``profile`` document) and the load stage.
    seed
        Workload seed (the ``seed`` of the spec).
    output_len
        ``"real-mean"`` (default): the stage's mean generated output length
        (:attr:`StageWorkload.output_len_mean`), rounded, as the constant: the profile's
        ``output_len`` under ``ignore_eos``, else the mean the client counted;
        ``"profile"``: the profile's ``output_len``.

    Raises
    ------
    BlisSetupError
        When the run has no profile document or it lacks a field, or ``output_len`` is unknown.
    """
    if not run.profile:
        raise BlisSetupError(f"{run.run_id}: no profile.yaml document")
    if output_len == "real-mean":
        out: int | None = max(1, int(round(stage.output_len_mean)))
    elif output_len == "profile":
        out = None
    else:
        raise BlisSetupError(f"output_len must be 'real-mean' or 'profile', got {output_len!r}")
    section = inference_perf_section(run.profile, stage.index, output_len=out)
    st = section["stages"][0]
    return {
        "version": "2", "seed": int(seed),
        # Bounds generation (BLIS wants num_requests or a horizon); the sessions hold exactly
        # this many rounds, and without a horizon every round runs.
        "num_requests": int(st["rate"] * st["duration"]),
        "inference_perf": section,
    }


def workload_spec(expansion: str, run: RealRun, stage: StageWorkload,
                  seed: int = 42) -> dict[str, Any]:
    """The BLIS workload spec of one load stage under ``expansion`` (:data:`EXPANSIONS`)."""
    if expansion == "prefix":
        return stage_spec(run, stage, seed=seed)
    if expansion == "inference-perf":
        return inference_perf_spec(run, stage, seed=seed)
    raise BlisSetupError(f"unknown expansion {expansion!r}; one of {', '.join(EXPANSIONS)}")


# ------------------------------------------------------------------------------ exports
def export_path(exports: str | Path, model: str, tp: int) -> Path:
    """``<exports>/<model>-h100-tp<N>.yaml``."""
    return Path(exports) / f"{model}-h100-tp{tp}.yaml"


def _block(doc: Any, where: str) -> Coefficients:
    tpc = doc.get("trained_physics_coefficients") if isinstance(doc, dict) else None
    if not isinstance(tpc, dict):
        raise BlisSetupError(f"{where}: no trained_physics_coefficients block")
    a, b = tpc.get("alpha_coeffs"), tpc.get("beta_coeffs")
    if not isinstance(a, list) or not isinstance(b, list):
        raise BlisSetupError(f"{where}: alpha_coeffs / beta_coeffs must be lists")
    try:
        return Coefficients(tuple(float(v) for v in a), tuple(float(v) for v in b), label=where)
    except (TypeError, ValueError) as exc:
        raise BlisSetupError(f"{where}: non-numeric coefficient ({exc})") from exc


def load_export(path: str | Path) -> tuple[Coefficients, list[Coefficients]]:
    """Mean block and posterior draws of one BLIS export file.

    Raises
    ------
    BlisSetupError
        One line naming the file when it is missing, not YAML, or a block does not have
        3 finite non-negative alphas and 11 betas.
    """
    path = Path(path)
    if not path.is_file():
        raise BlisSetupError(f"export missing: {path}")
    try:
        doc = load_yaml(read_text(path, "BLIS export", BlisSetupError))
    except (OSError, yaml.YAMLError) as exc:
        raise BlisSetupError(f"{path}: not readable YAML ({exc})".replace("\n", " ")) from exc
    mean = _block(doc, str(path))
    draws_doc = doc.get("draws") or []
    if not isinstance(draws_doc, list):
        raise BlisSetupError(f"{path}: draws must be a list")
    draws = [_block(d, f"{path} draw {i}") for i, d in enumerate(draws_doc)]
    return Coefficients(mean.alpha, mean.beta, label="export-mean"), draws


def write_perturbed_exports(out_dir: str | Path, configs: Iterable[tuple[str, int]],
                            n_draws: int = 20, sigma: float = 0.1, seed: int = 0,
                            base: Coefficients = PUBLISHED) -> list[Path]:
    """Write FAKE exports (``base`` as mean, lognormal perturbations as draws) for testing.

    For exercising the export path of the harness before real exports exist; never a result.
    Each draw multiplies every coefficient by ``exp(sigma * N(0, 1))``.
    """
    rng = np.random.default_rng(seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for model, tp in configs:
        def blk(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
            return {"trained_physics_coefficients": {"alpha_coeffs": [float(v) for v in a],
                                                     "beta_coeffs": [float(v) for v in b]}}
        a0, b0 = np.array(base.alpha), np.array(base.beta)
        doc = {"notes": [f"FAKE export: {base.label} x lognormal(0, {sigma}) draws, for tests"],
               **blk(a0, b0),
               "draws": [blk(a0 * np.exp(sigma * rng.standard_normal(N_ALPHA)),
                             b0 * np.exp(sigma * rng.standard_normal(N_BETA)))
                         for _ in range(n_draws)]}
        p = export_path(out, model, tp)
        p.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        paths.append(p)
    return paths
