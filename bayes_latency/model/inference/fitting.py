"""The draws of a fit: sampling (extended while the gates fail), deterministics, config draws.

:func:`draw_posterior` samples the PyMC model (:func:`~bayes_latency.model.inference.sampler.sample`, or
:func:`~bayes_latency.model.inference.extension.sample_extended` when sampling may go on past the requested draws), computes
the deterministics of nutpie's draws (:func:`~bayes_latency.model.posterior.deterministics._with_deterministics`) and, on the
fast path, draws the configuration coefficients (:func:`~bayes_latency.model.posterior.deterministics.add_config_draws`); the
model's fixed quantities (:func:`~bayes_latency.model.definition.population.fixed_quantities`) go to ``constant_data``. It
returns the trace with the sampler settings that made it; :mod:`bayes_latency.model.posterior.persistence` lays it out as the
result and :mod:`bayes_latency.model.posterior.groups` adds the ArviZ groups.

Importing this module is light (no PyMC, PyTensor or ArviZ).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import xarray as xr

from bayes_latency.model.inference.compiled import NUMBA_FASTMATH, NUMBA_OPT
from bayes_latency.model.inference.extension import sample_extended
from bayes_latency.model.inference.sampler import sample
from bayes_latency.model.posterior.deterministics import _with_deterministics, add_config_draws

if TYPE_CHECKING:  # pragma: no cover
    import pymc as pm

    from bayes_latency.model.posterior.state import FitState


@dataclass
class Drawn:
    """What :func:`draw_posterior` returns: the trace, the sampler settings that made it, the
    extension's checks (None when it was not extended) and notes for the fit report."""

    trace: xr.DataTree
    settings: dict[str, Any]
    extension: list[dict] | None = None
    notes: list[str] = field(default_factory=list)


def draw_posterior(model: pm.Model, state: FitState, *, draws: int, tune: int, chains: int,
                   seed: int, progress: bool | str, target_accept: float, adaptation: str,
                   prior_draws: int, max_draws: int | None, gates: dict | None,
                   timings: dict[str, float]) -> Drawn:
    """Posterior draws of ``model`` with every free variable, deterministic and (fast path)
    configuration coefficient; ``timings`` gets the sampling, deterministics and config-draw
    times. Arguments as :meth:`LatencyModel.fit
    <bayes_latency.model.estimator.LatencyModel.fit>` (which documents them)."""
    from bayes_latency.model.definition.population import fixed_quantities

    extension = None
    if max_draws is not None and max_draws > draws and state.sampler == "nutpie":
        dt, extension, target_accept = sample_extended(
            state, model, draws=draws, tune=tune, chains=chains, seed=seed, progress=progress,
            target_accept=target_accept, adaptation=adaptation, max_draws=max_draws,
            gates=gates, timings=timings)
        draws = int(dt["posterior"].sizes["draw"])
    else:
        dt = sample(model, state.sampler, draws=draws, tune=tune, chains=chains, seed=seed,
                    progress=progress, target_accept=target_accept, adaptation=adaptation,
                    timings=timings)
    if state.sampler in ("nutpie", "laplace"):  # draws of the value variables
        t0 = time.perf_counter()
        dt["posterior"] = xr.DataTree(_with_deterministics(model, dt["posterior"].to_dataset()))
        timings["deterministics_s"] = time.perf_counter() - t0
    settings: dict[str, Any] = {"draws": draws, "tune": tune, "chains": chains, "seed": seed,
                                "target_accept": target_accept, "adaptation": adaptation,
                                "numba_fastmath": NUMBA_FASTMATH,
                                "numba_opt": os.environ.get("NUMBA_OPT", NUMBA_OPT),
                                "prior_draws": prior_draws}
    if extension is not None:
        settings["max_draws"] = max_draws
    fixed = fixed_quantities(model)
    if fixed:  # the same at every draw: the result's constant_data, not posterior variables
        dt["constant_data"] = xr.DataTree(xr.Dataset(
            {k: (dims, v) for k, (dims, v) in fixed.items()},
            coords={d: list(model.coords[d]) for dims, _ in fixed.values() for d in dims}))
    seconds, notes = add_config_draws(state, dt, seed)
    if seconds is not None:
        timings["config_draws_s"] = seconds
    return Drawn(trace=dt, settings=settings, extension=extension, notes=notes)
