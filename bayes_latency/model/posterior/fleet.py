"""A fitted fleet's population as a file, and as the prior of the configurations of new data.

A fit of the hierarchy (:mod:`bayes_latency.model.definition.hierarchy`) learns, besides each configuration's coefficients,
the population they scatter around: the population log-means ``mu``, the effects of every seen
level of each factor (``eff_model``, ``eff_gpu``, ``eff_tp``, ``eff_stack``), the scales of
those factors (``sigma_<factor>``, and ``sigma_<factor>_common`` when the prior file has a
shift common to every term) and the configuration residual ``sigma_config``.
:func:`population_from_result` keeps these as thinned **joint** posterior draws (float32), with
the level names, the terms, the fitted configurations and the priors (YAML, hash), in a
:class:`Population`; :meth:`Population.save` writes it as a small compressed netCDF
(``population.nc``) and :func:`~bayes_latency.model.posterior.population_file.load_population`
reads it back, refusing another model version, another file format or terms that do not match
(its draws checked by :func:`~bayes_latency.model.posterior.population_draws.checked_draws`).

As a prior (:meth:`Population.config_prior`): for the configurations of new data, the joint
draws of their population log-locations ``log m[c, k]`` are made as an unseen configuration's
are (:func:`~bayes_latency.model.posterior.unseen.config_log_location`): a level the population saw takes
its fitted effect (draw by draw), an unseen level draws its effect from its factor's scale,
``N(0, sigma^2 (1 + 1/n))``, **shared** by every new configuration of that level. A
multivariate normal is fitted to those draws over all (configuration, coefficient) pairs at
once: it keeps the correlations between terms (the members of a sum-only group such as
``per_layer`` + ``per_step`` share their factor effects, so only their sum moves between
configurations) and between configurations of the same new level. The configuration residual
keeps its form, ``theta ~ N(m, (m sigma_config)^2)``, with ``sigma_config`` given a lognormal
prior fitted to the population's draws of it (:class:`ConfigPrior`). The noise of every class
the fleet fitted (:func:`fleet_noise`: per noise class, the row-weighted RMS of the fitted
configurations' scales, the mean and sd of their logs, attrs ``fleet_noise``) gives a new
configuration's noise scale of that class a lognormal prior fitted to the fleet's
configurations' scales (:attr:`ConfigPrior.noise_prior`): a configuration seen in one or two
rows per class cannot tell its noise from its coefficients, and the fleet's configurations say
what a configuration's noise is. A class the fleet did not fit keeps the priors file's prior. The PyMC model of a fit
with this prior is :func:`~bayes_latency.model.definition.hierarchy.build_model`'s variant
``"population"``.

:func:`leave_out` removes every row of one level (``model=llama-2-7b``, ``gpu=H100``,
``tp=2`` or ``config=<config id>``) from an observation table, for a population that has not
seen it. :data:`~bayes_latency.model.posterior.population_file.SHIPPED_POPULATION` is the
population of the real H100 fleet that the package ships (what it contains: its attrs,
:meth:`Population.describe`).

Importing this module is light (no PyMC, PyTensor or ArviZ).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from bayes_latency import __version__
from bayes_latency.data.observations.build import DEFAULT_STACK
from bayes_latency.errors import BayesLatencyError, ConfigError
from bayes_latency.model.definition.design import Design, level_dim, prior_arrays
from bayes_latency.model.posterior.population_draws import FACTORS, checked_draws

__all__ = ["DEFAULT_PRIOR_DRAWS", "DEFAULT_SAMPLES", "LEAVE_OUT_KEYS", "NOISE_LOG_SD_DEFAULT",
           "NOISE_LOG_SD_MIN", "POPULATION_FORMAT", "ConfigPrior", "Population", "client_noise",
           "fleet_noise", "leave_out", "noise_lognormal", "noise_priors", "parse_leave_out",
           "population_from_result"]

#: Version of the population file's layout (attrs ``population_format``).
POPULATION_FORMAT = "1"
#: Joint posterior draws a population file keeps (thinned evenly over chains and draws).
DEFAULT_SAMPLES = 500
#: Draws of the new configurations' log-locations the multivariate normal is fitted to (each
#: stored sample replicated with fresh unseen-level effects).
DEFAULT_PRIOR_DRAWS = 4000
#: Smallest sd of ``log sigma_config`` in its lognormal prior: a population whose residual scale
#: was fixed (a coefficient with data in one configuration) has draws that do not vary.
MIN_LOG_SIGMA_SD = 0.1
#: Added to the variances of the fitted covariance (log scale) so that it is positive definite
#: when two log-locations move together exactly (members of a sum-only group share effects).
COV_JITTER = 1e-6
#: Smallest sd of the log noise scale in a fleet noise prior (:meth:`Population.config_prior`):
#: a class whose fitted configurations happen to agree closely still leaves a new configuration
#: room (0.25: its scale within a factor 1.5 of the fleet's at 1.645 sd).
NOISE_LOG_SD_MIN = 0.25
#: sd of the log noise scale of a class the fleet fitted in one configuration (no spread to
#: measure), and of every class of a population file that records only the client kinds' scale.
NOISE_LOG_SD_DEFAULT = 0.5
#: The keys of ``--leave-out KEY=VALUE``.
LEAVE_OUT_KEYS = ("model", "gpu", "tp", "config")


@dataclass(frozen=True)
class ConfigPrior:
    """The prior of the configurations of new data from a population.

    Attributes
    ----------
    mean
        ``(C, K)`` prior mean of the log-locations ``log m[c, k]`` (log µs per feature unit).
    chol
        ``(C*K, C*K)`` lower Cholesky factor of their covariance (row-major over
        ``(config, coef)``): ``log m = mean + (chol @ z).reshape(C, K)``, ``z ~ N(0, 1)``.
    log_sigma_config
        ``(K,)`` mean and ``(K,)`` sd of ``log sigma_config`` (a lognormal prior).
    unseen
        Per configuration id, the levels the population did not see.
    configs
        The configuration ids in the order of ``mean``'s rows.
    noise_prior
        Per noise class the fleet fitted (:func:`fleet_noise`), ``(log median, sd)`` of the
        lognormal prior of a new configuration's noise scale of that class: the lognormal of the
        fleet's configurations' scales (sd at least :data:`NOISE_LOG_SD_MIN`; centred on the
        fleet's scale with sd :data:`NOISE_LOG_SD_DEFAULT` without a spread,
        :func:`noise_lognormal`). It replaces the prior file's half-normal for those classes;
        the other classes keep it.
    """

    mean: np.ndarray
    chol: np.ndarray
    log_sigma_config: tuple[np.ndarray, np.ndarray]
    unseen: dict[str, list[str]]
    configs: tuple[str, ...]
    noise_prior: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def sd(self) -> np.ndarray:
        """``(C, K)`` prior sd of each log-location."""
        return np.sqrt(np.sum(self.chol**2, axis=1)).reshape(self.mean.shape)


@dataclass
class Population:
    """A fitted fleet's population (see the module docstring).

    Attributes
    ----------
    draws
        Joint posterior draws over ``sample`` (the last dimension, as
        :func:`~bayes_latency.model.posterior.unseen.config_log_location` reads them): ``mu (coef,
        sample)``, ``eff_<factor> (<level dim>, coef, sample)``, ``sigma_<factor> (coef,
        sample)``, ``sigma_config (coef, sample)`` and the common shifts' scales where the fit
        has them.
    configs
        The configurations the population was fitted on (index ``config_id``; ``model``,
        ``gpu``, ``tp``, ``stack``).
    terms, alpha_terms
        The beta terms and alpha terms of the fit.
    priors
        The :class:`~bayes_latency.priors.PriorSet` of the fit (its GPU offsets place a new
        GPU).
    attrs
        Provenance: ``model_version``, ``bayes_latency_version``, ``priors_hash``,
        ``data_hash``, ``variant``, ``left_out``, ``source``, ``n_samples``.
    """

    draws: xr.Dataset
    configs: pd.DataFrame
    terms: tuple[str, ...]
    alpha_terms: tuple[str, ...]
    priors: Any
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def coefs(self) -> tuple[str, ...]:
        """Beta terms then alpha terms."""
        return tuple(self.terms) + tuple(self.alpha_terms)

    @property
    def design(self) -> Design:
        """The design of the fit the population comes from."""
        return Design(self.coefs, tuple(self.terms), tuple(self.alpha_terms), self.configs)

    @property
    def fleet_noise(self) -> dict[str, dict[str, Any]]:
        """Per noise class the fleet fitted, its scale, rows, configurations and the mean and sd
        of the log scales across them (:func:`fleet_noise`). A file that records only the client
        kinds (attrs ``client_noise``) gives those, without a spread; empty when the population
        was made without the fit's rows."""
        v = self.attrs.get("fleet_noise")
        if v is not None:
            return json.loads(v) if isinstance(v, str) else dict(v)
        old = self.attrs.get("client_noise") or {}
        old = json.loads(old) if isinstance(old, str) else dict(old)
        return {k: {**d, "configs": None, "log_mean": None, "log_sd": None}
                for k, d in old.items()}

    @property
    def client_noise(self) -> dict[str, dict[str, float]]:
        """Per client kind, the fleet's scale of the scatter of client means and its row count
        (:func:`client_noise` of :attr:`fleet_noise`; empty when the population was made without
        the fit's rows)."""
        return client_noise(self.fleet_noise)

    @property
    def noise_prior(self) -> dict[str, tuple[float, float]]:
        """Per noise class the fleet fitted with a positive scale, ``(log median, sd)`` of the
        lognormal prior of a new configuration's noise scale of that class
        (:func:`noise_priors` of :attr:`fleet_noise`): :attr:`ConfigPrior.noise_prior`."""
        return noise_priors(self.fleet_noise)

    @property
    def name(self) -> str:
        """A short name: the source and what was left out."""
        lo = self.attrs.get("left_out") or ""
        return str(self.attrs.get("source", "population")) + (f" without {lo}" if lo else "")

    def describe(self) -> dict[str, Any]:
        """What the population contains: its source, levels, fitted configurations, what was
        left out, the versions and hashes (for export notes and reports)."""
        d = self.design
        return {"name": self.name, "source": self.attrs.get("source", ""),
                "left_out": self.attrs.get("left_out", ""),
                "models": d.models, "gpus": d.gpus, "tps": d.tps, "stacks": d.stacks,
                "configs": list(self.configs.index), "terms": list(self.terms),
                "n_samples": int(self.draws.sizes["sample"]),
                "client_noise": self.client_noise, "fleet_noise": self.fleet_noise,
                "model_version": self.attrs.get("model_version"),
                "priors_hash": self.attrs.get("priors_hash"),
                "data_hash": self.attrs.get("data_hash"),
                "kernels": (json.loads(self.attrs["kernels"]).get("source")
                            if "kernels" in self.attrs else None)}

    # -------------------------------------------------------------------- as a prior
    def location_draws(self, configs: pd.DataFrame, n_draws: int = DEFAULT_PRIOR_DRAWS,
                       seed: int = 0) -> tuple[np.ndarray, dict[str, list[str]]]:
        """``(n, C, K)`` joint draws of the log-locations of ``configs`` (index ``config_id``;
        ``model``, ``gpu``, ``tp``, optional ``stack``) and, per configuration, its levels the
        population did not see.

        Each stored sample is used ``ceil(n_draws / n_samples)`` times, each time with fresh
        draws of the unseen levels' effects, shared by the configurations of the same level
        (:func:`~bayes_latency.model.posterior.unseen.config_log_location`).
        """
        from bayes_latency.model.posterior.unseen import config_common_draws, config_log_location

        design = self.design
        post = self.draws
        S = post.sizes["sample"]
        reps = max(1, int(np.ceil(n_draws / S)))
        rng = np.random.default_rng(seed)
        variant = str(self.attrs.get("variant", "hierarchy"))
        levels = []
        for cid, c in configs.iterrows():
            model = _level(design.models, str(c["model"]), "model")
            gpu = _level(design.gpus, str(c["gpu"]), "gpu")
            stack = str(c["stack"]) if "stack" in c and pd.notna(c["stack"]) else DEFAULT_STACK
            levels.append((str(cid), model, gpu, int(c["tp"]), stack))
        out = np.empty((reps, S, len(levels), len(self.coefs)))
        unseen: dict[str, list[str]] = {}
        for r in range(reps):
            shared: dict[tuple[str, Any], np.ndarray] = {}
            for i, (cid, model, gpu, tp, stack) in enumerate(levels):
                pa = prior_arrays(self.priors, self.coefs, [gpu])
                logt, un = config_log_location(post, pa, model, gpu, tp, stack, rng,
                                               design=design, variant=variant, shared=shared)
                out[r, :, i, :] = logt + config_common_draws(post, design, rng)
                unseen[cid] = un
        return out.reshape(reps * S, len(levels), len(self.coefs))[:n_draws], unseen

    def config_prior(self, configs: pd.DataFrame, n_draws: int = DEFAULT_PRIOR_DRAWS,
                     seed: int = 0) -> ConfigPrior:
        """The prior of ``configs`` (see the module docstring): a multivariate normal fitted to
        :meth:`location_draws`, a lognormal for ``sigma_config`` and, per noise class the fleet
        fitted, a lognormal for the noise scale (:attr:`ConfigPrior.noise_prior`)."""
        draws, unseen = self.location_draws(configs, n_draws, seed)
        n, C, K = draws.shape
        flat = draws.reshape(n, C * K)
        mean = flat.mean(axis=0)
        cov = np.cov(flat, rowvar=False).reshape(C * K, C * K)
        cov = cov + np.eye(C * K) * (COV_JITTER + 1e-9 * np.max(np.diag(cov)))
        chol = np.linalg.cholesky(cov)
        sc = self.draws["sigma_config"].transpose("coef", "sample").values.astype(float)
        ls = np.log(np.maximum(sc, 1e-6))
        return ConfigPrior(mean=mean.reshape(C, K), chol=chol,
                           log_sigma_config=(ls.mean(axis=1),
                                             np.maximum(ls.std(axis=1), MIN_LOG_SIGMA_SD)),
                           unseen=unseen, configs=tuple(str(c) for c in configs.index),
                           noise_prior=self.noise_prior)

    def coefficients(self, model: str, gpu: str, tp: int, n_draws: int | None = None,
                     seed: int = 0, stack: str = DEFAULT_STACK) -> xr.Dataset:
        """Zero-shot draws of beta and alpha for one configuration, from the population alone.

        The draws are those of a configuration the fleet did not fit
        (:func:`~bayes_latency.model.posterior.unseen.unseen_config_theta`): the population
        mean, the fitted effect of every level the fleet saw (model, GPU, TP degree, serving
        stack), an effect drawn from its factor's scale for every level it did not see, and a
        configuration residual drawn from ``sigma_config``. The file holds no configuration's
        own coefficients, so a configuration the fleet was fitted on gets the same kind of draws
        (its fit's posterior speaks for it more narrowly).

        Parameters
        ----------
        model, gpu
            Model name or ``config.json`` path; GPU name or datasheet (aliases resolved).
        tp
            Tensor-parallel degree.
        n_draws
            Number of draws (None: one per stored sample).
        seed
            Seed of the unseen effects, the residual and the subsample.
        stack
            Serving stack.

        Returns
        -------
        xr.Dataset
            ``beta (sample, term)`` and ``alpha (sample, alpha_term)``, with the attrs of
            :meth:`~bayes_latency.model.estimator.LatencyModel.coefficients` (``model``,
            ``gpu``, ``tp``, ``stack``, ``unseen_levels``, ``config_id``).
        """
        from bayes_latency.data.observations.build import config_id
        from bayes_latency.model.posterior.predict import coefficient_dataset
        from bayes_latency.model.posterior.unseen import kernel_terms_of, unseen_config_theta

        design = self.design
        model = _level(design.models, str(model), "model")
        gpu = _level(design.gpus, str(gpu), "gpu")
        rng = np.random.default_rng(seed)
        pa = prior_arrays(self.priors, self.coefs, [gpu])
        theta, unseen = unseen_config_theta(self.draws, pa, model, gpu, int(tp), stack, rng,
                                            design=design,
                                            variant=str(self.attrs.get("variant", "hierarchy")))
        extra = {}
        if "gpu" in unseen and (kt := kernel_terms_of(self.draws, gpu)):
            extra["kernel_terms"] = ",".join(kt)
        return coefficient_dataset(theta, self.terms, self.alpha_terms, rng, n_draws,
                                   model=model, gpu=gpu, tp=int(tp), stack=stack,
                                   unseen_levels=",".join(unseen),
                                   config_id=config_id(model, gpu, int(tp), stack), **extra)

    # -------------------------------------------------------------------- file
    def to_dataset(self) -> xr.Dataset:
        """The population as one xarray Dataset (what :meth:`save` writes)."""
        ds = self.draws.astype("float32")
        c = self.configs
        ds = ds.assign({
            "config_llm": ("config", c["model"].to_numpy().astype(str)),
            "config_gpu": ("config", c["gpu"].to_numpy().astype(str)),
            "config_tp": ("config", c["tp"].to_numpy().astype(int)),
            "config_stack": ("config", c["stack"].to_numpy().astype(str)),
        }).assign_coords(config=[str(i) for i in c.index])
        ds.attrs = {**{k: (json.dumps(v) if not isinstance(v, str | int | float) else v)
                       for k, v in self.attrs.items()},
                    "population_format": POPULATION_FORMAT,
                    "terms": json.dumps(list(self.terms)),
                    "alpha_terms": json.dumps(list(self.alpha_terms)),
                    "priors_yaml": _priors_yaml(self.priors),
                    "priors_hash": self.priors.hash}
        return ds

    def save(self, path: str | Path) -> Path:
        """Write the population atomically as compressed netCDF (float32 draws).

        Raises
        ------
        BayesLatencyError
            Draws that are not finite, or not of the population's coefficients and levels
            (:func:`checked_draws`): nothing is written.
        """
        from bayes_latency.io import atomic_path, write_netcdf
        from bayes_latency.model.posterior.persistence import COMPRESSION

        try:
            checked_draws(self.draws, self.coefs, self.configs)
        except BayesLatencyError as exc:
            raise BayesLatencyError(f"{path}: population not written: {exc}; the fit it comes "
                                    f"from is damaged (refit, or check it with `bayes-latency "
                                    f"check`)") from None

        ds = self.to_dataset()
        enc = {v: dict(COMPRESSION) for v in ds.data_vars
               if np.issubdtype(ds[v].dtype, np.number)}
        with atomic_path(path) as tmp:
            write_netcdf(ds, tmp, encoding=enc)
        return Path(path)


def _priors_yaml(priors: Any) -> str:
    from bayes_latency.model.posterior.persistence import _priors_yaml as embed

    return embed(priors)


#: What a fit with kernel evidence adds to a population (an unseen GPU's draw is conditioned on
#: its kernels, a configuration of another stack takes its GPU x stack interaction:
#: :mod:`bayes_latency.model.definition.kernels`; ``eff_gpu_stack`` is kept as an effect).
KERNEL_VARIABLES = ("kernel_offset", "kernel_log_time", "kernel_sigma", "kernel_stack",
                    "sigma_gpu_stack")
#: Posterior variables a population keeps (``eff_<factor>`` and ``sigma_<factor>_common`` of
#: every factor the fit has, besides these).
_KEEP = ("mu", "sigma_config", "sigma_config_common",
         *(f"sigma_{f}" for f in FACTORS), *KERNEL_VARIABLES)


def noise_lognormal(entry: dict[str, Any]) -> tuple[float, float]:
    """``(log median, sd)`` of the lognormal noise prior of a fleet noise class ``entry``
    (:func:`fleet_noise`): the lognormal of the configurations' scales, median
    ``exp(log_mean)`` and sd ``max(log_sd, NOISE_LOG_SD_MIN)``; an entry without them (one
    configuration, or a file that records the client kinds only) is centred on ``sigma`` with
    sd :data:`NOISE_LOG_SD_DEFAULT`.

    The RMS ``sigma`` is not the median: it is the scale of the pooled squared noise, above the
    configurations' typical scale when they differ (a lognormal's mean square is
    ``exp(2 sd^2)`` times its median's square: 2.6 for sd 0.69)."""
    sd, mu = entry.get("log_sd"), entry.get("log_mean")
    if sd is None or mu is None or not np.isfinite(sd) or not np.isfinite(mu):
        return float(np.log(float(entry["sigma"]))), NOISE_LOG_SD_DEFAULT
    return float(mu), max(float(sd), NOISE_LOG_SD_MIN)


def noise_priors(noise: dict[str, dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """Per class of a :func:`fleet_noise` table with a positive scale, ``(log median, sd)`` of
    its lognormal noise prior (:func:`noise_lognormal`)."""
    return {k: noise_lognormal(v) for k, v in noise.items() if float(v.get("sigma") or 0.0) > 0}


def fleet_noise(model: Any) -> dict[str, dict[str, Any]]:
    """Per noise class (:func:`~bayes_latency.model.definition.likelihood.noise_kind`) of a fitted model's
    rows, the fleet's noise scale of that class:

    * ``sigma``: the row-weighted RMS of the configurations' fitted scales,
      ``sqrt(sum_c n_c s_c^2 / sum_c n_c)`` (log scale, per step at the reference load);
    * ``rows``: ``sum_c n_c``; ``configs``: the configurations with rows of the class;
    * ``log_mean``, ``log_sd``: the mean and sd of ``log s_c`` across those configurations
      (each configuration once; None for one configuration): the lognormal of a
      configuration's scale (:func:`noise_lognormal`).

    ``model`` is a fitted :class:`~bayes_latency.model.estimator.LatencyModel` with its rows
    (after ``fit``, or ``attach_rows`` after ``load``); empty without them. Posterior-predictive
    rows (role ``ppc``) are not counted.
    """
    from bayes_latency.model.definition.likelihood import noise_kind

    rows = getattr(model, "_rows", None)
    out: dict[str, dict[str, Any]] = {}
    if rows is None or not len(rows):
        return out
    rows = rows[rows["role"] != "ppc"]
    cls = pd.Series(noise_kind(rows), index=rows.index)
    for kind in sorted(cls.unique()):
        counts = rows[cls == kind].groupby("config_id").size()
        s = np.asarray([float(model.noise(str(c), kind).sigma) for c in counts.index])
        n = counts.to_numpy(dtype=float)
        if not len(s) or not np.all(s > 0):
            continue
        out[str(kind)] = {"sigma": float(np.sqrt(np.sum(n * s**2) / n.sum())),
                          "rows": int(n.sum()), "configs": int(len(s)),
                          "log_mean": float(np.mean(np.log(s))) if len(s) > 1 else None,
                          "log_sd": float(np.std(np.log(s), ddof=1)) if len(s) > 1 else None}
    return out


def client_noise(noise: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """The client kinds (``workload_ttft``, ``workload_e2e``) of a :func:`fleet_noise` table as
    ``{kind: {"sigma", "rows"}}``: the fleet's scatter of a run's client means, which
    :func:`~bayes_latency.calibrate.predict.run_level_sigma` pools into the bands."""
    from bayes_latency.schedule.replay import WORKLOAD_KINDS

    return {k: {"sigma": float(v["sigma"]), "rows": int(v["rows"])}
            for k, v in noise.items() if k in WORKLOAD_KINDS[:2]}


def population_from_result(result: xr.DataTree, *, n_samples: int = DEFAULT_SAMPLES,
                           left_out: str = "", source: str = "",
                           noise: dict[str, dict[str, float]] | None = None) -> Population:
    """The population of a fitted result (a :class:`~bayes_latency.model.estimator.LatencyModel`'s
    ``result`` or a file read with :func:`~bayes_latency.model.posterior.persistence.read_result`).

    ``n_samples``: joint posterior draws kept, evenly thinned; ``left_out``: what the fit's
    data left out (recorded, e.g. ``model=llama-2-7b``); ``source``: what the fit was made on;
    ``noise``: the fleet's noise scale per noise class (:func:`fleet_noise` of the fitted
    model), recorded as attrs ``fleet_noise`` (:attr:`Population.client_noise` reads its client
    kinds; files that record only ``client_noise`` still load).

    Raises
    ------
    ConfigError
        The result is not of a hierarchy (variants ``hierarchy`` or ``no_ard``): the others have
        no population to borrow from.
    """
    from bayes_latency.model.posterior.persistence import configs_table, posterior_with_fixed
    from bayes_latency.priors import load_priors
    from bayes_latency.textfiles import load_yaml

    a = result.attrs
    variant = str(a.get("variant", ""))
    if variant not in ("hierarchy", "no_ard"):
        raise ConfigError(f"a population comes from a fit of the hierarchy (variant hierarchy or "
                          f"no_ard), not of variant {variant!r}")
    post = posterior_with_fixed(result)
    names = [v for v in post.data_vars
             if v in _KEEP or str(v).startswith("eff_")
             or (str(v).startswith("sigma_") and str(v).endswith("_common"))]
    post = post[names].stack(sample=("chain", "draw")).transpose(..., "sample")
    S = post.sizes["sample"]
    idx = np.unique(np.linspace(0, S - 1, min(int(n_samples), S)).round().astype(int))
    draws = post.isel(sample=idx).drop_vars(["sample", "chain", "draw"], errors="ignore")
    draws = draws.assign_coords(sample=np.arange(draws.sizes["sample"]))
    for v in list(draws.coords):
        if v not in draws.dims:
            draws = draws.drop_vars(v)
    priors = load_priors(load_yaml(a["priors_yaml"]))
    pop = Population(
        draws=draws.astype("float32"), configs=configs_table(result).assign(
            stack=lambda d: d["stack"] if "stack" in d else DEFAULT_STACK),
        terms=tuple(json.loads(a["terms"])), alpha_terms=tuple(
            str(t) for t in result["posterior"]["alpha_term"].values),
        priors=priors,
        attrs={"model_version": str(a.get("model_version")),
               "bayes_latency_version": __version__, "data_hash": str(a.get("data_hash", "")),
               "variant": variant, "left_out": left_out, "source": source,
               "n_samples": int(draws.sizes["sample"]),
               "fleet_noise": json.dumps(noise or {}),
               # the kernel tables of a fit with kernel evidence (model.definition.kernels)
               **({"kernels": str(a["kernels"])} if "kernels" in a else {})})
    return pop


# ------------------------------------------------------------------------ leave-out
def parse_leave_out(spec: str) -> tuple[str, str]:
    """``KEY=VALUE`` of ``--leave-out`` as ``(key, value)``; the key one of
    :data:`LEAVE_OUT_KEYS`.

    Raises
    ------
    ConfigError
        No ``=``, an empty value or an unknown key.
    """
    key, sep, value = str(spec).partition("=")
    key, value = key.strip().lower(), value.strip()
    if not sep or not value:
        raise ConfigError(f"--leave-out {spec!r}: expected KEY=VALUE with KEY one of "
                          f"{', '.join(LEAVE_OUT_KEYS)} (e.g. model=llama-2-7b)")
    if key not in LEAVE_OUT_KEYS:
        raise ConfigError(f"--leave-out {spec!r}: unknown key {key!r}; expected one of "
                          f"{', '.join(LEAVE_OUT_KEYS)}")
    if key == "tp" and not value.isdigit():
        raise ConfigError(f"--leave-out {spec!r}: tp must be an integer")
    return key, value


def leave_out(observations: pd.DataFrame, spec: str) -> tuple[pd.DataFrame, int]:
    """``observations`` without every row of the level ``spec`` (``KEY=VALUE``,
    :func:`parse_leave_out`) and the number of rows removed.

    Model and GPU names resolve like the rest of the package (``H100`` matches
    ``H100-SXM``).

    Raises
    ------
    ConfigError
        A bad ``spec``, or no row of the table has that level (nothing would be left out).
    """
    key, value = parse_leave_out(spec)
    col = {"model": "model", "gpu": "gpu", "tp": "tp", "config": "config_id"}[key]
    if col not in observations.columns:
        raise ConfigError(f"--leave-out {spec}: the observation table has no {col!r} column")
    have = observations[col]
    if key == "tp":
        hit = have.astype(int) == int(value)
    else:
        hit = have.astype(str) == value
        if not hit.any() and key in ("model", "gpu"):
            hit = have.astype(str) == _canonical(key, value)
    if not hit.any():
        seen = sorted(map(str, have.astype(str).unique()))
        raise ConfigError(f"--leave-out {spec}: no row has {key} {value!r}; the table has "
                          f"{key} {seen}")
    return observations[~hit].reset_index(drop=True), int(hit.sum())


def _level(levels: list[str], value: str, key: str) -> str:
    """``value`` as the population names it: a level whose canonical name (GPU alias, model
    name resolved) is ``value``'s, else ``value`` itself (unseen)."""
    if value in levels:
        return value
    want = _canonical(key, value)
    for lv in levels:
        if _canonical(key, lv) == want:
            return lv
    return want


def _canonical(key: str, value: str) -> str:
    from bayes_latency.physics.hardware import load_gpu
    from bayes_latency.physics.models import load_architecture

    try:
        return (load_architecture(value).name or value) if key == "model" else load_gpu(value).name
    except BayesLatencyError:
        return value


def level_names(pop: Population, factor: str) -> list[str]:
    """The seen levels of ``factor`` in the population's draws (``eff_<factor>``)."""
    eff = pop.draws.get(f"eff_{factor}")
    return [] if eff is None else [str(v) for v in eff[level_dim(factor)].values]
