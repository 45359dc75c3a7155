"""Export: statistics, JSON document, BLIS block / flags / draws, validation, CLI."""

from __future__ import annotations

import argparse
import json
import sys
import types

import numpy as np
import pytest
import xarray as xr
import yaml

from bayes_latency.cli.export import export_command
from bayes_latency.errors import BayesLatencyError
from bayes_latency.export.document import (
    blis_block,
    blis_draws,
    blis_flags,
    blis_notes,
    export_document,
    predict_reference,
    summarize_coefficients,
)
from bayes_latency.physics import ALPHA_TERMS, BLIS_BETA_ORDER, DEFAULT_TERMS

CONFIG = {"model": "llama-2-7b", "gpu": "H100", "tp": 1}


def make_coefs(n=400, spread=0.05, seed=0) -> xr.Dataset:
    """Coefficients where term ``i`` has centre ``10 * (i + 1)`` and alpha ``j`` has ``j + 1``."""
    rng = np.random.default_rng(seed)
    centre_b = 10.0 * (np.arange(len(DEFAULT_TERMS)) + 1)
    centre_a = np.arange(len(ALPHA_TERMS)) + 1.0
    beta = centre_b * np.exp(spread * rng.standard_normal((n, len(DEFAULT_TERMS))))
    alpha = centre_a * np.exp(spread * rng.standard_normal((n, len(ALPHA_TERMS))))
    return xr.Dataset({"beta": (("sample", "term"), beta), "alpha": (("sample", "alpha_term"), alpha)},
                      coords={"term": list(DEFAULT_TERMS), "alpha_term": list(ALPHA_TERMS)})


def test_blis_block_slots():
    coefs = make_coefs(spread=0.0)
    block = blis_block(coefs)["trained_physics_coefficients"]
    assert block["alpha_coeffs"] == [1.0, 2.0, 3.0]
    assert len(block["beta_coeffs"]) == 11
    for slot, name in enumerate(BLIS_BETA_ORDER):
        assert block["beta_coeffs"][slot] == 10.0 * (DEFAULT_TERMS.index(name) + 1)
    # BLIS's StepTime slots, written out (sim/latency/trained_physics_model.go)
    by_slot = dict(enumerate(BLIS_BETA_ORDER))
    assert by_slot == {0: "prefill_compute", 1: "decode_compute", 2: "weight_loading",
                       3: "tp_allreduce", 4: "per_layer", 5: "per_request", 6: "per_step",
                       7: "moe_layer", 8: "prefill_kv", 9: "decode_kv", 10: "moe_dispatch"}
    assert blis_notes(coefs) == []
    flags = blis_flags(coefs)
    assert flags.startswith("--alpha-coeffs 1,2,3 --beta-coeffs ")
    assert [float(v) for v in flags.split()[-1].split(",")] == block["beta_coeffs"]
    assert blis_flags(blis_block(coefs)) == flags


def _with_terms(coefs: xr.Dataset, extra: dict[str, float]) -> xr.Dataset:
    b = coefs["beta"]
    add = xr.DataArray(np.tile(list(extra.values()), (b.sizes["sample"], 1)),
                       dims=("sample", "term"), coords={"term": list(extra)})
    return xr.Dataset({"beta": xr.concat([b, add], dim="term"), "alpha": coefs["alpha"]})


def test_blis_extra_terms_fold_or_refuse():
    coefs = make_coefs(spread=0.0)
    base = blis_block(coefs)["trained_physics_coefficients"]["beta_coeffs"]
    mix = {"model": "mixtral-8x7b", "gpu": "H100", "tp": 2}
    folded = _with_terms(coefs, {"moe_routing": 40.0})
    with pytest.raises(BayesLatencyError, match="needs the configuration"):
        blis_block(folded)
    b = blis_block(folded, config=mix)["trained_physics_coefficients"]["beta_coeffs"]
    step = BLIS_BETA_ORDER.index("per_step")
    assert b[step] == pytest.approx(base[step] + 40.0 * 32)       # 32 MoE layers
    assert [v for i, v in enumerate(b) if i != step] == [v for i, v in enumerate(base) if i != step]
    assert any("moe_routing" in n and "folded into per_step" in n for n in blis_notes(folded, mix))
    with pytest.raises(BayesLatencyError, match="prefill_context_kv.*cannot be folded"):
        blis_block(_with_terms(coefs, {"prefill_context_kv": 1.0}), config=mix)
    # a default term left out of the fit is exported as 0, with a note
    sub = coefs.sel(term=[t for t in DEFAULT_TERMS if t != "moe_dispatch"])
    assert blis_block(sub)["trained_physics_coefficients"]["beta_coeffs"][10] == 0.0
    assert any("moe_dispatch" in n and "exported as 0" in n for n in blis_notes(sub))


def test_blis_median_and_draws():
    coefs = make_coefs()
    med = blis_block(coefs, "median")["trained_physics_coefficients"]
    assert med["alpha_coeffs"][0] == pytest.approx(float(np.median(coefs["alpha"].values[:, 0])))
    draws = blis_draws(coefs, 25, seed=1)
    assert len(draws) == 25
    for d in draws:
        tp = d["trained_physics_coefficients"]
        assert len(tp["alpha_coeffs"]) == 3 and len(tp["beta_coeffs"]) == 11
    assert len({tuple(d["trained_physics_coefficients"]["alpha_coeffs"]) for d in draws}) == 25
    with pytest.raises(BayesLatencyError):
        blis_block(coefs, "mode")


@pytest.mark.parametrize("bad", [-0.5, np.nan, np.inf])
def test_invalid_coefficient_raises_naming_it(bad):
    coefs = make_coefs()
    coefs["beta"].values[3, DEFAULT_TERMS.index("decode_kv")] = bad
    for fn in (blis_block, summarize_coefficients, lambda c: blis_draws(c, 5),
               lambda c: export_document(c, CONFIG, {})):
        with pytest.raises(BayesLatencyError, match="decode_kv"):
            fn(coefs)
    coefs = make_coefs()
    coefs["alpha"].values[0, 2] = bad
    with pytest.raises(BayesLatencyError, match="alpha_per_token"):
        blis_block(coefs)


def test_summarize_coefficients():
    coefs = make_coefs()
    table = summarize_coefficients(coefs)
    assert list(table.index) == list(DEFAULT_TERMS) + list(ALPHA_TERMS)
    assert (table["q05"] <= table["median"]).all() and (table["median"] <= table["q95"]).all()
    assert (table["hdi_low"] < table["mean"]).all() and (table["mean"] < table["hdi_high"]).all()
    assert table.loc["per_layer", "unit"] == "us/layer"
    assert table.loc["alpha_per_token", "unit"] == "us/token"
    assert table.loc["alpha_arrival", "kind"] == "alpha"
    assert table.loc["prefill_compute", "blis_slot"] == 0


def test_export_document_json_round_trip():
    coefs = make_coefs()
    prov = {"posterior_sha256": "0" * 64, "package_version": "0.1.0", "approximate": False}
    doc = export_document(coefs, CONFIG, prov, n_draws=10)
    back = json.loads(json.dumps(doc, allow_nan=False))
    assert back["schema_version"] == 1
    assert back["configuration"]["serving"]["tp"] == 1
    assert back["provenance"] == prov
    names = [t["name"] for t in back["terms"]]
    assert names == list(DEFAULT_TERMS) + list(ALPHA_TERMS)
    for t in back["terms"]:
        for k in ("mean", "median", "q05", "q95", "hdi_low", "hdi_high"):
            assert np.isfinite(t[k]) and t[k] >= 0
    refs = {r["name"]: r for r in back["reference_predictions"]}
    assert set(refs) == {"prefill_2048", "decode_32x1000", "decode_128x2000",
                         "mixed_1024_prefill_32x1000_decode"}
    for r in refs.values():
        assert 0 < r["q05_us"] <= r["median_us"] <= r["q95_us"]
    assert refs["decode_128x2000"]["mean_us"] > refs["decode_32x1000"]["mean_us"]
    assert len(back["draws"]["beta"]) == 10 and len(back["draws"]["beta"][0]) == len(DEFAULT_TERMS)
    assert len(back["blis"]["trained_physics_coefficients"]["beta_coeffs"]) == 11


def test_predict_reference_is_linear_in_beta():
    coefs = make_coefs(spread=0.0)
    ref = predict_reference(coefs, CONFIG)
    doubled = coefs.copy(deep=True)
    doubled["beta"] = doubled["beta"] * 2
    np.testing.assert_allclose(predict_reference(doubled, CONFIG)["mean_us"], 2 * ref["mean_us"])


def _fake_estimator(monkeypatch, coefs):
    result = xr.DataTree()
    result.attrs = {"bayes_latency_version": "0.1.0", "model_version": "1", "priors_hash": "p",
                    "data_hash": "d", "method": "laplace-hierarchy", "sampler": "laplace",
                    "approximate": "true"}

    class FakeModel:
        def __init__(self):
            self.result = result
            self.calls = []

        @classmethod
        def load(cls, path):
            return cls()

        def coefficients(self, model, gpu, tp, n_draws=None, seed=0, new_run=False):
            assert (model, gpu, tp) == ("llama-2-7b", "H100", 1)
            assert new_run  # an export is for simulating a new run of the configuration
            return coefs

        def noise(self, cfg, kind):
            from bayes_latency.model.definition.likelihood import NoiseParams

            return NoiseParams(0.02 if kind == "iteration" else 0.03, 0.0, 4.0, 0.5,
                               float(np.log(64.0)), "batch")

    mod = types.ModuleType("bayes_latency.model.estimator")
    mod.LatencyModel = FakeModel
    monkeypatch.setitem(sys.modules, "bayes_latency.model.estimator", mod)


@pytest.mark.parametrize("fmt", ["json", "blis"])
def test_export_command(monkeypatch, tmp_path, capsys, fmt):
    coefs = make_coefs()
    _fake_estimator(monkeypatch, coefs)
    posterior = tmp_path / "posterior.nc"
    posterior.write_bytes(b"not really netcdf")
    out = tmp_path / "sub" / f"export.{fmt}"
    args = argparse.Namespace(posterior=str(posterior), model="llama-2-7b", gpu="H100", tp=1,
                              draws=7, format=fmt, out=str(out))
    assert export_command(args) == 0
    assert "wrote" in capsys.readouterr().out
    text = out.read_text()
    if fmt == "json":
        doc = json.loads(text)
        assert doc["provenance"]["approximate"] is True
        assert len(doc["provenance"]["posterior_sha256"]) == 64
        assert len(doc["draws"]["alpha"]) == 7
        it = doc["step_noise"]["classes"]["iteration"]
        assert it == {"sigma": 0.02, "nu": 4.0, "load": "batch", "gamma": 0.5,
                      "load_ref": pytest.approx(64.0)}
        assert doc["step_noise"]["classes"]["iteration_prefill"]["sigma"] == 0.03
    else:
        assert text.startswith("# bayes-latency export") and "--beta-coeffs" in text.splitlines()[1]
        doc = yaml.safe_load(text)
        assert doc["trained_physics_coefficients"] == blis_block(coefs)["trained_physics_coefficients"]
        assert doc["blis_flags"] == blis_flags(coefs)
        assert doc["blis_hardware"] == {"name": "H100", "in_blis_hardware_config": True}
        assert len(doc["draws"]) == 7
        assert doc["provenance"]["method"] == "laplace-hierarchy"
