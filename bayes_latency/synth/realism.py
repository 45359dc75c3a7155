"""Realism check of the synthetic engine against real step summaries (a script, not a test).

:func:`realism_table` simulates H100 Llama-2-70B TP4 and CodeLlama-34B TP2 under the real
``general`` profile (8 req/s then 20 req/s, prefix caching on as on the real servers; durations
shortened) and compares median / p10 / p90 of the decode batch size, the prefill tokens per step,
the iteration time and the ``schedule()`` CPU time with the real ``step.BATCH_SUMMARY`` records of
``../shared/data/real/h100-steps/batch_summaries.parquet``. Both sides are measured the same way:
sampled summaries only, iteration = gap between the starts of two consecutive sampled steps.

Run ``python -m bayes_latency.synth.realism [OUT_DIR]``; it prints a markdown table and skips
cleanly (returns None) when the real data are absent.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from bayes_latency.synth.fleet import ExperimentSpec, simulate_experiment
from bayes_latency.synth.workloads import load_workload

REAL_DIR = Path(__file__).resolve().parents[3] / "shared" / "data" / "real"
"""Default location of the real data (``../shared/data/real`` next to the repository)."""

CASES: tuple[tuple[str, str, int, str], ...] = (
    ("llama-2-70b", "H100", 4, "20260217-202857-llama-2-70b-tp4-general"),
    ("codellama-34b", "H100", 2, "20260218-150304-codellama-34b-tp2-general"),
)
METRICS: tuple[tuple[str, str, int], ...] = (
    ("decode batch (reqs)", "batch.num_decode_reqs", 0),
    ("prefill tokens / step", "batch.prefill_tokens", 0),
    ("iteration (ms)", "iteration_ms", 1),
    ("schedule() CPU (µs)", "step.duration_us", 0),
)


def _summary_stats(df: pd.DataFrame) -> dict[str, np.ndarray]:
    """Metric arrays from BATCH_SUMMARY-like rows (``step.id``, ``step.ts_start_ns``, ...)."""
    df = df.sort_values("step.id")
    ids = df["step.id"].to_numpy(dtype=np.int64)
    ts = df["step.ts_start_ns"].to_numpy(dtype=np.int64)
    pair = np.flatnonzero(np.diff(ids) == 1)
    return {
        "batch.num_decode_reqs": df["batch.num_decode_reqs"].to_numpy(dtype=float),
        "batch.prefill_tokens": df["batch.prefill_tokens"].to_numpy(dtype=float),
        "iteration_ms": (ts[pair + 1] - ts[pair]) / 1e6,
        "step.duration_us": df["step.duration_us"].to_numpy(dtype=float),
    }


def _q(x: np.ndarray, digits: int) -> str:
    if x.size == 0:
        return "n/a"
    p10, p50, p90 = np.percentile(x, [10, 50, 90])
    return f"{p50:.{digits}f} [{p10:.{digits}f}, {p90:.{digits}f}]"


def realism_table(out_dir: Path | str | None = None, real_dir: Path | str | None = None,
                  duration_s: float = 120.0, seed: int = 0, verbose: bool = True) -> str | None:
    """Simulate the two real configurations and compare their step statistics with the real ones.

    Parameters
    ----------
    out_dir : Path, optional
        Where to write the two synthetic experiment folders (a temporary folder by default).
    real_dir : Path, optional
        The real data folder (default :data:`REAL_DIR`).
    duration_s : float
        Duration of each of the two load stages (real: 600 s).
    seed : int
        Fleet seed.
    verbose : bool
        Print the table.

    Returns
    -------
    str or None
        The markdown table, or None when the real step summaries are absent.
    """
    real_dir = Path(real_dir) if real_dir is not None else REAL_DIR
    real_file = real_dir / "h100-steps" / "batch_summaries.parquet"
    if not real_file.is_file():
        if verbose:
            print(f"realism check skipped: {real_file} is absent", file=sys.stderr)
        return None
    real = pd.read_parquet(real_file)
    tmp = None
    if out_dir is None:
        tmp = tempfile.TemporaryDirectory()
        out_dir = tmp.name
    lines = ["| configuration | metric | real median [p10, p90] | synthetic median [p10, p90] |",
             "|---|---|---|---|"]
    try:
        for model, gpu, tp, exp_id in CASES:
            w = load_workload("general").with_stages([(duration_s, 8.0), (duration_s, 20.0)])
            spec = ExperimentSpec(model, gpu, tp, w, prefix_caching=True, auto_rate=False,
                                  experiment_id=f"realism-{model}-{gpu.lower()}-tp{tp}-general")
            run = simulate_experiment(spec, Path(out_dir), seed=seed)
            st = run.engine.steps
            st = st[st["sampled"]]
            syn = pd.DataFrame({
                "step.id": st["step_id"], "step.ts_start_ns": st["ts_start_ns"],
                "batch.num_decode_reqs": st["sum_num_decode_reqs"],
                "batch.prefill_tokens": st["sum_prefill_tokens"],
                "step.duration_us": st["cpu_ns"] // 1000,
            })
            rs = _summary_stats(real[real["experiment_id"] == exp_id])
            ss = _summary_stats(syn)
            for label, key, dig in METRICS:
                lines.append(f"| {model} {gpu} TP{tp} general | {label} | {_q(rs[key], dig)} "
                             f"| {_q(ss[key], dig)} |")
    finally:
        if tmp is not None:
            tmp.cleanup()
    table = "\n".join(lines)
    if verbose:
        print(table)
    return table


if __name__ == "__main__":  # pragma: no cover
    realism_table(sys.argv[1] if len(sys.argv) > 1 else None)
