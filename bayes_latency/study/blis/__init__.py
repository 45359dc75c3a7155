"""The BLIS harness: real runs simulated in BLIS with exported coefficients.

One entry point, :func:`bayes_latency.study.blis.e2e.run_study` (``bayes-latency study blis``):
:mod:`.spec` turns a real run and an export into BLIS workload specs and flags, :mod:`.e2e` runs
``blis run`` per load stage and compares, :mod:`.metrics` reads BLIS's per-request metrics,
:mod:`.report` writes ``blis_e2e.md`` and ``blis_e2e.csv``.
"""
