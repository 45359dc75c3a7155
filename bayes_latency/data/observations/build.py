"""The observation table: every measured duration as a linear functional of per-step features.

Each row is ``value_us ≈ Σ_j beta_j · x_j`` (or ``Σ alpha_k · x_alpha_k``), where ``x`` is the sum
(or mean) of the per-step basis (:func:`~bayes_latency.physics.basis.basis_matrix`) over the steps
the row spans. Row kinds (``docs/ARCHITECTURE.md``):

``iteration`` (role ``beta``)
    Step ``i`` with both ``i`` and ``i+1`` sampled: ``(ts_start(i+1) - ts_start(i)) / 1000``.
``step_window`` (role ``beta``)
    The step timeline cut at *anchors* (estimates of step start times) into non-overlapping
    windows ``[a, b)``: value ``anchor(b) - anchor(a)``, features the sum of the basis over
    ``a..b-1``. Anchors are exact for sampled steps (``step.ts_start_ns``); otherwise they come
    from journey events: the earliest ``SCHEDULED``/``PREEMPTED`` at ``s`` (inside ``s``'s
    ``schedule()``, just after the start) or else the latest ``FIRST_TOKEN``/``FINISHED`` at
    ``s-1`` (just before ``s`` starts). Both are bias-corrected by their median offset to the
    exact starts of sampled steps when at least :data:`MIN_CALIBRATION` pairs exist, and
    ``anchor_error_us`` is the 95th percentile of the remaining absolute error (summed over the
    two ends). Windows of one step between two exact anchors are ``iteration`` rows instead, so
    no step is counted twice.
``request_prefill`` / ``request_decode`` (role ``ppc``)
    ``FIRST_TOKEN - SCHEDULED`` over steps ``first_scheduled..first_token`` and ``FINISHED -
    FIRST_TOKEN`` over ``first_token+1..finished``: overlapping sums, for predictive checks only.
``alpha_arrival`` / ``alpha_departure`` (role ``alpha``)
    ``QUEUED - api.ARRIVED`` (feature ``x_alpha_arrival`` = 1) and ``api.DEPARTED - FINISHED``
    (``x_alpha_post_decode`` = 1, ``x_alpha_per_token`` = output tokens).
``scheduler_cpu`` (role ``aux``)
    ``step.duration_us`` of sampled steps (CPU time of ``schedule()``) with that step's features.
``benchmark_mean`` (role ``beta``, aggregate ``mean``)
    Static-batch microbenchmarks (:func:`observations_from_microbench`).

Rows that cannot be used are dropped and counted in the :class:`IngestReport` (never silently):
windows or iterations spanning an idle engine (``idle_gap``: no request alive across a step
boundary, or ``empty_step``: a step with nothing scheduled), whose time per µs of ideal roofline
time (the sum of the roofline features) exceeds :data:`LONG_GAP_FACTOR` times the median
(``long_gap``: an idle period the request journeys did not reveal), or whose value is not positive
(``nonpositive_value``); alpha rows with missing or negative times.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

# the module is split by concern: the table (columns, rows, assembly, domain) and the rows from
# the journeys live in observations_table / observations_journey; their public names (and the
# helpers other modules use, e.g. schedule/replay.py's _finish and _rows) are re-exported here
from bayes_latency.data.observations.journey import (
    LONG_GAP_FACTOR,
    MIN_CALIBRATION,
    _alpha_rows,
    _request_rows,
    _timeline_rows,
)
from bayes_latency.data.observations.table import (
    BASE_COLUMNS,
    DEFAULT_STACK,
    EXTRA_COLUMNS,
    REQUIRED_COLUMNS,
    _assemble,
    _finish,
    _label,
    _nullable_steps,
    _row_dict,
    _rows,
    config_id,
    domain_violations,
    drop_out_of_domain,
    empty_observations,
    observation_columns,
    validate_observations,
)
from bayes_latency.data.rebuild.reconstruct import BATCH_COLUMNS, reconstruct_batches
from bayes_latency.data.report import IngestReport
from bayes_latency.physics.basis import DEFAULT_TERMS, basis_matrix

__all__ = [
    "BASE_COLUMNS",
    "DEFAULT_STACK",
    "config_id",
    "EXTRA_COLUMNS",
    "LONG_GAP_FACTOR",
    "MIN_CALIBRATION",
    "build_observations",
    "domain_violations",
    "drop_out_of_domain",
    "empty_observations",
    "observation_columns",
    "observations_from_iterations",
    "observations_from_microbench",
    "validate_observations",
    "REQUIRED_COLUMNS",
]


def _clean_sorted_steps(steps: pd.DataFrame) -> bool:
    """Whether ``steps`` has no null ``step.id`` / ``step.ts_start_ns`` and strictly increasing
    step ids (then dropping nulls and repeats and sorting by ``step.id`` leave it as it is)."""
    sid, ts = steps["step.id"], steps["step.ts_start_ns"]
    if sid.hasnans or ts.hasnans:
        return False
    v = sid.to_numpy()
    return v.dtype.kind in "iu" and bool((v[1:] > v[:-1]).all())


def _all_equal(col: pd.Series, value: str) -> bool:
    """Whether every value of a text column is ``value`` (one pyarrow pass; False when unsure,
    e.g. a column that is not text)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not pd.api.types.is_string_dtype(col.dtype) or col.dtype == object:
        return False
    try:
        arr = pa.array(col)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        return False
    if not pa.types.is_string(arr.type) and not pa.types.is_large_string(arr.type):
        return False
    return arr.null_count == 0 and bool(pc.all(pc.equal(arr, value)).as_py())


def _steps_of(tables: Mapping[str, Any], name: str, experiment_id: str) -> pd.DataFrame | None:
    df = tables.get(name) if isinstance(tables, Mapping) else getattr(tables, name, None)
    if df is None:
        return None
    if "experiment_id" in df.columns and experiment_id is not None and len(df):
        if _all_equal(df["experiment_id"], str(experiment_id)):
            return df
        sel = df["experiment_id"].astype(str) == str(experiment_id)
        if sel.any() and not sel.all():  # (all rows: the frame itself, no copy)
            df = df[sel]
    return df

# ------------------------------------------------------------------------------- public API
def build_observations(tables: Mapping[str, Any], serving: Any, arch: Any, gpu: Any,
                       experiment_id: str, workload: str = "",
                       terms: Sequence[str] = DEFAULT_TERMS
                       ) -> tuple[pd.DataFrame, IngestReport]:
    """Observation rows of one experiment.

    Parameters
    ----------
    tables
        Mapping (or object with attributes) holding ``steps``, ``requests``, ``journey_events``
        and optionally ``batches`` (rebuilt by
        :func:`~bayes_latency.data.rebuild.reconstruct.reconstruct_batches`; rebuilt here when absent and
        journeys exist). Rows of other experiments are ignored.
    serving, arch, gpu
        :class:`~bayes_latency.physics.serving.ServingConfig`, ``Architecture``, ``GPU``.
    experiment_id, workload
        Labels of the rows.
    terms
        Term set of the ``x_`` columns.

    Returns
    -------
    observations : pandas.DataFrame
        Columns :func:`observation_columns`.
    report : IngestReport
        ``kept`` per kind, ``dropped`` per ``kind:reason``, notes on anchors and approximations.

    Notes
    -----
    Without journeys, only ``iteration`` and ``scheduler_cpu`` rows can be built, from batches
    approximated from the step summaries (``ctx_approximated=True``).
    """
    report = IngestReport(source=f"observations {experiment_id}")
    steps = _steps_of(tables, "steps", experiment_id)
    ev = _steps_of(tables, "journey_events", experiment_id)
    requests = _steps_of(tables, "requests", experiment_id)
    batches = _steps_of(tables, "batches", experiment_id)
    if steps is not None and len(steps) and not _clean_sorted_steps(steps):
        steps = steps.dropna(subset=["step.id", "step.ts_start_ns"]).drop_duplicates("step.id")
        steps = steps.sort_values("step.id")
    have_journeys = ev is not None and len(ev) > 0
    if not have_journeys:
        if steps is None or not len(steps):
            report.notes.append("no journeys and no step summaries: no observation")
            return empty_observations(terms), report
        from bayes_latency.data.steps import iterations_from_steps

        it = iterations_from_steps(steps, block_size=int(serving.block_size), report=report)
        obs = observations_from_iterations(it, arch, gpu, serving, experiment_id=experiment_id,
                                           workload=workload, terms=terms)
        report.notes.append("no journeys: iteration rows from step summaries only "
                            "(ctx_approximated)")
        obs = drop_out_of_domain(obs, report)
        report.kept.update(obs["kind"].value_counts().to_dict())
        return obs, report
    if batches is None or not len(batches):
        batches, _, rrep = reconstruct_batches(ev, requests, serving, steps, with_members=False)
        report.notes.append(rrep.format())
    b_sid = batches["step_id"].to_numpy()
    if not (isinstance(batches.index, pd.RangeIndex) and batches.index.start == 0
            and batches.index.step == 1 and b_sid.dtype.kind in "iu"
            and bool((b_sid[1:] > b_sid[:-1]).all())):  # (else already what the sort gives)
        batches = batches.sort_values("step_id").reset_index(drop=True)
    s0 = int(batches["step_id"].iloc[0])
    n = len(batches)
    if not np.array_equal(batches["step_id"].to_numpy(), np.arange(s0, s0 + n)):
        raise ValueError("batches must hold every step id from the first to the last")
    X = basis_matrix(batches[[c for c in BATCH_COLUMNS if c in batches]], arch, gpu, serving,
                     terms)
    cs = np.vstack([np.zeros((1, X.shape[1])), np.cumsum(X, axis=0)])

    # rows as dicts of columns (_row_dict), one frame at the end (_assemble)
    parts: list[dict[str, Any]] = _timeline_rows(batches, X, steps, ev, requests, terms, report,
                                                 make=_row_dict)
    if requests is not None and len(requests):
        parts += _request_rows(requests, cs, s0, n, terms, report, make=_row_dict)
        parts += _alpha_rows(requests, terms, report, make=_row_dict)
    if steps is not None and len(steps) and "step.duration_us" in steps.columns:
        sid = steps["step.id"].to_numpy(dtype=np.int64)
        dur = steps["step.duration_us"].to_numpy(dtype=float, na_value=np.nan)
        inside = (sid >= s0) & (sid < s0 + n)
        ok = inside & np.isfinite(dur) & (dur > 0)
        if (~ok).sum():
            report.drop("scheduler_cpu:missing_or_nonpositive", int((~ok).sum()))
        if ok.any():
            parts.append(_row_dict("scheduler_cpu", dur[ok], X[sid[ok] - s0], terms,
                                   step_first=sid[ok], step_last=sid[ok]))
    parts = [p for p in parts if len(p["value_us"])]
    if not parts:
        return empty_observations(terms), report
    df = _assemble(parts, terms, experiment_id=experiment_id, workload=workload, arch=arch,
                   gpu=gpu, serving=serving, report=report)
    report.kept.update(df["kind"].value_counts().to_dict())
    return df, report


def observations_from_iterations(iterations: pd.DataFrame, arch: Any, gpu: Any, serving: Any,
                                 experiment_id: str | None = None, workload: str = "",
                                 terms: Sequence[str] = DEFAULT_TERMS) -> pd.DataFrame:
    """``iteration`` rows from an ``iterations`` table (e.g. the real H100 step summaries).

    Parameters
    ----------
    iterations
        ``iterations`` table (:func:`~bayes_latency.data.steps.iterations_from_steps`):
        ``experiment_id, step_id, iteration_us`` + batch-table columns + ``ctx_approximated``.
        Rows with a NaN batch column or a non-positive time are skipped.
    arch, gpu, serving
        Configuration of the experiment(s).
    experiment_id
        Label; default: the table's own ``experiment_id`` column.
    workload, terms
        Workload label and term set.

    Returns
    -------
    pandas.DataFrame
        Observation rows of kind ``iteration``.
    """
    it = iterations
    # tables from step summaries have no prefill_input_pairs: the basis fills it in
    cols = [c for c in BATCH_COLUMNS if c in it.columns]
    ok = it[cols].notna().all(axis=1).to_numpy() & (it["iteration_us"].to_numpy(float) > 0)
    it = it[ok]
    if not len(it):
        return empty_observations(terms)
    X = basis_matrix(it[cols], arch, gpu, serving, terms)
    apx = it["ctx_approximated"].to_numpy(bool) if "ctx_approximated" in it else True
    df = _rows("iteration", it["iteration_us"].to_numpy(float), X, terms,
               step_first=it["step_id"].to_numpy(), step_last=it["step_id"].to_numpy(),
               anchor_exact=True, anchor_error_us=0.0, ctx_approximated=apx)
    df = _nullable_steps(df)
    frames = []
    eids = (it["experiment_id"].astype(str).to_numpy() if experiment_id is None
            and "experiment_id" in it else np.full(len(it), experiment_id or ""))
    for eid in dict.fromkeys(eids):
        part = df[eids == eid].reset_index(drop=True)
        frames.append(_label(part, experiment_id=str(eid), workload=workload, arch=arch, gpu=gpu,
                             serving=serving))
    return _finish(frames, terms)


_SPLITWISE_MODELS = {"llama2-70b": "llama-2-70b", "bloom-176b": "bloom-176b",
                     "llama-2-70b": "llama-2-70b"}


def observations_from_microbench(df: pd.DataFrame, terms: Sequence[str] = DEFAULT_TERMS,
                                 report: IngestReport | None = None,
                                 stack: str = "splitwise") -> pd.DataFrame:
    """``benchmark_mean`` rows from static-batch microbenchmarks (Splitwise format).

    Parameters
    ----------
    df
        One row per measurement with columns ``model, hardware, tensor_parallel`` (or ``tp``),
        ``prompt_size, batch_size, token_size`` and ``prompt_time``, ``token_time`` in
        milliseconds (or ``prompt_time_us``, ``token_time_us``). Repetitions of a point are
        averaged into one row.
    terms
        Term set.
    stack
        Serving software the benchmark ran on (Splitwise's own harness by default): its rows
        form configurations of their own (``model|gpu|tpN|stack``), and the hierarchy gives the
        stack an effect, because a static-batch harness is not the traced vLLM server (measured:
        Llama-2-70B H100 TP4 decode at batch 1 takes 29.4 ms in Splitwise, while the vLLM run's
        median step at batch ~43 is 19.0 ms).
    report
        Counts of points kept/skipped (unknown model or GPU).

    Returns
    -------
    pandas.DataFrame
        Observation rows (kind ``benchmark_mean``, aggregate ``mean``, role ``beta``):

        - ``prompt_time``: one prefill of ``batch_size`` prompts of ``prompt_size`` tokens
          (a single step, no chunking): ``n_steps`` 1.
        - ``token_time``: the mean decode iteration over ``token_size`` steps of ``batch_size``
          sequences whose context grows from ``prompt_size`` to ``prompt_size + token_size - 1``:
          features = mean of the per-step basis, ``n_steps = token_size``.
    """
    from bayes_latency.errors import ConfigError
    from bayes_latency.physics.hardware import load_gpu
    from bayes_latency.physics.models import load_architecture
    from bayes_latency.physics.serving import ServingConfig

    report = report if report is not None else IngestReport(source="microbench")
    d = df.copy()
    if "tp" not in d.columns:
        d["tp"] = d["tensor_parallel"]
    for c in ("prompt_time", "token_time"):
        if f"{c}_us" not in d.columns:
            d[f"{c}_us"] = d[c].astype(float) * 1e3
    keys = ["model", "hardware", "tp", "prompt_size", "batch_size"]
    frames = []
    for (model, hw, tp), g in d.groupby(["model", "hardware", "tp"], sort=True):
        try:
            arch = load_architecture(_SPLITWISE_MODELS.get(str(model), str(model)))
            gpu = load_gpu(str(hw))
        except ConfigError as e:
            report.drop("benchmark:unknown_config", len(g))
            report.notes.append(f"microbench {model}/{hw}: {e}")
            continue
        tp = int(tp)
        eid = f"splitwise-{arch.name}-{gpu.name}-tp{tp}"
        parts = []
        # prompt_time: one static prefill per (prompt, batch)
        pt = g.groupby(keys, sort=True)["prompt_time_us"].mean().reset_index()
        P = pt["prompt_size"].to_numpy(float)
        B = pt["batch_size"].to_numpy(float)
        budget = int(max(2048, (P * B).max()))
        serving = ServingConfig(tp=tp, max_num_batched_tokens=budget,
                                max_num_seqs=int(max(128, B.max())), prefix_caching=False)
        batches = pd.DataFrame({
            "num_prefill_reqs": B, "prefill_tokens": B * P,
            "prefill_attn_pairs": B * P * (P + 1) / 2, "prefill_kv_tokens": B * P,
            "num_decode_reqs": 0.0, "decode_tokens": 0.0, "decode_ctx_tokens": 0.0,
        })
        X = basis_matrix(batches, arch, gpu, serving, terms)
        parts.append(_rows("benchmark_mean", pt["prompt_time_us"].to_numpy(float), X, terms,
                           n_steps=1, aggregate="mean", anchor_exact=True, anchor_error_us=0.0))
        # token_time: mean decode step over token_size steps
        tt = g.groupby(keys + ["token_size"], sort=True)["token_time_us"].mean().reset_index()
        feats = []
        for p, b, k in tt[["prompt_size", "batch_size", "token_size"]].itertuples(index=False):
            k = int(k)
            ctx = float(p) + np.arange(k, dtype=float)
            bt = pd.DataFrame({
                "num_prefill_reqs": 0.0, "prefill_tokens": 0.0, "prefill_attn_pairs": 0.0,
                "prefill_kv_tokens": 0.0, "num_decode_reqs": float(b), "decode_tokens": float(b),
                "decode_ctx_tokens": float(b) * ctx,
            })
            feats.append(basis_matrix(bt, arch, gpu, serving, terms).mean(axis=0))
        if feats:
            parts.append(_rows("benchmark_mean", tt["token_time_us"].to_numpy(float),
                               np.vstack(feats), terms,
                               n_steps=tt["token_size"].to_numpy(np.int64), aggregate="mean",
                               anchor_exact=True, anchor_error_us=0.0))
        out = pd.concat(parts, ignore_index=True)
        out = _nullable_steps(out)
        frames.append(_label(out, experiment_id=eid, workload="splitwise", arch=arch, gpu=gpu,
                             serving=serving, stack=stack))
        report.kept["benchmark_mean"] += len(out)
    return _finish(frames, terms)
