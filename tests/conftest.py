"""Shared fixtures: where the real data lives, skipping cleanly when it is absent."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT.parent / "shared" / "data" / "real"
SPECS = ROOT.parent / "shared" / "specs"


@pytest.fixture(scope="session")
def real_dir() -> Path:
    """``../shared/data/real`` or skip."""
    if not REAL.is_dir():
        pytest.skip("../shared/data/real is absent")
    return REAL


@pytest.fixture(scope="session")
def specs_dir() -> Path:
    """``../shared/specs`` or skip."""
    if not SPECS.is_dir():
        pytest.skip("../shared/specs is absent")
    return SPECS
