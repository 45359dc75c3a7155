"""The rows a fit is made on and their feature columns.

:func:`fit_rows` keeps the observation rows the model fits (roles beta / alpha / workload,
positive finite values, valid non-zero features) and counts the others in an
:class:`~bayes_latency.data.report.IngestReport`; :func:`feature_columns` names the ``x_<coef>``
columns of a set of coefficients.

Importing this module is light (NumPy and pandas only).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from bayes_latency.data.report import IngestReport
from bayes_latency.model.definition.likelihood import FIT_ROLES


def feature_columns(coefs: tuple[str, ...] | list[str]) -> list[str]:
    """Names of the feature columns ``x_<coef>`` of the observation table."""
    return [f"x_{c}" for c in coefs]


def fit_rows(observations: pd.DataFrame, report: IngestReport | None = None,
             coefs: tuple[str, ...] | list[str] | None = None) -> pd.DataFrame:
    """The rows the model fits: role beta or alpha, positive finite value, non-zero features.

    Features are the ``x_<coef>`` columns of ``coefs`` (default: every ``x_`` column), so a row
    whose only non-zero features belong to terms left out of a fit is dropped, with its count.
    Other rows are left out with a counted reason in ``report`` (never silently).
    """
    report = report if report is not None else IngestReport(source="fit rows")
    if "role" not in observations:
        raise ValueError("observation table has no 'role' column")
    rows = observations[observations["role"].isin(FIT_ROLES)]
    report.read["observations"] += len(observations)
    report.dropped["role_not_fitted"] += len(observations) - len(rows)
    v = rows["value_us"].to_numpy(dtype=float)
    bad = ~np.isfinite(v) | (v <= 0)
    if bad.any():
        report.drop("nonpositive_or_nan_value", int(bad.sum()))
    xcols = feature_columns(coefs) if coefs is not None else [c for c in rows.columns if c.startswith("x_")]
    X = rows[xcols].to_numpy(dtype=float)
    badx = ~np.isfinite(X).all(axis=1) | (X < 0).any(axis=1) | (X.sum(axis=1) <= 0)
    badx &= ~bad
    if badx.any():
        report.drop("invalid_or_zero_features", int(badx.sum()))
    kept = rows[~bad & ~badx]
    report.kept["fit_rows"] += len(kept)
    return kept
