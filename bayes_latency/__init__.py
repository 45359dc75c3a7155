"""bayes_latency: hierarchical Bayesian latency coefficients for vLLM simulators.

Layers (imports run downward only): ``physics`` (pure numpy) -> ``data`` / ``synth`` / ``priors``
-> ``model`` (PyMC) -> ``checks`` / ``export`` -> ``cli``. See ``docs/ARCHITECTURE.md``.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("bayes_latency")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0+local"

MODEL_VERSION = "11"  # 11: no TP effect on weight_loading (prior file hierarchy.tp.without; held-out real TP-8 configurations, #15); 10: no ARD gate on a pair of terms that no configuration tells apart, configurations where each is flat on its own not counting as telling them apart (per_layer / per_step on the real data and the demo fleet; #14, #15); 9: steps that carry prefill work (iteration and benchmark-mean rows) have a noise of their own, per (configuration, noise class) (#15); 8: exact sum-only groups pooled only where their weights agree across configurations, near pairs (features proportional wherever both are non-zero, e.g. decode_compute + per_request on the real data) sampled as sum-only groups, optional config_common shift (#15), derived variables computed after sampling (#15 speed); 7: sum-only groups sampled through their sum with shared factor effects, two-level factor scales fixed, sigma_config fixed below 2 configurations (#15), multi-step rows centred at log mu + sigma^2/2 (1 - 1/n) (#15); 6: common stack shift at fixed scales, sigma_config truncated at 0.25, no ARD gate on alpha (#15), client rows (#14); 5: ArviZ groups + priors embedded (#18), factors that split configurations alike share z (#15); 3: full-path dof
"""Version of the statistical model's structure; bumped whenever saved posteriors stop being comparable."""

#: Names importable from the package without importing the modules that define them up front
#: (``from bayes_latency import LatencyModel`` imports the estimator, not PyMC or ArviZ).
#: ``bayes_latency.fit`` is the gated fit of :mod:`bayes_latency.checks.gated` (what
#: ``bayes-latency fit`` runs); ``LatencyModel.fit`` is the estimator step under it.
_LAZY = {
    "LatencyModel": "bayes_latency.model.estimator",
    "fit": "bayes_latency.checks.gated",
    "GateReport": "bayes_latency.checks.gated",
    "load_priors": "bayes_latency.priors",
    "diagnose": "bayes_latency.checks.diagnostics",
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
