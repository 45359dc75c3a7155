"""Posterior predictive checks at three levels: steps, requests and workloads.

Every level reduces a matrix of predictive draws ``(sample, item)`` and the observed values of
the items to the same per-item columns (:func:`band_summary`):

``observed_us, pred_mean_us, pred_median_us, q05_us, q25_us, q75_us, q95_us, pit, in_50, in_90,
ape`` (absolute percentage error of the predictive median, in %).

- **step level** (:func:`step_ppc`, :func:`ppc_rows`): observation rows (``iteration``,
  ``step_window``) against their posterior predictive draws; per configuration coverage of the
  central 50% / 90% bands, PIT values and the median absolute percentage error.
- **request level** (:func:`request_ppc`): teacher-forced TTFT, TPOT and E2E of each request,
  from the predictions of the request's ``request_prefill`` / ``request_decode`` rows, its alpha
  overheads and its *observed* queueing wait.
- **workload level** (:func:`workload_ppc`): mean TTFT, mean ITL (decode interval) and mean E2E
  per experiment (and per load stage when known), with a 90% band over the draws of the mean, the
  error in % against the observation and optionally against the truth of a synthetic experiment.

All times are in microseconds.
The shared band reductions are in :mod:`bayes_latency.checks.ppc_bands`, the request level in
:mod:`bayes_latency.checks.ppc_requests`, the workload level in
:mod:`bayes_latency.checks.ppc_workloads`; their public names are re-exported here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import xarray as xr

from bayes_latency.checks.ppc_bands import (  # noqa: F401 - re-exported
    ALL,
    BAND_COLUMNS,
    align_draws,
    band_summary,
    coverage_by_load,
    summarize_rows,
)
from bayes_latency.checks.ppc_requests import (  # noqa: F401 - re-exported
    REQUEST_METRICS,
    FixedCoefficientModel,
    RequestPPC,
    request_ppc,
)
from bayes_latency.checks.ppc_workloads import (  # noqa: F401 - re-exported
    E2E_TARGET_PCT,
    WORKLOAD_METRICS,
    workload_ppc,
)

STEP_KINDS = ("iteration", "step_window")
"""Observation kinds of the step-level check run by ``bayes-latency check``."""
STEP_GROUPS = ("config_id", "kind")
"""Grouping of the step-level summary."""


# --------------------------------------------------------------------------------------------
# step level

_KEY_COLUMNS = ["obs_id", "kind", "experiment_id", "workload", "model", "gpu", "tp", "config_id",
                "n_steps"]


def ppc_rows(obs_df: pd.DataFrame, ppc_draws: xr.DataArray | np.ndarray,
             kinds: Sequence[str] | None = ("iteration",)) -> pd.DataFrame:
    """Per-row predictive check of observation rows.

    Parameters
    ----------
    obs_df
        Observations table (at least ``value_us``, ``kind`` and ``config_id``).
    ppc_draws
        ``(sample, obs)`` posterior predictive draws of the rows of ``obs_df`` (matched by the
        ``obs`` coordinate = ``obs_id`` when present, else by position).
    kinds
        Keep only rows of these kinds (None keeps all).

    Returns
    -------
    DataFrame
        The key columns of ``obs_df`` present among ``obs_id, kind, experiment_id, workload,
        model, gpu, tp, config_id, n_steps`` plus :data:`BAND_COLUMNS`.
    """
    obs_df = obs_df.reset_index(drop=True)
    mat = align_draws(obs_df, ppc_draws)
    keep = np.ones(len(obs_df), bool) if kinds is None else obs_df["kind"].isin(kinds).to_numpy()
    sub = obs_df[keep].reset_index(drop=True)
    bands = band_summary(mat[:, keep], sub["value_us"].to_numpy(dtype=float))
    keys = sub[[c for c in _KEY_COLUMNS if c in sub.columns]]
    return pd.concat([keys, bands], axis=1)


def step_ppc(obs_df: pd.DataFrame, ppc_draws: xr.DataArray | np.ndarray,
             kinds: Sequence[str] = ("iteration",)) -> pd.DataFrame:
    """Step-level predictive check per configuration (and kind).

    Parameters
    ----------
    obs_df
        Observations table.
    ppc_draws
        ``(sample, obs)`` posterior predictive draws (with noise) of the rows of ``obs_df``.
    kinds
        Observation kinds to check.

    Returns
    -------
    DataFrame
        One row per (``config_id``, ``kind``) plus pooled ``config_id="all"`` rows: ``n, coverage_50,
        coverage_90`` (share of observations inside the central 50% / 90% predictive bands),
        ``mape, mdape`` (mean / median absolute % error of the predictive median), ``pit_mean``,
        ``pit_ks_pvalue``. Per-row values (PIT for calibration plots) come from :func:`ppc_rows`.
    """
    return summarize_rows(ppc_rows(obs_df, ppc_draws, kinds), by=STEP_GROUPS)
