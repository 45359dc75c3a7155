"""The code a benchmark measured: package version, model version and a hash of the sources.

A report names the code it ran as, e.g.,
``package 0.1.0, model version 11, source sha256 0e03ffd72b33``: the installed package's
version, :data:`bayes_latency.MODEL_VERSION` and the first 12 hex digits of a sha256 over the
bytes of every ``bayes_latency/**/*.py`` and ``priors/*.yaml`` file, in sorted path order. The
hash identifies the code exactly, including edits not yet committed, without asking version
control.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def source_sha256(root: Path = ROOT) -> str:
    """First 12 hex digits of the sha256 of the package's Python sources and prior files."""
    h = hashlib.sha256()
    for f in sorted([*root.glob("bayes_latency/**/*.py"), *root.glob("priors/*.yaml")]):
        h.update(f.read_bytes())
    return h.hexdigest()[:12]


def code_provenance(root: Path = ROOT) -> str:
    """``package VERSION, model version N, source sha256 HEX`` for the code under ``root``."""
    from bayes_latency import MODEL_VERSION, __version__

    return f"package {__version__}, model version {MODEL_VERSION}, source sha256 {source_sha256(root)}"
