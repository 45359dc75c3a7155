"""Golden feature parity with BLIS's ``trained-physics`` step-time model.

``tests/golden/blis_steptime.json`` was written by BLIS itself (``tools/blis_golden/``: a Go
program built against the unpacked BLIS source calls ``NewLatencyModel(..., "trained-physics")``
and the public ``StepTime``). For every case (model config, GPU, TP, DP, batch of requests) it
holds BLIS's 11 basis values (one per beta slot) and ``StepTime`` for several coefficient vectors.
The fixture is committed, so these tests need no Go.

1. BLIS self-consistency: ``Σ beta_j·feature_j`` reproduces ``StepTime`` (truncated to int µs).
2. The fixture's features equal BLIS's formulas re-derived here from the batch table columns and
   the model's frozen parameters (documents exactly which functions the package must compute).
3. Parity: the package's features (``basis_matrix`` with ``terms=BLIS_BETA_ORDER``) for the same
   batch equal BLIS's, per term, and ``beta·basis`` equals ``StepTime`` within 0.1% for every
   vector.
"""

from __future__ import annotations

import json
import math
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from bayes_latency.physics.basis import BLIS_BETA_ORDER, basis_matrix
from bayes_latency.physics.serving import ServingConfig

pytestmark = pytest.mark.cpu_sensitive  # float results: .ci/run reruns them without AVX-512

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "golden" / "blis_steptime.json"
CONFIG_DIR = Path(os.environ.get("BLIS_GOLDEN_CONFIGS",
                                 ROOT.parent / "shared" / "data" / "real" / "model-configs"))
N_BETA = 11
# BLIS hardware names -> the package's GPU names (bayes_latency/physics/data/gpus.yaml)
GPU_NAMES = {"H100": "H100", "A100-SXM": "A100", "A100-80": "A100", "L40S": "L40S"}
# BLIS published iter29 betas (../shared/blis/README.md, defaults.yaml)
PUBLISHED = [0.152128, 0.0, 1.36252915, 0.752037, 32.09546717, 4.41684444, 126.024825,
             481.8613888, 0.0, 1.94710771, 0.752037]


FEATURE_RTOL, FEATURE_ATOL = 1e-6, 1e-5  # per term (µs or counts)
STEP_RTOL = 1e-3  # beta·basis vs StepTime


@lru_cache(maxsize=1)
def _fixture() -> dict[str, Any]:
    with open(FIXTURE, encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    if not FIXTURE.is_file():
        pytest.skip(f"{FIXTURE} is absent (tools/blis_golden/regenerate.sh writes it)")
    return _fixture()


@pytest.fixture(scope="module")
def config_dir() -> Path:
    if not CONFIG_DIR.is_dir():
        pytest.skip(f"model configs {CONFIG_DIR} are absent")
    return CONFIG_DIR


# ----------------------------------------------------------------------------- batch mapping
def blis_case_to_batch(case: dict[str, Any],
                       config_dir: Path = CONFIG_DIR) -> tuple[pd.DataFrame, dict[str, Any]]:
    """One-row batch table and configuration of a BLIS golden case.

    Parameters
    ----------
    case : dict
        A fixture case: ``model_config`` (file name), ``gpu`` (BLIS name), ``tp``, ``dp`` and
        ``requests`` (``input_len, progress_index, num_new_tokens, n_output`` each).
    config_dir : Path
        Directory holding the model configs.

    Returns
    -------
    batch_df : pandas.DataFrame
        One row: ``num_prefill_reqs, prefill_tokens, prefill_attn_pairs, prefill_kv_tokens,
        prefill_input_pairs, num_decode_reqs, decode_tokens, decode_ctx_tokens``. A request is
        in prefill when ``progress_index < input_len`` (chunk ``c = num_new_tokens`` at offset
        ``o = progress_index``: pairs ``c·(o + (c+1)/2)``, KV tokens ``o + c``, input pairs
        ``c·(input_len + c/2)``, the quantity BLIS's prefill attention uses) and in decode when
        ``progress_index >= input_len`` and ``n_output > 0`` (context ``progress_index + 1``).
    kwargs : dict
        ``arch`` (config.json path), ``gpu`` (package GPU name) and ``serving``
        (``{"tp", "dp"}``, for :class:`ServingConfig`).
    """
    pf = [r for r in case["requests"] if r["progress_index"] < r["input_len"]]
    dc = [r for r in case["requests"]
          if r["progress_index"] >= r["input_len"] and r["n_output"] > 0]
    c = np.array([r["num_new_tokens"] for r in pf], dtype=float)
    o = np.array([r["progress_index"] for r in pf], dtype=float)
    s = np.array([r["input_len"] for r in pf], dtype=float)
    row = {
        "num_prefill_reqs": float(len(pf)),
        "prefill_tokens": float(c.sum()),
        "prefill_attn_pairs": float((c * (o + (c + 1.0) / 2.0)).sum()),
        "prefill_kv_tokens": float((o + c).sum()),
        "prefill_input_pairs": float((c * (s + c / 2.0)).sum()),
        "num_decode_reqs": float(len(dc)),
        "decode_tokens": float(len(dc)),
        "decode_ctx_tokens": float(sum(r["progress_index"] + 1 for r in dc)),
    }
    kwargs = {"arch": str(config_dir / case["model_config"]), "gpu": GPU_NAMES[case["gpu"]],
              "serving": {"tp": int(case["tp"]), "dp": int(case.get("dp", 1))}}
    return pd.DataFrame([row]), kwargs


_PACKAGE_FEATURES: dict[tuple[str, str], np.ndarray] = {}


def package_features(case: dict[str, Any], config_dir: Path = CONFIG_DIR) -> np.ndarray:
    """The package's features of a case, in BLIS slot order (``terms=BLIS_BETA_ORDER``; cached)."""
    key = (case["id"], str(config_dir))
    if key not in _PACKAGE_FEATURES:
        batch, kw = blis_case_to_batch(case, config_dir)
        _PACKAGE_FEATURES[key] = basis_matrix(batch, kw["arch"], kw["gpu"],
                                              ServingConfig(**kw["serving"]),
                                              terms=BLIS_BETA_ORDER)[0]
    return _PACKAGE_FEATURES[key]


# ----------------------------------------------------------------------------- BLIS reference
def blis_reference_features(row: dict[str, float], p: dict[str, Any]) -> np.ndarray:
    """BLIS's 11 basis values re-derived from a batch-table row and the model's parameters.

    Transcribes ``StepTime`` of ``sim/latency/trained_physics_model.go`` (BLIS f90a1e3) with
    ``p`` = the ``TrainedPhysicsModel`` fields recorded in the fixture (``model_params``).
    Notable: head dim = hidden/heads (not ``head_dim``); prefill attention uses the full input
    length; prefill KV counts only the new tokens; decode attention uses ``Σ progress_index``
    (``decode_ctx_tokens - decode_tokens``) but decode KV uses ``decode_ctx_tokens``; KV is
    always 2 bytes; weight loading reads all routed experts / (TP·DP) every step and no
    embeddings; communication is divided by the HBM bandwidth.
    """
    L, d, tp, dp = p["numLayers"], p["hiddenDim"], p["tp"], p["dp"]
    dkv, dh, h = p["dKV"], p["headDim"], p["numHeads"]
    n_moe, n_dense, k = p["numMoELayers"], p["numDenseLayers"], p["kEff"]
    group, n_exp, shared = p["moeGroup"], p["numExperts"], p["sharedExpertFFNDim"]
    flops, bw, act, wb = p["flopsPeakUs"], p["bwHbmUs"], p["activationBPP"], p["weightBPP"]
    tpdp = tp * dp
    P, D = row["prefill_tokens"], row["decode_tokens"]
    sum_ctx = row["decode_ctx_tokens"] - D  # Σ ProgressIndex over decode requests
    T = P + D

    def ffn_flops(tokens: float) -> float:
        f = 0.0
        if n_moe:
            f += n_moe * tokens * k / group * 6 * d * p["dFFMoE"]
            f += n_moe * tokens * 6 * d * shared / tpdp
        if n_dense:
            f += n_dense * tokens * 6 * d * p["dFFDense"] / tpdp
        return f

    proj = 2 * d * (2 * d + 2 * dkv)
    f = np.zeros(N_BETA)
    if P > 0:
        f[0] = (L * P * proj / tpdp + L * 4 * (h / tp) * dh * row["prefill_input_pairs"] / dp
                + ffn_flops(P)) / flops
        f[8] = L * 2 * (dkv / tpdp) * P * 2.0 / bw
    if D > 0:
        f[1] = (L * D * proj / tpdp + L * 4 * (h / tp) * dh * sum_ctx / dp + ffn_flops(D)) / flops
        f[9] = L * 2 * (dkv / tpdp) * 2.0 * (sum_ctx + D) / bw
    w = L * d * (2 * d + 2 * dkv) * wb / tp
    if n_moe:
        w += n_moe * (n_exp / group) * 3 * d * p["dFFMoE"] * wb + n_moe * 3 * d * shared * wb / tp
    if n_dense:
        w += n_dense * 3 * d * p["dFFDense"] * wb / tp
    f[2] = w / bw
    if tp > 1:
        units = (L + n_dense) / dp + (n_moe if (p["isMoE"] and n_moe and dp == 1) else 0)
        f[3] = units * T * d * act * 2.0 * (tp - 1) / tp / bw
    f[4] = L
    f[5] = row["num_prefill_reqs"] + row["num_decode_reqs"]
    f[6] = 1.0
    f[7] = n_moe if p["hasInterleavedMoE"] else 0.0
    if p["isMoE"] and dp > 1:  # all-gather family (BLIS default backend)
        f[10] = (T / dp) * (group - 1) / group * 2 * d * act / bw * n_moe
    return f


# ----------------------------------------------------------------------------- tests
def test_fixture_covers_the_issue(golden: dict[str, Any]) -> None:
    res = golden["results"]
    assert len(res) >= 200
    assert golden["coefficients"]["published"] == PUBLISHED
    assert golden["blis_commit"] != "unknown"
    cats = {(r["case"]["category"]["arch"], r["case"]["category"]["batch"]) for r in res}
    for arch in ("dense-mha", "dense-gqa", "moe", "moe-interleaved-fp8"):
        for kind in ("prefill", "decode", "mixed"):
            assert (arch, kind) in cats
    assert {r["case"]["tp"] for r in res} == {1, 2, 4, 8}
    assert any(r["case"]["dp"] > 1 for r in res)
    assert "mixtral-8x7b-v0.1.json" in {r["case"]["model_config"] for r in res}
    for r in res:
        assert len(r["features"]) == N_BETA
        assert "/" not in r["case"]["model_config"]
        assert set(r["step_time"]) == set(golden["coefficients"])


def test_blis_self_consistency(golden: dict[str, Any]) -> None:
    """Σ beta_j·feature_j = StepTime within max(0.1%, 1 µs); exact after int64 truncation."""
    worst = 0.0
    for r in golden["results"]:
        feats = np.asarray(r["features"])
        for name, beta in golden["coefficients"].items():
            pred = float(np.dot(beta, feats))
            st = r["step_time"][name]
            assert abs(pred - st) <= max(1e-3 * st, 1.0), (r["case"]["id"], name, pred, st)
            # StepTime = max(1, trunc(pred)); allow one tick where pred sits on an integer
            assert abs(max(1, math.floor(pred)) - st) <= 1, (r["case"]["id"], name, pred, st)
            worst = max(worst, abs(pred - st) / st)
    assert worst < 0.01


def test_blis_features_match_reference_formulas(golden: dict[str, Any]) -> None:
    """The fixture's features are the documented functions of the batch-table row."""
    bad = []
    for r in golden["results"]:
        batch, _ = blis_case_to_batch(r["case"])
        ref = blis_reference_features(batch.iloc[0].to_dict(), r["model_params"])
        got = np.asarray(r["features"])
        ok = np.isclose(ref, got, rtol=1e-9, atol=1e-5)
        bad += [(r["case"]["id"], j, got[j], ref[j]) for j in np.flatnonzero(~ok)]
    assert not bad, bad[:10]


def test_package_terms_are_blis_slots() -> None:
    assert len(BLIS_BETA_ORDER) == N_BETA


def test_gpu_datasheets_match_blis(golden: dict[str, Any]) -> None:
    """The GPU numbers the exported terms use (``GPU.blis``) are BLIS's ``hardware_config.json``
    entries, under the name BLIS knows the GPU by."""
    from bayes_latency.physics.hardware import load_gpu

    for blis_name, hw in golden["hardware"].items():
        b = load_gpu(GPU_NAMES[blis_name]).blis
        assert b.in_blis and b.name in (blis_name, "A100-80"), blis_name
        assert b.tflops_peak == pytest.approx(hw["TFlopsPeak"], rel=1e-12), blis_name
        assert b.bw_peak_tbs == pytest.approx(hw["BwPeakTBs"], rel=1e-12), blis_name
        assert b.tflops_fp8 == pytest.approx(hw.get("TFlopsFP8") or 0.0, rel=1e-12), blis_name


def test_feature_parity(golden: dict[str, Any], config_dir: Path) -> None:
    """Per term, the package's feature equals BLIS's within 1e-6 relative + 1e-5 absolute."""
    names = list(BLIS_BETA_ORDER)
    bad = []
    for r in golden["results"]:
        ours = package_features(r["case"], config_dir)
        blis = np.asarray(r["features"])
        ok = np.isclose(ours, blis, rtol=FEATURE_RTOL, atol=FEATURE_ATOL)
        bad += [(r["case"]["id"], names[j], float(blis[j]), float(ours[j]))
                for j in np.flatnonzero(~ok)]
    assert not bad, f"{len(bad)} (case, term, BLIS, package) mismatches, first: {bad[:10]}"


@pytest.mark.parametrize("vector", sorted(_fixture()["coefficients"]) if FIXTURE.is_file()
                         else ["published"])
def test_step_time_parity(golden: dict[str, Any], config_dir: Path, vector: str) -> None:
    """``beta·basis`` of the package equals BLIS's ``StepTime`` within 0.1% (+1 µs truncation)."""
    beta = np.asarray(golden["coefficients"][vector])
    bad = []
    for r in golden["results"]:
        pred = float(beta @ package_features(r["case"], config_dir))
        st = r["step_time"][vector]
        if abs(pred - st) > max(STEP_RTOL * st, 1.0):
            bad.append((r["case"]["id"], st, pred))
    assert not bad, f"{len(bad)} of {len(golden['results'])} cases off, first: {bad[:10]}"
