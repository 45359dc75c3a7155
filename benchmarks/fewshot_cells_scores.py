"""Scores and report of ``benchmarks/fewshot_cells.py`` (no fitting): the Splitwise point of
each benchmark row of a cell, the one-shot point rule, scores by phase and by sweep, the goals
and the markdown report.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

#: The compared settings, in the report's order.
SETTINGS = ("zero-shot", "one-shot population", "one-shot roofline", "in-sample")
#: Goals: one-shot MdAPE (%) per phase, and the 90% band's coverage range.
GOAL_MDAPE = {"decode": 5.0, "prefill": 10.0}
GOAL_COVERAGE = (0.85, 0.95)
#: Factors of the hierarchy whose levels a configuration has.
FACTORS = ("model", "gpu", "tp", "stack")
PHASES = ("prefill", "decode")
#: Noise class of a benchmark row by phase (``model/definition/likelihood.py``: ``noise_kind``).
NOISE_CLASS = {"prefill": "benchmark_mean_prefill", "decode": "benchmark_mean"}


def cell_label(cell: str) -> str:
    """A configuration id as a table shows it (no ``|``, which splits a markdown cell):
    ``bloom-176b|A100-80GB|tp8|splitwise`` -> ``bloom-176b A100-80GB tp8 splitwise``."""
    return str(cell).replace("|", " ")


# ------------------------------------------------------------------------------ pure pieces
def attach_points(cell: pd.DataFrame, mb: pd.DataFrame, rtol: float = 1e-9) -> pd.DataFrame:
    """``cell`` (benchmark rows of one configuration, ``phase`` prefill / decode, ``value_us``,
    ``tp``) with the Splitwise point each row measures: ``prompt_size``, ``batch_size`` and, for
    a decode row, ``token_size`` (-1 on prefill rows: one prefill serves every token size).

    ``mb`` is :func:`~bayes_latency.data.microbench.read_splitwise`'s table. A row is matched to
    the point whose mean time (``prompt_time_us`` over ``(prompt, batch)``, ``token_time_us``
    over ``(prompt, batch, token)``, at the row's TP degree) equals its value within ``rtol``.

    Raises
    ------
    ValueError
        A row matches no point or several (names its ``obs_id``).
    """
    keys = ["model", "hardware", "tp"]
    pre = mb.groupby(keys + ["prompt_size", "batch_size"])["prompt_time_us"].mean().reset_index()
    dec = mb.groupby(keys + ["prompt_size", "batch_size", "token_size"])[
        "token_time_us"].mean().reset_index()
    out = []
    for _, r in cell.iterrows():
        tab, col = (pre, "prompt_time_us") if r["phase"] == "prefill" else (dec, "token_time_us")
        v = float(r["value_us"])
        hit = tab[(tab["tp"] == int(r["tp"])) & (np.abs(tab[col] - v) <= rtol * abs(v))]
        if len(hit) != 1:
            raise ValueError(f"benchmark row {r.get('obs_id', '?')}: value {v:.6g} us matches "
                             f"{len(hit)} Splitwise points at tp {int(r['tp'])}, expected one")
        h = hit.iloc[0]
        out.append((int(h["prompt_size"]), int(h["batch_size"]),
                    int(h["token_size"]) if "token_size" in h else -1))
    p = np.array(out, dtype=int).reshape(-1, 3)
    return cell.assign(prompt_size=p[:, 0], batch_size=p[:, 1], token_size=p[:, 2])


def choose_shots(cell: pd.DataFrame, n: int = 3) -> list[tuple[int, int, int]]:
    """The one-shot points ``(prompt_size, batch_size, token_size)`` of a cell, in order, by
    this rule on its decode points (the sweeps of a Splitwise cell cross at one point):

    1. the **centre**: the point whose prompt size, batch size and token size are shared by the
       most points (sum of the three counts; ties: the smallest point);
    2. the median batch size of the points at the centre's prompt and token size (the batch
       sweep; the upper median of an even count);
    3. the median prompt size of the points at the centre's batch and token size (the prompt
       sweep).

    A rule's point already chosen (a sweep of one point) is skipped; at most ``n`` points.
    """
    d = cell[cell["phase"] == "decode"][["prompt_size", "batch_size", "token_size"]]
    pts = sorted({tuple(int(v) for v in r) for r in d.to_numpy()})
    if not pts:
        return []
    cnt = [d[c].value_counts() for c in ("prompt_size", "batch_size", "token_size")]
    centre = max(pts, key=lambda p: (sum(int(cnt[i][p[i]]) for i in range(3)),
                                     [-v for v in p]))
    chosen = [centre]
    for vary in (1, 0):  # batch sweep, then prompt sweep
        fixed = [i for i in range(3) if i != vary]
        sweep = sorted((p for p in pts if all(p[i] == centre[i] for i in fixed)),
                       key=lambda p: p[vary])
        pick = sweep[len(sweep) // 2]
        if pick not in chosen:
            chosen.append(pick)
    return chosen[:n]


def shot_mask(cell: pd.DataFrame, point: tuple[int, int, int]) -> np.ndarray:
    """Rows of ``point`` in ``cell`` (with :func:`attach_points`' columns): its prefill row
    ``(prompt, batch)`` and its decode row ``(prompt, batch, token)``."""
    p, b, t = point
    same = (cell["prompt_size"] == p) & (cell["batch_size"] == b)
    return (same & ((cell["phase"] == "prefill") | (cell["token_size"] == t))).to_numpy()


def point_label(point: tuple[int, int, int]) -> str:
    """``prompt P, batch B, T tokens``."""
    return f"prompt {point[0]}, batch {point[1]}, {point[2]} tokens"


def _metrics(g: pd.DataFrame) -> dict[str, float]:
    """``n``, ``mdape_pct``, ``coverage90`` and ``obs_over_pred`` of the predicted rows ``g``
    (at least one; :func:`score`)."""
    y, m = g["observed_us"].to_numpy(float), g["pred_median_us"].to_numpy(float)
    return {"n": int(len(g)),
            "mdape_pct": float(np.median(np.abs(m / y - 1.0)) * 100.0),
            "coverage90": float(g["in_90"].astype(float).mean()),
            "obs_over_pred": float(np.median(y / m))}


def score(held: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Per phase of the predicted rows (``phase``, ``observed_us``, ``pred_median_us``,
    ``q05_us``, ``q95_us``, ``in_90``): ``n``, ``mdape_pct`` (median of
    ``|median / observed - 1|``, %), ``coverage90`` (share inside the central 90% band),
    ``band_rel_width`` (median of ``(q95 - q05) / median``) and ``obs_over_pred`` (median of
    ``observed / median``); NaN for a phase without rows."""
    out = {}
    for ph in PHASES:
        g = held[held["phase"] == ph]
        if g.empty:
            out[ph] = {"n": 0, "mdape_pct": math.nan, "coverage90": math.nan,
                       "band_rel_width": math.nan, "obs_over_pred": math.nan}
            continue
        width = (g["q95_us"] - g["q05_us"]) / g["pred_median_us"]
        s = _metrics(g)
        out[ph] = {k: s[k] for k in ("n", "mdape_pct", "coverage90")} | {
            "band_rel_width": float(np.median(width)), "obs_over_pred": s["obs_over_pred"]}
    return out


def score_table(held: pd.DataFrame) -> pd.DataFrame:
    """One row per (cell, setting, shot point, phase) of all predicted rows (``cell``,
    ``setting``, ``shot`` besides :func:`score`'s columns), in the order they appear."""
    rows = []
    for (cell, setting, shot), g in held.groupby(["cell", "setting", "shot"], sort=False):
        for ph, s in score(g).items():
            rows.append({"cell": cell, "setting": setting, "shot": shot, "phase": ph, **s})
    return pd.DataFrame(rows)


def sweep_of(rows: pd.DataFrame, centre: tuple[int, int, int]) -> np.ndarray:
    """Which sweep of its cell each row (``prompt_size``, ``batch_size``, ``token_size``, -1 on
    prefill rows) belongs to, from the centre point (:func:`choose_shots`' first): ``batch``
    (another batch size), ``prompt`` (another prompt size at the centre's batch size),
    ``tokens`` (a decode row at another token size) or ``centre``."""
    p, b, t = centre
    out = np.full(len(rows), "centre", dtype=object)
    tok = rows["token_size"].to_numpy()
    out[(tok >= 0) & (tok != t)] = "tokens"
    out[rows["prompt_size"].to_numpy() != p] = "prompt"
    out[rows["batch_size"].to_numpy() != b] = "batch"
    return out


def sweep_table(held: pd.DataFrame) -> pd.DataFrame:
    """Per setting, phase and sweep (:func:`sweep_of`, the centre of each cell from its
    zero-shot rows) over every cell and shot: rows, MdAPE (%), 90% coverage and the median
    observed / predictive median."""
    parts = []
    for _, g in held.groupby("cell", sort=False):
        z = g[g["setting"] == "zero-shot"]
        centre = choose_shots(z if len(z) else g, 1)
        if centre:
            parts.append(g.assign(sweep=sweep_of(g, centre[0])))
    if not parts:
        return pd.DataFrame()
    h = pd.concat(parts, ignore_index=True)
    rows = []
    for (st, ph, sw), g in h.groupby(["setting", "phase", "sweep"], sort=False):
        rows.append({"setting": st, "phase": ph, "sweep": sw, **_metrics(g)})
    order = {s: i for i, s in enumerate(SETTINGS)}
    t = pd.DataFrame(rows)
    return t.sort_values(["setting", "phase", "sweep"], key=lambda c: c.map(order).fillna(0)
                         if c.name == "setting" else c, kind="stable").reset_index(drop=True)


def batch_sweep_table(held: pd.DataFrame) -> pd.DataFrame:
    """Per cell, the shape of its prefill as measured (the zero-shot rows hold every point).

    The batch sweep is the prefill rows at the prompt size ``p0`` its batches above 1 share; the
    prompt sweep the rows at batch 1. Columns: ``prompt_size`` (``p0``); ``batches`` measured;
    ``ms_per_ktok_b1`` / ``ms_per_ktok_max``: prefill milliseconds per thousand prompt tokens at
    batch 1 and where highest along the batch sweep (``at_batch``);
    ``faster_than_smaller_batch``: batch sizes whose prefill took less time than a smaller batch
    of the same prompt size (one prefill of more tokens cannot be faster: a failed measurement);
    ``best_line_mdape_pct``: the lowest MdAPE, over the batch sweep's other points, of a line
    ``a + c b`` (``a, c >= 0``) through two of them or through one with ``a = 0`` or ``c = 0``
    (at a fixed prompt size the default terms are affine in the batch size ``b``: the weight,
    per-layer and per-step terms constant, the compute, KV, TP and per-request terms
    proportional to ``b``; so this is about the best any coefficients predict the sweep);
    ``us_per_token_below`` / ``us_per_token_above``: the prefill's added microseconds per prompt
    token at batch 1 from the smallest prompt to ``p0`` and from ``p0`` to the largest;
    ``batch_obs_over_pred_b1_shots``: median observed / predictive median of the batch sweep's
    rows (batch above 1) in the one-shot population fits of a batch-1 point.
    """
    from itertools import combinations

    rows = []
    z = held[(held["setting"] == "zero-shot") & (held["phase"] == "prefill")]
    for cell, g in z.groupby("cell", sort=False):
        g = g.drop_duplicates(["prompt_size", "batch_size"])
        multi = g[g["batch_size"] > 1]
        if multi.empty:
            continue
        p0 = int(multi["prompt_size"].mode().iloc[0])
        sw = g[g["prompt_size"] == p0].sort_values("batch_size")
        b = sw["batch_size"].to_numpy(float)
        y = sw["observed_us"].to_numpy(float)
        slower = np.array([not np.any(y[:i] > y[i]) for i in range(len(y))])
        bb, yy = b[slower], y[slower]
        lines = [(yy[i] - (yy[j] - yy[i]) / (bb[j] - bb[i]) * bb[i],
                  (yy[j] - yy[i]) / (bb[j] - bb[i])) for i, j in combinations(range(len(bb)), 2)]
        lines += [(0.0, yy[i] / bb[i]) for i in range(len(bb))]
        lines += [(yy[i], 0.0) for i in range(len(bb))]
        best = min((float(np.median(np.abs((a + c * bb) / yy - 1))) for a, c in lines
                    if a >= 0 and c >= 0), default=math.nan)
        per_ktok = y / (b * p0)  # us per token = ms per 1000 tokens
        ps = g[g["batch_size"] == 1].sort_values("prompt_size")
        pp, py = ps["prompt_size"].to_numpy(float), ps["observed_us"].to_numpy(float)
        below = above = math.nan
        if p0 in pp and pp[0] < p0 < pp[-1]:
            k = int(np.flatnonzero(pp == p0)[0])
            below = (py[k] - py[0]) / (pp[k] - pp[0])
            above = (py[-1] - py[k]) / (pp[-1] - pp[k])
        one = held[(held["cell"] == cell) & (held["setting"] == "one-shot population")
                   & (held["phase"] == "prefill")
                   & held["shot"].astype(str).str.contains(r"\bbatch 1,", regex=True)]
        one = one[(one["prompt_size"] == p0) & (one["batch_size"] > 1)]
        ratio = (float(np.median(one["observed_us"] / one["pred_median_us"])) if len(one)
                 else math.nan)
        rows.append({"cell": cell, "prompt_size": p0,
                     "batches": ", ".join(str(int(v)) for v in b),
                     "ms_per_ktok_b1": float(per_ktok[0]),
                     "ms_per_ktok_max": float(per_ktok[slower].max()),
                     "at_batch": int(b[slower][np.argmax(per_ktok[slower])]),
                     "faster_than_smaller_batch": ", ".join(str(int(v)) for v in b[~slower]),
                     "best_line_mdape_pct": 100 * best,
                     "us_per_token_below": float(below), "us_per_token_above": float(above),
                     "batch_obs_over_pred_b1_shots": ratio})
    return pd.DataFrame(rows)


def pooled_coverage(g: pd.DataFrame) -> float:
    """Share of all rows of the score rows ``g`` inside their 90% band (row-weighted)."""
    return float((g["coverage90"] * g["n"]).sum() / g["n"].sum())


def with_gates(scores: pd.DataFrame, fits: pd.DataFrame) -> pd.DataFrame:
    """``scores`` with ``passed``: whether the fit behind each row passed the convergence
    gates (zero-shot rows: the population fit of the cell; one-shot rows: the fit named
    ``"<setting>: <shot>"``; in-sample rows: the fit of the whole fleet)."""
    if fits is None or fits.empty or "passed" not in fits:
        return scores.assign(passed=True)
    ok = {(r["cell"], r["fit"]): bool(r["passed"]) for _, r in fits.iterrows()}
    pop = {r["cell"]: bool(r["passed"]) for _, r in fits.iterrows()
           if str(r["fit"]).startswith("population")}
    whole = [bool(r["passed"]) for _, r in fits.iterrows()
             if str(r["fit"]).startswith("in-sample")]
    return scores.assign(passed=[
        (all(whole) if r["setting"] == "in-sample" else pop.get(r["cell"], True))
        if not r["shot"] else ok.get((r["cell"], f"{r['setting']}: {r['shot']}"), True)
        for _, r in scores.iterrows()])


def shape_lines(batch_sweeps: list[dict[str, Any]]) -> list[str]:
    """A goal line on the prefill batch sweeps no line fits within the prefill goal (see
    :func:`batch_sweep_table`), and on the points measured faster than a smaller batch."""
    t = pd.DataFrame(batch_sweeps)
    if t.empty:
        return []
    out = []
    hard = t[t["best_line_mdape_pct"] > GOAL_MDAPE["prefill"]]
    if len(hard):
        out.append("- prefill batch sweeps no coefficients of the terms follow within "
                   f"{GOAL_MDAPE['prefill']:.0f}% (a line's best MdAPE): "
                   + ", ".join(f"`{cell_label(c)}` {v:.1f}%" for c, v in
                               hard[["cell", "best_line_mdape_pct"]].to_numpy())
                   + f"; {len(t) - len(hard)} of {len(t)} sweeps a line follows within "
                   + ", ".join(f"{v:.1f}%" for v in
                               t.loc[t["best_line_mdape_pct"] <= GOAL_MDAPE["prefill"],
                                     "best_line_mdape_pct"])
                   + " (\"What the terms can represent of the prefill\" below).")
    if {"us_per_token_below", "us_per_token_above"} <= set(t.columns):
        k = t.dropna(subset=["us_per_token_below", "us_per_token_above"])
        if len(k):
            r = k["us_per_token_above"] / k["us_per_token_below"]
            ob = k["batch_obs_over_pred_b1_shots"].dropna()
            out.append(
                f"- at batch 1 a prompt token above {int(k['prompt_size'].iloc[0])} tokens "
                f"adds {r.min():.1f}-"
                f"{r.max():.1f}x the prefill time one below does (prompt sweeps), as if the GPU "
                "took the "
                "larger of reading the weights and computing; BLIS's additive terms add the "
                "weight, per-layer and per-step terms to the compute term, so a one-shot point "
                "at batch 1 gives them time that larger prefills do not pay"
                + (f": the batch sweeps' observed / predicted in those fits "
                   f"{ob.min():.2f}-{ob.max():.2f}." if len(ob) else "."))
    odd = t[t["faster_than_smaller_batch"].astype(str) != ""]
    if len(odd):
        out.append("- prefill points measured faster than a smaller batch of the same prompt "
                   "size (kept in the fits and the scores, being no faster than the GPU's "
                   "peak): "
                   + ", ".join(f"`{cell_label(c)}` batch {b}" for c, b in
                               odd[["cell", "faster_than_smaller_batch"]].to_numpy()) + ".")
    return out


def goal_lines(scores: pd.DataFrame) -> list[str]:
    """The goals, met or not, from the one-shot population rows of :func:`score_table`:
    median over (cell, shot) of each phase's MdAPE against :data:`GOAL_MDAPE`, and the pooled
    90% coverage (row-weighted) against :data:`GOAL_COVERAGE`."""
    s = scores[scores["setting"] == "one-shot population"]
    lines = []
    lo, hi = GOAL_COVERAGE
    for ph in PHASES:
        g = s[(s["phase"] == ph) & (s["n"] > 0)]
        if g.empty:
            continue
        md = float(g["mdape_pct"].median())
        worst = float(g["mdape_pct"].max())
        n_ok = int((g["mdape_pct"] <= GOAL_MDAPE[ph]).sum())
        cov = pooled_coverage(g)
        lines.append(
            f"- one-shot {ph} MdAPE <= {GOAL_MDAPE[ph]:.0f}%: "
            f"**{'met' if md <= GOAL_MDAPE[ph] else 'not met'}** (median over {len(g)} "
            f"cell x shot fits {md:.1f}%, worst {worst:.1f}%, {n_ok} of {len(g)} within); "
            f"90% band coverage {lo:.2f}-{hi:.2f}: **{'met' if lo <= cov <= hi else 'not met'}** "
            f"({cov:.3f} of {int(g['n'].sum())} rows; per fit "
            f"{g['coverage90'].min():.2f}-{g['coverage90'].max():.2f}).")
    if "passed" in s and not s["passed"].all():
        bad = s[~s["passed"].astype(bool)][["cell", "shot"]].drop_duplicates()
        ok = s[s["passed"].astype(bool) & (s["n"] > 0)]
        lines.append(f"- {len(bad)} of {len(s[['cell', 'shot']].drop_duplicates())} one-shot "
                     "population fits fail the convergence gates ("
                     + "; ".join(f"`{cell_label(c)}`, {sh}" for c, sh in bad.to_numpy())
                     + "); over the fits that pass: "
                     + ", ".join(f"{ph} MdAPE median {g['mdape_pct'].median():.1f}%, "
                                 f"coverage {pooled_coverage(g):.3f}"
                                 for ph in PHASES if len(g := ok[ok["phase"] == ph])) + ".")
    return lines


def summary_table(scores: pd.DataFrame) -> pd.DataFrame:
    """Per setting and phase over every (cell, shot): the median and worst MdAPE, the pooled
    (row-weighted) 90% coverage, the range of the per-fit coverages and the median band
    width."""
    rows = []
    for (setting, ph), g in scores[scores["n"] > 0].groupby(["setting", "phase"], sort=False):
        rows.append({"setting": setting, "phase": ph, "fits": len(g), "rows": int(g["n"].sum()),
                     "median_mdape_pct": float(g["mdape_pct"].median()),
                     "worst_mdape_pct": float(g["mdape_pct"].max()),
                     "coverage90": pooled_coverage(g),
                     "coverage90_range": f"{g['coverage90'].min():.2f}-{g['coverage90'].max():.2f}",
                     "median_band_rel_width": float(g["band_rel_width"].median())})
    return pd.DataFrame(rows)



def against_table(res: dict[str, Any]) -> pd.DataFrame:
    """Per setting and phase, this run's summary beside that of ``res["against"]`` (another
    run's :func:`summarise` result on the same fleet, with other terms)."""
    fits = pd.DataFrame(res.get("fits", []))
    ref = res["against"]
    a = summary_table(with_gates(pd.DataFrame(res["scores"]), fits))
    b = summary_table(with_gates(pd.DataFrame(ref["scores"]), pd.DataFrame(ref.get("fits", []))))
    m = a.merge(b, on=["setting", "phase"], suffixes=("", "_against"))
    out = m[["setting", "phase"]].copy()
    for c, nd in (("median_mdape_pct", 1), ("worst_mdape_pct", 1), ("coverage90", 3),
                  ("median_band_rel_width", 3)):
        out[c] = [f"{_fmt(float(x), nd)} ({_fmt(float(y), nd)})"
                  for x, y in zip(m[c], m[f"{c}_against"], strict=True)]
    return out


def against_lines(res: dict[str, Any]) -> list[str]:
    """The report's section comparing this run with ``res["against"]``."""
    from bayes_latency.study.markdown import _md

    ref = res["against"]
    return ["## Against other terms", "",
            f"This run's numbers, and in brackets those of the same benchmark on the same "
            f"fleet with the terms `{', '.join(ref['terms'])}` "
            f"({ref.get('settings', '')}; fits passing the gates: "
            f"{sum(bool(f.get('passed')) for f in ref.get('fits', []))} of "
            f"{len(ref.get('fits', []))}).", "", _md(against_table(res)), ""]


def half_normal_text(s: float) -> str:
    """A ``HalfNormal(s)`` prior as text, with its mean ``s sqrt(2 / pi)``."""
    return f"HalfNormal({s:g}), mean {s * math.sqrt(2 / math.pi):.3f}"

def miss_lines(scores: pd.DataFrame, cells: pd.DataFrame, scales: pd.DataFrame | None = None,
               fits: pd.DataFrame | None = None,
               noise_prior: dict[str, float] | None = None) -> list[str]:
    """For each (cell, setting, shot, phase) whose coverage is outside the goal's range: the
    median observed / predicted ratio against the band's half width, the cell's unseen levels
    and, from the numbers, where the band's width comes from: the posterior-over-prior width of
    an unseen level's factor scale (``scales``, :func:`factor_scales`), the one-shot fit's noise
    scale of the phase's class (``fits``) against the population fit's (the fleet's other
    Splitwise configurations) and its prior: the fit's own ``noise_prior_<phase>`` (text, the
    fleet's lognormal under a population) when ``fits`` records it, else ``noise_prior`` (per
    phase, the scale ``s`` of the class's ``HalfNormal(s)`` prior, mean ``s sqrt(2 / pi)``)."""
    lo, hi = GOAL_COVERAGE
    unseen = cells.set_index("cell")["unseen"].to_dict() if len(cells) else {}
    out = []
    for _, r in scores[(scores["n"] > 0) & ((scores["coverage90"] < lo)
                                           | (scores["coverage90"] > hi))].iterrows():
        ratio, half = float(r["obs_over_pred"]), float(r["band_rel_width"]) / 2
        un = ("none" if r["setting"] == "in-sample"  # the whole fleet's fit sees every level
              else unseen.get(r["cell"]) or "none")
        if r["coverage90"] < lo:
            why = ("the median error is outside the band's half width"
                   if abs(math.log(ratio)) > math.log1p(half) else
                   "the median error is inside the half width, the rows scatter past it")
        else:
            why = "wider than the error needs"
        extra = []
        if scales is not None and len(scales) and un != "none":
            for f in un.split(", "):
                sc = scales[(scales["cell"] == r["cell"]) & (scales["scale"] == f"sigma_{f}")]
                if len(sc):
                    extra.append(f"`sigma_{f}` (unseen level) posterior 90% width "
                                 f"{float(sc['width_ratio'].iloc[0]):.2f}x its prior's")
        if fits is not None and len(fits) and r["shot"]:
            ft = fits[(fits["cell"] == r["cell"])
                      & (fits["fit"] == f"{r['setting']}: {r['shot']}")]
            col = f"noise_sigma_{r['phase']}"
            pf = fits[(fits["cell"] == r["cell"]) & fits["fit"].str.startswith("population")]
            if len(ft) and col in ft:
                txt = (f"the fit's {r['phase']} noise scale {float(ft[col].iloc[0]):.4f} "
                       "(log scale, from one row")
                own = ft.get(f"noise_prior_{r['phase']}")
                own = own.iloc[0] if own is not None else None
                if isinstance(own, str) and own:
                    txt += f"; prior {own}"
                elif noise_prior and r["phase"] in noise_prior:
                    txt += f"; prior {half_normal_text(noise_prior[r['phase']])}"
                if len(pf) and col in pf:
                    txt += (f"; the fleet's other Splitwise configurations "
                            f"{float(pf[col].iloc[0]):.3f}")
                extra.append(txt + ")")
        out.append(f"- `{cell_label(r['cell'])}` {r['setting']}"
                   f"{' (' + r['shot'] + ')' if r['shot'] else ''}, {r['phase']}: "
                   f"{r['coverage90']:.2f} inside; observed / predicted {ratio:.3f} against a "
                   f"band half width of {half:.3f} ({why}); unseen levels: {un}"
                   + ("; " + "; ".join(extra) if extra else "") + ".")
    return out


def benchmark_noise_prior() -> dict[str, float]:
    """Per phase, the scale of the ``HalfNormal`` prior of its benchmark noise class in
    ``priors/default.yaml`` (the prior of both one-shot fits' noise)."""
    from bayes_latency.model.definition.design import prior_arrays
    from bayes_latency.physics.basis import DEFAULT_TERMS
    from bayes_latency.priors import load_priors

    pa = prior_arrays(load_priors(None), tuple(DEFAULT_TERMS), [])
    return {ph: float(pa.noise_sigma[k]) for ph, k in NOISE_CLASS.items() if k in pa.noise_sigma}


def _fmt(v: Any, nd: int = 1, pct: bool = False) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    if isinstance(v, float):
        return f"{v:.{nd}f}{'%' if pct else ''}"
    return str(v)


def render(res: dict[str, Any], machine: str = "") -> str:
    """The markdown report of a run (``res`` as ``fewshot_cells.summarise`` returns it)."""
    from bayes_latency.study.markdown import _md
    from benchmarks.fewshot_cells_bound import bound_lines, bound_markdown, bound_table

    cells = pd.DataFrame(res["cells"])
    fits = pd.DataFrame(res["fits"])
    scores = with_gates(pd.DataFrame(res["scores"]), fits)
    scales = pd.DataFrame(res.get("scales", []))
    arg = res.get("fleet_arg") or ""
    fleet_how = ("" if not arg or arg == "real" else
                 f" (`--fleet PATH`: the `client/observations.parquet` that `bayes-latency study "
                 f"client --out DIR` writes; this run read `{arg}`)")
    ref_terms = res.get("against", {}).get("terms", [])
    against_how = (" (`--against WORK`: the `--work` folder of the same command with `--terms "
                   f"{'regime' if 'compute_over_2w' in ref_terms else 'blis'}`)"
                   if res.get("against") else "")
    lines = ["# Unseen Splitwise cells: zero-shot and one-shot from the fleet's population", "",
             f"Regenerate: `python benchmarks/fewshot_cells.py{' --quick' if res['quick'] else ''}"
             f"{' --fleet ' + ('real' if arg == 'real' else 'PATH') if arg else ''}"
             f"{' --terms regime' if 'compute_over_2w' in res['terms'] else ''}"
             f"{' --against WORK' if res.get('against') else ''}`{against_how}"
             f"{fleet_how}. "
             f"Fleet: {res['fleet']}"
             + (f" (without the {len(res['dropped_rows'])} rows measured faster than their "
                "compute at the GPU's peak, out of the fits and the scores: "
                + ", ".join(f"`{r['obs_id']}` ({r['ratio']:.2f}x)" for r in res["dropped_rows"])
                + ")" if res.get("dropped_rows") else "")
             + f". Terms: `{', '.join(res['terms'])}`; every fit: "
             f"{res['settings']}; 200 predictive draws per row.",
             *(["", machine] if machine else []), "",
             f"Cells run: {', '.join('`' + cell_label(c) + '`' for c in res['cells_run'])}"
             + (f" (of {len(res['all_cells'])}; not run: "
                + ", ".join('`' + cell_label(c) + '`' for c in res['all_cells']
                            if c not in res['cells_run'])
                + ")" if len(res["cells_run"]) < len(res["all_cells"]) else " (every cell)")
             + ". For each, every row of the cell's configuration is out of the fleet and the "
             "rest is fitted; its population is the prior of the one-shot fits.", "",
             "- **zero-shot**: every benchmark row of the cell predicted by the fleet's fit, the "
             "configuration drawn as an unseen one (a level the fleet saw takes its fitted "
             "effect, an unseen level its factor's population draw);",
             "- **one-shot population**: one benchmark point (its prefill row and its decode row) "
             "fitted with the population as the prior, the cell's other rows predicted;",
             "- **one-shot roofline**: the same point fitted with `priors/default.yaml` alone.", "",
             "One-shot points, by rule (`choose_shots`): the centre of the cell's sweeps (the "
             "point whose prompt, batch and token sizes the most points share), then the median "
             "batch size of the batch sweep, then the median prompt size of the prompt sweep. "
             "Scores are over the cell's rows not fitted (zero-shot: all rows).", "",
             "## Goals", "", *goal_lines(scores), *shape_lines(res.get("batch_sweeps", [])),
             *bound_lines(bt := bound_table(res.get("basis_bounds", []), scores),
                          GOAL_MDAPE["prefill"], GOAL_MDAPE["decode"]), ""]
    summ = summary_table(scores)
    for c, nd in (("median_mdape_pct", 1), ("worst_mdape_pct", 1), ("coverage90", 3),
                  ("median_band_rel_width", 3)):
        summ[c] = summ[c].map(lambda v, nd=nd: _fmt(float(v), nd))
    lines += ["## Summary", "", "Per setting and phase, over every cell (and one-shot point): "
              "median and worst MdAPE (%), the share of all scored rows inside their 90% band "
              "(`coverage90`) and the range of the per-fit shares, the median relative band "
              "width.", "", _md(summ), ""]
    if res.get("against"):
        lines += against_lines(res)
    shown = scores.copy()
    shown["cell"] = shown["cell"].map(cell_label)
    shown["passed"] = shown["passed"].map(lambda v: "yes" if v else "**no**")
    for c, nd in (("mdape_pct", 1), ("coverage90", 2), ("band_rel_width", 3),
                  ("obs_over_pred", 3)):
        shown[c] = shown[c].map(lambda v, nd=nd: _fmt(float(v), nd))
    lines += ["## Per cell, setting and phase", "",
              "`mdape_pct`: MdAPE of the predictive median (%); `coverage90`: share of rows "
              "inside the 90% band; `band_rel_width`: median (q95 - q05) / median; "
              "`obs_over_pred`: median observed / predictive median; `passed`: the fit behind "
              "the row passed the convergence gates.", "",
              _md(shown), ""]
    sw = pd.DataFrame(res.get("sweeps", []))
    if len(sw):
        for c, nd in (("mdape_pct", 1), ("coverage90", 2), ("obs_over_pred", 3)):
            sw[c] = sw[c].map(lambda v, nd=nd: _fmt(float(v), nd))
        lines += ["### By sweep", "", "The rows of every cell and one-shot point by the sweep "
                  "of the cell they belong to, from the centre point: `batch` (another batch "
                  "size), `prompt` (another prompt size at batch 1), `tokens` (decode at another "
                  "token count), `centre`.", "", _md(sw), ""]
    bs = pd.DataFrame(res.get("batch_sweeps", []))
    if len(bs):
        bs["cell"] = bs["cell"].map(cell_label)
        for c, nd in (("ms_per_ktok_b1", 1), ("ms_per_ktok_max", 1), ("best_line_mdape_pct", 1),
                      ("us_per_token_below", 1), ("us_per_token_above", 1),
                      ("batch_obs_over_pred_b1_shots", 3)):
            if c not in bs:
                continue
            bs[c] = bs[c].map(lambda v, nd=nd: _fmt(float(v), nd))
        lines += ["### What the terms can represent of the prefill", "",
                  "At a fixed prompt size BLIS's additive terms are affine in the batch size (the "
                  "weight, per-layer and per-step terms constant, the compute, KV, TP and "
                  "per-request terms proportional to it); the measured prefill cost per token "
                  "is not constant along the sweeps. `best_line_mdape_pct`: the lowest MdAPE "
                  "of a line `a + c b` (`a, c >= 0`) through the sweep's points, about the best "
                  "any coefficients predict it; `ms_per_ktok_b1` / `ms_per_ktok_max`: "
                  "milliseconds per thousand prompt tokens at batch 1 and at its highest "
                  "(`at_batch`); `faster_than_smaller_batch`: batch sizes measured faster than "
                  "a smaller batch of the same prompt size (impossible for a prefill of more "
                  "tokens; left out of the line), which the fits keep and the scores count; "
                  "`us_per_token_below` / `us_per_token_above`: microseconds each prompt token "
                  "adds at batch 1 below and above the sweep's prompt size; "
                  "`batch_obs_over_pred_b1_shots`: the batch sweep's median observed / "
                  "predicted in the one-shot population fits of a batch-1 point.",
                  "", _md(bs), ""]
    lines += bound_markdown(bt, GOAL_MDAPE["decode"], cell_label, _md)
    miss = miss_lines(scores, cells, scales, fits, benchmark_noise_prior())
    if miss:
        lines += [f"### Where the bands miss {GOAL_COVERAGE[0]:.2f}-{GOAL_COVERAGE[1]:.2f}", "",
                  *miss, ""]
    ct = cells.drop(columns=[c for c in ("shots",) if c in cells])
    if len(ct):
        ct["cell"] = ct["cell"].map(cell_label)
    lines += ["## Cells and what the fleet saw of their levels", "",
              "`unseen`: the cell's levels no fitted configuration has (their effects are drawn "
              "from the factor's scale); `<factor> seen in`: how many other configurations of "
              "the fleet share the cell's level.", "", _md(ct), ""]
    if len(scales):
        sh = scales.copy()
        sh["cell"] = sh["cell"].map(cell_label)
        for c in sh.columns:
            if sh[c].dtype.kind == "f":
                sh[c] = sh[c].map(lambda v: _fmt(float(v), 3))
        lines += ["## Factor scales of each population against their prior", "",
                  "Per population (cell left out) and factor: the posterior median of the "
                  "factor's scale `sigma_<factor>` and of `sigma_config`, as the median over the "
                  "terms, and the median over the terms of the ratio of the posterior 90% "
                  "interval's width to the prior's (`width_ratio`: near 1, the scale sits at its "
                  "prior, the data did not inform it; 0, the scale is fixed at its prior's "
                  "scale, a factor of two levels).", "", _md(sh), ""]
    fs = fits.copy()
    fs["cell"] = fs["cell"].map(cell_label)
    for c in fs.columns:
        if fs[c].dtype.kind == "f":
            nd = 4 if c in ("max_rhat", "noise_sigma_prefill", "noise_sigma_decode") else 0
            fs[c] = fs[c].map(lambda v, nd=nd: _fmt(float(v), nd))
    lines += ["## Fits", "", "Gates: R-hat, bulk ESS, divergences of each fit (`passed`: every "
              "convergence gate of `bayes-latency fit`); `draws`: per chain, after the "
              "extension to pass the gates; `wall_s` / `cpu_s`: the fit's wall and CPU time on "
              "this machine; `noise_sigma_<phase>`: the fit's noise scale (log scale) of the "
              "phase's benchmark rows (population fits: median over the fleet's other Splitwise "
              "configurations; one-shot fits: the cell's, from its one row of the phase).", "",
              _md(fs), ""]
    return "\n".join(lines)
