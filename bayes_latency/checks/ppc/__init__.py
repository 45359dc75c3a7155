"""Posterior predictive checks at three levels: steps, requests and workloads.

Every level reduces a matrix of predictive draws ``(sample, item)`` and the observed values of
the items to the same per-item columns (:func:`band_summary`):

``observed_us, pred_mean_us, pred_median_us, q05_us, q25_us, q75_us, q95_us, pit, in_50, in_90,
ape`` (absolute percentage error of the predictive median, in %).

- **step level** (:func:`step_ppc`, :func:`ppc_rows`): observation rows (``iteration``,
  ``step_window``) against their posterior predictive draws; per configuration coverage of the
  central 50% / 90% bands, PIT values and the median absolute percentage error.
- **request level** (:func:`request_ppc`): teacher-forced TTFT, TPOT and E2E of each request,
  from the predictions of the request's ``request_prefill`` / ``request_decode`` rows, its alpha
  overheads and its *observed* queueing wait.
- **workload level** (:func:`workload_ppc`): mean TTFT, mean ITL (decode interval) and mean E2E
  per experiment (and per load stage when known), with a 90% band over the draws of the mean, the
  error in % against the observation and optionally against the truth of a synthetic experiment.

All times are in microseconds.
The step level is in :mod:`bayes_latency.checks.ppc.steps`, the shared band reductions in
:mod:`bayes_latency.checks.ppc.bands`, the request level in
:mod:`bayes_latency.checks.ppc.requests`, the workload level in
:mod:`bayes_latency.checks.ppc.workloads`; their public names are re-exported here.
"""

from bayes_latency.checks.ppc.bands import (
    ALL,
    BAND_COLUMNS,
    align_draws,
    band_summary,
    coverage_by_load,
    summarize_rows,
)
from bayes_latency.checks.ppc.requests import (
    REQUEST_METRICS,
    FixedCoefficientModel,
    RequestPPC,
    request_ppc,
)
from bayes_latency.checks.ppc.steps import STEP_GROUPS, STEP_KINDS, ppc_rows, step_ppc
from bayes_latency.checks.ppc.workloads import E2E_TARGET_PCT, WORKLOAD_METRICS, workload_ppc

__all__ = ["ALL", "BAND_COLUMNS", "E2E_TARGET_PCT", "REQUEST_METRICS", "STEP_GROUPS", "STEP_KINDS",
           "WORKLOAD_METRICS", "FixedCoefficientModel", "RequestPPC", "align_draws", "band_summary",
           "coverage_by_load", "ppc_rows", "request_ppc", "step_ppc", "summarize_rows",
           "workload_ppc"]
