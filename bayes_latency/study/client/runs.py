"""The 12 normal real runs' client metrics as workload rows of the real-data fit.

:func:`client_stages` turns each load stage of the real lifecycle runs (``h100-lifecycle/``,
read by :func:`~bayes_latency.study.blis.spec.find_runs`) into a
:class:`~bayes_latency.schedule.replay.ClientStage`: the stage's achieved rate, request count, the
profile's shared-prefix prompts (11 system prompts x 4 users; each user's prompt repeats), the
output lengths the server generated (the profile's ``output_len``: ``ignore_eos``, see
:func:`~bayes_latency.calibrate.stages.generated_output_pdf`), KV blocks per GPU as BLIS
computes them, and the
stage's measured means of TTFT and E2E (successes). The 4 overloaded ``reasoning`` runs are
stress cases and stay out of every fit.

:func:`calibrated_fit` fits the real step and benchmark rows together with these rows through
:func:`bayes_latency.calibrate.loop.calibrate`.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import pandas as pd

from bayes_latency.calibrate.loop import (
    Calibration,
    calibrate,
    config_means,
    population_start,
)
from bayes_latency.data.client.lifecycle import read_lifecycle_dir
from bayes_latency.physics.basis import replay_terms
from bayes_latency.schedule.replay import ClientStage
from bayes_latency.study.blis.spec import RealRun, kv_blocks_per_gpu
from bayes_latency.study.settings import FitSettings

__all__ = ["FAST_FIT", "calibrated_fit", "client_stages", "drop_model", "drop_run",
           "require_kernels"]

#: The calibration's first iterations: 2 x 250 draws after 250 tuning steps (the loop needs only
#: posterior means while the rows move; the last fits use the caller's settings).
FAST_FIT = FitSettings(draws=250, tune=250)


def require_kernels() -> None:
    """Stop before any fit when the kernel tables (the optional extra) are absent, naming
    ``--no-kernels``: a study whose fits take them by default."""
    from bayes_latency.data.kernel_evidence import kernel_evidence
    from bayes_latency.errors import BayesLatencyError

    try:
        kernel_evidence()
    except BayesLatencyError as e:
        raise BayesLatencyError(f"{e} (or --no-kernels: every fit without them)") from e


def client_stages(runs: Sequence[RealRun], include_stress: bool = False) -> list[ClientStage]:
    """One :class:`ClientStage` per load stage of ``runs`` (normal runs only by default)."""
    out: list[ClientStage] = []
    for r in runs:
        if r.stress and not include_stress:
            continue
        kv = kv_blocks_per_gpu(json.loads(r.model_config.read_text(encoding="utf-8")), r.tp)
        table, _ = read_lifecycle_dir(r.path)
        st = table[table["stage"] != "summary"].sort_values("stage_index")
        if len(st) != len(r.stages):
            raise RuntimeError(f"{r.run_id}: {len(st)} stage files for {len(r.stages)} stages")
        prompt = int(round(r.prompt_len_mean)) if math.isfinite(r.prompt_len_mean) \
            else r.system_prompt_len + r.question_len
        for s, (_, row) in zip(r.stages, st.iterrows(), strict=True):
            out.append(ClientStage(
                run_id=r.short_id, stage=int(s.index), model=r.model, gpu="H100", tp=r.tp,
                observed={"ttft_mean_us": float(row["ttft_mean_s"]) * 1e6,
                          "e2e_mean_us": float(row["e2e_mean_s"]) * 1e6,
                          "output_len_mean": float(s.output_len_mean)},
                kv_blocks=kv, rate=s.rate, count=s.count, prompt_len=prompt,
                output_pdf=s.output_pdf, system_prompt_len=r.system_prompt_len,
                num_groups=r.num_groups, users_per_group=r.users_per_group,
                max_num_batched_tokens=r.max_num_batched_tokens, max_num_seqs=r.max_num_seqs,
                workload=r.workload))
    return out


def _fitter(settings: FitSettings, terms: Sequence[str], population: Any = None
            ) -> Callable[[pd.DataFrame], Any]:
    from bayes_latency.study.cv import fit_ours

    def fit(obs: pd.DataFrame) -> Any:
        return fit_ours(obs, settings, terms=terms, population=population)[0]

    return fit


def calibrated_fit(base: pd.DataFrame, stages: Sequence[ClientStage], settings: FitSettings,
                   terms: Sequence[str], start_settings: FitSettings | None = None,
                   start_model: Any = None, max_iter: int = 4, tol: float = 0.01,
                   log: Callable[[str], None] | None = print, fast_iter: int = 4,
                   population: Any = None) -> Calibration:
    """Calibrate on ``base`` rows plus the client rows of ``stages``.

    ``fast_iter``: most iterations with the short fit :data:`FAST_FIT` before the ones with
    ``settings`` (0: none; see :func:`~bayes_latency.calibrate.loop.calibrate`).

    The first replay runs at the posterior means of ``start_model`` (or of a fit of ``base``
    alone with ``start_settings``; unseen configurations at the population's prediction).
    ``population``: a fleet's :class:`~bayes_latency.model.posterior.fleet.Population`, the prior of every
    configuration of the fits (and, without ``start_model``, of the first replay,
    :func:`~bayes_latency.calibrate.loop.population_start`).
    """
    from bayes_latency.model.estimator import posterior_only

    start = None
    t0 = time.perf_counter()
    if start_model is None and len(base) and start_settings is not None:
        with posterior_only():   # only its posterior means are used
            start_model = _fitter(start_settings, terms)(base)
    start_fit_s = time.perf_counter() - t0
    if start_model is not None:
        start = config_means(start_model, stages, replay_terms(terms))
    elif population is not None:
        start = population_start(population, stages, replay_terms(terms))
    fast = _fitter(replace(FAST_FIT, kernels=settings.kernels), terms, population) \
        if fast_iter else None
    cal = calibrate(base, stages, _fitter(settings, terms, population), terms=replay_terms(terms),
                    start=start,
                    tol=tol, max_iter=max_iter, log=log, fast_fit=fast,
                    max_fast_iter=max(fast_iter, 1))
    cal.timings["start_fit_s"] = start_fit_s
    return cal


def drop_run(obs: pd.DataFrame, run_id: str) -> pd.DataFrame:
    """``obs`` without the client rows of run ``run_id`` (``<model>-tp<N>-<workload>``)."""
    exp = obs["experiment_id"].astype(str)
    return obs[~exp.str.startswith(f"{run_id}/")].reset_index(drop=True)


def drop_model(obs: pd.DataFrame, model: str) -> pd.DataFrame:
    """``obs`` without any row of ``model`` (steps, benchmarks and client rows)."""
    return obs[obs["model"].astype(str) != model].reset_index(drop=True)

