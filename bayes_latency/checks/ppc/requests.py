"""Request-level posterior predictive check: teacher-forced TTFT, TPOT and E2E of each request.

:func:`request_ppc` predicts each request's times from the predictions of its
``request_prefill`` / ``request_decode`` rows, its alpha overheads and its *observed* queueing
wait, and returns a :class:`RequestPPC`; :class:`FixedCoefficientModel` stands in for a fitted
model with fixed coefficients (tests, baselines). Part of :mod:`bayes_latency.checks.ppc`, which
re-exports the public names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from bayes_latency.checks.ppc.bands import _draw_matrix, band_summary, summarize_rows
from bayes_latency.errors import BayesLatencyError

REQUEST_METRICS = ("ttft", "tpot", "e2e")


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
    terms
        The coefficients' term set (beta and alpha names), when the observations carry the
        features of other terms too (``ingest`` writes every named term set's): those are not
        part of this model, whose time has no such term. None: every ``x_`` column counts.
    """

    def __init__(self, coefficients: dict[str, dict[str, float]],
                 terms: Sequence[str] | None = None) -> None:
        self.coefficients = {str(c): dict(v) for c, v in coefficients.items()}
        self.terms = None if terms is None else {str(t) for t in terms}

    def predict(self, observations: pd.DataFrame, **_: Any) -> xr.DataArray:
        """``(1, n)`` exact means of the rows."""
        mu = np.zeros(len(observations))
        x_cols = [c for c in observations.columns if c.startswith("x_")
                  and (self.terms is None or c[2:] in self.terms)]
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


def _first(r: dict[str, Any], *names: str) -> float:
    for n in names:
        v = r.get(n)
        if v is not None and not pd.isna(v):
            return float(v)
    return np.nan
