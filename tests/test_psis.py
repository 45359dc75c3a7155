"""The vectorised PSIS / LOO-PIT of ``checks/psis.py`` against ``arviz_stats.loo_pit``."""

import warnings

import numpy as np
import pytest
import xarray as xr

from bayes_latency.checks.psis import gpd_fit, loo_pit, psis_log_weights


def _student_rows(n_rows: int, S: int, seed: int) -> tuple[np.ndarray, ...]:
    """Predictive draws, observations and log-likelihoods of a Student-t location model."""
    rng = np.random.default_rng(seed)
    mu = rng.normal(0.0, 0.3, size=(S, 1)) + rng.normal(size=(1, n_rows))
    scale = rng.uniform(0.05, 0.5, size=n_rows)
    nu = rng.uniform(3, 30, size=n_rows)
    y = rng.normal(size=n_rows) + rng.standard_t(nu) * scale * 3  # some rows far in the tails
    z = (y[None, :] - mu) / scale
    from scipy import stats

    ll = stats.t.logpdf(z, nu) - np.log(scale)
    pred = mu + scale * rng.standard_t(np.broadcast_to(nu, mu.shape))
    return pred, y, ll


def _arviz_pit(pred: np.ndarray, y: np.ndarray, ll: np.ndarray, seed: int) -> np.ndarray:
    import arviz_stats as azs

    S = pred.shape[0]
    dims = ("chain", "draw", "obs")
    tree = xr.DataTree.from_dict({
        "posterior": xr.Dataset({"s": (("chain", "draw"), np.zeros((1, S)))}),
        "posterior_predictive": xr.Dataset({"y": (dims, pred[None])}),
        "log_likelihood": xr.Dataset({"y": (dims, ll[None])}),
        "observed_data": xr.Dataset({"y": (("obs",), y)}),
    })
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return azs.loo_pit(tree, var_names="y", random_state=seed)["y"].values


@pytest.mark.parametrize("S", [400, 200])
def test_loo_pit_matches_arviz(S):
    pred, y, ll = _student_rows(300, S, seed=S)
    ours = loo_pit(pred.T, y, ll.T, rng=3)
    ref = _arviz_pit(pred, y, ll, seed=3)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-12)


def test_log_weights_and_khat_match_arviz():
    import arviz_stats  # noqa: F401 - registers the .azstats accessor

    _, _, ll = _student_rows(50, 400, seed=1)
    lw, k = psis_log_weights(-ll.T)
    da = xr.DataArray(ll.T[:, None, :], dims=("obs", "chain", "draw"))
    ref_lw, ref_k = da.azstats.psislw(r_eff=1.0, dim=["chain", "draw"])
    np.testing.assert_allclose(lw, ref_lw.values[:, 0, :], rtol=0, atol=1e-10)
    np.testing.assert_allclose(k, ref_k.values, rtol=0, atol=1e-10)
    np.testing.assert_allclose(np.exp(lw).sum(axis=1), 1.0, rtol=1e-12)


def test_gpd_fit_degenerate_tail_is_nan():
    x = np.array([[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 2.0]])
    kappa, sigma = gpd_fit(x)
    assert np.isnan(kappa[0]) and np.isnan(sigma[0])


def test_constant_log_ratios_keep_uniform_weights():
    lw, k = psis_log_weights(np.zeros((2, 400)))
    np.testing.assert_allclose(np.exp(lw), 1 / 400)
    assert np.isnan(k).all()
