"""Compiling a PyMC model for nutpie: the Numba flags, the C callbacks and a cache of compiled
models.

The Numba code generation flags (LLVM fast-math, optimisation level) with the measurements behind
them; :func:`compiled_model`, which compiles a model once and reuses the compilation for later
models of the same structure in the process (their data swapped in); and the patches of
nutpie's and PyMC's builders that make the compiled callbacks cheaper and safer.

Importing this module is light (no PyMC, PyTensor, Numba or nutpie).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import pymc as pm

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
# Where a fit's time goes (demo fit, 12 configurations, 2 x (500 + 2000) iterations, CPU
# seconds on a 2-core machine): sampling at ~150-200 leapfrog steps per draw (target_accept
# 0.99), ~38 us per logp+gradient; ArviZ groups 2-5 s; compilation of the logp+gradient graph
# (172 nodes after PyTensor's rewrites, ~660 Numba functions on empty caches, two thirds of
# their time in LLVM) ~40 CPU s on empty caches, ~10 on warm ones.
# What keeps it there: 2000 draws for the demo (``demo.DEMO_DRAWS``); LLVM level 1
# (:data:`NUMBA_OPT`); the deterministics computed after sampling (:func:`_with_deterministics`):
# nutpie's expand function returns the unconstrained draws only (1 node instead of 46: cold
# compilation 55 against 73 CPU s, warm 0.4 against 1.2 s); no C compiler on a first fit
# (:func:`_initial_point_without_c`, ``cxx=""`` in ``groups.prior_groups``, LogSumExp inlined in
# ``_with_deterministics``): PyTensor's C thunks of the initial-point, deterministics and
# prior-sampling functions ran gcc 22 times, 16 s of wall time on an idle machine.
# Tried, not kept: compiling part of the logp+gradient Ops in a second process, to fill
# PyTensor's Numba cache on the idle core. The final linking is not cacheable: after a child
# compiled all 172 nodes (51.5 CPU s), the fit's compilation still took 18.9 CPU s (warm: 10-12);
# at best a few seconds of wall time for a forked compiler process.
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
# :data:`NUMBA_OPT`); on an older model structure: ``freeze_model=True`` (45 against 36 CPU s
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
    (:data:`bayes_latency.model.definition.hierarchy.SUMMARY_DATA`): they compile once. The reused model
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
