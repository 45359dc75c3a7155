"""Observation tables with known truth, built straight from the physics basis (no traces).

Used by the model tests, which need many fits and must stay fast; the end-to-end path
(synthetic traces -> ingest -> fit) is tested separately on the synthetic fleet.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from bayes_latency.model.definition.objective import NoisePrior
from bayes_latency.physics.basis import ALPHA_TERMS, DEFAULT_TERMS, basis_matrix
from bayes_latency.physics.hardware import load_gpu
from bayes_latency.physics.models import load_architecture
from bayes_latency.physics.serving import ServingConfig
from bayes_latency.priors import load_priors

#: The coefficients of the stage-1 tests: the default beta terms, then the alpha terms.
COEFS = tuple(DEFAULT_TERMS) + tuple(ALPHA_TERMS)
#: The noise prior of the stage-1 tests (a penalty on each kind's scale).
STAGE1_PRIOR = NoisePrior(sigma={"iteration": 0.1, "step_window": 0.1, "alpha_arrival": 0.2,
                                 "alpha_departure": 0.2})


def prior_scale(coefs=COEFS) -> np.ndarray:
    """The coefficients' prior medians: stage 1's scale of ``u = theta / scale``."""
    return np.asarray([load_priors().prior_median(c) for c in coefs])

POP = {"prefill_compute": 1.6, "prefill_kv": 0.0, "decode_compute": 0.0, "decode_kv": 1.3,
       "weight_loading": 1.25, "tp_allreduce": 18.0, "per_layer": 12.0, "per_request": 6.0,
       "per_step": 800.0, "moe_layer": 40.0, "moe_dispatch": 0.0,
       "alpha_arrival": 3000.0, "alpha_post_decode": 1500.0, "alpha_per_token": 30.0}
CONFIGS = [("llama-2-7b", "H100", 1), ("llama-2-7b", "A100", 1), ("llama-2-70b", "H100", 4),
           ("llama-2-70b", "A100", 4), ("codellama-34b", "H100", 2), ("mixtral-8x7b", "H100", 2),
           ("mixtral-8x7b", "A100", 4), ("llama-2-70b", "H100", 2)]


def random_batches(rng: np.random.Generator, n: int) -> pd.DataFrame:
    """Batches like a loaded server's: mostly decode, some prefill chunks."""
    nd = rng.integers(1, 128, n)
    has_p = rng.random(n) < 0.4
    npf = np.where(has_p, rng.integers(1, 4, n), 0)
    ptok = np.where(has_p, rng.integers(16, 2048, n), 0)
    ptok = np.minimum(ptok, 2048 - nd)
    ptok = np.where(has_p, np.maximum(ptok, 1), 0)
    ctx = nd * rng.uniform(200, 2500, n)
    off = np.where(has_p, rng.uniform(0, 1500, n), 0.0)
    c = np.where(npf > 0, ptok / np.maximum(npf, 1), 0.0)
    return pd.DataFrame({
        "num_prefill_reqs": npf, "prefill_tokens": ptok,
        "prefill_attn_pairs": npf * c * (off + (c + 1) / 2), "prefill_kv_tokens": npf * off + ptok,
        "num_decode_reqs": nd, "decode_tokens": nd, "decode_ctx_tokens": ctx,
    })


def truth_for(configs: list[tuple[str, str, int]], seed: int = 1) -> dict[str, dict[str, float]]:
    """Per-configuration true coefficients: population x model/GPU/TP effects."""
    rng = np.random.default_rng(seed)
    coefs = list(DEFAULT_TERMS) + list(ALPHA_TERMS)
    models = sorted({c[0] for c in configs})
    gpus = sorted({c[1] for c in configs})
    tps = sorted({c[2] for c in configs})
    em = {m: rng.normal(0, 0.15, len(coefs)) for m in models}
    eg = {g: rng.normal(0, 0.10, len(coefs)) for g in gpus}
    et = {t: rng.normal(0, 0.08, len(coefs)) for t in tps}
    out = {}
    for m, g, t in configs:
        eff = np.exp(em[m] + eg[g] + et[t] + rng.normal(0, 0.04, len(coefs)))  # + config residual
        out[f"{m}|{g}|tp{t}"] = {k: POP[k] * eff[i] for i, k in enumerate(coefs)}
    return out


def make_observations(configs=CONFIGS, n_iter: int = 400, n_win: int = 400, n_alpha: int = 200,
                      seed: int = 0, sigma: float = 0.06, nu: float = 4.0) -> tuple[pd.DataFrame, dict]:
    """An observation table with iteration, step_window and alpha rows, and its truth."""
    rng = np.random.default_rng(seed)
    truth = truth_for(configs, seed + 1)
    frames = []
    for m, g, t in configs:
        cid = f"{m}|{g}|tp{t}"
        arch, gpu, serving = load_architecture(m), load_gpu(g), ServingConfig(tp=t)
        th = truth[cid]
        beta = np.array([th[k] for k in DEFAULT_TERMS])
        # iterations
        B = random_batches(rng, n_iter + n_win * 6)
        X = basis_matrix(B, arch, gpu, serving)
        step_t = (X @ beta) * np.exp(sigma * rng.standard_t(nu, len(X)).clip(-15, 15))
        it = pd.DataFrame(X[:n_iter], columns=[f"x_{k}" for k in DEFAULT_TERMS])
        it["value_us"] = step_t[:n_iter]
        it["kind"], it["n_steps"] = "iteration", 1
        # windows of 1..10 consecutive steps
        rest_X, rest_t = X[n_iter:], step_t[n_iter:]
        lens = rng.integers(1, 11, n_win)
        ends = np.cumsum(lens)
        keep = ends <= len(rest_X)
        lens, ends = lens[keep], ends[keep]
        starts = ends - lens
        cs = np.vstack([np.zeros((1, X.shape[1])), np.cumsum(rest_X, axis=0)])
        ct = np.concatenate([[0.0], np.cumsum(rest_t)])
        wX = cs[ends] - cs[starts]
        wt = (ct[ends] - ct[starts]) * np.exp(0.01 / lens * rng.standard_normal(len(lens)))
        win = pd.DataFrame(wX, columns=[f"x_{k}" for k in DEFAULT_TERMS])
        win["value_us"], win["kind"], win["n_steps"] = wt, "step_window", lens
        for a in ALPHA_TERMS:
            it[f"x_{a}"] = 0.0
            win[f"x_{a}"] = 0.0
        # alpha rows
        arr = pd.DataFrame(0.0, index=range(n_alpha), columns=[f"x_{k}" for k in DEFAULT_TERMS])
        arr["x_alpha_arrival"], arr["x_alpha_post_decode"], arr["x_alpha_per_token"] = 1.0, 0.0, 0.0
        arr["value_us"] = th["alpha_arrival"] * np.exp(0.2 * rng.standard_t(nu, n_alpha).clip(-10, 10))
        arr["kind"], arr["n_steps"] = "alpha_arrival", 1
        dep = pd.DataFrame(0.0, index=range(n_alpha), columns=[f"x_{k}" for k in DEFAULT_TERMS])
        out_tok = rng.integers(50, 1000, n_alpha)
        dep["x_alpha_arrival"], dep["x_alpha_post_decode"], dep["x_alpha_per_token"] = 0.0, 1.0, out_tok
        dep["value_us"] = (th["alpha_post_decode"] + th["alpha_per_token"] * out_tok) * np.exp(
            0.15 * rng.standard_t(nu, n_alpha).clip(-10, 10))
        dep["kind"], dep["n_steps"] = "alpha_departure", 1
        df = pd.concat([it, win, arr, dep], ignore_index=True)
        df["role"] = np.where(df["kind"].str.startswith("alpha"), "alpha", "beta")
        df["config_id"], df["model"], df["gpu"], df["tp"] = cid, m, g, t
        df["experiment_id"], df["workload"] = f"{cid}-synthetic", "general"
        df["aggregate"] = "sum"
        frames.append(df)
    obs = pd.concat(frames, ignore_index=True)
    obs["obs_id"] = np.arange(len(obs))
    return obs, truth
