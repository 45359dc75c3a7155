"""Runs and stretches of a run: the levels of the run effects.

A run (one server process under one workload, an ``experiment_id`` or a client result's
``run_id``) sits off its configuration's coefficients by a factor common to all its rows, and a
stretch of a run (a window of :data:`WINDOW_STEPS` consecutive engine steps) off its run by
another one:

    log E[y_i] = log(x_i . theta_c) + v_run[r(i)] + v_window[w(i)]
    v_run ~ N(0, sigma_run^2),  v_window ~ N(0, sigma_window^2)

Stage 1 (:mod:`bayes_latency.model.definition.summaries`) estimates the shifts of a
configuration's runs under a sum-zero constraint (``theta_c`` is then the configuration's average
run; a configuration with one run has no run parameter) and those of a run's windows under a
sum-zero constraint within the run, in orthonormal contrast coordinates (:func:`contrast_basis`),
and profiles them out of the coefficients' information like the noise. Stage 2
(:mod:`bayes_latency.model.definition.hierarchy`) fits ``sigma_run`` and ``sigma_window`` from the
contrasts of every configuration: with ``v ~ N(0, sigma^2 I)`` the orthonormal contrasts are
``N(0, sigma^2 I)``, observed with the stage-1 covariance (:func:`contrast_loglik`).

Predictions (:mod:`bayes_latency.model.posterior.predict`) tell a fitted run (its estimated shift)
from a new run of the configuration, whose shift relative to the fitted average of ``n`` runs is
``N(0, sigma_run^2 (1 + 1/n))``; a new stretch of a fitted run likewise
``N(0, sigma_window^2 (1 + 1/m))`` for a run of ``m`` fitted windows.

Runs of fewer than :data:`MIN_RUN_ROWS` rows (a client result's few means) share one shift. Rows
without a step index (benchmark means, client means, per-request host rows) belong to their
run and to no window. Pure NumPy and pandas.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.linalg import helmert

#: Whether fits estimate the within-run (window) effect. Off: on the real runs' within-run
#: splits it left the held-out bands where they were and the point errors slightly worse
#: (windows of 2,000 steps, ``sigma_window`` 0.005: ``blocks`` 90% coverage 0.900 -> 0.900,
#: MdAPE 1.18% -> 1.34%; ``later third`` 0.799 -> 0.785, MdAPE 1.83% -> 1.92%): what the later
#: third misses is a wider step scatter under the heavier load (5-95% of its residuals -7.5% to
#: +12.7% against a fitted band of +-2.7%), not a shift of a stretch.
WINDOWS = False
#: Engine steps per window of the within-run effect: steps ``[k W, (k+1) W)`` of a run form window
#: ``k`` (absolute step indices, so rows held out of a fit find the window their neighbours fitted).
WINDOW_STEPS = 2000
#: Fewest rows of a run that gets a shift of its own; a configuration's smaller runs share one
#: (one level of the sum-zero contrasts). A client result gives a run two to four means (TTFT and
#: E2E of its stages). Measured on the real client fit (``study client``, seed 0): with a shift
#: per client run, stage 1 gave some runs a standard error of 0 (no positive curvature) and the
#: fit failed its gates (the departure pair bimodal: ``alpha_post_decode`` chain medians 849 and
#: 350,576 us, R-hat 1.79); with the small runs sharing one shift it passes (6,000 draws) and its
#: in-sample BLIS errors are those of the fit without run effects (E2E 0.4%, worst 3.6%).
#: Tried and not kept: the client runs' contrasts as data on ``sigma_run`` alone (a flat pass
#: with a shift for every run of 2 rows, the fit's shifts as here). ``sigma_run`` fell from
#: 0.034 (90%: 0.006-0.080) to 0.012-0.017 (8 contrasts instead of 2), and one traced run held out
#: (``benchmarks/heldout_runs.py``), Llama-2-70B's iterations as a new run went from 0.894 of
#: them inside the 90% band at width 13.4% to 0.841 at 10.1%: a client run's mean sits off the
#: others less than a traced run's steps sit off the configuration. Without CodeLlama-34B's traced
#: run the calibration then ended with 8 client means still moving, predicting its steps 1.8x
#: too fast (0.955 inside before).
MIN_RUN_ROWS = 10
#: Fewest rows of a window that gets a shift of its own (the rows of smaller windows belong to
#: their run only). One or two heavy-tailed rows fit their window's shift exactly, and the
#: curvature at that fit (a Student-t's at its mode) understates the shift's variance: with
#: every window kept, the real runs' blocks split (every third block of 25 iterations held out,
#: leaving windows of 1-5 rows) put ``sigma_window`` at 0.019 against 0.005 on all the rows.
MIN_WINDOW_ROWS = 10
#: Most runs of one configuration that get shifts of their own: stage 1 holds a dense
#: ``rows x (runs - 1)`` matrix and a Hessian of that many more parameters. A configuration of
#: more runs fits them as one (no shifts; the fit's notes say so: :func:`too_many_runs`).
MAX_RUNS = 64
#: Bound of a log shift in stage 1 (a factor e^2 either way).
SHIFT_BOUND = 2.0
#: The effect levels, in the order of the contrast coordinates.
LEVELS = ("run", "window")
#: Kinds whose rows carry engine step indices (``step_first``) and so belong to a window.
STEP_KINDS = frozenset({"iteration", "step_window"})
#: Half-normal prior scales of ``sigma_run`` and ``sigma_window`` (log scale). Repeated runs of
#: one serving configuration differ by a few percent (client means of the real runs: in-sample
#: residual RMS 2.6% of E2E; the Splitwise repetitions of a point 0.1-2%); the prior puts 95% of
#: its mass below 10% (runs) and 6% (windows).
SIGMA_PRIOR = {"run": 0.05, "window": 0.03}


def run_keys(rows: pd.DataFrame) -> np.ndarray:
    """The run of each row: ``run_id`` where the table has one (client stages of one run), else
    ``experiment_id`` (one experiment folder is one run); ``""`` when neither is known."""
    n = len(rows)
    out = np.full(n, "", dtype=object)
    if "experiment_id" in rows.columns:
        e = rows["experiment_id"]
        out = np.where(e.notna(), e.astype(str), out)
    if "run_id" in rows.columns:
        r = rows["run_id"]
        ok = (r.notna() & (r.astype(str) != "")).to_numpy()
        out = np.where(ok, r.astype(str), out)
    return out.astype(str)


def window_keys(rows: pd.DataFrame, runs: np.ndarray | None = None) -> np.ndarray:
    """The window of each row, ``"<run>#w<k>"`` with ``k = step_first // WINDOW_STEPS``, or
    ``""`` for rows of no window (kinds other than :data:`STEP_KINDS`, no step index, no run)."""
    runs = run_keys(rows) if runs is None else runs
    out = np.full(len(rows), "", dtype=object)
    if "step_first" not in rows.columns or "kind" not in rows.columns:
        return out.astype(str)
    step = pd.to_numeric(rows["step_first"], errors="coerce").to_numpy(dtype=float)
    ok = (rows["kind"].isin(STEP_KINDS).to_numpy() & np.isfinite(step) & (step >= 0)
          & (runs != ""))
    k = np.floor(np.where(ok, step, 0.0) / WINDOW_STEPS).astype(np.int64)
    out[ok] = [f"{r}#w{int(w)}" for r, w in zip(runs[ok], k[ok], strict=True)]
    return out.astype(str)


def contrast_basis(n: int) -> np.ndarray:
    """``(n, n-1)`` orthonormal basis of the sum-zero vectors of length ``n`` (Helmert)."""
    if n < 2:
        return np.zeros((n, 0))
    return helmert(n, full=False).T


@dataclass(frozen=True)
class ShiftDesign:
    """The run and window shifts of one configuration's rows in contrast coordinates.

    Attributes
    ----------
    runs, windows
        The runs and windows (sorted), with ``window_run`` the run of each window.
    R
        ``(n_rows, n_contrasts)``: row ``i``'s log shift is ``R[i] @ w``.
    B
        ``(n_runs + n_windows, n_contrasts)``: the runs' and windows' shifts are ``B @ w``
        (runs that share a shift have equal rows).
    contrast_level
        ``(n_contrasts,)``: 0 for a run contrast, 1 for a window contrast (:data:`LEVELS`).
    """

    runs: tuple[str, ...]
    windows: tuple[str, ...]
    window_run: tuple[str, ...]
    R: np.ndarray
    B: np.ndarray
    contrast_level: np.ndarray

    @property
    def n_contrasts(self) -> int:
        """Number of contrast coordinates."""
        return int(self.R.shape[1])


def shift_design(rows: pd.DataFrame, windows: bool = WINDOWS) -> ShiftDesign:
    """The :class:`ShiftDesign` of one configuration's rows: sum-zero run shifts over the
    configuration's runs of at least :data:`MIN_RUN_ROWS` rows and one shift shared by its other
    runs, sum-zero window shifts over each run's windows of at least :data:`MIN_WINDOW_ROWS`
    rows (``windows=False``: none)."""
    runs_i = run_keys(rows)
    wins_i = window_keys(rows, runs_i) if windows else np.full(len(rows), "", dtype=str)
    labels, counts = np.unique(wins_i, return_counts=True)
    small = set(labels[counts < MIN_WINDOW_ROWS])
    if small:
        wins_i = np.where(np.isin(wins_i, list(small)), "", wins_i)
    runs = tuple(sorted(set(runs_i)))
    if len(runs) > MAX_RUNS:  # the runs share the configuration's coefficients: no shifts
        return ShiftDesign(runs=runs, windows=(), window_run=(), R=np.zeros((len(rows), 0)),
                           B=np.zeros((len(runs), 0)), contrast_level=np.zeros(0, dtype=int))
    win_levels = sorted(set(wins_i) - {""})
    window_run = tuple(w.rsplit("#w", 1)[0] for w in win_levels)
    n_lev = len(runs) + len(win_levels)
    blocks: list[np.ndarray] = []  # (n_lev, n_c) columns per parent
    level: list[int] = []
    # runs of at least MIN_RUN_ROWS rows have a shift each; the others share one
    counts = pd.Series(runs_i).value_counts()
    own = [r for r in runs if counts[r] >= MIN_RUN_ROWS]
    shared = len(own) < len(runs)
    run_level = np.asarray([own.index(r) if r in own else len(own) for r in runs], dtype=int)
    Bcols = contrast_basis(len(own) + int(shared))
    if Bcols.shape[1]:
        b = np.zeros((n_lev, Bcols.shape[1]))
        b[:len(runs)] = Bcols[run_level]
        blocks.append(b)
        level += [0] * Bcols.shape[1]
    for r in runs:
        idx = [j for j, wr in enumerate(window_run) if wr == r]
        Bw = contrast_basis(len(idx))
        if Bw.shape[1]:
            b = np.zeros((n_lev, Bw.shape[1]))
            b[len(runs) + np.asarray(idx)] = Bw
            blocks.append(b)
            level += [1] * Bw.shape[1]
    B = np.concatenate(blocks, axis=1) if blocks else np.zeros((n_lev, 0))
    # a row's shift: its run's, plus its window's if it has one
    run_pos = {r: j for j, r in enumerate(runs)}
    R = B[np.asarray([run_pos[r] for r in runs_i], dtype=np.int64)]
    has = wins_i != ""
    if has.any():
        win_pos = {w: len(runs) + j for j, w in enumerate(win_levels)}
        R[has] += B[np.asarray([win_pos[w] for w in wins_i[has]], dtype=np.int64)]
    return ShiftDesign(runs=runs, windows=tuple(win_levels), window_run=window_run, R=R,
                       B=B, contrast_level=np.asarray(level, dtype=int))


def too_many_runs(rows: pd.DataFrame) -> str:
    """One line naming the configurations of ``rows`` with more than :data:`MAX_RUNS` runs
    (empty when there are none)."""
    runs = pd.Series(run_keys(rows), index=rows.index)
    n = runs.groupby(rows["config_id"].astype(str)).nunique()
    big = n[n > MAX_RUNS]
    if big.empty:
        return ""
    return (f"{len(big)} configuration(s) with more than {MAX_RUNS} runs fit their runs as one "
            "(no run shifts): " + ", ".join(f"{c} ({k} runs)" for c, k in big.items()))


def new_shift_var(sigma: np.ndarray | float, n_fitted: int) -> np.ndarray | float:
    """Variance of a new level's log shift about the fitted average of ``n_fitted`` levels:
    ``sigma^2 (1 + 1/n_fitted)`` (``sigma^2`` when none was fitted)."""
    s2 = np.square(sigma)
    return s2 * (1.0 + 1.0 / n_fitted) if n_fitted > 0 else s2


def contrast_arrays(contrasts: list[tuple[np.ndarray, np.ndarray, np.ndarray]]
                    ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per level, the contrasts of every configuration rotated to their covariance's eigenbasis:
    ``(z, lam)`` with ``z_j ~ N(0, sigma_level^2 + lam_j)`` (the blocks of a level are rotated
    separately; the small covariance between a configuration's run and window contrasts is left
    out). ``contrasts``: ``(w, C, level)`` per configuration."""
    out: dict[str, tuple[list, list]] = {lv: ([], []) for lv in LEVELS}
    for w, C, level in contrasts:
        for i, lv in enumerate(LEVELS):
            m = np.asarray(level) == i
            if not m.any():
                continue
            lam, V = np.linalg.eigh(np.asarray(C)[np.ix_(m, m)])
            out[lv][0].append(V.T @ np.asarray(w)[m])
            out[lv][1].append(np.clip(lam, 0.0, None))
    return {lv: (np.concatenate(z) if z else np.zeros(0), np.concatenate(la) if la else np.zeros(0))
            for lv, (z, la) in out.items()}


def contrast_loglik(z: np.ndarray, lam: np.ndarray, sigma: float) -> float:
    """``sum_j log N(z_j; 0, sigma^2 + lam_j)`` (the stage-2 term of one level, in NumPy; the
    model's own is :func:`bayes_latency.model.definition.hierarchy.run_scales`)."""
    v = sigma**2 + lam
    return float(-0.5 * np.sum(z * z / v + np.log(2 * np.pi * v)))
