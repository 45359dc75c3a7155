"""The notebooks use the public API only: names of ``bayes_latency`` and a few public modules."""

from __future__ import annotations

import json
import re
from pathlib import Path

import bayes_latency

ROOT = Path(__file__).resolve().parents[1]

#: Modules a notebook may import from besides the package itself (not re-exported there).
PUBLIC_MODULES = {"bayes_latency.checks", "bayes_latency.checks.plots", "bayes_latency.checks.ppc",
                  "bayes_latency.calibrate.loop", "bayes_latency.cli.main"}
"""``from bayes_latency.checks import plots, ppc`` imports the two public modules."""


def _code(path: Path) -> str:
    nb = json.loads(path.read_text())
    return "\n".join("".join(c["source"]) if isinstance(c["source"], list) else c["source"]
                     for c in nb["cells"] if c["cell_type"] == "code")


def test_notebooks_import_public_names_only():
    bad = []
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        code = _code(path)
        for stmt in re.findall(r"^\s*(?:from|import) bayes_latency[^\n]*(?:\([^)]*\))?", code, re.M):
            m = re.match(r"\s*from (bayes_latency[\w.]*) import \(?(.*?)\)?\s*$", stmt, re.S)
            if m is None:  # `import bayes_latency` / `import bayes_latency as bl`
                if not re.match(r"\s*import bayes_latency(?: as \w+)?\s*$", stmt):
                    bad.append(f"{path.name}: {stmt.strip()}")
                continue
            module, names = m.group(1), [n.strip().split(" as ")[0] for n in m.group(2).split(",")]
            for name in filter(None, names):
                ok = (name in bayes_latency.__all__ if module == "bayes_latency"
                      else module in PUBLIC_MODULES and not name.startswith("_"))
                if not ok:
                    bad.append(f"{path.name}: from {module} import {name}")
    assert not bad, "\n".join(bad)
