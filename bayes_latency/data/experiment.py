"""Ingest: trace files and experiment folders -> the Parquet tables of ``docs/ARCHITECTURE.md``.

Called by ``bayes-latency ingest TRACE_FILES_OR_FOLDERS... [--config SERVING.yaml] --out DIR``.

Inputs
------
- **Experiment folder** ``EXP/``: ``serving.yaml`` (else ``exp-config.yaml``, else ``--config``),
  ``traces.jsonl`` (or ``traces.json``, optionally ``.gz``), optional ``kv_events.jsonl``,
  ``results/`` (inference-perf lifecycle metrics) and ``profile.yaml``.
- **Trace file** (OTLP JSON Lines): features need ``--config``; without it every table except
  ``observations`` is written (batches rebuilt with the default serving knobs) and the report
  says so.

The serving YAML format is described in :mod:`bayes_latency.data.serving_yaml`.

Outputs (in ``--out``)
----------------------
``steps``, ``journey_events``, ``requests``, ``batches``, ``iterations``, ``observations``,
``lifecycle`` and ``kv_events`` (when any input has them) as Parquet datasets partitioned by
experiment (``<name>/experiment_id=<id>/part.parquet``, read them with
:func:`bayes_latency.data.tables.read_table`), all keyed by ``experiment_id``;
``ingest_report.json`` (total and per-experiment counts) and ``reconstruction_report.json`` (per
experiment). Each experiment is one unit of work, inline or a Dask task
(:mod:`bayes_latency.parallel`); it streams its trace and writes its own partitions.
"""

from __future__ import annotations

import gc
import json
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from bayes_latency.data.observations.build import build_observations, empty_observations
from bayes_latency.data.rebuild.reconstruct import BATCH_COLUMNS, reconstruct_batches
from bayes_latency.data.report import IngestReport
from bayes_latency.data.serving_yaml import (
    _CONFIG_NAMES,
    _cfg_source,
    _check_prompt_lengths,
    _given,
    _normalise,
    load_serving_yaml,
    serving_config,
)
from bayes_latency.data.tables import (
    MANIFEST,
    clear_table,
    read_table,
    remove_manifest,
    table_names,
    write_manifest,
    write_partition,
)
from bayes_latency.errors import BayesLatencyError, ConfigError, TraceFormatError
from bayes_latency.io import (
    atomic_write_text,
    check_output_path,
    folder_lock,
    staged_folder,
)
from bayes_latency.textfiles import (
    check_regular,
    check_text_start,
    load_yaml,
    read_text,
    refuse_special,
)

__all__ = [
    "TABLES",
    "build_iterations",
    "ingest",
    "ingest_experiment",
    "load_serving_yaml",
    "load_tables",
    "serving_config",
]

#: A function of one experiment's ``iterations`` table that returns notes for its ingest report.
IterationNotes = Callable[[pd.DataFrame], Iterable[str]]

TABLES: tuple[str, ...] = ("steps", "journey_events", "requests", "batches", "iterations",
                           "lifecycle", "kv_events", "observations")
"""Table names written by :func:`ingest` (``lifecycle`` / ``kv_events`` only when present)."""

_TRACE_NAMES = ("traces.jsonl", "traces.json", "traces.jsonl.gz", "traces.json.gz")


def _find(folder: Path, names: Sequence[str]) -> Path | None:
    """The first of ``names`` present in ``folder``; one that is there but is no regular file
    (a folder named ``serving.yaml``, a FIFO) is refused with what it is."""
    for n in names:
        cand = folder / n
        if os.path.lexists(cand):
            what = "trace" if n in _TRACE_NAMES else (
                "serving config" if n in _CONFIG_NAMES else "input")
            check_regular(cand, what, ConfigError if n in _CONFIG_NAMES else TraceFormatError)
            return cand
    return None


def build_iterations(steps: pd.DataFrame, batches: pd.DataFrame,
                     report: IngestReport | None = None) -> pd.DataFrame:
    """The ``iterations`` table from sampled steps and rebuilt batches.

    One row per step ``i`` with ``i`` and ``i + 1`` sampled: ``iteration_us = (ts_start(i+1) -
    ts_start(i)) / 1000``, ``schedule_cpu_us = step.duration_us(i)``, the batch columns of the
    rebuilt step ``i`` and ``ctx_approximated`` (False). Pairs whose start times do not increase
    are dropped (``non_positive_gap``).
    """
    cols = ["experiment_id", "step_id", "iteration_us", "schedule_cpu_us", *BATCH_COLUMNS,
            "ctx_approximated"]
    frames = []
    # numpy per experiment (the pandas dropna / drop_duplicates / sort / set_index / loc chain
    # cost 5 ms per experiment on the demo fleet): the first row of each step id with a start
    # time, in step order; the rebuilt batch of each step by its step id
    if not len(steps):
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in cols})
    codes, eids = pd.factorize(steps["experiment_id"], sort=False)  # groupby's order
    sid_all = steps["step.id"]
    ts_all = steps["step.ts_start_ns"]
    ok_all = (sid_all.notna() & ts_all.notna()).to_numpy(dtype=bool)
    sid_all = sid_all.to_numpy(dtype=np.int64, na_value=0)
    ts_all = ts_all.to_numpy(dtype=np.int64, na_value=0)
    dur_all = steps["step.duration_us"].to_numpy(dtype=float, na_value=np.nan)
    b_eid = batches["experiment_id"]
    for g, eid in enumerate(eids):
        rows = np.flatnonzero((codes == g) & ok_all)
        first = np.unique(sid_all[rows], return_index=True)[1]
        rows = rows[first]  # drop_duplicates("step.id") then sort_values("step.id")
        sid, ts = sid_all[rows], ts_all[rows]
        nxt = np.flatnonzero(np.diff(sid) == 1)
        gap = (ts[nxt + 1] - ts[nxt]) / 1e3
        bad = ~(gap > 0)
        if bad.any() and report is not None:
            report.drop("non_positive_gap", int(bad.sum()))
        nxt, gap = nxt[~bad], gap[~bad]
        in_b = (b_eid == eid).to_numpy(dtype=bool)
        b_rows = None if in_b.all() else np.flatnonzero(in_b)
        b_sid = batches["step_id"].to_numpy()
        b_sid = b_sid if b_rows is None else b_sid[b_rows]
        pos = pd.Index(b_sid).get_indexer(sid[nxt])
        keep = pos >= 0
        nxt, gap, pos = nxt[keep], gap[keep], pos[keep]
        if b_rows is not None:
            pos = b_rows[pos]
        d: dict[str, Any] = {"experiment_id": str(eid), "step_id": sid[nxt], "iteration_us": gap,
                             "schedule_cpu_us": dur_all[rows][nxt]}
        for c in BATCH_COLUMNS:
            d[c] = batches[c].to_numpy(dtype=float)[pos]
        d["ctx_approximated"] = batches["ctx_approximated"].to_numpy(dtype=bool)[pos]
        frames.append(pd.DataFrame(d))
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in cols})
    return pd.concat(frames, ignore_index=True)[cols]


def ingest_experiment(trace: Path, cfg: dict[str, Any] | None, experiment_id: str | None = None,
                      folder: Path | None = None, iteration_notes: IterationNotes | None = None,
                      chunk_bytes: int | None = None) -> tuple[dict[str, pd.DataFrame], IngestReport,
                                                           dict[str, Any]]:
    """Read and process one experiment (a trace file, and its folder when given).

    Parameters
    ----------
    trace
        OTLP JSON Lines trace file.
    cfg
        :func:`load_serving_yaml` dict, or None (no observations; default serving knobs for the
        reconstruction).
    experiment_id
        Id of the experiment (default: ``cfg["experiment_id"]``, else the reader's default).
    folder
        Experiment folder, for ``kv_events.jsonl`` and ``results/``.
    chunk_bytes
        :func:`~bayes_latency.data.otlp.read.read_otlp`'s chunks for the byte scanner (None: its
        default; 0: every line read line by line).

    Returns
    -------
    tables : dict[str, pandas.DataFrame]
    report : IngestReport
    reconstruction : dict
        :meth:`ReconstructionReport.to_dict`.
    """
    from bayes_latency.data.otlp.read import read_otlp
    from bayes_latency.data.steps import drop_over_serving_limits, iterations_from_steps
    from bayes_latency.physics.serving import ServingConfig

    eid = experiment_id or (cfg or {}).get("experiment_id")
    report = IngestReport(source=str(folder or trace))
    tabs = read_otlp(trace, experiment_id=eid, report=report, chunk_bytes=chunk_bytes)
    eid = eid or (str(tabs.steps["experiment_id"].iloc[0]) if len(tabs.steps) else None) or (
        str(tabs.requests["experiment_id"].iloc[0]) if len(tabs.requests) else trace.stem)
    serving = serving_config(cfg, source=_cfg_source(cfg, trace)) if cfg else ServingConfig()
    if cfg is not None:
        tabs.steps = drop_over_serving_limits(
            tabs.steps, *(getattr(serving, k) if _given(cfg, k) else None
                          for k in ("max_num_seqs", "max_num_batched_tokens")),
            report, source=str(folder or trace))
    if cfg is None:
        report.notes.append("no serving config: batches rebuilt with the default serving knobs "
                            f"(max_num_batched_tokens={serving.max_num_batched_tokens}, "
                            f"prefix_caching={serving.prefix_caching}); no observations written")
    out: dict[str, pd.DataFrame] = {"steps": tabs.steps, "journey_events": tabs.journey_events,
                                    "requests": tabs.requests}
    recon: dict[str, Any] = {}
    if len(tabs.journey_events):
        batches, _, rrep = reconstruct_batches(tabs.journey_events, tabs.requests, serving,
                                               tabs.steps, with_members=False)
        rrep.experiment_id = eid
        batches["experiment_id"] = eid
        recon = rrep.to_dict()
        report.kept["batches"] += len(batches)
        for issue in ("step_out_of_range", "summary_step_out_of_range"):
            if rrep.issues.get(issue):
                report.drop(f"rebuild:{issue}", int(rrep.issues[issue]))
                report.notes.append(f"rebuild: {rrep.issues[issue]} step id(s) outside the "
                                    f"range the journeys' tokens allow were not used "
                                    f"({issue})")
        if rrep.n_compared and rrep.agreement < 0.9:
            report.notes.append(f"reconstruction agrees with only {rrep.agreement:.1%} of the "
                                f"{rrep.n_compared} sampled steps (journey sampling < 1, or "
                                f"serving knobs wrong?)")
        iterations = build_iterations(tabs.steps, batches, report) if len(tabs.steps) else \
            build_iterations(pd.DataFrame(columns=["experiment_id", "step.id"]), batches)
    else:
        batches = pd.DataFrame(columns=["experiment_id", "step_id", "sampled", *BATCH_COLUMNS,
                                        "ctx_approximated"])
        iterations = iterations_from_steps(tabs.steps, block_size=serving.block_size,
                                           report=report)
        report.notes.append("no journeys: no batches rebuilt; iterations from step summaries "
                            "(ctx_approximated)")
    out["batches"], out["iterations"] = batches, iterations
    report.kept["iterations"] += len(iterations)
    if iteration_notes is not None:
        report.notes.extend(iteration_notes(iterations))
    if folder is not None:
        kv = _find(folder, ("kv_events.jsonl", "kv_events.jsonl.gz"))
        if kv is not None:
            from bayes_latency.data.kvevents import read_kv_events

            try:
                kvdf = read_kv_events(kv, report=report)
            except TraceFormatError as exc:  # empty / garbage file: counted, like lifecycle
                report.drop("kv_events:unreadable")
                report.notes.append(f"kv events skipped: {exc}")
            else:
                kvdf.insert(0, "experiment_id", eid)
                out["kv_events"] = kvdf
        if (folder / "results").is_dir():
            from bayes_latency.data.client.lifecycle import read_lifecycle_dir

            try:
                lc, lrep = read_lifecycle_dir(folder, experiment_id=eid)
                report.merge(lrep)
                out["lifecycle"] = lc
            except TraceFormatError as exc:
                report.drop("lifecycle:unreadable")
                report.notes.append(f"lifecycle metrics skipped: {exc}")
        from bayes_latency.data.client.read import (
            add_folder_client_results,  # vllm_bench*.json, TraceV2
        )

        add_folder_client_results(out, folder, eid, report)
        from bayes_latency.data.client.frames import plausibility_notes

        report.notes.extend(plausibility_notes(out.get("lifecycle"), str(folder)))
    if cfg is not None:
        from bayes_latency.physics.basis import INGEST_TERMS
        from bayes_latency.physics.hardware import load_gpu
        from bayes_latency.physics.models import load_architecture

        arch, gpu = load_architecture(cfg["model"]), load_gpu(cfg["gpu"])
        serving.check_against(arch, source=_cfg_source(cfg, trace))
        _check_prompt_lengths(tabs.requests, serving, cfg, _cfg_source(cfg, trace))
        obs, orep = build_observations(
            {"steps": tabs.steps, "requests": tabs.requests,
             "journey_events": tabs.journey_events, "batches": batches},
            serving, arch, gpu, experiment_id=eid, workload=cfg.get("workload", ""),
            terms=INGEST_TERMS)
        report.kept.update({f"observations:{k}": v for k, v in orep.kept.items()})
        report.dropped.update({f"observations:{k}": v for k, v in orep.dropped.items()})
        report.notes.extend(orep.notes)
        out["observations"] = obs
    return out, report, recon


#: Files that a shell glob over a fleet folder picks up beside the experiments and that are not
#: traces (e.g. the fleet's truth.yaml): skipped with a note, never parsed as traces.
_NOT_TRACES = frozenset({".yaml", ".yml", ".md", ".txt", ".parquet", ".csv", ".png", ".nc"})


def _inputs(paths: Sequence[Path], config: Path | None, skipped: list[Path] | None = None
            ) -> list[tuple[Path, dict[str, Any] | None, Path | None, str | None]]:
    """(trace, cfg, folder, experiment_id) per experiment; non-trace files go to ``skipped``."""
    shared = load_serving_yaml(config) if config is not None else None
    paths = [Path(p) for p in paths]
    if skipped is not None:
        skipped.extend(p for p in paths if p.is_file() and p.suffix.lower() in _NOT_TRACES)
        paths = [p for p in paths if p not in skipped]
    loose = [p for p in paths if not Path(p).is_dir()]
    items = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            trace = _find(p, _TRACE_NAMES)
            if trace is None:
                raise TraceFormatError(f"experiment folder has no trace file "
                                       f"({', '.join(_TRACE_NAMES)})", file=str(p))
            cfg_path = _find(p, _CONFIG_NAMES)
            cfg = load_serving_yaml(cfg_path) if cfg_path is not None and \
                cfg_path.name != "exp-config.yaml" else None
            if cfg is None and cfg_path is not None:  # exp-config.yaml: knobs, maybe no gpu
                try:
                    doc = load_yaml(read_text(cfg_path, "serving config", ConfigError)) or {}
                except yaml.YAMLError as exc:
                    raise ConfigError(f"{cfg_path}: not valid YAML: {exc}") from None
                if isinstance(doc, dict) and ("gpu" in doc or shared is not None):
                    merged = {**(shared or {}), **doc}
                    merged["experiment_id"] = p.name
                    tmp = dict(merged)
                    cfg = _normalise(tmp, cfg_path)
            if cfg is None and shared is not None:
                cfg = dict(shared, experiment_id=p.name)
            eid = cfg["experiment_id"] if cfg else p.name
            items.append((trace, cfg, p, eid))
        elif p.is_file():
            eid = shared["experiment_id"] if shared is not None and len(loose) == 1 else None
            cfg = dict(shared, experiment_id=eid) if shared is not None and eid else (
                dict(shared) if shared is not None else None)
            if cfg is not None and eid is None:
                cfg.pop("experiment_id", None)
            items.append((p, cfg, None, eid))
        else:
            refuse_special(p, "trace", TraceFormatError)
            raise TraceFormatError("no such file or folder", file=str(p))
    for trace, *_ in items:
        check_text_start(trace, "trace", TraceFormatError,
                         compressed_ok=trace.suffix.lower() == ".gz")
    return items


#: Generation-0 threshold of Python's cyclic garbage collector while an experiment is ingested
#: (Python's default: 700 allocations). An ingest allocates many short-lived containers (frames,
#: arrays, dicts) and frees them by reference counting; with the default a collection runs every
#: few ms and each full one walks every object of the process (150,000-180,000 after the imports,
#: more on a Dask worker). 130 demo-sized experiments (431 MB) inline: 465 collections taking
#: 0.25 CPU-s (0.16 of them in 2 full ones) with 700, 15 taking 0.03 CPU-s with 10,000, same peak
#: RSS (``results/benchmarks/ingest_scale.md``).
GC_GEN0_THRESHOLD = 10_000
_gc_lock = threading.Lock()
_gc_depth = [0, (700, 10, 10)]


@contextmanager
def _few_gc_passes():
    """Raise the collector's generation-0 threshold to :data:`GC_GEN0_THRESHOLD` inside (the
    thresholds in force on entry of the outermost one are restored on its exit; thread-safe)."""
    with _gc_lock:
        if _gc_depth[0] == 0:
            _gc_depth[1] = gc.get_threshold()
            t = _gc_depth[1]
            gc.set_threshold(max(t[0], GC_GEN0_THRESHOLD), *t[1:])
        _gc_depth[0] += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_depth[0] -= 1
            if _gc_depth[0] == 0:
                gc.set_threshold(*_gc_depth[1])


def _ingest_unit(trace: Path, cfg: dict[str, Any] | None, folder: Path | None,
                 eid: str | None, out: Path, iteration_notes: IterationNotes | None = None,
                 chunk_bytes: int | None = None) -> dict[str, Any]:
    """Ingest one experiment and write its partition of every table (a Dask task, or inline).

    Returns
    -------
    dict
        ``experiment_id``, ``report`` (:class:`IngestReport`), ``reconstruction`` (dict),
        ``rows`` (table -> rows written), ``empty`` (table -> a 0-row frame, for tables this
        experiment has no rows of: their schema when no experiment has any) and ``bytes`` read.
    """
    with _few_gc_passes():
        return _ingest_one(trace, cfg, folder, eid, out, iteration_notes, chunk_bytes)


def _ingest_one(trace: Path, cfg: dict[str, Any] | None, folder: Path | None,
                eid: str | None, out: Path, iteration_notes: IterationNotes | None = None,
                chunk_bytes: int | None = None) -> dict[str, Any]:
    """:func:`_ingest_unit`'s work."""
    try:
        tables, rep, rec = ingest_experiment(trace, cfg, experiment_id=eid, folder=folder,
                                             iteration_notes=iteration_notes,
                                             chunk_bytes=chunk_bytes)
    except ConfigError as exc:  # e.g. an unknown GPU: say which experiment it is about
        src = str(folder or trace)
        if src in str(exc):
            raise
        raise type(exc)(f"{src}: {exc}") from exc
    ids = set()
    for name in ("steps", "requests", "batches"):
        df = tables.get(name)
        if df is not None and len(df):
            ids.update(df["experiment_id"].astype(str).unique().tolist())
    eid = eid or (sorted(ids)[0] if ids else trace.stem)
    rows: dict[str, int] = {}
    empty: dict[str, pd.DataFrame] = {}
    for name, df in tables.items():
        if df is None:
            continue
        if len(df):
            write_partition(out, name, eid, df)
            rows[name] = len(df)
        else:
            empty[name] = df.iloc[0:0].copy()
    return {"experiment_id": eid, "report": rep, "reconstruction": rec, "rows": rows,
            "empty": empty, "bytes": _size(trace)}


def _size(path: Path) -> int:
    try:
        return Path(path).stat().st_size
    except OSError:
        return 0


#: Ingest speed used to decide between inline and a local Dask cluster (bytes of trace per
#: CPU-second, end to end: reading, reconstruction, observations, Parquet). Measured
#: (``results/benchmarks/ingest_scale.md``, fourth pass): the demo fleet's 86 MB take 2.7-3.4
#: CPU-seconds inline (25-32 MB per CPU-second, with the load of the shared machine); the 20x
#: fleet 22.8-23.3 MB per worker CPU-second. Kept at 18 MB/s (a busy machine is slower still):
#: the demo fleet (about 4.8 s estimated) stays inline.
INGEST_BYTES_PER_S = 18e6


def ingest(paths: Sequence[Path], out: Path, config: Path | None = None,
           scheduler: Any = None, iteration_notes: IterationNotes | None = None) -> IngestReport:
    """Turn trace files and experiment folders into the Parquet tables.

    Each experiment is one unit of work (read, rebuild, observations, write its partitions), run
    inline for small inputs or as a task on Dask distributed (:func:`bayes_latency.parallel.run_units`);
    the tables are Parquet datasets partitioned by experiment (:mod:`bayes_latency.data.tables`).

    Parameters
    ----------
    paths
        Trace files (OTLP JSON Lines) and / or experiment folders.
    out
        Output folder (created). Workers of a remote cluster must be able to write it.
    config
        Serving YAML for loose trace files (and for folders without ``serving.yaml``).
    scheduler
        None (inline below about :data:`bayes_latency.parallel.INLINE_MAX_SECONDS` of work, else
        a local cluster; ``$DASK_SCHEDULER_ADDRESS`` when set), ``"inline"``, ``"local"``, a
        scheduler address ``tcp://host:8786`` or a ``distributed.Client``.
    iteration_notes
        A function of one experiment's ``iterations`` table returning notes for its report
        (``bayes-latency ingest`` passes :func:`bayes_latency.checks.host_overhead.ingest_notes`,
        which flags steps whose host CPU time delays the engine); None for no such notes.

    Returns
    -------
    IngestReport
        Total counts; per-experiment ones are in ``out/ingest_report.json``.

    Raises
    ------
    ConfigError
        Bad serving config, or two inputs with the same experiment id.
    TraceFormatError
        Unreadable input.
    OutputPathError
        ``out`` is being written by another ingest (its lock file ``.bayes_latency.lock``
        names a running process; a lock of a process that no longer runs is taken over, with
        a note in the report).
    """
    owned = [*TABLES, *(f"{t}.parquet" for t in TABLES), MANIFEST, "ingest_report.json",
             "reconstruction_report.json"]
    out = check_output_path(
        out, [*paths, *([config] if config is not None else [])], kind="dir",
        names=[*owned, ".bayes_latency.lock"])
    # every table is written into a staging folder and moved into ``out`` at the end (the
    # manifest last): ``out`` holds one ingest's tables, and nothing of a failed one
    with folder_lock(out, "ingest") as lock_notes, \
            staged_folder(out, owned=owned, last=[MANIFEST]) as stage:
        total = _ingest_locked(paths, out, config, scheduler, iteration_notes, dest=stage)
    total.notes[:0] = lock_notes
    return total


def _ingest_locked(paths: Sequence[Path], out: Path, config: Path | None, scheduler: Any,
                   iteration_notes: IterationNotes | None, dest: Path | None = None
                   ) -> IngestReport:
    """:func:`ingest`'s work, while it holds the lock of ``out``; the files are written into
    ``dest`` (default ``out``), messages name ``out``."""
    dest = out if dest is None else dest
    from bayes_latency.data.otlp.read import SCANNER_MIN_INPUT_BYTES, _default_experiment_id
    from bayes_latency.parallel import run_units

    total = IngestReport(source=str(out))
    per_exp: dict[str, Any] = {}
    recon: dict[str, Any] = {}
    no_obs = []
    skipped: list[Path] = []
    inputs = _inputs([Path(p) for p in paths], config, skipped)
    if skipped:
        total.notes.append(f"skipped {len(skipped)} non-trace file(s): "
                           f"{', '.join(p.name for p in skipped)}")
    if not inputs:
        raise TraceFormatError("no trace files or experiment folders among the inputs",
                               file=", ".join(str(p) for p in paths))
    # partitions are written by the units: ids must be unique before any is written
    seen: set[str] = set()
    for trace, _cfg, _folder, eid in inputs:
        key = eid or _default_experiment_id(trace)
        if key in seen:
            raise ConfigError(f"experiment id {key!r} appears twice in the inputs "
                              f"(set experiment_id in the serving YAML)")
        seen.add(key)
    remove_manifest(dest)
    for name in TABLES:
        clear_table(dest, name)
    sizes = [_size(trace) for trace, *_ in inputs]
    # small inputs are read line by line: the byte scanner's compilation does not pay off
    chunk = 0 if sum(sizes) < SCANNER_MIN_INPUT_BYTES else None
    results = run_units(_ingest_unit, [(*item, dest, iteration_notes, chunk) for item in inputs],
                        scheduler=scheduler,
                        cost_s=sum(sizes) / INGEST_BYTES_PER_S, weights=sizes, desc="ingest",
                        unit="B", batch=True)
    written_rows: dict[str, list[str]] = {t: [] for t in TABLES}
    empties: dict[str, pd.DataFrame] = {}
    order: list[str] = []
    for res in results:
        eid, rep, rec = res["experiment_id"], res["report"], res["reconstruction"]
        if eid in per_exp:
            raise ConfigError(f"experiment id {eid!r} appears twice in the inputs "
                              f"(set experiment_id in the serving YAML)")
        order.append(eid)
        per_exp[eid] = rep.to_dict()
        if rec:
            recon[eid] = rec
        if "observations" not in res["rows"] and "observations" not in res["empty"]:
            no_obs.append(eid)
        for name in res["rows"]:
            written_rows[name].append(eid)
        for name, df in res["empty"].items():
            empties.setdefault(name, df)
        total.merge(rep)
    if no_obs:
        total.notes.append(f"no serving config for {', '.join(no_obs)}: observations not built "
                           f"(pass --config SERVING.yaml)")
    written = []
    for name in TABLES:
        if not written_rows[name]:  # no experiment has rows: write the schema (as before)
            if name in ("lifecycle", "kv_events"):
                continue
            if name == "observations":
                if len(no_obs) == len(per_exp):
                    continue
                df = empty_observations()
            else:
                df = empties.get(name, pd.DataFrame())
            write_partition(dest, name, order[0], df)
            written_rows[name].append(order[0])
        written.append(name)
    write_manifest(dest, order, {k: v for k, v in written_rows.items() if v})
    total.notes.append(f"wrote {', '.join(written)} to {out}")
    atomic_write_text(dest / "ingest_report.json", json.dumps(
        {"total": total.to_dict(), "experiments": per_exp}, indent=2, default=str))
    atomic_write_text(dest / "reconstruction_report.json",
                      json.dumps(recon, indent=2, default=str))
    for eid, rec in recon.items():
        agree = rec.get("agreement")
        if agree is not None:
            total.notes.append(f"reconstruction {eid}: {agree:.1%} of {rec['n_compared']} "
                               f"sampled steps match")
    return total


def load_tables(folder: str | Path) -> dict[str, pd.DataFrame]:
    """Read every ``<name>.parquet`` of an ingest output folder.

    Returns
    -------
    dict[str, pandas.DataFrame]
        Table name -> table.

    Raises
    ------
    BayesLatencyError
        If the folder does not exist or holds no Parquet table.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise BayesLatencyError(f"{folder}: no such table folder")
    tables = {name: read_table(folder, name) for name in table_names(folder)}
    if not tables:
        raise BayesLatencyError(f"{folder}: no Parquet table (run `bayes-latency ingest` first)")
    return tables
