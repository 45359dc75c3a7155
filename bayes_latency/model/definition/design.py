"""Coordinates of a fit and the prior file laid out on them.

:class:`Design` holds the coefficients and the configurations with their levels (model, GPU, TP,
serving stack); :class:`PriorArrays` (:func:`prior_arrays`) the numbers of a prior set on those
coordinates. Pure numpy / pandas: the PyMC model is built in :mod:`bayes_latency.model.definition.hierarchy`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import xarray as xr

from bayes_latency.data.observations.build import DEFAULT_STACK
from bayes_latency.model.definition.likelihood import PREFILL_NOISE_KINDS


@dataclass
class PriorArrays:
    """Numbers of the prior file laid out on the model's coordinates."""

    mu_mean: np.ndarray  # (K,) log-scale mean of the population coefficient
    mu_sd: np.ndarray  # (K,)
    gpu_offset: np.ndarray  # (G, K)
    sigma_model: float
    sigma_gpu: float
    sigma_tp: float
    sigma_stack: float
    spread: dict[str, float | None]
    sigma_config: dict
    ard: dict
    noise_sigma: dict[str, float]
    nu_alpha: float
    nu_beta: float
    #: per factor, the scale of an effect common to every coefficient (``hierarchy.<f>_common``)
    common: dict[str, float | None] = field(default_factory=dict)
    #: per factor, ``(K,)`` 1.0 where the factor has an effect on the coefficient and 0.0 for the
    #: terms of ``hierarchy.<f>.without`` (no effect of that factor at all)
    keep: dict[str, np.ndarray] = field(default_factory=dict)
    #: scale of the GPU x stack interaction of a fit with kernel evidence (``hierarchy.gpu_stack``)
    sigma_gpu_stack: float = 0.25
    #: sd of a GPU's step-level effect around its kernels' (``hierarchy.kernel``)
    kernel_sigma: float = 0.15

    def factor_keep(self, factor: str) -> np.ndarray:
        """``(K,)`` 1.0 where ``factor`` has an effect on the coefficient, 0.0 for the terms of
        the prior file's ``hierarchy.<factor>.without`` (all ones for a factor without entry)."""
        k = self.keep.get(factor)
        return np.ones(len(self.mu_mean)) if k is None else np.asarray(k, dtype=float)


def _half_scale(entry: object, default: float) -> float:
    if isinstance(entry, dict):
        return float(entry.get("sigma", entry.get("scale", default)))
    return default


def _config_scale(entry: object) -> dict:
    """Prior of the configuration residual scale: lognormal, bounded away from 0."""
    if isinstance(entry, dict) and entry.get("dist") == "lognormal":
        return {"median": float(entry["median"]), "sigma": float(entry["sigma"])}
    return {"median": 0.08, "sigma": 0.5}


def prior_arrays(priors: object, coefs: tuple[str, ...], gpus: list[str]) -> PriorArrays:
    """Lay the prior set out on (coef,) and (gpu, coef) arrays."""
    K = len(coefs)
    mu_mean = np.zeros(K)
    mu_sd = np.zeros(K)
    for k, name in enumerate(coefs):
        mu_mean[k], mu_sd[k] = priors.log_mean_sd(name)
    offset = np.zeros((len(gpus), K))
    for g, gpu in enumerate(gpus):
        for k, name in enumerate(coefs):
            offset[g, k] = priors.log_mean_sd(name, gpu)[0] - mu_mean[k]
    hier = getattr(priors, "hierarchy", {}) or {}
    ard = getattr(priors, "ard", {}) or {}
    noise = getattr(priors, "noise", {}) or {}
    nsig = {k: _half_scale(v.get("sigma") if isinstance(v, dict) else None, 0.5) for k, v in noise.items()}
    for base, cls in PREFILL_NOISE_KINDS.items():  # a prefill class without its own prior: its kind's
        if cls not in nsig and base in nsig:
            nsig[cls] = nsig[base]
    nu_entry = next((v.get("nu") for v in noise.values() if isinstance(v, dict) and "nu" in v), {})
    return PriorArrays(
        mu_mean=mu_mean, mu_sd=mu_sd, gpu_offset=offset,
        sigma_model=_half_scale(hier.get("model"), 0.5),
        sigma_gpu=_half_scale(hier.get("gpu"), 0.3),
        sigma_tp=_half_scale(hier.get("tp"), 0.3),
        sigma_stack=_half_scale(hier.get("stack"), 0.5),
        spread={f: (float(hier[f]["spread"]) if isinstance(hier.get(f), dict) and "spread" in hier[f]
                    else None) for f in ("model", "gpu", "tp", "stack")},
        sigma_config=_config_scale(hier.get("config")),
        ard=dict(ard) or {"dist": "logistic_gate", "loc": -1.5, "scale": 1.0, "sharpness": 4.0},
        noise_sigma=nsig,
        nu_alpha=float(nu_entry.get("alpha", 2.0)) if isinstance(nu_entry, dict) else 2.0,
        nu_beta=float(nu_entry.get("beta", 0.1)) if isinstance(nu_entry, dict) else 0.1,
        common={f: (_half_scale(hier[f"{f}_common"], 1.0) if f"{f}_common" in hier else None)
                for f in ("model", "gpu", "tp", "stack", "config")},
        keep={f: np.asarray([c not in _without(hier.get(f)) for c in coefs], dtype=float)
              for f in ("model", "gpu", "tp", "stack")},
        sigma_gpu_stack=_half_scale(hier.get("gpu_stack"), 0.25),
        kernel_sigma=_half_scale(hier.get("kernel"), 0.15),
    )


def _without(entry: object) -> tuple[str, ...]:
    """Terms of a ``hierarchy.<factor>`` entry without that factor's effect."""
    return tuple(entry.get("without", ())) if isinstance(entry, dict) else ()


#: The value of the fixed (NaN, :data:`~bayes_latency.model.definition.population.NAN_FIXED`) elements of a
#: posterior variable: ``relevance`` 1 (no ARD gate), ``eff_<factor>`` 0 (no effect of the
#: factor); ``sigma_config``'s is ``sigma_config_fixed`` of ``constant_data`` (the prior median).
FIXED_FILL = {"relevance": 1.0, "eff_": 0.0}


def filled(da: xr.DataArray, fill: float | None = None) -> xr.DataArray:
    """``da`` with its fixed (NaN) elements at their value: ``fill``, else that of
    :data:`FIXED_FILL` for its name (``da`` unchanged when neither gives one)."""
    if fill is None:
        name = str(da.name)
        fill = FIXED_FILL.get(name, FIXED_FILL["eff_"] if name.startswith("eff_") else None)
    return da if fill is None else da.fillna(fill)


#: Dimension of each factor's levels (``eff_<factor> (<dim>, coef)``): the factor ``model`` (the
#: LLM; configuration column ``model``, prior file ``hierarchy.model``) has its levels on ``llm``.
LEVEL_DIMS = {"model": "llm", "gpu": "gpu", "tp": "tp", "stack": "stack"}


def level_dim(factor: str) -> str:
    """The dimension of ``factor``'s levels (:data:`LEVEL_DIMS`)."""
    return LEVEL_DIMS[factor]


@dataclass
class Design:
    """Coordinates of a fit: coefficients and the configurations with their group levels."""

    coefs: tuple[str, ...]
    beta_terms: tuple[str, ...]
    alpha_terms: tuple[str, ...]
    configs: pd.DataFrame  # index config_id; columns model, gpu, tp, stack (default: vLLM)

    def __post_init__(self) -> None:
        if "stack" not in self.configs:
            self.configs = self.configs.assign(stack=DEFAULT_STACK)

    @property
    def models(self) -> list[str]:
        return sorted(self.configs["model"].unique())

    @property
    def gpus(self) -> list[str]:
        return sorted(self.configs["gpu"].unique())

    @property
    def tps(self) -> list[int]:
        return sorted(int(t) for t in self.configs["tp"].unique())

    @property
    def stacks(self) -> list[str]:
        return sorted(self.configs["stack"].unique())

    def coords(self) -> dict[str, list]:
        """Coordinates of the model and of the result file. The LLM factor's levels are on the
        dimension ``llm`` (:data:`LEVEL_DIMS`), not ``model``: arviz-plots names the dimension
        that lays out several fits of a comparison ``model``."""
        return {"coef": list(self.coefs), "term": list(self.beta_terms),
                "alpha_term": list(self.alpha_terms), "config": list(self.configs.index),
                "llm": self.models, "gpu": self.gpus, "tp": self.tps, "stack": self.stacks}

    def levels(self, factor: str) -> list:
        """The fitted levels of ``factor`` (``model``, ``gpu``, ``tp`` or ``stack``)."""
        return {"model": self.models, "gpu": self.gpus, "tp": self.tps,
                "stack": self.stacks}[factor]

    def index(self, level: str) -> np.ndarray:
        """Each configuration's level index of the factor ``level``."""
        levels = self.levels(level)
        col = self.configs[level].astype(int) if level == "tp" else self.configs[level]
        return np.asarray([levels.index(v) for v in col])


#: A coefficient with information in fewer configurations than this has its residual scale
#: ``sigma_config`` fixed at the prior median (in the posterior as ``sigma_config``; the free
#: variable ``sigma_config_free`` then holds prior draws for it): one configuration cannot teach
#: how configurations scatter, and with the scale free, the configuration's coefficient pinned
#: by its data made a funnel with the population mean (tiny fleet seed 7, ``tp_allreduce`` and
#: ``moe_layer``, active only on Mixtral: bulk ESS 116 and 324, R-hat 1.0103 and 1.0094).
MIN_CONFIGS_FOR_RESIDUAL = 2
