"""Where an export's coefficients come from, in words: the notes an export carries.

- :func:`config_notes`: a configuration of a fit's posterior (seen, or unseen and which of its
  levels were drawn from their population);
- :func:`population_notes`: a zero-shot export from a fleet population alone;
- :func:`calibration_notes`: a posterior calibrated on client means (the population it started
  from, the client means left out of the fit);
- :func:`run_notes`: which run the draws are (a new run, or the configuration's fitted average).

:func:`bayes_latency.export.document.export_notes` puts them before the notes on BLIS's vector.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import xarray as xr

#: How the notes of :func:`config_notes` name each level of a configuration.
LEVEL_NAMES = {"model": "model", "gpu": "GPU", "tp": "TP", "stack": "stack"}


def config_notes(coefs: xr.Dataset) -> list[str]:
    """Notes on where the coefficients of ``coefs``' configuration come from.

    A configuration the fit saw has its fitted draws: no note. For an unseen one
    (``coefs.attrs["unseen_levels"]``, set by
    :meth:`~bayes_latency.model.estimator.LatencyModel.coefficients`), one note says it is unseen
    and how its draws were made, one names each unseen level (model, GPU, TP, stack) whose
    effect was drawn from its population scale ``sigma_<level>`` (``N(0, sigma^2 (1 + 1/n))``
    over the ``n`` seen levels), one for an unseen GPU whose draw was conditioned on the fit's
    kernel tables (``coefs.attrs["kernel_terms"]``), and one the seen levels whose fitted
    effects were used.
    """
    attrs = coefs.attrs
    unseen = [u for u in str(attrs.get("unseen_levels", "")).split(",") if u]
    if not unseen:
        return []
    values = {"model": attrs.get("model"), "gpu": attrs.get("gpu"), "tp": attrs.get("tp"),
              "stack": attrs.get("stack")}
    named = {k: f"{LEVEL_NAMES[k]} {v}" for k, v in values.items() if v is not None}
    levels = [u for u in unseen if u in named]
    seen = [k for k in named if k not in levels]
    where = ", ".join(named.values())
    notes = [f"unseen configuration: the fit has no data of {where}; its coefficients are "
             "population draws (the seen levels' fitted effects, an effect drawn for each "
             "unseen level, and a configuration residual drawn from sigma_config), so their "
             "bands are wider than a fitted configuration's"]
    if levels:
        notes.append("unseen levels: " + ", ".join(named[u] for u in levels)
                     + ": each effect drawn from its population scale ("
                     + ", ".join(f"sigma_{u}" for u in levels)
                     + "; N(0, sigma^2 (1 + 1/n)) over the n levels the fit saw)")
    else:
        notes.append("every level was seen, in other configurations: only the configuration "
                     "residual is drawn")
    kernel_terms = [t for t in str(attrs.get("kernel_terms", "")).split(",") if t]
    if "gpu" in levels and kernel_terms:
        notes.append(f"{named['gpu']}: its effect on {', '.join(kernel_terms)} drawn from that "
                     "population conditioned on its vLLM GEMM efficiency in the fit's kernel "
                     "tables (AIConfigurator; `fit --kernels`)")
    if seen:
        notes.append("seen levels: " + ", ".join(named[k] for k in seen)
                     + ": their fitted effects")
    return notes


def calibration_notes(population: Mapping[str, Any] | None,
                      host_bound: Sequence[str] = ()) -> list[str]:
    """Notes of a calibration's export: which fleet population was the configuration's prior
    (``population``: :meth:`~bayes_latency.model.posterior.fleet.Population.describe` with
    ``unseen_levels``; None: the roofline priors alone), and, when the client result has stages
    whose mean runs past what a load-independent overhead can follow (``host_bound``: the client
    means not fitted for their elasticity, :data:`bayes_latency.calibrate.loop.MAX_FIT_ELASTICITY`;
    on the real runs the 20 req/s stages, whose serving host is the bottleneck, see
    :mod:`bayes_latency.checks.host_overhead`), that BLIS's per-request alphas cannot follow a
    load-dependent host delay."""
    notes = []
    if population is None:
        notes.append("prior: the roofline priors alone (no fleet population)")
    else:
        unseen = population.get("unseen_levels") or {}
        levels = sorted({u for v in unseen.values() for u in v})
        notes.append(f"prior: the fleet population {population.get('name')!r} (models "
                     f"{', '.join(map(str, population.get('models', [])))}; GPUs "
                     f"{', '.join(map(str, population.get('gpus', [])))}; TP "
                     f"{', '.join(map(str, population.get('tps', [])))}; data hash "
                     f"{population.get('data_hash')}): "
                     + ("levels it did not see (" + ", ".join(levels) + ") drew their effects "
                        "from its scales, the others took its fitted effects" if levels
                        else "every level seen, the fitted effects taken"))
    if host_bound:
        notes.append("client means left out of the fit (stages near capacity, where a 1% change "
                     "of the step time moves them by more than 10%): " + ", ".join(host_bound)
                     + ". Where the serving host is the bottleneck (on the real runs the 20 "
                     "req/s stages), the time before a request reaches the engine grows with "
                     "the load; BLIS's per-request alphas cannot follow a load-dependent host "
                     "delay, so simulated TTFT at such loads runs low")
    return notes


def population_notes(population: Mapping[str, Any], coefs: xr.Dataset) -> list[str]:
    """Notes of a zero-shot export made from a fleet population alone (``export --population``,
    or no posterior): which population, what it was fitted on, which levels of the
    configuration it saw (their fitted effects) and which it did not (an effect drawn from the
    factor's scale), and that the configuration's own residual is drawn.

    Parameters
    ----------
    population
        :meth:`~bayes_latency.model.posterior.fleet.Population.describe`.
    coefs
        The draws of :meth:`~bayes_latency.model.posterior.fleet.Population.coefficients`.
    """
    attrs = coefs.attrs
    named = {k: f"{LEVEL_NAMES[k]} {attrs.get(k)}" for k in ("model", "gpu", "tp", "stack")
             if attrs.get(k) is not None}
    unseen = [u for u in str(attrs.get("unseen_levels", "")).split(",") if u in named]
    seen = [k for k in named if k not in unseen]
    fitted = str(attrs.get("config_id", "")) in {str(c) for c in population.get("configs", [])}
    notes = [f"zero-shot: no posterior of this configuration; its coefficients are draws of the "
             f"fleet population {population.get('name')!r} (models "
             f"{', '.join(map(str, population.get('models', [])))}; GPUs "
             f"{', '.join(map(str, population.get('gpus', [])))}; TP "
             f"{', '.join(map(str, population.get('tps', [])))}; data hash "
             f"{population.get('data_hash')})"]
    if unseen:
        notes.append("unseen levels: " + ", ".join(named[u] for u in unseen)
                     + ": each effect drawn from the population's scale ("
                     + ", ".join(f"sigma_{u}" for u in unseen)
                     + "; N(0, sigma^2 (1 + 1/n)) over the n levels it saw), so the bands widen")
    if seen:
        notes.append("seen levels: " + ", ".join(named[k] for k in seen)
                     + ": the population's fitted effects")
    notes.append("configuration residual drawn from sigma_config"
                 + (" (the population was fitted on this configuration but keeps no "
                    "configuration's own coefficients: a fit's posterior of its data is "
                    "narrower)" if fitted else ""))
    notes.append("no step_noise block: a population holds no configuration's step noise "
                 "(a fit's posterior does)")
    return notes


def run_notes(coefs: xr.Dataset) -> list[str]:
    """One note on which run the draws are (``coefs.attrs["run"]``, set by
    :meth:`~bayes_latency.model.estimator.LatencyModel.coefficients`): a new run of the
    configuration (its run-to-run scale and the runs it was fitted from), the configuration's
    average fitted run (asked for, or because the fit has no run-to-run scale); none when the
    attribute is absent."""
    run = str(coefs.attrs.get("run", ""))
    if run == "new run":
        return [f"bands are for a new run of the configuration: each draw times "
                f"exp(N(0, sigma_run^2 (1 + 1/n))), sigma_run {float(coefs.attrs['sigma_run']):.4f} "
                f"(posterior mean), n = {int(coefs.attrs['n_runs'])} fitted run(s)"]
    if run == "new run, no run scale":
        return ["bands are the configuration's (its average fitted run): the fit repeats no "
                "configuration, so it has no run-to-run scale to add for a new run"]
    if run == "configuration":
        return ["bands are the configuration's average fitted run, not a new run's (a new run "
                "scatters about it by sigma_run: coefficients(..., new_run=True))"]
    return []
