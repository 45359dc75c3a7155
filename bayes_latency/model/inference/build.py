"""From an observation table to the PyMC model: rows, design, identifiability, stage 1.

:func:`prepare` checks the table's columns, keeps the rows a fit is made on
(:func:`~bayes_latency.model.posterior.persistence.table_rows`), lays out the :class:`~bayes_latency.model.definition.design.Design`,
hashes the rows and measures which coefficients the configurations identify (notes for the fit
report when some are identified only jointly everywhere). :func:`stage_one` computes the
per-configuration likelihood summaries of the fast path (:func:`~bayes_latency.model.definition.summaries.summarize`, under
the noise prior of the prior file). :func:`no_gate` and :func:`sum_groups` say which terms go
without an ARD gate and which coefficients the rows give only as a weighted sum, and
:func:`build_pymc_model` builds the model (:func:`~bayes_latency.model.definition.hierarchy.build_model`) from all of these.

Importing this module is light (no PyMC, PyTensor or ArviZ; :mod:`bayes_latency.model.definition.hierarchy` is imported when
a model is built).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from bayes_latency.data.observations.table import peak_compute_note
from bayes_latency.data.report import IngestReport
from bayes_latency.errors import ConfigError
from bayes_latency.model.definition.identifiability import IdentifiabilityReport, identifiability
from bayes_latency.model.definition.likelihood import DEFAULT_NOISE_LOAD
from bayes_latency.model.definition.rows import feature_columns
from bayes_latency.model.definition.runs import too_many_runs
from bayes_latency.model.definition.summaries import ConfigSummary, NoisePrior, summarize
from bayes_latency.model.posterior.persistence import physical_rows, rows_hash, table_rows

if TYPE_CHECKING:  # pragma: no cover
    import pymc as pm

    from bayes_latency.model.definition.design import Design


def coefficient_scale(priors: Any, coefs: tuple[str, ...]) -> np.ndarray:
    """Typical magnitude of each coefficient: its prior median."""
    return np.asarray([priors.prior_median(c) for c in coefs], dtype=float)


@dataclass(frozen=True)
class Prepared:
    """A table made ready for a fit: its rows, design, data hash and identifiability."""

    rows: pd.DataFrame
    design: Design
    data_hash: str
    identifiability: IdentifiabilityReport


def prepare(observations: pd.DataFrame, terms: tuple[str, ...], alpha_terms: tuple[str, ...],
            scale: np.ndarray, report: IngestReport) -> Prepared:
    """The rows of ``observations`` a fit is made on, with their design (dropped rows and
    jointly identified groups noted in ``report``)."""
    from bayes_latency.model.definition.hierarchy import Design

    coefs = tuple(terms) + tuple(alpha_terms)
    missing = [c for c in feature_columns(coefs) + ["value_us", "kind", "role", "config_id",
                                                    "model", "gpu", "tp", "n_steps"]
               if c not in observations.columns]
    if missing:
        raise ConfigError(f"observation table lacks columns {missing} needed by terms {coefs}")
    rows = table_rows(observations, coefs, report)
    if rows.empty:
        raise ConfigError("no observation rows to fit (roles beta/alpha with positive values)")
    rows, fast = physical_rows(observations, rows, report)
    if note := peak_compute_note(fast):
        report.notes.append(note)
    if note := too_many_runs(rows):
        report.notes.append(note)
    configs = (rows[["config_id", "model", "gpu", "tp", "stack"]].drop_duplicates("config_id")
               .set_index("config_id").sort_index())
    configs["tp"] = configs["tp"].astype(int)
    design = Design(coefs, tuple(terms), tuple(alpha_terms), configs)
    data_hash = rows_hash(rows, coefs)
    ident = identifiability(rows, coefs, scale)
    for g in ident.confounded_everywhere:
        report.notes.append(
            f"no configuration separates {'+'.join(g)}: the rows identify only a combination; "
            "their split comes from the hierarchy (differences between configurations) and "
            "the priors")
    return Prepared(rows=rows, design=design, data_hash=data_hash, identifiability=ident)


def stage_one(rows: pd.DataFrame, design: Design, priors: Any, scale: np.ndarray,
              report: IngestReport, scheduler: Any = None,
              noise_load: str = DEFAULT_NOISE_LOAD) -> list[ConfigSummary]:
    """The fast path's per-configuration likelihood summaries of ``rows`` (configurations whose
    optimiser did not report convergence noted in ``report``)."""
    from bayes_latency.model.definition.hierarchy import prior_arrays

    pa = prior_arrays(priors, design.coefs, design.gpus)
    noise_prior = NoisePrior(sigma=dict(pa.noise_sigma), nu_alpha=pa.nu_alpha, nu_beta=pa.nu_beta)
    summaries = summarize(rows, design.coefs, scale, noise_prior=noise_prior, scheduler=scheduler,
                          load=noise_load)
    bad = [s.config_id for s in summaries if not s.converged]
    if bad:
        report.notes.append(f"stage-1 optimiser did not report convergence for {bad}")
    return summaries


def sum_groups(rows: pd.DataFrame | None, coefs: tuple[str, ...]
               ) -> list[tuple[list[str], np.ndarray, dict[str, np.ndarray]]]:
    """Groups of coefficients the fitted rows give only as a weighted sum, with the typical
    and the per-configuration weights (:func:`~bayes_latency.model.definition.identifiability.pooled_groups`;
    ``sum_groups`` of :func:`~bayes_latency.model.definition.hierarchy.build_model`); none without rows."""
    from bayes_latency.model.definition.identifiability import pooled_groups

    if rows is None:
        return []
    groups = pooled_groups(rows, list(coefs))
    return [(g.coefs, g.weights, g.config_weights) for g in groups]


def no_gate(ident: IdentifiabilityReport | None, rows: pd.DataFrame | None,
            coefs: tuple[str, ...]) -> tuple[str, ...]:
    """Terms without an ARD gate: those that no configuration identifies on their own
    (in a group of :attr:`IdentifiabilityReport.confounded_everywhere`, or without data:
    features zero in every fitted row). Their relevance is the prior's call either way, and
    the gate's kink and heavy tail only add modes and curvature (see
    :func:`~bayes_latency.model.definition.hierarchy._population`)."""
    groups = ident.confounded_everywhere if ident else []
    off = {c for g in groups for c in g}
    if rows is not None:
        X = rows[feature_columns(coefs)].to_numpy(dtype=float)
        off |= {c for c, used in zip(coefs, (X != 0).any(axis=0), strict=True) if not used}
    return tuple(sorted(off))


def build_pymc_model(design: Design, priors: Any, rows: pd.DataFrame, *, variant: str,
                     ident: IdentifiabilityReport | None,
                     summaries: list[ConfigSummary] | None = None,
                     population_prior: Any = None,
                     noise_load: str = DEFAULT_NOISE_LOAD, kernels: Any = None) -> pm.Model:
    """The PyMC model of ``rows``: on the summaries when given (fast path), else on every row;
    variant ``population`` under ``population_prior``
    (:meth:`~bayes_latency.model.posterior.fleet.Population.config_prior` of ``design.configs``);
    ``kernels``: :class:`~bayes_latency.data.kernel_evidence.KernelEvidence` of the hierarchy
    (:mod:`bayes_latency.model.definition.kernels`)."""
    from bayes_latency.model.definition.hierarchy import build_model

    if variant == "population":
        return build_model(design, priors, variant=variant, summaries=summaries,
                           rows=None if summaries is not None else rows,
                           population_prior=population_prior)
    kw = {"no_gate": no_gate(ident, rows, design.coefs),
          "sum_groups": sum_groups(rows, design.coefs), "kernels": kernels}
    if summaries is not None:
        return build_model(design, priors, variant=variant, summaries=summaries, **kw)
    return build_model(design, priors, variant=variant, rows=rows, noise_load=noise_load, **kw)
