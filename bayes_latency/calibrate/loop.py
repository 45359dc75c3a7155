"""Calibrate from client-side results: replay, fit, replay again until the rows stop moving.

The rows of a client run (:mod:`bayes_latency.schedule.replay`) are linear in the coefficients once
the run's schedule is known, and the schedule depends on the coefficients. :func:`calibrate`
solves that fixed point:

1. replay every client stage at the current coefficients of its configuration (the posterior
   mean of the previous fit; at the start, the start coefficients given, else the prior medians);
2. fit the step, journey and benchmark rows together with the client rows (one hierarchical fit,
   the client rows with their own noise kinds), and take the new posterior means;
3. replay again at the new means and compare the rows' predicted means at those same
   coefficients under the old and the new schedule; stop when every mean moved less than
   ``tol`` (relative) or less than ``tol_noise`` of its kind's fitted noise scale (or after
   ``max_iter`` fits).

The fit of the last iteration is returned with the history (iterations, final change). A
configuration with only client rows gets its posterior from them plus the hierarchy; one with
traces too gets both.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from bayes_latency.calibrate.predict import (  # noqa: F401  (re-exported: split by concern)
    FLEET_ROWS,
    MIN_ALPHA_FACTOR,
    PRIOR_ROWS,
    client_predictions,
    draw_matrices,
    run_level_coefficients,
    run_level_sigma,
    ttft_alpha_share,
)
from bayes_latency.errors import ConfigError
from bayes_latency.physics.basis import ALPHA_TERMS, DEFAULT_TERMS, term_names
from bayes_latency.physics.hardware import load_gpu
from bayes_latency.physics.models import load_architecture
from bayes_latency.schedule.replay import (
    WORKLOAD_KINDS,
    ClientStage,
    Replay,
    elasticities,
    predicted_means,
    replay_stage,
    workload_rows,
)

__all__ = ["DEFAULT_MAX_ITER", "DEFAULT_TOL", "DEFAULT_TOL_NOISE", "FITTED_KINDS",
           "MAX_FIT_ELASTICITY", "Calibration", "calibrate",
           "client_predictions", "config_means", "draw_matrices", "population_start", "replay_all",
           "run_level_coefficients", "run_level_sigma", "scale_start", "ttft_alpha_share"]

#: Largest relative change of any predicted client mean between two replays at the same
#: coefficients for the loop to stop.
DEFAULT_TOL = 0.01
#: ... or below this fraction of the row's fitted noise scale.
DEFAULT_TOL_NOISE = 0.25
DEFAULT_MAX_ITER = 6
#: Relative step of beta for the elasticities of the tangent rows.
BUMP = 0.05
#: Estimated seconds of one stage's replay, for ``run_units``' inline/cluster choice (measured
#: 2.2 CPU-s for the 24 real stages with the compiled loop; 1.5 s each before it).
REPLAY_COST_S = 0.1
#: The client kinds that are fitted (``workload_decode`` is implied by them, role ``ppc``).
FITTED_KINDS = ("workload_ttft", "workload_e2e")
#: A client mean whose replayed engine part moves more than this many times as fast as beta is
#: not fitted (role ``ppc``: replayed and reported, not in the likelihood), from the first
#: replay that shows it to the end of the loop. Such a stage runs near its ``max_num_seqs`` or
#: KV capacity, where the mean wait is set by the bursts of the arrivals: a 1% change of the
#: step time moves it by 10-50%, so the row says little about beta that the stage's E2E does
#: not, and its tangent holds only for steps far below the fit's own uncertainty. Measured on
#: the real runs: Llama-2-7B general stage 1 (TTFT elasticity 35-50) made the loop's largest
#: change go 19.8% -> 2.7% -> 4.8% -> 7.4% over four fits and 31% at the third
#: fit of a rerun, never settling. With this limit the real study leaves out three TTFT rows
#: (the 20 req/s stages of Llama-2-70B, Llama-2-7B and Mixtral general) and the loop settles in
#: 5 fits (final change 0.45%).
MAX_FIT_ELASTICITY = 10.0


@dataclass
class Calibration:
    """Result of :func:`calibrate`.

    Attributes
    ----------
    model
        The last fit (a fitted :class:`~bayes_latency.model.estimator.LatencyModel`).
    observations
        The rows it was fitted on (the base rows plus the last client rows).
    rows
        The last client rows (kinds :data:`~bayes_latency.schedule.replay.WORKLOAD_KINDS`).
    history
        One row per iteration: ``iteration, fit_s, replay_s, max_change, worst_row,
        max_change_sigma, rows_moving, damping, max_elasticity, n_rows, n_client_rows,
        n_unfitted`` (``max_change`` and the stop rule over the fitted client rows only)
        (``max_change``: largest relative change of a predicted client mean when the schedule is
        replayed again at the fit's posterior mean).
    converged
        Whether no row was still moving at the last iteration (see :func:`calibrate`).
    replays
        The last replays, by experiment id.
    unfitted
        ``obs_id`` of the client rows left out of the fit for their elasticity
        (:data:`MAX_FIT_ELASTICITY`); their rows are in ``rows`` with role ``ppc``.
    timings
        Wall seconds of the loop's phases: ``scale_start_s`` (:func:`scale_start`),
        ``first_replay_s`` (the first rows' replays) and ``total_s`` (the whole call; the fits
        and later replays are in ``history``).
    """

    model: Any
    observations: pd.DataFrame
    rows: pd.DataFrame
    history: pd.DataFrame
    converged: bool
    replays: dict[str, Replay] = field(default_factory=dict)
    elasticity: pd.DataFrame = field(default_factory=pd.DataFrame)
    unfitted: tuple[str, ...] = ()
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def iterations(self) -> int:
        """Number of fits."""
        return len(self.history)

    @property
    def final_change(self) -> float:
        """Last ``max_change``."""
        return float(self.history["max_change"].iloc[-1]) if len(self.history) else math.nan


def config_means(model: Any, stages: Sequence[ClientStage], terms: Sequence[str],
                 seed: int = 0) -> dict[str, tuple[np.ndarray, dict[str, float]]]:
    """Posterior-mean ``(beta over terms, {alpha_term: value})`` of every stage's configuration.

    Terms the model did not fit get 0 (the value an export writes for them).
    """
    out: dict[str, tuple[np.ndarray, dict[str, float]]] = {}
    names = list(term_names(terms))
    for s in stages:
        cid = s.config_id
        if cid in out:
            continue
        ds = model.coefficients(s.model, s.gpu, s.tp, seed=seed)
        b = ds["beta"].mean("sample")
        fitted = {str(t): float(v) for t, v in zip(b["term"].values, b.values, strict=True)}
        beta = np.array([fitted.get(t, 0.0) for t in names])
        a = ds["alpha"].mean("sample")
        alpha = {str(t): float(v) for t, v in zip(a["alpha_term"].values, a.values, strict=True)}
        out[cid] = (beta, alpha)
    return out


def _replay_unit(stage: ClientStage, beta: np.ndarray, terms: tuple[str, ...],
                 seed: int) -> Replay:
    return replay_stage(stage, load_architecture(stage.model), load_gpu(stage.gpu), beta, terms,
                        seed=seed)


def replay_all(stages: Sequence[ClientStage], coefs: Mapping[str, tuple[np.ndarray, Any]],
               terms: Sequence[str], seed: int = 0, scheduler: Any = "inline",
               bump: float = BUMP, done: Mapping[str, Replay] | None = None
               ) -> tuple[dict[str, Replay], pd.DataFrame, pd.DataFrame]:
    """Replay every stage at its configuration's coefficients, and again with beta scaled by
    ``1 + bump``; the replays, their tangent rows and the elasticities.

    ``done``: replays already made at exactly these coefficients (by experiment id); only the
    bumped replays run then.

    Returns
    -------
    (replays, rows, elasticity)
        Replays by experiment id, the client rows (:func:`~bayes_latency.schedule.replay.
        workload_rows` with the elasticities; ``bump=0``: fixed-schedule rows) and one row per
        stage with the elasticity of each kind.
    """
    from bayes_latency.parallel import run_units

    terms = tuple(term_names(terms))
    units = []
    for s in stages:
        cid = s.config_id
        if cid not in coefs:
            raise ConfigError(f"client stage {s.experiment_id}: no coefficients for {cid}")
        b = np.asarray(coefs[cid][0], dtype=float)
        if done is None:
            units.append((s, b, terms, seed))
        if bump > 0:
            units.append((s, b * (1.0 + bump), terms, seed))
    out = run_units(_replay_unit, units, scheduler=scheduler, cost_s=REPLAY_COST_S * len(units),
                    desc="replay", unit="stage")
    if done is not None:   # interleave the given replays with the bumped ones
        full: list[Replay] = []
        for s, r in zip(stages, out, strict=True):
            full += [done[s.experiment_id], r]
        out = full
    step = 2 if bump > 0 else 1
    reps = out[::step]
    rows, el = [], []
    for i, (s, r) in enumerate(zip(stages, reps, strict=True)):
        e = elasticities(r, out[step * i + 1], bump) if bump > 0 else None
        rows.append(workload_rows(s, r, load_architecture(s.model), load_gpu(s.gpu), terms,
                                  elasticity=e))
        el.append({"experiment_id": s.experiment_id, **{f"e_{k}": (e or {}).get(k, 1.0)
                                                        for k in WORKLOAD_KINDS}})
    return ({s.experiment_id: r for s, r in zip(stages, reps, strict=True)},
            pd.concat(rows, ignore_index=True), pd.DataFrame(el))


def _prior_start(stages: Sequence[ClientStage], terms: Sequence[str]
                 ) -> dict[str, tuple[np.ndarray, dict[str, float]]]:
    from bayes_latency.priors import load_priors

    pri = load_priors()
    out = {}
    for s in stages:
        gpu = load_gpu(s.gpu).name
        beta = np.array([float(pri.term(t, gpu=gpu)["median"]) for t in term_names(terms)])
        alpha = {a: float(pri.term(a, gpu=gpu)["median"]) for a in ALPHA_TERMS}
        out[s.config_id] = (beta, alpha)
    return out


def population_start(population: Any, stages: Sequence[ClientStage], terms: Sequence[str]
                     ) -> dict[str, tuple[np.ndarray, dict[str, float]]]:
    """Start coefficients from a fleet population: per stage configuration, the prior median
    ``exp(mean log m)`` of :meth:`~bayes_latency.model.posterior.fleet.Population.config_prior` (terms
    the population does not fit get 0)."""
    names = list(term_names(terms))
    cfgs = {s.config_id: (s.model, load_gpu(s.gpu).name, int(s.tp)) for s in stages}
    table = pd.DataFrame([{"config_id": k, "model": load_architecture(m).name, "gpu": g, "tp": t}
                          for k, (m, g, t) in cfgs.items()]).set_index("config_id")
    prior = population.config_prior(table)
    coefs = list(population.coefs)
    out = {}
    for i, cid in enumerate(table.index):
        med = np.exp(prior.mean[i])
        beta = np.array([med[coefs.index(t)] if t in coefs else 0.0 for t in names])
        alpha = {a: float(med[coefs.index(a)]) for a in ALPHA_TERMS if a in coefs}
        out[str(cid)] = (beta, alpha)
    return out


def scale_start(stages: Sequence[ClientStage],
                coefs: Mapping[str, tuple[np.ndarray, Mapping[str, float]]],
                terms: Sequence[str], seed: int = 0, max_eval: int = 8,
                log: Callable[[str], None] | None = None
                ) -> dict[str, tuple[np.ndarray, dict[str, float]]]:
    """Start coefficients near the fixed point: per configuration, one factor ``c`` on beta such
    that the replayed mean E2E of its stages matches the measured one (a secant search on
    ``log c``, each step a replay), and ``alpha_arrival`` set from the TTFT gap.

    A start far from the data (e.g. the population's prediction for an unseen model, or prior
    medians) can put a loaded stage past its capacity in the replay, where the rows of the first
    fit say little; this costs a few replays per configuration instead of a few fits.
    """
    terms = tuple(term_names(terms))
    by: dict[str, list[ClientStage]] = {}
    for s in stages:
        cid = s.config_id
        by.setdefault(cid, []).append(s)
    out = {k: (np.asarray(v[0], dtype=float), dict(v[1])) for k, v in coefs.items()}
    for cid, sts in by.items():
        beta0, alpha = out[cid]
        obs = np.array([s.observed.get("e2e_mean_us", math.nan) for s in sts])
        ok = np.isfinite(obs) & (obs > 0)
        if not ok.any():
            continue

        def gap(c: float, sts: list[ClientStage] = sts, beta0: np.ndarray = beta0,
                alpha: Mapping[str, float] = alpha, ok: np.ndarray = ok,
                obs: np.ndarray = obs) -> tuple[float, list[Replay]]:
            reps = [_replay_unit(s, c * beta0, terms, seed) for s in sts]
            pred = np.array([predicted_means(r, c * beta0, alpha)["workload_e2e"]
                             for r in reps])
            return float(np.mean(np.log(pred[ok] / obs[ok]))), reps

        g0, reps = gap(1.0)
        x0, best = 0.0, (abs(g0), 0.0, reps, g0)
        x1 = -g0                              # linear guess: log c = -gap
        n_eval = 1
        while n_eval < max_eval and best[0] > 1e-3:
            x1 = float(np.clip(x1, math.log(0.02), math.log(50.0)))
            g1, reps1 = gap(math.exp(x1))
            n_eval += 1
            if abs(g1) < best[0]:
                best = (abs(g1), x1, reps1, g1)
            if g1 == g0:
                break
            x0, x1, g0 = x1, x1 - g1 * (x1 - x0) / (g1 - g0), g1
        _, x_best, reps, g_best = best
        c = math.exp(x_best)
        # alpha_arrival from the TTFT gap of the replay at the chosen scale
        tt = [(s.observed.get("ttft_mean_us", math.nan),
               predicted_means(r, c * beta0, {**alpha, "alpha_arrival": 0.0})["workload_ttft"])
              for s, r in zip(sts, reps, strict=True)]
        gaps = [o - p for o, p in tt if math.isfinite(o) and o > p]
        alpha = dict(alpha)
        if gaps:
            alpha["alpha_arrival"] = float(np.median(gaps))
        out[cid] = (c * beta0, alpha)
        if log:
            log(f"[calibrate] start {cid}: beta x {c:.3g} ({n_eval} replays, E2E gap "
                f"{g_best:+.2%}), alpha_arrival {alpha.get('alpha_arrival', math.nan):.0f} us")
    return out


def _changes(stages: Sequence[ClientStage], old: Mapping[str, Replay],
             old_el: pd.DataFrame, new: Mapping[str, Replay],
             coefs: Mapping[str, tuple[np.ndarray, Mapping[str, float]]],
             model: Any = None) -> pd.DataFrame:
    """Per stage and fitted kind, the relative gap at the new coefficients between the old rows'
    prediction of a client mean (tangent at the old schedule) and a new replay's (``change``),
    and the same gap in units of the kind's fitted noise scale (``change_sigma``)."""
    out = []
    el = old_el.set_index("experiment_id")
    for s in stages:
        cid = s.config_id
        b, a = coefs[cid]
        r0, r1 = old[s.experiment_id], new[s.experiment_id]
        p0 = predicted_means(r0, b, a)
        p1 = predicted_means(r1, b, a)
        for k in FITTED_KINDS:
            e = float(el.loc[s.experiment_id, f"e_{k}"])
            # tangent: e * f0 . b - (e - 1) * f0 . b0 (+ alpha), f0 . b0 = the old engine mean
            p0k = p0[k] + (e - 1.0) * (float(r0.features[k] @ b) - r0.engine_us[k])
            c = abs(p1[k] / p0k - 1.0) if p0k > 0 else math.inf
            sig = float(model.noise(cid, k).sigma) if model is not None else math.nan
            cs = abs(math.log(p1[k] / p0k)) / sig if p0k > 0 and sig > 0 else math.inf
            out.append({"experiment_id": s.experiment_id, "kind": k,
                        "obs_id": f"{s.experiment_id}/{k}", "change": c,
                        "change_sigma": cs, "elasticity": e})
    return pd.DataFrame(out)


def _blend(old: Mapping[str, tuple[np.ndarray, Mapping[str, float]]],
           new: Mapping[str, tuple[np.ndarray, Mapping[str, float]]], lam: float
           ) -> dict[str, tuple[np.ndarray, dict[str, float]]]:
    """Coefficients ``lam`` of the way from ``old`` to ``new`` (geometric where both > 0)."""
    if lam >= 1.0:
        return {k: (np.asarray(v[0]), dict(v[1])) for k, v in new.items()}
    out = {}
    for k, (bn, an) in new.items():
        bo, ao = old.get(k, (bn, an))
        bo, bn = np.asarray(bo, dtype=float), np.asarray(bn, dtype=float)
        pos = (bo > 0) & (bn > 0)
        b = np.where(pos, np.exp((1 - lam) * np.log(np.where(pos, bo, 1.0))
                                 + lam * np.log(np.where(pos, bn, 1.0))),
                     (1 - lam) * bo + lam * bn)
        a = {t: float((ao.get(t, v) ** (1 - lam)) * (v ** lam)) if v > 0 and ao.get(t, v) > 0
             else float(v) for t, v in an.items()}
        out[k] = (b, a)
    return out


def _unfit(rows: pd.DataFrame, el: pd.DataFrame, unfitted: set[str], limit: float
           ) -> pd.DataFrame:
    """Give role ``ppc`` to the client rows above the elasticity ``limit`` (adding them to
    ``unfitted``, which only grows) and to those already in it."""
    e = el.set_index("experiment_id")
    for k in FITTED_KINDS:
        hot = e.index[e[f"e_{k}"].to_numpy(float) > limit]
        unfitted.update(f"{x}/{k}" for x in hot)
    rows = rows.copy()
    rows.loc[rows["obs_id"].isin(unfitted), "role"] = "ppc"
    return rows


def calibrate(base: pd.DataFrame, stages: Sequence[ClientStage],
              fit: Callable[[pd.DataFrame], Any], terms: Sequence[str] = DEFAULT_TERMS,
              start: Mapping[str, tuple[np.ndarray, Mapping[str, float]]] | None = None,
              tol: float = DEFAULT_TOL, max_iter: int = DEFAULT_MAX_ITER, seed: int = 0,
              tol_noise: float = DEFAULT_TOL_NOISE,
              scheduler: Any = "inline", log: Callable[[str], None] | None = print,
              scale: bool = True, fast_fit: Callable[[pd.DataFrame], Any] | None = None,
              max_fast_iter: int = DEFAULT_MAX_ITER,
              max_fit_elasticity: float = MAX_FIT_ELASTICITY) -> Calibration:
    """Fit ``base`` rows plus the client rows of ``stages`` at a self-consistent schedule.

    Parameters
    ----------
    base
        Observation rows of traces and benchmarks (may be empty: client results only).
    stages
        The client stages (their measured means are the rows' values).
    fit
        ``fit(observations) -> fitted LatencyModel`` (sampler settings are the caller's).
    terms
        Terms of the replayed features (every term the fit may use; the fit's own terms are
        whatever ``fit`` builds). Default: BLIS's 11.
    start
        ``{config_id: (beta over terms, {alpha_term: value})}`` of the first replay; missing
        configurations start at the prior medians.
    tol, tol_noise, max_iter
        Stop when every predicted client mean moved, between the old rows and a replay at the
        new posterior mean, by less than ``tol`` (relative) or less than ``tol_noise`` of its
        kind's fitted noise scale (rows near a stage's capacity, whose elasticity is tens, move
        by the Monte Carlo error of the posterior mean alone); or after ``max_iter`` fits.
    seed
        Seed of the drawn requests (the same in every replay).
    scheduler
        Where the replays run (:func:`bayes_latency.parallel.run_units`).
    log
        Progress lines (None: quiet).
    scale
        Move the start to match each configuration's measured mean E2E first
        (:func:`scale_start`).
    fast_fit, max_fast_iter
        A cheap fit (e.g. fewer draws) for the first iterations: the loop runs with it until
        the rows settle (at most ``max_fast_iter`` fits), then goes on with ``fit``; it has
        converged only when the rows settle after a ``fit`` (``max_iter`` counts those). The
        Laplace sampler is not a good cheap fit: its posterior mean over directions the rows
        leave flat moved the first iteration's largest change between 1.8% and 5.9% from run
        to run on the calibrate command's test result.
    max_fit_elasticity
        Client rows whose elasticity exceeds this are replayed and reported but not fitted
        (:data:`MAX_FIT_ELASTICITY`); the stop rule ignores them.

    Returns
    -------
    Calibration
    """
    from bayes_latency.model.estimator import posterior_only

    if not stages:
        raise ConfigError("calibrate: no client stage to replay")
    if not (tol > 0) or max_iter < 1:
        raise ConfigError("calibrate: tol must be > 0 and max_iter >= 1")
    t_call = time.perf_counter()
    terms = tuple(term_names(terms))
    say = log or (lambda _m: None)
    coefs = dict(_prior_start(stages, terms))
    if start:
        coefs.update({k: (np.asarray(v[0], dtype=float), dict(v[1])) for k, v in start.items()})
    if scale:
        coefs = scale_start(stages, coefs, terms, seed=seed, log=say)
    t_first = time.perf_counter()
    replays, rows, el = replay_all(stages, coefs, terms, seed=seed, scheduler=scheduler)
    timings = {"scale_start_s": t_first - t_call, "first_replay_s": time.perf_counter() - t_first}
    unfitted: set[str] = set()
    rows = _unfit(rows, el, unfitted, max_fit_elasticity)
    hist: list[dict[str, Any]] = []
    model, obs = None, base
    converged = False
    lam, last_change = 1.0, math.inf
    fast, n_full, n_fast, it = fast_fit is not None, 0, 0, 0
    while True:
        it += 1
        obs = pd.concat([base, rows], ignore_index=True) if len(base) else rows
        xcols = [c for c in obs.columns if c.startswith("x_")]
        obs[xcols] = obs[xcols].fillna(0.0)
        t = time.perf_counter()
        if fast:  # only its posterior means are used: no ArviZ groups beyond the posterior
            with posterior_only():
                model, n_fast = fast_fit(obs), n_fast + 1
        else:
            model, n_full = fit(obs), n_full + 1
        fit_s = time.perf_counter() - t
        post = config_means(model, stages, terms, seed=seed)
        t = time.perf_counter()
        new_replays, _, _ = replay_all(stages, post, terms, seed=seed, scheduler=scheduler,
                                       bump=0.0)
        ch_all = _changes(stages, replays, el, new_replays, post, model)
        ch = ch_all[~ch_all["obs_id"].isin(unfitted)].reset_index(drop=True)
        if ch.empty:
            raise ConfigError("calibrate: every client mean is past its stage's capacity "
                              f"(elasticity above {max_fit_elasticity:g}); nothing to fit")
        w = int(np.argmax(ch["change"].to_numpy()))
        change, where = float(ch["change"].iloc[w]), f"{ch['experiment_id'].iloc[w]}/" \
            f"{ch['kind'].iloc[w]}"
        # a row has settled when it moved less than tol, or less than tol_noise of its noise
        open_rows = ch[(ch["change"] >= tol) & ~(ch["change_sigma"] < tol_noise)]
        max_e = float(el[[f"e_{k}" for k in FITTED_KINDS]].to_numpy().max())
        tm = getattr(model, "timings", {}) or {}
        hist.append({"iteration": it, "fit": "fast" if fast else "full", "fit_s": fit_s,
                     "compile_s": float(tm.get("compile_s", math.nan)),
                     "arviz_groups_s": float(tm.get("arviz_groups_s", math.nan)),
                     "max_change": change, "worst_row": where,
                     "max_change_sigma": float(ch["change_sigma"].max()),
                     "rows_moving": len(open_rows), "damping": lam, "max_elasticity": max_e,
                     "n_rows": len(obs), "n_client_rows": int((rows["role"] != "ppc").sum()),
                     "n_unfitted": len(unfitted)})
        say(f"[calibrate] iteration {it} ({'fast' if fast else 'full'} fit): fit {fit_s:.0f} s, "
            "largest change of a client mean "
            f"{change:.2%} ({where}; {float(ch['change_sigma'].max()):.2f} noise sd at most), "
            f"{len(open_rows)} row(s) still moving, largest elasticity {max_e:.2f}, "
            f"damping {lam:g}")
        if open_rows.empty and not fast:
            converged = True
            hist[-1]["replay_s"] = time.perf_counter() - t
            break
        if not fast and n_full >= max_iter:
            hist[-1]["replay_s"] = time.perf_counter() - t
            break
        if fast and (open_rows.empty or n_fast >= max_fast_iter):
            # settled under the cheap fit: the full fit takes over from these coefficients
            fast, lam, last_change = False, 1.0, math.inf
        else:
            if not math.isfinite(change) or change > last_change:
                lam = max(lam / 2.0, 0.125)      # oscillating: take shorter steps
            last_change = change
        coefs = _blend(coefs, post, lam)
        # undamped, the next rows are at ``post``, whose replays are made: bump only
        replays, rows, el = replay_all(stages, coefs, terms, seed=seed, scheduler=scheduler,
                                       done=new_replays if lam >= 1.0 else None)
        rows = _unfit(rows, el, unfitted, max_fit_elasticity)
        hist[-1]["replay_s"] = time.perf_counter() - t
    if unfitted:
        say(f"[calibrate] not fitted (elasticity above {max_fit_elasticity:g}): "
            + ", ".join(sorted(unfitted)))
    timings["total_s"] = time.perf_counter() - t_call
    return Calibration(model=model, observations=obs, rows=rows, history=pd.DataFrame(hist),
                       converged=converged, replays=replays, elasticity=el,
                       unfitted=tuple(sorted(unfitted)), timings=timings)
