"""``LatencyModel``: the one estimator of bayes_latency.

>>> m = LatencyModel().fit(observations)          # doctest: +SKIP
>>> m.coefficients("llama-2-70b", "H100", 4)       # beta(sample, term), alpha(sample, alpha_term)
>>> m.save("posterior.nc"); LatencyModel.load("posterior.nc")

The fitted result is an ``xarray.DataTree`` with the groups ArviZ expects (``posterior``,
``sample_stats``, ``observed_data``, ``log_likelihood``, ``posterior_predictive``, ``prior``,
``prior_predictive``, ``log_prior``; see :mod:`bayes_latency.model.groups`) and two of its own
(``constant_data``, ``summaries``), with attrs ``bayes_latency_version``, ``model_version``,
``priors_hash``, ``priors_yaml`` (the priors themselves), ``data_hash``, ``terms``, ``method``,
``variant``, ``sampler``, ``sampler_settings`` and ``approximate``: :meth:`LatencyModel.load`
rebuilds the estimator from the file alone. Loading a file made by another model version, or
given priors that differ from the embedded ones, raises
:class:`~bayes_latency.errors.ModelMismatchError`.

The estimator's concerns live in their own modules: the sampler and compilation settings and the
samplers (:mod:`bayes_latency.model.sampler`), the variables derived after sampling
(:mod:`bayes_latency.model.deterministics`), the result's layout, save and load
(:mod:`bayes_latency.model.persistence`), the convergence gates
(:mod:`bayes_latency.model.convergence`) and the ``bayes-latency fit`` command
(:mod:`bayes_latency.cli.fit`). Their public names are re-exported here.

Importing this module is light (no PyMC, PyTensor or ArviZ): they are imported when a model is
built or diagnosed.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import xarray as xr

from bayes_latency.data.observations.build import DEFAULT_STACK, config_id
from bayes_latency.data.report import IngestReport
from bayes_latency.errors import BayesLatencyError, ConfigError
from bayes_latency.model import convergence as _convergence
from bayes_latency.model import persistence as _persistence
from bayes_latency.model.convergence import GATES  # noqa: F401 - re-exported
from bayes_latency.model.deterministics import _with_deterministics, add_config_draws
from bayes_latency.model.extension import sample_extended
from bayes_latency.model.identifiability import IdentifiabilityReport, identifiability
from bayes_latency.model.likelihood import NoiseParams, noise_kind, row_loglik, student_t_draws
from bayes_latency.model.persistence import assemble, rows_hash, table_rows
from bayes_latency.model.sampler import (
    ADAPTATIONS,
    DEFAULT_DRAWS,
    DEFAULT_TUNE,
    NUMBA_FASTMATH,
    NUMBA_OPT,
    NUTPIE_ADAPTATION,
    SAMPLERS,
    TARGET_ACCEPT,
    sample,
)
from bayes_latency.model.summaries import (
    ConfigSummary,
    NoisePrior,
    feature_columns,
    summarize,
)
from bayes_latency.model.unseen import _shared_effects, unseen_config_theta  # noqa: F401
from bayes_latency.physics.basis import ALPHA_TERMS, DEFAULT_TERMS, term_names

if TYPE_CHECKING:  # pragma: no cover
    import pymc as pm

    from bayes_latency.model.hierarchy import Design

METHODS = ("laplace-hierarchy", "full")
#: Noise of kinds that are predicted but not fitted, borrowed from a fitted kind of the same config.
NOISE_PROXY = {"request_prefill": ("step_window", "iteration"),
               "request_decode": ("step_window", "iteration"),
               "benchmark_mean": ("iteration",),
               # a noise class without rows in the configuration: its kind's other class
               "iteration_prefill": ("iteration",), "iteration": ("iteration_prefill",),
               "benchmark_mean_prefill": ("benchmark_mean", "iteration_prefill"),
               "workload_decode": ("workload_e2e",)}


#: Whether :meth:`LatencyModel.fit` adds the observation-level and prior groups
#: (:mod:`bayes_latency.model.groups`); off inside :func:`posterior_only`.
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
    """

    def __init__(self, priors: object = None, terms: tuple = DEFAULT_TERMS,
                 method: str = "laplace-hierarchy", sampler: str = "nutpie",
                 variant: str = "hierarchy", scheduler: object = None) -> None:
        if method not in METHODS:
            raise ConfigError(f"unknown method {method!r}; expected one of {METHODS}")
        if sampler not in SAMPLERS:
            raise ConfigError(f"unknown sampler {sampler!r}; expected one of {SAMPLERS}")
        from bayes_latency.model.hierarchy import VARIANTS

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
        #: where stage 1 runs (:func:`bayes_latency.model.summaries.summarize`); stage 2 runs here
        self.scheduler = scheduler
        self.result: xr.DataTree | None = None
        self.design: Design | None = None
        self.summaries: list[ConfigSummary] | None = None
        self.report = IngestReport(source="fit")
        self.identifiability: IdentifiabilityReport | None = None
        self._noise: dict[str, dict[str, NoiseParams]] = {}
        self.timings: dict[str, float] = {}
        self._settings: dict[str, object] = {}

    # ------------------------------------------------------------------ building
    def _scale(self) -> np.ndarray:
        return np.asarray([self.priors.prior_median(c) for c in self.coefs], dtype=float)

    def _prepare(self, observations: pd.DataFrame) -> pd.DataFrame:
        from bayes_latency.model.hierarchy import Design

        missing = [c for c in feature_columns(self.coefs) + ["value_us", "kind", "role", "config_id",
                                                             "model", "gpu", "tp", "n_steps"]
                   if c not in observations.columns]
        if missing:
            raise ConfigError(f"observation table lacks columns {missing} needed by terms {self.coefs}")
        rows = table_rows(observations, self.coefs, self.report)
        if rows.empty:
            raise ConfigError("no observation rows to fit (roles beta/alpha with positive values)")
        configs = (rows[["config_id", "model", "gpu", "tp", "stack"]].drop_duplicates("config_id")
                   .set_index("config_id").sort_index())
        configs["tp"] = configs["tp"].astype(int)
        self.design = Design(self.coefs, self.terms, self.alpha_terms, configs)
        self._data_hash = rows_hash(rows, self.coefs)
        self.identifiability = identifiability(rows, self.coefs, self._scale())
        for g in self.identifiability.confounded_everywhere:
            self.report.notes.append(
                f"no configuration separates {'+'.join(g)}: the rows identify only a combination; "
                "their split comes from the hierarchy (differences between configurations) and "
                "the priors")
        return rows

    def build(self, observations: pd.DataFrame) -> pm.Model:
        """The PyMC model for ``observations`` (computes stage-1 summaries when needed)."""
        from bayes_latency.model.hierarchy import build_model, prior_arrays

        rows = self._prepare(observations)
        self._rows = rows
        if self.method == "laplace-hierarchy":
            t0 = time.perf_counter()
            pa = prior_arrays(self.priors, self.coefs, self.design.gpus)
            noise_prior = NoisePrior(sigma=dict(pa.noise_sigma), nu_alpha=pa.nu_alpha, nu_beta=pa.nu_beta)
            self.summaries = summarize(rows, self.coefs, self._scale(), noise_prior=noise_prior,
                                       scheduler=self.scheduler)
            self.timings["summaries_s"] = time.perf_counter() - t0
            bad = [s.config_id for s in self.summaries if not s.converged]
            if bad:
                self.report.notes.append(f"stage-1 optimiser did not report convergence for {bad}")
            self._noise = {s.config_id: s.noise for s in self.summaries}
            return build_model(self.design, self.priors, variant=self.variant,
                               summaries=self.summaries, no_gate=self._no_gate(),
                               sum_groups=self._sum_groups())
        return build_model(self.design, self.priors, variant=self.variant, rows=rows,
                           no_gate=self._no_gate(), sum_groups=self._sum_groups())

    def _sum_groups(self) -> list[tuple[list[str], np.ndarray, dict[str, np.ndarray]]]:
        """Groups of coefficients the fitted rows give only as a weighted sum, with the typical
        and the per-configuration weights (:func:`~bayes_latency.model.identifiability.pooled_groups`;
        ``sum_groups`` of :func:`~bayes_latency.model.hierarchy.build_model`)."""
        from bayes_latency.model.identifiability import pooled_groups

        rows = getattr(self, "_rows", None)
        if rows is None:
            return []
        groups = pooled_groups(rows, list(self.coefs))
        return [(g.coefs, g.weights, g.config_weights) for g in groups]

    def _no_gate(self) -> tuple[str, ...]:
        """Terms without an ARD gate: those that no configuration identifies on their own
        (in a group of :attr:`IdentifiabilityReport.confounded_everywhere`, or without data:
        features zero in every fitted row). Their relevance is the prior's call either way, and
        the gate's kink and heavy tail only add modes and curvature (see
        :func:`~bayes_latency.model.hierarchy._population`)."""
        groups = self.identifiability.confounded_everywhere if self.identifiability else []
        off = {c for g in groups for c in g}
        rows = getattr(self, "_rows", None)
        if rows is not None:
            X = rows[feature_columns(self.coefs)].to_numpy(dtype=float)
            off |= {c for c, used in zip(self.coefs, (X != 0).any(axis=0), strict=True) if not used}
        return tuple(sorted(off))

    # ------------------------------------------------------------------ fitting
    def fit(self, observations: pd.DataFrame, draws: int = DEFAULT_DRAWS, tune: int = DEFAULT_TUNE,
            chains: int = 2,
            seed: int = 0, progress: bool = False, target_accept: float = TARGET_ACCEPT,
            adaptation: str = NUTPIE_ADAPTATION, prior_draws: int = 500,
            max_draws: int | None = None, gates: dict | None = None) -> LatencyModel:
        """Fit the model; the result is in :attr:`result`. Check :meth:`convergence` after.

        ``target_accept`` is NUTS's step-size target (nutpie and PyMC); raise it towards 0.99 when
        a few divergences remain. ``adaptation`` is nutpie's mass-matrix adaptation, ``"low_rank"``
        (default; needed when coefficients are identified only jointly) or ``"diag"`` (cheaper
        when they are not; see :data:`NUTPIE_ADAPTATION`). ``prior_draws`` is the number of
        draws in the ``prior`` and ``prior_predictive`` groups (0: no prior groups).

        ``max_draws`` (nutpie only; ``None``: exactly ``draws``) lets sampling go on past
        ``draws``, checking the convergence gates (``gates``, default :data:`GATES`) at fixed
        checkpoints (``draws``, then every ``draws / 2`` more) and stopping at the first that
        passes, or when more draws cannot help (divergences, or chains in different places:
        R-hat above 1.3 at the first check, or above 1.1 and not falling). When it stopped on
        divergences, it samples once more at ``target_accept`` 0.995
        (:mod:`~bayes_latency.model.extension`). The checks and where it stopped are in the
        result's ``extension`` attribute and in :meth:`convergence`. The CLI's ``fit`` does this
        by default (``--max-draws``).
        """
        if adaptation not in ADAPTATIONS:
            raise ConfigError(f"unknown adaptation {adaptation!r}; expected one of {ADAPTATIONS}")
        t_start = time.perf_counter()
        model = self.build(observations)
        self.timings["build_s"] = time.perf_counter() - t_start
        extension = None
        if max_draws is not None and max_draws > draws and self.sampler == "nutpie":
            dt, extension, target_accept = sample_extended(
                self, model, draws=draws, tune=tune, chains=chains, seed=seed, progress=progress,
                target_accept=target_accept, adaptation=adaptation, max_draws=max_draws,
                gates=gates)
            draws = int(dt["posterior"].sizes["draw"])
        else:
            dt = sample(model, self.sampler, draws=draws, tune=tune, chains=chains, seed=seed,
                        progress=progress, target_accept=target_accept, adaptation=adaptation,
                        timings=self.timings)
        if self.sampler == "nutpie":
            t0 = time.perf_counter()
            dt["posterior"] = xr.DataTree(_with_deterministics(model, dt["posterior"].to_dataset()))
            self.timings["deterministics_s"] = time.perf_counter() - t0
        self._settings = {"draws": draws, "tune": tune, "chains": chains, "seed": seed,
                          "target_accept": target_accept, "adaptation": adaptation,
                          "numba_fastmath": NUMBA_FASTMATH,
                          "numba_opt": os.environ.get("NUMBA_OPT", NUMBA_OPT),
                          "prior_draws": prior_draws}
        if extension is not None:
            self._settings["max_draws"] = max_draws
        add_config_draws(self, dt, seed)
        self.timings["total_s"] = time.perf_counter() - t_start
        self.result = assemble(self, dt)
        if extension is not None:
            self.result.attrs["extension"] = json.dumps(extension)
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
        ``prior_predictive`` and ``log_prior`` (:mod:`bayes_latency.model.groups`)."""
        from bayes_latency.model import groups

        self.timings.update(groups.add_groups(self, model, self._rows, seed,
                                              prior_draws=prior_draws))

    # ------------------------------------------------------------------ posterior access
    def _post(self) -> xr.Dataset:
        if self.result is None:
            raise BayesLatencyError("the model is not fitted; call fit() or load()")
        return self.result["posterior"].to_dataset()

    def noise(self, cfg: str, kind: str) -> NoiseParams:
        """Noise parameters of (configuration, kind); the fleet median for unseen ones."""
        if not self._noise:
            self._noise_from_result()
        mine = self._noise.get(cfg, {})
        p = mine.get(kind)
        if p is not None:
            return p
        # kinds that are not fitted (request spans) are sums of steps like step windows
        for proxy in NOISE_PROXY.get(kind, ()):
            if proxy in mine:
                return mine[proxy]
        vals = [n[kind] for n in self._noise.values() if kind in n]
        if not vals:
            return NoiseParams(sigma=0.1, tau=0.0, nu=5.0)
        return NoiseParams(sigma=float(np.median([v.sigma for v in vals])),
                           tau=float(np.median([v.tau for v in vals])),
                           nu=float(np.median([v.nu for v in vals])))

    def _noise_from_result(self) -> None:
        ds = self.result["summaries"].to_dataset()
        post = self._post()
        self._noise = {}
        for c in ds["config"].values:
            d = {}
            for k in ds["kind"].values:
                if self.method == "full" and "noise_sigma" in post:
                    sig = float(post["noise_sigma"].sel(config=c, kind=k).mean())
                    tau = float(post["noise_tau"].sel(config=c, kind=k).mean())
                    nu = float(post["noise_nu"].sel(config=c, kind=k).mean())
                    d[str(k)] = NoiseParams(sig, tau if k == "step_window" else 0.0, nu)
                else:
                    s = float(ds["noise_sigma"].sel(config=c, kind=k))
                    if np.isfinite(s):
                        d[str(k)] = NoiseParams(s, float(ds["noise_tau"].sel(config=c, kind=k)),
                                                float(ds["noise_nu"].sel(config=c, kind=k)))
            self._noise[str(c)] = d

    def _canonical(self, model: str, gpu: str) -> tuple[str, str]:
        from bayes_latency.physics.hardware import load_gpu
        from bayes_latency.physics.models import load_architecture

        levels_m = list(self.design.models)
        levels_g = list(self.design.gpus)
        if model not in levels_m:
            model = load_architecture(model).name
        if gpu not in levels_g:
            gpu = load_gpu(gpu).name
        return model, gpu

    def config_ids(self, model: str | None = None, gpu: str | None = None, tp: int | None = None,
                   stack: str | None = None) -> list[str]:
        """Fitted configuration ids matching the given model / GPU / TP degree / stack.

        Names are resolved like :meth:`coefficients` does: a GPU alias (``"H100"``) or a Hugging
        Face model name matches the canonical level the fit stored (``"H100-SXM"``). ``None``
        matches every level.
        """
        from bayes_latency.physics.hardware import load_gpu
        from bayes_latency.physics.models import load_architecture

        if self.design is None:
            raise BayesLatencyError("the model is not fitted; call fit() or load()")
        c = self.design.configs
        keep = np.ones(len(c), dtype=bool)
        if model is not None:
            m = model if model in set(c["model"]) else load_architecture(model).name
            keep &= (c["model"] == m).to_numpy()
        if gpu is not None:
            g = gpu if gpu in set(c["gpu"]) else load_gpu(gpu).name
            keep &= (c["gpu"] == g).to_numpy()
        if tp is not None:
            keep &= (c["tp"].astype(int) == int(tp)).to_numpy()
        if stack is not None:
            keep &= (c["stack"] == stack).to_numpy()
        return [str(i) for i in c.index[keep]]

    def sel(self, model: str | None = None, gpu: str | None = None, tp: int | None = None,
            stack: str | None = None, group: str = "posterior") -> xr.Dataset:
        """The ``group`` of the result restricted to the configurations matching the levels.

        >>> m.sel(model="llama-2-70b", gpu="H100", tp=4)["beta"]   # doctest: +SKIP

        Aliases resolve (see :meth:`config_ids`); the ``config`` dimension is kept, with its
        non-index coordinates ``config_model``, ``config_gpu``, ``config_tp``, ``config_stack``.
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
                     seed: int = 0, stack: str = DEFAULT_STACK) -> xr.Dataset:
        """Posterior draws of beta and alpha for any configuration.

        Levels (model, GPU, TP degree) seen in the data use their fitted effects; an unseen level
        draws its effect from the population, ``N(0, sigma_level^2 (1 + 1/n))`` around the
        fitted mean (the ``n`` seen levels' zero-sum effects leave their average in the mean),
        so the bands of an unseen configuration widen honestly.

        Returns
        -------
        xr.Dataset
            ``beta (sample, term)`` and ``alpha (sample, alpha_term)``; attrs say which levels
            were unseen.
        """
        from bayes_latency.model.hierarchy import prior_arrays

        model, gpu = self._canonical(model, gpu)
        post = self._post().stack(sample=("chain", "draw"))
        S = post.sizes["sample"]
        rng = np.random.default_rng(seed)
        pa = prior_arrays(self.priors, self.coefs, [gpu])
        unseen: list[str] = []
        cid = config_id(model, gpu, tp, stack)
        if cid in self.design.configs.index:
            theta = np.concatenate([post["beta"].sel(config=cid).values,
                                    post["alpha"].sel(config=cid).values], axis=0).T
        elif self.variant == "no_pooling":
            raise ConfigError(f"the no_pooling variant cannot speak for unseen configuration {cid}")
        else:
            theta, unseen = unseen_config_theta(self, post, pa, model, gpu, int(tp), stack, rng)
        if n_draws is not None and n_draws < S:
            idx = np.sort(rng.choice(S, size=n_draws, replace=False))
            theta = theta[idx]
        nb = len(self.terms)
        ds = xr.Dataset({"beta": (("sample", "term"), theta[:, :nb]),
                         "alpha": (("sample", "alpha_term"), theta[:, nb:])},
                        coords={"term": list(self.terms), "alpha_term": list(self.alpha_terms)})
        ds.attrs.update({"model": model, "gpu": gpu, "tp": int(tp), "stack": stack,
                         "unseen_levels": ",".join(unseen), "config_id": cid})
        return ds

    def _theta_rows(self, observations: pd.DataFrame, n_draws: int, seed: int) -> np.ndarray:
        """(S, n, K) coefficient draws for each row's configuration."""
        out = np.empty((n_draws, len(observations), len(self.coefs)))
        cfg = observations["config_id"].to_numpy()
        for c in pd.unique(cfg):
            m = cfg == c
            first = observations.loc[m].iloc[0]
            ds = self.coefficients(str(first["model"]), str(first["gpu"]), int(first["tp"]),
                                   n_draws=n_draws, seed=seed,
                                   stack=str(first.get("stack", DEFAULT_STACK)))
            th = np.concatenate([ds["beta"].values, ds["alpha"].values], axis=1)
            out[:, m, :] = th[:, None, :]
        return out

    def predict(self, observations: pd.DataFrame, model: str | None = None, gpu: str | None = None,
                tp: int | None = None, n_draws: int = 200, seed: int = 0,
                stack: str = DEFAULT_STACK, **serving: object) -> xr.DataArray | pd.DataFrame:
        """Predicted iteration times: of observation rows, or of a batch table for a configuration.

        Two forms:

        * ``predict(observations)`` (rows of the observation table, with their ``x_<term>``
          features and configuration): posterior draws of each row's expected value (µs),
          without observation noise, as a DataArray ``(sample, obs)``.
        * ``predict(batches, model=, gpu=, tp=, **serving)``: ``batches`` is a batch table (the
          columns of :data:`bayes_latency.physics.basis.BATCH_COLUMNS`, one row per engine
          step); the configuration may be seen or unseen (:meth:`coefficients` draws its
          coefficients, an unseen one with its wider band) and ``serving`` takes the knobs of
          :class:`~bayes_latency.physics.serving.ServingConfig`. Returns a DataFrame: the batch
          columns plus ``mean_us, median_us, q05_us, q95_us`` per row
          (:func:`bayes_latency.export.document.predict_reference`).
        """
        if model is not None or gpu is not None or tp is not None:
            if model is None or gpu is None or tp is None:
                raise ConfigError("predict on a batch table needs model=, gpu= and tp=")
            from bayes_latency.export.document import predict_reference

            coefs = self.coefficients(model, gpu, int(tp), n_draws=n_draws, seed=seed,
                                      stack=stack)
            config = {"model": model, "gpu": gpu, "tp": int(tp), **serving}
            out = predict_reference(coefs, config, batches=observations)
            out.attrs["unseen_levels"] = coefs.attrs.get("unseen_levels", "")
            return out
        missing = [c for c in feature_columns(self.coefs) + ["config_id", "obs_id"]
                   if c not in observations.columns]
        if missing:
            raise ConfigError(
                f"predict: the table lacks {missing}. For a batch table (columns of "
                "physics.basis.BATCH_COLUMNS) give the configuration: "
                "predict(batches, model=..., gpu=..., tp=...)")
        X = observations[feature_columns(self.coefs)].to_numpy(dtype=float)
        th = self._theta_rows(observations, n_draws, seed)
        mu = np.einsum("snk,nk->sn", th, X)
        return xr.DataArray(mu, dims=("sample", "obs"),
                            coords={"obs": observations["obs_id"].to_numpy()}, name="mu_us")

    def _row_noise(self, observations: pd.DataFrame
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-row noise of each row's (configuration, noise class): the log-scale ``s_i``, the
        Student-t dof and the offset of ``log y`` over ``log mu`` of multi-step rows
        (:mod:`.likelihood`)."""
        scale = np.empty(len(observations))
        nu = np.empty(len(observations))
        off = np.zeros(len(observations))
        n = observations["n_steps"].to_numpy(dtype=float)
        key = [observations["config_id"].to_numpy(), noise_kind(observations)]
        for (c, k), idx in pd.Series(0, index=observations.index).groupby(key).indices.items():
            p = self.noise(str(c), str(k))
            scale[idx] = p.scale(n[idx])
            nu[idx] = p.nu
            off[idx] = p.log_offset(n[idx])
        return scale, nu, off

    def sample_posterior_predictive(self, observations: pd.DataFrame, n_draws: int = 200,
                                    seed: int = 0) -> xr.DataArray:
        """Posterior predictive draws (µs) of each row, with the fitted heavy-tailed noise."""
        mu = self.predict(observations, n_draws=n_draws, seed=seed)
        scale, nu, off = self._row_noise(observations)
        rng = np.random.default_rng(seed + 1)
        vals = student_t_draws(rng, np.log(np.maximum(mu.values, 1e-12)) + off[None, :],
                               scale[None, :], nu[None, :])
        return mu.copy(data=vals).rename("y_us")

    def pointwise_loglik(self, observations: pd.DataFrame, seed: int = 0) -> xr.DataArray:
        """``log p(y_i | theta)`` for every posterior draw (chain, draw, obs)."""
        post = self._post()
        C, D = post.sizes["chain"], post.sizes["draw"]
        X = observations[feature_columns(self.coefs)].to_numpy(dtype=float)
        log_y = np.log(observations["value_us"].to_numpy(dtype=float))
        scale, nu, off = self._row_noise(observations)
        cfg = observations["config_id"].to_numpy()
        ll = np.empty((C * D, len(observations)), dtype=np.float32)
        for c in pd.unique(cfg):
            m = cfg == c
            th = np.concatenate([post["beta"].sel(config=c).values.reshape(C * D, -1),
                                 post["alpha"].sel(config=c).values.reshape(C * D, -1)], axis=1)
            ll[:, m] = row_loglik(log_y[m], X[m], th, scale[m], nu[m], off[m])
        return xr.DataArray(ll.reshape(C, D, -1), dims=("chain", "draw", "obs_row"),
                            coords={"obs_row": observations["obs_id"].astype(str).to_numpy()},
                            name="obs")

    # ------------------------------------------------------------------ checks
    def convergence(self, gates: dict | None = None) -> dict:
        """Max R-hat, min bulk ESS, divergences and whether they pass ``gates`` (:data:`GATES`)."""
        return _convergence.convergence(self, gates)

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path, thin: int = 1) -> Path:
        """Write the result DataTree to netCDF (``.nc``) or zarr (``.zarr``).

        ``thin`` > 1 keeps every ``thin``-th draw of every group indexed by the posterior's draws
        (``posterior``, ``sample_stats``, ``log_likelihood``, ``posterior_predictive``,
        ``log_prior``), so they stay aligned as ArviZ needs and the file is ``thin`` times
        smaller; attrs ``thinned_by`` records it. The in-memory result is not changed.
        """
        return _persistence.save_result(self, path, thin)

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
        return _persistence.load_estimator(cls, path, priors)
