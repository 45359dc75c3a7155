"""A partitioned table folder is read only when ``tables.json`` and the partition files agree,
and an ingest refuses an ``--out`` another run is writing."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from bayes_latency.data.experiment import ingest
from bayes_latency.data.tables import (
    MANIFEST,
    partition_path,
    read_table,
    write_manifest,
    write_partition,
)
from bayes_latency.errors import TableLayoutError
from bayes_latency.io import OutputPathError, folder_lock

EXPS = ["e1", "e2", "e3"]


def tables(tmp_path: Path) -> Path:
    """A folder of one table ``observations`` with a partition per experiment of EXPS."""
    d = tmp_path / "T"
    for k, e in enumerate(EXPS):
        write_partition(d, "observations", e, pd.DataFrame(
            {"experiment_id": [e] * 2, "value_us": [1.0 + k, 2.0 + k]}))
    write_manifest(d, EXPS, {"observations": EXPS})
    return d


def test_agreeing_folder_reads_every_experiment_in_order(tmp_path):
    df = read_table(tables(tmp_path), "observations")
    assert list(df["experiment_id"]) == ["e1", "e1", "e2", "e2", "e3", "e3"]


def test_missing_partition_names_table_and_experiment(tmp_path):
    d = tables(tmp_path)
    shutil.rmtree(partition_path(d, "observations", "e2").parent)
    with pytest.raises(TableLayoutError, match=r"table 'observations'.*'e2' listed but missing"):
        read_table(d, "observations")


def test_extra_and_foreign_partitions_are_refused(tmp_path):
    d = tables(tmp_path)
    write_manifest(d, EXPS, {"observations": ["e1", "e3"]})
    with pytest.raises(TableLayoutError, match=r"'e2' present but not listed"):
        read_table(d, "observations")
    write_manifest(d, EXPS, {"observations": EXPS})
    write_partition(d, "observations", "other", pd.DataFrame({"experiment_id": ["other"]}))
    with pytest.raises(TableLayoutError, match=r"not in this ingest: 'other'"):
        read_table(d, "observations")


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"experiments": "e1"}', None])
def test_unreadable_or_missing_manifest_is_refused(tmp_path, text):
    d = tables(tmp_path)
    if text is None:
        (d / MANIFEST).unlink()
    else:
        (d / MANIFEST).write_text(text, encoding="utf-8")
    with pytest.raises(TableLayoutError, match=r"tables\.json"):
        read_table(d, "observations")


def test_table_missing_from_manifest_is_refused(tmp_path):
    d = tables(tmp_path)
    write_manifest(d, EXPS, {})
    with pytest.raises(TableLayoutError, match=r"table 'observations': not listed"):
        read_table(d, "observations")


def test_fit_on_a_folder_with_a_missing_partition_exits_2(tmp_path, capsys):
    from bayes_latency.cli.main import main

    d = tables(tmp_path)
    shutil.rmtree(partition_path(d, "observations", "e3").parent)
    assert main(["fit", str(d), "--out", str(tmp_path / "p.nc")]) == 2
    err = capsys.readouterr().err
    assert "'e3' listed but missing" in err and "Traceback" not in err
    assert not (tmp_path / "p.nc").exists()


def test_ingest_refuses_an_out_another_live_run_holds(tmp_path):
    out = tmp_path / "T"
    out.mkdir()
    lock = out / ".bayes_latency.lock"
    lock.write_text(f"{os.getppid()} {socket.gethostname()}\n", encoding="utf-8")
    with pytest.raises(OutputPathError, match=rf"another run \(process {os.getppid()}\)"):
        ingest([tmp_path / "missing-trace.jsonl"], out)
    assert lock.is_file()  # still the other run's


def test_stale_lock_of_a_dead_process_is_taken_over_with_a_note(tmp_path):
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead = int(proc.stdout)
    lock = tmp_path / ".bayes_latency.lock"
    lock.write_text(f"{dead} {socket.gethostname()}\n", encoding="utf-8")
    with folder_lock(tmp_path) as notes:
        assert lock.read_text(encoding="utf-8").split()[0] == str(os.getpid())
        with pytest.raises(OutputPathError, match="another run"), folder_lock(tmp_path):
            pass
    assert notes and f"process {dead}" in notes[0]
    assert not lock.exists()
