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

Importing this module is light (no PyMC, PyTensor or ArviZ): they are imported when a model is
built or diagnosed.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import xarray as xr

from bayes_latency import MODEL_VERSION, __version__
from bayes_latency.data.identifiability import IdentifiabilityReport, identifiability
from bayes_latency.data.observations import DEFAULT_STACK, config_id
from bayes_latency.data.report import IngestReport
from bayes_latency.errors import (
    BayesLatencyError,
    ConfigError,
    ConvergenceError,
    ModelMismatchError,
)
from bayes_latency.model.likelihood import NoiseParams, row_loglik, student_t_draws
from bayes_latency.model.summaries import (
    ConfigSummary,
    NoisePrior,
    feature_columns,
    fit_rows,
    summarize,
)
from bayes_latency.physics.basis import ALPHA_TERMS, DEFAULT_TERMS, term_names

if TYPE_CHECKING:  # pragma: no cover
    import pymc as pm

    from bayes_latency.model.hierarchy import Design

METHODS = ("laplace-hierarchy", "full")
SAMPLERS = ("nutpie", "pymc", "numpyro", "laplace")
#: Convergence gates applied by :meth:`LatencyModel.convergence`.
GATES = {"max_rhat": 1.01, "min_ess_bulk": 400.0, "max_divergences": 0}
#: NUTS step-size adaptation target (higher than the 0.8 default: the population posterior has
#: funnel-like corners where the ARD tail meets the effect scales).
TARGET_ACCEPT = 0.95
#: nutpie's mass-matrix adaptation by default ("low_rank"; ``fit(adaptation="diag")`` for the
#: other). Measured: on the demo fleet (well-separated coefficients) "diag" takes 2x fewer
#: leapfrog steps (target_accept 0.9, 1000 draws: 5.8 s of sampling and 85 steps per draw against
#: 24.5 s and 197), and the demo uses it; on the real data, whose coefficients are identified
#: partly as sums (strongly correlated population parameters), "diag" failed where "low_rank"
#: converged (H100-only fit: R-hat 1.019 and ESS 166 against 1.004 and 941).
NUTPIE_ADAPTATION = "low_rank"
ADAPTATIONS = ("low_rank", "diag")
#: PyTensor compiles the model's Numba code with LLVM fast-math off. With PyTensor's default
#: (fast-math on), code compiled fresh and the same code loaded from PyTensor's on-disk cache
#: round differently, so the same fit with the same seed gave different chains on a machine's
#: first run and on later runs (measured: first draw of z_pop -0.5577 fresh, -0.4990 cached,
#: -0.5095 with only the PyTensor cache cold). Off, fresh and cached runs agree bit for bit, and
#: the demo fit samples as fast (22-23 s against 22-33 s for seeds 0-2).
NUMBA_FASTMATH = False
#: LLVM optimisation level of the Numba code nutpie compiles for the model (Numba's default is 3;
#: a ``NUMBA_OPT`` set in the environment wins). Measured on the demo fit (issue 15, MODEL_VERSION
#: 7, 2-core machine at load 6-7, CPU seconds): level 1 compiles on empty caches in 71-73 CPU s
#: against 82-91 at level 3, samples the same chains (identical R-hat and ESS at 1000, 1500 and
#: 2000 draws; fast-math is off either way) at 41.7 against 40.1 CPU s for 2 x (500 + 2000)
#: iterations, and compiles on warm caches in 17.1 against 18.5 CPU s. Level 0 (not kept): warm
#: compilation 10.6 CPU s, but 53 instead of 38 us per gradient evaluation (40% slower sampling).
NUMBA_OPT = 1
#: Where a fit's time goes (demo fit, 12 configurations, measured for issue 15 on a 2-core
#: machine shared with other jobs (load 5-7), so in CPU seconds). MODEL_VERSION 7, before the
#: changes below, 2 x (500 + 4000) iterations: 91-94 CPU s in all (idle-machine estimate 57-58 s):
#: compilation 17-18 CPU s on warm caches, 82-91 on empty ones; sampling 67-70 CPU s (196-206
#: leapfrog steps per draw at target_accept 0.99, ~38 us per logp+gradient); ArviZ groups 4-7 s.
#: Warm compilation: PyTensor's graph rewrites of logp+gradient and expand ~4.5 s, the rest
#: Numba compiling nutpie's C callbacks (not cacheable) and linking the cached Ops into them. Cold: ~660 Numba functions (the logp
#: +gradient graph has 361 nodes, the expand graph 155), two thirds of it in LLVM.
#: Kept: 2000 draws for the demo (``demo.DEMO_DRAWS``), LLVM level 1 (:data:`NUMBA_OPT`), and
#: the deterministics computed after sampling (:func:`_with_deterministics`; nutpie's expand
#: function then only returns the free variables: cold compilation 55 against 73 CPU s).
#: Geometry (unconstrained draws, seed 0): the slowest direction is the funnel of the model
#: effects (4 levels): ``z_model`` against ``log sigma_model`` correlate at -0.95, -0.90, -0.89
#: for three coefficients (``z_tp`` against ``sigma_tp``: 0.86); the smallest posterior sd is
#: 0.02 (``z_pop`` in sum-group coordinates); ``sigma_model`` has the lowest ESS at every seed.
#: A centred parameterisation of the well-identified effects, or ``sigma_model`` fixed, is the
#: model's lever (hierarchy.py), not the sampler's. Tried and not kept (demo, seed 0, 2 x
#: (500 + 2000)): target_accept 0.95 (67 steps per draw, but ESS 403 against 826: about the
#: same ESS per CPU s, no margin), 0.9 (6 divergences), low-rank adaptation (0.95: ESS 453,
#: 1 divergence, 65 us per step; 0.99: R-hat 1.012), nutpie's JAX backend (4 CPU s of
#: compilation, but 490 us per step: 266 CPU s to sample 2 x (500 + 1000)), Numba level 0 (see
#: :data:`NUMBA_OPT`); earlier (MODEL_VERSION < 7): ``freeze_model=True`` (45 against 36 CPU s
#: cold), numpyro (345 s of sampling).
#: Noise of kinds that are predicted but not fitted, borrowed from a fitted kind of the same config.
NOISE_PROXY = {"request_prefill": ("step_window", "iteration"),
               "request_decode": ("step_window", "iteration"),
               "benchmark_mean": ("iteration",),
               "workload_decode": ("workload_e2e",)}


@contextlib.contextmanager
def _numba_opt(level: int) -> Iterator[None]:
    """Numba's LLVM optimisation level set to ``level`` for the compilations inside the block
    (see :data:`NUMBA_OPT`); left alone when the user set ``NUMBA_OPT`` in the environment."""
    from numba.core import config as numba_config

    if "NUMBA_OPT" in os.environ:
        yield
        return
    old = numba_config.OPT
    numba_config.OPT = numba_config._OptLevel(level)
    try:
        yield
    finally:
        numba_config.OPT = old


def _with_deterministics(model: pm.Model, post: xr.Dataset) -> xr.Dataset:
    """``post`` (draws of the free variables) with every deterministic of ``model`` added.

    Computed for all draws at once by one vectorised PyTensor function in ``FAST_COMPILE`` mode
    (NumPy, nothing to compile), instead of by nutpie's per-draw expand function, whose Numba
    compilation cost ~18 CPU s on empty caches (demo fit, issue 15: 55 against 73 CPU s of
    compilation); the values agree to 4e-15 relative. On empty caches PyTensor builds the C
    thunks of this function with gcc, ~6 s of wall time in a subprocess (not in the fit's CPU
    time); Python thunks only (``cxx=""``) avoid that but cost 2.2 CPU s on every fit instead of
    0.6, so C stays.
    """
    import pytensor
    import pytensor.tensor as pt
    from pytensor.graph.replace import vectorize_graph

    rvs = list(model.free_RVs)
    dets = list(model.deterministics)
    if not dets:
        return post
    batched = {rv: pt.tensor(dtype=rv.dtype, shape=(None, *rv.type.shape), name=rv.name)
               for rv in rvs}
    outs = vectorize_graph(dets, replace=batched)
    fn = pytensor.function(list(batched.values()), outs, mode="FAST_COMPILE",
                           on_unused_input="ignore")
    C, D = post.sizes["chain"], post.sizes["draw"]
    args = []
    for rv in rvs:
        a = post[rv.name].transpose("chain", "draw", ...).values
        args.append(a.reshape(C * D, *a.shape[2:]))
    new = {}
    for det, out, val in zip(dets, outs, fn(*args), strict=True):
        val = np.asarray(val)
        if out.type.ndim == det.type.ndim:  # does not depend on the draws (a constant)
            val = np.broadcast_to(val, (C * D, *val.shape))
        dims = model.named_vars_to_dims.get(det.name) or [f"{det.name}_dim_{j}"
                                                          for j in range(val.ndim - 1)]
        new[det.name] = (("chain", "draw", *dims), val.reshape(C, D, *val.shape[1:]))
    used = {d for dims, _ in new.values() for d in dims}
    coords = {d: list(v) for d, v in model.coords.items()
              if d in used and d not in post.coords and v is not None}
    return post.assign(new).assign_coords(coords)


def _priors_yaml(priors: object) -> str:
    """The validated prior content as YAML (embedded in the result so a fit reloads alone)."""
    import yaml

    return yaml.safe_dump(priors.content(), sort_keys=False, allow_unicode=True)


def _hash_frame(df: pd.DataFrame) -> str:
    h = pd.util.hash_pandas_object(df.reset_index(drop=True), index=False).to_numpy()
    return hashlib.sha256(h.tobytes()).hexdigest()[:16]


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
        rows = fit_rows(observations, self.report, self.coefs)
        if rows.empty:
            raise ConfigError("no observation rows to fit (roles beta/alpha with positive values)")
        if "stack" not in rows.columns:  # tables written before the stack level existed
            rows = rows.assign(stack=DEFAULT_STACK)
        configs = (rows[["config_id", "model", "gpu", "tp", "stack"]].drop_duplicates("config_id")
                   .set_index("config_id").sort_index())
        configs["tp"] = configs["tp"].astype(int)
        self.design = Design(self.coefs, self.terms, self.alpha_terms, configs)
        self._data_hash = _hash_frame(rows[["config_id", "kind", "value_us", "n_steps"]
                                           + feature_columns(self.coefs)])
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
        and the per-configuration weights (:func:`~bayes_latency.data.identifiability.pooled_groups`;
        ``sum_groups`` of :func:`~bayes_latency.model.hierarchy.build_model`)."""
        from bayes_latency.data.identifiability import pooled_groups

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
    def fit(self, observations: pd.DataFrame, draws: int = 1000, tune: int = 500, chains: int = 2,
            seed: int = 0, progress: bool = False, target_accept: float = TARGET_ACCEPT,
            adaptation: str = NUTPIE_ADAPTATION, prior_draws: int = 500) -> LatencyModel:
        """Fit the model; the result is in :attr:`result`. Check :meth:`convergence` after.

        ``target_accept`` is NUTS's step-size target (nutpie and PyMC); raise it towards 0.99 when
        a few divergences remain. ``adaptation`` is nutpie's mass-matrix adaptation, ``"low_rank"``
        (default; needed when coefficients are identified only jointly) or ``"diag"`` (cheaper
        when they are not; see :data:`NUTPIE_ADAPTATION`). ``prior_draws`` is the number of
        draws in the ``prior`` and ``prior_predictive`` groups (0: no prior groups).
        """
        import pymc as pm
        import pytensor

        if adaptation not in ADAPTATIONS:
            raise ConfigError(f"unknown adaptation {adaptation!r}; expected one of {ADAPTATIONS}")
        t_start = time.perf_counter()
        model = self.build(observations)
        self.timings["build_s"] = time.perf_counter() - t_start
        t0, c0 = time.perf_counter(), time.process_time()  # CPU time: all threads (chains)
        with model:
            if self.sampler == "laplace":
                post = _laplace_draws(model, draws * chains, chains, seed)
                dt = xr.DataTree.from_dict({"posterior": post})
            elif self.sampler == "nutpie":
                import nutpie

                if progress:  # nutpie's progress table starts with sampling; say what comes first
                    print("compiling the model (about 15 s; a minute on a machine's first fit)...",
                          file=sys.stderr, flush=True)
                with pytensor.config.change_flags(numba__fastmath=NUMBA_FASTMATH), \
                        _numba_opt(NUMBA_OPT):
                    # the trace stores the free variables only; the deterministics are
                    # computed afterwards (see _with_deterministics)
                    compiled = nutpie.compile_pymc_model(
                        model, var_names=[v.name for v in model.free_RVs])
                self.timings["compile_s"] = time.perf_counter() - t0
                self.timings["compile_cpu_s"] = time.process_time() - c0
                dt = nutpie.sample(compiled, draws=draws, tune=tune, chains=chains,
                                   cores=min(chains, 2), seed=seed, progress_bar=progress,
                                   adaptation=adaptation, target_accept=target_accept)
            else:
                if self.sampler == "numpyro":
                    from bayes_latency.model.marginal import register_jax

                    register_jax()
                kw: dict = {"nuts_sampler": self.sampler, "target_accept": target_accept}
                if self.sampler == "pymc":
                    kw["compute_convergence_checks"] = False
                dt = pm.sample(draws=draws, tune=tune, chains=chains, cores=min(chains, 2),
                               random_seed=seed, progressbar=progress, **kw)
        self.timings["sampling_s"] = time.perf_counter() - t0
        self.timings["sampling_cpu_s"] = time.process_time() - c0
        if self.sampler == "nutpie":
            t0 = time.perf_counter()
            dt["posterior"] = xr.DataTree(_with_deterministics(model, dt["posterior"].to_dataset()))
            self.timings["deterministics_s"] = time.perf_counter() - t0
        self._settings = {"draws": draws, "tune": tune, "chains": chains, "seed": seed,
                          "target_accept": target_accept, "adaptation": adaptation,
                          "numba_fastmath": NUMBA_FASTMATH,
                          "numba_opt": os.environ.get("NUMBA_OPT", NUMBA_OPT),
                          "prior_draws": prior_draws}
        self._add_config_draws(dt, seed)
        self.timings["total_s"] = time.perf_counter() - t_start
        self.result = self._assemble(dt, model)
        t0 = time.perf_counter()
        self._add_arviz_groups(model, seed, prior_draws)
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

    def _add_config_draws(self, dt: xr.DataTree, seed: int) -> None:
        """Fast path: draw the integrated-out configuration coefficients, per posterior draw."""
        from bayes_latency.model.hierarchy import config_draws, prior_arrays

        post = dt["posterior"].to_dataset() if isinstance(dt, xr.DataTree) else dt["posterior"]
        if "beta" in post or "theta_pop" not in post:
            return
        t0 = time.perf_counter()
        tp = post["theta_pop"].transpose("chain", "draw", "config", "coef").values
        sc = post["sigma_config"].transpose("chain", "draw", "coef").values
        Cn, Dn = tp.shape[:2]
        pa = prior_arrays(self.priors, self.coefs, self.design.gpus)
        theta, n_neg = config_draws(tp.reshape(Cn * Dn, *tp.shape[2:]), sc.reshape(Cn * Dn, -1),
                                    self.summaries, self.design, np.random.default_rng(seed + 7),
                                    scale=np.exp(pa.mu_mean))
        theta = theta.reshape(tp.shape)
        if n_neg:
            self.report.notes.append(f"{n_neg} of {Cn * Dn * len(self.design.configs)} (draw, "
                                     "configuration) coefficient vectors drawn from the truncated "
                                     "(theta >= 0) conditional")
        nb = len(self.terms)
        post = post.assign(
            beta=(("chain", "draw", "config", "term"), theta[..., :nb]),
            alpha=(("chain", "draw", "config", "alpha_term"), theta[..., nb:]),
        ).assign_coords(term=list(self.terms), alpha_term=list(self.alpha_terms))
        dt["posterior"] = xr.DataTree(post)
        self.timings["config_draws_s"] = time.perf_counter() - t0

    def _assemble(self, dt: xr.DataTree, model: pm.Model) -> xr.DataTree:
        from bayes_latency.model.groups import annotate, with_config_coords

        groups: dict[str, xr.Dataset] = {
            "posterior": annotate(with_config_coords(dt["posterior"].to_dataset(), self.design))}
        if "sample_stats" in dt:
            ss = dt["sample_stats"].to_dataset()
            ss = ss.drop_vars([v for v in ss.data_vars if ss[v].dtype == object])
            groups["sample_stats"] = ss
        d = self.design
        const = xr.Dataset(
            {"config_model": ("config", d.configs["model"].to_numpy().astype(str)),
             "config_gpu": ("config", d.configs["gpu"].to_numpy().astype(str)),
             "config_tp": ("config", d.configs["tp"].to_numpy().astype(int)),
             "config_stack": ("config", d.configs["stack"].to_numpy().astype(str))},
            coords={"config": list(d.configs.index)})
        groups["constant_data"] = const
        groups["summaries"] = self._noise_dataset()
        out = xr.DataTree.from_dict(groups)
        out.attrs.update({
            "bayes_latency_version": __version__, "model_version": MODEL_VERSION,
            "priors_hash": self.priors.hash, "data_hash": self._data_hash,
            "terms": json.dumps(list(self.terms)), "alpha_terms": json.dumps(list(self.alpha_terms)),
            "method": self.method, "variant": self.variant, "sampler": self.sampler,
            "approximate": "true" if self.sampler == "laplace" else "false",
            "timings": json.dumps(self.timings), "fit_report": json.dumps(self.report.to_dict()),
            "priors_yaml": _priors_yaml(self.priors), "priors_path": str(self.priors.path),
            "model_config": json.dumps({"terms": list(self.terms), "method": self.method,
                                        "variant": self.variant, "sampler": self.sampler}),
        })
        if self.identifiability is not None:
            out.attrs["identifiability"] = json.dumps(self.identifiability.to_dict())
        if self._settings:
            out.attrs["sampler_settings"] = json.dumps(self._settings)
        return out

    def _noise_dataset(self) -> xr.Dataset:
        """Noise parameters per (config, kind) and, on the fast path, the stage-1 summaries."""
        cfgs = list(self.design.configs.index)
        kinds = sorted({k for n in self._noise.values() for k in n} | set(self._rows["kind"].unique()))
        arr = {w: np.full((len(cfgs), len(kinds)), np.nan) for w in ("sigma", "tau", "nu")}
        for i, c in enumerate(cfgs):
            for j, k in enumerate(kinds):
                p = self._noise.get(c, {}).get(k)
                if p is not None:
                    arr["sigma"][i, j], arr["tau"][i, j], arr["nu"][i, j] = p.sigma, p.tau, p.nu
        ds = xr.Dataset({f"noise_{w}": (("config", "kind"), a) for w, a in arr.items()},
                        coords={"config": cfgs, "kind": kinds})
        if self.summaries:
            by = {s.config_id: s for s in self.summaries}
            ds["theta_hat"] = (("config", "coef"), np.stack([by[c].theta_hat for c in cfgs]))
            ds["grad"] = (("config", "coef"), np.stack([by[c].grad for c in cfgs]))
            ds["info"] = (("config", "coef", "coef2"), np.stack([by[c].info for c in cfgs]))
            ds = ds.assign_coords(coef=list(self.coefs), coef2=list(self.coefs))
        return ds

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
        from bayes_latency.physics.architecture import load_architecture
        from bayes_latency.physics.hardware import load_gpu

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
        from bayes_latency.physics.architecture import load_architecture
        from bayes_latency.physics.hardware import load_gpu

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
        K = len(self.coefs)
        unseen: list[str] = []
        cid = config_id(model, gpu, tp, stack)
        if cid in self.design.configs.index:
            theta = np.concatenate([post["beta"].sel(config=cid).values,
                                    post["alpha"].sel(config=cid).values], axis=0).T
        elif self.variant == "no_pooling":
            raise ConfigError(f"the no_pooling variant cannot speak for unseen configuration {cid}")
        else:
            logt = post["mu"].values.T + pa.gpu_offset[0][None, :]
            if self.variant != "complete_pooling":
                levels = [("model", model), ("gpu", gpu), ("tp", int(tp))]
                if "eff_stack" in post:
                    levels.append(("stack", stack))
                elif stack not in self.design.stacks:
                    raise ConfigError(f"stack {stack!r}: the fit saw only {self.design.stacks}")
                for level, value in levels:
                    eff = post[f"eff_{level}"]
                    if value in list(eff[level].values):
                        logt = logt + eff.sel({level: value}).values.T
                    else:
                        unseen.append(level)
                        # the fitted effects sum to zero over the n seen levels, so the
                        # population mean carries their average: a new level lies
                        # N(0, sigma^2 (1 + 1/n)) from it, not N(0, sigma^2)
                        inflate = np.sqrt(1.0 + 1.0 / eff.sizes[level])
                        # members of a sum-only group share their group's effect (hierarchy)
                        rep = _shared_effects(eff.transpose(level, "coef", "sample").values)
                        sig = post[f"sigma_{level}"].values.T[:, rep] * inflate  # (S, K)
                        logt = logt + sig * rng.standard_normal((S, K))[:, rep]
                        if f"sigma_{level}_common" in post:  # plus the shift common to all terms
                            sc_c = post[f"sigma_{level}_common"].values.ravel() * inflate
                            logt = logt + (sc_c * rng.standard_normal(S))[:, None]
            unseen.append("config")
            if "sigma_config_common" in post:  # the shift common to a configuration's beta terms
                beta = np.asarray([c in self.terms for c in self.coefs], dtype=float)
                sc_cc = post["sigma_config_common"].values.ravel()
                logt = logt + (sc_cc * rng.standard_normal(S))[:, None] * beta[None, :]
            sc = post["sigma_config"].values.T
            theta = np.maximum(np.exp(logt) * (1.0 + sc * rng.standard_normal((S, K))), 0.0)
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
          (:func:`bayes_latency.export.predict_reference`).
        """
        if model is not None or gpu is not None or tp is not None:
            if model is None or gpu is None or tp is None:
                raise ConfigError("predict on a batch table needs model=, gpu= and tp=")
            from bayes_latency.export import predict_reference

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

    def _row_noise(self, observations: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        scale = np.empty(len(observations))
        nu = np.empty(len(observations))
        n = observations["n_steps"].to_numpy(dtype=float)
        for (c, k), idx in observations.groupby(["config_id", "kind"]).indices.items():
            p = self.noise(str(c), str(k))
            scale[idx] = p.scale(n[idx])
            nu[idx] = p.nu
        return scale, nu

    def _row_offset(self, observations: pd.DataFrame) -> np.ndarray:
        """Per-row offset of ``log y`` over ``log mu`` of multi-step rows (:mod:`.likelihood`)."""
        off = np.zeros(len(observations))
        n = observations["n_steps"].to_numpy(dtype=float)
        for (c, k), idx in observations.groupby(["config_id", "kind"]).indices.items():
            off[idx] = self.noise(str(c), str(k)).log_offset(n[idx])
        return off

    def sample_posterior_predictive(self, observations: pd.DataFrame, n_draws: int = 200,
                                    seed: int = 0) -> xr.DataArray:
        """Posterior predictive draws (µs) of each row, with the fitted heavy-tailed noise."""
        mu = self.predict(observations, n_draws=n_draws, seed=seed)
        scale, nu = self._row_noise(observations)
        rng = np.random.default_rng(seed + 1)
        off = self._row_offset(observations)[None, :]
        vals = student_t_draws(rng, np.log(np.maximum(mu.values, 1e-12)) + off, scale[None, :],
                               nu[None, :])
        return mu.copy(data=vals).rename("y_us")

    def pointwise_loglik(self, observations: pd.DataFrame, seed: int = 0) -> xr.DataArray:
        """``log p(y_i | theta)`` for every posterior draw (chain, draw, obs)."""
        post = self._post()
        C, D = post.sizes["chain"], post.sizes["draw"]
        X = observations[feature_columns(self.coefs)].to_numpy(dtype=float)
        log_y = np.log(observations["value_us"].to_numpy(dtype=float))
        scale, nu = self._row_noise(observations)
        off = self._row_offset(observations)
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
        import arviz_stats as azs

        gates = {**GATES, **(gates or {})}
        post = self._post()
        var_names = [v for v in ("beta", "alpha", "mu", "relevance", "sigma_model", "sigma_gpu",
                                 "sigma_tp") if v in post]
        # constants (effect scales fixed for factors with two levels) have no diagnostics
        var_names = [v for v in var_names if float(post[v].std()) > 0]
        rhat = azs.rhat(post[var_names])
        ess = azs.ess(post[var_names], method="bulk")
        max_rhat = float(max(float(rhat[v].max()) for v in var_names))
        min_ess = float(min(float(ess[v].min()) for v in var_names))
        div = 0
        if "sample_stats" in self.result and "diverging" in self.result["sample_stats"]:
            div = int(self.result["sample_stats"]["diverging"].values.sum())
        approx = self.result.attrs.get("approximate") == "true"
        failures = []
        if not approx:
            if not max_rhat <= gates["max_rhat"]:
                failures.append(f"max R-hat {max_rhat:.4f} > {gates['max_rhat']}")
            if not min_ess >= gates["min_ess_bulk"]:
                failures.append(f"min bulk ESS {min_ess:.0f} < {gates['min_ess_bulk']:.0f}")
            if div > gates["max_divergences"]:
                failures.append(f"{div} divergent transitions")
        hints = self._convergence_hints(rhat, ess, gates) if failures else []
        return {"max_rhat": max_rhat, "min_ess_bulk": min_ess, "divergences": div,
                "approximate": approx, "passed": not failures, "failures": failures, "hints": hints}

    def _convergence_hints(self, rhat: xr.Dataset, ess: xr.Dataset, gates: dict) -> list[str]:
        """What to do about failing gates: name the coefficients that fail and, when the data
        identify them only jointly with others, say so (the usual cause on real traces)."""
        bad: set[str] = set()
        for v in ("beta", "alpha", "mu", "relevance"):
            if v not in rhat:
                continue
            dim = next(d for d in rhat[v].dims if d in ("term", "alpha_term", "coef"))
            fail = (rhat[v] > gates["max_rhat"]) | (ess[v] < gates["min_ess_bulk"])
            other = [d for d in fail.dims if d != dim]
            fail = fail.any(other) if other else fail
            bad.update(str(c) for c in fail[dim].values[fail.values])
        if not bad:
            return []
        hints = [f"coefficients failing the gates: {', '.join(sorted(bad))}"]
        ident = getattr(self, "identifiability", None)
        groups = ident.involved(sorted(bad)) if ident is not None else []
        if groups:
            hints.append("no configuration of the data separates "
                         + "; ".join("+".join(g) for g in groups)
                         + ": the posterior has corners where one of them carries the sum. Fit "
                         "without all but one of each group (terms=...), or add configurations "
                         "whose batches separate them (see bayes_latency.data.identifiability)")
        else:
            hints.append("raise target_accept (0.99) and draws; check the stage-1 notes of the fit report")
        return hints

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path, thin: int = 1) -> Path:
        """Write the result DataTree to netCDF (``.nc``) or zarr (``.zarr``).

        ``thin`` > 1 keeps every ``thin``-th draw of every group indexed by the posterior's draws
        (``posterior``, ``sample_stats``, ``log_likelihood``, ``posterior_predictive``,
        ``log_prior``), so they stay aligned as ArviZ needs and the file is ``thin`` times
        smaller; attrs ``thinned_by`` records it. The in-memory result is not changed.
        """
        if self.result is None:
            raise BayesLatencyError("nothing to save: the model is not fitted")
        if int(thin) < 1:
            raise ConfigError(f"thin must be >= 1, got {thin}")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        out = self.result
        if int(thin) > 1:
            out = out.copy()
            for g in ("posterior", "sample_stats", "log_likelihood", "posterior_predictive",
                      "log_prior"):
                if g in out.children and "draw" in out[g].dims:
                    out[g] = xr.DataTree(out[g].to_dataset().isel(draw=slice(None, None, int(thin))))
            out.attrs["thinned_by"] = int(thin)
        if path.suffix == ".zarr":
            out.to_zarr(path, mode="w")
        else:
            out.to_netcdf(path, engine="h5netcdf")
        return path

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
        from bayes_latency.model.hierarchy import Design

        path = Path(path)
        if not path.exists():
            raise BayesLatencyError(f"posterior file {path} does not exist")
        try:
            dt = xr.open_datatree(path, engine="zarr" if path.suffix == ".zarr" else "h5netcdf").load()
        except Exception as e:  # noqa: BLE001 - any reader failure is a bad file for the user
            raise BayesLatencyError(f"cannot read posterior file {path}: {e}") from e
        a = dt.attrs
        if a.get("model_version") != MODEL_VERSION:
            raise ModelMismatchError(
                f"{path} was made by model version {a.get('model_version')!r}; this bayes_latency "
                f"({__version__}) uses model version {MODEL_VERSION!r}. Refit with this version.")
        terms = tuple(json.loads(a["terms"]))
        embedded = None
        if "priors_yaml" in a:
            import yaml

            from bayes_latency.priors import load_priors

            embedded = load_priors(yaml.safe_load(a["priors_yaml"]))
            if embedded.hash != a.get("priors_hash"):
                raise ModelMismatchError(
                    f"{path}: the embedded priors hash to {embedded.hash}, not to the recorded "
                    f"{a.get('priors_hash')}: the file was altered")
        m = cls(priors=priors if priors is not None or embedded is None else embedded,
                terms=terms, method=a["method"], sampler=a["sampler"], variant=a["variant"])
        if a.get("priors_hash") != m.priors.hash:
            raise ModelMismatchError(
                f"{path} was fitted with priors {a.get('priors_hash')}, but the priors given now hash "
                f"to {m.priors.hash}; load without priors= (the file embeds its own) or pass the "
                "priors file used for the fit (--priors).")
        const = dt["constant_data"].to_dataset()
        configs = pd.DataFrame({"model": const["config_model"].values.astype(str),
                                "gpu": const["config_gpu"].values.astype(str),
                                "tp": const["config_tp"].values.astype(int)},
                               index=pd.Index(const["config"].values.astype(str), name="config_id"))
        if "config_stack" in const:  # Design fills in vLLM otherwise
            configs["stack"] = const["config_stack"].values.astype(str)
        m.design = Design(m.coefs, m.terms, m.alpha_terms, configs)
        m.result = dt
        m._data_hash = a.get("data_hash")
        m.timings = json.loads(a.get("timings", "{}"))
        m._settings = json.loads(a.get("sampler_settings", "{}"))
        if "identifiability" in a:  # hints after loading name the confounded groups too
            m.identifiability = IdentifiabilityReport.from_dict(json.loads(a["identifiability"]))
        m._noise_from_result()
        return m


def _shared_effects(eff: np.ndarray) -> np.ndarray:
    """For effects ``(level, coef, sample)``, each coefficient's first coefficient with the very
    same non-zero effects (the members of a sum-only group read their group's; see
    :func:`bayes_latency.model.hierarchy.build_model`), else itself."""
    K = eff.shape[1]
    rep = np.arange(K)
    for k in range(1, K):
        if not np.any(eff[:, k]):
            continue
        for j in range(k):
            if rep[j] == j and np.array_equal(eff[:, j], eff[:, k]):
                rep[k] = j
                break
    return rep


def _laplace_draws(model: pm.Model, n: int, chains: int, seed: int) -> xr.Dataset:
    """Approximate posterior: Gaussian at the mode in unconstrained space (labelled approximate)."""
    import pymc as pm
    import pytensor

    mode = pm.find_MAP(progressbar=False, seed=seed)
    ip = model.initial_point()
    vars_ = model.value_vars
    flat = np.concatenate([np.atleast_1d(mode[v.name]).ravel() for v in vars_])
    sizes = [int(np.prod(ip[v.name].shape)) for v in vars_]
    shapes = [ip[v.name].shape for v in vars_]
    dlogp = model.compile_dlogp(vars=model.free_RVs)

    def unpack(x: np.ndarray) -> dict:
        out, i = {}, 0
        for v, sz, shp in zip(vars_, sizes, shapes, strict=True):
            out[v.name] = x[i:i + sz].reshape(shp)
            i += sz
        return out

    # Hessian by central differences of the analytic gradient (the marginal-likelihood Op has a
    # first derivative only)
    h = 1e-5
    H = np.empty((flat.size, flat.size))
    for j in range(flat.size):
        e = np.zeros(flat.size)
        e[j] = h
        H[:, j] = -(np.asarray(dlogp(unpack(flat + e))) - np.asarray(dlogp(unpack(flat - e)))) / (2 * h)
    w, V = np.linalg.eigh(0.5 * (H + H.T))
    w = np.clip(w, 1e-8, None)
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n, len(flat)))
    draws = flat[None, :] + (z / np.sqrt(w)[None, :]) @ V.T
    # map unconstrained draws to all model variables
    names = [v.name for v in model.unobserved_RVs]
    fn = pytensor.function(vars_, [model[nm] for nm in names], on_unused_input="ignore")
    out = {nm: [] for nm in names}
    for row in draws:
        point = unpack(row)
        for nm, val in zip(names, fn(*[point[v.name] for v in vars_]), strict=True):
            out[nm].append(val)
    per = n // chains
    ds = {}
    for nm in names:
        arr = np.asarray(out[nm])[: per * chains]
        arr = arr.reshape((chains, per) + arr.shape[1:])
        dims = ["chain", "draw"] + list(model.named_vars_to_dims.get(nm, [f"{nm}_dim_{j}" for j in range(arr.ndim - 2)]))
        ds[nm] = (dims, arr)
    coords = {k: list(v) for k, v in model.coords.items() if v is not None}
    return xr.Dataset(ds, coords={k: v for k, v in coords.items()
                                  if any(k in d[0] for d in ds.values())})


def load_observations(path: str | Path) -> pd.DataFrame:
    """The observation table from an ingest folder (either layout) or a Parquet file."""
    from bayes_latency.data.tables import read_table

    path = Path(path)
    if not path.exists():
        raise BayesLatencyError(f"no observation table at {path}; run `bayes-latency ingest` first")
    return read_table(path, "observations")


def _check_sampler_args(args: argparse.Namespace) -> None:
    """Sampler arguments of ``fit`` in range, before any work (exit 2 with the option named)."""
    def bad(opt: str, value: object, need: str) -> BayesLatencyError:
        return BayesLatencyError(f"{opt} {value!r}: must be {need}")

    ints = (("--draws", "draws", 1, 1_000_000), ("--tune", "tune", 0, 1_000_000),
            ("--chains", "chains", 1, 64))
    for opt, name, lo, hi in ints:
        v = getattr(args, name, None)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise bad(opt, v, f"an integer in [{lo}, {hi:,}]")
    seed = getattr(args, "seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise bad("--seed", seed, "an integer in [0, 2**32)")
    ta = getattr(args, "target_accept", None)
    if ta is not None and not (isinstance(ta, (int, float)) and 0.5 <= ta < 1.0):
        raise bad("--target-accept", ta, "a number in [0.5, 1)")
    mr = getattr(args, "max_rhat", None)
    if mr is not None and not (isinstance(mr, (int, float)) and 1.0 <= mr < 10.0):
        raise bad("--max-rhat", mr, "a number in [1, 10)")


def fit_command(args: argparse.Namespace) -> int:
    """``bayes-latency fit``: fit, save, and exit 1 when the convergence gates fail.

    The arguments, the output path and the observation table are validated before sampling; the
    posterior is written atomically (never over an input).
    """
    from bayes_latency.data.observations import validate_observations
    from bayes_latency.io import atomic_path, check_output_path

    _check_sampler_args(args)
    tables = Path(args.tables)
    f_in = tables / "observations.parquet" if tables.is_dir() else tables
    inputs = [tables, f_in] + ([Path(args.priors)] if getattr(args, "priors", None) else [])
    out_path = check_output_path(args.out, inputs,
                                 kind="dir" if Path(args.out).suffix == ".zarr" else "file")
    if out_path.suffix == ".zarr" and out_path.exists():
        raise BayesLatencyError(f"--out {out_path}: zarr store exists; remove it or choose "
                                f"another path")
    obs = validate_observations(load_observations(args.tables), source=str(f_in))
    terms = getattr(args, "terms", None)
    terms = tuple(t.strip() for t in terms.split(",") if t.strip()) if terms else DEFAULT_TERMS
    m = LatencyModel(priors=args.priors, terms=terms, method=args.method, sampler=args.sampler,
                     scheduler=getattr(args, "scheduler", None))
    t0 = time.perf_counter()
    m.fit(obs, draws=args.draws, tune=args.tune, chains=args.chains, seed=args.seed,
          progress=sys.stderr.isatty(),  # sampling progress on a terminal only
          target_accept=getattr(args, "target_accept", TARGET_ACCEPT),
          adaptation=getattr(args, "adaptation", NUTPIE_ADAPTATION))
    with atomic_path(out_path) as tmp:
        m.save(tmp)
    out = out_path
    conv = m.convergence({"max_rhat": args.max_rhat})
    print(m.report.format())
    print(f"fitted {len(m.design.configs)} configurations, {len(m._rows):,} rows in "
          f"{time.perf_counter() - t0:.1f} s ({m.method}, {m.sampler}); saved {out}")
    print(f"max R-hat {conv['max_rhat']:.4f}, min bulk ESS {conv['min_ess_bulk']:.0f}, "
          f"divergences {conv['divergences']}" + (" [APPROXIMATE: no MCMC diagnostics]"
                                                  if conv["approximate"] else ""))
    # adequacy gate (posterior predictive checks of the fitted rows and workload means)
    from bayes_latency.checks.adequacy import check_fit

    req_file = Path(args.tables) / "requests.parquet"
    requests = pd.read_parquet(req_file) if req_file.is_file() else None
    adq, _, _ = check_fit(m, obs, requests, seed=args.seed)
    if not conv["passed"]:
        extra = ([f"and the model does not explain the data: {'; '.join(adq.failures)}"]
                 if not adq.passed else [])
        raise ConvergenceError("; ".join(conv["failures"] + conv["hints"] + extra))
    if not adq.passed:
        print("bayes-latency: the model does not explain the data (adequacy gate):\n"
              + "\n".join(f"- {f}" for f in adq.failures), file=sys.stderr)
        return 1
    print("adequacy gate passed (LOO-PIT, band coverage, workload means)")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(fit_command(argparse.Namespace()))
