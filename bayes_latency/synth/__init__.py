"""Floor 2: synthetic fleets in the real trace formats, with known true coefficients.

- :mod:`~bayes_latency.synth.workloads`: inference-perf ``shared_prefix`` workloads and load stages.
- :mod:`~bayes_latency.synth.truth`: true beta / alpha from a known hierarchy.
- :mod:`~bayes_latency.schedule.steptime`: fast scalar ``beta . basis(batch)`` for the engine loop.
- :mod:`~bayes_latency.schedule.engine`: continuous-batching engine (the reference scheduling policy).
- :mod:`~bayes_latency.synth.writer`: experiment folders (OTLP traces, inference-perf results,
  ``serving.yaml``, ``truth.yaml``, engine truth tables).
- :mod:`~bayes_latency.synth.fleet`: presets and :func:`~bayes_latency.synth.fleet.simulate_fleet`.
- :mod:`~bayes_latency.synth.realism`: comparison with real step summaries (a script).

Never imports :mod:`bayes_latency.data` (the data layer reads what this package writes).
"""
