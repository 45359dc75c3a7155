"""The best the default terms can do on a Splitwise cell's prefill, with every point known.

A one-shot fit sees one point of a cell; this module asks what the basis itself allows: over
all non-negative coefficient vectors ``b`` of the terms, the lowest median absolute relative
error ``|x_i . b / y_i - 1|`` of the cell's prefill rows (``y_i`` the measured time, ``x_i`` the
row's features). It is exact: the median of ``n`` errors is the ``m = n // 2 + 1``-th smallest
(``n`` odd; for even ``n`` an upper bound of ``np.median``), and that is at most ``t`` exactly
when some ``m`` rows all have error ``<= t``; so the bound is the smallest, over every subset
of ``m`` rows, of the subset's minimax error, one linear program each
(:func:`least_median_relative_error`). A least-median fit ignores the other half of the
points, which no estimator that weighs every point does, so a fit of all points lands above it.

BLIS uses one coefficient vector for a configuration's prefill and decode, so the second
bound (:func:`basis_bounds`, ``with_decode``) adds the constraint that the same ``b`` keeps the
cell's decode rows within a mean absolute relative error (default 5%, the decode goal).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import combinations
from math import comb
from typing import Any

import numpy as np
import pandas as pd

#: The most row subsets :func:`least_median_relative_error` solves (a cell of 13 prefill rows
#: has 1,716).
MAX_SUBSETS = 20_000


def _minimax(a: np.ndarray, y: np.ndarray, a_fix: np.ndarray | None, y_fix: np.ndarray | None,
             fix_mean: float | None) -> tuple[float, np.ndarray]:
    """The smallest ``t`` with ``|a b / y - 1| <= t`` on every row for some ``b >= 0`` (and,
    with ``a_fix``, ``mean |a_fix b / y_fix - 1| <= fix_mean``); ``inf`` when infeasible."""
    from scipy.optimize import linprog

    r = a / y[:, None]
    k, n = a.shape[1], len(y)
    nf = 0 if a_fix is None else len(y_fix)
    scale = np.abs(r).max(axis=0)
    if a_fix is not None:
        scale = np.maximum(scale, np.abs(a_fix / y_fix[:, None]).max(axis=0))
    scale[scale == 0] = 1.0
    r = r / scale
    blocks = [np.c_[r, -np.ones(n), np.zeros((n, nf))], np.c_[-r, -np.ones(n), np.zeros((n, nf))]]
    rhs = [np.ones(n), -np.ones(n)]
    if a_fix is not None:
        f = (a_fix / y_fix[:, None]) / scale
        blocks += [np.c_[f, np.zeros(nf), -np.eye(nf)], np.c_[-f, np.zeros(nf), -np.eye(nf)],
                   np.r_[np.zeros(k + 1), np.full(nf, 1.0 / nf)][None, :]]
        rhs += [np.ones(nf), -np.ones(nf), [float(fix_mean)]]
    res = linprog(np.r_[np.zeros(k), 1.0, np.zeros(nf)], A_ub=np.vstack(blocks),
                  b_ub=np.concatenate(rhs), bounds=[(0, None)] * (k + 1 + nf), method="highs")
    if res.status != 0:
        return float("inf"), np.full(k, np.nan)
    return float(res.fun), res.x[:k] / scale


def least_median_relative_error(a: np.ndarray, y: np.ndarray, *, a_fix: np.ndarray | None = None,
                                y_fix: np.ndarray | None = None, fix_mean: float | None = None,
                                max_subsets: int = MAX_SUBSETS) -> tuple[float, np.ndarray]:
    """The lowest median ``|a b / y - 1|`` over ``b >= 0``, and a ``b`` reaching it.

    Parameters
    ----------
    a, y
        Features ``(n, k)`` and measured times ``(n,)`` (``y > 0``).
    a_fix, y_fix, fix_mean
        Rows every candidate ``b`` must also predict within a mean absolute relative error of
        ``fix_mean`` (none by default).
    max_subsets
        Refuse (``ValueError``) when the ``C(n, n // 2 + 1)`` subsets are more than this.

    Returns
    -------
    tuple
        The error (a fraction; ``inf`` when no ``b`` meets the ``fix`` constraint) and ``b``.
    """
    a, y = np.asarray(a, float), np.asarray(y, float)
    if a.ndim != 2 or a.shape[0] != y.shape[0] or not len(y) or np.any(~(y > 0)):
        raise ValueError("least_median_relative_error: a is (n, k), y (n,) with every y > 0")
    if (a_fix is None) != (y_fix is None) or (a_fix is not None) != (fix_mean is not None):
        raise ValueError("least_median_relative_error: give a_fix, y_fix and fix_mean together")
    n = len(y)
    m = n // 2 + 1
    if comb(n, m) > max_subsets:
        raise ValueError(f"least_median_relative_error: {comb(n, m)} subsets of {m} of {n} rows "
                         f"(more than {max_subsets})")
    af = None if a_fix is None else np.asarray(a_fix, float)
    yf = None if y_fix is None else np.asarray(y_fix, float)
    best, coef = float("inf"), np.full(a.shape[1], np.nan)
    for rows in combinations(range(n), m):
        idx = list(rows)
        t, b = _minimax(a[idx], y[idx], af, yf, fix_mean)
        if t < best:
            best, coef = t, b
    return best, coef


def basis_bounds(obs: pd.DataFrame, cells: list[str], terms: tuple[str, ...],
                 decode_mean: float = 0.05) -> pd.DataFrame:
    """Per cell, the exact least-median prefill error (%) of the terms ``terms`` over the cell's
    benchmark rows in ``obs`` (``kind == "benchmark_mean"``, ``phase`` prefill / decode):
    ``prefill_alone_pct`` (any ``b >= 0``) and ``with_decode_pct`` (a ``b`` that also keeps the
    cell's decode rows within a mean absolute relative error of ``decode_mean``), and the median
    relative error of the decode rows at that ``b`` (``decode_mdape_pct``)."""
    cols = [f"x_{t}" for t in terms]
    out = []
    for cell in cells:
        g = obs[(obs["config_id"].astype(str) == cell) & (obs["kind"] == "benchmark_mean")]
        a = g[cols].to_numpy(float)
        a = a[:, np.abs(a).sum(axis=0) > 0]
        y = g["value_us"].to_numpy(float)
        pf = (g["phase"] == "prefill").to_numpy()
        alone, _ = least_median_relative_error(a[pf], y[pf])
        joint, b = least_median_relative_error(a[pf], y[pf], a_fix=a[~pf], y_fix=y[~pf],
                                               fix_mean=decode_mean)
        dec = (float(np.median(np.abs(a[~pf] @ b / y[~pf] - 1))) if np.isfinite(joint)
               else float("nan"))
        out.append({"cell": cell, "prefill_rows": int(pf.sum()), "decode_rows": int((~pf).sum()),
                    "prefill_alone_pct": 100 * alone, "with_decode_pct": 100 * joint,
                    "decode_mdape_pct": 100 * dec})
    return pd.DataFrame(out)


def bound_table(bounds: list[dict[str, Any]], scores: pd.DataFrame) -> pd.DataFrame:
    """The cells' bounds (:func:`basis_bounds`) beside their fits' prefill MdAPE in ``scores``
    (the few-shot cells' score table): ``in_sample_pct`` (the whole fleet's fit, every point
    of the cell in it; NaN without that fit), ``one_shot_median_pct`` (median over the cell's
    one-shot population fits) and ``zero_shot_pct``."""
    t = pd.DataFrame(bounds)
    if t.empty:
        return t
    pf = scores[scores["phase"] == "prefill"]
    by = {s: pf[pf["setting"] == s].groupby("cell")["mdape_pct"].median()
          for s in ("in-sample", "one-shot population", "zero-shot")}
    return t.assign(in_sample_pct=t["cell"].map(by["in-sample"]),
                    one_shot_median_pct=t["cell"].map(by["one-shot population"]),
                    zero_shot_pct=t["cell"].map(by["zero-shot"]))


def bound_lines(bounds: pd.DataFrame, goal_prefill: float, goal_decode: float) -> list[str]:
    """A goal line: what the default terms allow of the prefill with every point known, against
    the prefill goal ``goal_prefill`` (%) (``bounds`` from :func:`bound_table`)."""
    if bounds.empty:
        return []
    j = bounds["with_decode_pct"]
    one = bounds["one_shot_median_pct"]
    ins = bounds["in_sample_pct"].dropna()
    fitted = (f"; a fit that weighs every point does not come near them: the whole fleet's "
              f"fit, every point of every cell in it, has prefill MdAPE {ins.min():.1f}-"
              f"{ins.max():.1f}% per cell (median {ins.median():.1f}%; "
              f"{int((ins <= goal_prefill).sum())} of {len(ins)} within {goal_prefill:.0f}%), "
              if len(ins) else "; ")
    return [f"- with every point of a cell known, coefficients of the terms exist whose "
            f"prefill MdAPE is {bounds['prefill_alone_pct'].min():.1f}-"
            f"{bounds['prefill_alone_pct'].max():.1f}% (least median over the prefill rows "
            f"alone), and {j.min():.1f}-{j.max():.1f}% (median {j.median():.1f}%) when the same "
            f"coefficients keep the decode rows within a mean error of {goal_decode:.0f}%"
            + fitted + f"the one-shot fits' median per cell {one.min():.1f}-{one.max():.1f}% "
            "(\"What the terms can represent of the prefill\" below)."]


def bound_markdown(bounds: pd.DataFrame, goal_decode: float, label: Callable[[str], str],
                   table: Callable[[pd.DataFrame], str]) -> list[str]:
    """The report's paragraph and table of the bounds (``label`` names a cell, ``table``
    renders a markdown table)."""
    if bounds.empty:
        return []
    bt = bounds.assign(cell=bounds["cell"].map(label))
    for c in ("prefill_alone_pct", "with_decode_pct", "decode_mdape_pct", "in_sample_pct",
              "one_shot_median_pct", "zero_shot_pct"):
        bt[c] = bt[c].map(lambda v: "n/a" if not np.isfinite(float(v)) else f"{float(v):.1f}")
    return ["With every point of the cell known: `prefill_alone_pct`, the lowest MdAPE of the "
            "cell's prefill rows over every non-negative coefficient vector of the terms "
            "(exact: the smallest, over every half of the rows plus one, of the largest relative "
            "error a linear program can hold them to; `benchmarks/fewshot_cells_bound.py`); "
            "`with_decode_pct`, the same when the coefficients must also keep the cell's decode "
            f"rows within a mean absolute relative error of {goal_decode:.0f}% (BLIS uses one "
            "vector for both), `decode_mdape_pct` the decode rows' MdAPE there; beside them the "
            "fits' prefill MdAPE: `in_sample_pct` (the whole fleet's fit, every point of the "
            "cell in it), `one_shot_median_pct` (median over the cell's one-shot population "
            "fits) and `zero_shot_pct`. A least-median fit leaves half the points "
            "out of account, which a fit that weighs every point does not: these are floors, "
            "not values a fit reaches.", "", table(bt), ""]
