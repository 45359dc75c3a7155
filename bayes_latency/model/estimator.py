"""``LatencyModel``: the one estimator of bayes_latency.

>>> m = LatencyModel().fit(observations)          # doctest: +SKIP
>>> m, report = bayes_latency.fit(observations)     # the same, then the gates (as the CLI)
>>> m.coefficients("llama-2-70b", "H100", 4)       # beta(sample, term), alpha(sample, alpha_term)
>>> m.save("posterior.nc"); LatencyModel.load("posterior.nc")

The fitted result is an ``xarray.DataTree`` with the groups ArviZ expects (``posterior``,
``sample_stats``, ``observed_data``, ``log_likelihood``, ``posterior_predictive``, ``prior``,
``prior_predictive``, ``log_prior``; see :mod:`bayes_latency.model.posterior.groups`) and two of its own
(``constant_data``, ``summaries``), with attrs ``bayes_latency_version``, ``model_version``,
``priors_hash``, ``priors_yaml`` (the priors themselves), ``data_hash``, ``terms``, ``method``,
``variant``, ``sampler``, ``sampler_settings`` and ``approximate``: :meth:`LatencyModel.load`
rebuilds the estimator from the file alone. Loading a file made by another model version, or
given priors that differ from the embedded ones, raises
:class:`~bayes_latency.errors.ModelMismatchError`.

``LatencyModel`` is a facade: it keeps the fit's state and delegates each concern to a module
that takes arrays, tables, DataTrees, the PyMC model and a :class:`~bayes_latency.model.posterior.state.FitState`: from the
table to the PyMC model (:mod:`bayes_latency.model.inference.build`), the draws (:mod:`bayes_latency.model.inference.fitting`, with the samplers of
:mod:`bayes_latency.model.inference.sampler`, the extension of :mod:`bayes_latency.model.inference.extension` and the derived variables of
:mod:`bayes_latency.model.posterior.deterministics`), the ArviZ groups (:mod:`bayes_latency.model.posterior.groups`), the result's layout, save and read
(:mod:`bayes_latency.model.posterior.persistence`), the noise per configuration (:mod:`bayes_latency.model.definition.noise`), coefficients and predictions
(:mod:`bayes_latency.model.posterior.predict`) and the convergence gates (:mod:`bayes_latency.model.inference.convergence`). The ``bayes-latency fit``
command is :mod:`bayes_latency.cli.fit`.

Importing this module is light (no PyMC, PyTensor or ArviZ): they are imported when a model is
built or diagnosed.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import xarray as xr

from bayes_latency.data.observations.build import DEFAULT_STACK
from bayes_latency.data.report import IngestReport
from bayes_latency.errors import BayesLatencyError, ConfigError
from bayes_latency.model.definition.identifiability import IdentifiabilityReport
from bayes_latency.model.definition.likelihood import (
    DEFAULT_NOISE_LOAD,
    NoiseParams,
    check_noise_load,
)
from bayes_latency.model.definition.noise import (  # noqa: F401 - NOISE_PROXY re-exported
    NOISE_PROXY,
    noise_from_result,
    noise_params,
    row_noise,
)
from bayes_latency.model.definition.summaries import ConfigSummary
from bayes_latency.model.inference import build as _build
from bayes_latency.model.inference import convergence as _convergence
from bayes_latency.model.inference.convergence import GATES  # noqa: F401 - re-exported
from bayes_latency.model.inference.fitting import draw_posterior
from bayes_latency.model.inference.progress import progress_mode
from bayes_latency.model.inference.sampler import (
    ADAPTATIONS,
    DEFAULT_DRAWS,
    DEFAULT_TUNE,
    NUTPIE_ADAPTATION,
    SAMPLERS,
    TARGET_ACCEPT,
    resolve_max_draws,
)
from bayes_latency.model.posterior import persistence as _persistence
from bayes_latency.model.posterior import predict as _predict
from bayes_latency.model.posterior.shifts import RunTable
from bayes_latency.model.posterior.state import FitState
from bayes_latency.physics.basis import ALPHA_TERMS, DEFAULT_TERMS, term_names

if TYPE_CHECKING:  # pragma: no cover
    import pymc as pm

    from bayes_latency.model.definition.hierarchy import Design

METHODS = ("laplace-hierarchy", "full")

#: Whether :meth:`LatencyModel.fit` adds the observation-level and prior groups
#: (:mod:`bayes_latency.model.posterior.groups`); off inside :func:`posterior_only`.
_ARVIZ_GROUPS: contextvars.ContextVar[bool] = contextvars.ContextVar("arviz_groups", default=True)


@contextlib.contextmanager
def posterior_only() -> Iterator[None]:
    """Fits inside the block skip the ArviZ groups beyond ``posterior``, ``sample_stats`` and the
    package's own (``constant_data``, ``summaries``): no ``observed_data``, ``log_likelihood``,
    ``posterior_predictive``, ``prior``, ``prior_predictive`` or ``log_prior``; attrs
    ``arviz_groups`` says so. For intermediate fits whose posterior means are all that is used
    (a calibration's fast iterations, :func:`bayes_latency.calibrate.loop.calibrate`), which saves
    their cost (3-6 s a fit: the log-likelihood and replicated rows, the prior draws, the log
    prior). Not for a fit that is checked, saved or returned to a user.
    """
    token = _ARVIZ_GROUPS.set(False)
    try:
        yield
    finally:
        _ARVIZ_GROUPS.reset(token)


@contextlib.contextmanager
def _quiet_pymc() -> Iterator[None]:
    """PyMC's INFO messages (``Sampling: [sigma_config_free, ...]`` of
    ``pm.sample_prior_predictive``) off inside the block; its warnings still show."""
    import logging

    log = logging.getLogger("pymc")
    old = log.level
    if log.getEffectiveLevel() < logging.WARNING:
        log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        log.setLevel(old)


def _as_population(population: object) -> object:
    """A :class:`~bayes_latency.model.posterior.fleet.Population` (read from its file when a path)."""
    from bayes_latency.model.posterior.population_file import load_population

    return population if hasattr(population, "config_prior") else load_population(population)


def _with_population(population: object, priors: object, terms: tuple
                     ) -> tuple[object, tuple, str]:
    """``(priors, terms, "population")`` of a fit under ``population``: the population's own
    priors and terms; given ones must match them."""
    from bayes_latency.errors import ModelMismatchError

    pop = _as_population(population)
    if priors is not None:
        if not hasattr(priors, "log_mean_sd"):
            from bayes_latency.priors import load_priors

            priors = load_priors(priors)
        if priors.hash != pop.priors.hash:
            raise ModelMismatchError(f"the population {pop.name!r} was fitted with priors "
                                     f"{pop.priors.hash[:12]}, the priors given hash to "
                                     f"{priors.hash[:12]}; leave the priors out")
    if tuple(term_names(terms)) not in (tuple(pop.terms), tuple(term_names(DEFAULT_TERMS))):
        raise ModelMismatchError(f"the population {pop.name!r} has terms {list(pop.terms)}; the "
                                 f"fit asks for {list(term_names(terms))}")
    return pop.priors, tuple(pop.terms), "population"


class LatencyModel:
    """Hierarchical Bayesian model of iteration times (beta) and request overheads (alpha).

    Parameters
    ----------
    priors
        A :class:`bayes_latency.priors.PriorSet`, a path to a prior YAML, or None for
        ``priors/default.yaml``.
    terms
        Beta terms (default: the BLIS ``trained-physics`` set of :mod:`bayes_latency.physics.basis`).
    method
        ``"laplace-hierarchy"`` (per-configuration likelihood summaries under the hierarchy; fast
        and exact up to a quadratic expansion of each configuration's likelihood) or ``"full"``
        (every row in the likelihood).
    sampler
        ``"nutpie"`` (default), ``"pymc"``, ``"numpyro"`` (NUTS) or ``"laplace"`` (a Gaussian at
        the posterior mode in unconstrained space: fast, **approximate**, labelled as such).
    variant
        ``"hierarchy"`` (default), ``"no_ard"``, ``"complete_pooling"`` or ``"no_pooling"``.
    population
        A fitted fleet's :class:`~bayes_latency.model.posterior.fleet.Population` (or a path to its
        file): the configurations of the data take the population's prior (a seen level its
        fitted effect, an unseen level a draw from its factor's scale; variant
        ``"population"``, :mod:`bayes_latency.model.posterior.fleet`). The terms and priors are then the
        population's (``terms`` / ``priors`` given must match them), and the rows enter the
        likelihood directly (method ``"full"``): new data of a few client means give a
        stage-1 summary whose optimum lies far outside the population's range, and its
        quadratic expansion there made a second mode (one run's client rows, llama-2-7b
        codegen: R-hat 1.83, chains 9 prior sds apart; with the rows: one mode, R-hat 1.017
        at 1000 draws).
    noise_load
        Load covariate of the noise scale (:data:`~bayes_latency.model.definition.likelihood.NOISE_LOADS`;
        default :data:`~bayes_latency.model.definition.likelihood.DEFAULT_NOISE_LOAD`): the scale of a
        step's noise grows with it at a fitted rate (:mod:`~bayes_latency.model.definition.likelihood`).
    kernels
        Measured kernel efficiency per GPU
        (:func:`~bayes_latency.data.kernel_evidence.kernel_evidence`, or ``True`` to read the
        installed tables): data on each GPU's effect in the tables' serving stack, and a GPU x
        stack interaction for the other stacks (:mod:`bayes_latency.model.definition.kernels`).
        Recorded in the result (attribute ``kernels``).
    """

    def __init__(self, priors: object = None, terms: tuple = DEFAULT_TERMS,
                 method: str = "laplace-hierarchy", sampler: str = "nutpie",
                 variant: str = "hierarchy", scheduler: object = None,
                 population: object = None, noise_load: str = DEFAULT_NOISE_LOAD,
                 kernels: object = None) -> None:
        if population is not None:
            population = _as_population(population)
            priors, terms, variant = _with_population(population, priors, terms)
            method = "full"
        if method not in METHODS:
            raise ConfigError(f"unknown method {method!r}; expected one of {METHODS}")
        if sampler not in SAMPLERS:
            raise ConfigError(f"unknown sampler {sampler!r}; expected one of {SAMPLERS}")
        from bayes_latency.model.definition.hierarchy import VARIANTS

        if variant not in VARIANTS:
            raise ConfigError(f"unknown variant {variant!r}; expected one of {VARIANTS}")
        if not hasattr(priors, "log_mean_sd"):
            from bayes_latency.priors import load_priors

            priors = load_priors(priors)
        self.priors = priors
        self.terms = tuple(term_names(terms))
        self.alpha_terms = tuple(ALPHA_TERMS)
        self.coefs = self.terms + self.alpha_terms
        self.method, self.sampler, self.variant = method, sampler, variant
        #: the fleet population whose prior the configurations take (variant ``population``)
        self.population = population
        #: per configuration, the levels the population did not see (after a build)
        self.population_unseen: dict[str, list[str]] = {}
        self.noise_load = check_noise_load(noise_load)
        if kernels is True:
            from bayes_latency.data.kernel_evidence import kernel_evidence

            kernels = kernel_evidence()
        if kernels is not None and variant not in ("hierarchy", "no_ard"):
            raise ConfigError(f"kernel evidence acts on the crossed GPU effects: variant "
                              f"{variant!r} has none")
        #: measured kernel efficiency per GPU (:mod:`bayes_latency.model.definition.kernels`)
        self.kernels = kernels or None
        #: where stage 1 runs (:func:`bayes_latency.model.definition.summaries.summarize`); stage 2 runs here
        self.scheduler = scheduler
        self.result: xr.DataTree | None = None
        self.design: Design | None = None
        self.summaries: list[ConfigSummary] | None = None
        self.report = IngestReport(source="fit")
        self.identifiability: IdentifiabilityReport | None = None
        self._noise: dict[str, dict[str, NoiseParams]] = {}
        self.timings: dict[str, float] = {}
        self._settings: dict[str, object] = {}
        self._rows: pd.DataFrame | None = None
        self._data_hash: str | None = None
        self._post_cache: tuple | None = None
        self._runs_cache: tuple | None = None

    # ------------------------------------------------------------------ state
    def _scale(self) -> np.ndarray:
        return _build.coefficient_scale(self.priors, self.coefs)

    def _state(self) -> FitState:
        """The fitted state the functional modules take (:class:`~bayes_latency.model.posterior.state.FitState`)."""
        if self.design is None:
            raise BayesLatencyError("the model is not fitted; call fit() or load()")
        return FitState(priors=self.priors, design=self.design, method=self.method,
                        variant=self.variant, sampler=self.sampler, noise=self._noise,
                        summaries=self.summaries, identifiability=self.identifiability,
                        data_hash=self._data_hash, noise_load=self.noise_load,
                        runs=self._run_table())

    @property
    def run_table(self) -> RunTable | None:
        """The fitted runs' and windows' log shifts with their standard errors
        (:class:`~bayes_latency.model.posterior.shifts.RunTable`; None for a fit without run
        effects or before a fit)."""
        return self._run_table()

    def _run_table(self) -> RunTable | None:
        """The fitted run and window shifts (:class:`~bayes_latency.model.posterior.shifts.RunTable`),
        read once per result from its ``summaries`` group."""
        if self.result is None or "summaries" not in self.result.children:
            return None
        node = self.result["summaries"]
        if "run_label" not in node.data_vars:  # the full path, or a file without run effects
            return None
        if self._runs_cache is None or self._runs_cache[0] is not node:
            self._runs_cache = (node, RunTable.from_dataset(node.to_dataset()))
        return self._runs_cache[1]

    # ------------------------------------------------------------------ building
    def _prepare(self, observations: pd.DataFrame) -> pd.DataFrame:
        prep = _build.prepare(observations, self.terms, self.alpha_terms, self._scale(),
                              self.report)
        self.design, self._data_hash = prep.design, prep.data_hash
        self.identifiability = prep.identifiability
        return prep.rows

    def build(self, observations: pd.DataFrame) -> pm.Model:
        """The PyMC model for ``observations`` (computes stage-1 summaries when needed)."""
        rows = self._prepare(observations)
        self._rows = rows
        summaries = None
        if self.method == "laplace-hierarchy":
            t0 = time.perf_counter()
            self.summaries = summaries = _build.stage_one(rows, self.design, self.priors,
                                                          self._scale(), self.report,
                                                          scheduler=self.scheduler,
                                                          noise_load=self.noise_load)
            self.timings["summaries_s"] = time.perf_counter() - t0
            self._noise = {s.config_id: s.noise for s in summaries}
        prior = None
        if self.variant == "population":
            if self.population is None:
                raise ConfigError("variant 'population' needs population=")
            prior = self.population.config_prior(self.design.configs)
            self.population_unseen = dict(prior.unseen)
        return _build.build_pymc_model(self.design, self.priors, rows, variant=self.variant,
                                       ident=self.identifiability, summaries=summaries,
                                       population_prior=prior, noise_load=self.noise_load,
                                       kernels=self.kernels)

    def _sum_groups(self) -> list[tuple[list[str], np.ndarray, dict[str, np.ndarray]]]:
        """:func:`~bayes_latency.model.inference.build.sum_groups` of the fitted rows."""
        return _build.sum_groups(self._rows, self.coefs)

    def _no_gate(self) -> tuple[str, ...]:
        """:func:`~bayes_latency.model.inference.build.no_gate` of the fitted rows."""
        return _build.no_gate(self.identifiability, self._rows, self.coefs)

    # ------------------------------------------------------------------ fitting
    def fit(self, observations: pd.DataFrame, draws: int = DEFAULT_DRAWS, tune: int = DEFAULT_TUNE,
            chains: int = 2,
            seed: int = 0, progress: bool | str = True, target_accept: float = TARGET_ACCEPT,
            adaptation: str = NUTPIE_ADAPTATION, prior_draws: int = 500,
            max_draws: int | str | None = "auto", gates: dict | None = None) -> LatencyModel:
        """Fit the model; the result is in :attr:`result`. Check :meth:`convergence` after.

        This is the estimator step: it samples (on until the convergence gates pass, by default)
        but applies no gate. :func:`bayes_latency.fit` (what ``bayes-latency fit`` runs) fits
        with this method and then applies the convergence and adequacy gates, returning the
        model and a :class:`~bayes_latency.checks.gated.GateReport`.

        ``target_accept`` is NUTS's step-size target (nutpie and PyMC); raise it towards 0.99 when
        a few divergences remain. ``adaptation`` is nutpie's mass-matrix adaptation, ``"low_rank"``
        (default; needed when coefficients are identified only jointly) or ``"diag"`` (cheaper
        when they are not; see :data:`NUTPIE_ADAPTATION`). ``prior_draws`` is the number of
        draws in the ``prior`` and ``prior_predictive`` groups (0: no prior groups).

        ``max_draws`` (nutpie only) lets sampling go on past ``draws``, checking the convergence
        gates (``gates``, default :data:`GATES`) at fixed checkpoints (``draws``, then every
        ``draws / 2`` more) and stopping at the first that passes, or when more draws cannot
        help (divergences, or chains in different places: R-hat above 1.3 at the first check,
        or above 1.1 and not falling). ``"auto"`` (default, as ``bayes-latency fit``): up to
        :data:`~bayes_latency.model.inference.sampler.MAX_DRAWS_FACTOR` x ``draws``; ``None`` or 0:
        exactly ``draws``. When it stopped on divergences, it samples once more at
        ``target_accept`` 0.995 (:mod:`~bayes_latency.model.inference.extension`). The checks and where
        it stopped are in the result's ``extension`` attribute and in :meth:`convergence`.

        ``progress``: ``True`` (default) shows nutpie's progress where the fit runs: a bar in a
        notebook or on a terminal whose total is what will run (the draws up to the next
        checkpoint), else one line on stderr at the end of tuning, at each checkpoint and at the
        end; ``False``: nothing; ``"bar"`` / ``"lines"``: that display
        (:func:`~bayes_latency.model.inference.progress.progress_mode`).
        """
        progress = progress_mode(progress)
        max_draws = resolve_max_draws(max_draws, draws)
        if adaptation not in ADAPTATIONS:
            raise ConfigError(f"unknown adaptation {adaptation!r}; expected one of {ADAPTATIONS}")
        t_start = time.perf_counter()
        model = self.build(observations)
        self.timings["build_s"] = time.perf_counter() - t_start
        drawn = draw_posterior(model, self._state(), draws=draws, tune=tune, chains=chains,
                               seed=seed, progress=progress, target_accept=target_accept,
                               adaptation=adaptation, prior_draws=prior_draws,
                               max_draws=max_draws, gates=gates, timings=self.timings)
        self._settings = drawn.settings
        self.report.notes.extend(drawn.notes)
        self.timings["total_s"] = time.perf_counter() - t_start
        self.result = _persistence.assemble(self._state(), drawn.trace, self._rows,
                                            timings=self.timings, report=self.report,
                                            settings=self._settings)
        if drawn.extension is not None:
            self.result.attrs["extension"] = json.dumps(drawn.extension)
        if self.kernels is not None:
            self.result.attrs["kernels"] = self.kernels.to_json()
        if self.population is not None:
            self.result.attrs["population"] = json.dumps(
                {**self.population.describe(), "unseen_levels": self.population_unseen})
        t0 = time.perf_counter()
        if _ARVIZ_GROUPS.get():
            self._add_arviz_groups(model, seed, prior_draws)
        else:
            self.result.attrs["arviz_groups"] = "skipped (posterior_only)"
        self.timings["arviz_groups_s"] = time.perf_counter() - t0
        self.result.attrs["timings"] = json.dumps(self.timings)
        self.result.attrs["fit_report"] = json.dumps(self.report.to_dict())
        return self

    def _add_arviz_groups(self, model: pm.Model, seed: int, prior_draws: int) -> None:
        """``observed_data``, ``log_likelihood``, ``posterior_predictive``, ``prior``,
        ``prior_predictive`` and ``log_prior`` (:mod:`bayes_latency.model.posterior.groups`)."""
        from bayes_latency.model.posterior import groups

        if not self._noise:  # the full path's noise: posterior means of the result
            self._noise_from_result()
        with _quiet_pymc():  # no "Sampling: [...]" line of pm.sample_prior_predictive
            timings, notes = groups.add_groups(self.result, self._state(), model, self._rows,
                                               seed, prior_draws=prior_draws)
        self.timings.update(timings)
        self.report.notes.extend(notes)

    # ------------------------------------------------------------------ posterior access
    def _post(self) -> xr.Dataset:
        """The posterior with the fixed quantities (kept once in ``constant_data``) over the
        draws, as the model has them (:func:`~bayes_latency.model.posterior.persistence.posterior_with_fixed`)."""
        if self.result is None:
            raise BayesLatencyError("the model is not fitted; call fit() or load()")
        # built once per posterior (predictions call this per configuration): kept while the
        # result, its posterior and constant_data are the same objects with the same variables
        node = self.result["posterior"]
        nodes = (self.result, node, self.result.children.get("constant_data"))
        names = tuple(node.data_vars)
        cached = self._post_cache
        if (cached is None or cached[1] != names
                or any(a is not b for a, b in zip(cached[0], nodes, strict=True))):
            self._post_cache = (nodes, names, _persistence.posterior_with_fixed(self.result))
        return self._post_cache[2]

    def noise(self, cfg: str, kind: str) -> NoiseParams:
        """Noise parameters of (configuration, kind); the fleet median for unseen ones."""
        if not self._noise:
            self._noise_from_result()
        return noise_params(self._noise, cfg, kind)

    def _noise_from_result(self) -> None:
        if self.result is None:
            raise BayesLatencyError("the model is not fitted; call fit() or load()")
        self._noise = noise_from_result(self.result, self.method)

    def _canonical(self, model: str, gpu: str) -> tuple[str, str]:
        return _predict.canonical_levels(self.design, model, gpu)

    def config_ids(self, model: str | None = None, gpu: str | None = None, tp: int | None = None,
                   stack: str | None = None) -> list[str]:
        """Fitted configuration ids matching the given model / GPU / TP degree / stack.

        Names are resolved like :meth:`coefficients` does: a GPU alias (``"H100"``) or a Hugging
        Face model name matches the canonical level the fit stored (``"H100-SXM"``). ``None``
        matches every level.
        """
        if self.design is None:
            raise BayesLatencyError("the model is not fitted; call fit() or load()")
        return _predict.config_ids(self.design, model, gpu, tp, stack)

    def sel(self, model: str | None = None, gpu: str | None = None, tp: int | None = None,
            stack: str | None = None, group: str = "posterior") -> xr.Dataset:
        """The ``group`` of the result restricted to the configurations matching the levels.

        >>> m.sel(model="llama-2-70b", gpu="H100", tp=4)["beta"]   # doctest: +SKIP

        Aliases resolve (see :meth:`config_ids`); the ``config`` dimension is kept. This is the
        way to select a configuration: ``llm``, ``gpu`` and ``tp`` are the level dimensions of
        the factor effects (``eff_model (llm, coef)``), not of ``beta``, so
        ``post.sel(llm=..., gpu=..., tp=...)["beta"]`` would leave every configuration in. On a
        file without the estimator, :func:`bayes_latency.select` gives the ids from its
        ``constant_data`` (``config_llm``, ``config_gpu``, ``config_tp``, ``config_stack``):
        ``dt["posterior"]["beta"].sel(config=select(dt, llm=..., gpu="H100", tp=4))``.
        Raises :class:`~bayes_latency.errors.ConfigError` when no fitted configuration matches
        (use :meth:`coefficients` for an unseen one).
        """
        ids = self.config_ids(model, gpu, tp, stack)
        if not ids:
            raise ConfigError(f"no fitted configuration has model={model!r}, gpu={gpu!r}, "
                              f"tp={tp!r}, stack={stack!r}; fitted: {list(self.design.configs.index)}"
                              "; coefficients() speaks for unseen configurations")
        if self.result is None or group not in self.result.children:
            raise BayesLatencyError(f"the result has no {group!r} group")
        ds = self.result[group].to_dataset()
        if "config" not in ds.dims:
            raise ConfigError(f"group {group!r} has no config dimension")
        return ds.sel(config=ids)

    def coefficients(self, model: str, gpu: str, tp: int, n_draws: int | None = None,
                     seed: int = 0, stack: str = DEFAULT_STACK,
                     new_run: bool = False) -> xr.Dataset:
        """Posterior draws of beta and alpha for any configuration.

        Levels (model, GPU, TP degree) seen in the data use their fitted effects; an unseen level
        draws its effect from the population, ``N(0, sigma_level^2 (1 + 1/n))`` around the
        fitted mean (the ``n`` seen levels' zero-sum effects leave their average in the mean),
        so the bands of an unseen configuration widen honestly.

        The draws are the configuration's coefficients: the average of its fitted runs. With
        ``new_run=True`` each draw is multiplied by the factor of a new run,
        ``exp(N(0, sigma_run^2 (1 + 1/n)))`` for a configuration of ``n`` fitted runs
        (:mod:`bayes_latency.model.posterior.shifts`): the coefficients a simulation of the next
        run of the configuration should scatter over.

        Returns
        -------
        xr.Dataset
            ``beta (sample, term)`` and ``alpha (sample, alpha_term)``; attrs say which levels
            were unseen and whether the draws are a new run's (``run``).
        """
        return _predict.coefficient_draws(self._state(), self._post(), model, gpu, tp,
                                          n_draws=n_draws, seed=seed, stack=stack,
                                          new_run=new_run)

    def predict(self, observations: pd.DataFrame, n_draws: int = 200,
                seed: int = 0, run: str = "auto") -> xr.DataArray:
        """Posterior draws of the expected value (µs) of each row of an observation table.

        ``observations`` are rows of the observation table, with their ``x_<term>`` features and
        configuration (``config_id``, ``model``, ``gpu``, ``tp``). Returns a DataArray
        ``(sample, obs)`` of each row's expected value without observation noise
        (:meth:`sample_posterior_predictive` adds the noise). For a batch table of a
        configuration (seen or not), use :meth:`predict_batches`.

        A row of a run the fit saw (its ``experiment_id``, or ``run_id``) is predicted with
        that run's shift; any other row as a **new run** of its configuration, whose shift is
        drawn from ``sigma_run`` (``run="new"``: every row a new run). The coordinate
        ``run_status (obs)`` says which (:mod:`bayes_latency.model.posterior.shifts`).
        """
        _predict.require_row_columns(self.coefs, observations)
        return _predict.predict_rows(self._state(), self._post(), observations,
                                     n_draws=n_draws, seed=seed, run=run)

    def predict_batches(self, batches: pd.DataFrame | None, model: str, gpu: str, tp: int,
                        n_draws: int = 200, seed: int = 0, stack: str = DEFAULT_STACK,
                        **serving: object) -> pd.DataFrame:
        """Predicted iteration times of a batch table for one configuration, with 90% bands.

        ``batches`` is a batch table (the columns of
        :data:`bayes_latency.physics.basis.BATCH_COLUMNS`, one row per engine step; None: the
        default reference batches of :func:`bayes_latency.model.posterior.predict.predict_reference`). The
        configuration ``model`` / ``gpu`` / ``tp`` may be seen or unseen (:meth:`coefficients`
        draws its coefficients, an unseen one with its wider band); ``serving`` takes the knobs
        of :class:`~bayes_latency.physics.serving.ServingConfig`. The coefficients are a new run's
        (``coefficients(new_run=True)``). Returns a DataFrame: the batch
        columns plus ``mean_us, median_us, q05_us, q95_us`` per row
        (:func:`bayes_latency.model.posterior.predict.predict_reference`); ``attrs["unseen_levels"]``
        names the levels the fit did not see.
        """
        coefs = self.coefficients(model, gpu, int(tp), n_draws=n_draws, seed=seed, stack=stack,
                                  new_run=True)
        config = {"model": model, "gpu": gpu, "tp": int(tp), **serving}
        out = _predict.predict_reference(coefs, config, batches=batches)
        out.attrs["unseen_levels"] = coefs.attrs.get("unseen_levels", "")
        out.attrs["run"] = coefs.attrs.get("run", "")
        return out

    def _row_noise(self, observations: pd.DataFrame
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-row noise of each row's (configuration, noise class)
        (:func:`~bayes_latency.model.definition.noise.row_noise`)."""
        if not self._noise:
            self._noise_from_result()
        return row_noise(self._noise, observations)

    def sample_posterior_predictive(self, observations: pd.DataFrame, n_draws: int = 200,
                                    seed: int = 0, run: str = "auto") -> xr.DataArray:
        """Posterior predictive draws (µs) of each row, with the fitted heavy-tailed noise; rows
        of fitted runs and new runs as in :meth:`predict` (coordinate ``run_status``)."""
        mu = self.predict(observations, n_draws=n_draws, seed=seed, run=run)
        if not self._noise:
            self._noise_from_result()
        return _predict.replicate_rows(mu, self._noise, observations, seed=seed)

    def pointwise_loglik(self, observations: pd.DataFrame, seed: int = 0) -> xr.DataArray:
        """``log p(y_i | theta)`` for every posterior draw (chain, draw, obs): a fitted run's
        rows about its fitted shift, any other row about its configuration."""
        post = self._post()
        if not self._noise:
            self._noise_from_result()
        return _predict.pointwise_loglik(post, self.coefs, self._noise, observations,
                                         runs=self.run_table)

    # ------------------------------------------------------------------ checks
    def convergence(self, gates: dict | None = None) -> dict:
        """Max R-hat, min bulk ESS, divergences and whether they pass ``gates`` (:data:`GATES`)."""
        return _convergence.convergence(self.result, self.identifiability, gates)

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path, thin: int | None = None) -> Path:
        """Write the result DataTree to netCDF (``.nc``) or zarr (``.zarr``).

        ``thin`` keeps every ``thin``-th draw of every group indexed by the posterior's draws
        (``posterior``, ``sample_stats``, ``log_likelihood``, ``posterior_predictive``,
        ``log_prior``), so they stay aligned as ArviZ needs. Default (``None``): the thinning
        that keeps at most :data:`~bayes_latency.model.posterior.groups.FILE_MAX_SAMPLES` (800)
        posterior samples; ``thin=1`` keeps every draw. Attrs ``thinned_by`` and ``n_samples``
        record the factor and the samples kept. Draws are float32 except the free variables of
        the model (float64), every numeric array gzip-compressed with shuffle. The in-memory
        result is not changed.
        """
        return _persistence.save_result(self.result, path, thin)

    @classmethod
    def load(cls, path: str | Path, priors: object = None) -> LatencyModel:
        """Rebuild a fitted estimator from a saved file alone.

        The file carries the model configuration (terms, method, variant, sampler), the sampler
        settings and the priors themselves (``priors_yaml``), so ``LatencyModel.load(path)``
        needs no other argument, also for a fit made with non-default priors. ``priors`` (a
        prior set or file), when given, must hash like the embedded ones.

        Raises
        ------
        ModelMismatchError
            The file was made by another model version, or ``priors`` differ from the fit's.
        BayesLatencyError
            Missing or unreadable file.
        """
        saved = _persistence.read_result(path)
        embedded = saved.embedded_priors
        m = cls(priors=priors if priors is not None or embedded is None else embedded,
                terms=saved.terms, method=saved.method, sampler=saved.sampler,
                variant=saved.variant, noise_load=saved.noise_load)
        _persistence.check_priors(path, saved.result, m.priors)
        from bayes_latency.model.definition.hierarchy import Design

        m.design = Design(m.coefs, m.terms, m.alpha_terms, _persistence.configs_table(saved.result))
        m.result = saved.result
        restored = _persistence.restored_attrs(saved.result)
        m._data_hash, m.timings = restored["data_hash"], restored["timings"]
        m._settings = restored["settings"]
        if "kernels" in saved.result.attrs:
            from bayes_latency.data.kernel_evidence import KernelEvidence

            m.kernels = KernelEvidence.from_json(str(saved.result.attrs["kernels"]))
        if restored["identifiability"] is not None:
            m.identifiability = restored["identifiability"]
        m._noise_from_result()
        return m

    def attach_rows(self, observations: pd.DataFrame) -> None:
        """Give a loaded fit the rows it was fitted on, for what reads them after a fit (e.g.
        the row counts per configuration and kind of ``calibrate_predict.run_level_sigma``,
        which without them falls back on the prior's scale).

        Raises
        ------
        ModelMismatchError
            ``observations`` do not give the fit's rows (their hash differs from its data hash).
        """
        self._rows = _persistence.checked_rows(observations, self.coefs, self._data_hash)
