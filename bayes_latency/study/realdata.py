"""The real data of the study: where it lives, the pooled observation table, and the
cross-validation splits.

Read from ``../shared/data/real`` (never copied; see its README):

- ``h100-steps/batch_summaries.parquet``: sampled ``step.BATCH_SUMMARY`` records of two real vLLM
  runs on H100 SXM (Llama-2-70B TP4 and CodeLlama-34B TP2, ``general`` workload). Iteration rows
  are the ``ts_start(i+1) - ts_start(i)`` gaps of consecutive sampled steps
  (:func:`~bayes_latency.data.steps.iterations_from_steps`), features from the summaries
  (contexts approximated from the KV usage).
- ``microbench/splitwise_perf_model.csv``: Splitwise static-batch microbenchmarks (A100:
  Llama-2-70B TP 2/4/8, Bloom-176B TP 8; H100: Llama-2-70B TP 2/4) as ``benchmark_mean`` rows.
- ``h100-lifecycle/<run>/``: client-side lifecycle metrics of 16 real runs, for the workload-level
  comparison of the mean decode interval per token.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bayes_latency.data.microbench import read_splitwise
from bayes_latency.data.observations.build import (
    observations_from_iterations,
    observations_from_microbench,
)
from bayes_latency.data.steps import BATCH_COLUMNS as STEP_BATCH_COLUMNS
from bayes_latency.data.steps import iterations_from_steps, load_step_table
from bayes_latency.physics.basis import DEFAULT_TERMS
from bayes_latency.physics.hardware import load_gpu
from bayes_latency.physics.models import load_architecture
from bayes_latency.physics.serving import ServingConfig

#: Serving knobs of the real H100 runs (step summaries and lifecycle runs).
H100_SERVING: dict[str, Any] = {"max_num_batched_tokens": 2048, "max_num_seqs": 128,
                                "max_model_len": 4096, "chunked_prefill": True,
                                "prefix_caching": True}
H100_GPU = "H100"
ENV_DATA = "BAYES_LATENCY_REAL_DATA"


def real_data_dir() -> Path | None:
    """The real-data folder, or None when absent.

    Looks at ``$BAYES_LATENCY_REAL_DATA``, then ``<repo>/../shared/data/real`` (relative to this
    package) and ``./../shared/data/real``.
    """
    cands = []
    if os.environ.get(ENV_DATA):
        cands.append(Path(os.environ[ENV_DATA]))
    cands.append(Path(__file__).resolve().parents[3] / "shared" / "data" / "real")
    cands.append(Path.cwd().parent / "shared" / "data" / "real")
    for c in cands:
        if (c / "h100-steps" / "batch_summaries.parquet").is_file() and \
                (c / "microbench" / "splitwise_perf_model.csv").is_file():
            return c
    return None


# --------------------------------------------------------------------------------- data
@dataclass
class RealData:
    """The pooled observation table and what the study needs besides it.

    Attributes
    ----------
    observations
        Observation table (``iteration`` rows of the H100 runs, ``benchmark_mean`` rows of the
        microbenchmarks) plus ``source`` (``steps`` / ``microbench``), ``phase`` (``prefill``,
        ``decode``, ``mixed``), ``prefill_tokens_step`` and ``decode_tokens_step`` (tokens of
        one step, for the blackbox baseline).
    iterations
        The ``iterations`` table of the H100 runs (batch columns, observed ``iteration_us``).
    data_dir
        Where the data was read.
    """

    observations: pd.DataFrame
    iterations: pd.DataFrame
    data_dir: Path
    notes: list[str] = field(default_factory=list)


def h100_serving(tp: int) -> ServingConfig:
    """Serving configuration of the real H100 runs at tensor parallelism ``tp``."""
    return ServingConfig(tp=int(tp), **H100_SERVING)


def _microbench_tokens(mb: pd.DataFrame) -> pd.DataFrame:
    """Per-step token counts of the ``benchmark_mean`` rows, in the order
    :func:`observations_from_microbench` emits them (checked by the caller)."""
    keys = ["model", "hardware", "tp", "prompt_size", "batch_size"]
    parts = []
    for _, g in mb.groupby(["model", "hardware", "tp"], sort=True):
        pt = g.groupby(keys, sort=True)["prompt_time_us"].mean().reset_index()
        parts.append(pd.DataFrame({
            "value_check": pt["prompt_time_us"].to_numpy(float), "phase": "prefill",
            "prefill_tokens_step": (pt["prompt_size"] * pt["batch_size"]).to_numpy(float),
            "decode_tokens_step": 0.0}))
        tt = g.groupby(keys + ["token_size"], sort=True)["token_time_us"].mean().reset_index()
        parts.append(pd.DataFrame({
            "value_check": tt["token_time_us"].to_numpy(float), "phase": "decode",
            "prefill_tokens_step": 0.0,
            "decode_tokens_step": tt["batch_size"].to_numpy(float)}))
    return pd.concat(parts, ignore_index=True)


def load_real_data(data_dir: Path, terms: Sequence[str] = DEFAULT_TERMS) -> RealData:
    """Build the pooled observation table of the real H100 runs and the Splitwise benchmarks.

    Parameters
    ----------
    data_dir
        ``shared/data/real``.
    terms
        Term set whose feature columns the table carries (default: the 11 BLIS terms).

    Returns
    -------
    RealData
    """
    data_dir = Path(data_dir)
    notes: list[str] = []
    steps = load_step_table(data_dir / "h100-steps" / "batch_summaries.parquet")
    its = iterations_from_steps(steps, block_size=16)
    gpu = load_gpu(H100_GPU)
    frames, it_frames = [], []
    meta = steps.groupby("experiment_id")[["model", "tp", "workload"]].first()
    for eid, it in its.groupby("experiment_id", sort=True):
        arch = load_architecture(str(meta.loc[eid, "model"]))
        tp = int(meta.loc[eid, "tp"])
        obs = observations_from_iterations(it, arch, gpu, h100_serving(tp), experiment_id=str(eid),
                                           workload=str(meta.loc[eid, "workload"]), terms=terms)
        ok = it[list(STEP_BATCH_COLUMNS)].notna().all(axis=1) & (it["iteration_us"] > 0)
        it = it[ok].reset_index(drop=True)
        if len(it) != len(obs):
            raise RuntimeError(f"{eid}: {len(it)} iterations but {len(obs)} observation rows")
        obs["source"] = "steps"
        # the traced run is one of the client lifecycle runs (its ``<model>-tp<N>-<workload>``):
        # its steps and its client means share one run effect (model.definition.runs)
        obs["run_id"] = re.sub(r"^\d{8}-\d{6}-", "", str(eid))
        obs["phase"] = np.where(it["prefill_tokens"].to_numpy(float) > 0, "mixed", "decode")
        obs["prefill_tokens_step"] = it["prefill_tokens"].to_numpy(float)
        obs["decode_tokens_step"] = it["decode_tokens"].to_numpy(float)
        frames.append(obs)
        it = it.assign(model=arch.name, gpu=gpu.name, tp=tp, obs_id=obs["obs_id"].to_numpy())
        it_frames.append(it)
    mb = read_splitwise(data_dir / "microbench" / "splitwise_perf_model.csv")
    mobs = observations_from_microbench(mb, terms=terms)
    tok = _microbench_tokens(mb)
    if len(tok) != len(mobs) or not np.allclose(tok["value_check"], mobs["value_us"]):
        raise RuntimeError("microbenchmark rows do not line up with observations_from_microbench")
    mobs["source"] = "microbench"
    for c in ("phase", "prefill_tokens_step", "decode_tokens_step"):
        mobs[c] = tok[c].to_numpy()
    frames.append(mobs)
    obs = pd.concat(frames, ignore_index=True)
    notes.append(f"{len(obs)} observation rows: "
                 + ", ".join(f"{k} {v}" for k, v in obs["kind"].value_counts().items()))
    return RealData(observations=obs, iterations=pd.concat(it_frames, ignore_index=True),
                    data_dir=data_dir, notes=notes)


# --------------------------------------------------------------------------------- splits
@dataclass(frozen=True)
class Split:
    """One cross-validation split: the experiments held out and why.

    Attributes
    ----------
    name
        Short label.
    family
        ``a: experiment``, ``b: TP degree`` or ``c: GPU x TP cell``.
    held_out
        ``experiment_id`` values of the held-out rows.
    note
        What stays in the training set.
    """

    name: str
    family: str
    held_out: tuple[str, ...]
    note: str


# (name, family, source, model, gpu, tp, note)
_SPLIT_SPECS: tuple[tuple[str, str, str, str, str, int, str], ...] = (
    ("run llama-2-70b H100 tp4", "a: experiment", "steps", "llama-2-70b", "H100-SXM", 4,
     "Splitwise H100 TP4 (same model/GPU/TP, other stack) stays in"),
    ("run codellama-34b H100 tp2", "a: experiment", "steps", "codellama-34b", "H100-SXM", 2,
     "the only CodeLlama data: the model level is unseen"),
    ("bench llama-2-70b A100 tp2", "a: experiment", "microbench", "llama-2-70b", "A100-80GB", 2,
     "A100 TP4/8 and H100 TP2 stay in"),
    ("bench llama-2-70b A100 tp8", "a: experiment", "microbench", "llama-2-70b", "A100-80GB", 8,
     "A100 TP2/4 stay in; TP8 only seen through Bloom"),
    ("bench llama-2-70b H100 tp4", "a: experiment", "microbench", "llama-2-70b", "H100-SXM", 4,
     "the real vLLM H100 TP4 run (same model/GPU/TP, other stack) stays in"),
    ("bench bloom-176b A100 tp8", "a: experiment", "microbench", "bloom-176b", "A100-80GB", 8,
     "the only Bloom data: the model level is unseen"),
    ("bench llama-2-70b A100 tp4", "b: TP degree", "microbench", "llama-2-70b", "A100-80GB", 4,
     "Llama-2-70B A100 TP 2 and 8 stay in (interpolate in TP)"),
    ("bench llama-2-70b H100 tp2", "c: GPU x TP cell", "microbench", "llama-2-70b", "H100-SXM", 2,
     "A100 TP2 and H100 TP4 stay in (the cell is new)"),
)
QUICK_SPLITS = ("run llama-2-70b H100 tp4", "bench llama-2-70b H100 tp2")


def define_splits(observations: pd.DataFrame, quick: bool = False) -> list[Split]:
    """The cross-validation splits present in ``observations`` (two in quick mode)."""
    out = []
    for name, family, source, model, gpu, tp, note in _SPLIT_SPECS:
        if quick and name not in QUICK_SPLITS:
            continue
        o = observations
        sel = ((o["source"] == source) & (o["model"] == model) & (o["gpu"] == gpu)
               & (o["tp"] == tp))
        eids = tuple(sorted(o.loc[sel, "experiment_id"].unique()))
        if eids:
            out.append(Split(name, family, eids, note))
    return out


def _xcols(terms: Sequence[str] = DEFAULT_TERMS) -> list[str]:
    """Feature columns ``x_<term>`` of the observation table for ``terms``."""
    return [f"x_{t}" for t in terms]
