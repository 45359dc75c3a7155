"""Workload-level posterior predictive check: mean TTFT, ITL and E2E per experiment and stage.

:func:`workload_ppc` turns the draws of a :class:`~bayes_latency.checks.ppc.requests.RequestPPC`
into draws of the mean per experiment (and per load stage when known), with a 90% band, the error
in % against the observation (the lifecycle table's client means when given) and optionally
against the truth of a synthetic experiment. Part of :mod:`bayes_latency.checks.ppc`, which
re-exports the public names.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from bayes_latency.checks.ppc.bands import ALL, BAND_COLUMNS, band_summary
from bayes_latency.checks.ppc.requests import RequestPPC, _first

WORKLOAD_METRICS = ("ttft_mean", "itl_mean", "e2e_mean")
E2E_TARGET_PCT = 10.0
"""Target of the mean E2E error per experiment, in %."""


def _group_keys(table: pd.DataFrame) -> list[tuple[str, str, np.ndarray]]:
    """(experiment_id, stage, row positions) groups: each experiment pooled (stage ``all``) and
    per stage when a ``stage`` column exists."""
    groups = []
    exp = table["experiment_id"].astype(str).to_numpy()
    stage = table["stage"].astype(str).to_numpy() if "stage" in table.columns else None
    for e in pd.unique(exp):
        idx = np.flatnonzero(exp == e)
        groups.append((e, ALL, idx))
        if stage is not None:
            for s in pd.unique(stage[idx]):
                groups.append((e, s, idx[stage[idx] == s]))
    return groups


def _means(ttft: np.ndarray, tpot: np.ndarray, e2e: np.ndarray, idx: np.ndarray) -> dict[str, Any]:
    """Means over the requests ``idx`` (along the last axis) of TTFT, decode interval and E2E."""
    t = tpot[..., idx]
    multi = np.isfinite(t).all(axis=tuple(range(t.ndim - 1))) if t.ndim > 1 else np.isfinite(t)
    return {
        "ttft_mean": ttft[..., idx].mean(axis=-1),
        "itl_mean": t[..., multi].mean(axis=-1) if multi.any() else np.full(t.shape[:-1], np.nan),
        "e2e_mean": e2e[..., idx].mean(axis=-1),
    }


def _truth_means(truth: pd.DataFrame, req: pd.DataFrame,
                 groups: list[tuple[str, str, np.ndarray]]) -> dict[tuple[str, str, str], float]:
    """True workload means from ``truth`` (per request, or per experiment[/stage])."""
    out: dict[tuple[str, str, str], float] = {}
    cols = {"ttft_mean": "ttft_us", "itl_mean": "itl_us", "e2e_mean": "e2e_us"}
    if "request_id" in truth.columns:
        t = req[["experiment_id", "request_id", "output_tokens"]].merge(
            truth, on=["experiment_id", "request_id"], how="left", suffixes=("", "_truth"))
        n_out = t["output_tokens"].to_numpy(dtype=float)
        ttft = t["ttft_us"].to_numpy(dtype=float)
        e2e = t["e2e_us"].to_numpy(dtype=float)
        if "tpot_us" in t.columns:
            tpot = t["tpot_us"].to_numpy(dtype=float)
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                tpot = np.where(n_out > 1, (e2e - ttft) / (n_out - 1), np.nan)
        for e, s, idx in groups:
            for metric, v in _means(ttft, tpot, e2e, idx).items():
                out[(e, s, metric)] = float(v)
        return out
    tr = truth.copy()
    tr["experiment_id"] = tr["experiment_id"].astype(str)
    tr["stage"] = tr["stage"].astype(str) if "stage" in tr.columns else ALL
    for r in tr.itertuples(index=False):
        for metric, col in cols.items():
            if hasattr(r, col):
                out[(r.experiment_id, r.stage, metric)] = float(getattr(r, col))
    return out


def _lifecycle_means(lifecycle: pd.DataFrame) -> dict[tuple[str, str, str], float]:
    """Client-side means (µs) from the lifecycle table (``ttft_mean_s``, ``e2e_mean_s``,
    ``decode_interval_s`` in seconds; ``ttft_mean`` / ``e2e_mean`` also accepted). Its
    ``summary`` stage maps to ``all``. The mean decode interval is
    ``(E2E - TTFT) / (output_len_mean - 1)`` when ``decode_interval_s`` is missing (the client's
    ITL / TPOT fields are not used: they undercount real decode intervals)."""
    out: dict[tuple[str, str, str], float] = {}
    for r in lifecycle.to_dict(orient="records"):
        stage = str(r.get("stage", ALL))
        stage = ALL if stage in ("summary", ALL, "None", "nan", "<NA>") else stage
        key = str(r["experiment_id"])
        ttft = _first(r, "ttft_mean_s", "ttft_mean")
        e2e = _first(r, "e2e_mean_s", "e2e_mean")
        itl = _first(r, "decode_interval_s")
        n = _first(r, "output_len_mean")
        if not np.isfinite(itl) and n > 1:
            itl = (e2e - ttft) / (n - 1)
        for metric, v in (("ttft_mean", ttft), ("itl_mean", itl), ("e2e_mean", e2e)):
            if np.isfinite(v):
                out[(key, stage, metric)] = v * 1e6
    return out


def workload_ppc(req: RequestPPC, lifecycle: pd.DataFrame | None = None,
                 truth: pd.DataFrame | None = None,
                 target_pct: float = E2E_TARGET_PCT) -> pd.DataFrame:
    """Workload-level check: mean TTFT, ITL and E2E per experiment (and per stage).

    The mean decode interval (ITL) of a request is ``(E2E - TTFT) / (output_tokens - 1)``
    (requests with one output token have none). The predicted mean of a group is computed per
    draw, so its band is the band of the *mean*.

    The point prediction (``error_pct``, ``truth_error_pct``) is the *median* of the draws of the
    mean (``pred_median_us``), which lies inside its own band by construction. The average of the
    draws (``pred_mean_us``) need not exist: the noise is Student-t on the log scale, whose
    exponential has no mean, and one far-tail draw of a request span can dominate it (measured:
    tiny fleet seed 5, Mixtral mean E2E, average of draws 70,711 ms against a 90% band of
    [4,806.8, 4,858.9] ms and a median of 4,832 ms; one draw of its prefill span, with the step
    windows' fitted dof 1.85, weighed e^20).

    Parameters
    ----------
    req
        Output of :func:`request_ppc`.
    lifecycle
        Optional lifecycle table (``ttft_mean_s``, ``e2e_mean_s``, ``decode_interval_s`` /
        ``output_len_mean``, in seconds; stage ``summary`` = whole experiment); adds the
        client-side means as ``lifecycle_us`` (they cover all client requests, not only the
        traced ones).
    truth
        Optional true values of a synthetic experiment: either per request (``experiment_id,
        request_id, ttft_us, e2e_us[, tpot_us]``) or per experiment (``experiment_id[, stage],
        ttft_us, itl_us, e2e_us``, all means in µs). Adds ``truth_us`` and ``truth_error_pct``.
    target_pct
        Target of the absolute mean E2E error in % (default 10).

    Returns
    -------
    DataFrame
        One row per (experiment_id, stage, metric) with ``config_id, n_requests`` and
        :data:`BAND_COLUMNS` (over the draws of the mean), ``error_pct`` (point prediction vs
        observed, in %; the point prediction is ``pred_median_us``, see below), ``target_pct`` / ``within_target`` (E2E rows only), and the optional
        ``lifecycle_us``, ``truth_us``, ``truth_error_pct``.
    """
    table = req.requests
    ttft = req.draws["ttft"].transpose("sample", "request").values
    tpot = req.draws["tpot"].transpose("sample", "request").values
    e2e = req.draws["e2e"].transpose("sample", "request").values
    obs_ttft = table["ttft_us"].to_numpy(dtype=float)
    obs_tpot = table["tpot_us"].to_numpy(dtype=float)
    obs_e2e = table["e2e_us"].to_numpy(dtype=float)
    groups = _group_keys(table)
    keys, pred_cols, obs_vals = [], [], []
    for e, s, idx in groups:
        pred = _means(ttft, tpot, e2e, idx)
        obs = _means(obs_ttft, obs_tpot, obs_e2e, idx)
        cfg = ", ".join(pd.unique(table["config_id"].to_numpy()[idx]).astype(str))
        for metric in WORKLOAD_METRICS:
            keys.append({"experiment_id": e, "stage": s, "config_id": cfg, "metric": metric,
                         "n_requests": int(len(idx))})
            pred_cols.append(pred[metric])
            obs_vals.append(float(obs[metric]))
    if not keys:
        return pd.DataFrame(columns=["experiment_id", "stage", "config_id", "metric", "n_requests",
                                     *BAND_COLUMNS, "error_pct", "target_pct", "within_target"])
    bands = band_summary(np.column_stack(pred_cols), np.asarray(obs_vals))
    out = pd.concat([pd.DataFrame(keys), bands], axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        out["error_pct"] = (out["pred_median_us"] - out["observed_us"]) / out["observed_us"] * 100
    is_e2e = out["metric"] == "e2e_mean"
    out["target_pct"] = np.where(is_e2e, target_pct, np.nan)
    out["within_target"] = pd.array(np.where(is_e2e, out["error_pct"].abs() < target_pct, None),
                                    dtype="boolean")
    lookup_keys = list(zip(out["experiment_id"], out["stage"], out["metric"], strict=True))
    if lifecycle is not None and len(lifecycle):
        life = _lifecycle_means(lifecycle)
        out["lifecycle_us"] = [life.get(k, np.nan) for k in lookup_keys]
    if truth is not None and len(truth):
        tru = _truth_means(truth, table, groups)
        out["truth_us"] = [tru.get(k, np.nan) for k in lookup_keys]
        with np.errstate(divide="ignore", invalid="ignore"):
            out["truth_error_pct"] = (out["pred_median_us"] - out["truth_us"]) / out["truth_us"] * 100
    return out
