"""The workload level: the client's mean decode interval per token of the 16 lifecycle runs
vs predicted step times (of the runs' own batches and of a steady-state typical batch)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from bayes_latency.calibrate.stages import generated_output_len
from bayes_latency.data.client.lifecycle import read_exp_config, read_lifecycle_dir, read_profile
from bayes_latency.data.observations.build import DEFAULT_STACK, config_id
from bayes_latency.physics.basis import ALPHA_TERMS, DEFAULT_TERMS, basis_matrix
from bayes_latency.physics.hardware import load_gpu
from bayes_latency.physics.models import load_architecture
from bayes_latency.physics.serving import ServingConfig
from bayes_latency.study.realdata import H100_GPU, RealData, Split, _xcols, h100_serving
from bayes_latency.study.settings import N_PRED_DRAWS, SEED


# --------------------------------------------------------------------------------- workload
def _obs_rows_for_batches(batches: pd.DataFrame, arch: Any, gpu: Any, serving: ServingConfig,
                          prefix: str) -> pd.DataFrame:
    """Minimal observation rows (for ``predict``) of a batch table."""
    X = basis_matrix(batches, arch, gpu, serving, DEFAULT_TERMS)
    d = pd.DataFrame(X, columns=_xcols())
    for a in ALPHA_TERMS:
        d[f"x_{a}"] = 0.0
    d["obs_id"] = [f"{prefix}/{i}" for i in range(len(d))]
    d["kind"], d["role"], d["n_steps"], d["value_us"] = "iteration", "beta", 1, np.nan
    d["model"], d["gpu"], d["tp"], d["stack"] = arch.name, gpu.name, int(serving.tp), DEFAULT_STACK
    d["config_id"] = config_id(arch.name, gpu.name, int(serving.tp), DEFAULT_STACK)
    return d


def typical_step(model: Any, arch: Any, gpu: Any, serving: ServingConfig, rate: float,
                 prompt_len: float, output_len: float, cached_prefix: float,
                 n_iter: int = 8) -> tuple[np.ndarray, dict[str, float]]:
    """Predicted step time of the steady-state batch of a constant-rate workload.

    A fixed point of ``t``: decode concurrency ``n_d = min(max_num_seqs, rate · (output_len - 1)
    · t)`` (Little's law: every request decodes for ``output_len - 1`` steps), decode context
    ``n_d · (prompt_len + output_len / 2)``, and per step ``rate · t`` new prompts of
    ``prompt_len - cached_prefix`` uncached tokens each after a cached prefix (prefix caching).
    Uses only the workload profile (rate, lengths), not the measured latencies.

    Returns
    -------
    (draws, batch)
        Posterior draws (µs) of the mean step time at the fixed point and the batch used.
    """
    t = 20_000.0
    c = max(prompt_len - cached_prefix, 1.0)
    batch: dict[str, float] = {}
    mu = np.array([t])
    for _ in range(n_iter):
        n_d = min(float(serving.max_num_seqs), rate * max(output_len - 1.0, 0.0) * t / 1e6)
        n_p = rate * t / 1e6
        batch = {"num_prefill_reqs": n_p, "prefill_tokens": n_p * c,
                 "prefill_attn_pairs": n_p * c * (cached_prefix + (c + 1.0) / 2.0),
                 "prefill_kv_tokens": n_p * (cached_prefix + c), "num_decode_reqs": n_d,
                 "decode_tokens": n_d, "decode_ctx_tokens": n_d * (prompt_len + output_len / 2)}
        rows = _obs_rows_for_batches(pd.DataFrame([batch]), arch, gpu, serving, "typical")
        mu = model.predict(rows, n_draws=N_PRED_DRAWS, seed=SEED).values[:, 0]
        t = float(np.median(mu))
    return mu, batch


def _q(v: np.ndarray) -> tuple[float, float, float]:
    return (float(np.median(v)), float(np.quantile(v, 0.05)), float(np.quantile(v, 0.95)))


def workload_table(data: RealData, model: Any, cv_models: dict[str, Any],
                   splits: Sequence[Split] = (), log: Any = print) -> pd.DataFrame:
    """Observed mean decode interval per token of the 16 lifecycle runs vs predicted step times.

    Columns (times in ms): ``decode_interval_ms`` (client: (mean E2E - mean TTFT) / (mean output
    len - 1), with the generated output length, :func:`~bayes_latency.calibrate.stages.
    generated_output_len`, where the profile sets ``ignore_eos``); for the two runs with step summaries ``step_obs_ms`` / ``step_obs_tokw_ms`` (mean
    observed iteration time over the sampled step pairs, plain and weighted by decode tokens) and
    ``step_pred_ms`` / ``step_pred_tokw_ms`` (+ ``_lo``/``_hi``: 90% interval) predicted by the
    full fit for the same batches, ``step_pred_heldout_tokw_ms`` by the fit that held the run out;
    for every run ``typical_pred_ms`` (+ interval) from :func:`typical_step` per load stage,
    weighted by the stage's successful requests; ``n_decode_little`` (time-averaged decode
    concurrency from Little's law with the observed per-stage interval) and ``n_decode_steps``
    (mean decoding requests of the sampled steps) to check that batch; ``gap_pct`` = (observed
    decode interval -
    predicted) / observed, using the batch prediction when available, else the typical batch.
    """
    root = data.data_dir / "h100-lifecycle"
    if not root.is_dir():
        return pd.DataFrame()
    gpu = load_gpu(H100_GPU)
    its = data.iterations
    heldout_by_eid = {eid: cv_models[sp.name] for sp in splits if sp.name in cv_models
                      for eid in sp.held_out}
    rows = []
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        try:
            lc, _ = read_lifecycle_dir(d)
            cfg = read_exp_config(d / "exp-config.yaml")
            prof = read_profile(d / "profile.yaml")
        except Exception as exc:  # noqa: BLE001 - one unreadable run must not stop the study
            log(f"[study] lifecycle {d.name} skipped: {exc}")
            continue
        arch = load_architecture(cfg["model"])
        tp = int(cfg["tp"])
        serving = ServingConfig(tp=tp, max_num_batched_tokens=cfg.get("max_num_batched_tokens",
                                                                      2048),
                                max_num_seqs=cfg.get("max_num_seqs", 128),
                                max_model_len=cfg.get("max_model_len", 4096),
                                prefix_caching=True)
        gen = generated_output_len(prof)
        if gen is not None:     # ignore_eos: every request ran the profile's output_len
            lc = lc.assign(output_len_mean=float(gen),
                           decode_interval_s=(lc["e2e_mean_s"] - lc["ttft_mean_s"]) / (gen - 1.0))
        summ = lc[lc["stage"] == "summary"].iloc[0]
        workload = d.name.rsplit("-", 1)[-1]
        cfg_id = config_id(arch.name, gpu.name, tp, DEFAULT_STACK)
        unseen = model.coefficients(arch.name, gpu.name, tp, n_draws=2,
                                    stack=DEFAULT_STACK).attrs["unseen_levels"]
        row: dict[str, Any] = {
            "run": d.name, "model": arch.name, "tp": tp, "workload": workload,
            "successes": summ["successes"], "count": summ["count"],
            "output_len_mean": summ["output_len_mean"],
            "decode_interval_ms": summ["decode_interval_s"] * 1e3,
            "config_in_fit": cfg_id in model.design.configs.index,
            "unseen_levels": unseen or "none",
        }
        # typical batch per stage, weighted by successful requests
        stages = lc[lc["stage"] != "summary"]
        draws, weights = [], []
        for _, st in stages.iterrows():
            rate = st["achieved_rate"] if np.isfinite(st["achieved_rate"]) else st["requested_rate"]
            if not (np.isfinite(rate) and st["successes"] > 0):
                continue
            mu, _ = typical_step(model, arch, gpu, serving, float(rate),
                                 float(st["prompt_len_mean"]), float(st["output_len_mean"]),
                                 float(prof["system_prompt_len"]))
            draws.append(mu)
            weights.append(float(st["successes"]))
        if draws:
            w = np.asarray(weights) / np.sum(weights)
            tm = np.einsum("k,ks->s", w, np.vstack(draws)) / 1e3
            row["typical_pred_ms"], row["typical_pred_lo_ms"], row["typical_pred_hi_ms"] = _q(tm)
        # the batches of the run itself where step summaries exist
        it = its[its["experiment_id"] == d.name]
        dur = stages["send_duration_s"].to_numpy(float)
        n_lit = (np.minimum(float(serving.max_num_seqs),
                            stages["achieved_rate"].to_numpy(float)
                            * (stages["output_len_mean"].to_numpy(float) - 1.0)
                            * stages["decode_interval_s"].to_numpy(float)))
        ok = np.isfinite(n_lit) & np.isfinite(dur) & (dur > 0)
        if ok.any():
            row["n_decode_little"] = float(np.sum(n_lit[ok] * dur[ok]) / np.sum(dur[ok]))
        if len(it):
            row["n_decode_steps"] = float(it["num_decode_reqs"].mean())
            w_tok = it["decode_tokens"].to_numpy(float)
            y = it["iteration_us"].to_numpy(float)
            row["n_step_pairs"] = len(it)
            row["step_obs_ms"] = float(y.mean()) / 1e3
            row["step_obs_tokw_ms"] = float((w_tok * y).sum() / w_tok.sum()) / 1e3
            rows_b = _obs_rows_for_batches(it, arch, gpu, h100_serving(tp), d.name)
            mu = model.predict(rows_b, n_draws=N_PRED_DRAWS, seed=SEED).values / 1e3
            row["step_pred_ms"], row["step_pred_lo_ms"], row["step_pred_hi_ms"] = \
                _q(mu.mean(axis=1))
            tokw = (mu * w_tok[None, :]).sum(axis=1) / w_tok.sum()
            row["step_pred_tokw_ms"], row["step_pred_tokw_lo_ms"], row["step_pred_tokw_hi_ms"] = \
                _q(tokw)
            mh = heldout_by_eid.get(d.name)
            if mh is not None:
                muh = mh.predict(rows_b, n_draws=N_PRED_DRAWS, seed=SEED).values / 1e3
                row["step_pred_heldout_tokw_ms"] = float(np.median(
                    (muh * w_tok[None, :]).sum(axis=1) / w_tok.sum()))
        pred = row.get("step_pred_tokw_ms", row.get("typical_pred_ms", math.nan))
        row["gap_pct"] = (row["decode_interval_ms"] - pred) / row["decode_interval_ms"] * 100.0
        rows.append(row)
    return pd.DataFrame(rows)
