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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr
from scipy import stats as sps

from bayes_latency.errors import BayesLatencyError

STEP_KINDS = ("iteration", "step_window")
"""Observation kinds of the step-level check run by ``bayes-latency check``."""
BAND_COLUMNS = ["observed_us", "pred_mean_us", "pred_median_us", "q05_us", "q25_us", "q75_us",
                "q95_us", "pit", "in_50", "in_90", "ape"]
STEP_GROUPS = ("config_id", "kind")
"""Grouping of the step-level summary."""
REQUEST_METRICS = ("ttft", "tpot", "e2e")
WORKLOAD_METRICS = ("ttft_mean", "itl_mean", "e2e_mean")
ALL = "all"
"""Group label of pooled summaries (all configurations / all stages)."""
E2E_TARGET_PCT = 10.0
"""Target of the mean E2E error per experiment, in %."""


# --------------------------------------------------------------------------------------------
# shared reductions


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
    if (isinstance(ppc_draws, xr.DataArray) and "obs" in ppc_draws.coords
            and "obs_id" in obs_df.columns):
        ids = pd.Index(ppc_draws["obs"].values)
        if ids.is_unique:
            pos = ids.get_indexer(obs_df["obs_id"].to_numpy())
            if (pos >= 0).all():
                return mat[:, pos]
    if mat.shape[1] != len(obs_df):
        raise BayesLatencyError(
            f"{mat.shape[1]} predictive columns for {len(obs_df)} observation rows, and the draws'"
            " obs coordinate does not name their obs_id")
    return mat


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


# --------------------------------------------------------------------------------------------
# request level


@dataclass
class RequestPPC:
    """Teacher-forced request-level predictions (output of :func:`request_ppc`).

    Attributes
    ----------
    requests
        One row per checked request: ``experiment_id, request_id, config_id, model, gpu, tp,
        output_tokens, queue_us`` (observed wait QUEUED -> first SCHEDULED), observed
        ``ttft_us, tpot_us, e2e_us`` and ``stage`` when the requests table has it.
    draws
        ``ttft, tpot, e2e`` predictive draws, each ``(sample, request)`` aligned with ``requests``.
    rows
        Long table, one row per (request, metric) with :data:`BAND_COLUMNS`.
    notes
        Requests left out and why.
    """

    requests: pd.DataFrame
    draws: xr.Dataset
    rows: pd.DataFrame
    notes: list[str] = field(default_factory=list)

    def summary(self, by: Sequence[str] = ("config_id",)) -> pd.DataFrame:
        """Per configuration and metric: ``n, coverage_50, coverage_90, mape, mdape, ...``."""
        return summarize_rows(self.rows, by=[*by, "metric"])

    def expected(self) -> pd.DataFrame:
        """Per request mean of the draws: ``experiment_id, request_id, ttft_us, tpot_us,
        e2e_us`` (the ``truth`` format of :func:`workload_ppc` when the model is a
        :class:`FixedCoefficientModel` holding the true coefficients)."""
        out = self.requests[["experiment_id", "request_id"]].copy()
        for name in REQUEST_METRICS:
            out[f"{name}_us"] = self.draws[name].mean("sample").values
        return out


class FixedCoefficientModel:
    """A stand-in model with known coefficients per configuration (e.g. a synthetic fleet's
    truth): ``predict`` and ``sample_posterior_predictive`` both return the exact mean
    ``x . theta`` as a single draw. Use it with :func:`request_ppc` (then
    :meth:`RequestPPC.expected`) to compute true workload means the same way as the predictions.

    Parameters
    ----------
    coefficients
        ``config_id -> {coefficient name: value}`` over beta and alpha terms (µs units as in the
        observations' ``x_<name>`` features). Features without a coefficient must be zero.
    """

    def __init__(self, coefficients: dict[str, dict[str, float]]) -> None:
        self.coefficients = {str(c): dict(v) for c, v in coefficients.items()}

    def predict(self, observations: pd.DataFrame, **_: Any) -> xr.DataArray:
        """``(1, n)`` exact means of the rows."""
        mu = np.zeros(len(observations))
        x_cols = [c for c in observations.columns if c.startswith("x_")]
        cfg = observations["config_id"].astype(str).to_numpy()
        for c in pd.unique(cfg):
            if c not in self.coefficients:
                raise BayesLatencyError(f"no coefficients for configuration {c!r}")
            m = cfg == c
            theta = self.coefficients[c]
            for col in x_cols:
                x = observations.loc[m, col].to_numpy(dtype=float)
                if col[2:] in theta:
                    mu[m] += theta[col[2:]] * x
                elif np.any(x != 0):
                    raise BayesLatencyError(f"feature {col!r} is used by configuration {c!r} "
                                            "but has no coefficient")
        return xr.DataArray(mu[None, :], dims=("sample", "obs"),
                            coords={"obs": observations["obs_id"].to_numpy()})

    def sample_posterior_predictive(self, observations: pd.DataFrame, **_: Any) -> xr.DataArray:
        """Same as :meth:`predict` (no noise)."""
        return self.predict(observations)


def _observed_request_times(req: pd.DataFrame) -> pd.DataFrame:
    """Observed TTFT / E2E / TPOT and queueing wait (µs) of each request.

    ``arrival_s`` / ``departed_s`` (API, seconds) and the engine ``*_ns`` timestamps are on the
    same monotonic clock of the host.
    """
    out = pd.DataFrame(index=req.index)
    arrival_us = req["arrival_s"].astype(float) * 1e6
    out["queue_us"] = (req["first_scheduled_ns"].astype(float) - req["queued_ns"].astype(float)) / 1e3
    out["ttft_us"] = req["first_token_ns"].astype(float) / 1e3 - arrival_us
    out["e2e_us"] = req["departed_s"].astype(float) * 1e6 - arrival_us
    n_out = req["output_tokens"].astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out["tpot_us"] = np.where(n_out > 1, (out["e2e_us"] - out["ttft_us"]) / (n_out - 1), np.nan)
    out["alpha_arrival_us"] = req["queued_ns"].astype(float) / 1e3 - arrival_us
    out["alpha_departure_us"] = req["departed_s"].astype(float) * 1e6 - req["finished_ns"].astype(float) / 1e3
    return out


def _span_rows(obs: pd.DataFrame, req: pd.DataFrame, kind: str) -> pd.Series:
    """Index (into ``obs``) of the ``kind`` row of each request (-1 when absent).

    Uses a ``request_id`` column of the observations when present; otherwise matches the step
    span: prefill = ``[first_scheduled_step, first_token_step]``, decode =
    ``[first_token_step + 1, finished_step]`` (rows spanning the same steps have the same
    features, so any of them serves).
    """
    rows = obs[obs["kind"] == kind]
    if "request_id" in rows.columns and rows["request_id"].notna().any():
        key_obs = list(zip(rows["experiment_id"], rows["request_id"], strict=True))
        key_req = list(zip(req["experiment_id"], req["request_id"], strict=True))
    else:
        if kind == "request_prefill":
            first, last = req["first_scheduled_step"], req["first_token_step"]
        else:
            first, last = req["first_token_step"] + 1, req["finished_step"]
        key_obs = list(zip(rows["experiment_id"], rows["step_first"].astype("Int64"),
                           rows["step_last"].astype("Int64"), strict=True))
        key_req = list(zip(req["experiment_id"], pd.Series(first).astype("Int64"),
                           pd.Series(last).astype("Int64"), strict=True))
    lookup = dict(zip(key_obs, rows.index, strict=True))
    return pd.Series([lookup.get(k, -1) for k in key_req], index=req.index)


def _alpha_rows(req: pd.DataFrame, obs: pd.DataFrame, observed: pd.DataFrame) -> pd.DataFrame:
    """One ``alpha_arrival`` and one ``alpha_departure`` row per request, built like the ingested
    alpha rows (configuration columns copied from a row of the same configuration)."""
    template = obs.drop_duplicates("config_id").set_index("config_id")
    x_cols = [c for c in obs.columns if c.startswith("x_")]
    base = template.loc[req["config_id"].to_numpy()].reset_index()
    base[x_cols] = 0.0
    if "request_id" in base.columns:
        base["request_id"] = req["request_id"].to_numpy()
    base["experiment_id"] = req["experiment_id"].to_numpy()
    base["n_steps"] = 1
    base["aggregate"] = "sum"
    base["role"] = "ppc"
    arr = base.copy()
    arr["kind"] = "alpha_arrival"
    arr["x_alpha_arrival"] = 1.0
    arr["value_us"] = observed["alpha_arrival_us"].to_numpy()
    dep = base.copy()
    dep["kind"] = "alpha_departure"
    dep["x_alpha_post_decode"] = 1.0
    dep["x_alpha_per_token"] = req["output_tokens"].to_numpy(dtype=float)
    dep["value_us"] = observed["alpha_departure_us"].to_numpy()
    return pd.concat([arr, dep], ignore_index=True)


def request_ppc(model: Any, observations: pd.DataFrame, requests: pd.DataFrame, *,
                noise: bool = True, seed: int = 0) -> RequestPPC:
    """Teacher-forced request-level check of TTFT, TPOT and E2E.

    For each complete request, with draws of the model's predictions:

    - TTFT = alpha_arrival + observed queueing wait (first SCHEDULED - QUEUED)
      + predicted prefill span (its ``request_prefill`` row: the sum of the predicted iteration
      times of the steps from first scheduling to first token);
    - E2E = TTFT + predicted decode span (its ``request_decode`` row; 0 for one output token)
      + alpha_post_decode + alpha_per_token x output_tokens;
    - TPOT = (E2E - TTFT) / (output_tokens - 1).

    Observed values come from the requests table (``arrival_s``/``departed_s`` and the engine
    ``*_ns`` timestamps, one monotonic clock).

    Parameters
    ----------
    model
        A fitted model with ``predict(df)`` / ``sample_posterior_predictive(df, seed=)``
        returning ``(sample, obs)`` draws in the row order of ``df``.
    observations
        Observations table with the ``request_prefill`` / ``request_decode`` rows.
    requests
        Requests table.
    noise
        Use posterior predictive draws (with observation noise; default) rather than mean
        predictions. Coverage of the bands is only meaningful with noise.
    seed
        Seed of the predictive draws.

    Returns
    -------
    RequestPPC

    Raises
    ------
    BayesLatencyError
        When no request can be checked.
    """
    notes: list[str] = []
    req = requests.copy()
    n0 = len(req)
    if "complete" in req.columns:
        req = req[req["complete"].astype(bool)]
    if "aborted" in req.columns:
        req = req[~req["aborted"].astype(bool)]
    if len(req) < n0:
        notes.append(f"{n0 - len(req)} incomplete or aborted requests left out")
    observed = _observed_request_times(req)
    ok = observed[["ttft_us", "e2e_us", "queue_us"]].notna().all(axis=1) & (req["output_tokens"] >= 1)
    if (~ok).any():
        notes.append(f"{int((~ok).sum())} requests without usable timestamps left out")
    req, observed = req[ok], observed[ok]

    obs = observations.reset_index(drop=True)
    pre_idx = _span_rows(obs, req, "request_prefill")
    dec_idx = _span_rows(obs, req, "request_decode")
    has_dec = (dec_idx >= 0) | (req["output_tokens"] <= 1)
    ok = (pre_idx >= 0) & has_dec
    if (~ok).any():
        notes.append(f"{int((~ok).sum())} requests without request_prefill/request_decode rows "
                     "left out")
    req, observed, pre_idx, dec_idx = req[ok], observed[ok], pre_idx[ok], dec_idx[ok]
    if len(req) == 0:
        raise BayesLatencyError("request_ppc: no request could be matched to its "
                                "request_prefill/request_decode observation rows")
    cfg = obs.loc[pre_idx.to_numpy(), "config_id"].to_numpy()
    req = req.assign(config_id=cfg)
    for col in ("model", "gpu", "tp"):
        if col in obs.columns:
            req[col] = obs.loc[pre_idx.to_numpy(), col].to_numpy()

    span_ids = np.unique(np.concatenate([pre_idx.to_numpy(), dec_idx[dec_idx >= 0].to_numpy()]))
    spans = obs.loc[span_ids]
    alpha = _alpha_rows(req, obs, observed)
    frame = pd.concat([spans, alpha], ignore_index=True)
    frame["obs_id"] = np.arange(len(frame))
    if noise:
        mat = _draw_matrix(model.sample_posterior_predictive(frame, seed=seed))
    else:
        mat = _draw_matrix(model.predict(frame))
    if mat.shape[1] != len(frame):
        raise BayesLatencyError(f"model returned {mat.shape[1]} predictions for {len(frame)} rows")
    col_of = {int(s): i for i, s in enumerate(span_ids)}
    n_req = len(req)
    pre = mat[:, [col_of[int(i)] for i in pre_idx]]
    dec = np.zeros_like(pre)
    has = (dec_idx >= 0).to_numpy()
    dec[:, has] = mat[:, [col_of[int(i)] for i in dec_idx[has]]]
    a_arr = mat[:, len(span_ids):len(span_ids) + n_req]
    a_dep = mat[:, len(span_ids) + n_req:]
    ttft = a_arr + observed["queue_us"].to_numpy()[None, :] + pre
    e2e = ttft + dec + a_dep
    n_out = req["output_tokens"].to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(n_out > 1, (e2e - ttft) / (n_out - 1), np.nan)

    keep_cols = [c for c in ("experiment_id", "request_id", "config_id", "model", "gpu", "tp",
                             "stage", "output_tokens", "prompt_tokens") if c in req.columns]
    table = pd.concat([req[keep_cols].reset_index(drop=True),
                       observed[["queue_us", "ttft_us", "tpot_us", "e2e_us"]].reset_index(drop=True)],
                      axis=1)
    draws = xr.Dataset({name: (("sample", "request"), arr)
                        for name, arr in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e))})
    long = []
    for name, arr in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e)):
        keep = np.isfinite(arr).all(axis=0)
        part = pd.concat([table.loc[keep, keep_cols].reset_index(drop=True),
                          band_summary(arr[:, keep], table.loc[keep, f"{name}_us"].to_numpy())],
                         axis=1)
        part.insert(len(keep_cols), "metric", name)
        long.append(part)
    rows = pd.concat(long, ignore_index=True)
    return RequestPPC(requests=table, draws=draws, rows=rows, notes=notes)


# --------------------------------------------------------------------------------------------
# workload level


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


def _first(r: dict[str, Any], *names: str) -> float:
    for n in names:
        v = r.get(n)
        if v is not None and not pd.isna(v):
            return float(v)
    return np.nan


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
