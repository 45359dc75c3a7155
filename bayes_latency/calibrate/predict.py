"""Predictions of a calibrated fit: client means at the posterior draws, and run-level draws.

Split from :mod:`bayes_latency.calibrate.loop` (which re-exports every name here): what to do with a
fit once the replay/fit loop has settled. :func:`client_predictions` evaluates the replayed rows
at the posterior draws; :func:`run_level_coefficients` widens the draws by the run-to-run scale
of the client means (:func:`run_level_sigma`) for simulating a new run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from bayes_latency.data.observations.build import config_id
from bayes_latency.errors import ConfigError
from bayes_latency.physics.basis import term_names
from bayes_latency.physics.hardware import load_gpu
from bayes_latency.physics.models import load_architecture
from bayes_latency.schedule.replay import (
    TTFT_ALPHA,
    WORKLOAD_KINDS,
    ClientStage,
    Replay,
    observed_means,
)

__all__ = ["FLEET_ROWS", "MIN_ALPHA_FACTOR", "PRIOR_ROWS", "client_predictions", "draw_matrices",
           "run_level_coefficients", "run_level_sigma", "ttft_alpha_share"]


def draw_matrices(ds: Any, terms: Sequence[str]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """``(sample, term)`` beta over ``terms`` (0 for terms not in ``ds``) and ``{alpha_term:
    (sample,)}`` from a coefficient Dataset (``LatencyModel.coefficients`` or
    :func:`run_level_coefficients`), for evaluating replayed rows at every draw."""
    names = list(term_names(terms))
    fitted = [str(t) for t in ds["term"].values]
    B = np.zeros((ds.sizes["sample"], len(names)))
    for j, t in enumerate(names):
        if t in fitted:
            B[:, j] = ds["beta"].sel(term=t).values
    A = {str(a): ds["alpha"].sel(alpha_term=a).values for a in ds["alpha_term"].values}
    return B, A


def client_predictions(model: Any, stages: Sequence[ClientStage], replays: Mapping[str, Replay],
                       terms: Sequence[str], n_draws: int = 200, seed: int = 0) -> pd.DataFrame:
    """Predicted client means (µs) per stage and kind at the posterior draws: mean, median, 5%
    and 95% of ``features . theta`` over draws (coefficient uncertainty, no run noise), with the
    measured value."""
    out = []
    for s in stages:
        rep = replays[s.experiment_id]
        ds = model.coefficients(s.model, s.gpu, s.tp, n_draws=n_draws, seed=seed)
        B, A = draw_matrices(ds, terms)
        obs = observed_means(s)
        for k in WORKLOAD_KINDS:
            v = B @ rep.features[k] + sum(w * A.get(a, 0.0) for a, w in rep.alpha[k].items())
            out.append({"experiment_id": s.experiment_id, "run_id": s.run_id, "stage": s.stage,
                        "model": s.model, "tp": s.tp, "kind": k, "observed_us": obs[k],
                        "mean_us": float(np.mean(v)), "median_us": float(np.median(v)),
                        "q05_us": float(np.quantile(v, 0.05)),
                        "q95_us": float(np.quantile(v, 0.95))})
    df = pd.DataFrame(out)
    df["error"] = df["mean_us"] / df["observed_us"] - 1.0
    return df


#: Weight of the prior's mean scale in the fleet's run-level scale, in client rows.
PRIOR_ROWS = 2.0
#: Weight of the fleet's run-level scale in a configuration's, in client rows.
FLEET_ROWS = 4.0


def run_level_sigma(model: Any, cid: str, kind: str, prior_rows: float = PRIOR_ROWS,
                    fleet_rows: float = FLEET_ROWS) -> tuple[float, str]:
    """Run-to-run scale of a client kind for configuration ``cid``, partially pooled, and where
    it comes from.

    Two levels of the conjugate update of a normal scale (scaled inverse chi-square, the prior
    scale counted as pseudo-rows):

    * fleet: ``s_F^2 = (nu_p s_prior^2 + sum_c n_c s_c^2 + N s_pop^2) / (nu_p + sum_c n_c + N)``
      (``s_pop``, ``N``: the scatter and rows of the fleet population the fit was made under,
      :func:`bayes_latency.model.posterior.fleet.client_noise`; none otherwise),
    * configuration: ``s^2 = (nu_F s_F^2 + n_c s_c^2) / (nu_F + n_c)``,

    ``s_c`` the configuration's fitted noise scale of the kind, ``n_c`` its rows of the kind,
    ``s_prior`` the prior mean of the kind's noise scale (a half-normal's ``sigma sqrt(2/pi)``),
    ``nu_p = prior_rows`` and ``nu_F = fleet_rows``. A configuration with many rows keeps its
    own scale; one with one or two (whose stage-1 scale collapses towards 0: bands of +-0.5%)
    borrows the fleet's; a fleet without client rows falls back on the prior. Measured on the
    real runs (leave-one-run-out): each configuration's own scale, from 3-4 rows
    after a run is left out, gave 90% bands of median width 3.6% (E2E) that held 8 of 12 real
    means; the in-sample residual RMS of the 20 stages is 2.6% (E2E) and 14% (TTFT).

    Returns
    -------
    (sigma, source)
        ``source``: ``"pooled (own n_c rows, fleet N rows in k configurations)"`` or
        ``"prior"`` when no configuration has rows of the kind.
    """
    pri = model.priors.noise_prior(kind)["sigma"] if kind in model.priors.noise else \
        {"dist": "halfnormal", "sigma": 0.1}
    s_prior = float(pri.get("sigma", 0.1)) * math.sqrt(2.0 / math.pi)
    rows = getattr(model, "_rows", None)
    counts: dict[str, int] = {}
    if rows is not None and len(rows):
        r = rows[rows["kind"] == kind]
        counts = {str(c): int(n) for c, n in r.groupby("config_id").size().items()}
    if not counts:
        return s_prior, "prior"
    own = {c: float(model.noise(c, kind).sigma) ** 2 for c in counts}
    n_all = sum(counts.values())
    pop = _population_noise(model, kind)   # a fit under a fleet's population: its scatter too
    fleet = (prior_rows * s_prior**2 + sum(counts[c] * own[c] for c in counts)
             + pop[1] * pop[0] ** 2) / (prior_rows + n_all + pop[1])
    n_c = counts.get(cid, 0)
    var = (fleet_rows * fleet + n_c * own.get(cid, 0.0)) / (fleet_rows + n_c)
    return math.sqrt(var), (f"pooled (own {n_c} rows, fleet {n_all} rows in "
                            f"{len(counts)} configurations"
                            + (f", population {pop[1]} rows" if pop[1] else "") + ")")


def _population_noise(model: Any, kind: str) -> tuple[float, int]:
    """``(scale, rows)`` of the fleet's scatter of client means of ``kind`` recorded by the
    population a fit was made under (result attrs ``population``, ``client_noise``), else
    ``(0, 0)``."""
    import json

    result = getattr(model, "result", None)
    attrs = getattr(result, "attrs", {}) or {}
    if "population" not in attrs:
        return 0.0, 0
    v = (json.loads(attrs["population"]).get("client_noise") or {}).get(kind)
    return (float(v["sigma"]), int(v["rows"])) if v else (0.0, 0)


#: Smallest multiplier of alpha in a run-level draw (a draw that would need a negative alpha to
#: reach its TTFT is held here).
MIN_ALPHA_FACTOR = 0.05


def ttft_alpha_share(model: Any, name: str, gpu: str, tp: int, ttft_us: Sequence[float]) -> float:
    """Share of a configuration's mean TTFT that its alpha terms make (median over stages).

    A request's TTFT is its alpha terms (:data:`~bayes_latency.schedule.replay.TTFT_ALPHA`) plus
    the steps it waited and ran through (:mod:`~bayes_latency.schedule.replay`); ``ttft_us`` are
    the replayed mean TTFTs of the configuration's stages at the posterior mean. Clipped to
    [0.02, 1].
    """
    if not len(ttft_us):
        return 1.0
    a = model.coefficients(name, gpu, tp)["alpha"].mean("sample")
    over = sum(w * float(a.sel(alpha_term=t)) for t, w in TTFT_ALPHA.items()
               if t in a["alpha_term"].values)
    return float(np.clip(np.median(over / np.asarray(ttft_us, dtype=float)), 0.02, 1.0))


def run_level_coefficients(model: Any, name: str, gpu: str, tp: int, n_draws: int | None = None,
                           seed: int = 0, ttft_alpha_share: float = 1.0) -> Any:
    """Coefficient draws for simulating a **new run** of a configuration (an ``xr.Dataset`` like
    :meth:`~bayes_latency.model.estimator.LatencyModel.coefficients`).

    A posterior draw of the coefficients gives the mean a run would have if runs never varied;
    a real run's mean TTFT and E2E also scatter around that by the client rows' residual (run
    to run, and what the replay misses). Each draw here multiplies beta by ``exp(s_e2e * z1)``
    (E2E is mostly steps) and alpha by

        m = (exp(s_ttft * z2) - (1 - f) exp(s_e2e * z1)) / f   (at least MIN_ALPHA_FACTOR),

    ``z`` standard normal, ``s`` the run-level scales of ``workload_e2e`` and ``workload_ttft``
    (:func:`run_level_sigma`) and ``f = ttft_alpha_share`` the alpha terms' share of the
    configuration's mean TTFT (:func:`ttft_alpha_share`): the TTFT ``f T m + (1 - f) T
    exp(s_e2e z1)`` is then ``T exp(s_ttft z2)``, so a draw's TTFT scatters by ``s_ttft``
    whatever part of it the alphas make (to first order: queueing is not linear in beta).
    ``f = 1`` (default) multiplies alpha by ``exp(s_ttft z2)``. The band of the simulated means
    of these draws is a predictive band for a run's mean. ``attrs``: ``run_level_sigma``,
    ``run_level_sigma_source`` (how each kind's scale was pooled) and ``ttft_alpha_share``.
    """
    import xarray as xr

    ds = model.coefficients(name, gpu, tp, n_draws=n_draws, seed=seed)
    cid = config_id(load_architecture(name).name, load_gpu(gpu).name, int(tp))
    s_e2e, src_e2e = run_level_sigma(model, cid, "workload_e2e")
    s_ttft, src_ttft = run_level_sigma(model, cid, "workload_ttft")
    rng = np.random.default_rng([seed, 7])
    n = ds.sizes["sample"]
    if not 0.0 < ttft_alpha_share <= 1.0:
        raise ConfigError(f"ttft_alpha_share must be in (0, 1], got {ttft_alpha_share}")
    f = float(ttft_alpha_share)
    eb = np.exp(s_e2e * rng.standard_normal(n))
    ea = (np.exp(s_ttft * rng.standard_normal(n)) - (1.0 - f) * eb) / f
    fb = xr.DataArray(eb, dims=("sample",))
    fa = xr.DataArray(np.maximum(ea, MIN_ALPHA_FACTOR), dims=("sample",))
    out = ds.copy()
    out["beta"] = ds["beta"] * fb
    out["alpha"] = ds["alpha"] * fa
    out.attrs.update(ds.attrs)
    out.attrs["run_level_sigma"] = {"workload_e2e": s_e2e, "workload_ttft": s_ttft}
    out.attrs["run_level_sigma_source"] = {"workload_e2e": src_e2e, "workload_ttft": src_ttft}
    out.attrs["ttft_alpha_share"] = f
    return out
