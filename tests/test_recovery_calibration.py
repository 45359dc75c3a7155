"""The recovery-calibration benchmarks' pieces (no fit): the expected coverage of a calibrated
posterior, and the simulation of a fleet with given per-configuration truths."""

from __future__ import annotations

import numpy as np
from benchmark_module import load_benchmark


def test_expected_coverage_is_nominal_for_truths_drawn_from_the_prior():
    from bayes_latency.checks import recovery as cal

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
    from bayes_latency.physics.hardware import load_gpu
    from bayes_latency.study.demo import _truth
    from bayes_latency.synth import fleet as synth_fleet
    from bayes_latency.synth.truth import config_id

    bench = load_benchmark("recovery_prior_truths")
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


def test_with_calibration_places_truths_against_their_prior():
    """A truth at its prior median, once with a data-narrowed posterior (sd 0.1 prior sigma:
    calibrated coverage ~90%) and once with a posterior as wide as the prior (covered for sure
    by a calibrated posterior): the columns and the summary say so."""
    from types import SimpleNamespace

    import pandas as pd
    import xarray as xr

    from bayes_latency.checks.recovery import calibration_summary, recovery_table, with_calibration
    from bayes_latency.priors import load_priors

    pr = load_priors()
    cfgs = ["m|H100-SXM|tp1", "m|A100-80GB|tp1"]
    terms = ("decode_kv",)
    rng = np.random.default_rng(1)
    mu = [pr.log_mean_sd("decode_kv", c.split("|")[1]) for c in cfgs]
    ratios = (0.1, 1.0)
    draws = np.stack([np.exp(m + r * s * rng.standard_normal((2, 2000)))
                      for (m, s), r in zip(mu, ratios, strict=True)], axis=-1)[..., None]
    post = xr.Dataset({"beta": (("chain", "draw", "config", "term"), draws),
                       "alpha": (("chain", "draw", "config", "alpha_term"),
                                 np.ones((2, 2000, 2, 0)))},
                      coords={"config": cfgs, "term": list(terms), "alpha_term": []})
    model = SimpleNamespace(result={"posterior": post}, terms=terms, coefs=terms, priors=pr,
                            design=SimpleNamespace(configs=pd.DataFrame(index=cfgs)))
    truth = {c: {"decode_kv": float(np.exp(m))} for c, (m, _) in zip(cfgs, mu, strict=True)}
    rec = with_calibration(recovery_table(model, truth), post, terms, pr)
    assert np.allclose(rec["z_prior"], 0.0)
    assert np.allclose(rec["sd_ratio"], ratios, rtol=0.05)
    assert rec["pairs_class"].tolist() == ["identified", "prior-dominated"]
    assert abs(rec["expected_90"].iloc[0] - 0.90) < 0.01 and rec["expected_90"].iloc[1] == 1.0
    s = calibration_summary(rec)
    assert s["pairs"] == 2 and s["near_prior_median"] == 1.0 and s["identified_pairs"] == 1
    assert abs(s["expected_90"] - 0.95) < 0.01 and s["coverage_90"] == 1.0
