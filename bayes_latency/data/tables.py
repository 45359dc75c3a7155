"""The on-disk layout of ingested tables, and the one way to read them.

``bayes-latency ingest`` writes each table as a Parquet dataset partitioned by experiment::

    TABLES/<table>/experiment_id=<id>/part.parquet      (id percent-encoded)
    TABLES/tables.json                                   (layout version, experiment order)

Each experiment's partition is written by the task that ingested it, so the ingest never holds
more than one experiment's tables in memory, and the files keep their ``experiment_id`` column
(a plain ``pd.read_parquet`` of one file gives the full rows). Folders written before this layout
hold one ``<table>.parquet`` file per table; :func:`read_table` reads both.

Every reader of ingested tables (``fit``, ``check``, the demo, benchmarks) goes through
:func:`read_table`; it reads only the partitions (``experiments``) and ``columns`` asked for, in
the experiment order of the ingest, with one schema unified over the partitions (a column that
is all null in one experiment takes the type it has in the others). A partitioned table is read
only when its partition files are exactly those ``tables.json`` lists for it: a missing, extra or
foreign partition, or a missing or unreadable manifest, is a :class:`TableLayoutError` naming
the table and experiment (never a silent subset).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import pandas as pd

from bayes_latency.errors import BayesLatencyError, TableLayoutError, TraceFormatError
from bayes_latency.io import atomic_write, atomic_write_text, read_parquet
from bayes_latency.textfiles import read_text

__all__ = [
    "check_tables",
    "load_checked_observations",
    "load_observations",
    "LAYOUT_VERSION",
    "MANIFEST",
    "clear_table",
    "partition_path",
    "read_table",
    "remove_manifest",
    "row_locator",
    "table_files",
    "table_source",
    "table_names",
    "write_manifest",
    "write_partition",
]

#: Version of the partitioned layout (``tables.json``).
LAYOUT_VERSION = 2
#: Name of the manifest file of a table folder.
MANIFEST = "tables.json"
_PART = "part.parquet"
_KEY = "experiment_id="


def partition_path(tables_dir: str | Path, name: str, experiment_id: str) -> Path:
    """``TABLES/<name>/experiment_id=<id>/part.parquet`` (the id percent-encoded)."""
    return Path(tables_dir) / name / f"{_KEY}{quote(str(experiment_id), safe='')}" / _PART


def write_partition(tables_dir: str | Path, name: str, experiment_id: str,
                    df: pd.DataFrame) -> Path:
    """Write one experiment's rows of table ``name`` atomically; object columns of mixed types as
    strings, text UTF-8 cannot encode (lone surrogates) with U+FFFD."""
    from bayes_latency.data.jsonl import _replace_lone_surrogates

    path = partition_path(tables_dir, name, experiment_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    ix = df.index
    if not (type(ix) is pd.RangeIndex and ix.start == 0 and ix.step == 1 and ix.name is None):
        df = df.reset_index(drop=True)  # (a frame with the default index is written as is)
    try:
        atomic_write(path, lambda tmp: _write_parquet(df, tmp))
    except (TypeError, ValueError, ArithmeticError):
        df = df.copy()
        for c in df.columns:
            if df[c].dtype == object or pd.api.types.is_string_dtype(df[c]):
                df[c] = df[c].map(lambda v: _replace_lone_surrogates(v)[0]
                                  if isinstance(v, str) else v).astype("string")
        atomic_write(path, lambda tmp: _write_parquet(df, tmp))
    return path


def _write_parquet(df: pd.DataFrame, path: str | Path) -> None:
    """``df.to_parquet(path, index=False)`` without pandas' wrapper, without dictionary
    encoding and statistics (no reader filters on them), LZ4 pages (same file schema and pandas
    metadata, so the same frame reads back). Demo fleet's 182 partitions, pyarrow 26, writing
    CPU-s / files MB (``benchmarks/ingest_scale.py`` part 1): LZ4 0.220 / 13.4, uncompressed
    0.217 / 86.1, snappy 0.227 / 15.3, zstd level 1 0.305 / 9.1, level 3 0.360 / 8.6; with
    dictionary encoding 0.334, with statistics 0.274, 8 MB pages or one row group no faster;
    without the Arrow schema in the file (``store_schema=False``, 11.8 MB) the frames do not
    read back the same. The Arrow conversion (:func:`_arrow_table`) is another 0.06-0.07."""
    import pyarrow.parquet as pq

    pq.write_table(_arrow_table(df), path, compression="lz4", use_dictionary=False,
                   write_statistics=False)


#: Arrow schemas (with their pandas metadata) of the frames written so far, by column names,
#: dtypes and Arrow types: :func:`_arrow_table` builds the metadata once per table layout.
_SCHEMAS: dict[tuple, Any] = {}


def _arrow_table(df: pd.DataFrame) -> Any:
    """``pa.Table.from_pandas(df, preserve_index=False, nthreads=1)``, the same table (schema,
    pandas metadata and values), with the schema of an earlier frame of the same columns,
    dtypes and Arrow types reused (the metadata depends on nothing else: no index is kept,
    no ``attrs``, no categoricals) and each column converted from its array (pyarrow's
    per-Series entry costs more). The arrays are taken from the frame's blocks
    (``_mgr.iget_values``) when pandas has them: ``DataFrame.items`` builds a Series per
    column, 0.054 of the 0.143 CPU-s this took for the demo fleet's 182 partitions (4,082
    columns); now 0.063."""
    import numpy as np
    import pyarrow as pa

    names, dtypes = list(df.columns), list(df.dtypes)
    if (not names or df.attrs or df.columns.has_duplicates
            or not all(type(c) is str for c in names)
            or any(isinstance(d, pd.CategoricalDtype) for d in dtypes)):
        return pa.Table.from_pandas(df, preserve_index=False, nthreads=1)
    values = getattr(df._mgr, "iget_values", None)
    if values is not None:
        arrays = [pa.array(values(i), from_pandas=True, safe=True) for i in range(len(names))]
    else:  # pragma: no cover - another pandas
        arrays = [pa.array(col.to_numpy() if isinstance(col.dtype, np.dtype)
                           and col.dtype.kind in "biuf" else col, from_pandas=True, safe=True)
                  for _, col in df.items()]
    key = (tuple(names), tuple(str(d) for d in dtypes), tuple(a.type for a in arrays))
    schema = _SCHEMAS.get(key)
    if schema is None:
        table = pa.Table.from_pandas(df, preserve_index=False, nthreads=1)
        if len(_SCHEMAS) < 256 and table.schema.types == [a.type for a in arrays]:
            _SCHEMAS[key] = table.schema
        return table
    return pa.Table.from_arrays(arrays, schema=schema)


def clear_table(tables_dir: str | Path, name: str) -> None:
    """Remove table ``name`` from a folder (both layouts), before an ingest rewrites it."""
    d = Path(tables_dir)
    (d / f"{name}.parquet").unlink(missing_ok=True)
    part_dir = d / name
    if part_dir.is_dir() and all(p.name.startswith(_KEY) for p in part_dir.iterdir()):
        shutil.rmtree(part_dir)


def write_manifest(tables_dir: str | Path, experiments: Sequence[str],
                   tables: dict[str, Sequence[str]]) -> None:
    """``tables.json`` (written atomically, last of an ingest): the layout version, the
    experiments in ingest order and, per table, the experiments that have a partition."""
    doc = {"layout": LAYOUT_VERSION, "experiments": list(experiments),
           "tables": {k: list(v) for k, v in tables.items()}}
    atomic_write_text(Path(tables_dir) / MANIFEST, json.dumps(doc, indent=1))


def remove_manifest(tables_dir: str | Path) -> None:
    """Remove ``tables.json`` (an ingest does so before it rewrites any partition, so that a
    folder whose ingest did not finish is refused by :func:`read_table`)."""
    (Path(tables_dir) / MANIFEST).unlink(missing_ok=True)


def _manifest(tables_dir: Path) -> dict[str, Any]:
    """The manifest of a partitioned table folder.

    Raises
    ------
    TableLayoutError
        Missing, unreadable, or not of the shape :func:`write_manifest` writes.
    """
    f = tables_dir / MANIFEST
    if not f.is_file():
        raise TableLayoutError(f"{f}: missing: the folder holds partitioned tables but no "
                               f"manifest (an ingest that did not finish?); run "
                               f"`bayes-latency ingest` again")
    try:
        doc = json.loads(read_text(f, "table manifest", TableLayoutError))
    except (OSError, ValueError) as exc:
        raise TableLayoutError(f"{f}: unreadable table manifest ({exc}); run "
                               f"`bayes-latency ingest` again") from None
    ok = (isinstance(doc, dict) and isinstance(doc.get("experiments"), list)
          and isinstance(doc.get("tables"), dict)
          and all(isinstance(e, str) for e in doc["experiments"])
          and all(isinstance(v, list) and all(isinstance(e, str) for e in v)
                  for v in doc["tables"].values()))
    if not ok:
        raise TableLayoutError(f"{f}: not a table manifest (needs 'experiments': a list of ids "
                               f"and 'tables': table -> list of ids); run `bayes-latency ingest` "
                               f"again")
    return doc


def _check_partitions(tables_dir: Path, name: str, found: dict[str, Path],
                      man: dict[str, Any]) -> None:
    """Refuse a table whose partition files are not exactly those the manifest lists.

    Raises
    ------
    TableLayoutError
        Naming the table and the first experiments whose partition is missing, not listed, or
        of an experiment the manifest does not know.
    """
    where = f"{tables_dir / MANIFEST}: table {name!r}"
    if name not in man["tables"]:
        raise TableLayoutError(f"{where}: not listed, but {tables_dir / name} holds partitions "
                               f"of {_few(found)}")
    listed = man["tables"][name]
    known = set(man["experiments"])
    foreign = sorted(set(found) - known)
    if foreign:
        raise TableLayoutError(f"{where}: partition(s) of experiment(s) not in this ingest: "
                               f"{_few(foreign)} (e.g. {found[foreign[0]]})")
    missing = [e for e in listed if e not in found]
    if missing:
        raise TableLayoutError(f"{where}: partition(s) of experiment(s) {_few(missing)} listed "
                               f"but missing (e.g. {partition_path(tables_dir, name, missing[0])})"
                               f"; run `bayes-latency ingest` again")
    extra = sorted(set(found) - set(listed))
    if extra:
        raise TableLayoutError(f"{where}: partition(s) of experiment(s) {_few(extra)} present "
                               f"but not listed (e.g. {found[extra[0]]})")


def _few(ids: Any, n: int = 3) -> str:
    ids = list(ids)
    more = f" and {len(ids) - n} more" if len(ids) > n else ""
    return ", ".join(repr(str(e)) for e in ids[:n]) + more


def table_names(tables_dir: str | Path) -> list[str]:
    """Names of the tables in a folder (either layout), sorted."""
    d = Path(tables_dir)
    names = {p.stem for p in d.glob("*.parquet") if p.is_file()}
    names |= {p.name for p in d.iterdir() if p.is_dir() and any(p.glob(f"{_KEY}*/{_PART}"))} \
        if d.is_dir() else set()
    return sorted(names)


def table_files(tables_dir: str | Path, name: str,
                experiments: Sequence[str] | None = None) -> list[Path]:
    """The Parquet files of table ``name``: the single file of the old layout, or the partitions
    (of ``experiments`` only, when given) in ingest order. Empty when the table is absent."""
    d = Path(tables_dir)
    single = d / f"{name}.parquet"
    if single.is_file():
        return [single]
    part_dir = d / name
    if not part_dir.is_dir():
        return []
    found = {unquote(p.parent.name[len(_KEY):]): p for p in part_dir.glob(f"{_KEY}*/{_PART}")}
    if not found:
        return []
    man = _manifest(d)
    _check_partitions(d, name, found, man)
    order = [e for e in man["experiments"] if e in found]
    if experiments is not None:
        wanted = {str(e) for e in experiments}
        order = [e for e in order if e in wanted]
    return [found[e] for e in order]


def read_table(tables_dir: str | Path, name: str, columns: Sequence[str] | None = None,
               experiments: Sequence[str] | None = None) -> pd.DataFrame:
    """Read table ``name`` of an ingest folder (partitioned or single-file layout).

    Parameters
    ----------
    tables_dir
        Folder written by ``bayes-latency ingest`` (or a path to one ``.parquet`` file, read as is).
    name
        Table name (``observations``, ``requests``, ...).
    columns
        Columns to read (default: all).
    experiments
        Experiment ids whose partitions to read (default: all; ignored for single-file tables
        except as a row filter).

    Returns
    -------
    pandas.DataFrame
        Rows of the experiments in ingest order, with a fresh index.

    Raises
    ------
    BayesLatencyError
        When the folder has no table ``name``.
    """
    import pyarrow as pa
    import pyarrow.dataset as ds

    d = Path(tables_dir)
    if d.is_file():
        return read_parquet(d, columns=list(columns) if columns is not None else None)
    files = table_files(d, name, experiments)
    if not files:
        if not table_files(d, name):
            raise BayesLatencyError(f"{d}: no table {name!r} (run `bayes-latency ingest` first)")
        first = table_files(d, name)[0]
        df = read_parquet(first, columns=list(columns) if columns is not None else None)
        return df.iloc[0:0].reset_index(drop=True)
    cols = list(columns) if columns is not None else None
    if len(files) == 1:
        df = read_parquet(files[0], columns=cols)
        if experiments is not None and files[0].name == f"{name}.parquet" \
                and "experiment_id" in df.columns:
            df = df[df["experiment_id"].astype(str).isin({str(e) for e in experiments})]
        return df.reset_index(drop=True)
    schemas = _schemas(files)
    _check_same_columns(d, name, files, schemas)
    schema = pa.unify_schemas(schemas, promote_options="permissive")
    # keep the pandas metadata of a partition whose columns are typed (not all-null) if possible
    meta = next((s.metadata for s in schemas
                 if not any(pa.types.is_null(t) for t in s.types)), schemas[0].metadata)
    schema = schema.with_metadata(meta)
    table = ds.dataset([str(f) for f in files], schema=schema, format="parquet").to_table(
        columns=cols)
    return table.to_pandas().reset_index(drop=True)


def _check_same_columns(tables_dir: Path, name: str, files: Sequence[Path],
                        schemas: Sequence[Any]) -> None:
    """Refuse partitions of one table with different columns (unifying them would fill the
    missing ones with nulls and report a foreign file as null values).

    Raises
    ------
    TableLayoutError
        Naming the partition file and its missing and foreign columns (against the first
        partition in ingest order).
    """
    ref = list(schemas[0].names)
    for f, sch in zip(files[1:], schemas[1:], strict=True):
        cols = list(sch.names)
        if set(cols) == set(ref):
            continue
        missing = [c for c in ref if c not in cols]
        foreign = [c for c in cols if c not in ref]
        parts = []
        if missing:
            parts.append(f"lacks column(s) {_few(missing, 5)}")
        if foreign:
            parts.append(f"has column(s) {_few(foreign, 5)} the others have not")
        raise TableLayoutError(f"{f}: partition of table {name!r} {' and '.join(parts)} "
                               f"(compared with {files[0]}); run `bayes-latency ingest` again")


def check_tables(tables_dir: str | Path) -> list[str]:
    """Check a table folder before a command writes anything: every table's partitions agree
    with the manifest, every Parquet file's schema reads, and the partitions of a table have
    the same columns. Returns the table names.

    Raises
    ------
    BayesLatencyError
        Naming the folder, table, experiment or file (:class:`TableLayoutError`,
        :class:`TraceFormatError`).
    """

    d = Path(tables_dir)
    if d.is_file():
        return [d.stem]
    if not d.is_dir():
        raise BayesLatencyError(f"{d}: no such table folder")
    names = table_names(d)
    if not names:
        raise BayesLatencyError(f"{d}: no Parquet table (run `bayes-latency ingest` first)")
    for name in names:
        files = table_files(d, name)
        schemas = _schemas(files)
        if len(files) > 1:
            _check_same_columns(d, name, files, schemas)
    return names


def row_locator(path: str | Path, name: str = "observations"
                ) -> Callable[[int], tuple[str, int]]:
    """A function of a row of :func:`read_table`'s frame (all experiments) -> ``(file, row in
    that file)``, for messages about a row of a partitioned table.

    ``path`` is a table folder (either layout) or one Parquet file.
    """
    import pyarrow.parquet as pq

    p = Path(path)
    files = [p] if p.is_file() else table_files(p, name)
    counts = []
    for f in files:
        try:
            counts.append(pq.ParquetFile(f).metadata.num_rows)
        except Exception:  # noqa: BLE001 - an unreadable file was reported by read_table
            counts.append(0)
    starts = [0]
    for n in counts:
        starts.append(starts[-1] + n)

    def locate(row: int) -> tuple[str, int]:
        for f, a, b in zip(files, starts, starts[1:], strict=False):
            if a <= row < b:
                return str(f), row - a
        return str(p), row

    return locate


def load_observations(path: str | Path) -> pd.DataFrame:
    """The observation table from an ingest folder (either layout) or a Parquet file."""
    path = Path(path)
    if not path.exists():
        raise BayesLatencyError(f"no observation table at {path}; run `bayes-latency ingest` first")
    return read_table(path, "observations")


def load_checked_observations(path: str | Path) -> pd.DataFrame:
    """:func:`load_observations`, validated
    (:func:`~bayes_latency.data.observations.table.validate_observations`): a bad value is
    reported at its partition file and row."""
    from bayes_latency.data.observations.table import validate_observations

    obs = load_observations(path)
    return validate_observations(obs, source=str(table_source(path, "observations")),
                                 locate=row_locator(path, "observations"))


def table_source(path: str | Path, name: str) -> Path:
    """The path messages about table ``name`` of ``path`` name: the file itself, the single
    ``<name>.parquet`` of the old layout, else the table's partition folder."""
    p = Path(path)
    if p.is_file() or (p / f"{name}.parquet").is_file():
        return p if p.is_file() else p / f"{name}.parquet"
    return p / name


def _schemas(files: Sequence[Path]) -> list[Any]:
    """The Parquet schema of each file; an unreadable file is a :class:`TraceFormatError`
    naming it."""
    import pyarrow.parquet as pq

    out = []
    for f in files:
        try:
            out.append(pq.read_schema(f))
        except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for corrupt files
            raise TraceFormatError(f"cannot read Parquet table: {str(exc).strip()[:200]}",
                                   file=str(f)) from None
    return out
