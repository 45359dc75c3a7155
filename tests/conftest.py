"""Shared fixtures: where the real data lives, skipping cleanly when it is absent."""

from __future__ import annotations

from pathlib import Path

import pytest

from bayes_latency.data.tables import read_table as _read_table

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


@pytest.fixture(scope="session")
def tiny_fleet_seed5(tmp_path_factory) -> Path:
    """A fleet folder of ``simulate --fleet tiny --seed 5`` (3 experiments), read-only by use."""
    from bayes_latency.synth.fleet import simulate_fleet

    root = tmp_path_factory.mktemp("tiny5") / "fleet"
    simulate_fleet("tiny", root, seed=5, progress=False)
    return root


@pytest.fixture(scope="session")
def tiny_posterior(tiny_fleet_seed5, tmp_path_factory) -> tuple[Path, Path]:
    """``(tables folder, posterior.nc)``: ingest of the seed-5 tiny fleet and a fast Laplace fit
    of 120 rows per configuration (one fit per session, ~15 s)."""

    from bayes_latency.cli.main import main
    from bayes_latency.data.experiment import ingest

    root = tmp_path_factory.mktemp("tiny5post")
    tables = root / "tables"
    ingest(sorted(p for p in tiny_fleet_seed5.iterdir() if p.is_dir()), tables)
    obs = _read_table(tables, "observations")
    small = root / "small"
    small.mkdir()
    obs.groupby("config_id").head(120).reset_index(drop=True).to_parquet(
        small / "observations.parquet")
    post = root / "posterior.nc"
    rc = main(["fit", str(small), "--out", str(post), "--sampler", "laplace", "--draws", "100",
               "--chains", "2"])
    assert rc in (0, 1) and post.is_file()
    return tables, post
