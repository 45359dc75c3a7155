"""The real-data study: baselines on synthetic data, and a quick end-to-end run on the real data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bayes_latency.physics.basis import BLIS_BETA_ORDER, DEFAULT_TERMS
from bayes_latency.study import real as study


def _synthetic(n: int = 300, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = np.column_stack([rng.uniform(0, 5000, n), rng.uniform(0, 200, n),
                         rng.choice([40.0, 80.0], n), np.ones(n), np.zeros(n)])
    beta = np.array([1.3, 2.1, 25.0, 900.0, 0.0])
    return X, beta


def test_nnls_recovers_known_coefficients() -> None:
    X, beta = _synthetic()
    y = X @ beta
    np.testing.assert_allclose(study.fit_nnls(X, y), beta, rtol=1e-6, atol=1e-6)
    # small multiplicative noise: still close, and never negative
    rng = np.random.default_rng(1)
    c = study.fit_nnls(X, y * np.exp(rng.normal(0, 0.01, len(y))))
    assert (c >= 0).all()
    np.testing.assert_allclose(c[:4], beta[:4], rtol=0.05)
    assert c[4] == 0.0  # all-zero feature column


def test_nnls_clips_at_zero() -> None:
    X, _ = _synthetic()
    y = X[:, 0] * 2.0 + 3000.0 - X[:, 1] * 5.0  # a negative slope NNLS must not take
    y = np.maximum(y, 100.0)
    c = study.fit_nnls(X[:, [0, 1, 3]], y)
    assert (c >= 0).all() and c[1] == 0.0


def test_blackbox_recovers_linear_model() -> None:
    rng = np.random.default_rng(2)
    p, d = rng.uniform(0, 2048, 200), rng.uniform(1, 128, 200)
    y = 8000.0 + 3.5 * p + 60.0 * d
    np.testing.assert_allclose(study.fit_blackbox(p, d, y), [8000.0, 3.5, 60.0], rtol=1e-8)


def test_blis_mapping_follows_blis_beta_order() -> None:
    b = dict(zip(DEFAULT_TERMS, study.blis_published_beta(), strict=True))
    for slot, term in enumerate(BLIS_BETA_ORDER):
        assert b[term] == study.BLIS_BETA[slot]
    assert b["moe_dispatch"] == 0.0  # no BLIS slot
    assert b["per_step"] == pytest.approx(126.024825)


def test_baselines_on_split_and_metrics() -> None:
    """Baselines predict held-out rows of a synthetic two-configuration table."""
    rng = np.random.default_rng(3)
    rows = []
    for cfg, scale in (("a|H100|tp1", 1.0), ("b|H100|tp2", 1.5)):
        for i in range(40):
            x = np.zeros(len(DEFAULT_TERMS))
            pre, dec = rng.uniform(0, 1000), rng.uniform(1, 64)
            x[0], x[3], x[8] = pre * 0.5, dec * 20.0, 1.0
            rows.append({"obs_id": f"{cfg}/{i}", "config_id": cfg, "experiment_id": cfg,
                         "prefill_tokens_step": pre, "decode_tokens_step": dec,
                         "value_us": scale * (x[0] * 1.2 + x[3] * 1.5 + 500.0)
                         * np.exp(rng.normal(0.0, 0.01)),
                         **{f"x_{t}": v for t, v in zip(DEFAULT_TERMS, x, strict=True)}})
    df = pd.DataFrame(rows)
    train = pd.concat([df[df["config_id"] == "a|H100|tp1"], df.iloc[40:60]])
    test = df.iloc[60:].reset_index(drop=True)
    pt, lo, hi, how = study.baseline_predictions(train, test, "nnls")
    assert how == "same-configuration fit"
    m = study.error_metrics(test["value_us"].to_numpy(), pt, lo, hi)
    assert m["n"] == 20 and m["mdape_pct"] < 3.0 and m["coverage90"] >= 0.5
    for meth in ("blackbox", "blis"):
        pt, lo, hi, _ = study.baseline_predictions(train, test, meth)
        assert np.isfinite(pt).all() and (lo <= hi).all()


def test_main_without_data_returns_zero(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(study, "real_data_dir", lambda: None)
    assert study.main(tmp_path / "out", quick=True) == 0
    assert "real data not found" in capsys.readouterr().out
    assert not (tmp_path / "out").exists()


@pytest.mark.real
@pytest.mark.slow
def test_quick_study_on_real_data(tmp_path: Path) -> None:
    if study.real_data_dir() is None:
        pytest.skip("../shared/data/real is absent")
    assert study.main(tmp_path, quick=True) == 0
    for f in ("README.md", "coefficients.csv", "convergence.csv", "cv.csv", "workload.csv",
              "insample.csv", "forest.png", "heldout_observed_vs_predicted.png", "cv_mdape.png"):
        assert (tmp_path / f).is_file(), f
    coefs = pd.read_csv(tmp_path / "coefficients.csv")
    assert np.isfinite(coefs[["mean", "q05", "q95"]].to_numpy()).all()
    cv = pd.read_csv(tmp_path / "cv.csv")
    assert set(cv["method"]) == set(study.METHODS)
    assert cv["split"].nunique() == 2
    assert np.isfinite(cv[["mdape_pct", "coverage90"]].to_numpy()).all()
    conv = pd.read_csv(tmp_path / "convergence.csv")
    assert len(conv) == 3 and np.isfinite(conv[["max_rhat", "min_ess_bulk"]].to_numpy()).all()
    wl = pd.read_csv(tmp_path / "workload.csv")
    assert len(wl) and np.isfinite(wl["decode_interval_ms"]).all()
    assert "bayes-latency study real" in (tmp_path / "README.md").read_text()
