"""Readers of inference-perf results: lifecycle metrics, ``exp-config.yaml`` and ``profile.yaml``.

Format: ``shared/specs/vllm-trace-format.md`` section 8. ``results/summary_lifecycle_metrics.json``
and ``results/stage_<N>_lifecycle_metrics.json`` hold, per run and per load stage, distributions
``{mean, min, p0.1, ..., median, ..., p90, p95, p99, p99.9, max}`` (seconds / tokens; null when
the count is 0) of the request latency (E2E), TTFT, TPOT, normalised TPOT and ITL, plus counts,
rates and prompt / output length distributions.

Per-token fields: in the real runs the client logged about two timestamps per generated token, so
``time_per_output_token`` and ``inter_token_latency`` are about half the real decode interval. The
column ``decode_interval_s = (mean E2E - mean TTFT) / (mean output length - 1)`` is the mean decode
interval per token that does not suffer from it (NaN when the mean output length is <= 1).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from bayes_latency.data.report import IngestReport
from bayes_latency.errors import TraceFormatError
from bayes_latency.textfiles import load_yaml, read_text

__all__ = ["LIFECYCLE_COLUMNS", "METRICS", "STATS", "read_lifecycle_dir", "read_lifecycle_file",
           "WORKLOAD_SPEC_FORMATS", "read_exp_config", "read_profile",
           "read_workload_spec", "workload_spec_fields"]

#: Short metric name -> key under ``successes.latency``.
METRICS: dict[str, str] = {
    "ttft": "time_to_first_token",
    "e2e": "request_latency",
    "tpot": "time_per_output_token",
    "itl": "inter_token_latency",
    "ntpot": "normalized_time_per_output_token",
}
#: Statistic column suffix -> key of the distribution.
STATS: dict[str, str] = {"mean": "mean", "median": "median", "p90": "p90", "p99": "p99"}

#: Columns of the lifecycle table.
LIFECYCLE_COLUMNS: tuple[str, ...] = (
    ("experiment_id", "stage", "stage_index", "model", "tp", "count", "successes", "failures",
     "requested_rate", "achieved_rate", "send_duration_s", "schedule_delay_mean_s")
    + tuple(f"{m}_{s}_s" for m in METRICS for s in STATS)
    + ("prompt_len_mean", "output_len_mean", "input_tokens_per_sec", "output_tokens_per_sec",
       "requests_per_sec", "failure_latency_mean_s", "decode_interval_s")
)
_STAGE_RE = re.compile(r"^stage_(\d+)_lifecycle_metrics\.json$")


_MISSING = object()


def _raw(d: Any, *keys: str) -> Any:
    """``d[k1][k2]...``; ``_MISSING`` when a level is absent or null; the offending value when
    a level that should be an object is something else (e.g. ``"request_latency": "fast"``)."""
    for k in keys:
        if d is None:
            return _MISSING
        if not isinstance(d, dict):
            return d
        if k not in d:
            return _MISSING
        d = d[k]
    return d


def _section_of(d: Any, doc: dict) -> str:
    """``"<section>."`` of the top-level section ``d`` of ``doc`` (for counter names)."""
    for name in ("load_summary", "successes", "failures"):
        if doc.get(name) is d:
            return f"{name}."
    return ""


def _number(d: Any, *keys: str) -> float:
    """``d[k1][k2]...`` as a finite float, NaN if absent, null or not a number."""
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return math.nan
        d = d[k]
    if isinstance(d, bool) or not isinstance(d, (int, float)):
        return math.nan
    try:
        v = float(d)
    except OverflowError:
        return math.nan
    return v if math.isfinite(v) else math.nan


def _load_json(path: Path) -> Any:
    try:
        return json.loads(read_text(path, "lifecycle metrics", TraceFormatError))
    except OSError as exc:
        raise TraceFormatError(f"cannot read: {exc}", file=str(path)) from exc
    except (ValueError, RecursionError) as exc:
        raise TraceFormatError(f"not valid JSON: {exc}", file=str(path)) from exc


def read_lifecycle_file(path: str | Path, experiment_id: str = "", stage: str = "summary",
                        report: IngestReport | None = None) -> dict[str, Any]:
    """One row (dict of :data:`LIFECYCLE_COLUMNS` except model / tp) from a lifecycle JSON file.

    Raises
    ------
    TraceFormatError
        If the file cannot be read, is not JSON, is not an object or has neither
        ``load_summary`` nor ``successes``.
    """
    path = Path(path)
    doc = _load_json(path)
    if not isinstance(doc, dict) or not ({"load_summary", "successes"} & set(doc)):
        raise TraceFormatError("not a lifecycle metrics object (no load_summary / successes)",
                               file=str(path))
    if report is not None:
        for section in ("load_summary", "successes", "failures"):
            if not isinstance(doc.get(section), dict):
                report.notes.append(f"{path.name}: section {section!r} missing")
                if section != "failures":  # a run without failures may omit the section
                    report.drop(f"lifecycle:missing_section:{section}")

    def _num(d: Any, *keys: str) -> float:
        """The value as a finite float >= 0; NaN when absent / null, or (counted) invalid."""
        v = _number(d, *keys)
        if math.isnan(v) or (v < 0 and keys[0] != "schedule_delay"):  # delays may be < 0
            raw = _raw(d, *keys)
            if raw is not None and raw is not _MISSING:  # present but unusable
                if report is not None:
                    report.drop_at(f"lifecycle:bad_value:{_section_of(d, doc)}{'.'.join(keys)}",
                                   f"{path.name}: {raw!r}")
                return math.nan
        return v

    ls, su, fa = doc.get("load_summary"), doc.get("successes"), doc.get("failures")
    row: dict[str, Any] = {
        "experiment_id": experiment_id,
        "stage": stage,
        "stage_index": None if stage == "summary" else int(stage),
        "count": _num(ls, "count"),
        "successes": _num(su, "count"),
        "failures": _num(fa, "count"),
        "requested_rate": _num(ls, "requested_rate"),
        "achieved_rate": _num(ls, "achieved_rate"),
        "send_duration_s": _num(ls, "send_duration"),
        "schedule_delay_mean_s": _num(ls, "schedule_delay", "mean"),
    }
    lat = su.get("latency") if isinstance(su, dict) else None
    for m, key in METRICS.items():
        for s, skey in STATS.items():
            row[f"{m}_{s}_s"] = _num(lat, key, skey)
    row["prompt_len_mean"] = _num(su, "prompt_len", "mean")
    row["output_len_mean"] = _num(su, "output_len", "mean")
    row["input_tokens_per_sec"] = _num(su, "throughput", "input_tokens_per_sec")
    row["output_tokens_per_sec"] = _num(su, "throughput", "output_tokens_per_sec")
    row["requests_per_sec"] = _num(su, "throughput", "requests_per_sec")
    row["failure_latency_mean_s"] = _num(fa, "request_latency", "mean")
    out_len = row["output_len_mean"]
    row["decode_interval_s"] = (
        (row["e2e_mean_s"] - row["ttft_mean_s"]) / (out_len - 1.0)
        if out_len > 1.0 else math.nan)
    if row["decode_interval_s"] < 0:  # mean E2E below mean TTFT: the file contradicts itself
        row["decode_interval_s"] = math.nan
        if report is not None:
            report.drop_at("lifecycle:bad_value:decode_interval", f"{path.name}: E2E < TTFT")
    return row


def read_lifecycle_dir(exp_dir: str | Path, experiment_id: str | None = None
                       ) -> tuple[pd.DataFrame, IngestReport]:
    """Read the summary and per-stage lifecycle metrics of one inference-perf run.

    Parameters
    ----------
    exp_dir
        Experiment folder holding ``results/`` (or the ``results`` folder itself).
        ``exp-config.yaml`` next to ``results/`` is used, when present, for ``model`` and ``tp``.
    experiment_id
        Value of the ``experiment_id`` column (default: the experiment folder name).

    Returns
    -------
    (pandas.DataFrame, IngestReport)
        One row per (experiment_id, stage), summary first then stages 0, 1, ...; columns
        :data:`LIFECYCLE_COLUMNS`: ``stage`` is text (``"summary"``, ``"0"``, ``"1"`` ...) and
        ``stage_index`` nullable Int64 (NA for the summary); counts and rates as floats
        (``requested_rate`` / ``achieved_rate`` only exist for stages); for each metric in
        :data:`METRICS` (``ttft, e2e, tpot, itl, ntpot``) ``<m>_mean_s, <m>_median_s, <m>_p90_s,
        <m>_p99_s`` in seconds (NaN when the file has no successes); ``decode_interval_s``.
        A stage file that cannot be parsed is skipped and counted ``bad_file``.

    Raises
    ------
    TraceFormatError
        If the folder has no lifecycle file at all, or none that can be read.
    """
    exp_dir = Path(exp_dir)
    results = exp_dir / "results" if (exp_dir / "results").is_dir() else exp_dir
    root = exp_dir if results != exp_dir else exp_dir.parent
    if experiment_id is None:
        experiment_id = (exp_dir if results != exp_dir else exp_dir.parent).name
    report = IngestReport(source=str(exp_dir))
    if not results.is_dir():
        raise TraceFormatError("no results folder", file=str(exp_dir))
    files: list[tuple[str, Path]] = []
    summary = results / "summary_lifecycle_metrics.json"
    if summary.exists():
        files.append(("summary", summary))
    stages = []
    for p in results.iterdir():
        m = _STAGE_RE.match(p.name)
        if m:
            stages.append((int(m.group(1)), p))
    files.extend((str(i), p) for i, p in sorted(stages))
    if not files:
        raise TraceFormatError("no summary_/stage_N_lifecycle_metrics.json files",
                               file=str(results))
    model, tp = None, None
    cfg_path = root / "exp-config.yaml"
    if cfg_path.exists():
        try:
            cfg = read_exp_config(cfg_path)
            model, tp = cfg.get("model"), cfg.get("tp")
        except TraceFormatError as exc:
            report.drop("bad_file")
            report.notes.append(f"exp-config.yaml ignored: {exc}")
    rows = []
    for stage, path in files:
        report.read["files"] += 1
        try:
            row = read_lifecycle_file(path, experiment_id=experiment_id, stage=stage,
                                      report=report)
        except TraceFormatError as exc:
            report.drop_record("lifecycle", "bad_file")
            report.notes.append(str(exc))
            continue
        row["model"], row["tp"] = model, tp
        rows.append(row)
    if not rows:
        raise TraceFormatError("no readable lifecycle metrics file", file=str(results))
    # one constructor over typed columns (assigning ~35 converted columns one by one took
    # 6 ms per experiment, more than reading the files)
    cols: dict[str, Any] = {}
    for c in LIFECYCLE_COLUMNS:
        vals = [r.get(c) for r in rows]
        if c == "stage":
            cols[c] = pd.Series(vals, dtype=object).astype("str")
        elif c in ("stage_index", "tp"):
            cols[c] = pd.array(vals, dtype="Int64")
        elif c == "model":
            cols[c] = pd.Series(vals, dtype=object)
        elif c == "experiment_id":
            cols[c] = pd.Series(vals)
        else:
            cols[c] = np.array([np.nan if v is None else v for v in vals], dtype=np.float64)
    df = pd.DataFrame(cols)
    report.kept["lifecycle_rows"] += len(df)
    return df, report


def _load_yaml(path: Path) -> Any:
    try:
        return load_yaml(read_text(path, "YAML file", TraceFormatError))
    except OSError as exc:
        raise TraceFormatError(f"cannot read: {exc}", file=str(path)) from exc
    except yaml.YAMLError as exc:
        raise TraceFormatError(f"not valid YAML: {exc}", file=str(path)) from exc


def _pos_int(value: Any, path: Path, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value != int(value) or value <= 0:
        raise TraceFormatError(f"expected a positive integer, got {value!r}", file=str(path),
                               field=field)
    return int(value)


def _pos_num(value: Any, path: Path, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
            or not math.isfinite(value):
        raise TraceFormatError(f"expected a positive number, got {value!r}", file=str(path),
                               field=field)
    return float(value)


def read_exp_config(path: str | Path) -> dict[str, Any]:
    """Read an ``exp-config.yaml`` (server settings of a run).

    Returns
    -------
    dict
        All keys of the file, plus normalised ``model`` (str), ``tp`` (from
        ``tensor_parallelism``, default 1) and, when present, ``max_model_len``,
        ``max_num_batched_tokens``, ``max_num_seqs`` as ints.

    Raises
    ------
    TraceFormatError
        If unreadable, not a mapping, without ``model``, or with a non-positive-integer knob
        (names the field).
    """
    path = Path(path)
    doc = _load_yaml(path)
    if not isinstance(doc, dict):
        raise TraceFormatError("expected a mapping", file=str(path))
    out = dict(doc)
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise TraceFormatError("missing or invalid model", file=str(path), field="model")
    out["model"] = model
    tp = doc.get("tensor_parallelism", doc.get("tp", 1))
    out["tp"] = _pos_int(tp, path, "tensor_parallelism")
    for k in ("max_model_len", "max_num_batched_tokens", "max_num_seqs"):
        if k in doc:
            out[k] = _pos_int(doc[k], path, k)
    return out


def read_profile(path: str | Path) -> dict[str, Any]:
    """Read an inference-perf ``profile.yaml`` (shared-prefix workload, constant-rate stages).

    Returns
    -------
    dict
        ``system_prompt_len, question_len, output_len, num_groups`` (unique system prompts),
        ``users_per_group`` (users per system prompt), ``stages`` (list of ``(rate, duration_s)``
        tuples), and ``data_type``, ``load_type``, ``streaming``, ``api_type``, ``ignore_eos``,
        ``model_name``, ``multi_turn`` when present (else None).

    Raises
    ------
    TraceFormatError
        If unreadable, not a mapping, not a shared-prefix workload, or a required field is
        missing / invalid (the error names it, e.g. ``data.shared_prefix.output_len``).
    """
    path = Path(path)
    doc = _load_yaml(path)
    if not isinstance(doc, dict):
        raise TraceFormatError("expected a mapping", file=str(path))
    return _profile_fields(doc, path)


def _profile_fields(doc: dict[str, Any], path: Path) -> dict[str, Any]:
    """:func:`read_profile`'s fields of a parsed inference-perf profile document."""
    data = doc.get("data")
    load = doc.get("load")
    out = _shape_and_stages(data.get("shared_prefix") if isinstance(data, dict) else None,
                            load.get("stages") if isinstance(load, dict) else None, path,
                            "data.shared_prefix", "load.stages")
    api = doc.get("api") if isinstance(doc.get("api"), dict) else {}
    server = doc.get("server") if isinstance(doc.get("server"), dict) else {}
    out["data_type"] = data.get("type")
    out["load_type"] = load.get("type")
    out["streaming"] = api.get("streaming")
    out["api_type"] = api.get("type")
    out["ignore_eos"] = server.get("ignore_eos")
    out["model_name"] = server.get("model_name")
    return out


def _shape_and_stages(sp: Any, stages: Any, path: Path, sp_where: str,
                      stages_where: str) -> dict[str, Any]:
    """The prompt shape of a ``shared_prefix`` mapping, its ``multi_turn`` flag and the
    ``stages`` (``sp_where`` and ``stages_where`` name them in errors)."""
    if not isinstance(sp, dict):
        raise TraceFormatError("no shared_prefix workload", file=str(path), field=sp_where)
    out = _shared_prefix(sp, path, sp_where)
    out["stages"] = _stages(stages, path, stages_where)
    out["multi_turn"] = sp.get("enable_multi_turn_chat")
    return out


def _shared_prefix(sp: dict[str, Any], path: Path, where: str) -> dict[str, Any]:
    """The prompt shape of a ``shared_prefix`` mapping (``where`` names it in errors)."""
    out: dict[str, Any] = {}
    for name, key in (("system_prompt_len", "system_prompt_len"),
                      ("question_len", "question_len"), ("output_len", "output_len"),
                      ("num_groups", "num_unique_system_prompts"),
                      ("users_per_group", "num_users_per_system_prompt")):
        out[name] = _pos_int(sp.get(key), path, f"{where}.{key}")
    return out


def _stages(stages: Any, path: Path, where: str) -> list[tuple[float, float]]:
    """``(rate, duration_s)`` of each constant-rate load stage of ``stages``."""
    if not isinstance(stages, list) or not stages:
        raise TraceFormatError("no load stages", file=str(path), field=where)
    out = []
    for i, st in enumerate(stages):
        if not isinstance(st, dict):
            raise TraceFormatError("stage is not a mapping", file=str(path),
                                   field=f"{where}[{i}]")
        out.append((_pos_num(st.get("rate"), path, f"{where}[{i}].rate"),
                    _pos_num(st.get("duration"), path, f"{where}[{i}].duration")))
    return out


#: The workload specs :func:`read_workload_spec` reads.
WORKLOAD_SPEC_FORMATS = (
    "an inference-perf profile (data.shared_prefix, load.stages) or a BLIS workload spec with "
    "an inference_perf section (inference_perf.shared_prefix, inference_perf.stages)")


def read_workload_spec(path: str | Path) -> dict[str, Any]:
    """Read a workload spec: what a load generator or BLIS is told to send, no measurement.

    Two formats (:data:`WORKLOAD_SPEC_FORMATS`): an inference-perf ``profile.yaml`` (read as
    :func:`read_profile` reads it) and a BLIS workload spec whose ``inference_perf:`` section
    holds the same fields (``stages``, ``shared_prefix``: what BLIS's ``InferencePerfSpec``
    reads, ``sim/workload/inference_perf.go``). A BLIS spec of explicit ``clients`` is refused
    (its arrival and length distributions are not read here).

    Returns
    -------
    dict
        :func:`read_profile`'s ``system_prompt_len, question_len, output_len, num_groups,
        users_per_group, stages, multi_turn``, plus ``format`` (``"inference-perf profile"`` or
        ``"BLIS inference_perf spec"``).

    Raises
    ------
    TraceFormatError
        Unreadable, not a mapping, neither format, or a field missing or invalid (named, e.g.
        ``inference_perf.stages[1].rate``).
    """
    path = Path(path)
    return workload_spec_fields(_load_yaml(path), path)


def workload_spec_fields(doc: Any, path: str | Path) -> dict[str, Any]:
    """:func:`read_workload_spec`'s fields of a document already parsed from ``path`` (named in
    errors)."""
    path = Path(path)
    if not isinstance(doc, dict):
        raise TraceFormatError(f"expected a mapping ({WORKLOAD_SPEC_FORMATS})", file=str(path))
    if "inference_perf" in doc:
        sec = doc["inference_perf"]
        if not isinstance(sec, dict):
            raise TraceFormatError("expected a mapping", file=str(path), field="inference_perf")
        out = _shape_and_stages(sec.get("shared_prefix"), sec.get("stages"), path,
                                "inference_perf.shared_prefix", "inference_perf.stages")
        out["format"] = "BLIS inference_perf spec"
        return out
    if "clients" in doc:
        raise TraceFormatError(
            "a BLIS workload spec of explicit clients is not read (its arrival and length "
            f"distributions are BLIS's own); give {WORKLOAD_SPEC_FORMATS}, or a client result",
            file=str(path), field="clients")
    if not (isinstance(doc.get("data"), dict) and isinstance(doc.get("load"), dict)):
        raise TraceFormatError(f"not a workload spec: expected {WORKLOAD_SPEC_FORMATS}",
                               file=str(path))
    out = _profile_fields(doc, path)
    out["format"] = "inference-perf profile"
    return out
