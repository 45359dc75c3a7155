"""The compiled scheduler loop reproduces the pure-Python engine exactly (issue #14 speed).

The digests below were computed with the pure-Python loop of ``schedule/engine.py`` at commit
7840784 (before the loop was compiled): every output array of :func:`run_engine` (steps,
events, chunks, per-request arrays, snapshots) and the generator's state after the call, on
workloads that cover chunked and unchunked prefill, prefix caching at both levels, preemption
storms, rich snapshots and more than one block of pre-drawn noise.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
import pytest

from bayes_latency.physics.basis import ALPHA_TERMS, DEFAULT_TERMS, kv_capacity_tokens
from bayes_latency.physics.hardware import load_gpu
from bayes_latency.physics.models import load_architecture
from bayes_latency.physics.serving import ServingConfig
from bayes_latency.schedule.engine import EngineConfig, EngineResult, NoiseConfig, run_engine
from bayes_latency.schedule.steptime import StepTimeModel
from bayes_latency.synth.truth import true_coefficients
from bayes_latency.synth.workloads import generate_requests, load_workload

REPLAY_NOISE = NoiseConfig(iteration_scale=0.0, iteration_clip=0.0, cpu_base_us=0.0,
                           cpu_per_request_us=0.0, cpu_sigma=0.0, wake_min_us=0.001,
                           wake_max_us=0.001, step_sample_rate=0.0, rich_subsample_rate=0.0)

CASES: dict[str, dict] = {
    "normal": {},
    "overloaded": {"gpu": "A100", "stages": ((12, 8), (8, 20)), "kv_blocks": 300,
                   "noise": NoiseConfig(step_sample_rate=1.0, rich_subsample_rate=0.3)},
    "cached": {"model": "mixtral-8x7b", "tp": 2, "workload": "codegen",
               "stages": ((6, 5), (4, 10)), "pc": True},
    "group_cache_only": {"workload": "codegen", "stages": ((5, 6),), "pc": True, "key": False,
                         "kv_blocks": 400},
    "unchunked": {"stages": ((4, 6),), "chunked": False, "budget": 8192, "max_len": 2048},
    "replay_noise_long": {"stages": ((60, 10), (40, 20)), "pc": True, "noise": REPLAY_NOISE,
                          "max_seqs": 64},
    "overloaded_cached": {"workload": "codegen", "stages": ((6, 8), (4, 16)), "pc": True,
                          "kv_blocks": 260},
    "small_seqs": {"stages": ((6, 10),), "max_seqs": 8, "kv_blocks": 600, "pc": True},
}


def _run_case(model: str = "llama-2-7b", gpu: str = "H100", tp: int = 1,
              stages=((6, 8), (4, 20)), workload: str = "general", kv_blocks: int | None = None,
              pc: bool = False, key: bool = True, chunked: bool = True, budget: int = 2048,
              max_seqs: int = 128, max_len: int = 4096, noise: NoiseConfig | None = None,
              seed: int = 0) -> tuple[EngineResult, np.random.Generator]:
    arch, g = load_architecture(model), load_gpu(gpu)
    sv = ServingConfig(tp=tp, prefix_caching=pc, max_num_batched_tokens=budget)
    truth = true_coefficients(model, gpu, tp, DEFAULT_TERMS, ALPHA_TERMS, seed=0)
    stm = StepTimeModel(arch, g, sv, truth.beta_vector(DEFAULT_TERMS))
    cap = kv_capacity_tokens(arch, g, sv)
    w = load_workload(workload).with_stages(list(stages))
    rng = np.random.default_rng(seed)
    reqs = generate_requests(w, rng, max_model_len=max_len)
    queued = (20_000_000_000_000 + reqs.send_s * 1e9 + 3e6).astype(np.int64)
    cfg = EngineConfig(max_num_batched_tokens=budget, max_num_seqs=max_seqs, block_size=16,
                       kv_capacity_blocks=kv_blocks or cap // 16, prefix_caching=pc,
                       chunked_prefill=chunked)
    pk = reqs.group * w.num_users_per_system_prompt + reqs.user if key else None
    res = run_engine(queued, reqs.prompt_len, reqs.max_tokens, reqs.group, reqs.prefix_len, stm,
                     cfg, rng, noise=noise, prompt_key=pk)
    return res, rng


def _h(a: np.ndarray) -> str:
    a = np.asarray(a)
    if a.dtype == object:
        return hashlib.sha256("\x00".join(map(str, a.tolist())).encode()).hexdigest()[:16]
    return hashlib.sha256(str(a.dtype).encode() + np.ascontiguousarray(a).tobytes()).hexdigest()[:16]


def digest(res: EngineResult, rng: np.random.Generator) -> dict[str, str]:
    """One short hash per output array (and the generator's next draw)."""
    out: dict[str, str] = {}
    for name, df in (("steps", res.steps), ("chunks", res.chunks), ("snap", res.snapshots)):
        assert isinstance(df, pd.DataFrame)
        for c in df.columns:
            out[f"{name}.{c}"] = _h(df[c].to_numpy())
    for name, d in (("ev", res.events), ("req", res.requests)):
        for c, v in d.items():
            out[f"{name}.{c}"] = _h(v)
    out["rng_next"] = repr(float(rng.random()))
    out["sizes"] = (f"{len(res.steps)}/{len(res.chunks)}/{len(res.snapshots)}/"
                    f"{len(res.events['req'])}/{int(res.requests['num_preemptions'].sum())}")
    return out


def combined(d: dict[str, str]) -> str:
    return hashlib.sha256(repr(sorted(d.items())).encode()).hexdigest()[:20]


#: case -> (steps/chunks/snapshots/events/preemptions, combined digest) of the Python loop.
FROZEN: dict[str, tuple[str, str]] = {
    'cached': ('781/70/1/280/0', '58ea004af74079a94c0b'),
    'group_cache_only': ('1109/51/9/162/21', 'f05fce732b1f62128c54'),
    'normal': ('1439/128/147/512/0', 'fbf710dc93a0c23b95b9'),
    'overloaded': ('10177/375/19174/1238/107', 'd057762abd487cf7e348'),
    'overloaded_cached': ('6479/156/42/536/44', '902b8bccfe95a8dc856d'),
    'replay_noise_long': ('11650/1400/0/5600/0', '8fd558461f6f4bd674c5'),
    'small_seqs': ('2042/60/40/240/0', 'f22364f589c9dd8b6553'),
    'unchunked': ('898/24/2/96/0', '4b1b90de4c014ae28292'),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_engine_matches_frozen_python_loop(case: str) -> None:
    d = digest(*_run_case(**CASES[case]))
    want_sizes, want = FROZEN[case]
    assert d["sizes"] == want_sizes
    assert combined(d) == want, d


if __name__ == "__main__":   # print the digests of the current engine (to freeze them)
    import time
    for c in sorted(CASES):
        t = time.process_time()
        d = digest(*_run_case(**CASES[c]))
        print(f"    {c!r}: ({d['sizes']!r}, {combined(d)!r}),  # {time.process_time() - t:.2f} s")
