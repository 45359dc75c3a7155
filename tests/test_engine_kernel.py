"""The engine reproduces its stored reference outputs, on any CPU.

``tests/golden/engine_cases.npz`` holds every output array of :func:`run_engine` (steps, events,
chunks, per-request arrays, snapshots) and the generator's next raw draw, on workloads that cover
chunked and unchunked prefill, prefix caching at both levels, preemption storms, rich snapshots
and more than one block of pre-drawn noise. The values are those of the scheduling policy as first
written in plain Python, which the compiled loop ports operation for operation.

How each column is compared:

* scheduling columns (step counts, tokens, requests, events, chunks, snapshots, blocks) and the
  generator's next draw: exactly;
* ``mean_us``: against the slow definition ``basis_matrix(batch) @ beta``
  (:meth:`StepTimeModel.reference_us`) with ``rtol = 1e-9``. It is a float sum whose last bits
  depend on how numpy and BLAS vectorise on the CPU (AVX-512 or not, x86-64 or ARM);
* ``prefill_input_pairs`` (float): ``rtol = 1e-9``;
* clocks in ns (``ts_start_ns``, ``iteration_ns``, ``cpu_ns``, event ``ts_ns``,
  ``first_token_ns``, ``finished_ns``): within :data:`CLOCK_ATOL_NS`. They are integers rounded from
  float products (``rint(mean_us * exp(eps) * 1000)``), so a one-ulp change of ``mean_us`` or of
  ``exp`` can move one of them by 1 ns.

Regenerate the file (only when the policy changes on purpose) with
``python tests/test_engine_kernel.py --write``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bayes_latency.physics.basis import ALPHA_TERMS, DEFAULT_TERMS, kv_capacity_tokens
from bayes_latency.physics.hardware import load_gpu
from bayes_latency.physics.models import load_architecture
from bayes_latency.physics.serving import ServingConfig
from bayes_latency.schedule.engine import EngineConfig, EngineResult, NoiseConfig, run_engine
from bayes_latency.schedule.steptime import COLUMNS as BATCH_COLUMNS
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
              seed: int = 0) -> tuple[EngineResult, np.random.Generator, StepTimeModel]:
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
    return res, rng, stm


GOLDEN = Path(__file__).resolve().parent / "golden" / "engine_cases.npz"

#: Largest difference (ns) of a clock column from its reference (see the module docstring).
CLOCK_ATOL_NS = 1000
CLOCK_COLUMNS = frozenset({"steps.ts_start_ns", "steps.iteration_ns", "steps.cpu_ns", "ev.ts_ns",
                           "req.first_token_ns", "req.finished_ns"})
FLOAT_RTOL = 1e-9
#: Columns not stored: ``step_id`` is 1..n, ``mean_us`` is checked against its definition.
NOT_STORED = frozenset({"steps.step_id", "steps.mean_us"})


def outputs(res: EngineResult, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Every output array by ``table.column`` (snapshot phase as 1 = DECODE), and ``rng_next``."""
    out: dict[str, np.ndarray] = {}
    for name, df in (("steps", res.steps), ("chunks", res.chunks), ("snap", res.snapshots)):
        assert isinstance(df, pd.DataFrame)
        for c in df.columns:
            v = df[c].to_numpy()
            out[f"{name}.{c}"] = (v == "DECODE").astype(np.int8) if v.dtype == object else v
    for name, d in (("ev", res.events), ("req", res.requests)):
        for c, v in d.items():
            out[f"{name}.{c}"] = np.asarray(v)
    out["rng_next"] = np.array([rng.bit_generator.random_raw()], dtype=np.uint64)
    return out


def _compact(v: np.ndarray) -> np.ndarray:
    """The smallest integer type that holds ``v`` exactly (the file stays small)."""
    if v.dtype.kind in "iu" and v.size and v.dtype != np.uint64:
        for t in (np.int8, np.int16, np.int32):
            if np.iinfo(t).min <= v.min() and v.max() <= np.iinfo(t).max:
                return v.astype(t)
    return v


def _sizes(res: EngineResult) -> str:
    return (f"{len(res.steps)}/{len(res.chunks)}/{len(res.snapshots)}/"
            f"{len(res.events['req'])}/{int(res.requests['num_preemptions'].sum())}")


#: case -> steps/chunks/snapshots/events/preemptions of the reference.
SIZES: dict[str, str] = {
    "cached": "781/70/1/280/0",
    "group_cache_only": "1109/51/9/162/21",
    "normal": "1439/128/147/512/0",
    "overloaded": "10177/375/19174/1238/107",
    "overloaded_cached": "6479/156/42/536/44",
    "replay_noise_long": "11650/1400/0/5600/0",
    "small_seqs": "2042/60/40/240/0",
    "unchunked": "898/24/2/96/0",
}


@pytest.fixture(scope="module")
def golden() -> dict[str, np.ndarray]:
    with np.load(GOLDEN) as f:
        return {k: f[k] for k in f.files}


@pytest.mark.cpu_sensitive
@pytest.mark.parametrize("case", sorted(CASES))
def test_engine_matches_reference(case: str, golden: dict[str, np.ndarray]) -> None:
    res, rng, stm = _run_case(**CASES[case])
    assert _sizes(res) == SIZES[case]
    got = outputs(res, rng)
    want = {k.split("/", 1)[1]: v for k, v in golden.items() if k.startswith(f"{case}/")}
    assert set(got) - NOT_STORED == set(want)
    steps = res.steps
    np.testing.assert_array_equal(steps["step_id"].to_numpy(), np.arange(1, len(steps) + 1))
    np.testing.assert_allclose(steps["mean_us"].to_numpy(),
                               stm.reference_us(steps[list(BATCH_COLUMNS)]), rtol=FLOAT_RTOL,
                               err_msg="steps.mean_us")
    for k, ref in sorted(want.items()):
        v = got[k]
        if k in CLOCK_COLUMNS:
            assert v.shape == ref.shape, k
            diff = np.abs(v.astype(np.int64) - ref.astype(np.int64))
            assert diff.max(initial=0) <= CLOCK_ATOL_NS, (k, int(diff.max()))
        elif v.dtype.kind == "f":
            np.testing.assert_allclose(v, ref, rtol=FLOAT_RTOL, atol=0, err_msg=k)
        else:
            np.testing.assert_array_equal(v, ref.astype(v.dtype), err_msg=k, strict=True)


if __name__ == "__main__" and "--write" in sys.argv:   # store the current engine's outputs
    arrays: dict[str, np.ndarray] = {}
    for c in sorted(CASES):
        r, g, _ = _run_case(**CASES[c])
        print(f"    {c!r}: {_sizes(r)!r},")
        arrays.update({f"{c}/{k}": _compact(v) for k, v in outputs(r, g).items()
                       if k not in NOT_STORED})
    np.savez_compressed(GOLDEN, **arrays)
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size} bytes)")
