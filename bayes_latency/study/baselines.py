"""The study's baselines: BLIS's old blackbox step model (per-experiment linear least squares),
non-pooled NNLS on our basis, and BLIS's published ``trained-physics`` coefficients."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from bayes_latency.physics.basis import BLIS_BETA_ORDER, DEFAULT_TERMS
from bayes_latency.study.realdata import _xcols
from bayes_latency.study.settings import REAL_TERMS

#: BLIS's published ``trained-physics`` alpha (µs, µs, µs/token).
BLIS_ALPHA: tuple[float, ...] = (15563.199579, 777.3455, 45.907545)
#: BLIS's published ``trained-physics`` beta (iter29, ``defaults.yaml``), in BLIS's 11-slot order
#: (see ``BLIS_BETA_ORDER``; slot 10, β_EP, is slot 3's value, as BLIS sets it).
BLIS_BETA: tuple[float, ...] = (0.152128, 0.0, 1.36252915, 0.752037, 32.09546717, 4.41684444,
                                126.024825, 481.8613888, 0.0, 1.94710771, 0.752037)


# --------------------------------------------------------------------------------- baselines
def blackbox_design(prefill_tokens: np.ndarray, decode_tokens: np.ndarray) -> np.ndarray:
    """Features ``(1, prefill tokens, decode tokens)`` of BLIS's old blackbox step model."""
    p = np.asarray(prefill_tokens, dtype=float)
    return np.column_stack([np.ones_like(p), p, np.asarray(decode_tokens, dtype=float)])


def _relative_lstsq(A: np.ndarray, y: np.ndarray, nonneg: bool) -> np.ndarray:
    """Coefficients minimising ``sum(((A c - y) / y)^2)`` (optionally with ``c >= 0``).

    Columns are rescaled to unit norm before solving; all-zero columns get coefficient 0.
    """
    A = np.asarray(A, dtype=float)
    y = np.asarray(y, dtype=float)
    W = A / y[:, None]
    norm = np.linalg.norm(W, axis=0)
    live = norm > 0
    coef = np.zeros(A.shape[1])
    if not live.any():
        return coef
    Ws = W[:, live] / norm[live]
    if nonneg:
        c, _ = nnls(Ws, np.ones(len(y)), maxiter=50 * Ws.shape[1])
    else:
        c, *_ = np.linalg.lstsq(Ws, np.ones(len(y)), rcond=None)
    coef[live] = c / norm[live]
    return coef


def fit_blackbox(prefill_tokens: np.ndarray, decode_tokens: np.ndarray,
                 y: np.ndarray) -> np.ndarray:
    """Least squares (relative error) of ``y`` on ``(1, prefill tokens, decode tokens)``.

    Returns
    -------
    numpy.ndarray
        ``[intercept_us, us_per_prefill_token, us_per_decode_token]``.
    """
    return _relative_lstsq(blackbox_design(prefill_tokens, decode_tokens), y, nonneg=False)


def fit_nnls(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares (relative error) of ``y`` on basis features ``X``."""
    return _relative_lstsq(X, y, nonneg=True)


def blis_published_beta(terms: Sequence[str] = DEFAULT_TERMS) -> np.ndarray:
    """BLIS's published beta on ``terms`` through ``BLIS_BETA_ORDER`` (0 for a term with no slot).

    The default terms are BLIS's own basis functions (golden test against BLIS's ``StepTime``), so
    ``published_beta · basis(batch)`` is what BLIS itself simulates for that batch.
    """
    by_term = dict(zip(BLIS_BETA_ORDER, BLIS_BETA, strict=True))
    return np.array([by_term.get(t, 0.0) for t in terms], dtype=float)


def _band_from_residuals(pred_train: np.ndarray, y_train: np.ndarray,
                         pred_test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """90% band of a point predictor from the 5/95% quantiles of its training log-residuals."""
    r = np.log(y_train / np.maximum(pred_train, 1.0))
    q05, q95 = np.quantile(r, [0.05, 0.95]) if len(r) else (np.nan, np.nan)
    p = np.maximum(pred_test, 1.0)
    return p * np.exp(q05), p * np.exp(q95)


def baseline_predictions(train: pd.DataFrame, test: pd.DataFrame, method: str
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """Point prediction and 90% band of a baseline for the held-out rows.

    Parameters
    ----------
    train, test
        Observation rows (with ``prefill_tokens_step`` / ``decode_tokens_step``).
    method
        ``blackbox``, ``nnls`` or ``blis``.

    Returns
    -------
    (point, lo, hi, how)
        Arrays over the test rows and a short description of what was fitted.
    """
    y_tr = train["value_us"].to_numpy(float)
    if method == "blackbox":
        # per experiment; a held-out experiment has no data of its own -> pooled training fit
        def design(d: pd.DataFrame) -> np.ndarray:
            return blackbox_design(d["prefill_tokens_step"].to_numpy(float),
                                   d["decode_tokens_step"].to_numpy(float))

        own = set(train["experiment_id"])
        point = np.empty(len(test))
        lo, hi = np.empty(len(test)), np.empty(len(test))
        pooled = fit_blackbox(train["prefill_tokens_step"], train["decode_tokens_step"], y_tr)
        for eid, idx in test.groupby("experiment_id").indices.items():
            t = test.iloc[idx]
            if eid in own:  # not used by the study's splits, kept for completeness
                tr = train[train["experiment_id"] == eid]
                c = fit_blackbox(tr["prefill_tokens_step"], tr["decode_tokens_step"],
                                 tr["value_us"].to_numpy(float))
            else:
                tr, c = train, pooled
            point[idx] = design(t) @ c
            lo[idx], hi[idx] = _band_from_residuals(design(tr) @ c, tr["value_us"].to_numpy(float),
                                                    point[idx])
        return point, lo, hi, "pooled fit over the training experiments (held-out has no data)"
    if method == "nnls":
        xc = _xcols(REAL_TERMS)
        point = np.empty(len(test))
        lo, hi = np.empty(len(test)), np.empty(len(test))
        hows = set()
        for cfg, idx in test.groupby("config_id").indices.items():
            t = test.iloc[idx]
            tr = train[train["config_id"] == cfg]
            hows.add("same-configuration fit" if len(tr) else "fit on all training rows")
            if not len(tr):
                tr = train
            c = fit_nnls(tr[xc].to_numpy(float), tr["value_us"].to_numpy(float))
            point[idx] = t[xc].to_numpy(float) @ c
            lo[idx], hi[idx] = _band_from_residuals(tr[xc].to_numpy(float) @ c,
                                                    tr["value_us"].to_numpy(float), point[idx])
        return point, lo, hi, "; ".join(sorted(hows))
    if method == "blis":
        b = blis_published_beta(DEFAULT_TERMS)
        xc = _xcols(DEFAULT_TERMS)
        point = test[xc].to_numpy(float) @ b
        lo, hi = _band_from_residuals(train[xc].to_numpy(float) @ b, y_tr, point)
        return point, lo, hi, "published coefficients (band from training residuals)"
    raise ValueError(f"unknown baseline {method!r}")
