"""The held-out real benchmark's report pieces (no fit): the share of held-out iterations inside
the fitted iterations' own residual range, and the residual scatter by batch size."""

from __future__ import annotations

import numpy as np
import pandas as pd
from benchmark_module import load_benchmark


def _rows(rng: np.random.Generator, n: int, scale: float, split: str, batch: float) -> pd.DataFrame:
    pred = np.full(n, 20_000.0)
    obs = pred * np.exp(scale * rng.standard_normal(n))
    return pd.DataFrame({"split": split, "config_id": "llama-2-70b|H100-SXM|tp4",
                         "phase": "decode", "observed_us": obs, "pred_median_us": pred,
                         "in_90": np.abs(np.log(obs / pred)) < 1.645 * 0.01, "batch": batch})


def test_training_range_and_scatter_tell_a_wider_held_out_scatter():
    hr = load_benchmark("heldout_real")
    rng = np.random.default_rng(0)
    fitted = pd.concat([_rows(rng, 4000, 0.01, "same", 30), _rows(rng, 4000, 0.01, "wider", 30)])
    held = pd.concat([_rows(rng, 4000, 0.01, "same", 30), _rows(rng, 4000, 0.02, "wider", 110)])
    tr = hr.training_range_coverage(fitted, held).set_index("split")
    # same scatter: ~90% inside the fitted rows' 5-95% range; twice the scatter: ~59%
    assert abs(tr.loc["same", "inside_fitted_range"] - 0.90) < 0.02
    assert abs(tr.loc["wider", "inside_fitted_range"] - 0.59) < 0.03
    sc = hr.scatter_by_batch(fitted, held)
    wide = sc[(sc["split"] == "wider") & (sc["batch"] == "(100, 128]")].iloc[0]
    assert np.isnan(wide["scaled_mad_fitted"]) and abs(wide["scaled_mad_held_out"] - 0.02) < 0.002
    same = sc[(sc["split"] == "same") & (sc["batch"] == "(0, 40]")].iloc[0]
    assert abs(same["scaled_mad_fitted"] / same["scaled_mad_held_out"] - 1) < 0.1
    # bins in increasing order within a split
    assert sc[sc["split"] == "wider"]["batch"].tolist() == ["(0, 40]", "(100, 128]"]


def _within(rng: np.random.Generator, scale: float, tmp, name: str) -> None:
    """A within-run folder: held-out bands of scale 0.01 against residuals of ``scale``."""
    tmp.mkdir(parents=True, exist_ok=True)
    frames = []
    for sp in ("blocks", "later third"):
        r = _rows(rng, 500, scale, sp, 60).assign(obs_id=[f"{sp}/{i}" for i in range(500)])
        r["in_50"] = np.abs(np.log(r["observed_us"] / r["pred_median_us"])) < 0.674 * 0.01
        frames.append(r.assign(q05_us=r["pred_median_us"] * 0.98, q95_us=r["pred_median_us"] * 1.02))
    pd.concat(frames).to_csv(tmp / "within_held.csv", index=False)
    pd.DataFrame([{"fit": f"within: {sp}", "noise_load": name, "heldout_lpd": -1.0,
                   "elpd_loo": 10.0, "max_rhat": 1.001, "divergences": 0, "passed": True}
                  for sp in ("blocks", "later third")]).to_csv(tmp / "within_conv.csv", index=False)


def test_noise_loads_are_compared_side_by_side(tmp_path):
    import json

    hr = load_benchmark("heldout_real")
    rng = np.random.default_rng(1)
    _within(rng, 0.01, tmp_path, "batch")  # the chosen covariate's files: the work folder
    _within(rng, 0.02, tmp_path / "noise-none", "none")
    (tmp_path / "compare.json").write_text(json.dumps({"chosen": "batch", "compare": ["none"]}))
    t, lines = hr.compare_noise_loads(tmp_path)
    assert len(t) == 4 and set(t["noise_load"]) == {"batch", "none"}
    cov = t.set_index(["split", "noise_load"])["coverage90"]
    assert abs(cov["blocks", "batch"] - 0.90) < 0.04 and abs(cov["blocks", "none"] - 0.59) < 0.06
    assert t["median_band_rel_width"].round(3).eq(0.04).all()
    assert "The model of the other sections: `batch`" in "\n".join(lines)
    assert hr.compare_noise_loads(tmp_path / "noise-none")[0].empty  # no compare.json
