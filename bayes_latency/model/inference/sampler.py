"""Sampler settings of a fit, and the samplers themselves.

What :meth:`bayes_latency.model.estimator.LatencyModel.fit` hands to the sampler: the sampler
names, NUTS's step-size target, nutpie's mass-matrix adaptation, the draws and their extension
while the gates fail (:class:`Until`), and :func:`sample`, which runs the chosen sampler (nutpie
on the model :func:`~bayes_latency.model.inference.compiled.compiled_model` compiles, PyMC, NumPyro, or
the approximate Laplace draws of :func:`_laplace_draws`) on a built PyMC model, showing its
progress as :mod:`~bayes_latency.model.inference.progress` says.

Importing this module is light (no PyMC, PyTensor, Numba or ArviZ).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import xarray as xr

from bayes_latency.model.inference.compiled import compiled_model
from bayes_latency.model.inference.progress import _Progress, progress_mode

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
    :func:`bayes_latency.model.posterior.deterministics._with_deterministics`.
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
                from bayes_latency.model.definition.marginal import register_jax

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


#: Least curvature of the Laplace approximation's Gaussian in unconstrained space (see
#: :func:`_laplace_draws`): at most unit sd along any direction.
LAPLACE_MIN_CURVATURE = 1.0


def _laplace_draws(model: pm.Model, n: int, chains: int, seed: int) -> xr.Dataset:
    """Approximate posterior: Gaussian at the mode in unconstrained space (labelled approximate).

    Returns the draws of the model's value variables (``chain``, ``draw``, ...), as nutpie's
    trace holds them; the free variables and the deterministics are computed from them by
    :func:`bayes_latency.model.posterior.deterministics._with_deterministics`, as for nutpie.
    """
    import pymc as pm

    # the MAP from the model's initial point (no jitter), values of the unconstrained variables
    fit = pm.find_MAP(progressbar=False, random_seed=seed, jitter=False,
                      return_inferencedata=True, idata_kwargs={"include_transformed": True})
    ip = model.initial_point()
    vars_ = model.value_vars
    mode = {v.name: np.asarray(fit["posterior"][v.name].values)[0, 0] for v in vars_}
    flat = np.concatenate([np.atleast_1d(mode[v.name]).ravel() for v in vars_])
    sizes = [int(np.prod(ip[v.name].shape)) for v in vars_]
    shapes = [ip[v.name].shape for v in vars_]
    dlogp = model.compile_dlogp(vars=model.free_RVs)

    def unpack(x: np.ndarray) -> dict:
        """The value variables of flat vectors ``x (..., P)``, each ``(..., *shape)``."""
        out, i = {}, 0
        for v, sz, shp in zip(vars_, sizes, shapes, strict=True):
            out[v.name] = x[..., i:i + sz].reshape(x.shape[:-1] + tuple(shp))
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
    # directions the posterior leaves flat, or curved the wrong way (a mode the optimiser did not
    # quite reach, a variable at a bound), get the curvature of a standard normal prior, that of
    # every non-centred variable of the model: an eigenvalue near 0 would put draws ~1e4 sd away
    w = np.clip(w, LAPLACE_MIN_CURVATURE, None)
    rng = np.random.default_rng(seed)
    per = n // chains
    z = rng.standard_normal((per * chains, len(flat)))
    draws = flat[None, :] + (z / np.sqrt(w)[None, :]) @ V.T
    values = unpack(draws.reshape(chains, per, -1))
    ds = {}
    for v, shp in zip(vars_, shapes, strict=True):
        # an untransformed variable's value has the variable's name and dims, as in nutpie's trace
        dims = model.named_vars_to_dims.get(v.name)
        if dims is None or len(dims) != len(shp):
            dims = [f"{v.name}_dim_{j}" for j in range(len(shp))]
        ds[v.name] = (["chain", "draw", *dims], values[v.name])
    used = {d for dims, _ in ds.values() for d in dims}
    coords = {d: list(v) for d, v in model.coords.items() if d in used and v is not None}
    return xr.Dataset(ds, coords={"chain": np.arange(chains), "draw": np.arange(per), **coords})
