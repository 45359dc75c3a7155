"""bayes_latency: hierarchical Bayesian latency coefficients for vLLM simulators.

Layers (imports run downward only): ``physics`` (pure numpy) -> ``data`` / ``synth`` / ``priors``
-> ``model`` (PyMC) -> ``checks`` / ``export`` -> ``cli``. See ``docs/ARCHITECTURE.md``.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("bayes_latency")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0+local"

MODEL_VERSION = "4"  # 4: shared z of alike factors, ARD mask, bounded tilt; 3: full-path dof
"""Version of the statistical model's structure; bumped whenever saved posteriors stop being comparable."""
