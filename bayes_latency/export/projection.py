"""A regime posterior handed to BLIS: its coefficients projected onto BLIS's additive basis over
the steps of one workload.

BLIS times a step with its 11 additive terms (:data:`~bayes_latency.physics.basis.DEFAULT_TERMS`).
The ``regime`` term set adds the compute knees (``compute_over_2w``, ``compute_over_6w``:
``max(C - k W, 0)``, the step's compute past ``k`` times its weight read), which no BLIS slot
holds. Their cost is carried to BLIS by the prefill compute slot, at an operating point: over the
steps ``X`` (steps x terms) a workload produces, each coefficient draw ``b`` gives the knees' time
``K = X_knees b_knees`` per step, and the least-squares shift of ``prefill_compute`` that best
reproduces it is

    delta = (x_pc . K) / (x_pc . x_pc) = sum_k b_k (x_pc . x_k) / (x_pc . x_pc)

(linear in the draw, so every draw is projected exactly and the bands come from the draws). The
projected ``prefill_compute`` is ``b_pc + delta`` (floored at 0); every other coefficient is
kept. Least squares in µs weighs the steps by their time, which is what a simulated latency sums.

A projection is exact only on the workload it was made on: :class:`Projection` carries its own
error there (the additive step times of the posterior-mean vector against the regime's, per step
and summed), and the export's notes name the workload and that error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import xarray as xr

from bayes_latency.errors import BayesLatencyError
from bayes_latency.physics.basis import DEFAULT_TERMS, REGIME_TERMS

__all__ = ["KNEE_TERMS", "Projection", "project_onto_blis", "project_over_stages",
           "replayed_step_features"]

#: The terms of the ``regime`` set that BLIS has no slot for.
KNEE_TERMS: tuple[str, ...] = tuple(t for t in REGIME_TERMS if t not in DEFAULT_TERMS)
#: The BLIS term that carries the knees' cost.
CARRIER = "prefill_compute"


@dataclass(frozen=True)
class Projection:
    """A posterior's coefficients on BLIS's basis at one workload, with the projection's error.

    Attributes
    ----------
    coefs
        ``beta`` (sample, term) over the posterior's terms without the knees, ``alpha`` as given.
    n_steps, n_prefill_steps
        Steps of the workload, and those with prefill tokens.
    step_mdape_pct, step_p90_pct
        Median and 90th percentile of ``|additive / regime - 1|`` over the steps (%), for the
        posterior-mean coefficients.
    total_error_pct
        Relative error of the summed step time (%), same vectors.
    carrier_mean_before, carrier_mean_after
        Posterior mean of ``prefill_compute`` before and after the projection.
    notes
        What was done, in words.
    """

    coefs: xr.Dataset
    n_steps: int
    n_prefill_steps: int
    step_mdape_pct: float
    step_p90_pct: float
    total_error_pct: float
    carrier_mean_before: float
    carrier_mean_after: float
    notes: list[str] = field(default_factory=list)


def project_onto_blis(coefs: xr.Dataset, X: np.ndarray, terms: Sequence[str],
                      workload: str = "the workload") -> Projection:
    """Project the knee terms of ``coefs`` onto ``prefill_compute`` over the steps ``X``.

    Parameters
    ----------
    coefs
        ``beta`` (sample, term) and ``alpha`` (sample, alpha_term), as
        :meth:`~bayes_latency.model.estimator.LatencyModel.coefficients` returns them.
    X
        Features of the workload's steps over ``terms`` (steps x terms).
    terms
        Term order of ``X``; must hold every term of ``coefs["beta"]``.
    workload
        What the steps are, for the notes.

    Returns
    -------
    Projection

    Raises
    ------
    BayesLatencyError
        ``X`` malformed (not 2-D over ``terms``, non-finite or negative values, no steps), a
        coefficient term missing from ``terms``, or a posterior with knees but without
        ``prefill_compute``.
    """
    X = np.asarray(X, dtype=float)
    terms = [str(t) for t in terms]
    if X.ndim != 2 or X.shape[1] != len(terms) or X.shape[0] == 0:
        raise BayesLatencyError(f"{workload}: step features must be (steps >= 1) x {len(terms)} "
                                f"terms, got shape {X.shape}")
    if not np.all(np.isfinite(X)) or np.any(X < 0):
        raise BayesLatencyError(f"{workload}: step features must be finite and >= 0")
    bterms = [str(t) for t in coefs["beta"]["term"].values]
    if missing := [t for t in bterms if t not in terms]:
        raise BayesLatencyError(f"{workload}: no step features of the posterior's terms {missing}")
    Xb = X[:, [terms.index(t) for t in bterms]]
    B = np.asarray(coefs["beta"].transpose("sample", "term").values, dtype=float)
    knees = [i for i, t in enumerate(bterms) if t in KNEE_TERMS]
    keep = [i for i, t in enumerate(bterms) if t not in KNEE_TERMS]
    kterms = [bterms[i] for i in keep]
    if knees and CARRIER not in kterms:
        raise BayesLatencyError(f"the posterior has the knee terms {[bterms[i] for i in knees]}"
                                f" but no {CARRIER!r} to carry their cost to BLIS")
    j = kterms.index(CARRIER) if CARRIER in kterms else None  # its column of Bp
    x_pc = Xb[:, bterms.index(CARRIER)] if j is not None else np.zeros(len(Xb))
    has_prefill = x_pc > 0
    Bp = B[:, keep].copy()
    notes: list[str] = []
    if not knees:
        notes.append("the posterior's terms are BLIS's own: nothing to project")
    elif (denom := float(x_pc @ x_pc)) <= 0:
        notes.append(f"{workload} has no prefill step: the knees cost nothing there and "
                     f"{CARRIER} is kept")
    else:
        w = (x_pc @ Xb[:, knees]) / denom              # (n_knees,)
        Bp[:, j] = np.maximum(Bp[:, j] + B[:, knees] @ w, 0.0)
    before = float(B[:, bterms.index(CARRIER)].mean()) if j is not None else float("nan")
    after = float(Bp[:, j].mean()) if j is not None else float("nan")
    t_regime = Xb @ B.mean(axis=0)
    t_add = Xb[:, keep] @ Bp.mean(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.abs(t_add / t_regime - 1.0)[t_regime > 0] * 100.0
    total = float((t_add.sum() / t_regime.sum() - 1.0) * 100.0) if t_regime.sum() > 0 else 0.0
    beta = xr.DataArray(Bp.astype(coefs["beta"].dtype), dims=("sample", "term"),
                        coords={"term": [bterms[i] for i in keep]})
    out = xr.Dataset({"beta": beta, "alpha": coefs["alpha"]}, attrs=dict(coefs.attrs))
    if knees:
        notes.append(
            f"knee terms {[bterms[i] for i in knees]} projected onto {CARRIER} over the "
            f"{len(Xb):,} steps of {workload} ({int(has_prefill.sum()):,} with prefill): "
            f"{CARRIER} {before:.4g} -> {after:.4g} (posterior mean); the additive step times "
            f"of the mean vector against the regime's: median error "
            f"{np.median(rel) if rel.size else 0.0:.2f}%, 90th percentile "
            f"{np.percentile(rel, 90) if rel.size else 0.0:.2f}%, summed time {total:+.2f}%. "
            "The projection holds for this workload; another workload needs its own")
    return Projection(coefs=out, n_steps=int(len(Xb)), n_prefill_steps=int(has_prefill.sum()),
                      step_mdape_pct=float(np.median(rel)) if rel.size else 0.0,
                      step_p90_pct=float(np.percentile(rel, 90)) if rel.size else 0.0,
                      total_error_pct=total, carrier_mean_before=before,
                      carrier_mean_after=after, notes=notes)


def replayed_step_features(stages: Sequence, model: str, gpu: str, beta: np.ndarray,
                           terms: Sequence[str], seed: int = 0) -> np.ndarray:
    """Features over ``terms`` (steps x terms) of every step of ``stages``
    (:class:`~bayes_latency.schedule.replay.ClientStage`) replayed by the package's scheduler at
    the coefficients ``beta`` (over ``terms``): the operating point of a projection."""
    from bayes_latency.physics.hardware import load_gpu
    from bayes_latency.physics.models import load_architecture
    from bayes_latency.schedule.replay import replay_stage

    arch, g = load_architecture(model), load_gpu(gpu)
    feats = [replay_stage(st, arch, g, beta, terms, seed=seed, keep_steps=True).step_features
             for st in stages]
    return np.concatenate(feats) if feats else np.zeros((0, len(terms)))


def project_over_stages(coefs: xr.Dataset, stages: Sequence, model: str, gpu: str,
                        workload: str, seed: int = 0, draws: Sequence[xr.Dataset] = ()
                        ) -> tuple[Projection, list[xr.Dataset]]:
    """:func:`project_onto_blis` of ``coefs`` over the steps of ``stages`` replayed at their
    posterior-mean coefficients (:func:`replayed_step_features`), and of each of ``draws``
    (other coefficient sets of the configuration, e.g. run-level draws) over the same steps."""
    terms = [str(t) for t in coefs["term"].values]
    mean = np.asarray(coefs["beta"].mean("sample").values, dtype=float)
    X = replayed_step_features(stages, model, gpu, mean, terms, seed=seed)
    return (project_onto_blis(coefs, X, terms, workload=workload),
            [project_onto_blis(d, X, terms, workload=workload).coefs for d in draws])
