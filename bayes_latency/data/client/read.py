"""Client-side benchmark results: common tables and a dispatcher over the three recorded formats.

What users record when they benchmark a vLLM server, read into two tables:

- ``lifecycle``: one summary row per run, the columns of
  :data:`bayes_latency.data.client.lifecycle.LIFECYCLE_COLUMNS` (seconds) plus ``source``
  (``"inference_perf"``, ``"vllm_bench"``, ``"tracev2"``), ``max_concurrency``, ``burstiness``
  and ``duration_s`` (:data:`.frames.CLIENT_SUMMARY_COLUMNS`);
- ``client_requests``: one row per recorded request when the input has them
  (:data:`.frames.CLIENT_REQUEST_COLUMNS`).

Formats (:func:`read_client_results` recognises them by content, not by name):

- **inference-perf** results: an experiment folder with ``results/summary_lifecycle_metrics.json``
  / ``stage_<N>_lifecycle_metrics.json`` (:mod:`bayes_latency.data.client.lifecycle`), or one such file;
- **vllm bench serve** ``--save-result`` JSON (:mod:`bayes_latency.data.client.vllm_bench`), with
  per-request lists when saved with ``--save-detailed``; ``--append-result`` files (one JSON
  object per line) give one row per run;
- **BLIS TraceV2** from ``blis observe --trace-header X.yaml --trace-data X.csv``
  (:mod:`bayes_latency.data.client.tracev2`): the header YAML and the data CSV of the same stem.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from bayes_latency.data.client.frames import _empty_requests, plausibility_notes, summary_frame
from bayes_latency.data.report import IngestReport
from bayes_latency.errors import TraceFormatError
from bayes_latency.textfiles import (
    TextEncodingError,
    check_text_start,
    load_yaml,
    read_text,
    refuse_special,
)

__all__ = ["ACCEPTED_FORMATS", "add_folder_client_results", "read_client_results"]

ACCEPTED_FORMATS = (
    "accepted client result formats: (1) an inference-perf results folder "
    "(results/summary_lifecycle_metrics.json, results/stage_<N>_lifecycle_metrics.json) or one "
    "such JSON; (2) a `vllm bench serve --save-result` JSON (object with 'completed', "
    "'duration', 'mean_ttft_ms', ...; per-request lists with --save-detailed; JSON lines with "
    "--append-result); (3) a BLIS TraceV2 pair from `blis observe`: header YAML "
    "(trace_version, time_unit, mode, ...) and data CSV of the same stem (X.yaml + X.csv)")


# ---------------------------------------------------------------------------------------------
# Recognising formats
# ---------------------------------------------------------------------------------------------

def _first_json_object(path: Path) -> Any:
    """The document of a JSON file, or its first line's when it holds JSON lines; None if not JSON."""
    try:
        text = read_text(path)
    except (OSError, TextEncodingError):
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


#: What to record instead of another tool's result (the formats :data:`ACCEPTED_FORMATS` lists).
RERUN_HINT = ("record the load with `vllm bench serve --save-result --save-detailed "
              "--percentile-metrics ttft,tpot,itl,e2el` (or inference-perf, or `blis observe`)")


def other_tool(doc: Any) -> str | None:
    """The benchmark tool whose result ``doc`` (a parsed JSON document) looks like, when it is
    one this package does not read: genai-perf, SGLang's bench_serving, LLMPerf, GuideLLM."""
    if isinstance(doc, list) and doc and isinstance(doc[0], dict):
        doc = doc[0]
    if not isinstance(doc, dict):
        return None
    keys = set(doc)
    if {"request_latency", "time_to_first_token"} <= keys or "input_config" in keys \
            and isinstance(doc.get("request_throughput"), dict):
        return "a genai-perf profile export (request_latency, time_to_first_token, ...)"
    if "mean_e2e_latency_ms" in keys and "mean_e2el_ms" not in keys:
        return ("an SGLang bench_serving result (mean_e2e_latency_ms; its fields are not "
                "vllm bench serve's)")
    if any(k.startswith("results_") for k in keys) and ("num_concurrent_requests" in keys
                                                        or "results_ttft_s_mean" in keys):
        return "an LLMPerf summary (results_ttft_s_mean, results_end_to_end_latency_s_mean, ...)"
    bench = doc.get("benchmarks")
    if isinstance(bench, list) and bench and isinstance(bench[0], dict) \
            and ("metrics" in bench[0] or "type_" in bench[0]):
        return "a GuideLLM benchmarks report (benchmarks[].metrics)"
    return None


def _is_lifecycle_doc(doc: Any) -> bool:
    return isinstance(doc, dict) and bool({"load_summary", "successes"} & set(doc))


def _is_vllm_doc(doc: Any) -> bool:
    from bayes_latency.data.client.vllm_bench import looks_like_vllm_bench

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
        doc = load_yaml(read_text(path))
    except (OSError, TextEncodingError, yaml.YAMLError):
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
        from bayes_latency.data.client.tracev2 import read_tracev2

        return read_tracev2(path, experiment_id=experiment_id)
    if suffix == ".csv":
        header = _tracev2_header_of(path)
        if header is None:
            raise TraceFormatError(f"a CSV without a TraceV2 header YAML of the same stem "
                                   f"({path.with_suffix('.yaml').name}); {ACCEPTED_FORMATS}",
                                   file=str(path))
        from bayes_latency.data.client.tracev2 import read_tracev2

        return read_tracev2(header, path, experiment_id=experiment_id)
    check_text_start(path, "client result", TraceFormatError)
    doc = _first_json_object(path)
    if doc is None:
        raise TraceFormatError(f"not JSON, YAML or CSV; {ACCEPTED_FORMATS}", file=str(path))
    tool = other_tool(doc)
    if tool is not None:
        raise TraceFormatError(f"{tool}, a format bayes-latency does not read; {RERUN_HINT}",
                               file=str(path))
    if _is_vllm_doc(doc):
        from bayes_latency.data.client.vllm_bench import read_vllm_bench

        return read_vllm_bench(path, experiment_id=experiment_id)
    if _is_lifecycle_doc(doc):
        from bayes_latency.data.client.lifecycle import _STAGE_RE, read_lifecycle_file

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
    return head.lstrip("\ufeff \t\r\n").startswith("{") and '"completed"' in head


def _folder_sources(folder: Path) -> tuple[bool, list[Path], list[Path]]:
    """(has inference-perf results, vllm bench JSONs, TraceV2 headers) of a folder."""
    from bayes_latency.data.client.lifecycle import _STAGE_RE

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
        ``lifecycle`` (:data:`.frames.CLIENT_SUMMARY_COLUMNS`) and ``client_requests``
        (:data:`.frames.CLIENT_REQUEST_COLUMNS`, empty when no input has per-request data).
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
        out, report = _read_one_file(path, experiment_id)
        report.notes.extend(plausibility_notes(out["lifecycle"], str(path)))
        return out, report
    if not path.is_dir():
        refuse_special(path, "client result", TraceFormatError)
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
        from bayes_latency.data.client.lifecycle import read_lifecycle_dir

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
    report.notes.extend(plausibility_notes(out["lifecycle"], str(path)))
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
