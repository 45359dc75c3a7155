"""Counting what a reader read, kept and dropped, so that nothing is lost silently."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class IngestReport:
    """Counts of records read, kept and dropped (by reason) for one source.

    Attributes
    ----------
    source
        File or experiment the counts are about.
    read, kept
        Records seen and records that made it into an output table.
    dropped
        Counter of dropped records by reason (e.g. ``"malformed_json"``).
    notes
        Free-text remarks (e.g. approximations used).
    lost
        Dropped records per record type (``steps``, ``requests``, ``lifecycle``), whatever the
        reason, so that :meth:`unbalanced` can check ``read = kept + dropped`` per type.
    """

    source: str = ""
    read: Counter = field(default_factory=Counter)
    kept: Counter = field(default_factory=Counter)
    dropped: Counter = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    lost: Counter = field(default_factory=Counter)

    #: record type -> (``read`` key, ``kept`` key) of the types whose books must balance.
    BALANCES = {"steps": ("step_summaries", "steps"), "requests": ("core_spans", "requests"),
                "lifecycle": ("files", "lifecycle_rows")}

    def drop_record(self, kind: str, reason: str, n: int = 1) -> None:
        """Count ``n`` records of type ``kind`` (a :attr:`BALANCES` key) dropped for ``reason``."""
        self.dropped[reason] += n
        self.lost[kind] += n

    def unbalanced(self) -> list[str]:
        """Record types whose counts do not add up (``read != kept + dropped``); empty if none."""
        out = []
        for kind, (r, k) in self.BALANCES.items():
            if self.read[r] != self.kept[k] + self.lost[kind]:
                out.append(f"{kind}: read {self.read[r]} != kept {self.kept[k]} + dropped "
                           f"{self.lost[kind]}")
        return out

    def drop(self, reason: str, n: int = 1) -> None:
        """Count ``n`` records dropped for ``reason``."""
        self.dropped[reason] += n

    def drop_at(self, reason: str, where: str, max_examples: int = 5) -> None:
        """Count one record dropped for ``reason``; note the first ``max_examples`` places."""
        self.dropped[reason] += 1
        if self.dropped[reason] <= max_examples:
            self.notes.append(f"{reason}: {where}")

    def merge(self, other: IngestReport) -> IngestReport:
        """Add the counts of ``other`` into this report and return self."""
        self.read.update(other.read)
        self.kept.update(other.kept)
        self.dropped.update(other.dropped)
        self.lost.update(other.lost)
        self.notes.extend(other.notes)
        return self

    @property
    def n_dropped(self) -> int:
        """Total number of dropped records."""
        return sum(self.dropped.values())

    def to_dict(self) -> dict:
        """Plain-dict form (for JSON)."""
        return {"source": self.source, "read": dict(self.read), "kept": dict(self.kept),
                "dropped": dict(self.dropped), "dropped_by_record": dict(self.lost),
                "notes": list(self.notes)}

    def format(self) -> str:
        """Human-readable multi-line summary."""
        lines = [f"{self.source or 'ingest'}:"]
        for title, counter in (("read", self.read), ("kept", self.kept), ("dropped", self.dropped)):
            if counter:
                body = ", ".join(f"{k}={v:,}" for k, v in sorted(counter.items()))
                lines.append(f"  {title}: {body}")
            elif title == "dropped":
                lines.append("  dropped: none")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)
