"""Studies: end-to-end evaluations of the model on real measurements (floor 4).

- :mod:`bayes_latency.study.real`: the real-data study (H100 step summaries, Splitwise
  microbenchmarks, inference-perf lifecycle metrics); ``bayes-latency study real``. Its parts:
  :mod:`~bayes_latency.study.settings`, :mod:`~bayes_latency.study.realdata` (data, splits),
  :mod:`~bayes_latency.study.baselines`, :mod:`~bayes_latency.study.cv` (fits, cross-validation),
  :mod:`~bayes_latency.study.workload`, :mod:`~bayes_latency.study.markdown` and
  :mod:`~bayes_latency.study.report` (README, figures); ``real`` keeps ``main`` and re-exports.
"""
