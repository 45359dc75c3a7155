"""Every plot writes a non-empty PNG, also for sparse configurations."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from bayes_latency.checks import plots
from bayes_latency.checks.ppc import ppc_rows

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def is_png(path) -> bool:
    data = path.read_bytes()
    return len(data) > 1000 and data.startswith(PNG_MAGIC)


def step_data(sizes=(300, 40, 1), seed=0):
    """Iteration rows of three configurations with ``sizes`` rows and calibrated draws."""
    rng = np.random.default_rng(seed)
    cfg = np.concatenate([[f"m{i}|H100|tp{i + 1}"] * n for i, n in enumerate(sizes)])
    exp = np.array([c.split("|")[0] for c in cfg])
    n = cfg.size
    mu = rng.uniform(5e3, 5e4, n)
    obs = pd.DataFrame({"obs_id": np.arange(n), "kind": "iteration", "config_id": cfg,
                        "experiment_id": exp, "value_us": mu * np.exp(0.1 * rng.standard_normal(n))})
    draws = xr.DataArray(mu * np.exp(0.1 * rng.standard_normal((200, n))), dims=("sample", "obs"),
                         coords={"obs": np.arange(n)})
    return obs, draws


def posterior(n_config=3):
    rng = np.random.default_rng(1)
    terms = ["prefill_compute", "decode_kv", "per_step"]
    post = xr.Dataset(
        {"beta": (("chain", "draw", "config", "term"),
                  np.exp(rng.normal([0.5, 0.0, 8.0], 0.1, (2, 200, n_config, 3)))),
         "alpha": (("chain", "draw", "config", "alpha_term"),
                   np.exp(rng.normal(6.0, 0.1, (2, 200, n_config, 3))))},
        coords={"config": [f"c{i}" for i in range(n_config)], "term": terms,
                "alpha_term": ["alpha_arrival", "alpha_post_decode", "alpha_per_token"]})
    return xr.DataTree.from_dict({"posterior": post})


def test_forest_from_result_and_from_coefficients(tmp_path):
    assert is_png(plots.plot_forest(posterior(), tmp_path / "forest.png"))
    coefs = posterior(1)["posterior"].to_dataset().isel(config=0).stack(sample=("chain", "draw"))
    coefs = coefs.drop_vars(["chain", "draw", "sample", "config"]).transpose("sample", ...)
    coefs["beta"].values[0, 0] = 0.0  # an exact zero on a log axis
    assert is_png(plots.plot_forest(coefs, tmp_path / "forest_one.png"))


def test_ppc_iterations_with_sparse_configs(tmp_path):
    obs, draws = step_data()
    out = plots.plot_ppc_iterations(obs, draws, tmp_path / "ppc.png")
    assert is_png(out)
    few, few_draws = step_data(sizes=(5, 3))  # ECDF branch
    assert is_png(plots.plot_ppc_iterations(few, few_draws, tmp_path / "ppc_few.png"))
    none = obs.assign(kind="step_window")
    assert is_png(plots.plot_ppc_iterations(none, draws, tmp_path / "ppc_none.png"))


def test_pit_and_calibration(tmp_path):
    obs, draws = step_data()
    assert is_png(plots.plot_pit(obs, draws, tmp_path / "pit.png"))
    tiny, tiny_draws = step_data(sizes=(2,))
    assert is_png(plots.plot_pit(tiny, tiny_draws, tmp_path / "pit_tiny.png"))
    rows = ppc_rows(obs, draws)
    assert is_png(plots.plot_calibration(rows, tmp_path / "cal.png"))
    assert is_png(plots.plot_calibration(rows.iloc[:0], tmp_path / "cal_empty.png"))


@pytest.mark.parametrize("facet", [None, "metric"])
def test_observed_vs_predicted(tmp_path, facet):
    obs, draws = step_data()
    rows = ppc_rows(obs, draws)
    if facet:
        rows = pd.concat([rows.assign(metric="ttft_mean"), rows.assign(metric="e2e_mean")])
    out = plots.plot_observed_vs_predicted(rows, tmp_path / "scatter.png", facet=facet)
    assert is_png(out)
    one = rows.iloc[:1]
    assert is_png(plots.plot_observed_vs_predicted(one, tmp_path / "one.png", facet=facet))
    assert is_png(plots.plot_observed_vs_predicted(rows.iloc[:0], tmp_path / "none.png"))


def test_fallbacks_when_arviz_cannot_draw(tmp_path, monkeypatch):
    import arviz_plots

    def broken(*args, **kwargs):
        raise ValueError("cannot draw")

    for name in ("plot_forest", "plot_ppc_dist", "plot_ppc_pit"):
        monkeypatch.setattr(arviz_plots, name, broken)
    obs, draws = step_data()
    assert is_png(plots.plot_forest(posterior(), tmp_path / "forest.png"))
    assert is_png(plots.plot_ppc_iterations(obs, draws, tmp_path / "ppc.png"))
    assert is_png(plots.plot_pit(obs, draws, tmp_path / "pit.png"))
