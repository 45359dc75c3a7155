"""Step-level posterior predictive check: observation rows against their predictive draws.

:func:`ppc_rows` and :func:`step_ppc` compare the ``iteration`` and ``step_window`` rows with
their posterior predictive draws: per configuration, coverage of the central 50% / 90% bands,
PIT values and the median absolute percentage error (the columns of
:func:`~bayes_latency.checks.ppc.bands.band_summary`). All times are in microseconds.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import xarray as xr

from bayes_latency.checks.ppc.bands import (
    align_draws,
    band_summary,
    draw_positions,
    summarize_rows,
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
        model, gpu, tp, config_id, n_steps`` plus :data:`BAND_COLUMNS`, and ``run_status``
        (``fitted run`` / ``new run``) when the draws carry it.
    """
    obs_df = obs_df.reset_index(drop=True)
    mat = align_draws(obs_df, ppc_draws)
    keep = np.ones(len(obs_df), bool) if kinds is None else obs_df["kind"].isin(kinds).to_numpy()
    sub = obs_df[keep].reset_index(drop=True)
    bands = band_summary(mat[:, keep], sub["value_us"].to_numpy(dtype=float))
    keys = sub[[c for c in _KEY_COLUMNS if c in sub.columns]]
    out = pd.concat([keys, bands], axis=1)
    if isinstance(ppc_draws, xr.DataArray) and "run_status" in ppc_draws.coords:
        # fitted run (its own shift) or new run of the configuration (model.posterior.shifts)
        status = ppc_draws["run_status"].values.astype(str)
        pos = draw_positions(obs_df, ppc_draws, status.size)
        out["run_status"] = (status if pos is None else status[pos])[keep]
    return out


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
