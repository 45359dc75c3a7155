"""Diagnostics gates on hand-built posteriors (no fit needed)."""

from __future__ import annotations

import argparse
import json
import sys
import types

import numpy as np
import pytest
import xarray as xr

from bayes_latency.checks.diagnostics import (
    Thresholds,
    compare_variants,
    diagnose,
    log_likelihood_tree,
)
from bayes_latency.cli.check import check_command
from bayes_latency.errors import BayesLatencyError

CONFIGS = ["llama-2-7b|H100|tp1", "llama-2-70b|H100|tp4", "mixtral-8x7b|A100|tp2"]
TERMS = ["prefill_compute", "decode_kv", "per_step"]
ALPHA = ["alpha_arrival", "alpha_post_decode", "alpha_per_token"]


def make_result(chains: int = 2, draws: int = 1000, shift: float = 0.0, divergences: int = 0,
                approximate: bool = False, loglik: bool = True, nutpie: bool = False,
                saturated: float = 0.0, ll_scale: float = 1.0, seed: int = 0) -> xr.DataTree:
    """A posterior DataTree shaped like the model's, with iid (well mixed) draws.

    ``shift`` moves the last chain's beta by that many posterior sds (non-convergence).
    """
    rng = np.random.default_rng(seed)
    beta = rng.normal(1.0, 0.05, size=(chains, draws, len(CONFIGS), len(TERMS)))
    beta[-1] += shift * 0.05
    alpha = rng.normal(50.0, 1.0, size=(chains, draws, len(CONFIGS), len(ALPHA)))
    mu = rng.normal(size=(chains, draws, len(TERMS) + len(ALPHA)))
    post = xr.Dataset(
        {"beta": (("chain", "draw", "config", "term"), beta),
         "alpha": (("chain", "draw", "config", "alpha_term"), alpha),
         "mu": (("chain", "draw", "coef"), mu)},
        coords={"chain": np.arange(chains), "draw": np.arange(draws), "config": CONFIGS,
                "term": TERMS, "alpha_term": ALPHA, "coef": TERMS + ALPHA})
    div = np.zeros((chains, draws), bool)
    div.ravel()[rng.choice(div.size, divergences, replace=False)] = True
    sat = np.zeros((chains, draws), bool)
    sat.ravel()[: int(saturated * sat.size)] = True
    stats = {"diverging": (("chain", "draw"), div),
             "energy": (("chain", "draw"), rng.normal(size=(chains, draws))),
             ("depth" if nutpie else "tree_depth"): (("chain", "draw"), np.full((chains, draws), 4)),
             ("maxdepth_reached" if nutpie else "reached_max_treedepth"): (("chain", "draw"), sat)}
    groups = {"posterior": post, "sample_stats": xr.Dataset(stats, coords=post[["chain", "draw"]].coords)}
    if loglik:
        y = rng.normal(size=60)
        m = rng.normal(0.0, ll_scale / np.sqrt(60), size=(chains, draws, 1))
        ll = -0.5 * (y[None, None, :] - m) ** 2 / ll_scale**2 - np.log(ll_scale)
        # named like the model's: variable `obs` over a dim `obs` -> xarray makes it a coordinate
        groups["log_likelihood"] = xr.Dataset({"obs": (("chain", "draw", "obs"), ll)})
    dt = xr.DataTree.from_dict(groups)
    dt.attrs = {"method": "full", "sampler": "nutpie", "approximate": "true" if approximate else "false",
                "model_version": "1", "priors_hash": "abc", "data_hash": "def",
                "bayes_latency_version": "0.1.0"}
    return dt


def gate(report, name):
    return next(g for g in report.gates if g.name == name)


def test_good_fit_passes():
    rep = diagnose(make_result())
    assert rep.passed, rep.failures
    assert rep.failures == []
    assert {g.status for g in rep.gates} <= {"pass"}
    assert set(rep.table.index) == {"beta", "alpha", "mu"}
    assert rep.table["rhat_max"].max() < 1.01
    assert rep.table["ess_bulk_min"].min() > 400
    assert len(rep.cells) == len(CONFIGS) * (len(TERMS) + len(ALPHA))
    assert rep.loo is not None and rep.loo["n_obs"] == 60 and rep.loo["n_k_high"] == 0
    assert rep.sampler["divergences"] == 0 and len(rep.sampler["ebfmi"]) == 2
    json.dumps(rep.to_dict())
    md = rep.to_markdown()
    assert "PASSED" in md and "APPROXIMATE" not in md


def test_chains_at_different_means_fail_rhat():
    rep = diagnose(make_result(shift=3.0))
    assert not rep.passed
    assert gate(rep, "R-hat").status == "fail"
    assert any("R-hat" in f and "beta" in f for f in rep.failures)
    # the failing cells are named (config, term)
    assert "beta[" in next(f for f in rep.failures if f.startswith("R-hat"))
    assert (rep.cells.query("variable == 'beta'")["rhat"] > 1.01).all()
    assert rep.table.loc["alpha", "rhat_max"] < 1.01


def test_divergences_fail():
    rep = diagnose(make_result(divergences=3))
    assert not rep.passed
    assert gate(rep, "divergences").status == "fail"
    assert any("3 divergent" in f for f in rep.failures)


def test_treedepth_saturation_nutpie_names():
    rep = diagnose(make_result(nutpie=True, saturated=0.05))
    assert gate(rep, "tree depth saturation").status == "fail"
    assert rep.sampler["treedepth_share"] == pytest.approx(0.05)
    assert diagnose(make_result(nutpie=True)).passed


def test_low_ess_fails():
    rep = diagnose(make_result(draws=150))
    assert gate(rep, "ESS bulk").status == "fail"
    assert not rep.passed
    lenient = Thresholds(max_rhat=1.05, min_ess_bulk=100, min_ess_tail=100)
    assert diagnose(make_result(draws=150), lenient).passed


def test_approximate_is_loud_and_skips_rhat_ess():
    rep = diagnose(make_result(shift=3.0, approximate=True))
    md = rep.to_markdown()
    assert rep.approximate and "APPROXIMATE" in md
    for name in ("R-hat", "ESS bulk", "ESS tail"):
        assert gate(rep, name).status == "n/a (approximate)"
    assert rep.passed
    assert rep.to_dict()["approximate"] is True


def test_missing_groups_are_not_available():
    dt = make_result(loglik=False)
    del dt["sample_stats"]
    rep = diagnose(dt)
    assert rep.loo is None
    assert gate(rep, "Pareto-k").status == "n/a"
    assert gate(rep, "divergences").status == "n/a"
    assert rep.passed


def test_no_posterior_raises():
    with pytest.raises(BayesLatencyError):
        diagnose(xr.DataTree())


def test_log_likelihood_coordinate_is_recovered():
    tree = log_likelihood_tree(make_result())
    assert tree is not None
    assert list(tree["log_likelihood"].data_vars) == ["obs"]
    assert tree["log_likelihood"]["obs"].dims == ("chain", "draw", "obs_idx")


def test_compare_variants_ranks_better_model_first():
    good = make_result(seed=1)
    bad = make_result(seed=1, ll_scale=3.0)
    table = compare_variants({"full": good, "complete_pooling": bad})
    assert list(table.index) == ["full", "complete_pooling"]
    assert table.loc["full", "elpd"] > table.loc["complete_pooling", "elpd"]
    with pytest.raises(BayesLatencyError):
        compare_variants({"full": good, "x": make_result(loglik=False)})


def _fake_estimator(monkeypatch, result):
    class FakeModel:
        def __init__(self):
            self.result = result

        @classmethod
        def load(cls, path):
            return cls()

    mod = types.ModuleType("bayes_latency.model.estimator")
    mod.LatencyModel = FakeModel
    monkeypatch.setitem(sys.modules, "bayes_latency.model.estimator", mod)


@pytest.mark.parametrize("shift,code", [(0.0, 0), (3.0, 1)])
def test_check_command_exit_code(monkeypatch, tmp_path, capsys, shift, code):
    _fake_estimator(monkeypatch, make_result(shift=shift))
    args = argparse.Namespace(posterior=str(tmp_path / "p.nc"), tables=None, out=str(tmp_path / "o"))
    assert check_command(args) == code
    assert "Posterior diagnostics" in capsys.readouterr().out
    assert json.loads((tmp_path / "o" / "diagnostics.json").read_text())["passed"] == (code == 0)
    assert (tmp_path / "o" / "diagnostics.md").read_text().startswith("# Posterior diagnostics")
