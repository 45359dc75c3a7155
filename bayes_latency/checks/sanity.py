"""Guards of ``check``: non-finite or absurd numbers are findings to report, never plotted.

A posterior fitted to nonsense data (or a damaged posterior file) can predict 1e290 µs or inf;
matplotlib then fails with "Axis limits cannot be NaN or Inf", and printing such means as plain
numbers hides that the fit is unusable. :func:`prediction_findings` and
:func:`coefficient_findings` return one line per problem; ``check`` writes them to
``findings.json``, skips the affected plots and exits 1.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["ABSURD_FACTOR", "coefficient_findings", "load_posterior", "prediction_findings"]

ABSURD_FACTOR = 1e6
"""A prediction more than this multiple of the observed value (or less than its inverse) is
absurd."""


def prediction_findings(label: str, observed: Any, predicted: Any) -> list[str]:
    """Findings about predictions of observed values (empty when all are finite and sane).

    Parameters
    ----------
    label
        What the rows are (e.g. ``"step rows"``), for the messages.
    observed
        Observed values, shape ``(n,)``.
    predicted
        Predictions of those values: shape ``(n,)`` (e.g. means) or ``(..., n)`` (draws).
    """
    obs = np.asarray(observed, dtype=float).ravel()
    pred = np.asarray(predicted, dtype=float)
    if pred.size == 0 or obs.size == 0:
        return []
    pred = pred.reshape(-1, obs.size) if pred.size % obs.size == 0 else pred.reshape(1, -1)
    out: list[str] = []
    finite = np.isfinite(pred)
    nonfinite = ~finite.all(axis=0)
    if nonfinite.any():
        out.append(f"{label}: {int(nonfinite.sum())} of {obs.size} predictions are not finite "
                   f"(NaN or inf): the posterior is unusable for these rows")
    if pred.shape[1] == obs.size:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns: reported above
            # np.median where every draw is finite (the same value; 0.15 against 1.4 CPU s on
            # the demo's 200 x 51,000 step draws), else the median of the finite draws
            centre = (np.median(pred, axis=0) if not nonfinite.any()
                      else np.nanmedian(np.where(finite, pred, np.nan), axis=0))
            ratio = centre / obs
        ok = np.isfinite(ratio) & (obs > 0)
        absurd = ok & ((ratio > ABSURD_FACTOR) | (ratio < 1.0 / ABSURD_FACTOR))
        if absurd.any():
            worst = float(np.max(np.abs(np.log10(ratio[absurd]))))
            out.append(f"{label}: {int(absurd.sum())} of {obs.size} predictions are absurd "
                       f"(off the observed value by more than {ABSURD_FACTOR:.0e}x, worst "
                       f"1e{worst:.0f}x): the fit does not describe these data")
    return out


def coefficient_findings(result: Any, var_names: Sequence[str] = ("beta", "alpha")) -> list[str]:
    """Findings about non-finite posterior coefficients of a fit's result DataTree."""
    out: list[str] = []
    try:
        post = result["posterior"]
    except (KeyError, TypeError):
        return out
    for v in var_names:
        if v not in post:
            continue
        vals = np.asarray(post[v].values, dtype=float)
        bad = ~np.isfinite(vals)
        if bad.any():
            out.append(f"posterior {v}: {int(bad.sum())} of {vals.size} values are not finite")
    return out


def load_posterior(path: Any, priors: Any = None) -> Any:
    """:meth:`LatencyModel.load`, with any failure to read the file as a one-line error.

    Raises
    ------
    BayesLatencyError
        Naming the file, for a file that is not a readable posterior of this package (missing
        or malformed attributes, wrong layout).
    """
    from bayes_latency.errors import BayesLatencyError
    from bayes_latency.model.estimator import LatencyModel

    try:
        if priors is None:  # the default priors (or whatever load embeds)
            return LatencyModel.load(path)
        return LatencyModel.load(path, priors=priors)
    except BayesLatencyError:
        raise
    except Exception as exc:  # noqa: BLE001 - a damaged file must not end in a traceback
        msg = " ".join(str(exc).split())[:200]
        raise BayesLatencyError(f"{path}: not a readable posterior of this package "
                                f"({type(exc).__name__}: {msg})") from exc
