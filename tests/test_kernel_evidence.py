"""Kernel evidence: the tables reduced per GPU, the measurement in the hierarchy, the GPU x stack
interaction, and an unseen GPU drawn conditioned on its kernels."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from obs_factory import make_observations
from test_kernels import _gemm, _write

from bayes_latency.data.kernel_evidence import (
    KERNEL_TERMS,
    KernelEvidence,
    canonical_gpu,
    kernel_evidence,
)
from bayes_latency.data.kernels import kernel_data_root
from bayes_latency.errors import BayesLatencyError, ConfigError
from bayes_latency.model.definition.design import prior_arrays
from bayes_latency.model.definition.population import fixed_quantities
from bayes_latency.model.estimator import LatencyModel
from bayes_latency.model.posterior.unseen import config_log_location

TERMS = tuple(KERNEL_TERMS)


def _evidence(gpus=("A100-80GB", "H100-SXM", "L40S"), stack="vllm") -> KernelEvidence:
    logt = np.asarray([[0.27, 0.27, 0.16], [0.14, 0.14, 0.22], [0.26, 0.26, 0.46]])[:len(gpus)]
    return KernelEvidence(tuple(gpus), TERMS, logt, np.full(logt.shape, 100.0), stack, "test")


def test_evidence_is_validated_restricted_and_round_trips():
    ev = _evidence()
    back = KernelEvidence.from_json(ev.to_json())
    assert back.gpus == ev.gpus and back.terms == ev.terms and back.hash == ev.hash
    assert np.allclose(back.log_time, ev.log_time, rtol=0, atol=1e-12)
    r = ev.restricted(("weight_loading", "per_step"))
    assert r.terms == ("weight_loading",) and r.log_time.shape == (3, 1)
    assert ev.restricted(("per_step",)) is None
    assert ev.index_of("A100") == 0 and ev.index_of("H200") is None
    assert canonical_gpu("H100") == "H100-SXM" and canonical_gpu("no-such-gpu") == "no-such-gpu"
    with pytest.raises(BayesLatencyError, match="shape"):
        KernelEvidence(("H100-SXM",), TERMS, np.zeros((2, 3)), np.ones((2, 3)), "vllm", "x")
    with pytest.raises(BayesLatencyError, match="not finite"):
        KernelEvidence(("H100-SXM",), TERMS, np.full((1, 3), np.nan), np.ones((1, 3)), "vllm",
                       "x")
    with pytest.raises(BayesLatencyError, match="per_step"):
        KernelEvidence(("H100-SXM",), ("per_step",), np.zeros((1, 1)), np.ones((1, 1)), "vllm",
                       "x")


def test_evidence_from_tables_is_minus_log_of_the_median_share(tmp_path):
    _write(tmp_path, "h100_sxm", "0.10.0", [
        _gemm(8192, 8192, 8192, 0.8, "compute"), _gemm(16384, 8192, 8192, 0.7, "compute"),
        _gemm(8192, 16384, 8192, 0.75, "compute"),
        _gemm(1, 16384, 16384, 0.9, "memory"), _gemm(4, 16384, 16384, 0.8, "memory")])
    ev = kernel_evidence(tmp_path)
    assert ev.gpus == ("H100-SXM",) and ev.terms == TERMS and ev.stack == "vllm"
    got = dict(zip(ev.terms, ev.log_time[0], strict=True))
    assert got["prefill_compute"] == pytest.approx(-np.log(0.75), abs=1e-9)
    assert got["weight_loading"] == pytest.approx(-np.log(0.85), abs=1e-9)
    assert got["decode_kv"] == got["weight_loading"]
    assert "h100_sxm 0.10.0" in ev.source


def test_evidence_without_both_regimes_is_refused(tmp_path):
    _write(tmp_path, "h100_sxm", "0.10.0", [_gemm(8192, 8192, 8192, 0.8, "compute")])
    with pytest.raises(BayesLatencyError, match="both regimes"):
        kernel_evidence(tmp_path)


@pytest.mark.skipif(kernel_data_root() is None, reason="aiconfigurator-core is not installed")
def test_installed_tables_give_the_a100_slower_weight_reads_than_the_h100():
    ev = kernel_evidence()
    a, h = ev.index_of("A100"), ev.index_of("H100")
    wl = ev.terms.index("weight_loading")
    # vLLM's memory-bound GEMMs: the A100 reaches a smaller share of its datasheet bandwidth
    assert ev.log_time[a, wl] > ev.log_time[h, wl] + 0.05


@pytest.fixture(scope="module")
def mixed():
    """The test fleet, with two of its configurations also measured in a second stack."""
    obs, _ = make_observations(n_iter=120, n_win=120, n_alpha=60, seed=4)
    bench = obs[obs["config_id"].isin(["llama-2-70b|A100|tp4", "llama-2-70b|H100|tp4"])
                & (obs["kind"] == "iteration")].copy()
    bench["stack"] = "splitwise"
    bench["config_id"] = bench["config_id"] + "|splitwise"
    bench["obs_id"] = bench["obs_id"].astype(str) + "|splitwise"
    return pd.concat([obs.assign(stack="vllm"), bench], ignore_index=True)


def test_model_measures_the_gpu_effect_and_lets_other_stacks_depart(mixed):
    ev = _evidence()
    m = LatencyModel(kernels=ev)
    model = m.build(mixed)
    free = {v.name for v in model.free_RVs}
    assert {"kernel_offset", "z_gpu_stack"} <= free
    assert "eff_gpu_stack" in {v.name for v in model.deterministics}
    fixed = fixed_quantities(model)
    assert {"kernel_log_time", "kernel_sigma", "kernel_stack", "sigma_gpu_stack"} <= set(fixed)
    assert fixed["kernel_stack"][1].tolist() == [0.0, 1.0]  # stacks: splitwise, vllm
    # the interaction only on the measured terms
    scale = dict(zip(m.coefs, fixed["sigma_gpu_stack"][1], strict=True))
    assert all(scale[c] == (0.25 if c in TERMS else 0.0) for c in m.coefs)
    assert list(model.coords["kernel_gpu"]) == list(ev.gpus)
    # the measurement's log density at a point, by hand
    pot = next(p for p in model.potentials if p.name == "loglik_kernels")
    ip = model.initial_point()
    ip = {**ip, "kernel_offset": np.asarray([0.1, 0.2, 0.3])}
    outs = model.replace_rvs_by_values([pot, model["eff_gpu"]])
    val, eff = model.compile_fn(outs, inputs=model.value_vars, on_unused_input="ignore")(ip)
    s = m.priors.hierarchy["kernel"]["sigma"]
    want = 0.0
    for g, gpu in enumerate(m.design.gpus):  # A100 and H100 of the fleet; L40S not in the fit
        i = ev.index_of(gpu)
        for t, term in enumerate(ev.terms):
            r = (ev.log_time[i, t] - [0.1, 0.2, 0.3][t] - eff[g, m.coefs.index(term)]) / s
            want += -0.5 * r * r - np.log(s) - 0.5 * np.log(2 * np.pi)
    assert float(val) == pytest.approx(want, rel=1e-9, abs=1e-9)


def test_one_stack_has_no_interaction_and_variants_without_effects_are_refused(mixed):
    m = LatencyModel(kernels=_evidence())
    model = m.build(mixed[mixed["stack"] == "vllm"])
    free = {v.name for v in model.free_RVs}
    assert "kernel_offset" in free and "z_gpu_stack" not in free
    # evidence on GPUs the fleet does not have: no measurement in the fit
    model = LatencyModel(kernels=_evidence(gpus=("L40S",))).build(mixed)
    assert "kernel_offset" not in {v.name for v in model.free_RVs}
    with pytest.raises(ConfigError, match="complete_pooling"):
        LatencyModel(kernels=_evidence(), variant="complete_pooling")


def _post(m: LatencyModel, S: int, sigma_gpu: float) -> xr.Dataset:
    """A stacked posterior of a fit with kernel evidence on A100 and H100 (zero effects)."""
    K, coefs = len(m.coefs), list(m.coefs)
    ev = _evidence()
    T = len(ev.terms)
    measured = np.asarray([c in TERMS for c in coefs], dtype=float)[:, None]
    return xr.Dataset({
        "mu": (("coef", "sample"), np.zeros((K, S))),
        "eff_model": (("llm", "coef", "sample"), np.zeros((1, K, S))),
        "eff_gpu": (("gpu", "coef", "sample"), np.zeros((2, K, S))),
        "eff_tp": (("tp", "coef", "sample"), np.zeros((1, K, S))),
        "eff_stack": (("stack", "coef", "sample"), np.zeros((2, K, S))),
        "eff_gpu_stack": (("gpu", "coef", "sample"),
                          np.stack([np.full((K, S), 0.2), np.full((K, S), -0.2)]) * measured),
        "sigma_gpu": (("coef", "sample"), np.full((K, S), sigma_gpu)),
        "sigma_gpu_stack": (("coef", "sample"), np.full((K, S), 0.25) * measured),
        "sigma_config": (("coef", "sample"), np.full((K, S), 1e-9)),
        "kernel_log_time": (("kernel_gpu", "kernel_term", "sample"),
                            np.repeat(ev.log_time[:, :, None], S, axis=2)),
        "kernel_offset": (("kernel_term", "sample"), np.full((T, S), 0.2)),
        "kernel_sigma": (("sample",), np.full(S, 0.15)),
        "kernel_stack": (("stack", "sample"), np.asarray([[0.0] * S, [1.0] * S])),
    }, coords={"coef": coefs, "llm": ["llama-2-7b"], "gpu": ["A100", "H100"], "tp": [1],
               "stack": ["splitwise", "vllm"], "kernel_gpu": list(ev.gpus),
               "kernel_term": list(ev.terms)})


def test_unseen_gpu_is_its_population_conditioned_on_its_kernels(mixed):
    m = LatencyModel(kernels=_evidence())
    m.build(mixed)
    S, sig = 40_000, 0.3
    post = _post(m, S, sig)
    pa = prior_arrays(m.priors, m.coefs, ["L40S"])
    logt, unseen = config_log_location(post, pa, "llama-2-7b", "L40S", 1, "vllm",
                                       np.random.default_rng(0), design=m.design,
                                       variant="hierarchy")
    assert unseen == ["gpu"]
    eff = logt - pa.gpu_offset[0][None, :]
    v = sig**2 * (1 + 1 / 2)  # a new level of 2 seen ones
    s2 = 0.15**2
    for t, term in enumerate(TERMS):
        r = _evidence().log_time[2, t] - 0.2
        k = m.coefs.index(term)
        want_mean, want_sd = v / (v + s2) * r, np.sqrt(v * s2 / (v + s2))
        # Monte Carlo over 40,000 draws: 4 standard errors
        assert abs(eff[:, k].mean() - want_mean) < 4 * want_sd / np.sqrt(S)
        assert eff[:, k].std() == pytest.approx(want_sd, rel=0.03)
    # a term the kernels do not measure keeps its population
    k = m.coefs.index("per_step")
    assert abs(eff[:, k].mean()) < 4 * np.sqrt(v / S)
    assert eff[:, k].std() == pytest.approx(np.sqrt(v), rel=0.03)


def test_other_stacks_add_their_gpu_stack_interaction(mixed):
    m = LatencyModel(kernels=_evidence())
    m.build(mixed)
    post = _post(m, 2000, 0.3)
    pa = prior_arrays(m.priors, m.coefs, ["A100"])

    def loc(gpu: str, stack: str) -> np.ndarray:
        return config_log_location(post, prior_arrays(m.priors, m.coefs, [gpu]), "llama-2-7b",
                                   gpu, 1, stack, np.random.default_rng(1), design=m.design,
                                   variant="hierarchy")[0]

    on = [m.coefs.index(t) for t in TERMS]
    off = [k for k in range(len(m.coefs)) if k not in on]
    # a seen GPU: its fitted interaction on the other stack, none on the tables' stack
    d = loc("A100", "splitwise") - loc("A100", "vllm")
    assert np.allclose(d[:, on], 0.2, rtol=0, atol=1e-12)
    assert np.allclose(d[:, off], 0.0, rtol=0, atol=1e-12)
    d = loc("H100", "splitwise") - loc("H100", "vllm")
    assert np.allclose(d[:, on], -0.2, rtol=0, atol=1e-12)
    # an unseen GPU on the other stack: a draw of N(0, 0.25^2 (1 + 1/2)) on the measured terms
    d = loc("L40S", "splitwise") - loc("L40S", "vllm")
    assert d[:, on].std(axis=0).min() == pytest.approx(0.25 * np.sqrt(1.5), rel=0.1)
    assert np.allclose(d[:, off], 0.0, rtol=0, atol=1e-12)
    assert pa.gpu_offset.shape == (1, len(m.coefs))


@pytest.fixture(scope="module")
def kernel_fit(mixed, tmp_path_factory):
    """A real fit of the mixed fleet with kernel evidence, saved and loaded back."""
    m = LatencyModel(kernels=_evidence()).fit(mixed, draws=400, tune=400, chains=2, seed=2,
                                              max_draws=None)
    path = tmp_path_factory.mktemp("kernels") / "fit.nc"
    m.save(path)
    return m, LatencyModel.load(path)


def test_fit_with_kernels_saves_loads_and_predicts_an_unseen_gpu(kernel_fit):
    import arviz as az

    fitted, loaded = kernel_fit
    assert loaded.kernels is not None and loaded.kernels.hash == _evidence().hash
    assert "kernel_offset" in loaded.result["posterior"]
    assert "kernel_log_time" in loaded.result["constant_data"]
    summ = az.summary(loaded.result)
    assert any(str(i).startswith("kernel_offset") for i in summ.index)
    # an unseen GPU the tables hold is drawn narrower than one they do not (the same
    # population scale: only the kernel measurement differs)
    held = loaded.coefficients("llama-2-7b", "L40S", 1, n_draws=2000, seed=0)
    free = loaded.coefficients("llama-2-7b", "L4", 1, n_draws=2000, seed=0)
    assert "gpu" in held.attrs["unseen_levels"] and "gpu" in free.attrs["unseen_levels"]
    sd = [np.log(c["beta"].sel(term="weight_loading").values.astype(float)).std()
          for c in (held, free)]
    assert sd[0] < 0.8 * sd[1]


def test_population_of_a_kernel_fit_keeps_the_evidence(kernel_fit, tmp_path):
    from bayes_latency.model.posterior.fleet import population_from_result
    from bayes_latency.model.posterior.population_file import load_population

    _, loaded = kernel_fit
    pop = population_from_result(loaded.result, n_samples=200, source="test")
    path = pop.save(tmp_path / "pop.nc")
    back = load_population(path)
    assert {"kernel_offset", "kernel_log_time", "kernel_sigma", "kernel_stack",
            "sigma_gpu_stack", "eff_gpu_stack"} <= set(back.draws.data_vars)
    cfgs = pd.DataFrame({"model": ["llama-2-7b", "llama-2-7b"], "gpu": ["L40S", "L4"],
                         "tp": [1, 1], "stack": ["vllm", "vllm"]}, index=["a", "b"])
    draws, unseen = back.location_draws(cfgs, n_draws=2000, seed=0)
    assert unseen["a"] == unseen["b"] == ["gpu"]
    k = back.coefs.index("weight_loading")
    # the L40S conditioned on its kernels, the L4 (no table) from the population alone
    assert draws[:, 0, k].std() < 0.8 * draws[:, 1, k].std()
    assert back.coefficients("llama-2-7b", "L40S", 1, n_draws=20).attrs["kernel_terms"] \
        == ",".join(TERMS)
    assert back.describe()["kernels"] == "test"  # the evidence's source, for reports


def test_export_notes_name_the_kernel_tables_of_an_unseen_gpu(kernel_fit):
    from bayes_latency.export.document import export_notes

    _, loaded = kernel_fit
    held = loaded.coefficients("llama-2-7b", "L40S", 1, n_draws=50, seed=0)
    free = loaded.coefficients("llama-2-7b", "L4", 1, n_draws=50, seed=0)
    assert held.attrs["kernel_terms"] == ",".join(TERMS) and "kernel_terms" not in free.attrs
    assert any("conditioned on its vLLM GEMM efficiency" in n and "weight_loading" in n
               for n in export_notes(held))
    assert not any("GEMM" in n for n in export_notes(free))
    # an unseen GPU is an unseen level, with or without kernels: never "every level was seen"
    assert not any("every level was seen" in n for n in export_notes(held) + export_notes(free))
    # a seen GPU takes its fitted effect: no such note
    seen = loaded.coefficients("llama-2-7b", "A100", 1, n_draws=50, seed=0)
    assert "kernel_terms" not in seen.attrs


def test_study_client_takes_the_kernels_by_default(monkeypatch, tmp_path):
    """``study client`` and ``study fewshot`` fit with the kernel tables unless
    ``--no-kernels``; without the optional extra they stop before any fit, naming
    ``--no-kernels``."""
    import bayes_latency.data.kernel_evidence as ke
    from bayes_latency.cli.main import build_parser
    from bayes_latency.study.client import blis as study
    from bayes_latency.study.client import fewshot

    for name in ("client", "fewshot"):
        assert build_parser().parse_args(["study", name]).kernels is True
        assert build_parser().parse_args(["study", name, "--no-kernels"]).kernels is False

    def missing(*_a, **_k):
        raise BayesLatencyError("AIConfigurator's kernel tables are not installed")

    monkeypatch.setattr(ke, "kernel_evidence", missing)
    import bayes_latency.study.realdata as realdata

    monkeypatch.setattr(realdata, "real_data_dir", lambda: tmp_path)
    with pytest.raises(BayesLatencyError, match="--no-kernels"):
        study.main(tmp_path / "out")
    with pytest.raises(BayesLatencyError, match="--no-kernels"):
        fewshot.main(tmp_path / "out", blis=tmp_path / "no-blis")
    assert not (tmp_path / "out").exists()
