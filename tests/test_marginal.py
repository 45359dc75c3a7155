"""The closed-form configuration marginal (numba kernel) and the truncated conditional draws."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from bayes_latency.model.definition.hierarchy import truncated_normal_positive
from bayes_latency.model.definition.marginal import marginal_kernel


def _problem(seed: int, C: int = 3, K: int = 6) -> tuple[np.ndarray, ...]:
    """Random summaries: PSD information with a flat direction and a coefficient without data."""
    rng = np.random.default_rng(seed)
    m = rng.uniform(0.5, 2.0, size=(C, K))
    sig = rng.uniform(0.03, 0.3, size=K)
    th = m * rng.uniform(0.8, 1.2, size=(C, K))
    g = rng.normal(scale=0.5, size=(C, K))
    info = np.zeros((C, K, K))
    for c in range(C):
        B = rng.normal(size=(K - 1, K - 2)) * rng.uniform(1, 30)
        info[c, : K - 1, : K - 1] = B @ B.T  # rank K-2 on the first K-1: one flat direction
    g[:, K - 1] = 0.0  # the last coefficient has no information at all
    return m, sig, th, g, info


def _reference(m: np.ndarray, sig: np.ndarray, th: np.ndarray, g: np.ndarray,
               info: np.ndarray) -> float:
    """log of the Gaussian integral of exp(quadratic) against N(m, D), by the textbook formula."""
    total = 0.0
    for c in range(m.shape[0]):
        act = np.diag(info[c]) > 0
        info_c, gc, t, mc = info[c][np.ix_(act, act)], g[c, act], th[c, act], m[c, act]
        dvar = (mc * sig[act]) ** 2
        P = info_c + np.diag(1.0 / dvar)
        b = gc + info_c @ t + mc / dvar
        total += (0.5 * b @ np.linalg.solve(P, b) - gc @ t - 0.5 * t @ info_c @ t
                  - 0.5 * np.sum(mc**2 / dvar) - 0.5 * np.sum(np.log(dvar))
                  - 0.5 * np.linalg.slogdet(P)[1])
    return total


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kernel_value_matches_the_gaussian_integral(seed: int) -> None:
    m, sig, th, g, info = _problem(seed)
    val, _, _ = marginal_kernel(m, sig, th, g, info)
    assert float(val) == pytest.approx(_reference(m, sig, th, g, info), rel=1e-9, abs=1e-8)


@pytest.mark.parametrize("seed", [0, 3])
def test_kernel_gradient_matches_finite_differences(seed: int) -> None:
    m, sig, th, g, info = _problem(seed)
    _, dm, dsig = marginal_kernel(m, sig, th, g, info)
    h = 1e-6
    for c, k in [(0, 0), (1, 3), (2, 4), (0, 5)]:
        mp, mn = m.copy(), m.copy()
        mp[c, k] += h
        mn[c, k] -= h
        fd = (float(marginal_kernel(mp, sig, th, g, info)[0])
              - float(marginal_kernel(mn, sig, th, g, info)[0])) / (2 * h)
        assert dm[c, k] == pytest.approx(fd, rel=1e-5, abs=1e-5)
    for k in range(m.shape[1]):
        sp, sn = sig.copy(), sig.copy()
        sp[k] += h
        sn[k] -= h
        fd = (float(marginal_kernel(m, sp, th, g, info)[0])
              - float(marginal_kernel(m, sn, th, g, info)[0])) / (2 * h)
        assert dsig[k] == pytest.approx(fd, rel=1e-5, abs=1e-5)
    # a coefficient without information contributes nothing
    assert np.all(dm[:, -1] == 0.0) and dsig[-1] == 0.0


@pytest.mark.parametrize("mean,sd", [(1.0, 1.0), (-3.0, 1.0), (-300.0, 2.0), (5.0, 0.1), (0.0, 1.0)])
def test_truncated_normal_positive_matches_scipy(mean: float, sd: float) -> None:
    rng = np.random.default_rng(1)
    x = truncated_normal_positive(np.full(20_000, mean), np.full(20_000, sd), rng)
    assert np.all(x >= 0) and np.all(np.isfinite(x))
    ref = stats.truncnorm(-mean / sd, np.inf, loc=mean, scale=sd)
    assert stats.kstest(x, ref.cdf).pvalue > 1e-3
    assert x.mean() == pytest.approx(ref.mean(), rel=0.03)
