"""The leave-one-GPU-out benchmark's scores and report, from predicted rows (no fit)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark_module import load_benchmark  # noqa: E402


def _held(gpu: str, cell: str) -> pd.DataFrame:
    """Predicted rows of one cell: ours with +-10% bands (the second row of each phase outside
    its band), BLIS's without bands."""
    obs = np.array([100.0, 200.0, 10.0, 20.0])
    phase = ["prefill", "prefill", "decode", "decode"]
    base = pd.DataFrame({"obs_id": [f"{cell}-{i}" for i in range(4)], "phase": phase,
                         "prompt_size": 512, "batch_size": 1, "token_size": [-1, -1, 128, 128],
                         "observed_us": obs})
    pred = obs * [1.05, 0.9, 1.02, 1.5]
    ours = base.assign(pred_median_us=pred, q05_us=pred * 0.9, q95_us=pred * 1.1,
                       setting="zero-shot, GPU out")
    blis = base.assign(pred_median_us=obs * 0.5, q05_us=np.nan, q95_us=np.nan,
                       setting="BLIS's vector")
    return pd.concat([ours, blis], ignore_index=True).assign(cell=cell, gpu=gpu)


def test_scores_per_gpu_and_cell_and_a_band_less_baseline(tmp_path: Path) -> None:
    logo = load_benchmark("leave_one_gpu_out")
    assert logo.gpu_of("llama-2-70b|A100-80GB|tp4|splitwise") == "A100-80GB"
    gpu, cell = "A100-80GB", "llama-2-70b|A100-80GB|tp4|splitwise"
    (tmp_path / gpu).mkdir()
    _held(gpu, cell).to_csv(tmp_path / gpu / "held.csv", index=False)
    pd.DataFrame([{"cell": gpu, "rows": 900, "passed": True, "max_rhat": 1.004,
                   "min_ess_bulk": 450.0, "divergences": 0, "draws": 4000, "wall_s": 90.0}]
                 ).to_csv(tmp_path / gpu / "fits.csv", index=False)
    (tmp_path / "run.json").write_text(json.dumps({"fleet": "a fleet no report measured",
                                                   "settings": "s", "gpus": [gpu],
                                                   "dropped_rows": []}))
    res = logo.summarise(tmp_path, "a fleet no report measured")
    g = {(r["setting"], r["phase"]): r for r in res["by_gpu"]}
    ours_dec, blis_pre = g[("zero-shot, GPU out", "decode")], g[("BLIS's vector", "prefill")]
    assert abs(ours_dec["mdape_pct"] - 26.0) < 1e-9     # median of 2% and 50%
    assert abs(ours_dec["coverage90"] - 0.5) < 1e-12    # the 1.5x row is outside
    assert abs(g[("zero-shot, GPU out", "prefill")]["coverage90"] - 0.5) < 1e-12
    assert abs(blis_pre["mdape_pct"] - 50.0) < 1e-9 and np.isnan(blis_pre["coverage90"])
    assert {r["setting"] for r in res["by_cell"]} == {"zero-shot, GPU out", "BLIS's vector"}
    md = logo.render(res, "Measured on a CPU.")
    assert "| A100-80GB | zero-shot, GPU out | decode | 2 | 26.0% | 0.50 |" in md
    assert "| A100-80GB | BLIS's vector | prefill | 2 | 50.0% |  |  | 2.000 |" in md
    assert "| A100-80GB | zero-shot, GPU out | 900 | True | 1.0040 | 450 | 0 | 4000 | 90 |" in md
