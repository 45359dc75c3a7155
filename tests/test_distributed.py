"""Ingest and stage 1 as tasks on a Dask LocalCluster give what the single-process path gives."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest

from bayes_latency.cli.main import main
from bayes_latency.data.experiment import ingest
from bayes_latency.data.tables import read_table, table_files, table_names
from bayes_latency.model.definition.summaries import NoisePrior, fit_rows, summarize
from bayes_latency.parallel import local_cluster, run_units
from bayes_latency.physics.basis import ALPHA_TERMS, DEFAULT_TERMS
from bayes_latency.priors import load_priors

distributed = pytest.importorskip("distributed")

COEFS = tuple(DEFAULT_TERMS) + tuple(ALPHA_TERMS)


@pytest.fixture(scope="module")
def client():
    cluster = local_cluster(2, silence_logs=40)
    c = distributed.Client(cluster)
    yield c
    c.close()
    cluster.close()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    from bayes_latency.synth.fleet import simulate_fleet

    root = tmp_path_factory.mktemp("dist")
    return root, simulate_fleet("tiny", root / "fleet", seed=5, progress=False)


@pytest.fixture(scope="module")
def both(fleet, client):
    root, folders = fleet
    rep_d = ingest(folders, root / "dist", scheduler=client)
    rep_i = ingest(folders, root / "inline", scheduler="inline")
    return root / "dist", root / "inline", rep_d, rep_i


def test_tasks_run_on_the_workers(client, monkeypatch):
    pids = run_units(os.getpid, [(), (), ()], scheduler=client)
    assert os.getpid() not in pids
    # the DASK_SCHEDULER_ADDRESS convention
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", client.scheduler.address)
    timings: dict = {}
    pids = run_units(os.getpid, [(), ()], timings=timings)
    assert os.getpid() not in pids and timings["workers"] == 2
    # one unit runs inline without a cluster
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS")
    assert run_units(os.getpid, [()]) == [os.getpid()]


def _twice_or_fail(x: int) -> int:
    if x < 0:
        raise ValueError(f"negative {x}")
    return 2 * x


def test_batches_largest_first_and_shrinking():
    from bayes_latency.parallel import batches

    w = [1.0, 5.0, 2.0, 2.0, 8.0, 1.0, 3.0] * 20
    for n in (1, 2, 3):
        g = batches(w, n, per_worker=4)
        flat = [i for b in g for i in b]
        assert sorted(flat) == list(range(len(w)))  # every unit once
        assert [w[i] for i in flat] == sorted(w, reverse=True)  # largest first
        sums = [sum(w[i] for i in b) for b in g]
        assert len(g[-1]) == 1 and len(g) < len(w) / 2
        assert sums[0] >= sum(w) / (4 * n) and sums[0] == max(sums)
    assert batches([], 2) == [] and batches([3.0], 2) == [[0]]
    assert batches([1.0, 1.0, 1.0], 2) == [[0], [1], [2]]


def test_batched_units_keep_their_order_and_errors(client):
    units = [(x,) for x in range(40)]
    w = [float((7 * x) % 11 + 1) for x in range(40)]
    assert run_units(_twice_or_fail, units, scheduler=client, weights=w, batch=True) == \
        [2 * x for x in range(40)]
    with pytest.raises(ValueError, match="negative -3"):
        run_units(_twice_or_fail, [*units, (-3,)], scheduler=client, batch=True)


def test_ingest_units_raise_the_gc_threshold_and_restore_it():
    import gc

    from bayes_latency.data.experiment import GC_GEN0_THRESHOLD, _few_gc_passes

    before = gc.get_threshold()
    with _few_gc_passes():
        assert gc.get_threshold()[0] == max(before[0], GC_GEN0_THRESHOLD)
        with _few_gc_passes():
            assert gc.get_threshold()[1:] == before[1:]
    assert gc.get_threshold() == before


def _worker_settings() -> tuple:
    import dask

    return (os.environ.get("MALLOC_TRIM_THRESHOLD_"),
            dask.config.get("distributed.worker.profile.enabled"),
            dask.config.get("distributed.admin.tick.interval"))


def test_local_cluster_workers_keep_glibc_malloc_defaults(client):
    # Dask's MALLOC_TRIM_THRESHOLD_=65536 costs ingest ~15% CPU in page faults (parallel.py)
    env = os.environ.get("MALLOC_TRIM_THRESHOLD_")
    env = None if env == "65536" else env  # Dask's value, left by an earlier Dask nanny
    assert set(client.run(_worker_settings).values()) == {(env, False, "1s")}
    assert len(client.scheduler_info(n_workers=-1)["workers"]) == 2


def test_distributed_ingest_writes_the_same_tables(both):
    dist, inline, rep_d, rep_i = both
    names = table_names(inline)
    assert names == table_names(dist)
    assert {"steps", "journey_events", "requests", "batches", "iterations",
            "observations"} <= set(names)
    for name in names:
        assert len(table_files(dist, name)) == 3 or name == "kv_events"
        pd.testing.assert_frame_equal(read_table(dist, name), read_table(inline, name),
                                      check_exact=True)
    assert rep_d.to_dict()["dropped"] == rep_i.to_dict()["dropped"]
    assert rep_d.to_dict()["kept"] == rep_i.to_dict()["kept"]
    # lazy reads: one experiment's partition, a few columns
    obs = read_table(dist, "observations")
    eid = obs["experiment_id"].iloc[-1]
    part = read_table(dist, "observations", columns=["experiment_id", "value_us"],
                      experiments=[eid])
    assert list(part.columns) == ["experiment_id", "value_us"]
    assert (part["experiment_id"] == eid).all()
    assert len(part) == int((obs["experiment_id"] == eid).sum())


def test_distributed_stage1_equals_inline(both, client):
    dist, _, _, _ = both
    pri = load_priors()
    scale = np.asarray([pri.prior_median(c) for c in COEFS], dtype=float)
    rows = fit_rows(read_table(dist, "observations"), coefs=COEFS)
    prior = NoisePrior(sigma={"iteration": 0.5, "step_window": 0.5, "alpha_arrival": 0.5,
                              "alpha_departure": 0.5})
    a = summarize(rows, COEFS, scale, noise_prior=prior, scheduler="inline")
    b = summarize(rows, COEFS, scale, noise_prior=prior, scheduler=client)
    assert [s.config_id for s in a] == [s.config_id for s in b] and len(a) == 3
    for x, y in zip(a, b, strict=True):
        for f in ("theta_hat", "grad", "info"):
            np.testing.assert_allclose(getattr(y, f), getattr(x, f), rtol=1e-12, atol=0)
        assert abs(x.loglik - y.loglik) <= 1e-12 * abs(x.loglik)
        assert x.noise == y.noise and x.n_rows == y.n_rows and x.converged == y.converged


def test_cli_ingest_on_a_scheduler_address_and_old_layout(fleet, client, both, tmp_path):
    _, folders = fleet
    out = tmp_path / "cli"
    assert main(["ingest", *map(str, folders), "--out", str(out),
                 "--scheduler", client.scheduler.address]) == 0
    _, inline, _, _ = both
    pd.testing.assert_frame_equal(read_table(out, "observations"),
                                  read_table(inline, "observations"), check_exact=True)
    # a folder of the former layout (one <table>.parquet) reads the same
    old = tmp_path / "old"
    old.mkdir()
    obs = read_table(inline, "observations")
    obs.to_parquet(old / "observations.parquet", index=False)
    pd.testing.assert_frame_equal(read_table(old, "observations"), obs)
    assert main(["ingest", str(folders[0]), "--out", str(tmp_path / "bad"),
                 "--scheduler", "nonsense"]) == 2


def test_a_failing_task_raises_the_package_error(client, tmp_path):
    from bayes_latency.errors import TraceFormatError

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"not": "otlp"}\n')
    other = tmp_path / "other.jsonl"
    other.write_text("also not json\n")
    with pytest.raises(TraceFormatError, match="no valid OTLP"):
        ingest([bad, other], tmp_path / "out", scheduler=client)


def test_arrow_table_equals_from_pandas():
    """Partitions are written from ``tables._arrow_table``: the same Arrow table (values, schema,
    pandas metadata) as ``Table.from_pandas``, also when the schema comes from its cache and
    when an object column's Arrow type changes with its values."""
    import pyarrow as pa

    from bayes_latency.data.tables import _arrow_table

    def frame(n: int, obj: list) -> pd.DataFrame:
        return pd.DataFrame({
            "experiment_id": pd.Series(["e"] * n, dtype="str"),
            "i": np.arange(n, dtype=np.int64), "f": np.where(np.arange(n) % 2, np.nan, 1.5),
            "b": np.arange(n) % 3 == 0, "I": pd.array([None] + list(range(n - 1)), dtype="Int64"),
            "o": pd.Series(obj, dtype=object), "u": np.arange(n, dtype=np.uint8),
            "s": pd.Series(["a", None] * (n // 2) + ["b"] * (n % 2), dtype="str"),
            "t": pd.date_range("2026-01-01", periods=n, freq="s", tz="UTC"),
            "d": pd.date_range("2026-01-01", periods=n, freq="ms"),
            "g": np.linspace(0.0, 1.0, n, dtype=np.float32),
        })

    for df in (frame(4, ["a", None, "b", "c"]), frame(3, ["x", "y", None]),
               frame(3, [None, None, None]), frame(2, [1, 2])):
        for _ in range(2):
            ref = pa.Table.from_pandas(df, preserve_index=False, nthreads=1)
            assert _arrow_table(df).equals(ref, check_metadata=True)
