"""PNG figures of a posterior and its predictive checks (matplotlib Agg).

ArviZ plots are used where they fit (:func:`arviz_plots.plot_forest`,
:func:`arviz_plots.plot_ppc_dist`, :func:`arviz_plots.plot_ppc_pit`); each of them falls back to a
plain matplotlib figure when ArviZ cannot draw the data (e.g. a configuration with a single row),
so no function here fails on sparse data. Every function takes data and an output path and returns
the path of the written PNG.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

import matplotlib

if "matplotlib.pyplot" not in sys.modules and not os.environ.get("MPLBACKEND"):
    matplotlib.use("Agg")  # headless by default; a notebook's own backend is respected

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import xarray as xr  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

from bayes_latency.checks.ppc import align_draws  # noqa: E402

DPI = 110
MAX_PANELS = 16
"""At most this many configurations / facets per figure (the rest is named in the title)."""
#: ``method`` of :func:`arviz_plots.plot_ppc_pit` in :func:`plot_pit`: "envelope" (PIT values
#: counted over the draws, vectorised; the Δ-ECDF with a simultaneous envelope this plot
#: describes) instead of ArviZ's default "pot_c", whose Pareto-smoothed PIT fits a generalized
#: Pareto tail per row in Python (~15 CPU s on the demo's ~51,000 step rows, against ~0.7 s).
PIT_METHOD = "envelope"
#: Bandwidth rule of the densities of :func:`plot_ppc_iterations` (650 of them on the demo: 50
#: predictive draws of 13 configurations): Silverman's rule, whose cost is a standard deviation
#: and a quantile range. ArviZ's default ("experimental", the mean of Silverman's and the ISJ
#: bandwidth) solves a fixed-point equation per density; CPU times of the plot in
#: ``CHANGELOG.md``.
PPC_KDE_BW = "silverman"


def _prepare(path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return path


def _empty(path: Path, message: str) -> Path:
    fig, ax = plt.subplots(figsize=(5, 2))
    ax.text(0.5, 0.5, message, ha="center", va="center")
    ax.set_axis_off()
    return _save(fig, path)


def _grid(n: int, width: float = 4.0, height: float = 3.0) -> tuple[plt.Figure, np.ndarray]:
    ncols = min(n, 4)
    nrows = int(np.ceil(n / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    for ax in axes.ravel()[n:]:
        ax.set_axis_off()
    return fig, axes.ravel()


# --------------------------------------------------------------------------------------------
# forest


def _coefficient_posterior(coefs: xr.DataTree | xr.Dataset,
                           var_names: Sequence[str]) -> xr.Dataset:
    """``(chain, draw, ...)`` Dataset of the coefficient variables, from a fitted DataTree, its
    posterior, or a ``model.coefficients()`` Dataset with a ``sample`` dimension."""
    ds = coefs["posterior"].to_dataset() if isinstance(coefs, xr.DataTree) else coefs
    ds = ds[[v for v in var_names if v in ds.data_vars]]
    if "sample" in ds.dims:
        ds = ds.rename({"sample": "draw"}).expand_dims("chain")
    if "draw" in ds.dims and "chain" not in ds.dims:
        ds = ds.expand_dims("chain")
    return ds


def plot_forest(coefs: xr.DataTree | xr.Dataset, path: str | Path,
                var_names: Sequence[str] = ("beta", "alpha"), hdi_prob: float = 0.9) -> Path:
    """Forest plot of the coefficients by configuration, on a log scale.

    One row per coefficient, one coloured interval per configuration (ArviZ ``plot_forest`` with
    one DataTree per configuration); thick line 50%, thin line ``hdi_prob`` equal-tailed interval.

    Parameters
    ----------
    coefs
        Fitted DataTree (its posterior ``beta (chain, draw, config, term)`` and ``alpha``), or a
        Dataset of such variables, or the output of ``model.coefficients()`` (``sample`` dim).
    path
        PNG to write.
    var_names
        Coefficient variables to show.
    hdi_prob
        Probability of the outer (thin) interval.

    Returns
    -------
    Path
    """
    path = _prepare(path)
    ds = _coefficient_posterior(coefs, var_names)
    if not ds.data_vars:
        return _empty(path, "no coefficient variables to plot")
    ds = ds.clip(min=1e-6)  # log scale: exact zeros are shown at 1e-6
    if "config" in ds.dims:
        per_config = {str(c): ds.sel(config=c, drop=True) for c in ds["config"].values}
    else:
        per_config = {"": ds}
    n_coef = sum(int(np.prod([ds[v].sizes[d] for d in ds[v].dims
                              if d not in ("chain", "draw", "config")])) for v in ds.data_vars)
    height = float(np.clip(0.16 * n_coef * (len(per_config) + 1) + 1.5, 3.0, 60.0))
    try:
        import arviz_plots as azp

        data = {c: xr.DataTree.from_dict({"posterior": d}) for c, d in per_config.items()}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pc = azp.plot_forest(data if len(data) > 1 else next(iter(data.values())),
                                 combined=True, ci_probs=(0.5, hdi_prob), ci_kind="eti",
                                 backend="matplotlib", figure_kwargs={"figsize": (11, height)})
            if len(data) > 1:
                pc.add_legend("model", title="configuration")
        ax = pc.viz["plot"].sel(column="forest").item()
        ax.set_xscale("log")
        ax.set_xlabel("coefficient (log scale; 1 for roofline multipliers, µs/unit otherwise)")
        return _save(pc.viz["figure"].item(), path)
    except Exception:  # noqa: BLE001 - fall back to a plain forest
        plt.close("all")
    return _forest_fallback(ds, path, hdi_prob, height)


def _forest_fallback(ds: xr.Dataset, path: Path, hdi_prob: float, height: float) -> Path:
    labels, lo, mid, hi = [], [], [], []
    lo_q, hi_q = (1 - hdi_prob) / 2, 1 - (1 - hdi_prob) / 2
    for v in ds.data_vars:
        da = ds[v].stack(__s__=("chain", "draw"))
        other = [d for d in da.dims if d != "__s__"]
        flat = da.stack(__i__=other) if other else da.expand_dims(__i__=[0])
        vals = flat.transpose("__i__", "__s__").values
        for i in range(vals.shape[0]):
            coords = flat["__i__"].values[i] if other else ()
            coords = coords if isinstance(coords, tuple) else (coords,)
            labels.append(f"{v}[{', '.join(map(str, coords))}]")
            row = vals[i][np.isfinite(vals[i])]
            q = np.quantile(row, [lo_q, 0.5, hi_q]) if row.size else [np.nan] * 3
            lo.append(q[0])
            mid.append(q[1])
            hi.append(q[2])
    fig, ax = plt.subplots(figsize=(10, height))
    y = np.arange(len(labels))[::-1]
    ax.hlines(y, lo, hi, color="C0")
    ax.plot(mid, y, "o", color="C0", ms=3)
    ax.set_yticks(y, labels, fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel(f"coefficient (median, {hdi_prob:.0%} interval; log scale)")
    return _save(fig, path)


# --------------------------------------------------------------------------------------------
# predictive distributions


def _per_config(obs_df: pd.DataFrame, mat: np.ndarray, min_rows: int) -> tuple[dict, list[str]]:
    groups, skipped = {}, []
    cfg = obs_df["config_id"].astype(str).to_numpy()
    for c in pd.unique(cfg):
        idx = np.flatnonzero(cfg == c)
        y = obs_df["value_us"].to_numpy(dtype=float)[idx]
        ok = np.isfinite(y) & (y > 0)
        if ok.sum() < min_rows:
            skipped.append(c)
            continue
        groups[c] = (y[ok], mat[:, idx[ok]])
    return groups, skipped


def plot_ppc_iterations(obs_df: pd.DataFrame, ppc_draws: xr.DataArray | np.ndarray,
                        path: str | Path, kinds: Sequence[str] | None = ("iteration",),
                        num_samples: int = 50) -> Path:
    """Observed vs posterior predictive distribution of log10 iteration time, one panel per
    configuration (ArviZ ``plot_ppc_dist``; matplotlib histograms as fallback).

    Parameters
    ----------
    obs_df
        Observation rows (``value_us``, ``config_id``, ``kind``).
    ppc_draws
        ``(sample, obs)`` posterior predictive draws of those rows.
    path
        PNG to write.
    kinds
        Kinds to show (None = all rows).
    num_samples
        Predictive draws overlaid per panel.

    Returns
    -------
    Path
    """
    path = _prepare(path)
    obs_df = obs_df.reset_index(drop=True)
    mat = align_draws(obs_df, ppc_draws)
    if kinds is not None:
        keep = obs_df["kind"].isin(kinds).to_numpy()
        obs_df, mat = obs_df[keep].reset_index(drop=True), mat[:, keep]
    groups, skipped = _per_config(obs_df, mat, min_rows=2)
    if not groups:
        return _empty(path, "no configuration with at least 2 observed rows")
    names = list(groups)[:MAX_PANELS]
    skipped += list(groups)[MAX_PANELS:]
    title = "log10 iteration time (µs): observed (black) vs posterior predictive"
    if skipped:
        title += f"\nnot shown: {', '.join(skipped)}"
    rng = np.random.default_rng(0)
    n_draws = mat.shape[0]
    pick = rng.choice(n_draws, size=min(num_samples, n_draws), replace=False)
    try:
        import arviz_plots as azp

        kind = "kde" if min(len(groups[c][0]) for c in names) >= 20 else "ecdf"
        pp = xr.Dataset({c: xr.DataArray(np.log10(np.maximum(groups[c][1][pick], 1e-9))[None],
                                         dims=("chain", "draw", f"row{i}"))
                         for i, c in enumerate(names)})
        od = xr.Dataset({c: xr.DataArray(np.log10(groups[c][0]), dims=(f"row{i}",))
                         for i, c in enumerate(names)})
        dt = xr.DataTree.from_dict({"posterior_predictive": pp, "observed_data": od})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            bw = {"bw": PPC_KDE_BW} if kind == "kde" else {}
            pc = azp.plot_ppc_dist(dt, kind=kind, num_samples=len(pick), backend="matplotlib",
                                   stats={"predictive_dist": bw, "observed_dist": bw})
        fig = pc.viz["figure"].item()
        fig.suptitle(title, fontsize=9, y=1.06)
        return _save(fig, path)
    except Exception:  # noqa: BLE001 - fall back to histograms
        plt.close("all")
    fig, axes = _grid(len(names))
    for ax, c in zip(axes, names, strict=False):
        y, d = groups[c]
        ly, ld = np.log10(y), np.log10(np.maximum(d[pick], 1e-9))
        bins = np.linspace(min(ly.min(), ld.min()), max(ly.max(), ld.max()) + 1e-9, 30)
        for row in ld[: min(20, len(ld))]:
            ax.hist(row, bins=bins, histtype="step", density=True, color="C0", alpha=0.2)
        ax.hist(ly, bins=bins, histtype="step", density=True, color="k", lw=1.5)
        ax.set_title(f"{c} (n={len(y)})", fontsize=8)
        ax.set_xlabel("log10 µs")
    fig.suptitle(title, fontsize=9, y=1.02)
    return _save(fig, path)


def plot_pit(obs_df: pd.DataFrame, ppc_draws: xr.DataArray | np.ndarray, path: str | Path,
             kinds: Sequence[str] | None = ("iteration",)) -> Path:
    """PIT calibration plot of all rows of ``kinds`` pooled: ArviZ ``plot_ppc_pit`` (Δ-ECDF of the
    PIT values with a simultaneous envelope); matplotlib PIT histogram as fallback.

    Parameters
    ----------
    obs_df
        Observation rows (``value_us``, ``kind``).
    ppc_draws
        ``(sample, obs)`` posterior predictive draws of those rows.
    path
        PNG to write.
    kinds
        Kinds to pool (None = all rows).

    Returns
    -------
    Path
    """
    path = _prepare(path)
    obs_df = obs_df.reset_index(drop=True)
    mat = align_draws(obs_df, ppc_draws)
    y = obs_df["value_us"].to_numpy(dtype=float)
    keep = np.isfinite(y)
    if kinds is not None:
        keep &= obs_df["kind"].isin(kinds).to_numpy()
    y, mat = y[keep], mat[:, keep]
    if y.size == 0:
        return _empty(path, "no observed rows for a PIT plot")
    try:
        import arviz_plots as azp

        if y.size < 5:
            raise ValueError("too few rows for the envelope")
        dt = xr.DataTree.from_dict({
            "posterior_predictive": xr.Dataset({"y": (("chain", "draw", "row"), mat[None])}),
            "observed_data": xr.Dataset({"y": (("row",), y)}),
        })
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pc = azp.plot_ppc_pit(dt, method=PIT_METHOD, backend="matplotlib")
        fig = pc.viz["figure"].item()
        fig.suptitle(f"PIT Δ-ECDF of {y.size} rows ({', '.join(kinds or ['all'])})", fontsize=9,
                     y=1.06)
        return _save(fig, path)
    except Exception:  # noqa: BLE001 - fall back to a histogram
        plt.close("all")
    pit = (mat < y).mean(axis=0) + 0.5 * (mat == y).mean(axis=0)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.hist(pit, bins=np.linspace(0, 1, 11), density=True, color="C0", alpha=0.7)
    ax.axhline(1.0, color="k", ls="--")
    ax.set_xlabel("PIT")
    ax.set_title(f"PIT histogram ({y.size} rows)", fontsize=9)
    return _save(fig, path)


def plot_calibration(rows: pd.DataFrame, path: str | Path, by: str = "config_id") -> Path:
    """Central-interval coverage calibration per group, from per-row PIT values.

    The empirical coverage of the central interval of probability ``p`` is the share of rows
    with ``|2·PIT − 1| <= p``; a calibrated model lies on the diagonal.

    Parameters
    ----------
    rows
        Per-row table with a ``pit`` column (:func:`~bayes_latency.checks.ppc.ppc_rows`).
    path
        PNG to write.
    by
        Grouping column (one line per group, at most :data:`MAX_PANELS`).

    Returns
    -------
    Path
    """
    path = _prepare(path)
    rows = rows[rows["pit"].notna()] if "pit" in rows.columns else rows.iloc[:0]
    if rows.empty:
        return _empty(path, "no PIT values")
    levels = np.linspace(0.0, 1.0, 21)
    fig, (ax_h, ax_c) = plt.subplots(1, 2, figsize=(10, 4))
    groups = list(rows.groupby(by)) if by in rows.columns else [("all", rows)]
    for i, (name, g) in enumerate(groups[:MAX_PANELS]):
        pit = g["pit"].to_numpy(dtype=float)
        dev = np.abs(2 * pit - 1)
        cov = [(dev <= p).mean() for p in levels]
        ax_c.plot(levels, cov, marker=".", label=f"{name} (n={len(pit)})", color=f"C{i % 10}")
        ax_h.hist(pit, bins=np.linspace(0, 1, 11), histtype="step", density=True,
                  color=f"C{i % 10}")
    n = len(rows)
    # 90% pointwise binomial band around perfect coverage for the pooled rows
    band = 1.645 * np.sqrt(levels * (1 - levels) / n)
    ax_c.fill_between(levels, levels - band, levels + band, color="0.85", label=f"90% band (n={n})")
    ax_c.plot([0, 1], [0, 1], "k--", lw=1)
    ax_c.set_xlabel("nominal central interval")
    ax_c.set_ylabel("empirical coverage")
    ax_c.legend(fontsize=6)
    ax_h.axhline(1.0, color="k", ls="--", lw=1)
    ax_h.set_xlabel("PIT")
    ax_h.set_title("PIT histograms", fontsize=9)
    ax_c.set_title("coverage calibration", fontsize=9)
    return _save(fig, path)


# --------------------------------------------------------------------------------------------
# observed vs predicted


def plot_observed_vs_predicted(table: pd.DataFrame, path: str | Path, *,
                               facet: str | None = None, group: str = "experiment_id",
                               predicted: str = "pred_mean_us", title: str | None = None,
                               max_points: int = 3000) -> Path:
    """Log-log scatter of observed vs predicted values with 90% bands, coloured by experiment.

    Parameters
    ----------
    table
        Any table with ``observed_us``, ``predicted`` and ``q05_us``/``q95_us`` columns (the
        step, request and workload tables of :mod:`~bayes_latency.checks.ppc`).
    path
        PNG to write.
    facet
        Column giving one panel per value (e.g. ``"metric"``), or None for one panel.
    group
        Column giving the colour (default ``experiment_id``).
    predicted
        Column of the point prediction (default ``pred_mean_us``).
    title
        Figure title.
    max_points
        Points per panel above which a random subset is drawn.

    Returns
    -------
    Path
    """
    path = _prepare(path)
    need = ["observed_us", predicted]
    if table.empty or any(c not in table.columns for c in need):
        return _empty(path, "nothing to plot")
    t = table[(table["observed_us"] > 0) & (table[predicted] > 0)]
    if t.empty:
        return _empty(path, "no positive observed/predicted pairs")
    panels = list(pd.unique(t[facet])) if facet and facet in t.columns else [None]
    panels = panels[:MAX_PANELS]
    fig, axes = _grid(len(panels), 4.5, 4.2)
    groups = list(pd.unique(t[group].astype(str))) if group in t.columns else ["all"]
    colours = {g: f"C{i % 10}" for i, g in enumerate(groups)}
    rng = np.random.default_rng(0)
    for ax, p in zip(axes, panels, strict=False):
        d = t if p is None else t[t[facet] == p]
        if len(d) > max_points:
            d = d.iloc[np.sort(rng.choice(len(d), max_points, replace=False))]
        gcol = d[group].astype(str) if group in d.columns else pd.Series("all", index=d.index)
        for g in pd.unique(gcol):
            s = d[gcol == g]
            x, yv = s["observed_us"].to_numpy(float), s[predicted].to_numpy(float)
            if {"q05_us", "q95_us"} <= set(s.columns):
                lo = np.clip(yv - s["q05_us"].to_numpy(float), 0, None)
                hi = np.clip(s["q95_us"].to_numpy(float) - yv, 0, None)
                ax.errorbar(x, yv, yerr=[lo, hi], fmt="o", ms=3, lw=0.8, alpha=0.7,
                            color=colours.get(g, "C0"), label=g if len(groups) <= 12 else None)
            else:
                ax.plot(x, yv, "o", ms=3, alpha=0.7, color=colours.get(g, "C0"), label=g)
        lim = [min(d["observed_us"].min(), d[predicted].min()) * 0.8,
               max(d["observed_us"].max(), d[predicted].max()) * 1.25]
        ax.plot(lim, lim, "k-", lw=0.8)
        for f in (0.9, 1.1):
            ax.plot(lim, [v * f for v in lim], "k:", lw=0.6)
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(NullFormatter())
        ax.tick_params(labelsize=7)
        ax.tick_params(axis="x", labelrotation=35)
        ax.set_xlim(lim)
        ax.set_ylim(lim)
        ax.set_xlabel("observed (µs)")
        ax.set_ylabel("predicted (µs)")
        if p is not None:
            ax.set_title(str(p), fontsize=9)
    if len(groups) <= 12:
        axes[0].legend(fontsize=6)
    fig.suptitle(title or "observed vs predicted (90% band; dotted: ±10%)", fontsize=10)
    return _save(fig, path)
