"""inference-perf-like workloads: shared-prefix prompts and staged constant-rate or Poisson load.

The presets (``general``, ``codegen``, ``roleplay``, ``reasoning``) carry the numbers of the real
H100 lifecycle runs' ``profile.yaml`` files (shipped in ``synth/data/workloads.yaml``): a shared
system prompt per group, a question per user, a fixed output length (``ignore_eos``), and load
stages of ``(duration_s, rate)``. Fleet presets shorten the durations with :meth:`Workload.scaled`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from bayes_latency.errors import ConfigError
from bayes_latency.textfiles import load_yaml, read_text

WORKLOADS_FILE = Path(__file__).resolve().parent / "data" / "workloads.yaml"

SCHEDULE_DELAY_MEAN_S = 4.6e-4
"""Mean lateness of inference-perf's sender against its constant-rate schedule (real runs)."""
SCHEDULE_DELAY_SD_S = 5.5e-4
"""Spread of that lateness (real runs: p1 -0.7 ms, p99 +1.8 ms)."""


@dataclass(frozen=True)
class Workload:
    """An inference-perf ``shared_prefix`` workload with staged load.

    Attributes
    ----------
    name : str
        Preset or custom name (written as ``workload`` in ``serving.yaml``).
    system_prompt_len, question_len, output_len : int
        Token lengths of the shared system prompt, the per-user question and the output
        (``max_tokens``; generation ignores EOS so the output has exactly this length).
    num_unique_system_prompts, num_users_per_system_prompt : int
        Groups and users per group; each user has one fixed prompt = its group's system prompt +
        its question.
    template_tokens : int
        Chat-template / tokenizer overhead added to every prompt.
    stages : tuple of (float, float)
        ``(duration_s, rate_per_s)`` of the load stages, run back to back.
    load : {"constant", "poisson"}
        Evenly spaced sends (with inference-perf's small schedule delay) or Poisson arrivals.
    prompt_jitter : int
        Half-width of the uniform per-user jitter of the question length (0 = none).
    output_jitter : int
        Half-width of the uniform per-request jitter of ``max_tokens`` (0 = none).
    """

    name: str
    system_prompt_len: int
    question_len: int
    output_len: int
    num_unique_system_prompts: int
    num_users_per_system_prompt: int
    template_tokens: int = 0
    stages: tuple[tuple[float, float], ...] = ((60.0, 5.0),)
    load: str = "constant"
    prompt_jitter: int = 15
    output_jitter: int = 2
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for k in ("system_prompt_len", "question_len", "output_len",
                  "num_unique_system_prompts", "num_users_per_system_prompt"):
            v = getattr(self, k)
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise ConfigError(f"workload {self.name!r}: field {k!r} must be a positive integer, got {v!r}")
        if self.load not in ("constant", "poisson"):
            raise ConfigError(f"workload {self.name!r}: field 'load' must be 'constant' or 'poisson', "
                              f"got {self.load!r}")
        if not self.stages or any(d <= 0 or r <= 0 for d, r in self.stages):
            raise ConfigError(f"workload {self.name!r}: field 'stages' needs positive (duration, rate) pairs")
        if self.prompt_jitter < 0 or self.output_jitter < 0:
            raise ConfigError(f"workload {self.name!r}: jitters must be >= 0")
        if self.output_jitter >= self.output_len:
            raise ConfigError(f"workload {self.name!r}: output_jitter must be < output_len")
        if self.prompt_jitter >= self.question_len:
            raise ConfigError(f"workload {self.name!r}: prompt_jitter must be < question_len")

    @property
    def duration_s(self) -> float:
        """Total send duration of all stages in seconds."""
        return float(sum(d for d, _ in self.stages))

    @property
    def expected_requests(self) -> float:
        """Expected number of requests (sum of duration x rate)."""
        return float(sum(d * r for d, r in self.stages))

    def scaled(self, duration_factor: float = 1.0, rate_factor: float = 1.0) -> Workload:
        """Copy with every stage's duration and/or rate multiplied."""
        return replace(self, stages=tuple((d * duration_factor, r * rate_factor) for d, r in self.stages))

    def with_stages(self, stages: list[tuple[float, float]] | tuple[tuple[float, float], ...]) -> Workload:
        """Copy with other load stages."""
        return replace(self, stages=tuple((float(d), float(r)) for d, r in stages))

    def to_profile(self, model_name: str) -> dict[str, Any]:
        """The inference-perf ``profile.yaml`` content for this workload (as a dict)."""
        return {
            "api": {"streaming": True, "type": "completion"},
            "data": {
                "shared_prefix": {
                    "enable_multi_turn_chat": True,
                    "num_unique_system_prompts": int(self.num_unique_system_prompts),
                    "num_users_per_system_prompt": int(self.num_users_per_system_prompt),
                    "output_len": int(self.output_len),
                    "question_len": int(self.question_len),
                    "system_prompt_len": int(self.system_prompt_len),
                },
                "type": "shared_prefix",
            },
            "load": {"stages": [{"duration": _num(d), "rate": _num(r)} for d, r in self.stages],
                     "type": "constant" if self.load == "constant" else "poisson"},
            "report": {"request_lifecycle": {"per_request": False, "per_stage": True, "summary": True}},
            "server": {"ignore_eos": True, "model_name": model_name, "type": "vllm"},
            "tokenizer": {"pretrained_model_name_or_path": model_name},
        }


def _num(x: float) -> int | float:
    return int(x) if float(x).is_integer() else float(x)


@dataclass(frozen=True)
class RequestSet:
    """The requests one workload sends, sorted by send time (all arrays have one entry per request).

    Attributes
    ----------
    send_s : ndarray of float
        Client send time in seconds from the start of the run (= ``api.ARRIVED`` relative time).
    stage : ndarray of int
        Load stage index of the request.
    schedule_delay_s : ndarray of float
        Send time minus the scheduled send time (inference-perf ``schedule_delay``).
    group, user : ndarray of int
        System-prompt group and user within the group.
    prompt_len : ndarray of int
        Prompt tokens.
    prefix_len : ndarray of int
        Tokens of the shared system prompt at the start of the prompt (cacheable prefix).
    max_tokens : ndarray of int
        Output tokens (generation runs to ``max_tokens``).
    stage_bounds_s : ndarray of float
        Start time of each stage plus the end of the last one (n_stages + 1 values).
    """

    send_s: np.ndarray
    stage: np.ndarray
    schedule_delay_s: np.ndarray
    group: np.ndarray
    user: np.ndarray
    prompt_len: np.ndarray
    prefix_len: np.ndarray
    max_tokens: np.ndarray
    stage_bounds_s: np.ndarray

    def __len__(self) -> int:
        return int(self.send_s.size)


def generate_requests(workload: Workload, rng: np.random.Generator,
                      max_model_len: int | None = None) -> RequestSet:
    """Draw the requests of one run of ``workload``.

    Parameters
    ----------
    workload : Workload
        What to send.
    rng : numpy.random.Generator
        Source of all randomness (same generator state -> same requests).
    max_model_len : int, optional
        When given, ``max_tokens`` is cut so that prompt + output fits.

    Returns
    -------
    RequestSet
    """
    w = workload
    n_groups, n_users = int(w.num_unique_system_prompts), int(w.num_users_per_system_prompt)
    # one fixed prompt per (group, user)
    q_jit = (rng.integers(-w.prompt_jitter, w.prompt_jitter + 1, size=(n_groups, n_users))
             if w.prompt_jitter else np.zeros((n_groups, n_users), dtype=np.int64))
    user_prompt = w.system_prompt_len + w.question_len + w.template_tokens + q_jit

    sends, stages, delays = [], [], []
    bounds = [0.0]
    t0 = 0.0
    for k, (dur, rate) in enumerate(w.stages):
        if w.load == "constant":
            n = int(np.floor(dur * rate + 1e-9))
            nominal = t0 + np.arange(n) / rate
            delay = rng.normal(SCHEDULE_DELAY_MEAN_S, SCHEDULE_DELAY_SD_S, size=n)
            delay = np.clip(delay, -3 * SCHEDULE_DELAY_SD_S, 6 * SCHEDULE_DELAY_SD_S)
            s = nominal + delay
        else:
            n_max = int(dur * rate + 10 * np.sqrt(dur * rate) + 20)
            gaps = rng.exponential(1.0 / rate, size=n_max)
            s = t0 + np.cumsum(gaps)
            s = s[s < t0 + dur]
            delay = np.zeros(s.size)
        sends.append(s)
        delays.append(delay)
        stages.append(np.full(s.size, k, dtype=np.int64))
        t0 += dur
        bounds.append(t0)
    send = np.concatenate(sends)
    stage = np.concatenate(stages)
    delay = np.concatenate(delays)
    n = send.size
    group = rng.integers(0, n_groups, size=n)
    user = rng.integers(0, n_users, size=n)
    prompt = user_prompt[group, user].astype(np.int64)
    out = np.full(n, w.output_len, dtype=np.int64)
    if w.output_jitter:
        out = out + rng.integers(-w.output_jitter, w.output_jitter + 1, size=n)
    if max_model_len is not None:
        if np.any(prompt >= max_model_len):
            raise ConfigError(f"workload {w.name!r}: prompts of up to {int(prompt.max())} tokens do not fit "
                              f"max_model_len={max_model_len}")
        out = np.minimum(out, max_model_len - prompt)
    order = np.argsort(send, kind="stable")
    return RequestSet(
        send_s=send[order], stage=stage[order], schedule_delay_s=delay[order],
        group=group[order].astype(np.int64), user=user[order].astype(np.int64),
        prompt_len=prompt[order], prefix_len=np.full(n, w.system_prompt_len, dtype=np.int64),
        max_tokens=out[order], stage_bounds_s=np.asarray(bounds, dtype=float),
    )


@cache
def _presets() -> dict[str, dict[str, Any]]:
    doc = load_yaml(read_text(WORKLOADS_FILE, "workload presets"))
    return dict(doc["workloads"])


def known_workloads() -> list[str]:
    """Names of the workload presets."""
    return sorted(_presets())


def load_workload(name: str, **overrides: Any) -> Workload:
    """A workload preset (``general``, ``codegen``, ``roleplay``, ``reasoning``).

    Parameters
    ----------
    name : str
        Preset name.
    **overrides
        Fields to change (e.g. ``load="poisson"``, ``prompt_jitter=0``).

    Raises
    ------
    ConfigError
        Unknown preset (naming the known ones) or invalid field.
    """
    presets = _presets()
    if name not in presets:
        raise ConfigError(f"unknown workload {name!r}; known: {', '.join(sorted(presets))}")
    d = dict(presets[name])
    d["stages"] = tuple((float(a), float(b)) for a, b in d["stages"])
    d.update(overrides)
    if "stages" in overrides:
        d["stages"] = tuple((float(a), float(b)) for a, b in d["stages"])
    return Workload(name=name, **d)


__all__ = ["RequestSet", "Workload", "generate_requests", "known_workloads", "load_workload",
           "WORKLOADS_FILE"]
