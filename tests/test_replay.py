"""Client-side rows: replay through the reference scheduler, linear functionals, row schema."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bayes_latency.data.observations.build import validate_observations
from bayes_latency.errors import ConfigError
from bayes_latency.physics.basis import DEFAULT_TERMS
from bayes_latency.physics.hardware import load_gpu
from bayes_latency.physics.models import load_architecture
from bayes_latency.schedule.replay import (
    MAX_CACHE_FRACTION,
    WORKLOAD_KINDS,
    ClientStage,
    cache_fraction,
    predicted_means,
    replay_stage,
    stage_requests,
    workload_rows,
)

pytestmark = pytest.mark.cpu_sensitive  # float results: .ci/run reruns them without AVX-512

ARCH = load_architecture("llama-2-7b")
GPU = load_gpu("H100")
#: BLIS-like coefficients in DEFAULT_TERMS order.
BETA = np.array([0.5, 1.0, 0.5, 1.4, 1.5, 15.0, 30.0, 4.0, 120.0, 0.0, 0.0])
ALPHA = {"alpha_arrival": 15000.0, "alpha_post_decode": 800.0, "alpha_per_token": 40.0}


def _stage(**kw) -> ClientStage:
    base = dict(run_id="r", stage=0, model="llama-2-7b", gpu="H100", tp=1,
                observed={"ttft_mean_us": 30_000.0, "e2e_mean_us": 2.0e6,
                          "output_len_mean": 200.0},
                kv_blocks=8000, rate=6.0, count=400, prompt_len=590,
                output_pdf={150: 0.3, 250: 0.7}, system_prompt_len=100, num_groups=11,
                users_per_group=4)
    base.update(kw)
    return ClientStage(**base)


def test_rows_are_the_engine_means_in_linear_form():
    """features . beta equals the replayed engine's own mean TTFT / E2E (to 1e-6: the engine
    rounds step times to whole ns)."""
    rep = replay_stage(_stage(), ARCH, GPU, BETA, DEFAULT_TERMS)
    for k in WORKLOAD_KINDS:
        assert rep.features[k] @ BETA == pytest.approx(rep.engine_us[k], rel=1e-6)
    assert rep.n_requests == 400 and rep.n_steps > 400
    # TTFT < E2E; the decode interval is near one decode step (~ a few ms for 7B on H100)
    assert rep.engine_us["workload_ttft"] < rep.engine_us["workload_e2e"]
    assert 1_000 < rep.engine_us["workload_decode"] < 50_000


def test_alpha_enters_as_blis_adds_it():
    rep = replay_stage(_stage(), ARCH, GPU, BETA, DEFAULT_TERMS)
    p0 = predicted_means(rep, BETA, {})
    p1 = predicted_means(rep, BETA, ALPHA)
    # TTFT: alpha_0 + alpha_2; E2E: alpha_0 + alpha_1 + N alpha_2
    assert p1["workload_ttft"] - p0["workload_ttft"] == pytest.approx(15040.0)
    assert p1["workload_e2e"] - p0["workload_e2e"] == pytest.approx(
        15000 + 800 + 40 * rep.mean_output)
    assert rep.mean_output == pytest.approx(0.3 * 150 + 0.7 * 250, abs=0.5)


def test_slower_steps_queue_more():
    """The schedule depends on the coefficients: 3x slower steps give a longer TTFT than 3x the
    fast one's (queueing), which is why calibration iterates."""
    fast = replay_stage(_stage(rate=12.0), ARCH, GPU, BETA, DEFAULT_TERMS)
    slow = replay_stage(_stage(rate=12.0), ARCH, GPU, 3 * BETA, DEFAULT_TERMS)
    assert slow.engine_us["workload_ttft"] > 3 * fast.engine_us["workload_ttft"]
    # the features moved too: not just a rescaling
    assert not np.allclose(slow.features["workload_e2e"], fast.features["workload_e2e"])


def test_prefix_caching_shrinks_prefill():
    cached = replay_stage(_stage(), ARCH, GPU, BETA, DEFAULT_TERMS)
    plain = replay_stage(_stage(prefix_caching=False), ARCH, GPU, BETA, DEFAULT_TERMS)
    j = list(DEFAULT_TERMS).index("prefill_compute")
    assert cached.features["workload_ttft"][j] < 0.2 * plain.features["workload_ttft"][j]


def test_prefix_cache_holds_every_repeated_prompt():
    """Repeated prompts that need more than the engine's default quarter of the KV blocks are
    all cached (vLLM keeps them in the free blocks): the prefill features do not depend on how
    much room beside them the KV cache has."""
    kw = dict(prompt_len=786, system_prompt_len=150, num_groups=10, users_per_group=5)
    small, large = _stage(kv_blocks=6886, **kw), _stage(kv_blocks=40_000, **kw)
    f = cache_fraction(stage_requests(small), 16, 6886)
    need = 10 * (150 // 16) + 50 * (785 // 16 - 150 // 16)   # groups' and users' full blocks
    assert f == pytest.approx((need + 1) / 6886) and 0.25 < f < MAX_CACHE_FRACTION
    assert cache_fraction(stage_requests(large), 16, 40_000) == 0.25
    # distinct prompts (no group) are never repeated: the default room
    assert cache_fraction(stage_requests(_stage(num_groups=0)), 16, 100) == 0.25
    j = list(DEFAULT_TERMS).index("prefill_compute")
    a = replay_stage(small, ARCH, GPU, BETA, DEFAULT_TERMS).features["workload_ttft"][j]
    b = replay_stage(large, ARCH, GPU, BETA, DEFAULT_TERMS).features["workload_ttft"][j]
    assert a == pytest.approx(b, rel=0.05)


def test_recorded_requests_are_replayed_as_given():
    st = _stage(arrival_s=(0.0, 0.5, 0.25), prompt_tokens=(100, 200, 300),
                output_tokens=(5, 6, 7), num_groups=0)
    req = stage_requests(st)
    assert req["arrival_ns"].tolist() == [0, 500_000_000, 250_000_000]
    assert req["max_tokens"].tolist() == [5, 6, 7]
    rep = replay_stage(st, ARCH, GPU, BETA, DEFAULT_TERMS)
    assert rep.n_requests == 3 and rep.mean_output == pytest.approx(6.0)


def test_drawn_requests_are_seeded_and_stratified():
    a, b = stage_requests(_stage()), stage_requests(_stage())
    assert a.equals(b)
    assert (a["max_tokens"] == 250).mean() == pytest.approx(0.7, abs=0.01)
    assert a["group"].max() < 11 and a["prompt_key"].max() < 44


def test_rows_schema_and_values():
    st = _stage()
    rep = replay_stage(st, ARCH, GPU, BETA, DEFAULT_TERMS)
    rows = workload_rows(st, rep, ARCH, GPU, DEFAULT_TERMS)
    validate_observations(rows)
    assert rows["kind"].tolist() == list(WORKLOAD_KINDS)
    assert rows["role"].tolist() == ["workload", "workload", "ppc"]
    assert rows["config_id"].unique().tolist() == [f"llama-2-7b|{GPU.name}|tp1"]
    assert rows["experiment_id"].unique().tolist() == ["r/stage0"]
    dec = rows.set_index("kind").loc["workload_decode", "value_us"]
    assert dec == pytest.approx((2.0e6 - 30_000.0) / 199.0)
    # a missing measurement leaves its row out
    st2 = _stage(observed={"e2e_mean_us": 2e6, "output_len_mean": 200.0})
    assert workload_rows(st2, rep, ARCH, GPU, DEFAULT_TERMS)["kind"].tolist() == ["workload_e2e"]


@pytest.mark.parametrize("kw, field", [
    ({"rate": 0.0}, "rate"), ({"count": 0}, "count"), ({"output_pdf": {}}, "output_pdf"),
    ({"kv_blocks": 0}, "kv_blocks"), ({"arrival_s": (0.0,), "prompt_tokens": (1, 2),
                                       "output_tokens": (1,)}, "arrival_s"),
])
def test_bad_stage_is_a_clear_error(kw, field):
    with pytest.raises(ConfigError, match=field):
        replay_stage(_stage(**kw), ARCH, GPU, BETA, DEFAULT_TERMS)


def test_bad_beta_and_oversized_requests():
    with pytest.raises(ConfigError, match="beta"):
        replay_stage(_stage(), ARCH, GPU, -BETA, DEFAULT_TERMS)
    with pytest.raises(ConfigError, match="KV cache"):
        replay_stage(_stage(kv_blocks=10), ARCH, GPU, BETA, DEFAULT_TERMS)
    assert math.isfinite(replay_stage(_stage(), ARCH, GPU, BETA).engine_us["workload_e2e"])


def test_prompt_sharing_system_caches_only_the_system_prompt():
    whole, system = _stage(), _stage(prompt_sharing="system")
    a, b = stage_requests(whole), stage_requests(system)
    # same arrivals, lengths, groups and shared prefix; only the prompts' own part differs
    for c in ("arrival_ns", "prompt_len", "max_tokens", "group", "prefix_len"):
        assert a[c].equals(b[c])
    assert a["prompt_key"].nunique() <= 44 and b["prompt_key"].nunique() == len(b)
    ra = replay_stage(whole, ARCH, GPU, BETA, DEFAULT_TERMS, keep_steps=True)
    rb = replay_stage(system, ARCH, GPU, BETA, DEFAULT_TERMS, keep_steps=True)
    # every request computes its prompt past the system prompt: more prefill tokens
    assert rb.steps["prefill_tokens"].sum() > 2 * ra.steps["prefill_tokens"].sum()
    assert ra.step_features.shape == (ra.n_steps, len(DEFAULT_TERMS))
    np.testing.assert_allclose(ra.step_features.sum(axis=0) @ BETA / 1e3,
                               ra.steps["iteration_ns"].sum() / 1e6, rtol=1e-6)
    assert replay_stage(whole, ARCH, GPU, BETA, DEFAULT_TERMS).steps is None
    with pytest.raises(ConfigError, match="prompt_sharing"):
        stage_requests(_stage(prompt_sharing="user"))


def test_replay_terms_cover_blis_and_the_fits_extra_terms():
    from bayes_latency.physics.basis import REGIME_TERMS, replay_terms

    assert replay_terms(("prefill_compute", "per_step")) == DEFAULT_TERMS
    assert replay_terms(REGIME_TERMS) == REGIME_TERMS
    assert replay_terms(("per_step", "compute_over_6w")) == DEFAULT_TERMS + ("compute_over_6w",)


def test_arrival_rate_of_drawn_and_recorded_requests():
    assert _stage().arrival_rate == 6.0
    rec = _stage(arrival_s=(0.0, 0.5, 1.0, 2.0), prompt_tokens=(100,) * 4,
                 output_tokens=(5,) * 4, num_groups=0)
    assert rec.arrival_rate == pytest.approx(1.5)
    one = _stage(arrival_s=(3.0,), prompt_tokens=(100,), output_tokens=(5,), num_groups=0)
    assert one.arrival_rate == math.inf
