"""Sampling on past the requested draws until the convergence gates pass (``fit(max_draws=...)``,
the CLI's ``--max-draws``).

:func:`sample_extended` runs nutpie through :func:`~bayes_latency.model.inference.sampler.sample` with an
:class:`~bayes_latency.model.inference.sampler.Until` whose check (:func:`gate_check`) measures the gates
of :func:`~bayes_latency.model.inference.convergence.convergence` on the draws up to each checkpoint; when
the first attempt stops on divergences it samples once more at
:data:`~bayes_latency.model.inference.sampler.RETRY_TARGET_ACCEPT`.

Importing this module is light (no PyMC, PyTensor or ArviZ).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import xarray as xr

from bayes_latency.model.inference import convergence as _convergence
from bayes_latency.model.inference.progress import progress_mode
from bayes_latency.model.inference.sampler import (
    HOPELESS_RHAT,
    RETRY_TARGET_ACCEPT,
    Until,
    sample,
)
from bayes_latency.model.posterior.deterministics import (
    _with_deterministics,
    config_draws_posterior,
)

if TYPE_CHECKING:  # pragma: no cover
    import pymc as pm

    from bayes_latency.model.posterior.state import FitState


def gate_check(state: FitState, model: pm.Model, seed: int,
               gates: dict | None) -> Callable[[xr.Dataset, int], str]:
    """The check of :class:`~bayes_latency.model.inference.sampler.Until`: the convergence gates of
    :func:`~bayes_latency.model.inference.convergence.convergence` on the draws so far (the gate
    variables' deterministics and, on the fast path, the configuration draws, added as after
    sampling).

    Returns ``"pass"``, ``"continue"`` or why more draws cannot help: divergences, or R-hat
    above 1 + 3 x (:data:`HOPELESS_RHAT` - 1) at the first check or above :data:`HOPELESS_RHAT`
    without having come down by a fifth of its excess over 1 since the last check.
    """
    gates = {**_convergence.GATES, **(gates or {})}
    names = [*_convergence.GATE_VARS, "theta_pop", "sigma_config"]
    cache: dict = {}  # the deterministics' function (compiled at the first check), last R-hat

    def check(post: xr.Dataset, divergences: int) -> str:
        post = _with_deterministics(model, post, names=names, cache=cache)
        post, _ = config_draws_posterior(state, post, seed)
        stats, _, _ = _convergence.gate_stats(post, divergences, gates)
        if stats["passed"]:
            return "pass"
        if divergences > gates["max_divergences"]:
            return f"{divergences} divergent transitions: more draws do not remove them"
        r, prev = stats["max_rhat"], cache.get("rhat")
        cache["rhat"] = r
        if r > 1.0 + 3.0 * (HOPELESS_RHAT - 1.0) or (
                r > HOPELESS_RHAT and prev is not None and r - 1.0 > 0.8 * (prev - 1.0)):
            return (f"max R-hat {r:.3f}: the chains sit in different places and more draws "
                    "do not bring them together")
        return "continue"

    return check


def sample_extended(state: FitState, model: pm.Model, *, draws: int, tune: int, chains: int,
                    seed: int, progress: bool | str, target_accept: float, adaptation: str,
                    max_draws: int, gates: dict | None, timings: dict[str, float]
                    ) -> tuple[xr.DataTree, list[dict], float]:
    """nutpie's draws of ``model``, extended up to ``max_draws`` while the gates fail.

    Returns ``(trace, extension, target_accept)``: the trace (value variables, cut at the
    checkpoint that stopped it), every check made (``draws``, ``decision``, ``check_s``,
    ``target_accept``) and the ``target_accept`` of the draws kept (the repeat's after
    divergences). ``timings`` gets the first attempt's compile and sampling times and the
    repeat's as ``retry_*``.
    """
    extension: list[dict] = []
    for attempt in range(2):
        attempt_timings = timings if attempt == 0 else {}
        dt = sample(model, state.sampler, draws=draws, tune=tune, chains=chains, seed=seed,
                    progress=progress, target_accept=target_accept, adaptation=adaptation,
                    timings=attempt_timings,
                    until=Until(max_draws, gate_check(state, model, seed, gates)))
        extension += [{**e, "target_accept": target_accept}
                      for e in attempt_timings.pop("extension")]
        if attempt:
            timings.update({f"retry_{k}": v for k, v in attempt_timings.items()})
        if "divergent" not in extension[-1]["decision"] or target_accept >= RETRY_TARGET_ACCEPT:
            break
        # divergences: once more with a smaller step (the compiled model is reused)
        if progress_mode(progress) != "none":
            print(f"divergent transitions at target_accept {target_accept}: sampling again at "
                  f"{RETRY_TARGET_ACCEPT}", file=sys.stderr, flush=True)
        target_accept = RETRY_TARGET_ACCEPT
    return dt, extension, target_accept
