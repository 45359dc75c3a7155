"""Predictive bands shared by the posterior predictive checks of every level.

:func:`band_summary` reduces predictive draws ``(sample, item)`` and observed values to the
per-item columns :data:`BAND_COLUMNS` (bands, PIT, errors); :func:`summarize_rows` pools them per
group (:data:`ALL` labels pooled groups); :func:`align_draws` lines draws up with the observation
rows they predict. Used by :mod:`bayes_latency.checks.ppc` (steps),
:mod:`bayes_latency.checks.ppc.requests` and :mod:`bayes_latency.checks.ppc.workloads`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr
from scipy import stats as sps

from bayes_latency.errors import BayesLatencyError

BAND_COLUMNS = ["observed_us", "pred_mean_us", "pred_median_us", "q05_us", "q25_us", "q75_us",
                "q95_us", "pit", "in_50", "in_90", "ape"]
ALL = "all"
"""Group label of pooled summaries (all configurations / all stages)."""
#: Where :func:`band_summary` holds draws that overflowed to +inf (µs): far above any duration,
#: and far enough below the largest float that quantiles interpolate without overflow.
OVERFLOW_US = 1e300


def band_summary(draws: np.ndarray, observed: np.ndarray) -> pd.DataFrame:
    """Predictive bands, PIT and errors of ``n`` items.

    Parameters
    ----------
    draws
        ``(n_samples, n)`` predictive draws.
    observed
        ``(n,)`` observed values (NaN allowed: the item then has NaN PIT / coverage / error).

    Returns
    -------
    DataFrame
        ``n`` rows with :data:`BAND_COLUMNS`. ``pit`` is ``P(draw < y) + P(draw == y)/2``;
        ``in_50`` / ``in_90`` tell whether ``y`` is inside the central 50% / 90% band
        (as float 0/1, NaN when ``y`` is NaN).
    """
    d = np.asarray(draws, dtype=float)
    # a heavy-tailed draw exponentiated past the float range is +inf: held at OVERFLOW_US, so a
    # quantile between two of them is finite, not inf - inf = NaN
    d = np.where(np.isposinf(d), OVERFLOW_US, d)
    y = np.asarray(observed, dtype=float)
    if d.ndim != 2 or d.shape[1] != y.shape[0]:
        raise BayesLatencyError(f"draws of shape {d.shape} do not match {y.shape[0]} observations")
    n = y.shape[0]
    if d.shape[0] == 0 or n == 0:
        return pd.DataFrame({c: np.full(n, np.nan) for c in BAND_COLUMNS})
    q = np.quantile(d, [0.05, 0.25, 0.5, 0.75, 0.95], axis=0)
    ok = np.isfinite(y)
    pit = ((d < y).mean(axis=0) + 0.5 * (d == y).mean(axis=0))
    in50 = ((q[1] <= y) & (y <= q[3])).astype(float)
    in90 = ((q[0] <= y) & (y <= q[4])).astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        ape = np.abs(q[2] - y) / np.abs(y) * 100.0
    nan_where = np.where(ok, 1.0, np.nan)
    return pd.DataFrame({
        "observed_us": y,
        "pred_mean_us": d.mean(axis=0),
        "pred_median_us": q[2],
        "q05_us": q[0], "q25_us": q[1], "q75_us": q[3], "q95_us": q[4],
        "pit": pit * nan_where,
        "in_50": in50 * nan_where,
        "in_90": in90 * nan_where,
        "ape": ape * nan_where,
    })


def summarize_rows(rows: pd.DataFrame, by: Sequence[str] = ("config_id",),
                   pooled: bool = True) -> pd.DataFrame:
    """Coverage and error summary of per-item rows (output of :func:`band_summary` + keys).

    Parameters
    ----------
    rows
        Per-item table with :data:`BAND_COLUMNS` and the ``by`` columns.
    by
        Grouping columns.
    pooled
        Also add rows pooling the groups of the first ``by`` column (set to ``"all"``), per
        value of the other ``by`` columns (e.g. all configurations, per metric).

    Returns
    -------
    DataFrame
        One row per group: ``n, coverage_50, coverage_90, mape, mdape, pit_mean,
        pit_ks_pvalue`` (KS test of the PIT values against uniform; NaN below 5 items).
    """
    by = list(by)

    def one(g: pd.DataFrame) -> dict[str, Any]:
        ok = g["observed_us"].notna() & g["pred_median_us"].notna()
        g = g[ok]
        pit = g["pit"].to_numpy(dtype=float)
        ks = float(sps.kstest(pit, "uniform").pvalue) if len(pit) >= 5 else np.nan
        return {
            "n": int(len(g)),
            "coverage_50": float(g["in_50"].mean()) if len(g) else np.nan,
            "coverage_90": float(g["in_90"].mean()) if len(g) else np.nan,
            "mape": float(g["ape"].mean()) if len(g) else np.nan,
            "mdape": float(g["ape"].median()) if len(g) else np.nan,
            "pit_mean": float(pit.mean()) if len(pit) else np.nan,
            "pit_ks_pvalue": ks,
        }

    out = []
    if len(rows):
        for key, g in rows.groupby(by, sort=True, dropna=False):
            key = key if isinstance(key, tuple) else (key,)
            out.append({**dict(zip(by, key, strict=True)), **one(g)})
    if pooled and len(rows):
        rest = by[1:]
        groups = rows.groupby(rest, sort=True, dropna=False) if rest else [((), rows)]
        for key, g in groups:
            key = key if isinstance(key, tuple) else (key,)
            out.append({by[0]: ALL, **dict(zip(rest, key, strict=True)), **one(g)})
    cols = by + ["n", "coverage_50", "coverage_90", "mape", "mdape", "pit_mean", "pit_ks_pvalue"]
    return pd.DataFrame(out, columns=cols)


def _draw_matrix(draws: xr.DataArray | np.ndarray) -> np.ndarray:
    """``(sample, obs)`` numpy matrix of a prediction DataArray (extra sample dims stacked)."""
    if isinstance(draws, xr.DataArray):
        obs_dim = "obs" if "obs" in draws.dims else draws.dims[-1]
        sample_dims = [d for d in draws.dims if d != obs_dim]
        if len(sample_dims) > 1:
            draws = draws.stack(__sample__=sample_dims)
            sample_dims = ["__sample__"]
        return np.asarray(draws.transpose(*sample_dims, obs_dim).values, dtype=float)
    return np.asarray(draws, dtype=float)


def align_draws(obs_df: pd.DataFrame, ppc_draws: xr.DataArray | np.ndarray) -> np.ndarray:
    """``(sample, n_rows)`` matrix of ``ppc_draws`` in the row order of ``obs_df``.

    When the draws carry an ``obs`` coordinate whose values are the ``obs_id`` of every row, rows
    are matched by id; otherwise by position (the lengths must agree).
    """
    mat = _draw_matrix(ppc_draws)
    pos = draw_positions(obs_df, ppc_draws, mat.shape[1])
    return mat if pos is None else mat[:, pos]


def draw_positions(obs_df: pd.DataFrame, ppc_draws: xr.DataArray | np.ndarray,
                   n_columns: int) -> np.ndarray | None:
    """The column of ``ppc_draws`` (``n_columns`` of them) holding each row of ``obs_df``: by
    ``obs_id`` when the draws' ``obs`` coordinate names every row (unique), else None (by
    position; the lengths must agree). :func:`align_draws` and the per-row coordinates of the
    draws (``run_status``) are matched with it."""
    if (isinstance(ppc_draws, xr.DataArray) and "obs" in ppc_draws.coords
            and "obs_id" in obs_df.columns):
        ids = pd.Index(ppc_draws["obs"].values)
        if ids.is_unique:
            pos = ids.get_indexer(obs_df["obs_id"].to_numpy())
            if (pos >= 0).all():
                return pos
    if n_columns != len(obs_df):
        raise BayesLatencyError(
            f"{n_columns} predictive columns for {len(obs_df)} observation rows, and the draws'"
            " obs coordinate does not name their obs_id")
    return None


#: Edges of the batch-size bins of :func:`coverage_by_load` (requests in a step).
LOAD_BINS = (0.0, 16.0, 32.0, 64.0, 96.0, 128.0, np.inf)
#: Parts of a run (by step index) of :func:`coverage_by_load`: a traced run that raises its
#: request rate stage by stage has its heaviest load last.
RUN_PARTS = ("first third", "second third", "last third")


def coverage_by_load(step_rows: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """Band coverage of step rows by load: per configuration and kind, by batch-size bin
    (:data:`LOAD_BINS`, requests per step: ``x_per_request / n_steps``) and by part of the run
    (:data:`RUN_PARTS`, thirds of each experiment's steps by ``step_first``), so a reader sees
    where the bands stop holding as the load grows.

    Parameters
    ----------
    step_rows
        The observation rows that were checked (``config_id``, ``kind``, ``n_steps``,
        ``x_per_request``; ``experiment_id`` and ``step_first`` for the run parts).
    rows
        Their per-row bands (:func:`band_summary` columns), row-aligned with ``step_rows``.

    Returns
    -------
    DataFrame
        ``config_id, kind, by ("batch" or "run part"), bin, n, coverage_50, coverage_90,
        median_band_rel_width`` (width of the 90% band over the predictive median); empty when
        ``step_rows`` lacks ``x_per_request``.
    """
    cols = ["config_id", "kind", "by", "bin", "n", "coverage_50", "coverage_90",
            "median_band_rel_width"]
    if "x_per_request" not in step_rows.columns or len(step_rows) != len(rows):
        return pd.DataFrame(columns=cols)
    s = step_rows.reset_index(drop=True)
    r = rows.reset_index(drop=True)
    n = np.maximum(s["n_steps"].to_numpy(dtype=float), 1.0)
    t = pd.DataFrame({"config_id": s["config_id"].to_numpy(), "kind": s["kind"].to_numpy(),
                      "in_50": r["in_50"].to_numpy(float), "in_90": r["in_90"].to_numpy(float),
                      "width": ((r["q95_us"] - r["q05_us"]) / r["pred_median_us"]).to_numpy(float)})
    batch = pd.cut(s["x_per_request"].to_numpy(dtype=float) / n, LOAD_BINS, right=True)
    parts = pd.Series(pd.NA, index=s.index, dtype=object)
    if {"experiment_id", "step_first"} <= set(s.columns):
        step = s["step_first"].astype(float)
        rank = step.groupby(s["experiment_id"]).rank(pct=True, method="first")
        parts = pd.cut(rank, [0.0, 1 / 3, 2 / 3, 1.0], labels=list(RUN_PARTS)).astype(object)
        parts[step.isna()] = pd.NA
    out = []
    for by, key in (("batch", pd.Series(batch.astype(str), index=s.index).where(batch.notna())),
                    ("run part", parts)):
        g = t.assign(bin=key).dropna(subset=["bin", "in_90"])
        for (c, k, b), gg in g.groupby(["config_id", "kind", "bin"], sort=False):
            out.append({"config_id": c, "kind": k, "by": by, "bin": b, "n": len(gg),
                        "coverage_50": float(gg["in_50"].mean()),
                        "coverage_90": float(gg["in_90"].mean()),
                        "median_band_rel_width": float(gg["width"].median())})
    res = pd.DataFrame(out, columns=cols)
    order = {b: i for i, b in enumerate([*(str(x) for x in batch.categories), *RUN_PARTS])}
    return (res.assign(_o=res["bin"].map(order)).sort_values(["config_id", "kind", "by", "_o"])
            .drop(columns="_o").reset_index(drop=True))
