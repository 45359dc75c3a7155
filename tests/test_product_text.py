"""The product's text says what the package does now, not how it got there.

Past work sessions, issue numbers, commit hashes, branch names and machine-load anecdotes belong
in ``CHANGELOG.md`` and ``git log``; this test scans every other user-facing text (README, docs,
prior files, generated reports, notebook markdown, Python comments, docstrings and strings,
benchmark scripts, tools) and lists each hit as ``file:line: text``.
"""

from __future__ import annotations

import io
import json
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: (name, pattern) pairs; each names one kind of history.
PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("session", re.compile(r"\bsessions? \d+", re.I)),
    ("issue number", re.compile(r"(?<![\w&/#])#\d{1,3}\b(?!-[0-9a-f])")),
    ("issue", re.compile(r"\bissues? \d+|\bthe issue(?:'s)?\b", re.I)),
    # short hashes as git prints them, or a full 40-digit one; longer hex runs and hex inside
    # ids (``cmpl-9dcf4ea4...``) are data
    ("commit", re.compile(r"(?<![\w-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)(?:[0-9a-f]{7,12}|[0-9a-f]{40})(?![\w-])")),
    ("branch", re.compile(r"\b(?:main|h-docs|h-input|h-model|h-tests|inv-\w+) [0-9a-f]{7}\b")),
    ("machine load", re.compile(r"\bat load\b(?! average)|\bload (?:about )?\d|\bquiet machine\b|\bnearly idle\b", re.I)),
]

#: Hex strings that are data, not commits of this project: a hash recorded in a file's attrs, and
#: the BLIS release the export contract is written against (an external version pin).
ALLOWED_HEX = re.compile(
    r"(?:hash|sha256|digest|sha)\W{0,4}[\"']?[0-9a-f]{7,}|\bf90a1e3(?:a6787da17c2cd463dab6fb2660b1b1760)?\b",
    re.I,
)

#: Whole files where history is the point.
EXEMPT = {"CHANGELOG.md", "tests/test_product_text.py"}


def _python_text(path: Path) -> list[tuple[int, str]]:
    """Comments and string literals (docstrings, messages, report text) with their line numbers."""
    out: list[tuple[int, str]] = []
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(path.read_text()).readline))
    except (tokenize.TokenError, SyntaxError):  # pragma: no cover - not Python
        return list(enumerate(path.read_text().splitlines(), 1))
    for tok in tokens:
        if tok.type in (tokenize.COMMENT, tokenize.STRING) or tok.type == getattr(
            tokenize, "FSTRING_MIDDLE", -1
        ):
            for i, line in enumerate(tok.string.splitlines()):
                out.append((tok.start[0] + i, line))
    return out


def _notebook_text(path: Path) -> list[tuple[int, str]]:
    """Markdown cells, numbered as cell * 1000 + line so a hit is easy to find."""
    nb = json.loads(path.read_text())
    out = []
    for c, cell in enumerate(nb.get("cells", []), 1):
        if cell.get("cell_type") == "markdown":
            src = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
            out += [(c * 1000 + i, line) for i, line in enumerate(src.splitlines(), 1)]
    return out


def _files() -> list[Path]:
    globs = [
        "README.md",
        "docs/**/*.md",
        "priors/*",
        "results/**/*.md",
        "notebooks/*.ipynb",
        "notebooks/*.md",
        "bayes_latency/**/*.py",
        "tests/**/*.py",
        "benchmarks/**/*.py",
        "tools/**/*",
        "run",
        ".ci/*",
    ]
    seen: dict[Path, None] = {}
    for g in globs:
        for p in sorted(ROOT.glob(g)):
            if p.is_file() and p.relative_to(ROOT).as_posix() not in EXEMPT:
                seen.setdefault(p, None)
    return list(seen)


def history_hits(files: list[Path] | None = None) -> list[str]:
    """Every ``file:line: [kind] text`` where the product's text carries history."""
    hits = []
    for path in _files() if files is None else files:
        rel = path.relative_to(ROOT).as_posix()
        if path.suffix == ".py":
            lines = _python_text(path)
        elif path.suffix == ".ipynb":
            lines = _notebook_text(path)
        else:
            try:
                lines = list(enumerate(path.read_text().splitlines(), 1))
            except UnicodeDecodeError:
                continue
        for n, line in lines:
            for kind, pat in PATTERNS:
                for m in pat.finditer(line):
                    if kind == "commit" and ALLOWED_HEX.search(line[max(0, m.start() - 12) : m.end()]):
                        continue
                    hits.append(f"{rel}:{n}: [{kind}] {line.strip()[:120]}")
    return hits


def test_patterns_catch_history_and_spare_ordinary_text():
    bad = ["see session 15", "issue #14's limit", "main 1808e63 took", "at load 6", "a quiet machine"]
    good = ["## Heading", "# a comment", "colour '#1f77b4'", "priors_hash 3fa9c2d81e", "load-bearing"]
    assert all(any(p.search(s) for _, p in PATTERNS) for s in bad)
    for s in good:
        found = [k for k, p in PATTERNS if p.search(s) and not (k == "commit" and ALLOWED_HEX.search(s))]
        assert not found, (s, found)


def test_no_history_in_product_text():
    hits = history_hits()
    assert not hits, f"{len(hits)} hit(s) of history in the product's text:\n" + "\n".join(hits)
