"""The least-median bound of the unseen-cells benchmark: exact on cases worked by hand, its
constraint and input errors, the per-cell table and its place in the report."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from benchmark_module import load_benchmark

fc = load_benchmark("fewshot_cells")
bound = load_benchmark("fewshot_cells_bound")

#: Tolerance of the linear programs' optimum (HiGHS' default feasibility tolerance is 1e-7).
TOL = 1e-6


def test_one_coefficient_case_worked_by_hand():
    # y = b for three rows measuring 1, 2 and 4: a median of 3 errors is the 2nd smallest; the
    # best pair is (1, 2) at b = 4/3 or (2, 4) at b = 8/3, both with error 1/3 (pair (1, 4):
    # b = 1.6, error 0.6)
    err, b = bound.least_median_relative_error(np.ones((3, 1)), np.array([1.0, 2.0, 4.0]))
    assert err == pytest.approx(1 / 3, abs=TOL)
    assert b[0] == pytest.approx(4 / 3, abs=1e-4) or b[0] == pytest.approx(8 / 3, abs=1e-4)


def test_half_the_rows_exact_gives_zero_whatever_the_others_do():
    rng = np.random.default_rng(3)
    a = rng.uniform(1, 10, size=(13, 3))
    truth = np.array([0.5, 2.0, 1.0])
    y = a @ truth
    y[:6] *= rng.uniform(1.5, 3.0, size=6)  # 6 of 13 rows far off: 7 still exact
    err, b = bound.least_median_relative_error(a, y)
    assert err == pytest.approx(0.0, abs=TOL)
    assert np.median(np.abs(a @ b / y - 1)) == pytest.approx(0.0, abs=1e-5)
    # a bound is a floor: any other coefficient vector does no better
    assert np.median(np.abs(a @ (truth * 1.01) / y - 1)) >= err


def test_the_fixed_rows_constraint_raises_the_bound_or_makes_it_infeasible():
    a, y = np.ones((3, 1)), np.array([1.0, 2.0, 4.0])
    # the fixed row holds b in [9.5, 10.5]: the best pair is (2, 4) at b = 9.5, where the row
    # measuring 2 is off by 9.5 / 2 - 1 = 3.75
    err, _ = bound.least_median_relative_error(a, y, a_fix=np.ones((1, 1)),
                                               y_fix=np.array([10.0]), fix_mean=0.05)
    assert err == pytest.approx(9.5 / 2 - 1, abs=TOL)
    # a second feature free for the fixed row lets b meet both
    a2 = np.c_[np.ones(3), np.zeros(3)]
    err2, _ = bound.least_median_relative_error(a2, y, a_fix=np.array([[0.0, 1.0]]),
                                                y_fix=np.array([10.0]), fix_mean=0.05)
    assert err2 == pytest.approx(1 / 3, abs=TOL)
    # rows that no b >= 0 predicts (a zero feature row against a positive time)
    err3, b3 = bound.least_median_relative_error(a, y, a_fix=np.zeros((1, 1)),
                                                 y_fix=np.array([5.0]), fix_mean=0.05)
    assert err3 == np.inf and np.isnan(b3).all()


@pytest.mark.parametrize("kwargs, match", [
    ({"a": np.ones((3, 1)), "y": np.array([1.0, 0.0, 2.0])}, "every y > 0"),
    ({"a": np.ones((3, 1)), "y": np.array([1.0, np.nan, 2.0])}, "every y > 0"),
    ({"a": np.ones((2, 1)), "y": np.array([1.0, 2.0, 3.0])}, "every y > 0"),
    ({"a": np.ones((3, 1)), "y": np.ones(3), "a_fix": np.ones((1, 1))}, "together"),
    ({"a": np.ones((30, 1)), "y": np.ones(30), "max_subsets": 1000}, "subsets"),
])
def test_bad_input_is_refused_with_what_is_wrong(kwargs, match):
    with pytest.raises(ValueError, match=match):
        bound.least_median_relative_error(**kwargs)


def _cell_rows(cell: str, prefill: np.ndarray, decode: np.ndarray) -> pd.DataFrame:
    """A cell's benchmark rows with two features: x_t1 on prefill rows, x_t2 on decode rows."""
    rows = [{"config_id": cell, "kind": "benchmark_mean", "phase": "prefill", "x_t1": 1.0,
             "x_t2": 0.0, "value_us": v} for v in prefill]
    rows += [{"config_id": cell, "kind": "benchmark_mean", "phase": "decode", "x_t1": 0.0,
              "x_t2": 1.0, "value_us": v} for v in decode]
    return pd.DataFrame(rows)


def test_basis_bounds_per_cell_and_in_the_report():
    obs = pd.concat([
        _cell_rows("a|A100|tp2|splitwise", np.array([1.0, 2.0, 4.0]), np.array([5.0, 5.0])),
        _cell_rows("b|H100|tp4|splitwise", np.array([3.0, 3.0, 9.0]), np.array([2.0, 2.2])),
        pd.DataFrame([{"config_id": "a|A100|tp2|splitwise", "kind": "iteration",
                       "phase": "prefill", "x_t1": 1.0, "x_t2": 0.0, "value_us": 100.0}]),
    ], ignore_index=True)
    t = bound.basis_bounds(obs, ["a|A100|tp2|splitwise", "b|H100|tp4|splitwise"], ("t1", "t2"))
    assert t["prefill_rows"].tolist() == [3, 3] and t["decode_rows"].tolist() == [2, 2]
    assert t["prefill_alone_pct"].to_numpy() == pytest.approx([100 / 3, 0.0], abs=1e-4)
    # separate features for the two phases: the decode constraint costs the prefill nothing
    assert t["with_decode_pct"].to_numpy() == pytest.approx([100 / 3, 0.0], abs=1e-4)
    assert t["decode_mdape_pct"].iloc[0] == pytest.approx(0.0, abs=1e-4)

    scores = pd.DataFrame([
        {"cell": "a|A100|tp2|splitwise", "setting": s, "phase": "prefill", "mdape_pct": v}
        for s, v in (("one-shot population", 12.0), ("one-shot population", 20.0),
                     ("zero-shot", 30.0), ("in-sample", 14.0))])
    scores = pd.concat([scores, pd.DataFrame([{"cell": "b|H100|tp4|splitwise", "phase": "prefill",
                                               "setting": "in-sample", "mdape_pct": 8.0}])])
    bt = bound.bound_table(t.to_dict(orient="records"), scores)
    assert bt["one_shot_median_pct"].iloc[0] == pytest.approx(16.0)
    assert bt["zero_shot_pct"].iloc[0] == pytest.approx(30.0)
    assert bt["in_sample_pct"].tolist() == pytest.approx([14.0, 8.0])
    assert np.isnan(bt["one_shot_median_pct"].iloc[1])
    line = bound.bound_lines(bt, 10.0, 5.0)[0]
    assert "0.0-33.3%" in line and "8.0-14.0% per cell" in line and "1 of 2 within 10%" in line
    # without the whole fleet's fit the line says nothing of it
    no_fit = bound.bound_lines(bt.assign(in_sample_pct=np.nan), 10.0, 5.0)[0]
    assert "whole fleet" not in no_fit and "one-shot fits' median" in no_fit
    md = "\n".join(bound.bound_markdown(bt, 5.0, fc.cell_label, lambda d: d.to_csv(index=False)))
    assert "a A100 tp2 splitwise" in md and "n/a" in md
