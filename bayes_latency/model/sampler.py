"""Sampler and compilation settings of a fit, and the samplers themselves.

What :meth:`bayes_latency.model.estimator.LatencyModel.fit` hands to the sampler: the sampler
names, NUTS's step-size target, nutpie's mass-matrix adaptation, the Numba compilation flags
(LLVM fast-math, optimisation level) with the measurements behind them, and :func:`sample`, which
runs the chosen sampler (nutpie, PyMC, NumPyro, or the approximate Laplace draws of
:func:`_laplace_draws`) on a built PyMC model.

Importing this module is light (no PyMC, PyTensor, Numba or ArviZ).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import xarray as xr

if TYPE_CHECKING:  # pragma: no cover
    import pymc as pm

SAMPLERS = ("nutpie", "pymc", "numpyro", "laplace")
#: NUTS step-size adaptation target (higher than the 0.8 default: the population posterior has
#: funnel-like corners where the ARD tail meets the effect scales). 0.99 with
#: :data:`DEFAULT_DRAWS` draws, a retune (``results/benchmarks/convergence_matrix.md``):
#: at the former 0.95 and 1000 draws per chain the tiny fleet's seeds 0-9 passed the gates in 4 of
#: 10 (5 short of ESS 400 at 305-380, 2 with one divergence); at 0.95 and 2000 draws in 8 of 10
#: (the two misses were 2 and 1 divergences, ESS 632-1024); at 0.99 and 2000 draws those two
#: passed (0 divergences, ESS 751 and 638).
TARGET_ACCEPT = 0.99
#: Posterior draws per chain of a fit by default (``LatencyModel.fit``, ``bayes-latency fit``); see
#: :data:`TARGET_ACCEPT`.
DEFAULT_DRAWS = 2000
#: Tuning (warm-up) iterations per chain by default, a retune: on the real data with
#: the 11 default terms, 500 left one divergence in 2 x 2000 draws (R-hat 1.020, ESS 144) and
#: 1000 none (passing at 5000 draws with :data:`DEFAULT_MAX_DRAWS`: R-hat 1.0073, ESS 440);
#: low-rank mass-matrix adaptation needs the longer warm-up to estimate the ridge directions.
DEFAULT_TUNE = 1000
#: nutpie's mass-matrix adaptation by default ("low_rank"; ``fit(adaptation="diag")`` for the
#: other). Measured: on the demo fleet (well-separated coefficients) "diag" takes 2x fewer
#: leapfrog steps (target_accept 0.9, 1000 draws: 5.8 s of sampling and 85 steps per draw against
#: 24.5 s and 197), and the demo uses it; on the real data, whose coefficients are identified
#: partly as sums (strongly correlated population parameters), "diag" failed where "low_rank"
#: converged (H100-only fit: R-hat 1.019 and ESS 166 against 1.004 and 941).
NUTPIE_ADAPTATION = "low_rank"
#: ``fit(max_draws="auto")`` (the default of ``LatencyModel.fit`` and of the CLI's
#: ``--max-draws``): the most draws per chain a fit samples while the gates fail, six times
#: ``draws`` (:data:`DEFAULT_MAX_DRAWS` at :data:`DEFAULT_DRAWS`; see :func:`_sample_until`).
MAX_DRAWS_FACTOR = 6
DEFAULT_MAX_DRAWS = MAX_DRAWS_FACTOR * DEFAULT_DRAWS


def resolve_max_draws(max_draws: int | str | None, draws: int) -> int | None:
    """``fit(max_draws=...)`` as a number of draws per chain: ``"auto"`` is
    :data:`MAX_DRAWS_FACTOR` x ``draws``; ``None`` or 0 is ``None`` (exactly ``draws``)."""
    if isinstance(max_draws, str):
        if max_draws != "auto":
            from bayes_latency.errors import ConfigError

            raise ConfigError(f"max_draws={max_draws!r}: expected 'auto', None or a number")
        return MAX_DRAWS_FACTOR * int(draws)
    return int(max_draws) if max_draws else None
#: Max R-hat above which sampling is not extended when it does not fall from one check to the
#: next (and 1 + 3 x (HOPELESS_RHAT - 1) above which it is not extended at all): the chains explore
#: different regions (on the real data's bimodal cross-validation splits at 500 tuning steps
#: R-hat was 1.5-1.6 with ESS 3-4), and more draws of the same chains do not join them.
HOPELESS_RHAT = 1.1
#: ``target_accept`` of the one repeat of an extended fit that stopped on divergences (a smaller
#: step size; on the real data single divergences in 2 x 2000-5000 draws at 0.99 stopped two of
#: the cross-validation splits).
RETRY_TARGET_ACCEPT = 0.995
ADAPTATIONS = ("low_rank", "diag")
#: PyTensor compiles the model's Numba code with LLVM fast-math off. With PyTensor's default
#: (fast-math on), code compiled fresh and the same code loaded from PyTensor's on-disk cache
#: round differently, so the same fit with the same seed gave different chains on a machine's
#: first run and on later runs (measured: first draw of z_pop -0.5577 fresh, -0.4990 cached,
#: -0.5095 with only the PyTensor cache cold). Off, fresh and cached runs agree bit for bit, and
#: the demo fit samples as fast (22-23 s against 22-33 s for seeds 0-2).
NUMBA_FASTMATH = False
#: LLVM optimisation level of the Numba code nutpie compiles for the model (Numba's default is 3;
#: a ``NUMBA_OPT`` set in the environment wins). Measured on the demo fit (MODEL_VERSION
#: 7, 2-core machine, CPU seconds): level 1 compiles on empty caches in 71-73 CPU s
#: against 82-91 at level 3, samples the same chains (identical R-hat and ESS at 1000, 1500 and
#: 2000 draws; fast-math is off either way) at 41.7 against 40.1 CPU s for 2 x (500 + 2000)
#: iterations, and compiles on warm caches in 17.1 against 18.5 CPU s. Level 0 (not kept): warm
#: compilation 10.6 CPU s, but 53 instead of 38 us per gradient evaluation (40% slower sampling).
NUMBA_OPT = 1
# Where a fit's time goes (demo fit, 12 configurations, measured on a 2-core
# machine shared with other jobs, so in CPU seconds). MODEL_VERSION 7, before the
# changes below, 2 x (500 + 4000) iterations: 91-94 CPU s in all (idle-machine estimate 57-58 s):
# compilation 17-18 CPU s on warm caches, 82-91 on empty ones; sampling 67-70 CPU s (196-206
# leapfrog steps per draw at target_accept 0.99, ~38 us per logp+gradient); ArviZ groups 4-7 s.
# Warm compilation: PyTensor's graph rewrites of logp+gradient and expand ~4.5 s, the rest
# Numba compiling nutpie's C callbacks (not cacheable) and linking the cached Ops into them. Cold: ~660 Numba functions (the logp
# +gradient graph has 361 nodes, the expand graph 155), two thirds of it in LLVM.
# Kept: 2000 draws for the demo (``demo.DEMO_DRAWS``), LLVM level 1 (:data:`NUMBA_OPT`), and
# the deterministics computed after sampling (:func:`_with_deterministics`; nutpie's expand
# function then only returns the free variables: cold compilation 55 against 73 CPU s).
# Cold caches (CPU s and counts, on a shared machine): a first fit
# also ran gcc 22 times (PyTensor C thunks of the OpFromGraph inner functions of the
# initial-point, deterministics and prior-sampling functions): 16 s of wall time on an idle machine
# (28 s on a busy one) outside the fit's CPU time, which is why the cold wall time exceeded the
# idle estimate by ~10 s. Now none (:func:`_initial_point_without_c`, ``cxx=""`` in
# ``groups.prior_groups``, LogSumExp inlined in ``_with_deterministics``; same chains, same
# prior draws). The expand function also returns no free variables any more (only the
# unconstrained draws, mapped afterwards by ``_with_deterministics``): its Numba compilation
# was 4-6 s of wall time cold (46 nodes, now 1), 1.2 s warm (now 0.4). The logp+gradient graph
# (172 nodes after this PyTensor's rewrites) is the rest: ~40 CPU s cold, ~10 warm.
# Tried, not kept: compiling part of the logp+gradient Ops in a second process, to fill
# PyTensor's Numba cache on the idle core (the sub-graph of the last Ops of the topological
# order, fed with values of its inputs computed in Python mode). The types numba infers there
# match the fit's for most Ops but not all, and the final linking is not cacheable: after a
# child compiled all 172 nodes (51.5 CPU s), the fit's compilation still took 18.9 CPU s (warm:
# 10-12); after a child compiled the second half (30.1 CPU s), 35.2 (cold: 45-50). At best a
# few seconds of wall time on an idle 2-core machine for a forked compiler process; not worth
# its risks.
# Geometry (unconstrained draws, seed 0): the slowest direction is the funnel of the model
# effects (4 levels): ``z_model`` against ``log sigma_model`` correlate at -0.95, -0.90, -0.89
# for three coefficients (``z_tp`` against ``sigma_tp``: 0.86); the smallest posterior sd is
# 0.02 (``z_pop`` in sum-group coordinates); ``sigma_model`` has the lowest ESS at every seed.
# A centred parameterisation of the well-identified effects, or ``sigma_model`` fixed, is the
# model's lever (hierarchy.py), not the sampler's. Tried and not kept (demo, seed 0, 2 x
# (500 + 2000)): target_accept 0.95 (67 steps per draw, but ESS 403 against 826: about the
# same ESS per CPU s, no margin), 0.9 (6 divergences), low-rank adaptation (0.95: ESS 453,
# 1 divergence, 65 us per step; 0.99: R-hat 1.012), nutpie's JAX backend (4 CPU s of
# compilation, but 490 us per step: 266 CPU s to sample 2 x (500 + 1000)), Numba level 0 (see
# :data:`NUMBA_OPT`); earlier (MODEL_VERSION < 7): ``freeze_model=True`` (45 against 36 CPU s
# cold), numpyro (345 s of sampling).
# Warm caches, demo model (2-core machine shared with other jobs, CPU s): compilation 9-10 CPU s, of which
# PyTensor's rewrites and function building ~4, nutpie's two C callbacks ~6 (typing and lowering
# 2.5, LLVM 3.5; PyTensor's cached logp+gradient function is loaded, not compiled). The callbacks
# are rebuilt in every process: nutpie names their data fields with random keys and bakes the
# shared arrays in as constants, so Numba cannot cache them. Their ``out[...] = grad`` copies
# compiled Numba's shape-error formatting (~30 functions, 2-3 CPU s) each time; the callbacks of
# :func:`_c_callbacks_without_shape_errors` copy element by element (same draws). nutpie's JAX
# backend, measured again (``gradient_backend="jax"``): 2.2 CPU s of compilation, but 1,294 CPU us
# per leapfrog step against 77 with Numba (2 x (200 + 200) draws).
# Refits of the same structure: the stage-1 summaries are
# ``pm.Data`` and :func:`compiled_model` reuses the compiled model with ``with_data``: on the demo
# fleet, a refit with changed values compiled in 0.33 CPU s against 8.6 for a fresh compilation
# in the same process (13-15 in a new one), with bit-identical draws; in the real-data
# calibration each fit after the first with client rows (same configurations, new values)
# compiles in 0.5-0.6 s. The structure test (:func:`_same_structure`, graph equality up to data)
# takes 0.26 s.


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


@contextlib.contextmanager
def _initial_point_without_c() -> Iterator[None]:
    """PyMC's initial-point functions, which nutpie compiles for the model (the starting point of
    each chain, and the variables' shapes), built without C code inside the block.

    They are compiled in ``FAST_COMPILE`` mode (Python thunks), but the inner functions of the
    ``OpFromGraph`` nodes in them (``ZeroSumNormal``, ``LogSumExp``) are linked with C thunks
    whenever a C compiler is configured: on empty caches that is 11 C modules built by gcc,
    ~7 s of wall time of a machine's first demo fit (in a subprocess: not in the fit's CPU time),
    for a function called once per chain. PyTensor's ``cxx`` flag is emptied while they are
    built (only then: it also changes the fusion rewrites of the logp graph). Same starting
    points, same draws.
    """
    import pymc.initial_point as ip
    import pytensor

    orig = ip.make_initial_point_fn

    def make(*args: object, **kwargs: object) -> object:
        with pytensor.config.change_flags(cxx=""):
            return orig(*args, **kwargs)

    ip.make_initial_point_fn = make  # nutpie imports it from the module when it compiles
    try:
        yield
    finally:
        ip.make_initial_point_fn = orig


def _c_logp_func(n_dim, logp_fn, user_data, shared_keys, shared_data):  # noqa: ANN001, ANN202
    """nutpie's ``_make_c_logp_func`` with the gradient copied element by element.

    nutpie copies it with ``out[...] = grad``, whose Numba implementation formats a shape
    mismatch error (array shapes to strings): ~30 Numba functions (``str`` of integers, unicode
    concatenation) compiled again in every process, because nutpie's C callbacks are not
    cached. Same values, same draws. Used by :func:`_c_callbacks_without_shape_errors`.
    """
    import numba
    from nutpie.compile_pymc import make_extraction_fn

    extract = make_extraction_fn(logp_fn, shared_data, shared_keys, user_data.dtype)
    c_sig = numba.types.int64(numba.types.uint64, numba.types.CPointer(numba.types.double),
                              numba.types.CPointer(numba.types.double),
                              numba.types.CPointer(numba.types.double), numba.types.voidptr)

    def logp_numba(dim, x_, out_, logp_, user_data_):  # noqa: ANN001, ANN202
        if dim != n_dim:
            return -1
        try:
            x = numba.carray(x_, (n_dim,))
            out = numba.carray(out_, (n_dim,))
            logp = numba.carray(logp_, ())
            logp_val, grad = extract(x, user_data_)
            logp[()] = logp_val
            for i in range(n_dim):
                out[i] = grad[i]
            if not np.all(np.isfinite(out)):
                return 3
            if not np.isfinite(logp_val):
                return 4
        except Exception:  # noqa: BLE001
            return 1
        return 0

    return logp_numba, c_sig


def _c_expand_func(n_dim, n_expanded, expand_fn, user_data, shared_var_keys,  # noqa: ANN001, ANN202
                   shared_data):  # noqa: ANN001
    """nutpie's ``_make_c_expand_func`` with the draw copied element by element (see
    :func:`_c_logp_func`)."""
    import numba
    from nutpie.compile_pymc import make_extraction_fn

    extract = make_extraction_fn(expand_fn, shared_data, shared_var_keys, user_data.dtype)
    c_sig = numba.types.int64(numba.types.uint64, numba.types.uint64,
                              numba.types.CPointer(numba.types.double),
                              numba.types.CPointer(numba.types.double), numba.types.voidptr)

    def expand_numba(dim, expanded, x_, out_, user_data_):  # noqa: ANN001, ANN202
        if dim != n_dim:
            return -1
        if expanded != n_expanded:
            return -1
        try:
            x = numba.carray(x_, (n_dim,))
            out = numba.carray(out_, (n_expanded,))
            (values,) = extract(x, user_data_)
            for i in range(n_expanded):
                out[i] = values[i]
        except Exception:  # noqa: BLE001
            return -2
        return 0

    return expand_numba, c_sig


@contextlib.contextmanager
def _c_callbacks_without_shape_errors() -> Iterator[None]:
    """nutpie's C callbacks built by :func:`_c_logp_func` and :func:`_c_expand_func` inside the
    block: ~2-3 CPU s less compilation per fit, warm or cold caches (demo model, warm caches,
    2-core machine shared with other jobs: 9.6 against 11.3-12.1 CPU s; bit-identical draws, same time per
    leapfrog step). Left alone when nutpie's builders do not take the arguments these were written for
    (another nutpie version)."""
    import inspect

    import nutpie.compile_pymc as ncp

    swaps = {"_make_c_logp_func": _c_logp_func, "_make_c_expand_func": _c_expand_func}
    orig = {k: getattr(ncp, k, None) for k in swaps}
    if (not hasattr(ncp, "make_extraction_fn")
            or any(f is None or list(inspect.signature(f).parameters)
                   != list(inspect.signature(swaps[k]).parameters) for k, f in orig.items())):
        yield
        return
    for k, f in swaps.items():
        setattr(ncp, k, f)
    try:
        yield
    finally:
        for k, f in orig.items():
            setattr(ncp, k, f)


#: How many compiled nutpie models :func:`compiled_model` keeps (most recent first) for reuse by
#: later fits of the same structure in the process.
COMPILED_CACHE_SIZE = 2
_COMPILED: list[tuple[pm.Model, object]] = []


def _structure(model: pm.Model) -> tuple[list, list, list]:
    """``(outputs, inputs, shared names)`` of what nutpie compiles for ``model``: the log density
    and the free variables as functions of the value variables and the shared data."""
    from pytensor.compile.sharedvalue import SharedVariable
    from pytensor.graph.traversal import graph_inputs

    outs = [model.logp(), *model.replace_rvs_by_values(model.free_RVs)]
    shared = sorted((v for v in graph_inputs(outs) if isinstance(v, SharedVariable)),
                    key=lambda v: str(v.name))
    return outs, list(model.value_vars) + shared, [v.name for v in shared]


def _same_structure(old: pm.Model, new: pm.Model) -> bool:
    """Whether ``new`` computes what ``old`` does up to the values of shared data (``pm.Data``):
    same coordinates, free variables, and graphs (constants compared by value)."""
    from pytensor.graph.basic import equal_computations

    if ({k: tuple(v) if v is not None else None for k, v in old.coords.items()}
            != {k: tuple(v) if v is not None else None for k, v in new.coords.items()}):
        return False
    if [v.name for v in old.free_RVs] != [v.name for v in new.free_RVs]:
        return False
    o_out, o_in, o_names = _structure(old)
    n_out, n_in, n_names = _structure(new)
    if (o_names != n_names or len(set(n_names)) != len(n_names)
            or any(_shared(new, nm) is None for nm in n_names)):
        return False
    return equal_computations(o_out, n_out, in_xs=o_in, in_ys=n_in)


def _shared(model: pm.Model, name: str | None) -> object:
    """The shared variable ``name`` of ``model`` (data or a dimension's length), or None."""
    var = model.named_vars.get(name) if name is not None else None
    if var is None and name is not None:
        var = model.dim_lengths.get(name)
    return var if hasattr(var, "get_value") else None


def compiled_model(model: pm.Model) -> object:
    """nutpie's compiled ``model``, reused from an earlier fit of the same structure when there is
    one (:func:`_same_structure`), with this model's data swapped in (``with_data``).

    A calibration's iterations (:func:`bayes_latency.calibrate.loop.calibrate`) rebuild the same model
    with new stage-1 summaries, which are ``pm.Data``
    (:data:`bayes_latency.model.hierarchy.SUMMARY_DATA`): they compile once. The reused model
    computes exactly what a fresh compilation of ``model`` would (same draws for the same seed).
    """
    import nutpie
    import pytensor

    for i, (old, compiled) in enumerate(_COMPILED):
        if _same_structure(old, model):
            names = {v.name for v in compiled.shared_var_keys}
            if any(_shared(model, nm) is None for nm in names):
                continue
            compiled = compiled.with_data(**{nm: _shared(model, nm).get_value() for nm in names})
            _COMPILED.insert(0, _COMPILED.pop(i))
            return compiled
    with (pytensor.config.change_flags(numba__fastmath=NUMBA_FASTMATH), _numba_opt(NUMBA_OPT),
          _initial_point_without_c(), _c_callbacks_without_shape_errors()):
        # the trace stores the unconstrained draws only (nutpie's expand function is then a
        # copy); the free variables and the deterministics are computed from them afterwards
        # (see _with_deterministics)
        compiled = nutpie.compile_pymc_model(model, var_names=[])
    # nutpie drops the draws of transformed value variables from the posterior unless told
    # they are not reparameterised: keep them there, under their own names (``sigma_log__``)
    compiled = dataclasses.replace(compiled, reparameterized_names=[])
    _COMPILED.insert(0, (model, compiled))
    del _COMPILED[COMPILED_CACHE_SIZE:]
    return compiled


#: What ``fit(progress=...)`` shows (:func:`progress_mode`): nutpie's or a tqdm bar, one line on
#: stderr per checkpoint, or nothing.
PROGRESS_MODES = ("bar", "lines", "none")


def _in_notebook() -> bool:
    """Whether the code runs in a Jupyter kernel (nutpie's own test)."""
    try:
        from nutpie.sample import in_notebook
    except ImportError:  # pragma: no cover - nutpie is a dependency
        return False
    return bool(in_notebook())


def progress_mode(progress: bool | str) -> str:
    """The progress display of a fit: ``"bar"``, ``"lines"`` or ``"none"``.

    ``True`` picks for the place the fit runs in: a bar in a notebook or when stderr is a
    terminal, else ``"lines"`` (one line on stderr per checkpoint and at the end, so a fit piped
    to a file or run by a job scheduler is not silent for minutes); ``False`` is ``"none"``; a
    mode name is taken as it is.
    """
    if isinstance(progress, str):
        if progress not in PROGRESS_MODES:
            from bayes_latency.errors import ConfigError

            raise ConfigError(f"progress={progress!r}: expected True, False or one of "
                              f"{PROGRESS_MODES}")
        return progress
    if not progress:
        return "none"
    return "bar" if _in_notebook() or sys.stderr.isatty() else "lines"


class _Progress:
    """Progress of nutpie's chains, read from its progress callback by :func:`_sample_until`.

    ``"bar"``: a tqdm bar (a widget in a notebook) whose total is the tuning steps plus the draws
    up to the next checkpoint: it grows by a checkpoint's step only when the gates fail there, so
    its total and remaining time are those of what will run. ``"lines"``: one line on stderr when
    tuning ends, at each checkpoint and at the end. ``"none"``: nothing.
    """

    def __init__(self, mode: str, tune: int, draws: int, chains: int,
                 max_draws: int | None = None) -> None:
        self.mode, self.tune, self.target, self.chains = mode, tune, draws, chains
        self.t0 = time.perf_counter()
        self.tuned = False
        self.n = 0  # iterations of the slowest chain so far
        self.bar = None
        if mode == "bar":
            from tqdm.auto import tqdm

            size: dict = {}
            if not _in_notebook():  # a terminal that reports no size (0 x 0) gets 80 x 24
                import shutil

                cols, rows = shutil.get_terminal_size()
                size = {"ncols": cols, "nrows": rows}
            self.bar = tqdm(total=tune + draws, unit="it", file=sys.stderr, smoothing=0.05,
                            desc=f"sampling ({chains} chains, tuning)", **size)
        elif mode == "lines":
            more = (f" (up to {max_draws} while the convergence gates fail)"
                    if max_draws and max_draws > draws else "")
            self.line(f"{chains} chains, {tune} tuning steps then {draws} draws each{more}")

    def elapsed(self) -> str:
        return f"{time.perf_counter() - self.t0:.0f} s"

    def update(self, done: list[tuple[int, bool]] | None) -> None:
        """``done``: (iterations finished, still tuning) of each chain."""
        if not done:
            return
        n = self.n = min(d for d, _ in done)
        if not self.tuned and all(not tuning for _, tuning in done):
            self.tuned = True
            if self.mode == "lines":
                self.line(f"tuning done ({self.tune} steps per chain), {self.elapsed()}")
            elif self.bar is not None:
                self.bar.set_description(f"sampling ({self.chains} chains)")
        if self.bar is not None:
            self.bar.n = min(n, self.bar.total)
            self.bar.refresh()

    def checkpoint(self, n: int, decision: str, next_n: int | None) -> None:
        """The gates' ``decision`` at ``n`` draws per chain; ``next_n``: the next checkpoint."""
        if decision == "continue" and next_n is not None:
            text = f"convergence gates fail, on to {next_n}"
            self.target = next_n
            if self.bar is not None:
                self.bar.total = self.tune + next_n
                self.bar.n = min(self.n, self.bar.total)  # chains may have run ahead
                self.bar.set_description(f"sampling (gates failed at {n}, on to {next_n})")
                self.bar.refresh()
        elif decision == "pass":
            text = "convergence gates pass"
            if self.bar is not None:
                self.bar.set_description(f"sampling (gates pass at {n})")
        elif decision == "max_draws":
            text = "the most draws per chain (max_draws)"
        else:
            text = f"stopping: {decision}"
        if self.mode == "lines":
            self.line(f"{n} draws per chain, {self.elapsed()}: {text}")

    def done(self, n: int) -> None:
        if self.bar is not None:
            self.bar.n = self.bar.total = self.tune + n
            self.bar.refresh()
            self.bar.close()
        elif self.mode == "lines":
            self.line(f"done, {n} draws per chain in {self.elapsed()}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    @staticmethod
    def line(text: str) -> None:
        print(f"sampling: {text}", file=sys.stderr, flush=True)


def sample(model: pm.Model, sampler: str, draws: int, tune: int, chains: int, seed: int,
           progress: bool | str, target_accept: float, adaptation: str,
           timings: dict[str, float], until: Until | None = None) -> xr.DataTree:
    """Draws of ``model`` by ``sampler`` (one of :data:`SAMPLERS`) as a DataTree with a
    ``posterior`` group (and ``sample_stats`` for the NUTS samplers).

    With ``until`` (nutpie only), sampling goes on past ``draws`` at the checkpoints of
    :func:`checkpoints` until ``until.check`` says stop or ``until.max_draws`` is reached
    (:func:`_sample_until`); ``timings["extension"]`` then lists each check.

    ``progress`` is a mode of :func:`progress_mode` or a bool. The bar of an extended run
    (``until``) counts to the next checkpoint, not to ``until.max_draws``; ``"lines"`` prints a
    line at the end of tuning, at each checkpoint and at the end.

    ``timings`` receives ``compile_s``/``compile_cpu_s`` (nutpie), ``sampling_s`` and
    ``sampling_cpu_s``. nutpie's trace holds the unconstrained draws (the model's value
    variables: ``sigma_log__`` for ``sigma``, untransformed variables under their own names): add
    the free variables and the deterministics with
    :func:`bayes_latency.model.deterministics._with_deterministics`.
    """
    import pymc as pm

    mode = progress_mode(progress)
    t0, c0 = time.perf_counter(), time.process_time()  # CPU time: all threads (chains)
    with model:
        if sampler == "laplace":
            post = _laplace_draws(model, draws * chains, chains, seed)
            dt = xr.DataTree.from_dict({"posterior": post})
        elif sampler == "nutpie":
            import nutpie

            if mode != "none":  # sampling progress starts after compiling: say what comes first
                print("compiling the model (about 15 s; a minute on a machine's first fit)...",
                      file=sys.stderr, flush=True)
            compiled = compiled_model(model)
            timings["compile_s"] = time.perf_counter() - t0
            timings["compile_cpu_s"] = time.process_time() - c0
            kw = {"tune": tune, "chains": chains, "cores": min(chains, 2), "seed": seed,
                  "progress_bar": mode == "bar", "adaptation": adaptation,
                  "target_accept": target_accept}
            if until is not None and until.max_draws > draws:
                dt = _sample_until(compiled, draws, until, kw, timings, mode=mode)
            elif mode == "lines":  # the same draws, watched: a line at the end of tuning and sampling
                dt = _sample_until(compiled, draws, Until(draws, _never_stop), kw, timings,
                                   mode=mode)
                timings.pop("extension", None)
            else:  # nutpie's own progress bar (its total is these draws)
                dt = nutpie.sample(compiled, draws=draws, **kw)
        else:
            if sampler == "numpyro":
                from bayes_latency.model.marginal import register_jax

                register_jax()
            kw: dict = {"nuts_sampler": sampler, "target_accept": target_accept}
            if sampler == "pymc":
                kw["compute_convergence_checks"] = False
            dt = pm.sample(draws=draws, tune=tune, chains=chains, cores=min(chains, 2),
                           random_seed=seed, progressbar=mode == "bar", **kw)
    timings["sampling_s"] = time.perf_counter() - t0
    timings["sampling_cpu_s"] = time.process_time() - c0
    return dt


@dataclass
class Until:
    """Sample past the requested draws until a check passes (see :func:`_sample_until`).

    ``check(post, divergences)`` gets nutpie's draws of every chain (the value variables, see
    :func:`sample`), truncated to the same length, and the divergences among them; it returns ``"pass"`` (stop: the gates
    pass), ``"continue"`` or any other string (stop: more draws will not help; the reason).
    """

    max_draws: int
    check: Callable[[xr.Dataset, int], str]


def checkpoints(draws: int, max_draws: int) -> list[int]:
    """Draw counts at which :func:`_sample_until` checks the gates: ``draws``, then every
    ``draws / 2`` more, up to ``max_draws`` (2000, 3000, ..., 12000 at the CLI defaults).

    A few fixed checkpoints, not a check after every draw: stopping the first time R-hat dips
    under its threshold would bias it low (optional stopping), and the draws kept are those up
    to a checkpoint, so a fit is reproducible from its seed.
    """
    step = max(1, draws // 2)
    out = list(range(draws, max_draws, step))
    return out + [max_draws]


def _truncate(dt: xr.DataTree, n: int) -> xr.DataTree:
    """A copy of ``dt`` with the first ``n`` posterior draws of every chain (``posterior`` and
    ``sample_stats``)."""
    out = dt.copy(deep=False)
    for g in ("posterior", "sample_stats"):
        if g in out and "draw" in out[g].dims:
            out[g] = xr.DataTree(out[g].to_dataset().isel(draw=slice(0, n)))
    return out


def _never_stop(post: xr.Dataset, divergences: int) -> str:
    """The check of a run watched only for its progress (no checkpoint before its end)."""
    return "continue"


def _sample_until(compiled: object, draws: int, until: Until, kw: dict,
                  timings: dict, mode: str = "none") -> xr.DataTree:
    """nutpie sampling of up to ``until.max_draws`` draws per chain, stopped at the first
    checkpoint (:func:`checkpoints`) where ``until.check`` does not say ``"continue"``.

    The sampler runs in the background; at each checkpoint the trace so far is read
    (``inspect``), cut to the checkpoint's draw count in every chain and checked. The result
    holds exactly the draws up to the checkpoint that stopped it (all ``max_draws`` when none
    did). ``timings["extension"]`` records each check: draws, decision and check time.
    Progress (``mode``, :func:`progress_mode`) comes from nutpie's progress callback
    (:class:`_Progress`), not from nutpie's own bar, whose total would be ``max_draws``.
    """
    import nutpie

    state: dict[str, list] = {}

    def on_progress(chains: list) -> None:  # nutpie's background thread
        state["done"] = [(int(c.finished_draws), bool(c.tuning)) for c in chains]

    tune = int(kw["tune"])
    cps = checkpoints(draws, until.max_draws)
    progress = _Progress(mode, tune, draws, int(kw["chains"]), until.max_draws)
    s = nutpie.sample(compiled, draws=until.max_draws, blocking=False,
                      progress_callback=on_progress, progress_rate=200,
                      **{**kw, "progress_bar": False})
    log: list[dict] = []
    keep = until.max_draws
    total = tune + until.max_draws

    def reached(n: int) -> bool:
        done = state.get("done")
        return bool(done) and all(not tuning and d - tune >= n for d, tuning in done)

    def finished() -> bool:
        done = state.get("done")
        if bool(done) and all(d >= total for d, _ in done):
            return True
        try:  # a chain that failed stops counting: nutpie knows it has stopped
            return bool(s.is_finished)
        except TimeoutError:  # nutpie's answer while the chains still run
            return False

    def wait_for(n: int) -> None:
        while not reached(n) and not finished():
            progress.update(state.get("done"))
            time.sleep(0.2)
        progress.update(state.get("done"))

    final = None  # the whole trace, once every chain has finished
    try:
        for i, n in enumerate(cps[:-1]):
            if final is None:
                # the progress callback's counts tell how far the chains are
                wait_for(n)
                if finished():
                    final = s.wait()
            # every checkpoint is checked on the draws up to it, whether or not the chains have
            # run ahead meanwhile: the draws kept depend on the seed only
            t0 = time.perf_counter()
            part = _truncate(final if final is not None else s.inspect(), n)
            div = int(part["sample_stats"]["diverging"].values.sum()) \
                if "diverging" in part["sample_stats"] else 0
            decision = until.check(part["posterior"].to_dataset(), div)
            log.append({"draws": n, "decision": decision,
                        "check_s": round(time.perf_counter() - t0, 2)})
            progress.checkpoint(n, decision, cps[i + 1])
            if decision != "continue":
                keep = n
                break
        if final is None:
            if keep < until.max_draws:
                final = s.abort()
            else:
                wait_for(until.max_draws)
                final = s.wait()
        if keep == until.max_draws:
            log.append({"draws": keep, "decision": "max_draws", "check_s": 0.0})
            if len(cps) > 1:
                progress.checkpoint(keep, "max_draws", None)
    except BaseException:
        progress.close()
        if final is None:
            s.cancel()
        raise
    progress.done(keep)
    timings["extension"] = log
    return _truncate(final, keep)


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
