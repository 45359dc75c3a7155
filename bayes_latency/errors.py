"""Error types of bayes_latency. Every error the package raises on bad input is one of these."""

from __future__ import annotations


class BayesLatencyError(Exception):
    """Base class of all errors raised by bayes_latency on bad input or failed checks."""


class TraceFormatError(BayesLatencyError):
    """A trace or results file does not follow the expected format.

    Parameters
    ----------
    file, line, field
        Where the problem is (``line`` is 1-based; any may be None when unknown).
    message
        What is wrong.
    """

    def __init__(self, message: str, file: str | None = None, line: int | None = None,
                 field: str | None = None) -> None:
        self.file, self.line, self.field, self.message = file, line, field, message
        where = ", ".join(p for p in (
            f"file {file}" if file else "",
            f"line {line}" if line is not None else "",
            f"field {field!r}" if field else "",
        ) if p)
        super().__init__(f"{where}: {message}" if where else message)


class ConfigError(BayesLatencyError):
    """A serving, model or GPU configuration is invalid or incomplete."""


class UnknownArchitectureError(ConfigError):
    """A model name or config.json that the physics layer cannot describe."""


class UnknownGPUError(ConfigError):
    """A GPU name that has no datasheet."""


class PriorError(BayesLatencyError):
    """A prior file is invalid (names file, term and field)."""


class ConvergenceError(BayesLatencyError):
    """A fit did not pass its convergence gates."""


class AdequacyError(BayesLatencyError):
    """A fitted model does not explain the data it was fitted to (the adequacy gate of
    :mod:`bayes_latency.checks.adequacy`)."""


class GateWarning(UserWarning):
    """A gate of :func:`bayes_latency.fit` failed and the model was returned all the same
    (``on_failure="warn"``)."""


class ModelMismatchError(BayesLatencyError):
    """A saved posterior was made by another model version, priors or term set."""


class TableLayoutError(BayesLatencyError):
    """A folder of ingested tables whose manifest and partition files disagree."""
