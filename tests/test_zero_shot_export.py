"""Zero-shot export: `bayes-latency export --model M --gpu G --tp N` from a fleet population alone
(the shipped one by default), its notes naming every level the population did not see."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from bayes_latency.cli.main import main
from bayes_latency.model.posterior.population_file import SHIPPED_POPULATION, load_population
from bayes_latency.physics.basis import BLIS_BETA_ORDER

MODELS = Path(__file__).resolve().parents[1] / "bayes_latency" / "physics" / "data" / "models"


def run(capsys, argv: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(capsys, argv: list[str]) -> str:
    rc, _, err = run(capsys, argv)
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("bayes-latency: error:"), err
    return lines[0]


def band_ratios(doc: dict) -> np.ndarray:
    """q95 / q05 of the predicted iteration time of each reference batch of an export document."""
    return np.array([r["q95_us"] / r["q05_us"] for r in doc["reference_predictions"]])


@pytest.fixture(scope="module")
def shipped():
    return load_population(SHIPPED_POPULATION)


def test_unseen_model_and_gpu_from_the_shipped_population(tmp_path, capsys, shipped):
    out = tmp_path / "l40s.json"
    rc, stdout, err = run(capsys, ["export", "--model", "llama-3.1-8b", "--gpu", "L40S",
                                   "--tp", "1", "--out", out])
    assert rc == 0, err
    doc = json.loads(out.read_text())
    notes = doc["notes"]
    assert notes[0].startswith("zero-shot: no posterior") and shipped.name in notes[0]
    assert any(n.startswith("unseen levels: model llama-3.1-8b, GPU L40S") for n in notes)
    assert any(n.startswith("seen levels: TP 1") for n in notes)
    assert "step_noise" not in doc
    prov = doc["provenance"]
    assert prov["population_file"] == SHIPPED_POPULATION.name
    assert len(prov["population_sha256"]) == 64 and "posterior_sha256" not in prov
    assert prov["model_version"] == shipped.attrs["model_version"]
    for t in doc["terms"]:
        assert np.isfinite(t["mean"]) and t["mean"] >= 0.0
    assert "zero-shot" in stdout and "unseen levels" in stdout

    # a configuration whose every level the population saw: only the residual is drawn, and
    # its band is narrower than that of the one with two unseen levels
    seen = tmp_path / "seen.json"
    rc, _, err = run(capsys, ["export", "--model", "llama-2-70b", "--gpu", "H100", "--tp", "4",
                              "--out", seen])
    assert rc == 0, err
    sdoc = json.loads(seen.read_text())
    assert not any(n.startswith("unseen levels") for n in sdoc["notes"])
    assert any("fitted on this configuration" in n for n in sdoc["notes"])
    assert np.all(band_ratios(doc) > band_ratios(sdoc))


def test_config_json_path_and_blis_format(tmp_path, capsys):
    (tmp_path / "my-qwen").mkdir()
    cfg = tmp_path / "my-qwen" / "config.json"
    shutil.copyfile(MODELS / "qwen3-14b.json", cfg)
    out = tmp_path / "qwen.yaml"
    rc, _, err = run(capsys, ["export", "--model", cfg, "--gpu", "A100", "--tp", "2",
                              "--format", "blis", "--draws", "5", "--out", out])
    assert rc == 0, err
    text = out.read_text()
    assert text.startswith("# bayes-latency export") and "population draws" in text.splitlines()[0]
    doc = yaml.safe_load(text)
    block = doc["trained_physics_coefficients"]
    assert len(block["beta_coeffs"]) == len(BLIS_BETA_ORDER) and len(block["alpha_coeffs"]) == 3
    assert all(np.isfinite(v) and v >= 0 for v in block["beta_coeffs"] + block["alpha_coeffs"])
    assert len(doc["draws"]) == 5
    assert any(n.startswith("unseen levels: model my-qwen") for n in doc["notes"]), doc["notes"]


def test_an_explicit_population_file(tmp_path, capsys):
    pop = tmp_path / "pop.nc"
    shutil.copyfile(SHIPPED_POPULATION, pop)
    out = tmp_path / "a.json"
    rc, _, err = run(capsys, ["export", "--population", pop, "--model", "llama-2-7b", "--gpu",
                              "H100", "--tp", "1", "--out", out])
    assert rc == 0, err
    assert json.loads(out.read_text())["provenance"]["population_file"] == "pop.nc"


def test_zero_shot_refusals(tmp_path, capsys):
    out = tmp_path / "a.json"
    base = ["--model", "llama-2-7b", "--gpu", "H100", "--tp", "1", "--out", out]
    err = one_line_error(capsys, ["export", SHIPPED_POPULATION, "--population",
                                  SHIPPED_POPULATION, *base])
    assert "not both" in err
    err = one_line_error(capsys, ["export", "--model", "llama-2-7b", "--gpu", "TPUv9", "--tp",
                                  "1", "--out", out])
    assert "unknown GPU 'TPUv9'" in err and SHIPPED_POPULATION.name not in err
    err = one_line_error(capsys, ["export", "--population", "none", *base])
    assert "--population none" in err
    err = one_line_error(capsys, ["export", "--population", tmp_path / "missing.nc", *base])
    assert "missing.nc" in err
    err = one_line_error(capsys, ["export", "--population", SHIPPED_POPULATION, "--out",
                                  SHIPPED_POPULATION, "--model", "llama-2-7b", "--gpu", "H100",
                                  "--tp", "1"])
    assert str(SHIPPED_POPULATION.name) in err
    assert not out.exists()
