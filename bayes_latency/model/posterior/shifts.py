"""Run and window shifts of predictions: a fitted run keeps its own, a new run draws one.

The model (:mod:`bayes_latency.model.definition.runs`) multiplies a row's expected value by
``exp(v_run + v_window)``. A prediction for a row of a run the fit saw uses that run's estimated
shift (and its window's, when the fit saw the window), with its standard error; any other row
is a **new run** of its configuration, whose shift about the fitted average of ``n`` runs is
``N(0, sigma_run^2 (1 + 1/n))`` per posterior draw of ``sigma_run``, one draw shared by the
rows of that run. A new stretch of a fitted run (rows past the fitted windows) draws
``N(0, sigma_window^2 (1 + 1/m))`` for a run of ``m`` fitted windows, and a new run's stretches
``N(0, sigma_window^2)``. Rows without a step index (benchmark means, batch tables) have no
window.

:class:`RunTable` holds the fitted shifts (from the result's ``summaries`` group,
:func:`bayes_latency.model.posterior.persistence.run_effects_dataset`); :func:`row_shifts` draws
the log shifts of observation rows and says which rows are fitted runs; :func:`fitted_log_shifts`
gives the fitted rows the shifts the fit conditioned on, for the saved ``log_likelihood`` and
``posterior_predictive`` groups and the adequacy gate's LOO-PIT.

Importing this module is light (NumPy, pandas, xarray).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import xarray as xr

from bayes_latency.model.definition.runs import new_shift_var, run_keys, window_keys

#: Run status of a prediction's rows (:func:`row_shifts`).
FITTED_RUN, NEW_RUN = "fitted run", "new run"
#: ``run=`` choices of the predictions: each row's own run where the fit saw it, else a new run
#: (``auto``); every row a new run of its configuration (``new``); every row the
#: configuration's average fitted run, no run shift at all (``configuration``).
RUN_MODES = ("auto", "new", "configuration")
CONFIGURATION = "configuration"


@dataclass(frozen=True)
class RunTable:
    """The fitted run and window shifts of a fit (log scale, with standard errors)."""

    runs: Mapping[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    windows: Mapping[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    n_runs: Mapping[str, int] = field(default_factory=dict)
    n_windows: Mapping[tuple[str, str], int] = field(default_factory=dict)

    @classmethod
    def from_dataset(cls, ds: xr.Dataset | None) -> RunTable:
        """From the ``run_*`` / ``window_*`` variables of a result's ``summaries`` group (an
        empty table when there are none)."""
        if ds is None or "run_label" not in ds:
            return cls()
        rc = ds["run_config"].values.astype(str)
        rl = ds["run_label"].values.astype(str)
        runs = {(c, r): (float(v), float(e)) for c, r, v, e in zip(
            rc, rl, ds["run_shift"].values, ds["run_shift_se"].values, strict=True)}
        n_runs: dict[str, int] = {}
        for c in rc:
            n_runs[c] = n_runs.get(c, 0) + 1
        windows: dict[tuple[str, str], tuple[float, float]] = {}
        n_windows: dict[tuple[str, str], int] = {}
        for j, w, v, e in zip(ds["window_run"].values, ds["window_label"].values.astype(str),
                              ds["window_shift"].values, ds["window_shift_se"].values, strict=True):
            c, r = rc[int(j)], rl[int(j)]
            windows[(c, w)] = (float(v), float(e))
            n_windows[(c, r)] = n_windows.get((c, r), 0) + 1
        return cls(runs=runs, windows=windows, n_runs=n_runs, n_windows=n_windows)


def _sigma_draws(post: xr.Dataset, name: str, S: int, rng: np.random.Generator) -> np.ndarray:
    """``S`` draws of ``sigma_<name>`` from the posterior (zeros when the fit has none)."""
    var = f"sigma_{name}"
    if var not in post:
        return np.zeros(S)
    v = np.asarray(post[var].values, dtype=float).ravel()
    return v[rng.integers(0, v.size, size=S)] if v.size else np.zeros(S)


def row_shifts(table: RunTable, post: xr.Dataset, observations: pd.DataFrame, S: int,
               seed: int = 0, run: str = "auto") -> tuple[np.ndarray, np.ndarray]:
    """``(S, n)`` log shift draws of the rows and each row's run status
    (:data:`FITTED_RUN`, :data:`NEW_RUN`, or :data:`CONFIGURATION` for ``run="configuration"``).

    Parameters
    ----------
    table
        The fit's :class:`RunTable`.
    post
        The posterior (``sigma_run``, ``sigma_window``).
    observations
        Rows with ``config_id`` and, when known, ``experiment_id`` / ``run_id``, ``kind`` and
        ``step_first``.
    S
        Draws.
    run
        One of :data:`RUN_MODES`.
    """
    if run not in RUN_MODES:
        raise ValueError(f"run must be one of {RUN_MODES}, got {run!r}")
    rng = np.random.default_rng([seed, 46])
    n = len(observations)
    out = np.zeros((S, n))
    if run == CONFIGURATION:
        return out, np.full(n, CONFIGURATION)
    status = np.full(n, NEW_RUN, dtype=object)
    s_run = _sigma_draws(post, "run", S, rng)
    s_win = _sigma_draws(post, "window", S, rng)
    cfg = observations["config_id"].astype(str).to_numpy()
    runs = run_keys(observations)
    wins = window_keys(observations, runs)
    for (c, r), idx in pd.DataFrame({"c": cfg, "r": runs}).groupby(["c", "r"], sort=False).indices.items():
        fitted = run == "auto" and r != "" and (c, r) in table.runs
        if fitted:
            v, se = table.runs[(c, r)]
            out[:, idx] += (v + se * rng.standard_normal(S))[:, None]
            status[idx] = FITTED_RUN
            m_fit = table.n_windows.get((c, r), 0)
        else:
            sd = np.sqrt(new_shift_var(s_run, table.n_runs.get(c, 0)))
            out[:, idx] += (sd * rng.standard_normal(S))[:, None]
            m_fit = 0
        w_of = wins[idx]
        for w in pd.unique(w_of[w_of != ""]):
            j = idx[w_of == w]
            if fitted and (c, w) in table.windows:
                v, se = table.windows[(c, w)]
                out[:, j] += (v + se * rng.standard_normal(S))[:, None]
            else:
                sd = np.sqrt(new_shift_var(s_win, m_fit))
                out[:, j] += (sd * rng.standard_normal(S))[:, None]
    return out, status.astype(str)


def fitted_log_shifts(table: RunTable | None, observations: pd.DataFrame) -> np.ndarray:
    """``(n,)`` log shift of each row at the fit's estimates: its run's, plus its window's,
    where the fit saw them; 0 for every other row (and for every row of a fit without run
    effects).

    Stage 1 profiles the shifts out at these estimates, so the row likelihood of the fitted
    coefficients is the Student-t around ``log(x . theta) + shift``: the pointwise
    log-likelihood, the replicated rows and the LOO-PIT of fitted rows use it.
    """
    out = np.zeros(len(observations))
    if table is None or not table.runs:
        return out
    cfg = observations["config_id"].astype(str).to_numpy()
    runs = run_keys(observations)
    wins = window_keys(observations, runs)
    for (c, r), idx in pd.DataFrame({"c": cfg, "r": runs}).groupby(["c", "r"], sort=False).indices.items():
        if not r or (c, r) not in table.runs:
            continue
        out[idx] = table.runs[(c, r)][0]
        w_of = wins[idx]
        for w in pd.unique(w_of[w_of != ""]):
            if (c, w) in table.windows:
                out[idx[w_of == w]] += table.windows[(c, w)][0]
    return out


def new_run_factor(table: RunTable, post: xr.Dataset, config: str, S: int,
                   seed: int = 0) -> np.ndarray:
    """``(S,)`` factors ``exp(v)`` of a new run of ``config``:
    ``v ~ N(0, sigma_run^2 (1 + 1/n))`` (``n`` fitted runs of the configuration; an unseen
    configuration ``sigma_run^2``)."""
    rng = np.random.default_rng([seed, 47])
    s_run = _sigma_draws(post, "run", S, rng)
    sd = np.sqrt(new_shift_var(s_run, table.n_runs.get(config, 0)))
    return np.exp(sd * rng.standard_normal(S))
