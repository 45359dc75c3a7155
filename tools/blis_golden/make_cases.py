"""Write the cases JSON for the BLIS golden step-time fixture (input of ``main.go``).

Plain Python + numpy, seeded (same output on every run). Run from the repository root::

    python tools/blis_golden/make_cases.py OUT.json [--configs ../shared/data/real/model-configs]

Cases (>= 240) cover dense MHA (Llama-2-7B), GQA (Llama-2-70B, CodeLlama-34B, Llama-3.1-8B),
uniform MoE (Mixtral-8x7B, Qwen3-30B-A3B) and interleaved MoE FP8 (Llama-4-Scout); TP 1, 2, 4, 8
where BLIS accepts it (query and KV heads divisible by TP); DP 2 for MoE; GPUs H100 and A100-SXM
(some L40S); prefill-only, decode-only and mixed batches with short and long contexts.

A request is ``{input_len, progress_index, num_new_tokens, n_output}`` with BLIS's meaning
(``sim/simulator.go`` executeBatchStep / processCompletions):

- prefill: ``progress_index < input_len`` (tokens already computed: earlier chunks or prefix-cache
  hits), ``num_new_tokens`` = this step's chunk ``<= input_len - progress_index``;
- decode: ``progress_index = input_len + g`` after ``g`` generated-and-fed-back tokens; a request
  with ``n_output`` output tokens decodes while ``progress_index <= input_len + n_output - 2``
  (it completes when ``progress_index >= input_len + n_output - 1``), so
  ``n_output >= g + 2``; ``num_new_tokens = 1``.

Coefficient vectors: ``published`` (BLIS iter29 defaults), ``coeffs_a`` / ``coeffs_b`` (seeded
random, plausible magnitudes) and any ``{"name": [11 floats]}`` in
``tools/blis_golden/extra_coefficients.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

SEED = 20261124
HERE = Path(__file__).resolve().parent
DEFAULT_CONFIGS = "../shared/data/real/model-configs"
EXTRA_COEFFICIENTS = HERE / "extra_coefficients.json"

# BLIS published trained-physics betas (defaults.yaml, iter29; ../shared/blis/README.md).
PUBLISHED = [0.152128, 0.0, 1.36252915, 0.752037, 32.09546717, 4.41684444, 126.024825,
             481.8613888, 0.0, 1.94710771, 0.752037]

# Ranges per BLIS slot for the random vectors (roofline multipliers dimensionless, overheads µs).
COEF_RANGES = [
    (0.1, 3.0),     # 0 prefill compute
    (0.1, 3.0),     # 1 decode compute
    (0.1, 3.0),     # 2 weight loading
    (0.1, 3.0),     # 3 TP communication
    (1.0, 50.0),    # 4 per layer (µs/layer)
    (1.0, 10.0),    # 5 per request (µs/request)
    (50.0, 1000.0),  # 6 per step (µs)
    (1.0, 500.0),   # 7 per MoE layer (µs/layer, interleaved MoE only)
    (0.1, 3.0),     # 8 prefill memory
    (0.1, 3.0),     # 9 decode memory
    (0.1, 2.0),     # 10 MoE dispatch (beta_EP)
]

# config file name -> (query heads, KV heads, is MoE); heads are checked against the file.
MODELS = {
    "llama-2-7b-hf.json": "dense-mha",
    "llama-2-70b-hf.json": "dense-gqa",
    "codellama-34b-instruct-hf.json": "dense-gqa",
    "llama-3.1-8b-instruct.json": "dense-gqa",
    "mixtral-8x7b-v0.1.json": "moe",
    "qwen3-30b-a3b.json": "moe",
    "llama-4-scout-17b-16e-instruct-fp8-dynamic.json": "moe-interleaved-fp8",
}
GPUS = ("H100", "A100-SXM", "L40S")
GPU_P = (0.6, 0.3, 0.1)


def _heads(cfg: dict) -> tuple[int, int, int]:
    """(query heads, KV heads, experts) as BLIS's config parser reads them."""
    c = dict(cfg)
    c.update(cfg.get("text_config") or {})
    h = int(c["num_attention_heads"])
    kv = int(c.get("num_key_value_heads") or c.get("num_kv_heads") or c.get("multi_query_group_num") or h)
    experts = 0
    for k in ("num_local_experts", "num_experts", "n_routed_experts"):
        if int(c.get(k) or 0) >= 2:
            experts = int(c[k])
            break
    return h, kv, experts


def _loguniform(rng: np.random.Generator, lo: float, hi: float) -> int:
    return int(round(float(np.exp(rng.uniform(np.log(lo), np.log(hi))))))


def prefill_request(rng: np.random.Generator, long: bool) -> dict:
    """One prefill chunk: chunk 16-2048 tokens, sometimes a later chunk / prefix-cached."""
    chunk = _loguniform(rng, 16, 2048)
    kind = rng.uniform()
    if kind < 0.5:  # whole prompt in one chunk
        offset, rest = 0, 0
    elif kind < 0.8:  # a later chunk of a long prompt (or after a prefix-cache hit)
        offset = _loguniform(rng, 16, 30000 if long else 4000)
        rest = int(rng.integers(0, 2)) * _loguniform(rng, 1, 2048)
    else:  # first chunk of a longer prompt
        offset, rest = 0, _loguniform(rng, 1, 16000 if long else 2048)
    return {"input_len": offset + chunk + rest, "progress_index": offset,
            "num_new_tokens": chunk, "n_output": _loguniform(rng, 1, 1024)}


def decode_request(rng: np.random.Generator, long: bool) -> dict:
    """One decode request: context (prompt + generated) 10-4000 tokens (long: up to 32000)."""
    ctx = _loguniform(rng, 10, 32000 if long else 4000)
    generated = int(rng.integers(0, max(1, min(ctx - 1, 2000))))
    input_len = max(1, ctx - generated)
    g = ctx - input_len
    return {"input_len": input_len, "progress_index": input_len + g, "num_new_tokens": 1,
            "n_output": g + 2 + int(rng.integers(0, 500))}


def make_batch(rng: np.random.Generator, kind: str, long: bool) -> list[dict]:
    if kind == "prefill":
        n_pf, n_dc = int(rng.integers(1, 9)), 0
    elif kind == "decode":
        n_pf, n_dc = 0, _loguniform(rng, 1, 128)
    else:  # mixed: a few prefill chunks riding along a decode batch
        n_pf, n_dc = int(rng.integers(1, 5)), _loguniform(rng, 1, 120)
    reqs = [prefill_request(rng, long) for _ in range(n_pf)]
    reqs += [decode_request(rng, long) for _ in range(n_dc)]
    order = rng.permutation(len(reqs))
    return [reqs[i] for i in order]


def random_coefficients(rng: np.random.Generator) -> list[float]:
    return [round(float(np.exp(rng.uniform(np.log(lo), np.log(hi)))), 6) for lo, hi in COEF_RANGES]


def coefficient_vectors(extra: Path = EXTRA_COEFFICIENTS) -> dict[str, list[float]]:
    rng = np.random.default_rng(SEED + 1)
    vecs = {"published": list(PUBLISHED), "coeffs_a": random_coefficients(rng),
            "coeffs_b": random_coefficients(rng)}
    if extra.is_file():
        with open(extra, encoding="utf-8") as f:
            more = json.load(f)
        for name, v in more.items():
            if name in vecs:
                raise SystemExit(f"{extra}: vector name {name!r} is reserved")
            if len(v) != 11 or any(not float(x) >= 0 for x in v):
                raise SystemExit(f"{extra}: vector {name!r} must be 11 non-negative numbers")
            vecs[name] = [float(x) for x in v]
    return vecs


def make_cases(config_dir: Path) -> list[dict]:
    rng = np.random.default_rng(SEED)
    cases: list[dict] = []

    def add(model: str, tp: int, dp: int, kind: str, long: bool, gpu: str | None = None,
            requests: list[dict] | None = None) -> None:
        g = gpu or str(rng.choice(GPUS, p=GPU_P))
        reqs = requests if requests is not None else make_batch(rng, kind, long)
        cid = (f"{len(cases):03d}-{model.removesuffix('.json')}-{g}-tp{tp}"
               f"{f'-dp{dp}' if dp > 1 else ''}-{kind}{'-long' if long else ''}")
        cases.append({"id": cid, "model_config": model, "gpu": g, "tp": tp, "dp": dp,
                      "category": {"arch": MODELS[model], "batch": kind,
                                   "context": "long" if long else "short"},
                      "requests": reqs})

    for model in MODELS:
        with open(config_dir / model, encoding="utf-8") as f:
            h, kv, experts = _heads(json.load(f))
        tps = [tp for tp in (1, 2, 4, 8) if h % tp == 0 and kv % tp == 0]
        for tp in tps:
            for kind in ("prefill", "decode", "mixed"):
                for long in (False, False, True):
                    add(model, tp, 1, kind, long)
        if experts:
            for tp in [t for t in tps if t <= 4]:
                for kind in ("prefill", "decode", "mixed"):
                    add(model, tp, 2, kind, bool(rng.integers(0, 2)))
    # hand-picked edges: smallest and largest batches, first decode step, chunk = rest of prompt
    edge_models = ("llama-2-7b-hf.json", "llama-2-70b-hf.json", "mixtral-8x7b-v0.1.json",
                   "llama-4-scout-17b-16e-instruct-fp8-dynamic.json")
    for model in edge_models:
        add(model, 1 if "7b" in model else 4, 1, "prefill", False, "H100",
            [{"input_len": 16, "progress_index": 0, "num_new_tokens": 16, "n_output": 1}])
        add(model, 1 if "7b" in model else 4, 1, "decode", False, "H100",
            [{"input_len": 10, "progress_index": 10, "num_new_tokens": 1, "n_output": 2}])
        add(model, 2, 1, "decode", True, "A100-SXM",
            [{"input_len": 3000, "progress_index": 3999, "num_new_tokens": 1, "n_output": 1001}] * 128)
        add(model, 2, 1, "mixed", True, "H100",
            [{"input_len": 8192, "progress_index": 6144, "num_new_tokens": 2048, "n_output": 64},
             {"input_len": 100, "progress_index": 100, "num_new_tokens": 1, "n_output": 2}])
    return cases


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="cases JSON to write")
    ap.add_argument("--configs", default=os.environ.get("BLIS_GOLDEN_CONFIGS", DEFAULT_CONFIGS),
                    help=f"directory of the HF config.json files (default {DEFAULT_CONFIGS})")
    args = ap.parse_args(argv)
    config_dir = Path(args.configs)
    missing = [m for m in MODELS if not (config_dir / m).is_file()]
    if missing:
        print(f"make_cases: {config_dir} lacks {missing}", file=sys.stderr)
        return 2
    cases = make_cases(config_dir)
    doc = {"coefficients": coefficient_vectors(), "model_config_dir": str(config_dir.resolve()),
           "cases": cases}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    n = {}
    for c in cases:
        key = (c["category"]["arch"], c["category"]["batch"])
        n[key] = n.get(key, 0) + 1
    summary = ", ".join(f"{a}/{b}: {k}" for (a, b), k in sorted(n.items()))
    print(f"make_cases: {len(cases)} cases -> {args.out} ({summary})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
