"""bayes_latency: hierarchical Bayesian latency coefficients for vLLM simulators.

Layers (imports run downward only): ``physics`` (pure numpy) -> ``data`` / ``synth`` / ``priors``
-> ``model`` (PyMC) -> ``checks`` / ``export`` -> ``cli``. See ``docs/ARCHITECTURE.md``.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("bayes_latency")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0+local"

MODEL_VERSION = "13"  # what each version changed: CHANGELOG.md
"""Version of the statistical model's structure; bumped whenever saved posteriors stop being comparable."""

#: The public API: names importable from the package without importing the modules that define
#: them up front (``from bayes_latency import LatencyModel`` imports the estimator, not PyMC or
#: ArviZ). Notebooks and scripts use these; module paths below them may change between versions.
#: ``bayes_latency.fit`` is the gated fit of :mod:`bayes_latency.checks.gated` (what
#: ``bayes-latency fit`` runs); ``LatencyModel.fit`` is the estimator step under it.
_LAZY = {
    # fleets and tables
    "simulate_fleet": "bayes_latency.synth.fleet",
    "ingest": "bayes_latency.data.experiment",
    "load_tables": "bayes_latency.data.experiment",
    "read_table": "bayes_latency.data.tables",
    "load_observations": "bayes_latency.data.tables",
    # real measurements without request journeys: step summaries and microbenchmarks
    "load_step_table": "bayes_latency.data.steps",
    "iterations_from_steps": "bayes_latency.data.steps",
    "read_splitwise": "bayes_latency.data.microbench",
    "observations_from_iterations": "bayes_latency.data.observations.build",
    "observations_from_microbench": "bayes_latency.data.observations.build",
    # the model
    "LatencyModel": "bayes_latency.model.estimator",
    "fit": "bayes_latency.checks.gated",
    "GateReport": "bayes_latency.checks.gated",
    "select": "bayes_latency.model.posterior.selection",
    "load_priors": "bayes_latency.priors",
    # checks
    "diagnose": "bayes_latency.checks.diagnostics",
    "compare_variants": "bayes_latency.checks.diagnostics",
    "check_fit": "bayes_latency.checks.adequacy",
    "run_checks": "bayes_latency.checks.run",
    "prior_sensitivity": "bayes_latency.checks.sensitivity",
    # exports
    "export_document": "bayes_latency.export.document",
    "blis_yaml": "bayes_latency.export.document",
    "provenance": "bayes_latency.export.document",
    "blis_block": "bayes_latency.export.document",
    "blis_flags": "bayes_latency.export.document",
    "blis_draws": "bayes_latency.export.document",
    "blis_notes": "bayes_latency.export.document",
    "export_notes": "bayes_latency.export.document",
    "summarize_coefficients": "bayes_latency.export.document",
    "predict_reference": "bayes_latency.model.posterior.predict",
    # client results and calibration
    "read_client_results": "bayes_latency.data.client.read",
    "client_stages": "bayes_latency.calibrate.stages",
    "stages_table": "bayes_latency.calibrate.stages",
    "default_kv_blocks": "bayes_latency.calibrate.stages",
    "synthetic_vllm_bench": "bayes_latency.synth.client_result",
    # physics
    "load_architecture": "bayes_latency.physics.models",
    "load_gpu": "bayes_latency.physics.hardware",
    "ServingConfig": "bayes_latency.physics.serving",
    "basis_matrix": "bayes_latency.physics.basis",
    "DEFAULT_TERMS": "bayes_latency.physics.basis",
    "BLIS_BETA_ORDER": "bayes_latency.physics.basis",
    "BayesLatencyError": "bayes_latency.errors",
    "ConvergenceError": "bayes_latency.errors",
    "AdequacyError": "bayes_latency.errors",
}

__all__ = ["MODEL_VERSION", "__version__", *_LAZY]


def __getattr__(name: str) -> object:
    """Import the public names of :data:`_LAZY` on first use (PEP 562)."""
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'bayes_latency' has no attribute {name!r}")
