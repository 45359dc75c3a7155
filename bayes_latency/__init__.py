"""bayes_latency: hierarchical Bayesian latency coefficients for vLLM simulators.

Layers (imports run downward only): ``physics`` (pure numpy) -> ``data`` / ``synth`` / ``priors``
-> ``model`` (PyMC) -> ``checks`` / ``export`` -> ``cli``. See ``docs/ARCHITECTURE.md``.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("bayes_latency")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0+local"

MODEL_VERSION = "12"  # 12: ArviZ-ready file layout (see CHANGELOG.md)
"""Version of the statistical model's structure; bumped whenever saved posteriors stop being comparable."""

#: Names importable from the package without importing the modules that define them up front
#: (``from bayes_latency import LatencyModel`` imports the estimator, not PyMC or ArviZ).
_LAZY = {
    "LatencyModel": "bayes_latency.model.estimator",
    "select": "bayes_latency.model.selection",
    "load_priors": "bayes_latency.priors",
    "diagnose": "bayes_latency.checks.diagnostics",
    "BayesLatencyError": "bayes_latency.errors",
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
