"""Markdown pieces of the study's README: number cells, tables, and the sentences computed from
the identifiability table and the cross-validation results; :func:`pct`, the share cell of the
client studies, and :func:`signed_pct`, their signed errors."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import pandas as pd

from bayes_latency.data.observations.build import DEFAULT_STACK
from bayes_latency.physics.basis import DEFAULT_TERMS
from bayes_latency.study.realdata import Split
from bayes_latency.study.settings import (
    H100_FIT,
    H100_FIT_DEFAULT,
    METHOD_LABELS,
    METHODS,
    REAL_TERMS,
)


def pct(x: Any) -> str:
    """``x`` (a share or an unsigned relative error) as a percentage with one decimal, ``n/a``
    when it is not a finite number."""
    return "n/a" if not (isinstance(x, numbers.Real) and math.isfinite(x)) else f"{100 * x:.1f}%"


def signed_pct(x: float) -> str:
    """A signed relative error ``x`` as a percentage with its sign and one decimal, ``n/a`` when
    it is not finite."""
    return "n/a" if not math.isfinite(x) else f"{100 * x:+.1f}%"


# --------------------------------------------------------------------------------- README
def _fmt(v: Any, nd: int = 1) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def _md(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join(str(r[c]) for c in cols) + " |")
    return "\n".join(lines)


def _coef_cell(r: pd.Series) -> str:
    def g(v: float) -> str:
        return f"{v:.3g}"
    star = "" if r["informed"] else "*"
    return f"{g(r['mean'])} [{g(r['q05'])}, {g(r['q95'])}]{star}"


def _cfg_label(model: str, gpu: str, tp: Any, stack: str = DEFAULT_STACK) -> str:
    lab = f"{model} {str(gpu).split('-')[0]} tp{int(tp)}"
    return lab if stack == DEFAULT_STACK else f"{lab} {stack}"


def _coef_wide(coefs: pd.DataFrame, terms: Sequence[str]) -> pd.DataFrame:
    """Term x configuration table of ``mean [5%, 95%]`` cells (beta block)."""
    b = coefs[coefs["block"] == "beta"].copy()
    b["cell"] = b.apply(_coef_cell, axis=1)
    stack = b["stack"] if "stack" in b else pd.Series(DEFAULT_STACK, index=b.index)
    b["cfg"] = [_cfg_label(m, g, t, s) for m, g, t, s in
                zip(b["model"], b["gpu"], b["tp"], stack, strict=True)]
    w = b.pivot(index="coef", columns="cfg", values="cell").reindex(list(terms))
    return w.reset_index().rename(columns={"coef": "term"})


def _conv_md(conv: pd.DataFrame) -> str:
    c = conv.copy()
    c["max_rhat"] = c["max_rhat"].map(lambda v: f"{v:.3f}")
    c["min_ess_bulk"] = c["min_ess_bulk"].map(lambda v: f"{v:.0f}")
    c["runtime_s"] = c["runtime_s"].map(lambda v: f"{v:.0f}")
    c["failures"] = c["failures"].map(lambda f: "; ".join(f) if f else "")
    return _md(c[["fit", "n_rows", "n_configs", "max_rhat", "min_ess_bulk", "divergences",
                  "passed", "runtime_s", "failures"]])


def _conv_phrase(r: pd.Series) -> str:
    return (f"R-hat {r['max_rhat']:.3f}, min bulk ESS {r['min_ess_bulk']:.0f}, "
            f"{int(r['divergences'])} divergence{'s' if int(r['divergences']) != 1 else ''}, "
            f"{r['runtime_s']:.0f} s: gates {'passed' if bool(r['passed']) else 'NOT passed'}")


def _span(v: pd.Series) -> str:
    lo, hi = int(v.min()), int(v.max())
    return str(lo) if lo == hi else f"{lo}-{hi}"


def _ident_narrative(ident: pd.DataFrame, obs: pd.DataFrame, conv_by: pd.DataFrame) -> str:
    """Why the fits use REAL_TERMS, from the identifiability table and the convergence rows."""
    labels = list(dict.fromkeys(ident["term_set"]))
    dflt, real = labels[0], labels[-1]
    vllm = set(obs.loc[obs["source"] == "steps", "config_id"])
    d = ident[(ident["term_set"] == dflt) & ident["config_id"].isin(vllm)]
    parts = [f"With the {len(DEFAULT_TERMS)} default terms the real vLLM H100 configurations "
             "identify " + "; ".join(f"{r['config_id']} rank {r['rank']} of {r['n_active']} "
                                     f"(flat: {r['flat_groups']})" for _, r in d.iterrows())
             + "."]
    mixed = obs[(obs["source"] == "steps") & (obs["phase"] == "mixed")]
    chunk = mixed.groupby("config_id")["prefill_tokens_step"].median()
    parts.append("`weight_loading`, `per_layer` and `per_step` are constant per step (dense "
                 "models); a decoding request contributes one token, so `decode_compute` (decode "
                 "tokens) and `per_request` (requests) move together, and `tp_allreduce` follows "
                 "all tokens of the step; prefill chunks in these prefix-cached runs are tiny "
                 "(median prefill tokens per mixed step: " + ", ".join(
                     f"{c} {v:.0f}" for c, v in chunk.items()) + "). Lognormal priors then "
                 "make \"one term carries the sum\" corners in which NUTS chains settle "
                 "separately.")
    if H100_FIT_DEFAULT in conv_by.index and H100_FIT in conv_by.index:
        a_, b_ = conv_by.loc[H100_FIT_DEFAULT], conv_by.loc[H100_FIT]
        parts.append(f"Measured here on the H100 iterations (same sampler settings): the "
                     f"{len(DEFAULT_TERMS)} default terms give R-hat {a_['max_rhat']:.3f}, bulk "
                     f"ESS {a_['min_ess_bulk']:.0f}, {int(a_['divergences'])} divergences; the "
                     f"{len(REAL_TERMS)} REAL_TERMS give R-hat {b_['max_rhat']:.3f}, ESS "
                     f"{b_['min_ess_bulk']:.0f}, {int(b_['divergences'])} divergences.")
    parts.append("When the term set was chosen (2 chains x 1000 draws, target_accept 0.99, an "
                 "earlier package version), all data with REAL_TERMS + `tp_allreduce` gave R-hat "
                 "1.46. `decode_compute` and `tp_allreduce` are left out because on these data "
                 "their features are near multiples of `per_request` and `prefill_compute`; "
                 "`prefill_kv`, `moe_layer` and `moe_dispatch` carry little or no information "
                 "(tiny prefix reads, no MoE model).")
    r = ident[ident["term_set"] == real]
    groups: dict[str, int] = {}
    for fg in r["flat_groups"]:
        for g_ in str(fg).split("; "):
            if g_ and g_ != "-":
                groups[g_] = groups.get(g_, 0) + 1
    if groups:
        parts.append(f"With REAL_TERMS (rank {_span(r['rank'])} of {_span(r['n_active'])} "
                     "active coefficients per configuration) what stays flat is "
                     + ", ".join(f"`{g_}` in {n} of {len(r)} configurations"
                                 for g_, n in sorted(groups.items(), key=lambda kv: -kv[1]))
                     + ": those coefficients are split by the hierarchy (differences between "
                     "configurations) and the priors, while their combination, which is what a "
                     "prediction uses, is measured.")
    else:
        parts.append("With REAL_TERMS every configuration identifies all its active "
                     "coefficients.")
    return " ".join(parts)


def _cv_narrative(cv: pd.DataFrame, splits: Sequence[Split]) -> list[str]:
    """Plain sentences: per split the lowest MdAPE, where ours stands, and the totals."""
    a = cv[cv["subset"] == "all"]
    if a.empty:
        return []
    wins: dict[str, list[str]] = {m: [] for m in METHODS}
    lines = []
    for sp in splits:
        s = a[a["split"] == sp.name].set_index("method")["mdape_pct"]
        if s.empty:
            continue
        best = str(s.idxmin())
        wins[best].append(sp.name)
        if "ours" in s.index:
            ours = float(s["ours"])
            if best == "ours":
                rest = s.drop("ours")
                second = str(rest.idxmin()) if len(rest) else None
                lines.append(f"`{sp.name}`: **ours wins**, {ours:.1f}% vs "
                             + (f"{second} {float(rest[second]):.1f}%" if second else "-"))
            else:
                lines.append(f"`{sp.name}`: **{best}** wins, {float(s[best]):.1f}% vs ours "
                             f"{ours:.1f}%" + (" (BLIS's coefficients may have been fitted to "
                                               "this very run)" if best == "blis"
                                               and sp.name.startswith("run ") else ""))
    out = ["Who wins where (lowest MdAPE per split): " + "; ".join(lines) + "."]
    out.append("Splits won: " + ", ".join(
        f"{METHOD_LABELS[m]} {len(wins[m])}" for m in METHODS) + f" (of {len(lines)}).")
    o = a[a["method"] == "ours"].set_index("split")
    bad = o[(o["mdape_pct"] > 20.0) | (o["coverage90"] < 0.8)]
    if len(bad):
        out.append("Where ours is weak (MdAPE above 20% or 90% coverage below 0.8): " + "; ".join(
            f"`{n}` {r['mdape_pct']:.1f}%, coverage {r['coverage90']:.2f}"
            for n, r in bad.iterrows())
            + ". A coverage near 1 with a large error means honest but wide bands (unseen "
            "levels); a low coverage means the bands are too narrow there.")
    return out
