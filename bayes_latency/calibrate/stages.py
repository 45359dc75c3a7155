"""Client results -> :class:`~bayes_latency.schedule.replay.ClientStage` s: what a replay needs.

:func:`client_stages` turns the tables of :func:`~bayes_latency.data.client.read.read_client_results`
(any accepted format) into the load stages that :mod:`bayes_latency.calibrate.loop` replays:

- **per-request records** (``vllm bench serve --save-detailed``, TraceV2): one stage per run
  with the recorded requests as they reached the server (the send time; the arrival time when
  no send time is recorded), their prompt and output tokens; the measured means are those of
  the successful requests, which are the ones replayed (a failed request's load is unknown);
- **summaries only** (inference-perf stages, ``vllm bench serve --save-result`` without the
  per-request lists): one stage per load stage (or per run) with its rate, request count, mean
  prompt length and output-length distribution (inference-perf's quantiles rebuilt by
  :func:`empirical_pdf`, or the profile's ``output_len`` when it sets ``ignore_eos``:
  :func:`generated_output_pdf`; vLLM's summary has only the mean, a point mass). ``request_rate: inf``
  sends every request at t = 0; a finite rate gives Poisson arrivals (``burstiness`` 1) or gamma
  arrivals of shape ``burstiness`` (vLLM's definition; ``inf``: evenly spaced).

A closed-loop run (``max_concurrency`` set) without per-request send times cannot be replayed
open-loop: the client's sends depend on the server's speed. It is refused with an error naming
the field (rerun with ``--save-detailed``). inference-perf's shared-prefix prompt shape comes
from the folder's ``profile.yaml`` when present.

A replay's memory and time grow with its requests (and their tokens): a stage of more than
:data:`MAX_REPLAY_REQUESTS` requests is replayed as its first :data:`MAX_REPLAY_REQUESTS`, and a
note says so. Recorded requests: the first by send time, a contiguous window that keeps the
load's arrival process, with the measured means taken over the same requests; drawn requests:
the first of the same arrival process (the stage's means are those of a stationary load).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bayes_latency.data.client.frames import MAX_PLAUSIBLE_LATENCY_S
from bayes_latency.errors import ConfigError, TraceFormatError
from bayes_latency.schedule.replay import ClientStage, stratified_lengths
from bayes_latency.textfiles import read_text, refuse_special

__all__ = ["MAX_REPLAY_REQUESTS", "QUANTILE_LEVELS", "check_client_report", "client_stages", "default_kv_blocks", "empirical_pdf",
           "generated_output_len", "generated_output_pdf", "pdf_mean",
           "spec_stages", "stages_table"]

#: Quantile levels of inference-perf distributions, key -> level.
QUANTILE_LEVELS: dict[str, float] = {
    "min": 0.0, "p0.1": 0.001, "p1": 0.01, "p5": 0.05, "p10": 0.10, "p25": 0.25,
    "median": 0.50, "p75": 0.75, "p90": 0.90, "p95": 0.95, "p99": 0.99, "p99.9": 0.999,
    "max": 1.0,
}


def empirical_pdf(dist: Mapping[str, Any], min_tokens: int = 1) -> dict[int, float]:
    """An integer length distribution rebuilt from inference-perf quantiles and mean.

    The mass between two consecutive quantile levels (e.g. 0.25 between ``p25`` and ``median``)
    is spread evenly over the integers between the two quantile values (a point mass when they
    are equal), so the CDF is piecewise linear through every reported quantile. Lengths below
    ``min_tokens`` are raised to it (BLIS generates at least one token). When ``dist`` has a
    ``mean`` inside ``(min, max)``, the distribution is then exponentially tilted
    (``p_k * exp(theta * k)``, the closest distribution in KL) so that its mean equals it; the
    piecewise-uniform version alone is 0-3% below the real means (the Llama-2-7B runs' long
    low tails).

    Raises
    ------
    TraceFormatError
        When fewer than two quantiles are present or they decrease.
    """
    pts = []
    for key, level in QUANTILE_LEVELS.items():
        v = dist.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            pts.append((level, float(v)))
    if len(pts) < 2:
        raise TraceFormatError("output_len has fewer than two quantiles", field="output_len")
    pdf: dict[int, float] = {}
    for (l0, v0), (l1, v1) in zip(pts, pts[1:], strict=False):
        if v1 < v0 - 1e-9:
            raise TraceFormatError(f"output_len quantiles decrease ({v0} -> {v1})",
                                   field="output_len")
        mass = l1 - l0
        if mass <= 0:
            continue
        lo, hi = max(int(round(v0)), min_tokens), max(int(round(v1)), min_tokens)
        n = hi - lo + 1
        for t in range(lo, hi + 1):
            pdf[t] = pdf.get(t, 0.0) + mass / n
    keys = np.array(sorted(pdf), dtype=float)
    probs = np.array([pdf[int(k)] for k in keys])
    probs /= probs.sum()
    target = dist.get("mean")
    if isinstance(target, (int, float)) and not isinstance(target, bool) \
            and keys[0] < target < keys[-1]:
        probs = _tilt(keys, probs, float(target))
    return {int(k): float(p) for k, p in zip(keys, probs, strict=True)}


def _tilt(keys: np.ndarray, probs: np.ndarray, target: float) -> np.ndarray:
    """``probs * exp(theta * keys)`` normalised, with ``theta`` such that the mean is ``target``."""
    z = (keys - keys.mean()) / (keys.max() - keys.min())

    def tilted(theta: float) -> np.ndarray:
        w = np.log(probs) + theta * z
        w = np.exp(w - w.max())
        return w / w.sum()

    lo, hi = -200.0, 200.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if float(tilted(mid) @ keys) < target:
            lo = mid
        else:
            hi = mid
    return tilted(0.5 * (lo + hi))


def pdf_mean(pdf: Mapping[int, float]) -> float:
    """Mean of a ``{value: probability}`` distribution."""
    return float(sum(k * p for k, p in pdf.items()) / sum(pdf.values()))


def generated_output_pdf(measured: Mapping[str, Any], profile: Mapping[str, Any] | None
                         ) -> tuple[dict[int, float], bool]:
    """The output lengths the server generated in an inference-perf stage.

    inference-perf counts a request's output tokens by tokenizing the text it received
    (``successes.output_len``). With ``server.ignore_eos: true`` in the profile, vLLM generates
    exactly ``max_tokens`` (the profile's ``data.shared_prefix.output_len``) for every request,
    but the tokens a model emits after its end-of-sequence token decode to little or no text,
    so the client counts fewer: the real Llama-2-7B runs count a mean of 194-210 tokens (10% of
    requests 26-64 or fewer) where 247-251 were generated. Their latencies show it: E2E's p10 is
    within 6-11% of its median (1.69 vs 1.80 s, codegen stage 0), where a request of 26 decode
    steps at the stage's 7.3 ms interval would take about 0.2 s. A replay of the client's
    counts runs ~20% too few decode steps, and a fit reads the missing time as host overhead.

    Parameters
    ----------
    measured
        The stage's ``successes.output_len`` quantiles and mean (:func:`empirical_pdf`).
    profile
        :func:`~bayes_latency.data.client.lifecycle.read_profile`'s fields, or None.

    Returns
    -------
    (pdf, generated)
        ``({output_len: 1.0}, True)`` under ``ignore_eos: true``; else the measured lengths'
        :func:`empirical_pdf` and False.
    """
    n = generated_output_len(profile)
    if n is not None:
        return {n: 1.0}, True
    return empirical_pdf(measured), False


def generated_output_len(profile: Mapping[str, Any] | None) -> int | None:
    """The output tokens every request of an inference-perf profile generated: its
    ``output_len`` when it sets ``ignore_eos: true`` (:func:`generated_output_pdf`), else None
    (the model's end-of-sequence token ends a request; the client's counts are the lengths)."""
    if profile is not None and profile.get("ignore_eos") is True \
            and isinstance(profile.get("output_len"), int) and profile["output_len"] >= 1:
        return int(profile["output_len"])
    return None



# ---------------------------------------------------------------------------------------------
# KV blocks
# ---------------------------------------------------------------------------------------------

def model_config_dict(model: str | Path) -> dict[str, Any]:
    """The Hugging Face ``config.json`` of a shipped model name or a config path (parsed)."""
    from bayes_latency.errors import UnknownArchitectureError
    from bayes_latency.physics.models import MODELS_DIR, known_architectures, resolve_name

    short = resolve_name(str(model))
    path = MODELS_DIR / f"{short}.json" if short is not None else Path(str(model)).expanduser()
    if path.is_dir():
        path = path / "config.json"
    refuse_special(path, "config.json", UnknownArchitectureError)
    if not path.is_file():
        raise UnknownArchitectureError(
            f"unknown model {str(model)!r}: not a known name and not a config.json path; "
            f"known: {', '.join(known_architectures())}")
    try:
        doc = json.loads(read_text(path, "config.json", UnknownArchitectureError))
    except (OSError, ValueError) as exc:
        raise UnknownArchitectureError(f"{path}: cannot read config.json: {exc}") from None
    if not isinstance(doc, dict):
        raise UnknownArchitectureError(f"{path}: config.json is not an object")
    return doc


def default_kv_blocks(model: str | Path, gpu: str, tp: int, block_size: int = 16,
                      gpu_memory_utilization: float = 0.9) -> int:
    """KV-cache blocks of one GPU as BLIS computes them (:func:`bayes_latency.physics.blis.
    kv_blocks_per_gpu`) from the model's ``config.json`` and the GPU's memory (whole GiB)."""
    from bayes_latency.physics.blis import kv_blocks_per_gpu
    from bayes_latency.physics.hardware import load_gpu

    mem_gib = float(round(load_gpu(gpu).memory_bytes / (1 << 30)))
    return kv_blocks_per_gpu(model_config_dict(model), int(tp), memory_gib=mem_gib,
                             gpu_memory_utilization=gpu_memory_utilization,
                             block_size=block_size)


# ---------------------------------------------------------------------------------------------
# stages
# ---------------------------------------------------------------------------------------------

def _finite(v: Any) -> bool:
    try:
        return v is not None and not pd.isna(v) and math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def _observed(ttft_s: float, e2e_s: float, out_mean: float, where: str) -> dict[str, float]:
    """The measured means a calibration fits (µs); both TTFT and E2E are needed (E2E anchors the
    scale of the coefficients, TTFT splits it between prefill and decode)."""
    for name, v, field, metric in (("TTFT", ttft_s, "ttft_mean_s; vLLM: mean_ttft_ms", "ttft"),
                                   ("E2E", e2e_s, "e2e_mean_s; vLLM: mean_e2el_ms", "e2el")):
        if not (_finite(v) and float(v) > 0):
            raise ConfigError(
                f"{where}: no mean {name} of successful requests (field {field}, got {v!r}); a "
                f"calibration needs both the TTFT and E2E means: `vllm bench serve` records "
                f"mean_{metric}_ms only for the metrics of --percentile-metrics (default "
                f"ttft,tpot,itl): rerun with --percentile-metrics ttft,tpot,itl,e2el, or with "
                f"--save-detailed (the per-request latencies give both)")
        if float(v) > MAX_PLAUSIBLE_LATENCY_S:
            raise ConfigError(f"{where}: implausible mean {name} {float(v):.6g} s (field {field}; "
                              f"above {MAX_PLAUSIBLE_LATENCY_S:g} s, which no LLM server "
                              f"produces): check the field's unit; nothing to calibrate on")
    if float(e2e_s) < float(ttft_s):
        raise ConfigError(f"{where}: mean E2E {float(e2e_s) * 1e3:.6g} ms below mean TTFT "
                          f"{float(ttft_s) * 1e3:.6g} ms: a request ends after its first token; "
                          f"check the result's fields (ttft / e2el, their units)")
    return {"ttft_mean_us": float(ttft_s) * 1e6, "e2e_mean_us": float(e2e_s) * 1e6,
            "output_len_mean": float(out_mean) if _finite(out_mean) else math.nan}


def check_client_report(report: Any, source: str | Path) -> None:
    """Refuse client results whose per-request records were all dropped.

    A result that lists requests, none of them kept, would otherwise fall back to its summary
    means, which describe those same (malformed) requests.

    Raises
    ------
    ConfigError
        Naming the file and the drop counts.
    """
    read = int(report.read.get("requests", 0))
    kept = int(report.kept.get("requests_ok", 0)) + int(report.kept.get("requests_failed", 0))
    if read > 0 and kept == 0:
        drops = ", ".join(f"{k}={v}" for k, v in sorted(report.dropped.items()) if v)
        raise ConfigError(f"{source}: all {read} per-request record(s) were dropped "
                          f"({drops or 'no reason counted'}): nothing to calibrate on")


def _stage_files(path: Path | None) -> tuple[Path | None, dict[str, Any] | None]:
    """(results folder, profile) of an inference-perf folder, when ``path`` is one."""
    if path is None:
        return None, None
    path = Path(path)
    root = path if path.is_dir() else (path.parent.parent if path.parent.name == "results"
                                       else path.parent)
    results = root / "results" if (root / "results").is_dir() else root
    profile = None
    if (root / "profile.yaml").is_file():
        from bayes_latency.data.client.lifecycle import read_profile

        try:
            profile = read_profile(root / "profile.yaml")
        except TraceFormatError:
            profile = None        # not a shared-prefix profile: distinct prompts
    return results, profile


def _inference_perf_pdf(results: Path | None, stage: str, profile: Mapping[str, Any] | None
                        ) -> dict[int, float] | None:
    """:func:`generated_output_pdf` of an inference-perf stage (or summary) file, when
    readable."""
    if results is None:
        return None
    name = "summary_lifecycle_metrics.json" if stage == "summary" \
        else f"stage_{stage}_lifecycle_metrics.json"
    f = results / name
    if not f.is_file():
        return None
    try:
        doc = json.loads(f.read_text(encoding="utf-8"))
        return generated_output_pdf((doc.get("successes") or {}).get("output_len") or {},
                                    profile)[0]
    except (OSError, ValueError, TraceFormatError, AttributeError):
        return None


#: Most requests of one stage a replay simulates (see the module docstring). A calibration of
#: one 20,000-request ``--save-detailed`` result (prompts ~550, outputs ~125 tokens, llama-2-7b
#: H100) peaks at 0.98 GB and takes 37 s; 1,000,000 requests do not fit in memory.
MAX_REPLAY_REQUESTS = 20_000


#: Longest span of a stage's send times (s) a replay takes (a week); with the run's recorded
#: duration, the sends must also fit in it (plus :data:`SEND_SPAN_SLACK`).
MAX_SEND_SPAN_S = 7 * 86400.0
#: Relative and absolute slack of the send times' span over the run's recorded duration.
SEND_SPAN_SLACK = (0.1, 1.0)


def _check_send_span(eid: str, t: np.ndarray, duration: float | None) -> None:
    """Refuse send times that span more than the run lasted (a clock that jumped)."""
    span = float(t.max() - t.min())
    known = duration is not None and _finite(duration) and float(duration) > 0
    limit = min(float(duration) * (1 + SEND_SPAN_SLACK[0]) + SEND_SPAN_SLACK[1] if known
                else MAX_SEND_SPAN_S, MAX_SEND_SPAN_S)
    if span > limit:
        gaps = np.diff(np.sort(t))
        k = int(np.argmax(gaps))
        raise ConfigError(
            f"{eid}: the requests' send times span {span:.6g} s, longer than "
            + (f"the run's recorded duration ({float(duration):.6g} s)"
               if known and span <= MAX_SEND_SPAN_S else f"{MAX_SEND_SPAN_S:g} s (a week)")
            + f"; the largest jump is {gaps[k]:.6g} s, after the {k + 1}-th send: the client's "
            f"clock jumped (start_times / send_time_us); fix or drop those requests")


def _window_note(where: str, n: int, how: str) -> str:
    return (f"{where}: {n:,} requests, more than a replay simulates ({MAX_REPLAY_REQUESTS:,}); "
            f"replaying the first {MAX_REPLAY_REQUESTS:,} {how}")


def _summary_stage(row: Mapping[str, Any], i: int, common: dict[str, Any],
                   results: Path | None, profile: dict[str, Any] | None,
                   seed: int, notes: list[str] | None = None) -> ClientStage:
    eid = str(row["experiment_id"])
    where = f"{eid} stage {row['stage']}"
    mc = row.get("max_concurrency")
    if _finite(mc):
        raise ConfigError(f"{where}: max_concurrency={float(mc):g} is a closed-loop client and "
                          "the result has no per-request send times to replay; rerun "
                          "`vllm bench serve` with --save-detailed (or without --max-concurrency)")
    src = str(row.get("source") or "")
    rate = row.get("achieved_rate") if src == "inference_perf" and _finite(
        row.get("achieved_rate")) else row.get("requested_rate")
    if rate is None or pd.isna(rate) or not float(rate) > 0:
        raise ConfigError(f"{where}: no request rate (field request_rate / requested_rate)")
    rate = float(rate)
    count = row.get("count")
    if not _finite(count) or int(count) < 1:
        raise ConfigError(f"{where}: no request count (field count / num_prompts)")
    count = int(count)
    if count > MAX_REPLAY_REQUESTS:
        if notes is not None:
            notes.append(_window_note(where, count, "of the same arrival process (the measured "
                                      "means are taken as those of a stationary load)"))
        count = MAX_REPLAY_REQUESTS
    plen = row.get("prompt_len_mean")
    if not _finite(plen) or float(plen) < 1:
        raise ConfigError(f"{where}: no mean prompt length (field prompt_len_mean; vLLM: "
                          "total_input_tokens)")
    prompt = int(round(float(plen)))
    olen = row.get("output_len_mean")
    pdf = _inference_perf_pdf(results, str(row["stage"]), profile) if src == "inference_perf" \
        else None
    generated = generated_output_len(profile) if pdf is not None else None
    if generated is not None:      # pdf is {generated: 1.0}
        if notes is not None and _finite(olen) \
                and abs(float(olen) - generated) > 0.02 * generated:
            notes.append(f"{where}: the profile sets ignore_eos, so every request generated "
                         f"output_len = {generated} tokens; the client counted "
                         f"{float(olen):.1f} on average (the text it received, re-tokenized), "
                         "which the replay does not use")
        olen = float(generated)
    if pdf is None:
        if not _finite(olen) or float(olen) < 1:
            raise ConfigError(f"{where}: no output length (field output_len_mean; vLLM: "
                              "total_output_tokens)")
        pdf = {max(int(round(float(olen))), 1): 1.0}
    observed = _observed(row.get("ttft_mean_s"), row.get("e2e_mean_s"), olen, where)
    shape: dict[str, Any] = {}
    if profile is not None and src == "inference_perf":
        sys_len = int(profile["system_prompt_len"])
        if sys_len < prompt:
            shape = {"system_prompt_len": sys_len, "num_groups": int(profile["num_groups"]),
                     "users_per_group": int(profile["users_per_group"])}
    burst = row.get("burstiness")
    burst = float(burst) if burst is not None and not pd.isna(burst) else 1.0
    stage_idx = int(row["stage_index"]) if _finite(row.get("stage_index")) else i
    run_id = eid
    if math.isinf(rate) or burst != 1.0:
        # all at t = 0, or gamma arrivals: written out as recorded arrivals
        rng = np.random.default_rng([seed, stage_idx, len(run_id), 11])
        if math.isinf(rate):
            arr = np.zeros(count)
        elif math.isinf(burst):
            arr = np.arange(count) / rate
        else:
            if not burst > 0:
                raise ConfigError(f"{where}: burstiness must be > 0 (got {burst})")
            gaps = rng.gamma(burst, 1.0 / (rate * burst), size=count)
            arr = np.cumsum(gaps) - gaps[0]
        outs = stratified_lengths(pdf, count, rng)
        return ClientStage(run_id=run_id, stage=stage_idx, observed=observed,
                           arrival_s=tuple(float(a) for a in arr),
                           prompt_tokens=(prompt,) * count,
                           output_tokens=tuple(int(o) for o in outs), **shape, **common)
    return ClientStage(run_id=run_id, stage=stage_idx, observed=observed, rate=rate,
                       count=count, prompt_len=prompt, output_pdf=pdf, **shape, **common)


def _request_stage(eid: str, req: pd.DataFrame, common: dict[str, Any],
                   notes: list[str] | None = None,
                   duration: float | None = None) -> ClientStage | None:
    """One stage of a run's recorded successful requests (None when they cannot be replayed);
    the first :data:`MAX_REPLAY_REQUESTS` by send time when there are more (noted)."""
    ok = req[req["status"] == "ok"]
    t = ok["send_s"].to_numpy(dtype=float)
    t = np.where(np.isfinite(t), t, ok["arrival_s"].to_numpy(dtype=float))
    p = ok["prompt_tokens"].to_numpy(dtype=float, na_value=np.nan)
    o = ok["output_tokens"].to_numpy(dtype=float, na_value=np.nan)
    good = np.isfinite(t) & np.isfinite(p) & (p >= 1) & np.isfinite(o) & (o >= 1)
    if not good.any():
        return None
    sub = ok[good]
    t, p, o = t[good], p[good], o[good]
    _check_send_span(eid, t, duration)
    order = np.argsort(t, kind="stable")
    if len(order) > MAX_REPLAY_REQUESTS:
        if notes is not None:
            notes.append(_window_note(eid, len(order), "by send time (the measured means are "
                                      "those of the same requests)"))
        order = order[:MAX_REPLAY_REQUESTS]
    observed = _observed(float(np.nanmean(sub["ttft_s"].to_numpy(dtype=float)[order])),
                         float(np.nanmean(sub["e2e_s"].to_numpy(dtype=float)[order])),
                         float(o[order].mean()), eid)
    return ClientStage(run_id=eid, stage=0, observed=observed,
                       arrival_s=tuple(float(x) for x in t[order]),
                       prompt_tokens=tuple(int(x) for x in p[order]),
                       output_tokens=tuple(int(x) for x in o[order]), **common)


def _check_model(recorded: pd.Series, model: str | Path, eid: str) -> None:
    """Refuse a result that names a known model other than ``model`` (both resolved)."""
    from bayes_latency.physics.models import resolve_name

    if not len(recorded):
        return
    mine, theirs = resolve_name(str(model)), resolve_name(str(recorded.iloc[0]))
    if mine is not None and theirs is not None and mine != theirs:
        raise ConfigError(f"{eid}: the result records model {recorded.iloc[0]!r} ({theirs}), "
                          f"not --model {model} ({mine})")


def client_stages(tables: Mapping[str, pd.DataFrame], model: str, gpu: str, tp: int,
                  kv_blocks: int, path: str | Path | None = None,
                  max_num_seqs: int = 128, max_num_batched_tokens: int = 2048,
                  block_size: int = 16, prefix_caching: bool = True, seed: int = 0,
                  notes: list[str] | None = None) -> list[ClientStage]:
    """The replayable load stages of client results (see the module docstring).

    Parameters
    ----------
    tables
        ``lifecycle`` and ``client_requests`` from
        :func:`~bayes_latency.data.client.read.read_client_results`.
    model, gpu, tp
        The configuration the results were measured on.
    kv_blocks
        KV-cache blocks of one GPU (:func:`default_kv_blocks`).
    path
        The results' path (an inference-perf folder's ``profile.yaml`` and stage files give
        the prompt shape and the output-length quantiles).
    max_num_seqs, max_num_batched_tokens, block_size, prefix_caching
        The server's scheduler settings.
    seed
        Seed of gamma arrivals and of output lengths drawn from a distribution.
    notes
        When given, a note is appended for each stage replayed as a window of its requests
        (more than :data:`MAX_REPLAY_REQUESTS`), and for each stage whose generated output
        length (``ignore_eos``, :func:`generated_output_pdf`) differs from the client's count
        by more than 2%.

    Raises
    ------
    ConfigError
        A run that cannot be replayed (closed loop without send times, no rate, no means, a
        different TP recorded in the result): the message names the field.
    """
    lc = tables.get("lifecycle")
    req = tables.get("client_requests")
    if lc is None or not len(lc):
        raise ConfigError("the client results hold no run summary")
    common = dict(model=str(model), gpu=str(gpu), tp=int(tp), kv_blocks=int(kv_blocks),
                  max_num_seqs=int(max_num_seqs),
                  max_num_batched_tokens=int(max_num_batched_tokens),
                  block_size=int(block_size), prefix_caching=bool(prefix_caching))
    try:
        return _client_stages(lc, req, model, tp, common, path, seed, notes)
    except ConfigError as exc:  # name the results the stage came from
        if path is None or str(path) in str(exc):
            raise
        raise ConfigError(f"{path}: {exc}") from None


def _client_stages(lc: pd.DataFrame, req: pd.DataFrame | None, model: str | Path, tp: int,
                   common: dict[str, Any], path: str | Path | None, seed: int,
                   notes: list[str] | None = None) -> list[ClientStage]:
    """:func:`client_stages`' work."""
    results, profile = _stage_files(Path(path) if path is not None else None)
    out: list[ClientStage] = []
    for eid, rows in lc.groupby("experiment_id", sort=False):
        _check_model(rows["model"].dropna(), model, str(eid))
        rtp = rows["tp"].dropna()
        if len(rtp) and int(rtp.iloc[0]) != int(tp):
            raise ConfigError(f"{eid}: the result records tp={int(rtp.iloc[0])}, not --tp {tp}")
        if req is not None and len(req):
            mine = req[req["experiment_id"] == eid]
            dur = rows["duration_s"].max() if "duration_s" in rows else None
            st = _request_stage(str(eid), mine, common, notes, dur) if len(mine) else None
            if st is not None:
                out.append(st)
                continue
        stage_rows = rows[rows["stage"].astype(str) != "summary"]
        use = stage_rows if len(stage_rows) else rows
        for i, (_, row) in enumerate(use.iterrows()):
            out.append(_summary_stage(row.to_dict(), i, common, results, profile, seed,
                                      notes))
    for s in out:
        s.validate()
    return out


def spec_stages(spec: Mapping[str, Any], model: str, gpu: str, tp: int, kv_blocks: int,
                name: str = "spec", max_num_seqs: int = 128,
                max_num_batched_tokens: int = 2048, block_size: int = 16,
                prefix_caching: bool = True, prompt_sharing: str = "system",
                notes: list[str] | None = None) -> list[ClientStage]:
    """The load stages a workload spec asks for, without a measurement: one
    :class:`~bayes_latency.schedule.replay.ClientStage` per constant-rate stage.

    Each stage draws ``int(rate x duration)`` Poisson arrivals at ``rate`` (at most
    :data:`MAX_REPLAY_REQUESTS`, with a note), prompts of ``system_prompt_len + question_len``
    tokens in ``num_groups`` system-prompt groups of ``users_per_group`` users, every output
    ``output_len`` tokens; its observed means are NaN (nothing was measured).

    Parameters
    ----------
    spec
        :func:`~bayes_latency.data.client.lifecycle.read_workload_spec`'s fields.
    model, gpu, tp, kv_blocks
        The configuration and KV-cache blocks of one GPU.
    name
        The run's name in the stages (it seeds the drawn requests with the stage index).
    max_num_seqs, max_num_batched_tokens, block_size, prefix_caching
        The server's scheduler settings.
    prompt_sharing
        ``"system"`` (default: how BLIS's expansion of an inference-perf spec caches, the
        system prompt only) or ``"prompt"`` (each user's whole prompt repeats and is cached).
    notes
        When given, a note is appended for each stage cut to :data:`MAX_REPLAY_REQUESTS`.

    Raises
    ------
    ConfigError
        A stage that cannot be replayed (names the stage and the field).
    """
    common = dict(model=str(model), gpu=str(gpu), tp=int(tp), kv_blocks=int(kv_blocks),
                  max_num_seqs=int(max_num_seqs),
                  max_num_batched_tokens=int(max_num_batched_tokens),
                  block_size=int(block_size), prefix_caching=bool(prefix_caching),
                  prompt_sharing=str(prompt_sharing))
    sys_len, q_len = int(spec["system_prompt_len"]), int(spec["question_len"])
    out_len = int(spec["output_len"])
    observed = {"ttft_mean_us": math.nan, "e2e_mean_us": math.nan,
                "output_len_mean": float(out_len)}
    stages: list[ClientStage] = []
    for i, (rate, duration) in enumerate(spec["stages"]):
        where = f"{name} stage {i}"
        n = math.floor(float(rate) * float(duration)) if math.isfinite(rate * duration) else 0
        if n < 1:
            raise ConfigError(f"{where}: rate x duration = {rate * duration:.6g} requests; "
                              "a stage needs at least 1")
        if n > MAX_REPLAY_REQUESTS:
            if notes is not None:
                notes.append(_window_note(where, n, "of the same arrival process"))
            n = MAX_REPLAY_REQUESTS
        st = ClientStage(run_id=str(name), stage=i, observed=dict(observed), rate=float(rate),
                         count=int(n), prompt_len=sys_len + q_len, output_pdf={out_len: 1.0},
                         system_prompt_len=sys_len, num_groups=int(spec["num_groups"]),
                         users_per_group=int(spec["users_per_group"]),
                         workload="spec", **common)
        st.validate()
        stages.append(st)
    return stages


def stages_table(stages: list[ClientStage]) -> pd.DataFrame:
    """One row per stage: id, requests, arrivals kind, rate, mean prompt / output, measured means."""
    rows = []
    for s in stages:
        rec = s.arrival_s is not None
        n = len(s.arrival_s) if rec else s.count
        rows.append({
            "experiment_id": s.experiment_id, "requests": n,
            "arrivals": "recorded" if rec else "poisson", "rate": s.arrival_rate,
            "prompt_mean": float(np.mean(s.prompt_tokens)) if rec else float(s.prompt_len),
            "output_mean": float(np.mean(s.output_tokens)) if rec else pdf_mean(s.output_pdf),
            "ttft_mean_ms": s.observed.get("ttft_mean_us", math.nan) / 1e3,
            "e2e_mean_ms": s.observed.get("e2e_mean_us", math.nan) / 1e3})
    return pd.DataFrame(rows)
