"""Hints of failing convergence gates: chains that sit in separate modes are named with each
chain's median, so a user can see which mode is physical."""

from __future__ import annotations

import re

import numpy as np
import xarray as xr

from bayes_latency.model.inference.convergence import (
    SPLIT_RHAT,
    chain_disagreement,
    convergence,
    gate_stats,
)


def _posterior(split: float) -> xr.Dataset:
    """Two chains of 500 draws; ``beta[b, per_step]`` has chain means 1 and 1 + ``split``, the
    rest mixes (the same distribution in both chains)."""
    rng = np.random.default_rng(0)
    beta = 1.0 + 0.01 * rng.standard_normal((2, 500, 2, 2))
    beta[1, :, 1, 1] += split
    alpha = 30.0 + 0.3 * rng.standard_normal((2, 500, 2, 1))
    return xr.Dataset(
        {"beta": (("chain", "draw", "config", "term"), beta),
         "alpha": (("chain", "draw", "config", "alpha_term"), alpha)},
        coords={"config": ["a", "b"], "term": ["weight_loading", "per_step"],
                "alpha_term": ["alpha_per_token"]})


def test_separate_modes_are_named_with_each_chains_median():
    post = _posterior(split=9.0)
    _, rhat, _ = gate_stats(post, 0)
    hints = chain_disagreement(post, rhat)
    assert len(hints) == 1
    num = r"([0-9]+(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?)"
    m = re.search(rf"beta\[b, per_step\] \(R-hat [0-9.]+, chain medians {num} / {num}\)",
                  hints[0])
    assert m, hints[0]
    np.testing.assert_allclose([float(m[1]), float(m[2])], [1.0, 10.0], atol=0.01)
    assert "beta[a" not in hints[0] and "alpha[" not in hints[0]  # only what disagrees


def test_slow_mixing_is_not_called_separate_modes():
    post = _posterior(split=0.002)  # R-hat above 1.01 (a failing gate) but below SPLIT_RHAT
    stats, rhat, _ = gate_stats(post, 0)
    assert 1.0 < stats["max_rhat"] < SPLIT_RHAT
    assert chain_disagreement(post, rhat) == []


def test_a_failing_fit_carries_the_hint_and_a_passing_one_none():
    bad = xr.DataTree.from_dict({"posterior": _posterior(split=9.0)})
    conv = convergence(bad)
    assert not conv["passed"] and any("the chains disagree most on" in h for h in conv["hints"])
    good = xr.DataTree.from_dict({"posterior": _posterior(split=0.0)})
    assert convergence(good, gates={"min_ess_bulk": 100})["hints"] == []
