"""The unseen-cells benchmark's pure pieces (no fit): matching benchmark rows to Splitwise
points, the one-shot point rule, scoring by phase and the report."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from benchmark_module import load_benchmark

fc = load_benchmark("fewshot_cells")

#: A Splitwise-like cell: a prompt sweep and a batch sweep at token 128, a token sweep at
#: prompt 512 and batch 1, crossing at (512, 1, 128).
PROMPTS = (128, 256, 512, 1024, 2048)
BATCHES = (1, 2, 4, 8, 16)
TOKENS = (128, 256, 512)


def _points() -> list[tuple[int, int, int]]:
    pts = {(p, 1, 128) for p in PROMPTS} | {(512, b, 128) for b in BATCHES}
    return sorted(pts | {(512, 1, t) for t in TOKENS})


def _mb(tp: int = 2) -> pd.DataFrame:
    """Two repetitions of every point; times a smooth function of the point (ms -> us)."""
    rows = []
    for p, b, t in _points():
        for rep in range(2):
            rows.append({"model": "llama2-70b", "hardware": "a100-80gb", "tp": tp,
                         "prompt_size": p, "batch_size": b, "token_size": t,
                         "prompt_time_us": 1000.0 * (50 + 0.3 * p * b + 0.7 * b) + rep,
                         "token_time_us": 1000.0 * (40 + 0.01 * b * (p + t / 2)) + 3 * rep})
    return pd.DataFrame(rows)


def _cell(mb: pd.DataFrame) -> pd.DataFrame:
    """The cell's benchmark rows as the fleet has them: one prefill row per (prompt, batch),
    one decode row per point, no point columns."""
    pre = mb.groupby(["prompt_size", "batch_size"])["prompt_time_us"].mean().reset_index()
    dec = mb.groupby(["prompt_size", "batch_size", "token_size"])["token_time_us"].mean()
    rows = [{"phase": "prefill", "value_us": v} for v in pre["prompt_time_us"]]
    rows += [{"phase": "decode", "value_us": v} for v in dec.to_numpy()]
    return pd.DataFrame(rows).assign(tp=2, obs_id=lambda t: [f"c/{i}" for i in range(len(t))])


def test_rows_are_matched_to_their_points_and_a_stray_row_is_named():
    mb = _mb()
    cell = fc.attach_points(_cell(mb), pd.concat([mb, _mb(tp=4)]))
    assert len(cell) == len(_points()) + len({(p, b) for p, b, _ in _points()})
    d = cell[cell["phase"] == "decode"]
    assert sorted(map(tuple, d[["prompt_size", "batch_size", "token_size"]].to_numpy())) \
        == _points()
    pre = cell[cell["phase"] == "prefill"]
    assert (pre["token_size"] == -1).all()
    r = pre[(pre["prompt_size"] == 1024) & (pre["batch_size"] == 1)].iloc[0]
    assert r["value_us"] == pytest.approx(1000.0 * (50 + 0.3 * 1024 + 0.7) + 0.5, rel=1e-12)
    bad = _cell(mb)
    bad.loc[3, "value_us"] *= 1.01
    with pytest.raises(ValueError, match="c/3"):
        fc.attach_points(bad, mb)


def test_shots_are_the_centre_then_the_median_batch_then_the_median_prompt():
    mb = _mb()
    cell = fc.attach_points(_cell(mb), mb)
    shots = fc.choose_shots(cell, 3)
    # the prompt sweep (128..2048 at batch 1) has the centre as its median: skipped
    assert shots == [(512, 1, 128), (512, 4, 128)]
    assert fc.choose_shots(cell, 1) == [(512, 1, 128)]
    m = fc.shot_mask(cell, (512, 4, 128))
    got = cell[m]
    assert sorted(got["phase"]) == ["decode", "prefill"]
    assert (got["batch_size"] == 4).all() and (got["prompt_size"] == 512).all()


def test_prompt_sweep_median_is_taken_when_it_is_not_the_centre():
    pts = [(p, 1, 128) for p in (128, 256, 512, 1024, 2048, 4096, 8192)] + \
          [(512, b, 128) for b in (2, 4, 8)] + [(512, 1, t) for t in (256, 512)]
    cell = pd.DataFrame(pts, columns=["prompt_size", "batch_size", "token_size"]).assign(
        phase="decode")
    assert fc.choose_shots(cell, 3) == [(512, 1, 128), (512, 4, 128), (1024, 1, 128)]


def _held(n: int, ratio: float, half: float, phase: str, **kw) -> pd.DataFrame:
    """Predicted rows whose observed values are ``ratio`` x the median, band +-``half``."""
    med = np.linspace(1e4, 2e4, n)
    obs = med * ratio
    lo, hi = med * (1 - half), med * (1 + half)
    return pd.DataFrame({"phase": phase, "observed_us": obs, "pred_median_us": med,
                         "q05_us": lo, "q95_us": hi,
                         "in_90": ((obs >= lo) & (obs <= hi)).astype(float), **kw})


def test_scores_by_phase_goals_and_misses_from_the_numbers():
    h = pd.concat([
        _held(10, 1.03, 0.10, "decode", cell="c1", setting="one-shot population", shot="s"),
        _held(6, 1.20, 0.10, "prefill", cell="c1", setting="one-shot population", shot="s"),
        _held(10, 1.50, 0.20, "decode", cell="c1", setting="zero-shot", shot=""),
    ], ignore_index=True)
    s = fc.score(h[h["setting"] == "one-shot population"])
    assert s["decode"]["mdape_pct"] == pytest.approx(100 * (1 - 1 / 1.03), rel=1e-9)
    assert s["decode"]["coverage90"] == 1.0 and s["prefill"]["coverage90"] == 0.0
    assert s["decode"]["band_rel_width"] == pytest.approx(0.2, rel=1e-9)
    assert s["prefill"]["obs_over_pred"] == pytest.approx(1.2, rel=1e-9)
    t = fc.score_table(h)
    assert list(t["setting"].unique()) == ["one-shot population", "zero-shot"]
    assert (t[t["setting"] == "zero-shot"]["phase"] == "prefill").any()
    assert np.isnan(t[(t["setting"] == "zero-shot") & (t["phase"] == "prefill")]
                    ["mdape_pct"].iloc[0])
    goals = "\n".join(fc.goal_lines(t))
    assert "decode MdAPE <= 5%: **met**" in goals and "prefill MdAPE <= 10%: **not met**" in goals
    cells = pd.DataFrame([{"cell": "c1", "unseen": "model"}])
    scales = pd.DataFrame([{"cell": "c1", "scale": "sigma_model", "width_ratio": 0.97}])
    fits = pd.DataFrame([{"cell": "c1", "fit": "one-shot population: s",
                          "noise_sigma_prefill": 0.0001, "noise_sigma_decode": 0.02},
                         {"cell": "c1", "fit": "population (fleet without the cell)",
                          "noise_sigma_prefill": 0.135, "noise_sigma_decode": 0.4}])
    miss = fc.miss_lines(t, cells, scales, fits, {"prefill": 0.3})
    # in score order: prefill one-shot misses (0.0), decode one-shot over-covers (1.0),
    # zero-shot decode misses (0.0)
    assert len(miss) == 3 and all("unseen levels: model" in m for m in miss)
    assert all("`sigma_model` (unseen level) posterior 90% width 0.97x its prior's" in m
               for m in miss)
    assert "outside the band's half width" in miss[0] and "noise scale 0.0001" in miss[0]
    assert "wider than the error needs" in miss[1] and "noise scale 0.0200" in miss[1]
    assert "prior HalfNormal(0.3), mean 0.239; the fleet's other Splitwise configurations " \
        "0.135)" in miss[0]
    assert "prior HalfNormal" not in miss[1] and "configurations 0.400)" in miss[1]
    assert "noise scale" not in miss[2]
    assert fc.benchmark_noise_prior().keys() == {"prefill", "decode"}
    summ = fc.summary_table(t).set_index(["setting", "phase"])
    assert summ.loc[("one-shot population", "decode"), "coverage90"] == 1.0
    assert summ.loc[("zero-shot", "decode"), "rows"] == 10


def test_report_renders_every_section(tmp_path):
    h = pd.concat([
        _held(4, 1.01, 0.1, ph, cell="a|A100|tp2|splitwise", setting=st, shot=sh)
        for ph in ("prefill", "decode")
        for st, sh in (("zero-shot", ""), ("one-shot population", "p"),
                       ("one-shot roofline", "p"))], ignore_index=True)
    res = {"quick": True, "fleet": "a test fleet", "fleet_arg": "", "terms": ["t1", "t2"],
           "settings": "2 chains", "all_cells": ["a|A100|tp2|splitwise", "b|H100|tp4|splitwise"],
           "cells_run": ["a|A100|tp2|splitwise"],
           "scores": fc.score_table(h).to_dict(orient="records"),
           "cells": [{"cell": "a|A100|tp2|splitwise", "rows": 8, "unseen": "none",
                      "shots": ["p"]}],
           "fits": [{"cell": "a|A100|tp2|splitwise", "fit": "population", "passed": True,
                     "max_rhat": 1.004, "min_ess_bulk": 500.0, "divergences": 0,
                     "wall_s": 60.0, "cpu_s": 110.0}],
           "scales": [{"cell": "a|A100|tp2|splitwise", "scale": "sigma_model", "terms": 2,
                       "posterior_median": 0.2, "width_ratio": 0.9}]}
    md = fc.render(res, "Measured on a CPU.")
    for part in ("## Goals", "## Summary", "## Per cell, setting and phase", "## Fits",
                 "Measured on a CPU.", "not run: `b H100 tp4 splitwise`", "## Factor scales",
                 "1.0040"):
        assert part in md
    # no configuration id splits a table row: every row of a table has the header's columns
    for block in md.split("\n\n"):
        rows = [ln for ln in block.splitlines() if ln.startswith("|")]
        assert len({ln.count("|") for ln in rows}) <= 1, block


def test_rows_carry_their_fit_gates_and_failed_fits_are_named_in_the_goals():
    h = pd.concat([
        _held(10, 1.02, 0.1, "decode", cell="c1", setting=st, shot=sh)
        for st, sh in (("zero-shot", ""), ("one-shot population", "p1"),
                       ("one-shot population", "p2"))], ignore_index=True)
    fits = pd.DataFrame([{"cell": "c1", "fit": "population (fleet without the cell)",
                          "passed": True},
                         {"cell": "c1", "fit": "one-shot population: p1", "passed": True},
                         {"cell": "c1", "fit": "one-shot population: p2", "passed": False}])
    t = fc.with_gates(fc.score_table(h), fits)
    got = t[t["phase"] == "decode"].set_index("shot")["passed"].to_dict()
    assert got == {"": True, "p1": True, "p2": False}
    goals = "\n".join(fc.goal_lines(t))
    assert "1 of 2 one-shot population fits fail the convergence gates (`c1`, p2)" in goals
    assert "over the fits that pass: decode MdAPE median" in goals


def test_in_sample_rows_carry_the_whole_fleets_fit_gates_not_the_cells_population():
    h = pd.concat([
        _held(10, 1.02, 0.1, "decode", cell="c1", setting=st, shot="")
        for st in ("zero-shot", "in-sample")], ignore_index=True)
    fits = pd.DataFrame([{"cell": "c1", "fit": "population (fleet without the cell)",
                          "passed": True},
                         {"cell": "every cell", "fit": "in-sample: the whole fleet",
                          "passed": False}])
    t = fc.with_gates(fc.score_table(h), fits)
    got = t[t["phase"] == "decode"].set_index("setting")["passed"].to_dict()
    assert got == {"zero-shot": True, "in-sample": False}
    # the whole fleet's fit saw every level of the cell: a miss names none unseen
    cells = pd.DataFrame([{"cell": "c1", "unseen": "model"}])
    wide = t.assign(coverage90=1.0)
    lines = fc.miss_lines(wide, cells)
    assert any("zero-shot" in ln and "unseen levels: model" in ln for ln in lines)
    assert any("in-sample" in ln and "unseen levels: none" in ln for ln in lines)


def test_rows_are_put_in_their_sweep_from_the_centre():
    mb = _mb()
    cell = fc.attach_points(_cell(mb), mb)
    sw = pd.Series(fc.sweep_of(cell, (512, 1, 128)), index=cell.index)
    key = list(zip(cell["phase"], cell["prompt_size"], cell["batch_size"], cell["token_size"],
                   strict=True))
    got = dict(zip(key, sw, strict=True))
    assert got[("decode", 512, 1, 128)] == "centre" and got[("prefill", 512, 1, -1)] == "centre"
    assert got[("decode", 512, 1, 256)] == "tokens"
    assert got[("decode", 2048, 1, 128)] == "prompt" and got[("prefill", 2048, 1, -1)] == "prompt"
    assert got[("decode", 512, 8, 128)] == "batch" and got[("prefill", 512, 8, -1)] == "batch"
    held = cell.assign(setting="zero-shot", shot="", cell="c", observed_us=cell["value_us"],
                       pred_median_us=cell["value_us"] / 1.1, in_90=1.0)
    t = fc.sweep_table(held).set_index(["phase", "sweep"])
    assert t.loc[("decode", "tokens"), "n"] == len(TOKENS) - 1
    assert t.loc[("prefill", "batch"), "obs_over_pred"] == pytest.approx(1.1, rel=1e-9)


def test_a_fits_own_noise_prior_is_what_the_report_names():
    """A fit under a population names the fleet's lognormal prior of its benchmark noise; a fit
    without one, the priors file's half-normal; the miss lines quote the fit's own prior."""
    from types import SimpleNamespace

    pop = SimpleNamespace(fleet_noise={"benchmark_mean_prefill": {
        "sigma": 0.18, "rows": 78, "configs": 6, "log_mean": float(np.log(0.163)),
        "log_sd": 0.38}})
    own = fc.noise_prior_text(pop)
    assert own["noise_prior_prefill"] == "LogNormal(median 0.163, sd 0.38)"
    assert own["noise_prior_decode"].startswith("HalfNormal(")
    assert fc.noise_prior_text(None)["noise_prior_prefill"].startswith("HalfNormal(")
    h = pd.DataFrame({"cell": "c1", "setting": "one-shot population", "shot": "s",
                      "phase": "prefill", "obs_id": ["a", "b"], "observed_us": [100.0, 100.0],
                      "pred_median_us": [150.0, 150.0], "q05_us": [140.0, 140.0],
                      "q95_us": [160.0, 160.0], "in_90": [False, False]})
    fits = pd.DataFrame([{"cell": "c1", "fit": "one-shot population: s",
                          "noise_sigma_prefill": 0.15, **own}])
    miss = fc.miss_lines(fc.score_table(h), pd.DataFrame([{"cell": "c1", "unseen": "none"}]),
                         None, fits, {"prefill": 0.3})
    assert len(miss) == 1 and "prior LogNormal(median 0.163, sd 0.38)" in miss[0]
    assert "HalfNormal" not in miss[0]


def _sweep_rows(times: dict[int, float], cell: str = "a|A100|tp4|splitwise") -> pd.DataFrame:
    """Zero-shot prefill rows of a batch sweep at prompt 512 (times in us) and one prompt-sweep
    row at batch 1."""
    rows = [{"prompt_size": 512, "batch_size": b, "observed_us": y} for b, y in times.items()]
    rows += [{"prompt_size": 128, "batch_size": 1, "observed_us": times[1] - 384 * 10.0},
             {"prompt_size": 1024, "batch_size": 1, "observed_us": times[1] + 512 * 40.0}]
    t = pd.DataFrame(rows).assign(cell=cell, setting="zero-shot", phase="prefill", shot="",
                                  pred_median_us=lambda d: d["observed_us"])
    # a one-shot fit of the batch-1 point that predicts the batch sweep 20% low
    one = t[t["prompt_size"] == 512].assign(setting="one-shot population",
                                             shot="prompt 512, batch 1, 128 tokens",
                                             pred_median_us=lambda d: d["observed_us"] / 1.2)
    return pd.concat([t, one], ignore_index=True)


def test_batch_sweep_table_finds_what_a_line_cannot_follow_and_impossible_points():
    affine = {b: 2e4 + 5e4 * b for b in (1, 2, 4, 8, 16, 32)}
    t = fc.batch_sweep_table(_sweep_rows(affine))
    assert t["prompt_size"].tolist() == [512]
    assert t["best_line_mdape_pct"].iloc[0] == pytest.approx(0.0, abs=1e-9)
    assert t["faster_than_smaller_batch"].iloc[0] == ""
    assert t["us_per_token_below"].iloc[0] == pytest.approx(10.0)
    assert t["us_per_token_above"].iloc[0] == pytest.approx(40.0)
    assert t["batch_obs_over_pred_b1_shots"].iloc[0] == pytest.approx(1.2)
    # per-token cost rising with the batch: no line through the points follows it
    convex = {b: 5e4 * b ** 1.3 for b in (1, 2, 4, 8, 16, 32)}
    t = fc.batch_sweep_table(_sweep_rows(convex))
    assert t["best_line_mdape_pct"].iloc[0] > 5.0
    assert t["at_batch"].iloc[0] == 32
    # a batch measured faster than a smaller one is named and left out of the line
    broken = {**affine, 64: 1e5}
    t = fc.batch_sweep_table(_sweep_rows(broken))
    assert t["faster_than_smaller_batch"].iloc[0] == "64"
    assert t["best_line_mdape_pct"].iloc[0] == pytest.approx(0.0, abs=1e-9)
    lines = fc.shape_lines(t.to_dict(orient="records"))
    assert len(lines) == 2 and "4.0-4.0x" in lines[0] and "1.20-1.20" in lines[0]
    assert "batch 64" in lines[1]
    lines = fc.shape_lines(fc.batch_sweep_table(_sweep_rows(convex)).to_dict(orient="records"))
    assert "follow within 10%" in lines[0]


def test_rows_faster_than_the_gpus_peak_are_out_of_the_fits_and_the_scores():
    obs = pd.DataFrame({"obs_id": ["a/0", "a/1", "a/2"], "kind": "benchmark_mean",
                        "config_id": "m|H100-SXM|tp2|splitwise",
                        "value_us": [1000.0, 50.0, 900.0],
                        "x_prefill_compute": [100.0, 400.0, 100.0],
                        "x_decode_compute": [0.0, 0.0, 0.0]})
    kept, dropped = fc.drop_unphysical(obs)
    assert kept["obs_id"].tolist() == ["a/0", "a/2"]
    assert dropped == [{"obs_id": "a/1", "config_id": "m|H100-SXM|tp2|splitwise",
                        "ratio": pytest.approx(0.125)}]


def test_a_run_is_set_beside_another_terms_run():
    fits = [{"cell": "c1", "fit": "one-shot population: s", "passed": True}]

    def res(ratio: float, terms: list[str]) -> dict:
        h = pd.concat([_held(8, ratio, 0.1, ph, cell="c1", setting="one-shot population",
                             shot="s") for ph in ("prefill", "decode")], ignore_index=True)
        return {"terms": terms, "settings": "2 chains", "fits": fits,
                "scores": fc.score_table(h).to_dict(orient="records")}

    mine = res(1.02, ["t1", "knee"])
    mine["against"] = res(1.20, ["t1"])
    t = fc.against_table(mine).set_index(["setting", "phase"])
    got = t.loc[("one-shot population", "prefill"), "median_mdape_pct"]
    assert got == f"{100 * (1 - 1 / 1.02):.1f} ({100 * (1 - 1 / 1.20):.1f})"
    assert t.loc[("one-shot population", "decode"), "coverage90"] == "1.000 (0.000)"
    md = "\n".join(fc.against_lines(mine))
    assert "## Against other terms" in md and "terms `t1`" in md and "1 of 1" in md
