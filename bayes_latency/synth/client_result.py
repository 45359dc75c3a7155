"""A synthetic ``vllm bench serve`` result: one open-loop run through the synthetic engine.

For tutorials and tests of ``bayes-latency calibrate``: the requests (Poisson arrivals, random
prompt and output lengths) run through :func:`~bayes_latency.schedule.engine.run_engine` at known
coefficients with step-time noise, and the client's view of each request is written the way
``vllm bench serve --save-result [--save-detailed]`` writes it. The alpha terms have BLIS's
meaning (``alpha_arrival`` delays the request's arrival at the scheduler and is in TTFT,
``alpha_per_token`` is added to the first token and to every later one, ``alpha_post_decode``
once at the end), each drawn per request with a small log-normal jitter.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from bayes_latency.physics.basis import DEFAULT_TERMS, term_names
from bayes_latency.physics.hardware import load_gpu
from bayes_latency.physics.models import load_architecture
from bayes_latency.physics.serving import ServingConfig

__all__ = ["synthetic_vllm_bench"]


def synthetic_vllm_bench(model: str, gpu: str, tp: int, beta: Sequence[float],
                         alpha: Mapping[str, float], rate: float = 4.0, num_prompts: int = 300,
                         prompt_len: tuple[int, int] = (200, 1000),
                         output_len: tuple[int, int] = (50, 400), kv_blocks: int = 20_000,
                         max_num_seqs: int = 128, max_num_batched_tokens: int = 2048,
                         detailed: bool = True, alpha_jitter: float = 0.1,
                         terms: Sequence[str] = DEFAULT_TERMS, seed: int = 0) -> dict[str, Any]:
    """A ``vllm bench serve --save-result`` document (a dict to ``json.dump``) of a synthetic run.

    Parameters
    ----------
    model, gpu, tp
        The configuration.
    beta, alpha
        True coefficients (``beta`` over ``terms``, µs per feature unit; ``alpha`` by alpha
        term, µs).
    rate, num_prompts
        Poisson request rate (req/s) and number of requests.
    prompt_len, output_len
        Uniform ranges (inclusive) of prompt and output tokens.
    kv_blocks, max_num_seqs, max_num_batched_tokens
        Server settings.
    detailed
        Write the per-request lists (``--save-detailed``): ``input_lens``, ``output_lens``,
        ``ttfts``, ``latencies``, ``start_times``, ``errors``.
    alpha_jitter
        Log-normal sigma of each request's alpha terms.
    """
    from bayes_latency.schedule.engine import EngineConfig, NoiseConfig, run_engine
    from bayes_latency.schedule.steptime import StepTimeModel

    arch, g = load_architecture(model), load_gpu(gpu)
    terms = tuple(term_names(terms))
    rng = np.random.default_rng(seed)
    n = int(num_prompts)
    send = np.cumsum(rng.exponential(1.0 / rate, size=n))
    send -= send[0]
    p = rng.integers(prompt_len[0], prompt_len[1] + 1, size=n)
    o = rng.integers(output_len[0], output_len[1] + 1, size=n)

    def jit(name: str) -> np.ndarray:
        return float(alpha.get(name, 0.0)) * np.exp(alpha_jitter * rng.standard_normal(n)
                                                    - 0.5 * alpha_jitter ** 2)

    a0, a1, a2 = jit("alpha_arrival"), jit("alpha_post_decode"), jit("alpha_per_token")
    queued = np.round((send + a0 * 1e-6) * 1e9).astype(np.int64)
    serving = ServingConfig(tp=int(tp), max_num_batched_tokens=int(max_num_batched_tokens),
                            max_num_seqs=int(max_num_seqs))
    cfg = EngineConfig(max_num_batched_tokens=int(max_num_batched_tokens),
                       max_num_seqs=int(max_num_seqs), kv_capacity_blocks=int(kv_blocks),
                       prefix_caching=True, chunked_prefill=True)
    noise = NoiseConfig(cpu_base_us=0.0, cpu_per_request_us=0.0, cpu_sigma=0.0,
                        step_sample_rate=0.0, rich_subsample_rate=0.0)
    st = StepTimeModel(arch, g, serving, np.asarray(beta, dtype=float), terms)
    res = run_engine(queued, p, o, np.arange(n), np.zeros(n, dtype=np.int64), st, cfg,
                     np.random.default_rng(seed + 1), noise,
                     prompt_key=np.arange(n) + n)
    steps = res.steps
    ends = (steps["ts_start_ns"].to_numpy(np.int64) + steps["iteration_ns"].to_numpy(np.int64))
    ft = res.requests["first_token_step"].astype(np.int64)
    fin = res.requests["finished_step"].astype(np.int64)
    sent_ns = np.round(send * 1e9)
    ttft = (ends[ft - 1] - sent_ns) / 1e9 + a2 * 1e-6
    e2e = (ends[fin - 1] - sent_ns) / 1e9 + (a1 + o * a2) * 1e-6
    tpot = (e2e - ttft) / np.maximum(o - 1, 1)
    duration = float(np.max(send + e2e))

    def stats(name: str, v: np.ndarray) -> dict[str, float]:
        ms = v * 1e3
        return {f"mean_{name}_ms": float(ms.mean()), f"median_{name}_ms": float(np.median(ms)),
                f"std_{name}_ms": float(ms.std()),
                f"p99_{name}_ms": float(np.percentile(ms, 99))}

    doc: dict[str, Any] = {
        "date": "20260101-000000", "backend": "vllm", "label": "synthetic",
        "model_id": str(model), "tokenizer_id": str(model), "num_prompts": n,
        "request_rate": float(rate) if math.isfinite(rate) else "inf", "burstiness": 1.0,
        "max_concurrency": None, "tensor_parallel_size": int(tp),
        "duration": duration, "completed": n, "failed": 0,
        "total_input_tokens": int(p.sum()), "total_output_tokens": int(o.sum()),
        "request_throughput": n / duration, "output_throughput": float(o.sum()) / duration,
        "total_token_throughput": float(p.sum() + o.sum()) / duration,
        **stats("ttft", ttft), **stats("tpot", tpot), **stats("e2el", e2e),
    }
    if detailed:
        doc.update({"input_lens": p.tolist(), "output_lens": o.tolist(),
                    "ttfts": ttft.tolist(), "latencies": e2e.tolist(),
                    "start_times": (1000.0 + send).tolist(), "errors": [""] * n})
    return doc
