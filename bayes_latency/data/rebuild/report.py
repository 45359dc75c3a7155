"""How well rebuilt batches match the sampled step summaries: the report and the summary convention.

Part of :mod:`bayes_latency.data.rebuild.reconstruct`: ``ReconstructionReport`` (agreement with the
sampled ``step.BATCH_SUMMARY`` rows, cached-prefix counts, inconsistencies met), the fields
compared, and ``summary_convention`` (rebuilt counts with recompute chunks counted as decode, as
the summaries count them). Both public names are re-exported by
:mod:`bayes_latency.data.rebuild.reconstruct`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

__all__ = ["ReconstructionReport", "summary_convention"]

_COMPARED = ["num_prefill_reqs", "prefill_tokens", "num_decode_reqs", "decode_tokens"]
_SUMMARY_COLS = {
    "num_prefill_reqs": "batch.num_prefill_reqs",
    "prefill_tokens": "batch.prefill_tokens",
    "num_decode_reqs": "batch.num_decode_reqs",
    "decode_tokens": "batch.decode_tokens",
}


@dataclass
class ReconstructionReport:
    """How well the rebuilt batches match what was observed.

    Attributes
    ----------
    experiment_id
        Experiment(s) the report is about.
    n_steps, n_requests, n_segments
        Step ids rebuilt, requests with a journey, scheduling segments (first schedule or resume
        to preemption or finish).
    n_compared, n_agree
        Sampled steps compared with their ``step.BATCH_SUMMARY`` and how many matched on all of
        (num_prefill_reqs, prefill_tokens, num_decode_reqs, decode_tokens), in the summary's
        convention (recompute tokens counted as decode).
    mae
        Mean absolute difference per compared field.
    n_prefix_cached, n_prefix_ambiguous, n_ambiguous_steps
        Segments given a cached prefix > 0, segments whose prefix was a guess, steps flagged.
    typical_prefix
        Cached prefix (tokens) used for ambiguous segments (median of the pinned ones).
    issues
        Counter of inconsistencies between the journeys and the policy (each handled, see notes).
    notes
        Free-text remarks.
    """

    experiment_id: str = ""
    n_steps: int = 0
    n_requests: int = 0
    n_segments: int = 0
    n_compared: int = 0
    n_agree: int = 0
    mae: dict[str, float] = field(default_factory=dict)
    n_prefix_cached: int = 0
    n_prefix_ambiguous: int = 0
    n_ambiguous_steps: int = 0
    typical_prefix: float = 0.0
    issues: Counter = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)

    @property
    def agreement(self) -> float:
        """Share of compared sampled steps that match exactly (NaN when none was compared)."""
        return self.n_agree / self.n_compared if self.n_compared else float("nan")

    def merge(self, other: ReconstructionReport) -> ReconstructionReport:
        """Add ``other`` (another experiment) into this report and return self."""
        tot = self.n_compared + other.n_compared
        for k in set(self.mae) | set(other.mae):
            a, b = self.mae.get(k, 0.0), other.mae.get(k, 0.0)
            self.mae[k] = (a * self.n_compared + b * other.n_compared) / tot if tot else 0.0
        for name in ("n_steps", "n_requests", "n_segments", "n_compared", "n_agree",
                     "n_prefix_cached", "n_prefix_ambiguous", "n_ambiguous_steps"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.issues.update(other.issues)
        self.notes.extend(other.notes)
        ids = [i for i in (self.experiment_id, other.experiment_id) if i]
        self.experiment_id = ",".join(ids)
        return self

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (for JSON)."""
        return {
            "experiment_id": self.experiment_id, "n_steps": self.n_steps,
            "n_requests": self.n_requests, "n_segments": self.n_segments,
            "n_compared": self.n_compared, "n_agree": self.n_agree,
            "agreement": None if not self.n_compared else self.agreement,
            "mae": dict(self.mae), "n_prefix_cached": self.n_prefix_cached,
            "n_prefix_ambiguous": self.n_prefix_ambiguous,
            "n_ambiguous_steps": self.n_ambiguous_steps,
            "typical_prefix": self.typical_prefix,
            "issues": dict(self.issues), "notes": list(self.notes),
        }

    def format(self) -> str:
        """Human-readable one-paragraph summary."""
        agree = f"{self.agreement:.1%}" if self.n_compared else "n/a"
        mae = ", ".join(f"{k}={v:.2f}" for k, v in self.mae.items())
        lines = [f"reconstruction {self.experiment_id}: {self.n_steps:,} steps, "
                 f"{self.n_requests:,} requests; agreement with {self.n_compared:,} sampled "
                 f"steps {agree}" + (f" (MAE {mae})" if mae else "")]
        if self.n_prefix_cached or self.n_prefix_ambiguous:
            lines.append(f"  prefix cache: {self.n_prefix_cached:,} segments cached, "
                         f"{self.n_prefix_ambiguous:,} guessed, {self.n_ambiguous_steps:,} steps flagged")
        if self.issues:
            lines.append("  issues: " + ", ".join(f"{k}={v:,}" for k, v in sorted(self.issues.items())))
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


def summary_convention(batches: pd.DataFrame) -> pd.DataFrame:
    """The batch counts in ``step.BATCH_SUMMARY``'s convention (recompute chunks as decode).

    Parameters
    ----------
    batches
        Rebuilt batches with the hidden columns ``recompute_reqs`` and ``recompute_tokens``
        (absent: treated as zero).

    Returns
    -------
    pandas.DataFrame
        Columns ``num_prefill_reqs, prefill_tokens, num_decode_reqs, decode_tokens``.
    """
    rr = batches["recompute_reqs"] if "recompute_reqs" in batches else 0
    rt = batches["recompute_tokens"] if "recompute_tokens" in batches else 0
    return pd.DataFrame({
        "num_prefill_reqs": batches["num_prefill_reqs"] - rr,
        "prefill_tokens": batches["prefill_tokens"] - rt,
        "num_decode_reqs": batches["num_decode_reqs"] + rr,
        "decode_tokens": batches["decode_tokens"] + rt,
    }, index=batches.index)
