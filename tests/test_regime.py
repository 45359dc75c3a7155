"""The regime term set: compute knees on top of BLIS's additive basis, their priors, and their
projection onto BLIS's basis at a workload's operating point (``export --workload``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from bayes_latency.cli.fit import parse_terms
from bayes_latency.errors import BayesLatencyError
from bayes_latency.export.projection import KNEE_TERMS, project_onto_blis
from bayes_latency.physics.basis import (
    DEFAULT_TERMS,
    INGEST_TERMS,
    KNEES,
    REGIME_TERMS,
    TERM_SETS,
    TERMS,
    basis_matrix,
)

CFG = ("llama-2-70b", "H100", 4)


def _batches(n: int = 400, seed: int = 0) -> pd.DataFrame:
    """Prefill-only, decode-only and mixed steps, from tiny to far past the knees."""
    rng = np.random.default_rng(seed)
    p = np.where(rng.random(n) < 0.6, rng.integers(0, 16_384, n), 0).astype(float)
    d = rng.integers(0, 256, n).astype(float)
    d[:3], p[:3] = 0.0, [0.0, 64.0, 16_000.0]  # an empty step, a small and a large prefill
    ctx = d * rng.integers(100, 4000, n)
    return pd.DataFrame({
        "num_prefill_reqs": np.minimum(p, 1.0) * rng.integers(1, 8, n), "prefill_tokens": p,
        "prefill_attn_pairs": p * (p + 1) / 2, "prefill_kv_tokens": p,
        "num_decode_reqs": d, "decode_tokens": d, "decode_ctx_tokens": ctx + d})


def _features(terms=REGIME_TERMS) -> np.ndarray:
    from bayes_latency.physics.serving import ServingConfig

    return basis_matrix(_batches(), CFG[0], CFG[1], ServingConfig(tp=CFG[2]), terms)


def test_knee_features_are_the_compute_past_k_times_the_weight_read():
    X = _features()
    col = {t: X[:, REGIME_TERMS.index(t)] for t in REGIME_TERMS}
    C = col["prefill_compute"] + col["decode_compute"]
    for k, name in zip(KNEES, KNEE_TERMS, strict=True):
        np.testing.assert_allclose(col[name], np.maximum(C - k * col["weight_loading"], 0.0),
                                   rtol=1e-12, atol=0.0)
    assert col["compute_over_2w"][0] == 0.0 and col["compute_over_6w"][0] == 0.0  # empty step
    assert col["compute_over_2w"][1] == 0.0  # 64 prompt tokens: under the weight read
    assert col["compute_over_6w"][2] > 0.0   # 16,000: past both knees
    assert (col["compute_over_2w"] >= col["compute_over_6w"]).all()
    assert not TERMS["compute_over_2w"].exportable and TERMS["compute_over_2w"].blis_index is None


def test_the_additive_basis_is_the_regime_basis_with_knees_at_zero():
    X = _features()
    beta = np.array([0.5, 1.0, 0.5, 1.4, 1.5, 15.0, 30.0, 4.0, 120.0, 0.0, 0.0])
    additive = _features(DEFAULT_TERMS) @ beta
    np.testing.assert_allclose(X @ np.concatenate([beta, [0.0, 0.0]]), additive, rtol=1e-12)
    # a knee coefficient only ever adds time, and only past its knee
    bent = X @ np.concatenate([beta, [0.7, 0.3]])
    assert (bent >= additive).all() and (bent > additive).any()


def test_term_sets_by_name():
    assert parse_terms("regime") == REGIME_TERMS == TERM_SETS["regime"]
    assert parse_terms("blis") == DEFAULT_TERMS
    assert parse_terms("prefill_compute,per_step") == ("prefill_compute", "per_step")
    assert REGIME_TERMS[:len(DEFAULT_TERMS)] == DEFAULT_TERMS
    assert set(REGIME_TERMS) <= set(INGEST_TERMS)


def test_the_default_priors_hold_the_knees():
    from bayes_latency.priors import load_priors

    pri = load_priors(None, terms=REGIME_TERMS)
    for t in KNEE_TERMS:
        assert pri.prior_median(t) == pytest.approx(0.3)
        mu, sd = pri.log_mean_sd(t, "H100-SXM")
        assert sd == pytest.approx(1.2) and mu == pytest.approx(np.log(0.3))
        assert "extra term" in pri.term(t, "H100-SXM")["rationale"]


# ------------------------------------------------------------------------------ projection
def _coefs(B: np.ndarray, terms=REGIME_TERMS) -> xr.Dataset:
    S = B.shape[0]
    return xr.Dataset(
        {"beta": (("sample", "term"), B.astype(np.float32)),
         "alpha": (("sample", "alpha_term"), np.full((S, 3), 1000.0, np.float32))},
        coords={"term": list(terms),
                "alpha_term": ["alpha_arrival", "alpha_post_decode", "alpha_per_token"]},
        attrs={"model": CFG[0]})


def _draws(S: int = 50, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = np.array([0.5, 1.0, 0.5, 1.4, 1.5, 15.0, 30.0, 4.0, 120.0, 0.0, 0.0, 0.6, 0.4])
    return base * np.exp(0.1 * rng.standard_normal((S, len(base))))


def test_projection_is_the_least_squares_shift_of_prefill_compute_per_draw():
    X, B = _features(), _draws()
    p = project_onto_blis(_coefs(B), X, REGIME_TERMS, workload="w")
    assert [str(t) for t in p.coefs["term"].values] == list(DEFAULT_TERMS)
    pc = REGIME_TERMS.index("prefill_compute")
    knee = [REGIME_TERMS.index(t) for t in KNEE_TERMS]
    for s in (0, 17, 49):  # each draw: argmin_d || d x_pc - X_knees b_knees ||
        d, *_ = np.linalg.lstsq(X[:, [pc]], X[:, knee] @ B[s, knee], rcond=None)
        assert float(p.coefs["beta"].values[s, pc]) == pytest.approx(B[s, pc] + d[0], rel=1e-5)
        np.testing.assert_allclose(np.delete(p.coefs["beta"].values[s], pc),
                                   np.delete(B[s, :len(DEFAULT_TERMS)], pc), rtol=1e-6)
    assert p.carrier_mean_after > p.carrier_mean_before
    assert p.n_steps == len(X) and 0 < p.n_prefill_steps < len(X)
    assert p.step_mdape_pct >= 0 and np.isfinite(p.total_error_pct)
    assert any("projected onto prefill_compute" in n and "w" in n for n in p.notes)
    np.testing.assert_array_equal(p.coefs["alpha"].values, _coefs(B)["alpha"].values)


def test_projection_is_exact_where_the_knee_is_proportional_to_the_prefill():
    X, B = _features(), _draws()
    pc = REGIME_TERMS.index("prefill_compute")
    X[:, REGIME_TERMS.index("compute_over_2w")] = 0.25 * X[:, pc]
    X[:, REGIME_TERMS.index("compute_over_6w")] = 0.0
    p = project_onto_blis(_coefs(B), X, REGIME_TERMS)
    assert p.step_mdape_pct == pytest.approx(0.0, abs=1e-4)
    assert p.total_error_pct == pytest.approx(0.0, abs=1e-4)


def test_projection_without_knees_or_prefill_keeps_the_coefficients():
    X, B = _features(), _draws()
    blis = _coefs(B[:, :len(DEFAULT_TERMS)], DEFAULT_TERMS)
    p = project_onto_blis(blis, X, REGIME_TERMS)
    np.testing.assert_array_equal(p.coefs["beta"].values, blis["beta"].values)
    assert "nothing to project" in p.notes[0]
    X[:, REGIME_TERMS.index("prefill_compute")] = 0.0
    p = project_onto_blis(_coefs(B), X, REGIME_TERMS, workload="decode only")
    assert "no prefill step" in p.notes[0]
    np.testing.assert_allclose(p.coefs["beta"].values, B[:, :len(DEFAULT_TERMS)], rtol=1e-6)


@pytest.mark.parametrize("bad", ["nan", "negative", "shape", "empty", "missing_term"])
def test_projection_refuses_bad_step_features(bad):
    X, B, terms = _features(), _draws(), list(REGIME_TERMS)
    if bad == "nan":
        X[5, 0] = np.nan
    elif bad == "negative":
        X[5, 0] = -1.0
    elif bad == "shape":
        X = X[:, :-1]
    elif bad == "empty":
        X = X[:0]
    else:
        X, terms = X[:, :-1], terms[:-1]
    with pytest.raises(BayesLatencyError, match="workload W"):
        project_onto_blis(_coefs(B), X, terms, workload="workload W")


# ------------------------------------------------------------------------------ fitted, CLI
@pytest.fixture(scope="module")
def regime_fit(tiny_fleet_seed5, tmp_path_factory) -> tuple[Path, Path]:
    """``(tables, posterior.nc)``: the tiny fleet ingested and fitted with ``--terms regime``
    (fast Laplace fit, 120 rows per configuration)."""
    from bayes_latency.cli.main import main
    from bayes_latency.data.experiment import ingest
    from bayes_latency.data.tables import read_table

    root = tmp_path_factory.mktemp("regime")
    tables = root / "tables"
    ingest(sorted(p for p in tiny_fleet_seed5.iterdir() if p.is_dir()), tables)
    obs = read_table(tables, "observations")
    assert {f"x_{t}" for t in KNEE_TERMS} <= set(obs.columns)  # ingest writes the knees
    small = root / "small"
    small.mkdir()
    obs.groupby("config_id").head(120).reset_index(drop=True).to_parquet(
        small / "observations.parquet")
    post = root / "posterior.nc"
    assert main(["fit", str(small), "--terms", "regime", "--out", str(post), "--sampler",
                 "laplace", "--draws", "100", "--chains", "2"]) == 0
    return small, post


def test_a_regime_fit_has_the_knees_and_its_adequacy_draws_are_finite(regime_fit):
    from bayes_latency.checks.adequacy import loo_pit_rows
    from bayes_latency.data.tables import read_table
    from bayes_latency.model.estimator import LatencyModel

    tables, post = regime_fit
    m = LatencyModel.load(post)
    assert [str(t) for t in m.result["posterior"]["term"].values] == list(REGIME_TERMS)
    rows = read_table(tables, "observations")
    rows = rows[rows["kind"] == "iteration"].head(50).reset_index(drop=True)
    pit, log_draws = loo_pit_rows(m, rows, n_draws=400)
    # 2 chains x 100 draws: the draws the posterior has, every one of them finite
    assert log_draws.shape == (200, len(rows)) and np.isfinite(log_draws).all()
    assert np.isfinite(pit).all()


def _workload(tmp_path: Path, model: str, gpu: str, tp: int) -> Path:
    from bayes_latency.synth.client_result import synthetic_vllm_bench

    beta = np.array([0.5, 1.0, 0.5, 1.4, 1.5, 15.0, 30.0, 4.0, 120.0, 0.0, 0.0])
    alpha = {"alpha_arrival": 15000.0, "alpha_post_decode": 800.0, "alpha_per_token": 40.0}
    doc = synthetic_vllm_bench(model, gpu, tp, beta, alpha, rate=4.0, num_prompts=60,
                               prompt_len=(500, 3000), output_len=(20, 60))
    p = tmp_path / "bench.json"
    p.write_text(json.dumps(doc), encoding="utf-8")
    return p


def test_export_of_a_regime_fit_for_blis_needs_the_workload(regime_fit, tmp_path, capsys):
    import yaml

    from bayes_latency.cli.main import main

    _, post = regime_fit
    cfg = ["--model", "llama-2-7b", "--gpu", "H100", "--tp", "1"]
    out = tmp_path / "blis.yaml"
    assert main(["export", str(post), *cfg, "--format", "blis", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--workload" in err and "compute_over_2w" in err and not out.exists()
    wl = _workload(tmp_path, "llama-2-7b", "H100", 1)
    assert main(["export", str(post), *cfg, "--format", "blis", "--workload", str(wl),
                 "--draws", "5", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "operating point: --workload bench.json (1 load stage(s), 3.7 req/s" in printed  # 60 Poisson arrivals at 4/s
    assert "projected onto prefill_compute" in printed
    doc = yaml.safe_load(out.read_text())
    beta = doc["trained_physics_coefficients"]["beta_coeffs"]
    assert len(beta) == 11 and all(np.isfinite(beta)) and min(beta) >= 0
    assert any("operating point" in n for n in doc["notes"])
    # json: the regime's own coefficients, and no BLIS vector without a workload
    js = tmp_path / "doc.json"
    assert main(["export", str(post), *cfg, "--out", str(js)]) == 0
    doc = json.loads(js.read_text())
    assert {t["name"] for t in doc["terms"]} >= set(KNEE_TERMS) and doc["blis"] is None
    assert any(n.startswith("no BLIS vector") and "--workload" in n for n in doc["notes"])
    # with one, the projected BLIS vector and the operating point in its notes
    assert main(["export", str(post), *cfg, "--workload", str(wl), "--out", str(js)]) == 0
    doc = json.loads(js.read_text())
    assert len(doc["blis"]["trained_physics_coefficients"]["beta_coeffs"]) == 11
    assert any("operating point" in n for n in doc["notes"])


def test_export_projects_at_a_workload_spec_of_either_format(regime_fit, tmp_path, capsys):
    import yaml

    from bayes_latency.cli.main import main

    _, post = regime_fit
    cfg = ["--model", "llama-2-7b", "--gpu", "H100", "--tp", "1", "--format", "blis"]
    sp = {"system_prompt_len": 100, "question_len": 1400, "output_len": 40,
          "num_unique_system_prompts": 3, "num_users_per_system_prompt": 2,
          "enable_multi_turn_chat": True}
    stages = [{"rate": 2, "duration": 20}, {"rate": 6, "duration": 10}]
    prof = tmp_path / "profile.yaml"
    prof.write_text(yaml.safe_dump({"data": {"type": "shared_prefix", "shared_prefix": sp},
                                    "load": {"type": "constant", "stages": stages}}))
    spec = tmp_path / "blis-spec.yaml"
    spec.write_text(yaml.safe_dump({"version": "2", "seed": 7, "num_requests": 100,
                                    "inference_perf": {"stages": stages, "shared_prefix": sp}}))
    coefs = {}
    for wl, fmt in ((prof, "inference-perf profile"), (spec, "BLIS inference_perf spec")):
        out = tmp_path / f"{wl.stem}.out.yaml"
        assert main(["export", str(post), *cfg, "--workload", str(wl), "--out", str(out)]) == 0
        printed = capsys.readouterr().out
        assert (f"operating point: --workload {wl.name} (2 load stage(s), 2, 6 req/s, only the "
                "system prompt shared") in printed
        assert fmt in printed and "closed-loop sessions" in printed
        doc = yaml.safe_load(out.read_text())
        coefs[fmt] = np.array(doc["trained_physics_coefficients"]["beta_coeffs"])
        assert coefs[fmt].shape == (11,) and np.isfinite(coefs[fmt]).all()
    # the same load, read from either format: the same operating point, the same vector
    np.testing.assert_allclose(coefs["inference-perf profile"], coefs["BLIS inference_perf spec"],
                               rtol=1e-9)
    # the whole prompt cached instead: far fewer prefill tokens, another projection
    out = tmp_path / "prompt.yaml"
    assert main(["export", str(post), *cfg, "--workload", str(prof), "--prompt-sharing",
                 "prompt", "--out", str(out)]) == 0
    assert "each user's whole prompt cached" in capsys.readouterr().out
    # a bad spec: one line naming the file and the field, nothing written
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"inference_perf": {"stages": [{"rate": -1, "duration": 5}],
                                                      "shared_prefix": sp}}))
    out = tmp_path / "never.yaml"
    assert main(["export", str(post), *cfg, "--workload", str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bad.yaml" in err and "stages[0].rate" in err
    assert not out.exists()


def test_export_refuses_a_bad_workload_before_loading(regime_fit, tmp_path, capsys):
    from bayes_latency.cli.main import main

    _, post = regime_fit
    cfg = ["--model", "llama-2-7b", "--gpu", "H100", "--tp", "1", "--format", "blis"]
    out = tmp_path / "blis.yaml"
    assert main(["export", str(post), *cfg, "--workload", str(tmp_path / "nope.json"),
                 "--out", str(out)]) == 2
    assert "--workload" in capsys.readouterr().err and not out.exists()
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    assert main(["export", str(post), *cfg, "--workload", str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bad.json" in err and not out.exists()
    wl = _workload(tmp_path, "llama-2-7b", "H100", 1)
    assert main(["export", str(post), *cfg, "--workload", str(wl), "--kv-blocks", "0",
                 "--out", str(out)]) == 2
    assert "--kv-blocks" in capsys.readouterr().err
    # the workload is an input: never the output
    assert main(["export", str(post), *cfg, "--workload", str(wl), "--out", str(wl)]) == 2
    assert json.loads(wl.read_text())  # intact


def test_the_regime_reports_render_from_their_numbers():
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from benchmark_module import load_benchmark

    rst = load_benchmark("regime_step_time")
    ins = [{"model": m, "cell": c, "phase": ph, "rows": 12, "mdape_pct": v,
            "coverage90": 0.9, "band_rel_width": 0.2}
           for m, v in (("additive", 15.0), ("regime", 5.0))
           for c in ("llama-2-70b A100-80GB tp4 splitwise", "traced steps (H100 vLLM)")
           for ph in ("prefill", "decode")]
    loo = {m: {"elpd": e, "n_obs": 100, "n_k_high": 1, "max_k": 0.8}
           for m, e in (("additive", 90.0), ("regime", 100.0))}
    fit = {"passed": True, "max_rhat": 1.004, "min_ess_bulk": 500.0, "divergences": 0,
           "draws": 4000, "wall_s": 60.0, "dropped": {"faster than the GPU's peak compute": 3,
                                                      "other": 0}}
    res = {"fits": {"blis": fit, "regime": fit}, "loo": loo, "machine": "Measured on a CPU.",
           "compare": [{"model": "regime", "elpd_diff": 0.0, "dse": 0.0},
                       {"model": "additive", "elpd_diff": -10.0, "dse": 2.5}],
           "in_sample": ins,
           "knees": [{"configuration": "llama-2-70b A100-80GB tp4 splitwise",
                      "prefill_compute": "0.5 (0.3-0.7)", "compute_over_2w": "0.4 (0.2-0.6)",
                      "compute_over_6w": "0.8 (0.5-1.1)",
                      "slope past 6W / below 2W": "3.4 (2-5)", "ratio_median": 3.4}]}
    md = rst.render(res, "knee.png")
    assert "**regime** is ahead by 10.0 (standard error of the difference 2.5)" in md
    assert "faster than the GPU's peak compute: 3)" in md and "other: 0" not in md
    assert "regime 5.0-5.0% (median 5.0%)" in md and "![prefill knee](knee.png)" in md
    for block in md.split("\n\n"):  # no configuration id splits a table row
        rows = [ln for ln in block.splitlines() if ln.startswith("|")]
        assert len({ln.count("|") for ln in rows}) <= 1, block


def test_the_blis_report_sets_the_two_fits_side_by_side():
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from benchmark_module import load_benchmark

    rb = load_benchmark("regime_blis")
    rows = []
    for fit, e in (("additive", 0.02), ("regime", -0.01)):
        for ex in ("prefix", "inference-perf"):
            for run in ("m-tp1-a", "m-tp1-b"):
                rows.append({"fit": fit, "expansion": ex, "run": run, "err_e2e_mean": e,
                             "err_ttft_mean": 2 * e, "err_decode_interval": e / 2,
                             **({"projection_steps": 1000.0, "prefill_compute_before": 0.1,
                                 "prefill_compute_after": 0.12, "projection_step_p90_pct": 0.5,
                                 "projection_total_pct": 0.1} if fit == "regime" else {})})
    fit = {"passed": True, "max_rhat": 1.004, "min_ess_bulk": 450.0, "divergences": 0,
           "converged": True, "wall_s": 100.0}
    res = {"blis": rows, "fits": {"additive": fit, "regime": fit}, "machine": "On a CPU.",
           "what": "2 runs.",
           "replay": [{"fit": f, "run": r, "err_ttft": 0.01, "err_e2e": -0.02}
                      for f in ("additive", "regime") for r in ("m-tp1-a", "m-tp1-b")]}
    md = rb.render(res)
    assert "| additive | prefix | 2 | 2.0% | 4.0% | 1.0% | 2.0% | 4.0% |" in md
    assert "| regime | inference-perf | 2 | 1.0% | 2.0% | 0.5% | 1.0% | 2.0% |" in md
    assert "| inference-perf | m-tp1-a | +2.0% | -1.0% | +4.0% | -2.0% |" in md
    assert "## The regime exports' projections" in md and "1,000" in md
    for block in md.split("\n\n"):
        rows_ = [ln for ln in block.splitlines() if ln.startswith("|")]
        assert len({ln.count("|") for ln in rows_}) <= 1, block


@pytest.mark.slow
def test_calibrate_with_the_knees_exports_them_projected_over_the_result(tmp_path, capsys):
    """``calibrate --terms regime --export``: the BLIS YAML carries the knees' cost in
    ``prefill_compute``, projected over the calibrated result's own steps (about 2 CPU min)."""
    import yaml

    from bayes_latency.cli.main import main

    wl = _workload(tmp_path, "llama-2-7b", "H100", 1)
    out, exp = tmp_path / "cal.nc", tmp_path / "cal.yaml"
    rc = main(["calibrate", str(wl), "--model", "llama-2-7b", "--gpu", "H100", "--tp", "1",
               "--terms", "regime", "--population", "none", "--sampler", "laplace",
               "--draws", "200", "--out", str(out), "--export", str(exp)])
    assert rc in (0, 1)  # the export is written before the gates
    printed = capsys.readouterr().out
    assert "projected onto prefill_compute" in printed and "the calibrated result" in printed
    doc = yaml.safe_load(exp.read_text())
    assert len(doc["trained_physics_coefficients"]["beta_coeffs"]) == 11
    assert all(len(d["trained_physics_coefficients"]["beta_coeffs"]) == 11 for d in doc["draws"])
    assert any("projected onto prefill_compute" in n for n in doc["notes"])


def test_projection_over_replayed_stages_projects_every_set_over_the_same_steps():
    from bayes_latency.export.projection import project_over_stages, replayed_step_features
    from bayes_latency.schedule.replay import ClientStage

    stage = ClientStage(run_id="r", stage=0, model=CFG[0], gpu=CFG[1], tp=CFG[2],
                        observed={"ttft_mean_us": 1e5, "e2e_mean_us": 5e6,
                                  "output_len_mean": 50.0},
                        kv_blocks=8000, rate=2.0, count=40, prompt_len=3000,
                        output_pdf={40: 0.5, 60: 0.5}, num_groups=0)
    coefs, other = _coefs(_draws()), _coefs(_draws(seed=7))
    mean = coefs["beta"].mean("sample").values.astype(float)
    X = replayed_step_features([stage], CFG[0], CFG[1], mean, REGIME_TERMS)
    proj, (o,) = project_over_stages(coefs, [stage], CFG[0], CFG[1], "w", draws=(other,))
    np.testing.assert_array_equal(proj.coefs["beta"].values,
                                  project_onto_blis(coefs, X, REGIME_TERMS).coefs["beta"].values)
    np.testing.assert_array_equal(o["beta"].values,
                                  project_onto_blis(other, X, REGIME_TERMS).coefs["beta"].values)
    assert proj.n_steps == len(X) and proj.n_prefill_steps > 0
