"""The real-data study: baselines on synthetic data, and a quick end-to-end run on the real data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bayes_latency.physics.basis import ALPHA_TERMS, BLIS_BETA_ORDER, DEFAULT_TERMS
from bayes_latency.study import real as study
from bayes_latency.study.markdown import _cfg_label
from bayes_latency.study.realdata import _SPLIT_SPECS
from bayes_latency.study.workload import _obs_rows_for_batches


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
    assert b["moe_dispatch"] == 0.752037  # slot 10, β_EP (BLIS: slot 3's value)
    assert b["per_step"] == pytest.approx(126.024825)
    assert b["decode_kv"] == pytest.approx(1.94710771) and b["decode_compute"] == 0.0


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


def test_real_terms_and_settings() -> None:
    """The study fits the 6 terms the real data identify best, at target_accept 0.99 (0.995 for
    the H100-only fits, measured to pass the gates with 4 of 4 seeds)."""
    assert study.REAL_TERMS == ("prefill_compute", "decode_kv", "weight_loading", "per_layer",
                                "per_request", "per_step")
    assert set(study.REAL_TERMS) <= set(DEFAULT_TERMS)
    assert not {"decode_compute", "tp_allreduce"} & set(study.REAL_TERMS)
    for s in (study.FULL, study.FULL_CV, study.QUICK):
        assert s.target_accept == 0.99
    assert study.FULL_H100.target_accept == 0.995
    assert study.QUICK.draws <= 200 and study.FULL.draws >= 1000


def _term_rows(n: int, seed: int = 4) -> pd.DataFrame:
    """Rows of one configuration with every x_ column; decode_compute is pure noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        x = dict.fromkeys(DEFAULT_TERMS, 0.0)
        pre, dec = rng.uniform(0, 1000), rng.uniform(1, 64)
        x.update(prefill_compute=pre * 0.5, decode_kv=dec * rng.uniform(5.0, 40.0), per_request=dec,
                 per_step=1.0, per_layer=80.0, weight_loading=5000.0,
                 decode_compute=rng.uniform(0, 1e4))
        y = 1.2 * x["prefill_compute"] + 1.5 * x["decode_kv"] + 30.0 * dec + 500.0 + 6000.0
        rows.append({"obs_id": f"r{i}", "config_id": "a|H100|tp1", "experiment_id": "e",
                     "model": "a", "gpu": "H100", "tp": 1, "kind": "iteration", "role": "beta",
                     "n_steps": 1, "prefill_tokens_step": pre, "decode_tokens_step": dec,
                     "value_us": y, **{f"x_{t}": v for t, v in x.items()},
                     **{f"x_{t}": 0.0 for t in ALPHA_TERMS}})
    return pd.DataFrame(rows)


def test_nnls_baseline_uses_real_terms_only() -> None:
    """Changing a feature outside REAL_TERMS does not change the NNLS baseline."""
    df = _term_rows(60)
    train, test = df.iloc[:40], df.iloc[40:].reset_index(drop=True)
    pt, *_ = study.baseline_predictions(train, test, "nnls")
    train2 = train.assign(x_decode_compute=0.0, x_tp_allreduce=123.0)
    pt2, *_ = study.baseline_predictions(train2, test.assign(x_decode_compute=7.0), "nnls")
    np.testing.assert_allclose(pt, pt2)
    np.testing.assert_allclose(pt, test["value_us"], rtol=1e-6)


def test_identifiability_table_flags_constant_terms() -> None:
    df = _term_rows(30)
    t, every = study.identifiability_table(df)
    assert list(t.columns) == ["term_set", "config_id", "n_active", "rank", "flat_groups"]
    assert len(t) == 2 and t["config_id"].eq("a|H100|tp1").all()
    real = t[t["term_set"].str.startswith("REAL_TERMS")].iloc[0]
    assert real["n_active"] == 6 and real["rank"] == 4  # 3 constant terms -> 2 flat directions
    assert "per_layer+per_step+weight_loading" in real["flat_groups"]
    lab = real["term_set"]
    assert ["per_layer", "per_step", "weight_loading"] in every[lab]
    default = t[t["term_set"].str.startswith("default")].iloc[0]
    assert default["n_active"] == 7 and default["rank"] == 5


def test_cfg_labels_and_workload_rows_carry_the_stack() -> None:
    assert _cfg_label("llama-2-70b", "H100-SXM", 4) == "llama-2-70b H100 tp4"
    assert _cfg_label("llama-2-70b", "H100-SXM", 4, "splitwise") == \
        "llama-2-70b H100 tp4 splitwise"
    from bayes_latency.physics.hardware import load_gpu
    from bayes_latency.physics.models import load_architecture

    batches = pd.DataFrame([{"num_prefill_reqs": 1.0, "prefill_tokens": 16.0,
                             "prefill_attn_pairs": 200.0, "prefill_kv_tokens": 40.0,
                             "num_decode_reqs": 8.0, "decode_tokens": 8.0,
                             "decode_ctx_tokens": 4000.0}])
    rows = _obs_rows_for_batches(batches, load_architecture("llama-2-70b"),
                                       load_gpu("H100"), study.h100_serving(4), "t")
    assert rows["stack"].iloc[0] == "vllm"
    assert rows["config_id"].iloc[0] == "llama-2-70b|H100-SXM|tp4"


def test_define_splits_notes_name_the_stack() -> None:
    notes = {spec[0]: spec[-1] for spec in _SPLIT_SPECS}
    assert "other stack" in notes["run llama-2-70b H100 tp4"]
    assert "other stack" in notes["bench llama-2-70b H100 tp4"]


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
    for f in ("README.md", "coefficients.csv", "coefficients_h100.csv", "identifiability.csv",
              "convergence.csv", "cv.csv", "workload.csv", "insample.csv", "forest.png",
              "heldout_observed_vs_predicted.png", "cv_mdape.png"):
        assert (tmp_path / f).is_file(), f
    coefs = pd.read_csv(tmp_path / "coefficients.csv")
    assert np.isfinite(coefs[["mean", "q05", "q95"]].to_numpy()).all()
    assert set(coefs.loc[coefs["block"] == "beta", "coef"]) == set(study.REAL_TERMS)
    assert (coefs["config_id"].str.endswith("|splitwise") == (coefs["stack"] == "splitwise")).all()
    h100 = pd.read_csv(tmp_path / "coefficients_h100.csv")
    assert set(h100["config_id"]) == {"llama-2-70b|H100-SXM|tp4", "codellama-34b|H100-SXM|tp2"}
    assert set(h100["coef"]) == set(study.REAL_TERMS) and (h100["block"] == "beta").all()
    assert np.isfinite(h100[["mean", "q05", "q95"]].to_numpy()).all()
    ident = pd.read_csv(tmp_path / "identifiability.csv")
    assert ident["term_set"].nunique() == 2 and ident["config_id"].nunique() == 8
    cv = pd.read_csv(tmp_path / "cv.csv")
    assert set(cv["method"]) == set(study.METHODS)
    assert cv["split"].nunique() == 2
    assert np.isfinite(cv[["mdape_pct", "coverage90"]].to_numpy()).all()
    conv = pd.read_csv(tmp_path / "convergence.csv")
    assert len(conv) == 5 and np.isfinite(conv[["max_rhat", "min_ess_bulk"]].to_numpy()).all()
    assert list(conv["fit"][:3]) == ["all data", study.H100_FIT, study.H100_FIT_DEFAULT]
    wl = pd.read_csv(tmp_path / "workload.csv")
    assert len(wl) and np.isfinite(wl["decode_interval_ms"]).all()
    readme = (tmp_path / "README.md").read_text()
    assert "bayes-latency study real" in readme
    for head in ("## Identifiability", "## Fit on the real H100 iterations only",
                 "## Convergence of every fit", "## Cross-validation"):
        assert head in readme, head
    assert "no level for the stack" not in readme
