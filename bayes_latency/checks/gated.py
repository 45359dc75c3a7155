"""The gated fit: the estimator's fit, then the convergence and adequacy gates.

:func:`fit` (``bayes_latency.fit``) is what ``bayes-latency fit`` runs
(:func:`bayes_latency.cli.fit.fit_command` calls it): :meth:`LatencyModel.fit
<bayes_latency.model.estimator.LatencyModel.fit>` (sampling on until the convergence gates pass,
up to ``max_draws``), optionally the posterior written to a file, then :func:`gate`: the
convergence gates (:meth:`LatencyModel.convergence
<bayes_latency.model.estimator.LatencyModel.convergence>`) and the adequacy gate
(:func:`~bayes_latency.checks.adequacy.check_fit`). It returns the fitted model and a
:class:`GateReport`.

Like ``pymc.sample``, which warns about R-hat and divergences but returns the draws, a failing
gate is a :class:`~bayes_latency.errors.GateWarning` by default and the model is returned;
``on_failure="raise"`` raises :class:`~bayes_latency.errors.ConvergenceError` (the convergence
gates failed) or :class:`~bayes_latency.errors.AdequacyError` (the model does not explain the
data) instead, as the CLI does (exit 1).
"""

from __future__ import annotations

import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from bayes_latency.checks import adequacy as _adequacy
from bayes_latency.checks.adequacy import AdequacyReport, AdequacyThresholds
from bayes_latency.errors import AdequacyError, ConfigError, ConvergenceError, GateWarning

if TYPE_CHECKING:  # pragma: no cover
    from bayes_latency.model.estimator import LatencyModel

__all__ = ["GateReport", "fit", "gate", "gate_summary"]

ON_FAILURE = ("warn", "raise", "ignore")


@dataclass
class GateReport:
    """The gates of a fit: convergence (R-hat, bulk ESS, divergences) and adequacy.

    Attributes
    ----------
    convergence
        :meth:`LatencyModel.convergence
        <bayes_latency.model.estimator.LatencyModel.convergence>`'s dict (``max_rhat``,
        ``min_ess_bulk``, ``divergences``, ``approximate``, ``passed``, ``failures``,
        ``hints`` and, when sampling went on past ``draws``, ``extension``).
    adequacy
        :class:`~bayes_latency.checks.adequacy.AdequacyReport` of the posterior predictive
        checks of the fitted rows (and workload means, given requests).
    requests_rows
        Rows of the requests table the adequacy gate had (None: no requests table).
    seconds
        Wall time of the fit and of the gates.
    """

    convergence: dict[str, Any]
    adequacy: AdequacyReport
    requests_rows: int | None = None
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """Both gates passed."""
        return bool(self.convergence["passed"]) and bool(self.adequacy.passed)

    @property
    def failures(self) -> list[str]:
        """One line per failing gate check (convergence first), with the convergence hints."""
        conv = list(self.convergence["failures"]) + (
            list(self.convergence.get("hints", [])) if self.convergence["failures"] else [])
        return conv + [f"adequacy: {f}" for f in self.adequacy.failures]

    def adequacy_summary(self) -> str:
        """What the adequacy gate checked, in words (:func:`gate_summary`)."""
        return gate_summary(self.adequacy.table, self.requests_rows)

    def format(self) -> str:
        """The report as text: the convergence numbers, the extension's checks, the adequacy
        verdict."""
        c = self.convergence
        lines = [f"max R-hat {c['max_rhat']:.4f}, min bulk ESS {c['min_ess_bulk']:.0f}, "
                 f"divergences {c['divergences']}"
                 + (" [APPROXIMATE: no MCMC diagnostics]" if c["approximate"] else "")]
        if c.get("extension"):
            lines.append(extension_summary(c["extension"]))
        lines.append("convergence gates " + (
            "passed" if c["passed"] else
            "FAILED: " + "; ".join(list(c["failures"]) + list(c.get("hints", [])))))
        lines.append(f"adequacy gate passed ({self.adequacy_summary()})" if self.adequacy.passed
                     else "adequacy gate FAILED, the model does not explain the data: "
                     + "; ".join(self.adequacy.failures) + f" ({self.adequacy_summary()})")
        return "\n".join(lines)

    __str__ = format

    def raise_if_failed(self) -> None:
        """Raise :class:`~bayes_latency.errors.ConvergenceError` when the convergence gates
        failed (the message also names adequacy failures), else
        :class:`~bayes_latency.errors.AdequacyError` when the adequacy gate failed."""
        if not self.convergence["passed"]:
            raise ConvergenceError("; ".join(self.failures))
        if not self.adequacy.passed:
            raise AdequacyError("the model does not explain the data (adequacy gate): "
                                + "; ".join(self.adequacy.failures))


def extension_summary(extension: list[dict]) -> str:
    """The checkpoints of a fit that sampled on while the gates failed, in one line: where the
    gates failed, and where and why sampling stopped (per ``target_accept``)."""
    parts = []
    for ta in dict.fromkeys(e.get("target_accept") for e in extension):
        checks = [e for e in extension if e.get("target_accept") == ta]
        failed = [str(e["draws"]) for e in checks if e["decision"] == "continue"]
        last = checks[-1]
        end = {"pass": f"passed at {last['draws']}",
               "max_draws": f"stopped at max_draws {last['draws']}",
               "continue": f"stopped at {last['draws']}"}.get(
            last["decision"], f"stopped at {last['draws']}: {last['decision']}")
        text = (f"gates failed at {', '.join(failed)}, " if failed else "") + end
        parts.append(f"{text} (target_accept {ta})" if ta is not None else text)
    return "convergence checks (draws per chain): " + "; ".join(parts)


def gate_summary(table: pd.DataFrame, requests: pd.DataFrame | int | None) -> str:
    """What the adequacy gate checked, in words: the step-level and workload checks it ran.

    ``table`` is the gate's table of checks (column ``level``: ``step`` or ``workload``);
    ``requests`` the requests table given to it, or its row count (None when there was none), so
    that a gate that had requests but could check no workload mean says so.
    """
    n_step = int((table["level"] == "step").sum()) if "level" in table else 0
    n_wl = int((table["level"] == "workload").sum()) if "level" in table else 0
    text = f"{n_step} step-level checks (LOO-PIT, band coverage)"
    if n_wl:
        return text + f", {n_wl} workload-mean checks"
    if requests is None:
        return text + "; no requests table, so no workload-mean checks"
    n = requests if isinstance(requests, int) else len(requests)
    return text + f"; no workload mean could be checked from {n:,} request rows"


def gate(model: LatencyModel, observations: pd.DataFrame,
         requests: pd.DataFrame | None = None, *, seed: int = 0, gates: dict | None = None,
         thresholds: AdequacyThresholds | None = None) -> GateReport:
    """The convergence and adequacy gates of a fitted ``model`` (fitted or loaded).

    ``observations`` are the rows it was fitted to; ``requests`` the requests table (workload
    means are checked only with it); ``gates`` the convergence thresholds
    (:data:`~bayes_latency.model.inference.convergence.GATES`), ``thresholds`` the adequacy ones.
    """
    t0 = time.perf_counter()
    conv = model.convergence(gates)
    adq, _, _ = _adequacy.check_fit(model, observations, requests, seed=seed, thresholds=thresholds)
    return GateReport(convergence=conv, adequacy=adq,
                      requests_rows=None if requests is None else len(requests),
                      seconds={"gates_s": time.perf_counter() - t0})


def fit(observations: pd.DataFrame, requests: pd.DataFrame | None = None, *,
        model: LatencyModel | None = None, out: str | Path | None = None,
        on_failure: str = "warn", gates: dict | None = None,
        thresholds: AdequacyThresholds | None = None, seed: int = 0,
        **fit_kwargs: Any) -> tuple[LatencyModel, GateReport]:
    """Fit and gate, as ``bayes-latency fit`` does: ``model, report = bayes_latency.fit(obs)``.

    Parameters
    ----------
    observations
        The observation table (``bayes-latency ingest``'s ``observations``).
    requests
        Optional requests table of the same ingest, for the adequacy gate's workload means.
    model
        An unfitted :class:`~bayes_latency.model.estimator.LatencyModel` carrying the priors,
        terms, method and sampler (default: ``LatencyModel()``).
    out
        Write the posterior there (``.nc`` or ``.zarr``, atomically) right after sampling,
        before the gates, so that a failing gate leaves the fit on disk.
    on_failure
        ``"warn"`` (default): a :class:`~bayes_latency.errors.GateWarning` per failing gate,
        the model is returned; ``"raise"``: :meth:`GateReport.raise_if_failed`; ``"ignore"``:
        only the report says it.
    gates
        Convergence thresholds (:data:`~bayes_latency.model.inference.convergence.GATES`), used while
        sampling goes on and by the gate.
    thresholds
        Adequacy thresholds (:class:`~bayes_latency.checks.adequacy.AdequacyThresholds`).
    seed
        Seed of the sampler and of the predictive checks.
    fit_kwargs
        :meth:`LatencyModel.fit <bayes_latency.model.estimator.LatencyModel.fit>`'s arguments
        (``draws``, ``tune``, ``chains``, ``max_draws``, ``progress``, ``target_accept`` ...).

    Returns
    -------
    (LatencyModel, GateReport)
        The fitted model and its gates (``report.passed``, ``report.failures``).
    """
    from bayes_latency.model.estimator import LatencyModel
    from bayes_latency.model.inference.progress import progress_mode

    if on_failure not in ON_FAILURE:
        raise ConfigError(f"on_failure={on_failure!r}: expected one of {ON_FAILURE}")
    progress = progress_mode(fit_kwargs.pop("progress", True))
    m = model if model is not None else LatencyModel()
    t0 = time.perf_counter()
    m.fit(observations, seed=seed, progress=progress, gates=gates, **fit_kwargs)
    fit_s = time.perf_counter() - t0
    if out is not None:
        from bayes_latency.io import atomic_path

        with atomic_path(out) as tmp:
            m.save(tmp)
    if progress != "none":
        print("adequacy gate: posterior predictive checks of the fitted rows...",
              file=sys.stderr, flush=True)
    report = gate(m, observations, requests, seed=seed, gates=gates, thresholds=thresholds)
    report.seconds["fit_s"] = fit_s
    if on_failure == "raise":
        report.raise_if_failed()
    elif on_failure == "warn" and not report.passed:
        warnings.warn("bayes_latency.fit: the gates failed: " + "; ".join(report.failures),
                      GateWarning, stacklevel=2)
    return m, report
