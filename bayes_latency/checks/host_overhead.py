"""Host CPU overhead of the engine loop, read from the ``iterations`` table.

vLLM's step summaries carry ``step.duration_us``, the CPU time of the scheduler's ``schedule()``
call, next to the iteration time (the gap between consecutive step starts, see
:mod:`bayes_latency.data.steps`). On a quiet host ``schedule()`` is a few hundred microseconds,
1-3% of an iteration. When the host's CPU is contended (the API server streaming thousands of
tokens per second, detokenization, many running requests) it grows by an order of magnitude, and
the iteration times grow noisier with it. The real H100 runs of the shared data show both
(``results/benchmarks/heldout_real.md``): in the 20 req/s stage of the general workload,
with 60 or more requests running, Llama-2-70B TP4 spends a median 5.4 ms of a 21.5 ms iteration
in ``schedule()`` where its batch size predicts 0.8 ms (0.27 ms of 18.5 ms at a batch of 36),
and the log-scatter of its decode iterations doubles (0.009 to 0.017).

None of this is in BLIS's latency model: its step time is linear in the batch features and its
alphas are per-request constants, so an overhead that grows with the host's load can be neither
fitted nor exported. This module finds the steps where it happens, so that a user knows which
iterations are noisier than the rest and why a simulated TTFT near capacity falls short:

- :func:`host_overhead` summarises each experiment: the share of the iteration spent in
  ``schedule()``, how many steps are above :data:`HOST_CPU_SHARE`, and the batch sizes and log
  scatter of the iterations below and above it;
- :func:`host_overhead_notes` turns that into one line per experiment where at least
  :data:`MIN_FRACTION` of the steps are above the share;
- :func:`host_bound_mask` flags the steps row by row (``check --tables`` reports the predictive
  bands' coverage of host-bound and quiet iterations apart).

The model does not use the flag, and measured, it has no reason to. At a matched batch size,
host-bound decode-only steps take the same time as quiet ones (real H100 runs, medians: Llama-2-70B
TP4 at 40-60 running 18.87 vs 18.90 ms, at 100-130 21.53 vs 21.62 ms; CodeLlama-34B TP2 at 80-100
16.74 vs 16.86 ms): the extra ``schedule()`` CPU time overlaps the forward pass, and host-bound
steps are slower only because their batches are larger, which the basis already charges. Two
model changes were measured and not kept (``priors/README.md``):
- a noise class of their own: in-sample 90% coverage of host-bound iterations
  0.80-0.87 -> 0.82-0.89, later-third split 0.776 -> 0.769, held-out Llama-2-70B run MdAPE 8.3% ->
  17.0%;
- an additive term per host-bound step: fitted at 21-40 µs
  (0.2% of an iteration), coverage within 0.009 of without (``later third`` 0.780 vs 0.778).
What the flag marks is a busy host. The same stages' TTFT grows, and on the real runs most of
that growth is the engine's own queue, not the host: by Little's law (mean ``queue.waiting_depth``
of the sampled steps over the arrival rate), the Llama-2-70B TP4 20 req/s stage waits 44 ms in
vLLM's queue (the running batch at ``max_num_seqs`` = 128 in 11.7% of its steps) of its 64 ms
TTFT growth over the 8 req/s stage; CodeLlama-34B TP2 at 20 req/s never fills the batch (0.0 ms)
and its TTFT grows 8 ms. A simulator with the same cap queues too, but how long depends on the
arrival realization: the package's replay of that 70B stage (three workload seeds at the
calibrated coefficients) fills the batch in 3-9% of its steps and gives an engine TTFT of 39-58
ms. What is left for the host is the few milliseconds ahead of the engine that BLIS's
per-request alphas cannot follow.

Pure pandas / numpy; no model.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["CPU_FACTOR", "HOST_CPU_SHARE", "MIN_FRACTION", "MIN_STEPS", "host_bound_mask",
           "host_overhead", "host_overhead_and_mask", "host_overhead_notes"]

#: A step is host-bound when its ``schedule()`` CPU time is above :data:`CPU_FACTOR` times what
#: the experiment's quiet steps predict for its batch size (a line in the batch size: the engine's
#: own per-request cost), and the excess is above this share of its iteration time. On the real
#: H100 runs the excess at 60+ running requests is 4-7 ms of a 17-22 ms iteration (20-40%); the
#: synthetic fleet's engine (``schedule()`` linear in the batch) has no host-bound step.
HOST_CPU_SHARE = 0.05
#: See :data:`HOST_CPU_SHARE`.
CPU_FACTOR = 3.0
#: Fraction of an experiment's steps above :data:`HOST_CPU_SHARE` from which it is reported.
MIN_FRACTION = 0.05
#: Experiments with fewer usable steps than this are not judged.
MIN_STEPS = 20

_COLUMNS = ("experiment_id", "n_steps", "cpu_share_median", "n_host_bound", "host_bound_fraction",
            "cpu_ms_median_quiet", "cpu_ms_median_host_bound", "cpu_ms_expected_host_bound", "iteration_ms_median_quiet",
            "iteration_ms_median_host_bound", "batch_median_quiet", "batch_median_host_bound",
            "log_mad_quiet", "log_mad_host_bound", "first_host_bound_step")


def _mad(x: np.ndarray) -> float:
    """Scaled median absolute deviation (1.4826 MAD; the sd for Gaussian data)."""
    if len(x) == 0:
        return float("nan")
    return float(1.4826 * np.median(np.abs(x - np.median(x))))


def _quiet_line(cpu: np.ndarray, batch: np.ndarray, share: np.ndarray) -> np.ndarray:
    """``schedule()`` CPU time each step's batch size predicts from the quiet steps (the half
    with the lower CPU share): least squares ``a + b * batch`` with ``b >= 0``."""
    q = share <= np.median(share)
    x, y = batch[q], cpu[q]
    b = 0.0
    if np.ptp(x) > 0:
        b = max(0.0, float(np.cov(x, y, bias=True)[0, 1] / np.var(x)))
    a = float(np.mean(y) - b * np.mean(x))
    return np.maximum(a + b * batch, 1e-9)


def _usable(iterations: pd.DataFrame) -> tuple[np.ndarray, ...]:
    """``(ok, iteration_us, schedule_cpu_us, batch size, prefill requests)`` as arrays."""
    it = iterations
    gap = it["iteration_us"].to_numpy(dtype=float, na_value=np.nan)
    cpu = it["schedule_cpu_us"].to_numpy(dtype=float, na_value=np.nan)
    ok = np.isfinite(gap) & np.isfinite(cpu) & (gap > 0) & (cpu > 0)
    pre = it["num_prefill_reqs"].to_numpy(dtype=float, na_value=0.0) \
        if "num_prefill_reqs" in it else np.zeros(len(it))
    dec = it["num_decode_reqs"].to_numpy(dtype=float, na_value=0.0) \
        if "num_decode_reqs" in it else np.zeros(len(it))
    return ok, gap, cpu, pre + dec, pre


def _hot(gap: np.ndarray, cpu: np.ndarray, batch: np.ndarray,
         share: float) -> tuple[np.ndarray, np.ndarray]:
    """Host-bound steps of one experiment's usable steps, and their expected CPU time."""
    expected = _quiet_line(cpu, batch, cpu / gap)
    return (cpu > CPU_FACTOR * expected) & (cpu - expected > share * gap), expected


def _classify(iterations: pd.DataFrame, share: float) -> dict[str, np.ndarray]:
    """Row-aligned arrays of an ``iterations`` table with ``iteration_us`` and
    ``schedule_cpu_us``: ``judged`` (usable, in an experiment of at least :data:`MIN_STEPS`
    usable steps), ``hot`` (host-bound), ``expected`` (the quiet steps' CPU time for the
    step's batch; NaN where not judged), ``gap``, ``cpu``, ``batch``, ``pre`` and ``exp``."""
    ok, gap, cpu, batch, pre = _usable(iterations)
    n = len(iterations)
    exp = (iterations["experiment_id"].astype(str).to_numpy() if "experiment_id" in iterations
           else np.full(n, ""))
    judged, hot = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    expected = np.full(n, np.nan)
    for eid in pd.unique(exp[ok]):
        m = np.flatnonzero(ok & (exp == eid))
        if len(m) >= MIN_STEPS:
            judged[m] = True
            hot[m], expected[m] = _hot(gap[m], cpu[m], batch[m], share)
    return {"judged": judged, "hot": hot, "expected": expected, "gap": gap, "cpu": cpu,
            "batch": batch, "pre": pre, "exp": exp}


def host_bound_mask(iterations: pd.DataFrame, share: float = HOST_CPU_SHARE) -> np.ndarray:
    """Whether each row of an ``iterations`` table is a host-bound step (see
    :func:`host_overhead`), aligned with the table's rows.

    False for rows without a usable ``iteration_us`` / ``schedule_cpu_us``, for experiments
    with fewer than :data:`MIN_STEPS` usable steps, and for every row when the table lacks
    ``schedule_cpu_us``.
    """
    if any(c not in iterations.columns for c in ("iteration_us", "schedule_cpu_us")):
        return np.zeros(len(iterations), dtype=bool)
    return _classify(iterations, share)["hot"]


def host_overhead_and_mask(iterations: pd.DataFrame, share: float = HOST_CPU_SHARE
                           ) -> tuple[pd.DataFrame, np.ndarray]:
    """:func:`host_overhead` and :func:`host_bound_mask` from one classification of the steps.

    Returns
    -------
    (table, mask)
        The per-experiment table of :func:`host_overhead` and the row-aligned host-bound flags
        of :func:`host_bound_mask`.
    """
    if not 0 < share < 1:
        raise ValueError(f"share must be in (0, 1), got {share}")
    need = ("experiment_id", "step_id", "iteration_us", "schedule_cpu_us")
    n = 0 if iterations is None else len(iterations)
    if iterations is None or any(c not in iterations.columns for c in need):
        return _empty(), np.zeros(n, dtype=bool)
    k = _classify(iterations, share)
    return _table(k, iterations["step_id"].to_numpy()), k["hot"]


def host_overhead(iterations: pd.DataFrame, share: float = HOST_CPU_SHARE) -> pd.DataFrame:
    """Per experiment, how much of the engine loop is ``schedule()`` CPU time.

    Parameters
    ----------
    iterations
        The ``iterations`` table (:data:`bayes_latency.data.steps.ITERATION_COLUMNS`):
        ``experiment_id``, ``step_id``, ``iteration_us``, ``schedule_cpu_us`` and the batch
        columns ``num_prefill_reqs`` / ``num_decode_reqs`` (batch size = their sum).
    share
        Excess of ``schedule()`` CPU time over the quiet steps' line, as a share of the
        iteration time, above which a step is host-bound (with :data:`CPU_FACTOR`).

    Returns
    -------
    pandas.DataFrame
        One row per experiment with at least :data:`MIN_STEPS` usable steps (finite, positive
        ``iteration_us`` and ``schedule_cpu_us``): ``n_steps``; ``cpu_share_median``;
        ``n_host_bound`` and ``host_bound_fraction``; ``cpu_ms_expected_host_bound``, the median
        CPU time the quiet steps' line predicts for the host-bound steps; the medians of
        ``schedule()`` CPU time (ms), iteration time (ms) and batch size of the quiet and of the
        host-bound steps; ``log_mad_*``, the scaled MAD of ``log(iteration_us)`` among each
        group's decode-only steps (batch sizes within the group's interquartile range, so the
        spread is not the batch mix); and ``first_host_bound_step``. Empty (with these columns)
        when the table lacks ``schedule_cpu_us`` or has no usable step.
    """
    return host_overhead_and_mask(iterations, share)[0]


def _empty() -> pd.DataFrame:
    """The table of :func:`host_overhead` without rows."""
    return pd.DataFrame({c: pd.Series(dtype="float64") for c in _COLUMNS})


def _table(k: dict[str, np.ndarray], sid_all: np.ndarray) -> pd.DataFrame:
    """Per-experiment rows of :func:`host_overhead` from :func:`_classify`'s arrays."""
    rows = []
    for eid in pd.unique(k["exp"][k["judged"]]):
        m = k["judged"] & (k["exp"] == eid)
        g, c, b, p = k["gap"][m], k["cpu"][m], k["batch"][m], k["pre"][m]
        hot, expected, sid = k["hot"][m], k["expected"][m], sid_all[m]
        s = c / g
        row = {"experiment_id": eid, "n_steps": int(m.sum()),
               "cpu_share_median": float(np.median(s)), "n_host_bound": int(hot.sum()),
               "host_bound_fraction": float(hot.mean()),
               "first_host_bound_step": int(sid[hot].min()) if hot.any() else -1,
               "cpu_ms_expected_host_bound": float(np.median(expected[hot]) / 1e3)
               if hot.any() else np.nan}
        for name, sel in (("quiet", ~hot), ("host_bound", hot)):
            row[f"cpu_ms_median_{name}"] = float(np.median(c[sel]) / 1e3) if sel.any() else np.nan
            row[f"iteration_ms_median_{name}"] = float(np.median(g[sel]) / 1e3) \
                if sel.any() else np.nan
            row[f"batch_median_{name}"] = float(np.median(b[sel])) if sel.any() else np.nan
            d = sel & (p == 0)
            if d.sum() >= 4:
                lo, hi = np.quantile(b[d], [0.25, 0.75])
                d &= (b >= lo) & (b <= hi)
            row[f"log_mad_{name}"] = _mad(np.log(g[d])) if d.sum() >= 4 else np.nan
        rows.append(row)
    if not rows:
        return _empty()
    return pd.DataFrame(rows)[list(_COLUMNS)]


def host_overhead_notes(table: pd.DataFrame, min_fraction: float = MIN_FRACTION) -> list[str]:
    """One line per experiment of :func:`host_overhead` with at least ``min_fraction`` of its
    steps host-bound, saying how much of the iteration ``schedule()`` takes there, from which
    batch size, and how much noisier those iterations are."""
    out = []
    for r in table.itertuples(index=False):
        if r.host_bound_fraction < min_fraction:
            continue
        mad = ""
        if np.isfinite(r.log_mad_quiet) and np.isfinite(r.log_mad_host_bound):
            mad = (f"; decode log-scatter {r.log_mad_host_bound:.3f} against "
                   f"{r.log_mad_quiet:.3f} on quiet steps")
        out.append(
            f"{r.experiment_id}: {r.n_host_bound} of {r.n_steps} steps "
            f"({100 * r.host_bound_fraction:.0f}%, from step {r.first_host_bound_step}) spend "
            f"{CPU_FACTOR:.0f}x or more the schedule() CPU time their batch size predicts (median "
            f"{r.cpu_ms_median_host_bound:.2f} ms where {r.cpu_ms_expected_host_bound:.2f} is "
            f"expected, of a {r.iteration_ms_median_host_bound:.2f} ms iteration, at a "
            f"median batch of {r.batch_median_host_bound:.0f}, against "
            f"{r.cpu_ms_median_quiet:.2f} of {r.iteration_ms_median_quiet:.2f} ms at "
            f"{r.batch_median_quiet:.0f}){mad}: the host's CPU is contended. These iterations "
            f"are noisier than the rest (on the real H100 runs no slower at a matched batch "
            f"size); a busy host delays requests before they reach the engine, which BLIS's "
            f"per-request alphas cannot follow.")
    return out


def ingest_notes(iterations: pd.DataFrame) -> list[str]:
    """The ``host CPU`` notes of one experiment's ingest report, from its ``iterations`` table.

    Passed by ``bayes-latency ingest`` as :func:`bayes_latency.data.experiment.ingest`'s
    ``iteration_notes``.
    """
    return [f"host CPU: {n}" for n in host_overhead_notes(host_overhead(iterations))]
