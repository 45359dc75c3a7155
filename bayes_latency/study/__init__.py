"""Studies: end-to-end evaluations of the model on real measurements (floor 4).

- :mod:`bayes_latency.study.real`: the real-data study (H100 step summaries, Splitwise
  microbenchmarks, inference-perf lifecycle metrics); ``bayes-latency study real``.
"""
