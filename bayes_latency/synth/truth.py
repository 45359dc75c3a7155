"""True coefficients of the synthetic fleet, drawn from a known hierarchy.

log beta[config, term] = log mu[term] + e_model[model, term] + e_gpu[gpu, term] + e_tp[tp, term]
(the structure the hierarchical model assumes), and the same for alpha with smaller effects.
Terms whose population value is 0 are truly absent in every configuration (the sparsity the
model's relevance weights should find). Effects are drawn from ``seed`` and the level name only,
so a level keeps its effect whatever other configurations a fleet contains.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

POPULATION_BETA: dict[str, float] = {
    "prefill_compute": 1.6,    # prefill matmuls reach ~60 % of peak flops
    "prefill_kv": 0.0,         # truly zero: prefill KV traffic hides under compute
    "decode_compute": 0.0,     # truly zero: decode is memory bound
    "decode_kv": 1.3,          # attention reads ~75 % of HBM bandwidth
    "weight_loading": 1.25,    # weights stream at ~80 % of HBM bandwidth
    "tp_allreduce": 18.0,      # all-reduce at ~40 % of link bandwidth: (HBM/link ~7.4) / 0.4
    #                            (BLIS's feature divides by HBM bandwidth)
    "per_layer": 12.0,         # µs per layer per step (kernel launches, norms)
    "per_request": 6.0,        # µs per scheduled request (input prep, sampling)
    "per_step": 800.0,         # µs per step (scheduler, sampler, host sync)
    "moe_layer": 40.0,         # µs per MoE layer per step (interleaved MoE only, as BLIS)
    "moe_dispatch": 0.0,       # no data parallelism in the fleets
    "prefill_context_kv": 0.0,
    "moe_routing": 0.0,
    "cpu_offload": 0.0,
    "kv_pressure": 0.0,
}
"""Population (median) value of each beta term; roofline terms dimensionless, others in µs."""

POPULATION_ALPHA: dict[str, float] = {
    "alpha_arrival": 3000.0,      # µs from api.ARRIVED to journey.QUEUED
    "alpha_post_decode": 1500.0,  # µs from journey.FINISHED to api.DEPARTED
    "alpha_per_token": 30.0,      # µs per output token (detokenise / stream)
}
"""Population value of each alpha term (µs, µs per output token)."""

EFFECT_SD: dict[str, float] = {"model": 0.15, "gpu": 0.10, "tp": 0.08}
"""Standard deviation of the log-scale beta effects per factor."""

ALPHA_EFFECT_SD: dict[str, float] = {"model": 0.05, "gpu": 0.04, "tp": 0.03}
#: Log-scale sd of the configuration residual (what model + GPU + TP effects do not explain):
#: real fleets are not exactly additive, and the fitted model has this level too.
CONFIG_SD: float = 0.04
"""Standard deviation of the log-scale alpha effects per factor."""

ALPHA_NOISE_SIGMA: float = 0.1
"""Log-normal noise of one alpha observation (ARRIVED -> QUEUED, FINISHED -> DEPARTED)."""

FACTORS: tuple[str, ...] = ("model", "gpu", "tp")


def config_id(model: str, gpu: str, tp: int) -> str:
    """Configuration key ``"model|gpu|tpN"`` (the ``config_id`` of the observations table)."""
    return f"{model}|{gpu}|tp{int(tp)}"


def level_effects(factor: str, level: str | int, names: Sequence[str], sd: float,
                  seed: int = 0) -> dict[str, float]:
    """Log-scale effects of one level of one factor, one per coefficient name.

    Deterministic in ``(seed, factor, level, name)``: each name gets its own stream, so effects do
    not change when the term list or the fleet changes.
    """
    out: dict[str, float] = {}
    for name in names:
        key = zlib.crc32(f"{factor}:{level}:{name}".encode())
        rng = np.random.default_rng([int(seed), key])
        out[name] = float(sd * rng.standard_normal())
    return out


@dataclass(frozen=True)
class ConfigTruth:
    """True coefficients of one (model, gpu, tp) configuration.

    Attributes
    ----------
    model, gpu : str
        Short names as written in ``serving.yaml``.
    tp : int
        Tensor parallelism.
    beta : dict
        Term name -> true coefficient (0 for truly absent terms).
    alpha : dict
        Alpha term name -> true value.
    effects : dict
        ``{"model"|"gpu"|"tp": {name: log effect}}`` for beta and alpha names.
    """

    model: str
    gpu: str
    tp: int
    beta: dict[str, float]
    alpha: dict[str, float]
    effects: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def config_id(self) -> str:
        """``"model|gpu|tpN"``."""
        return config_id(self.model, self.gpu, self.tp)

    def beta_vector(self, terms: Sequence[str]) -> np.ndarray:
        """Beta as an array in the order of ``terms`` (term names)."""
        return np.array([self.beta[t] for t in terms], dtype=float)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for ``truth.yaml``."""
        return {
            "config_id": self.config_id, "model": self.model, "gpu": self.gpu, "tp": int(self.tp),
            "beta": {k: float(v) for k, v in self.beta.items()},
            "alpha": {k: float(v) for k, v in self.alpha.items()},
            "effects": {f: {k: float(v) for k, v in e.items()} for f, e in self.effects.items()},
        }


def true_coefficients(model: str, gpu: str, tp: int, terms: Sequence[str],
                      alpha_terms: Sequence[str], seed: int = 0) -> ConfigTruth:
    """The true beta and alpha of one configuration.

    Parameters
    ----------
    model, gpu : str
        Short names (level names of the model / gpu effects).
    tp : int
        Tensor parallelism (level of the tp effect).
    terms, alpha_terms : sequence of str
        Term names (unknown names get population value 0, i.e. truly absent).
    seed : int
        Seed of the effects.
    """
    levels = {"model": model, "gpu": gpu, "tp": int(tp)}
    effects: dict[str, dict[str, float]] = {}
    beta: dict[str, float] = {}
    alpha: dict[str, float] = {}
    for f in FACTORS:
        eb = level_effects(f, levels[f], terms, EFFECT_SD[f], seed)
        ea = level_effects(f, levels[f], alpha_terms, ALPHA_EFFECT_SD[f], seed)
        effects[f] = {**eb, **ea}
    effects["config"] = level_effects("config", f"{model}|{gpu}|tp{int(tp)}",
                                      [*terms, *alpha_terms], CONFIG_SD, seed)
    for t in terms:
        mu = POPULATION_BETA.get(t, 0.0)
        beta[t] = float(mu * np.exp(sum(effects[f][t] for f in (*FACTORS, "config")))) if mu else 0.0
    for a in alpha_terms:
        mu = POPULATION_ALPHA.get(a, 0.0)
        alpha[a] = float(mu * np.exp(sum(effects[f][a] for f in (*FACTORS, "config")))) if mu else 0.0
    return ConfigTruth(model=model, gpu=gpu, tp=int(tp), beta=beta, alpha=alpha, effects=effects)


def population_dict(terms: Sequence[str], alpha_terms: Sequence[str]) -> dict[str, Any]:
    """Population values and effect scales for ``truth.yaml``."""
    return {
        "beta": {t: float(POPULATION_BETA.get(t, 0.0)) for t in terms},
        "alpha": {a: float(POPULATION_ALPHA.get(a, 0.0)) for a in alpha_terms},
        "effect_sd": {"beta": dict(EFFECT_SD), "alpha": dict(ALPHA_EFFECT_SD), "config": CONFIG_SD},
        "truly_zero": [t for t in terms if not POPULATION_BETA.get(t, 0.0)],
    }


__all__ = ["ALPHA_EFFECT_SD", "ALPHA_NOISE_SIGMA", "CONFIG_SD", "EFFECT_SD", "FACTORS", "POPULATION_ALPHA",
           "POPULATION_BETA", "ConfigTruth", "config_id", "level_effects", "population_dict",
           "true_coefficients"]
