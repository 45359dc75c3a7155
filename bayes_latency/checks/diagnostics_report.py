"""The report of :func:`~bayes_latency.checks.diagnostics.diagnose`: thresholds, gates, rendering.

:class:`Thresholds` holds the quality gates, :class:`Gate` one gate's value and status, and
:class:`DiagnosticsReport` the whole result with its markdown (:meth:`DiagnosticsReport.to_markdown`)
and JSON (:meth:`DiagnosticsReport.to_dict`) forms; :func:`jsonable` and the markdown-table
helpers are the formatting they share with the other reports of ``bayes-latency check``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bayes_latency.checks.sensitivity import SENSITIVITY_THRESHOLD


@dataclass(frozen=True)
class Thresholds:
    """Quality gates of :func:`diagnose`.

    Attributes
    ----------
    max_rhat
        Largest acceptable rank-normalised split R-hat (default 1.01, Vehtari et al. 2021).
    min_ess_bulk, min_ess_tail
        Smallest acceptable bulk and tail effective sample sizes (default 400 each).
    max_divergences
        Largest acceptable number of divergent transitions (default 0).
    min_ebfmi
        Smallest acceptable E-BFMI of any chain (default 0.3).
    max_treedepth_share
        Largest acceptable share of transitions that hit the maximum tree depth (default 0.01).
    pareto_k
        Pareto-k above which a PSIS-LOO observation is unreliable (default 0.7).
    max_pareto_k_share
        Largest share of observations with k above ``pareto_k`` before a *warning* (default 0.01).
        This gate never fails a report.
    """

    max_rhat: float = 1.01
    min_ess_bulk: float = 400.0
    min_ess_tail: float = 400.0
    max_divergences: int = 0
    min_ebfmi: float = 0.3
    max_treedepth_share: float = 0.01
    pareto_k: float = 0.7
    max_pareto_k_share: float = 0.01


@dataclass
class Gate:
    """One quality gate: its measured value, threshold and status.

    ``status`` is one of ``"pass"``, ``"fail"``, ``"warn"``, ``"n/a"`` or ``"n/a (approximate)"``.
    """

    name: str
    value: str
    threshold: str
    status: str
    detail: str = ""


@dataclass
class DiagnosticsReport:
    """Result of :func:`diagnose`.

    Attributes
    ----------
    passed
        True when no gate has status ``"fail"``.
    failures
        One line per failed gate (empty when ``passed``).
    warnings
        Lines for warning gates and for things that could not be checked.
    gates
        Every gate with value, threshold and status.
    table
        One row per posterior variable: ``size, rhat_max, ess_bulk_min, ess_tail_min`` and the
        location of the worst R-hat (``rhat_worst``).
    cells
        One row per (variable, config, term) of ``beta`` / ``alpha``: ``rhat, ess_bulk, ess_tail``.
    sampler
        Sampler statistics (``n_chains, n_draws, divergences, ebfmi, treedepth_share``).
    loo
        PSIS-LOO summary (``elpd, se, p, n_obs, n_k_high, share_k_high, max_k``) or None.
    approximate
        True when the posterior comes from an approximate method.
    attrs
        Provenance attributes of the result (method, sampler, hashes, versions).
    thresholds
        The thresholds used.
    """

    passed: bool
    failures: list[str]
    warnings: list[str]
    gates: list[Gate]
    table: pd.DataFrame
    cells: pd.DataFrame
    sampler: dict[str, Any]
    loo: dict[str, Any] | None
    approximate: bool
    attrs: dict[str, Any] = field(default_factory=dict)
    thresholds: Thresholds = field(default_factory=Thresholds)
    sensitivity: pd.DataFrame | None = None
    identifiability: list[dict[str, Any]] | None = None

    def gates_frame(self) -> pd.DataFrame:
        """The gates as a DataFrame (one row per gate)."""
        return pd.DataFrame([asdict(g) for g in self.gates])

    def to_markdown(self) -> str:
        """Human-readable report (GitHub markdown)."""
        lines = ["# Posterior diagnostics", ""]
        if self.approximate:
            lines += [
                "> **APPROXIMATE POSTERIOR** (method "
                f"`{self.attrs.get('method', '?')}`, sampler `{self.attrs.get('sampler', '?')}`): "
                "draws do not come from Markov chains, so R-hat and ESS do not apply and are "
                "reported as n/a. Intervals are only as good as the approximation.",
                "",
            ]
        verdict = "PASSED" if self.passed else "FAILED"
        lines += [f"**Result: {verdict}**", ""]
        if self.attrs:
            lines += ["| attribute | value |", "|---|---|"]
            lines += [f"| {k} | {_cell(v)} |" for k, v in self.attrs.items()]
            lines.append("")
        lines += ["## Gates", "", _markdown_table(self.gates_frame()), ""]
        if self.failures:
            lines += ["## Failures", ""] + [f"- {f}" for f in self.failures] + [""]
        if self.warnings:
            lines += ["## Warnings", ""] + [f"- {w}" for w in self.warnings] + [""]
        if not self.table.empty:
            lines += ["## Per variable", "", _markdown_table(self.table.reset_index()), ""]
        if self.loo is not None:
            lines += ["## PSIS-LOO", ""]
            lines += [f"- {k}: {_fmt(v)}" for k, v in self.loo.items()]
            lines.append("")
        if self.identifiability is not None:
            from bayes_latency.model.definition.identifiability import IdentifiabilityReport

            ident = IdentifiabilityReport.from_dict(self.identifiability)
            lines += ["## Identifiability", "", "```", ident.summary(), "```", ""]
        if self.sensitivity is not None and not self.sensitivity.empty:
            lines += ["## Prior sensitivity", "",
                      f"Power-scaling sensitivity (arviz_stats.psense_summary) of the population "
                      f"coefficients: above {SENSITIVITY_THRESHOLD} the posterior moves when the "
                      "prior (or the likelihood) is scaled. *prior-dominated*: the data say "
                      "little and the prior decides; *data-dominated*: the likelihood decides; "
                      "*prior-data conflict*: both matter.", "",
                      _markdown_table(self.sensitivity.reset_index()), ""]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form of the report."""
        return jsonable({
            "passed": self.passed,
            "approximate": self.approximate,
            "failures": list(self.failures),
            "warnings": list(self.warnings),
            "gates": [asdict(g) for g in self.gates],
            "thresholds": asdict(self.thresholds),
            "sampler": self.sampler,
            "loo": self.loo,
            "attrs": self.attrs,
            "variables": self.table.reset_index().to_dict(orient="records"),
            "identifiability": self.identifiability,
            "prior_sensitivity": (None if self.sensitivity is None else
                                  self.sensitivity.reset_index().to_dict(orient="records")),
        })


# --------------------------------------------------------------------------------------------
# formatting


def _fmt(v: Any) -> str:
    if isinstance(v, float | np.floating):
        if not np.isfinite(v):
            return str(v)
        return f"{v:.4g}"
    return str(v)


def _cell(v: Any) -> str:
    return _fmt(v).replace("|", "\\|")


def _markdown_table(df: pd.DataFrame) -> str:
    """Render a DataFrame as a markdown table (no dependency on ``tabulate``)."""
    cols = [str(c) for c in df.columns]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in df.itertuples(index=False):
        out.append("| " + " | ".join(_cell(v) for v in row) + " |")
    return "\n".join(out)


def jsonable(obj: Any) -> Any:
    """Recursively convert numpy scalars / arrays and paths to plain JSON / YAML types
    (non-finite floats become None)."""
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | np.ndarray):
        return [jsonable(v) for v in (obj.tolist() if isinstance(obj, np.ndarray) else obj)]
    if isinstance(obj, np.bool_ | bool):
        return bool(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating | float):
        f = float(obj)
        return f if np.isfinite(f) else None
    if isinstance(obj, Path | np.str_):
        return str(obj)
    return obj

