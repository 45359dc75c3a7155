"""The fit path's speed measures: deterministics after sampling, Numba's LLVM level while compiling."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest
import xarray as xr

from bayes_latency.model import sampler
from bayes_latency.model.deterministics import _with_deterministics
from bayes_latency.model.sampler import _numba_opt


def _model() -> pm.Model:
    with pm.Model(coords={"coef": ["a", "b", "c"], "config": ["x", "y"]}) as model:
        z = pm.Normal("z", 0.0, 1.0, dims="coef")
        s = pm.HalfNormal("s", 1.0)
        idx = np.array([0, 2])
        pm.Deterministic("theta", pt.exp(z[None, :] * s + np.arange(2.0)[:, None]), dims=("config", "coef"))
        pm.Deterministic("picked", z[idx] + s, dims="config")
        pm.Deterministic("fixed", pt.as_tensor_variable(np.full(3, 0.5)), dims="coef")
    return model


def test_deterministics_after_sampling_match_pymc():
    model = _model()
    rng = np.random.default_rng(0)
    C, D = 2, 7
    post = xr.Dataset({"z": (("chain", "draw", "coef"), rng.normal(size=(C, D, 3))),
                       "s": (("chain", "draw"), rng.uniform(0.5, 2.0, size=(C, D)))},
                      coords={"chain": [0, 1], "draw": np.arange(D), "coef": ["a", "b", "c"]})
    out = _with_deterministics(model, post)
    ref = pm.compute_deterministics(post, model=model, progressbar=False,
                                     compile_kwargs={"mode": "FAST_COMPILE"})
    for v in ("theta", "picked", "fixed"):
        assert out[v].dims == ("chain", "draw", *model.named_vars_to_dims[v])
        np.testing.assert_allclose(out[v].values, ref[v].transpose(*out[v].dims).values, rtol=1e-12)
    assert list(out["config"].values) == ["x", "y"]  # coordinates of dims no free variable has
    np.testing.assert_array_equal(out["z"].values, post["z"].values)


def test_numba_opt_is_scoped_and_yields_to_the_environment(monkeypatch):
    from numba.core import config

    before = int(config.OPT)
    monkeypatch.delenv("NUMBA_OPT", raising=False)
    with _numba_opt(sampler.NUMBA_OPT):
        assert int(config.OPT) == sampler.NUMBA_OPT
    assert int(config.OPT) == before
    monkeypatch.setenv("NUMBA_OPT", "2")
    with _numba_opt(0):
        assert int(config.OPT) == before
    with pytest.raises(RuntimeError), _numba_opt(0):
        raise RuntimeError
    assert int(config.OPT) == before
