"""The recovery-calibration benchmarks' pieces (no fit): the expected coverage of a calibrated
posterior, and the simulation of a fleet with given per-configuration truths."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_expected_coverage_is_nominal_for_truths_drawn_from_the_prior():
    cal = _load("recovery_calibration")
    rng = np.random.default_rng(0)
    d = rng.standard_normal(200_000)
    for r in (0.01, 0.3, 0.7, 0.95):
        assert abs(cal.expected_coverage(np.full_like(d, r), d).mean() - 0.90) < 0.003, r
    # prior-centred truths: the more the prior weighs, the higher the coverage
    cov = cal.expected_coverage(np.array([0.01, 0.5, 0.9]), np.zeros(3))
    assert 0.89 < cov[0] < cov[1] < cov[2] <= 1.0
    # posterior as wide as the prior or wider: covered iff within the interval's half-width
    assert cal.expected_coverage(np.array([1.0, 1.2, 1.2]), np.array([1.6, 1.9, 2.0])).tolist() \
        == [1.0, 1.0, 0.0]


def test_fleet_is_simulated_with_the_given_truths(tmp_path):
    from bayes_latency.demo import _truth
    from bayes_latency.physics.hardware import load_gpu
    from bayes_latency.synth import fleet as synth_fleet
    from bayes_latency.synth.truth import config_id

    bench = _load("recovery_prior_truths")
    specs = synth_fleet.fleet_specs("tiny")
    cids = {config_id(s.model, load_gpu(s.gpu).name, s.tp) for s in specs}
    truths = {c: {"beta": {t: 0.5 + i for i, t in enumerate(synth_fleet.DEFAULT_TERMS)},
                  "alpha": {a: 100.0 + i for i, a in enumerate(synth_fleet.ALPHA_TERMS)}}
              for c in cids}
    orig = synth_fleet.true_coefficients
    bench._simulate_with(truths, 0, tmp_path / "fleet", "tiny")
    assert synth_fleet.true_coefficients is orig  # restored
    got = _truth(tmp_path / "fleet")
    assert set(got) == cids
    for c in cids:
        assert got[c] == {**truths[c]["beta"], **truths[c]["alpha"]}
