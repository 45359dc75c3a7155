"""Client-side benchmark results: common tables and a dispatcher over the three recorded formats.

What users record when they benchmark a vLLM server, read into two tables:

- ``lifecycle``: one summary row per run, the columns of
  :data:`bayes_latency.data.lifecycle.LIFECYCLE_COLUMNS` (seconds) plus ``source``
  (``"inference_perf"``, ``"vllm_bench"``, ``"tracev2"``), ``max_concurrency``, ``burstiness``
  and ``duration_s`` (:data:`CLIENT_SUMMARY_COLUMNS`);
- ``client_requests``: one row per recorded request when the input has them
  (:data:`CLIENT_REQUEST_COLUMNS`).

Formats (:func:`read_client_results` recognises them by content, not by name):

- **inference-perf** results: an experiment folder with ``results/summary_lifecycle_metrics.json``
  / ``stage_<N>_lifecycle_metrics.json`` (:mod:`bayes_latency.data.lifecycle`), or one such file;
- **vllm bench serve** ``--save-result`` JSON (:mod:`bayes_latency.data.vllm_bench`), with
  per-request lists when saved with ``--save-detailed``; ``--append-result`` files (one JSON
  object per line) give one row per run;
- **BLIS TraceV2** from ``blis observe --trace-header X.yaml --trace-data X.csv``
  (:mod:`bayes_latency.data.tracev2`): the header YAML and the data CSV of the same stem.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from bayes_latency.data.lifecycle import LIFECYCLE_COLUMNS
from bayes_latency.data.report import IngestReport
from bayes_latency.errors import TraceFormatError

__all__ = ["ACCEPTED_FORMATS", "CLIENT_REQUEST_COLUMNS", "CLIENT_SUMMARY_COLUMNS",
           "add_folder_client_results", "read_client_results", "requests_frame",
           "summary_frame", "summary_from_requests"]

#: Columns of the client summary rows (the ``lifecycle`` table's, plus four).
#: ``max_concurrency`` / ``burstiness`` are vLLM's load settings (NaN elsewhere), ``duration_s``
#: the run's wall time (vLLM's ``duration``; TraceV2: first send to last chunk).
CLIENT_SUMMARY_COLUMNS: tuple[str, ...] = LIFECYCLE_COLUMNS + ("source", "max_concurrency",
                                                               "burstiness", "duration_s")

#: Columns of the per-request client table ``client_requests``.
#: ``arrival_s`` / ``send_s`` are seconds since the run's first arrival, on one clock (NaN when
#: the input does not record them; without arrivals ``arrival_s = send_s``; for TraceV2, whose
#: arrivals and sends are on different clocks, they are aligned so that the smallest send delay
#: is 0); ``status`` is ``"ok"`` or ``"error"`` (failed, timed-out or unfinished
#: requests, whose latencies are NaN) and ``error`` the recorded message (cut to 200 characters).
CLIENT_REQUEST_COLUMNS: tuple[str, ...] = (
    "experiment_id", "source", "request_index", "request_id", "arrival_s", "send_s",
    "prompt_tokens", "output_tokens", "ttft_s", "e2e_s", "decode_interval_s", "status", "error")

ACCEPTED_FORMATS = (
    "accepted client result formats: (1) an inference-perf results folder "
    "(results/summary_lifecycle_metrics.json, results/stage_<N>_lifecycle_metrics.json) or one "
    "such JSON; (2) a `vllm bench serve --save-result` JSON (object with 'completed', "
    "'duration', 'mean_ttft_ms', ...; per-request lists with --save-detailed; JSON lines with "
    "--append-result); (3) a BLIS TraceV2 pair from `blis observe`: header YAML "
    "(trace_version, time_unit, mode, ...) and data CSV of the same stem (X.yaml + X.csv)")

_STATS = (("mean", None), ("median", 50.0), ("p90", 90.0), ("p99", 99.0))


def _stats(values: np.ndarray) -> dict[str, float]:
    """mean / median / p90 / p99 of the finite values (NaN when there are none)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if not v.size:
        return {s: math.nan for s, _ in _STATS}
    return {s: float(v.mean()) if q is None else float(np.percentile(v, q)) for s, q in _STATS}


def summary_from_requests(req: pd.DataFrame, itl_values: np.ndarray | None = None
                          ) -> dict[str, float]:
    """Lifecycle summary fields computed from a per-request table.

    Parameters
    ----------
    req
        Rows of :data:`CLIENT_REQUEST_COLUMNS` of one run (failed rows included).
    itl_values
        All inter-token (inter-chunk) intervals of the successful requests, seconds, when the
        input records them; else the ITL statistics are NaN.

    Returns
    -------
    dict
        ``count, successes, failures``, ``<m>_<stat>_s`` for ``ttft, e2e, tpot`` (the per-request
        decode interval ``(e2e - ttft) / (output - 1)``, requests with > 1 output token),
        ``ntpot`` (``e2e / output``) and ``itl``, ``prompt_len_mean``, ``output_len_mean``,
        ``decode_interval_s`` (from the means, as in :mod:`bayes_latency.data.lifecycle`).
    """
    ok = req[req["status"] == "ok"]
    out: dict[str, float] = {"count": float(len(req)), "successes": float(len(ok)),
                             "failures": float(len(req) - len(ok))}
    ttft = ok["ttft_s"].to_numpy(dtype=float)
    e2e = ok["e2e_s"].to_numpy(dtype=float)
    n_out = ok["output_tokens"].to_numpy(dtype=float, na_value=np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        ntpot = np.where(n_out > 0, e2e / n_out, np.nan)
    per = {"ttft": ttft, "e2e": e2e, "tpot": ok["decode_interval_s"].to_numpy(dtype=float),
           "ntpot": ntpot,
           "itl": np.asarray(itl_values, dtype=float) if itl_values is not None else np.array([])}
    for m, vals in per.items():
        for s, v in _stats(vals).items():
            out[f"{m}_{s}_s"] = v
    out["prompt_len_mean"] = _mean(ok["prompt_tokens"])
    out["output_len_mean"] = _mean(ok["output_tokens"])
    out["decode_interval_s"] = decode_interval(out["e2e_mean_s"], out["ttft_mean_s"],
                                               out["output_len_mean"])
    return out


def _mean(s: pd.Series) -> float:
    v = s.to_numpy(dtype=float, na_value=np.nan)
    v = v[np.isfinite(v)]
    return float(v.mean()) if v.size else math.nan


def decode_interval(e2e_mean: float, ttft_mean: float, out_len_mean: float) -> float:
    """``(mean E2E - mean TTFT) / (mean output length - 1)``; NaN when the length is <= 1."""
    if not out_len_mean > 1.0:
        return math.nan
    return (e2e_mean - ttft_mean) / (out_len_mean - 1.0)


def summary_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Summary rows -> a frame of :data:`CLIENT_SUMMARY_COLUMNS` with the lifecycle dtypes."""
    df = pd.DataFrame(rows)
    for c in CLIENT_SUMMARY_COLUMNS:
        if c not in df:
            df[c] = None
    df["stage"] = df["stage"].astype("str")
    df["stage_index"] = pd.array(df["stage_index"].tolist(), dtype="Int64")
    df["tp"] = pd.array([None if v is None or (isinstance(v, float) and math.isnan(v)) else v
                         for v in df["tp"].tolist()], dtype="Int64")
    for c in ("model", "source", "experiment_id"):
        df[c] = df[c].astype("object")
    for c in CLIENT_SUMMARY_COLUMNS:
        if c not in ("experiment_id", "stage", "stage_index", "model", "tp", "source"):
            df[c] = pd.to_numeric(df[c], errors="coerce").astype(np.float64)
    return df[list(CLIENT_SUMMARY_COLUMNS)].reset_index(drop=True)


def requests_frame(rows: dict[str, list[Any]] | pd.DataFrame) -> pd.DataFrame:
    """Per-request columns -> a frame of :data:`CLIENT_REQUEST_COLUMNS` with fixed dtypes."""
    df = pd.DataFrame(rows)
    for c in CLIENT_REQUEST_COLUMNS:
        if c not in df:
            df[c] = pd.Series(dtype="object")
    df["request_index"] = df["request_index"].astype(np.int64)
    for c in ("prompt_tokens", "output_tokens"):
        df[c] = pd.array([None if v is None or (isinstance(v, float) and math.isnan(v))
                          else int(v) for v in df[c].tolist()], dtype="Int64")
    for c in ("arrival_s", "send_s", "ttft_s", "e2e_s", "decode_interval_s"):
        df[c] = pd.to_numeric(df[c], errors="coerce").astype(np.float64)
    for c in ("experiment_id", "source", "request_id", "status", "error"):
        df[c] = df[c].astype("object")
    return df[list(CLIENT_REQUEST_COLUMNS)].reset_index(drop=True)


def _empty_requests() -> pd.DataFrame:
    return requests_frame({c: [] for c in CLIENT_REQUEST_COLUMNS})


# ---------------------------------------------------------------------------------------------
# Recognising formats
# ---------------------------------------------------------------------------------------------

def _first_json_object(path: Path) -> Any:
    """The document of a JSON file, or its first line's when it holds JSON lines; None if not JSON."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        pass
    for line in text.splitlines():
        if line.strip():
            try:
                return json.loads(line)
            except (ValueError, RecursionError):
                return None
    return None


def _is_lifecycle_doc(doc: Any) -> bool:
    return isinstance(doc, dict) and bool({"load_summary", "successes"} & set(doc))


def _is_vllm_doc(doc: Any) -> bool:
    from bayes_latency.data.vllm_bench import looks_like_vllm_bench

    return looks_like_vllm_bench(doc)


def _tracev2_header_of(path: Path) -> Path | None:
    """The header YAML next to a data CSV (same stem, .yaml / .yml), if any."""
    for suffix in (".yaml", ".yml"):
        cand = path.with_suffix(suffix)
        if cand.is_file():
            return cand
    return None


def _is_tracev2_header(path: Path) -> bool:
    try:
        with open(path, encoding="utf-8") as fh:
            doc = yaml.safe_load(fh)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return isinstance(doc, dict) and "trace_version" in doc


def _lifecycle_with_source(df: pd.DataFrame, source: str = "inference_perf") -> pd.DataFrame:
    rows = df.to_dict(orient="records")
    for r in rows:
        r["source"] = source
        r["stage_index"] = None if pd.isna(r["stage_index"]) else int(r["stage_index"])
        r["tp"] = None if pd.isna(r["tp"]) else int(r["tp"])
    return summary_frame(rows)


def _read_one_file(path: Path, experiment_id: str | None
                   ) -> tuple[dict[str, pd.DataFrame], IngestReport]:
    suffix = path.suffix.lower()
    if suffix in (".yaml", ".yml"):
        if not _is_tracev2_header(path):
            raise TraceFormatError(f"not a TraceV2 header (no trace_version); {ACCEPTED_FORMATS}",
                                   file=str(path))
        from bayes_latency.data.tracev2 import read_tracev2

        return read_tracev2(path, experiment_id=experiment_id)
    if suffix == ".csv":
        header = _tracev2_header_of(path)
        if header is None:
            raise TraceFormatError(f"a CSV without a TraceV2 header YAML of the same stem "
                                   f"({path.with_suffix('.yaml').name}); {ACCEPTED_FORMATS}",
                                   file=str(path))
        from bayes_latency.data.tracev2 import read_tracev2

        return read_tracev2(header, path, experiment_id=experiment_id)
    doc = _first_json_object(path)
    if doc is None:
        raise TraceFormatError(f"not JSON, YAML or CSV; {ACCEPTED_FORMATS}", file=str(path))
    if _is_vllm_doc(doc):
        from bayes_latency.data.vllm_bench import read_vllm_bench

        return read_vllm_bench(path, experiment_id=experiment_id)
    if _is_lifecycle_doc(doc):
        from bayes_latency.data.lifecycle import _STAGE_RE, read_lifecycle_file

        m = _STAGE_RE.match(path.name)
        stage = m.group(1) if m else "summary"
        report = IngestReport(source=str(path))
        report.read["files"] += 1
        eid = experiment_id or (path.parent.parent.name if path.parent.name == "results"
                                else path.stem)
        row = read_lifecycle_file(path, experiment_id=eid, stage=stage, report=report)
        row.update(model=None, tp=None, source="inference_perf")
        report.kept["lifecycle_rows"] += 1
        return {"lifecycle": summary_frame([row]), "client_requests": _empty_requests()}, report
    if isinstance(doc, list):
        raise TraceFormatError(f"a JSON list, not a result object (the '.pytorch.json' companion "
                               f"of a vllm bench result? pass the main result JSON); "
                               f"{ACCEPTED_FORMATS}", file=str(path))
    raise TraceFormatError(f"JSON of an unknown kind; {ACCEPTED_FORMATS}", file=str(path))


#: Files of an experiment folder that are never client results (not parsed when scanning).
_NOT_CLIENT = ("traces.", "kv_events.", "ingest_report", "reconstruction_report")


def _sniff_vllm(path: Path, size: int = 8192) -> bool:
    """Cheap check before parsing a folder's JSON: vLLM writes ``completed`` near the top."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            head = fh.read(size)
    except OSError:
        return False
    return head.lstrip().startswith("{") and '"completed"' in head


def _folder_sources(folder: Path) -> tuple[bool, list[Path], list[Path]]:
    """(has inference-perf results, vllm bench JSONs, TraceV2 headers) of a folder."""
    from bayes_latency.data.lifecycle import _STAGE_RE

    results = folder / "results" if (folder / "results").is_dir() else folder
    has_ip = results.is_dir() and any(
        p.name == "summary_lifecycle_metrics.json" or _STAGE_RE.match(p.name)
        for p in results.iterdir())
    vllm, headers = [], []
    for p in sorted(folder.iterdir()):
        if not p.is_file():
            continue
        name = p.name.lower()
        if name.endswith((".json", ".jsonl")) and not name.endswith(".pytorch.json") \
                and "lifecycle_metrics" not in name and not name.startswith(_NOT_CLIENT):
            if _sniff_vllm(p) and _is_vllm_doc(_first_json_object(p)):
                vllm.append(p)
        elif p.suffix.lower() in (".yaml", ".yml") and p.with_suffix(".csv").is_file() \
                and _is_tracev2_header(p):
            headers.append(p)
    return has_ip, vllm, headers


def read_client_results(path: str | Path, experiment_id: str | None = None
                        ) -> tuple[dict[str, pd.DataFrame], IngestReport]:
    """Read client-side benchmark results of any accepted format (see the module docstring).

    Parameters
    ----------
    path
        A file (inference-perf lifecycle JSON, vllm bench JSON, TraceV2 header YAML or data CSV)
        or a folder holding any of them (an inference-perf experiment folder with ``results/``,
        ``*.json`` vllm bench results, ``X.yaml`` + ``X.csv`` TraceV2 pairs): all are read.
    experiment_id
        Id of the run (default: the folder name for inference-perf, the file stem otherwise;
        with several sources in one folder, ``<experiment_id>/<file stem>``).

    Returns
    -------
    tables : dict[str, pandas.DataFrame]
        ``lifecycle`` (:data:`CLIENT_SUMMARY_COLUMNS`) and ``client_requests``
        (:data:`CLIENT_REQUEST_COLUMNS`, empty when no input has per-request data).
    report : IngestReport
        Counts merged over the sources: ``read`` / ``kept`` / ``dropped`` by reason.

    Raises
    ------
    TraceFormatError
        If the path does not exist, is of no accepted format (the message lists them), or a
        source is malformed (names the file, line and field where known).
    """
    path = Path(path)
    if path.is_file():
        return _read_one_file(path, experiment_id)
    if not path.is_dir():
        raise TraceFormatError("no such file or folder", file=str(path))
    has_ip, vllm, headers = _folder_sources(path)
    n = int(has_ip) + len(vllm) + len(headers)
    if n == 0:
        raise TraceFormatError(f"no client results found in the folder; {ACCEPTED_FORMATS}",
                               file=str(path))
    base = experiment_id or path.name
    report = IngestReport(source=str(path))
    lifecycle, requests = [], []
    if has_ip:
        from bayes_latency.data.lifecycle import read_lifecycle_dir

        lc, rep = read_lifecycle_dir(path, experiment_id=base)
        report.merge(rep)
        lifecycle.append(_lifecycle_with_source(lc))
    for p in [*vllm, *headers]:
        eid = base if n == 1 else f"{base}/{p.stem}"
        tabs, rep = _read_one_file(p, eid)
        report.merge(rep)
        lifecycle.append(tabs["lifecycle"])
        if len(tabs["client_requests"]):
            requests.append(tabs["client_requests"])
    out = {"lifecycle": pd.concat(lifecycle, ignore_index=True) if len(lifecycle) > 1
           else lifecycle[0],
           "client_requests": pd.concat(requests, ignore_index=True) if requests
           else _empty_requests()}
    return out, report


def add_folder_client_results(out: dict[str, pd.DataFrame], folder: Path, experiment_id: str,
                              report: IngestReport) -> None:
    """Add an experiment folder's ``vllm_bench*.json`` / TraceV2 summaries to ``out["lifecycle"]``.

    Used by :func:`bayes_latency.data.experiment.ingest_experiment`. The rows' experiment id is
    ``experiment_id`` when the folder holds one such source and no inference-perf results, else
    ``<experiment_id>/<file stem>``. Only the summary rows are added (the per-request rows stay available through :func:`read_client_results`); a source
    that cannot be read is skipped and counted ``client_results:unreadable``.
    """
    _, vllm, headers = _folder_sources(folder)
    vllm = [p for p in vllm if p.name.lower().startswith("vllm_bench")]
    if not vllm and not headers:
        return
    rows = []
    has_lifecycle = "lifecycle" in out and len(out["lifecycle"]) > 0
    for p in [*vllm, *headers]:
        single = len(vllm) + len(headers) == 1 and not has_lifecycle
        eid = experiment_id if single else f"{experiment_id}/{p.stem}"
        try:
            tabs, rep = _read_one_file(p, eid)
        except TraceFormatError as exc:
            report.drop("client_results:unreadable")
            report.notes.append(f"client results skipped: {exc}")
            continue
        report.merge(rep)
        rows.append(tabs["lifecycle"])
    if not rows:
        return
    if "lifecycle" in out and len(out["lifecycle"]):
        rows.insert(0, _lifecycle_with_source(out["lifecycle"]))
    out["lifecycle"] = pd.concat(rows, ignore_index=True)
