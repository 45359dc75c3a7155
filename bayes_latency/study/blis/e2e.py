"""The real client in the loop: the 16 real runs simulated in BLIS, real vs simulated.

``bayes-latency study blis --blis PATH [--exports DIR] --out results/real`` runs, for every real
run of ``h100-lifecycle/`` (see :mod:`bayes_latency.study.blis.spec` for how a run becomes BLIS
workload specs), ``blis run --latency-model trained-physics`` with

(a) BLIS's published coefficients (:data:`~bayes_latency.study.blis.spec.PUBLISHED`), and
(b) when ``--exports`` is given, the package's export ``<model>-h100-tp<N>.yaml`` of the run's
    configuration: its mean block, and ``--draws`` of its posterior draws, whose simulated means
    give a 90% prediction band (order statistics of the draws, :func:`band`) for the mean E2E and TTFT.

Each load stage is one BLIS invocation per expansion (:data:`~bayes_latency.study.blis.spec.
EXPANSIONS`): ``prefix`` (open-loop Poisson arrivals at the rate the real client achieved, the
stage's request count, each user's whole prompt cached, the generated output lengths) and
``inference-perf`` (the profile's ``inference_perf:`` fields expanded by BLIS: closed-loop
sessions, the system prompt shared), both with explicit per-GPU KV blocks and the same workload
seeds; the per-request records of the stages (``--metrics-path`` JSON, ``requests``) are pooled
into the run's statistics, as the client's summary pools its stages. Real numbers are the client's
successes; on the simulated side the 4 overloaded reasoning runs get the client's 300 s deadline
(``--timeout``) and only completed requests count, the 12 normal runs have no deadline.

Writes ``OUT/blis_e2e.md`` and ``OUT/blis_e2e.csv`` (one row per run x coefficient source x
expansion),
atomically (:mod:`~bayes_latency.study.blis.report`). Signed relative errors are ``sim / real - 1``.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import math
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from bayes_latency.study.blis.metrics import (  # noqa: F401 - re-exported (see __all__)
    SimStats,
    StageResult,
    band,
    parse_metrics,
    pool_stages,
    rel_err,
)
from bayes_latency.study.blis.spec import (
    CLIENT_TIMEOUT_S,
    EXPANSIONS,
    FIXED_FLAGS,
    PUBLISHED,
    BlisSetupError,
    Coefficients,
    RealRun,
    StageWorkload,
    blis_flags,
    export_path,
    kv_blocks_per_gpu,
    load_export,
    workload_spec,
)

__all__ = ["BlisSetup", "SimStats", "StageResult", "band", "blis_command", "check_blis",
           "load_sources", "parse_metrics", "pool_stages", "rel_err", "run_study"]

#: Default number of posterior draws simulated per run (the 90% band is an order-statistic interval of their means). One pass over the 16
#: runs (24 BLIS invocations) takes ~53 s of BLIS CPU time, so published + mean + 20 draws is
#: ~22 x 53 s / 2 cores, about 10 minutes on 2 otherwise idle cores.
DEFAULT_DRAWS = 20


# ----------------------------------------------------------------------------- setup
@dataclass(frozen=True)
class BlisSetup:
    """A usable BLIS: binary, ``defaults.yaml``, ``hardware_config.json`` and commit (if known)."""

    binary: Path
    defaults: Path
    hardware_config: Path
    commit: str = "unknown"


def check_blis(binary: str | Path | None, data_dir: str | Path | None = None) -> BlisSetup:
    """Check that ``binary`` is a BLIS that runs, and find its data files.

    ``defaults.yaml`` and ``hardware_config.json`` are looked up in ``data_dir``, ``$BLIS_SRC``,
    the binary's folder and ``<binary folder>/src``; the commit in ``COMMIT`` next to the binary.

    Raises
    ------
    BlisSetupError
        One line: no binary given, not executable, ``blis run --help`` fails, data files missing.
    """
    if not binary:
        raise BlisSetupError("no BLIS binary: pass --blis PATH or set BLIS_BIN")
    b = Path(binary).expanduser()
    if not b.is_file() or not os.access(b, os.X_OK):
        raise BlisSetupError(f"BLIS binary {b} is not an executable file")
    try:
        proc = subprocess.run([str(b), "run", "--help"], capture_output=True, text=True,
                              timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        raise BlisSetupError(f"{b} run --help failed: {exc}") from exc
    if proc.returncode != 0 or "--workload-spec" not in proc.stdout \
            or "--total-kv-blocks" not in proc.stdout:
        raise BlisSetupError(f"{b} run --help failed or is not BLIS (exit {proc.returncode})")
    cands = [Path(p) for p in (data_dir, os.environ.get("BLIS_SRC")) if p]
    cands += [b.resolve().parent, b.resolve().parent / "src"]
    for c in cands:
        if (c / "defaults.yaml").is_file() and (c / "hardware_config.json").is_file():
            commit_file = b.resolve().parent / "COMMIT"
            commit = commit_file.read_text().strip()[:40] if commit_file.is_file() else "unknown"
            return BlisSetup(b, c / "defaults.yaml", c / "hardware_config.json", commit)
    raise BlisSetupError("no folder with BLIS's defaults.yaml and hardware_config.json among "
                         + ", ".join(str(c) for c in cands) + " (pass --blis-src DIR)")


def blis_command(setup: BlisSetup, run: RealRun, coeffs: Coefficients, spec_path: Path,
                 metrics_path: Path, model_dir: Path, kv_blocks: int) -> list[str]:
    """The ``blis run`` command of one stage of ``run`` with ``coeffs``."""
    cmd = [str(setup.binary), "run", "--model", run.hf_model,
           "--defaults-filepath", str(setup.defaults),
           "--hardware-config", str(setup.hardware_config),
           "--model-config-folder", str(model_dir), "--tp", str(run.tp),
           *FIXED_FLAGS, "--max-model-len", str(run.max_model_len),
           "--total-kv-blocks", str(kv_blocks),
           "--timeout", str(CLIENT_TIMEOUT_S if run.stress else -1),
           *blis_flags(coeffs), "--workload-spec", str(spec_path),
           "--metrics-path", str(metrics_path)]
    return cmd


# ----------------------------------------------------------------------------- running
@dataclass
class _Job:
    run: RealRun
    source: str
    draw: int  # -1: the block itself, else the posterior draw index
    coeffs: Coefficients
    stage: StageWorkload
    result: StageResult | None = None
    rep: int = 0  # a point set's arrival realization (:func:`point_seed`)
    expansion: str = "prefix"  # how the stage becomes a BLIS workload (spec.EXPANSIONS)


@dataclass
class StudyResult:
    """Everything :func:`run_study` measured."""

    table: pd.DataFrame
    runs: list[RealRun]
    setup: BlisSetup
    kv_blocks: dict[tuple[str, int], int]
    wall_s: float
    invocations: int
    invocation_s: list[float] = field(default_factory=list)
    invocation_cpu_s: list[float] = field(default_factory=list)
    n_draws: int = 0
    exports: str | None = None
    parallel: int = 2
    seed: int = 42
    draw_seeds: bool = True
    point_seeds: int = 1
    expansions: tuple[str, ...] = ("prefix",)
    #: One row per (run, posterior draw): its workload seed and simulated means (s), so bands
    #: can be recomputed without simulating again.
    draws: pd.DataFrame | None = None


#: Arrival realizations the ``export-mean`` point is averaged over (:func:`run_study`).
POINT_SEEDS = 5


def point_seed(seed: int, rep: int) -> int:
    """Workload seed of a point set's arrival realization ``rep``: ``seed`` for the first (the
    one the published coefficients share), ``seed + 1000 + rep`` for the others (clear of the
    draws' ``seed + 1 + i``)."""
    return int(seed) if rep == 0 else int(seed) + 1000 + int(rep)


def draw_seed(seed: int, draw: int, draw_seeds: bool = True) -> int:
    """Workload seed of one coefficient set: ``seed`` for a point set (``draw = -1``), and for
    posterior draw ``i`` ``seed + 1 + i`` when ``draw_seeds`` (an arrival realization of its own
    per draw), else ``seed``."""
    return int(seed) + 1 + int(draw) if (draw_seeds and draw >= 0) else int(seed)


def _run_job(job: _Job, setup: BlisSetup, work: Path, model_dirs: Mapping[str, Path],
             kv: Mapping[tuple[str, int], int], seed: int) -> StageResult:
    tag = (f"{job.run.run_id}-{job.expansion}-{job.source}-{job.draw}-r{job.rep}"
           f"-s{job.stage.index}")
    spec_path, metrics_path = work / f"{tag}.yaml", work / f"{tag}.json"
    spec = workload_spec(job.expansion, job.run, job.stage, seed=seed)
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    cmd = blis_command(setup, job.run, job.coeffs, spec_path, metrics_path,
                       model_dirs[job.run.model], kv[(job.run.model, job.run.tp)])
    env = dict(os.environ, GOMAXPROCS="1")
    err_path = work / f"{tag}.err"
    t0 = time.perf_counter()
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
        # wait4 gives the child's own CPU time (wall time depends on what else runs).
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    secs = time.perf_counter() - t0
    if proc.returncode != 0:
        lines = err_path.read_text(errors="replace").strip().splitlines() or ["(no stderr)"]
        raise BlisSetupError(f"BLIS failed on {tag} (exit {proc.returncode}): {lines[-1]}")
    res = parse_metrics(metrics_path)
    res.seconds, res.cpu_seconds = secs, usage.ru_utime + usage.ru_stime
    for p in (metrics_path, spec_path, err_path):
        p.unlink(missing_ok=True)
    return res


def load_sources(runs: Sequence[RealRun], exports: str | Path | None, n_draws: int
                  ) -> dict[tuple[str, int], tuple[Coefficients, list[Coefficients]]]:
    """Validate every export the runs need BEFORE simulating anything."""
    out: dict[tuple[str, int], tuple[Coefficients, list[Coefficients]]] = {}
    if exports is None:
        return out
    if not Path(exports).is_dir():
        raise BlisSetupError(f"exports folder {exports} does not exist")
    for r in runs:
        key = (r.model, r.tp)
        if key in out:
            continue
        mean, draws = load_export(export_path(exports, r.model, r.tp))
        if n_draws > 0 and len(draws) < n_draws:
            raise BlisSetupError(f"{export_path(exports, r.model, r.tp)}: {len(draws)} draws, "
                                 f"{n_draws} requested (--draws)")
        out[key] = (mean, draws[:n_draws])
    return out


def run_study(setup: BlisSetup, runs: Sequence[RealRun], exports: str | Path | None = None,
              n_draws: int = DEFAULT_DRAWS, parallel: int = 2, seed: int = 42,
              progress: Callable[[str], None] | None = None,
              sources: Mapping[tuple[str, int], tuple[Any, ...]] | None = None, draw_seeds: bool = True,
              point_seeds: int = POINT_SEEDS,
              expansions: Sequence[str] = ("prefix",)) -> StudyResult:
    """Simulate ``runs`` in BLIS with the published coefficients and (optionally) the exports.

    Parameters
    ----------
    setup
        From :func:`check_blis`.
    runs
        From :func:`~bayes_latency.study.blis.spec.find_runs`.
    exports
        Folder of ``<model>-h100-tp<N>.yaml`` exports; None: published coefficients only.
    n_draws
        Posterior draws simulated per run for the bands (0: none).
    parallel
        BLIS subprocesses at a time (threads waiting on them; each BLIS gets GOMAXPROCS=1).
    seed
        Workload seed of the point sets (``blis-published``, ``export-mean``: common random
        numbers, so their errors compare coefficients, not arrivals).
    draw_seeds
        Give every posterior draw its own workload seed (:func:`draw_seed`), so the band is
        the predictive band of a new run's mean: coefficient uncertainty, run-to-run scatter
        **and** the arrival realization. Near a stage's capacity the last dominates: measured on
        the client study's in-sample exports, Llama-2-70B TP4 general's simulated mean TTFT moved
        between -25% and +26% of the real one over 10 workload seeds at the same coefficients
        (sd 18.5%), against sd 0.1-0.7% for its codegen run and Mixtral general. False: the
        same seed for every set (the band of the coefficients alone, as before).
    point_seeds
        Arrival realizations the ``export-mean`` point is simulated with (:func:`point_seed`);
        its statistics pool their requests, so the point estimates the expected simulated
        metric at the exported coefficients rather than one realization's. The first uses
        ``seed``, like ``blis-published`` (one realization, the anchor). Near a stage's capacity
        one realization is far from the expectation: at the client study's in-sample exports,
        Llama-2-70B TP4 general's mean TTFT error was -29.1%, -3.9%, +47.5%, -26.3%, -26.7% and
        +8.8% with seeds 42-47; elsewhere the seeds move it by 0.1-0.7%. The spread over the
        realizations is reported (``ttft_mean_seed_sd``, ``e2e_mean_seed_sd``).
    progress
        Called with a short status line about every 10% of the invocations.
    sources
        ``{(model, tp): (mean, draws)}`` or ``(mean, draws, {label: point})`` used instead of
        reading ``exports`` (e.g. coefficients of an in-memory fit); ``draws`` are cut to
        ``n_draws``. Each extra point set (``label`` ``export-<name>``, e.g. ``export-median``)
        is simulated like ``export-mean`` (same arrival realizations) and gets its own rows.
    expansions
        How each stage becomes a BLIS workload (:data:`~bayes_latency.study.blis.spec.
        EXPANSIONS`): every coefficient set is simulated under each, with the same workload
        seeds, so the ``prefix`` numbers do not depend on what else is simulated.

    Returns
    -------
    StudyResult
        ``table``: one row per run x source (``blis-published``, ``export-mean``, the extra
        point sets) x expansion
        with real and simulated statistics, signed errors and, on ``export-mean`` rows, the
        draws' bands.
    """
    t_start = time.perf_counter()
    point_seeds = max(1, int(point_seeds))
    expansions = tuple(dict.fromkeys(expansions))
    unknown = [e for e in expansions if e not in EXPANSIONS]
    if unknown or not expansions:
        raise BlisSetupError(f"unknown expansion {unknown[0] if unknown else '(none)'!r}; "
                             f"choose from {', '.join(EXPANSIONS)}")
    extra: dict[tuple[str, int], dict[str, Coefficients]] = {}
    if sources is not None:
        for k, (_, _, *more) in sources.items():
            extra[k] = dict(more[0]) if more else {}
            bad = [lab for lab in extra[k] if not lab.startswith("export-")
                   or lab in ("export-mean", "export-draw")]
            if bad:
                raise BlisSetupError(f"point set label {bad[0]!r}: an extra point set is named "
                                     "export-<name>, other than export-mean and export-draw")
        sources = {k: (m, list(d)[:n_draws]) for k, (m, d, *_) in sources.items()}
        exports = exports if exports is not None else "(in memory)"
    else:
        sources = load_sources(runs, exports, n_draws)
    kv: dict[tuple[str, int], int] = {}
    for r in runs:
        if (r.model, r.tp) not in kv:
            kv[(r.model, r.tp)] = kv_blocks_per_gpu(json.loads(r.model_config.read_text()), r.tp)
    jobs: list[_Job] = []
    for r in runs:
        sets: list[tuple[str, int, Coefficients]] = [("blis-published", -1, PUBLISHED)]
        if (r.model, r.tp) in sources:
            mean, draws = sources[(r.model, r.tp)]
            sets.append(("export-mean", -1, mean))
            sets += [(lab, -1, c) for lab, c in extra.get((r.model, r.tp), {}).items()]
            sets += [("export-draw", i, d) for i, d in enumerate(draws)]
        for ex in expansions:
            for src, i, c in sets:
                reps = range(point_seeds if src.startswith("export-") and i < 0 else 1)
                jobs += [_Job(r, src, i, c, st, rep=k, expansion=ex)
                         for k in reps for st in r.stages]
    # Longest first (requests x output tokens) so two workers finish together.
    order = sorted(jobs, key=lambda j: -j.stage.count * j.stage.output_len_mean)
    with tempfile.TemporaryDirectory(prefix="blis_e2e_") as tmp:
        work = Path(tmp)
        model_dirs: dict[str, Path] = {}
        for r in runs:
            if r.model not in model_dirs:
                d = work / f"model-{r.model}"
                d.mkdir()
                shutil.copyfile(r.model_config, d / "config.json")
                model_dirs[r.model] = d
        done = 0
        with cf.ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
            futs = {pool.submit(_run_job, j, setup, work, model_dirs, kv,
                                point_seed(seed, j.rep) if j.draw < 0
                                else draw_seed(seed, j.draw, draw_seeds)): j for j in order}
            try:
                for fut in cf.as_completed(futs):
                    futs[fut].result = fut.result()
                    done += 1
                    if progress and (done % max(1, len(jobs) // 10) == 0 or done == len(jobs)):
                        progress(f"{done}/{len(jobs)} BLIS runs, "
                                 f"{time.perf_counter() - t_start:.0f} s")
            except BaseException:
                for f in futs:
                    f.cancel()
                raise
    pooled = _pooled_draws(runs, jobs)
    return StudyResult(table=_table(runs, jobs, kv, pooled),
                       draws=_draw_table(runs, jobs, seed, draw_seeds, pooled),
                       runs=list(runs), setup=setup, kv_blocks=kv,
                       wall_s=time.perf_counter() - t_start, invocations=len(jobs),
                       invocation_s=[j.result.seconds for j in jobs if j.result is not None],
                       invocation_cpu_s=[j.result.cpu_seconds for j in jobs
                                         if j.result is not None],
                       n_draws=n_draws if sources else 0,
                       exports=str(exports) if exports is not None else None, parallel=parallel,
                       seed=int(seed), draw_seeds=bool(draw_seeds),
                       point_seeds=point_seeds if sources else 1, expansions=expansions)


def _row(run: RealRun, source: str, sim: SimStats, kv: int,
         expansion: str = "prefix") -> dict[str, Any]:
    real = run.real
    row: dict[str, Any] = {
        "run_id": run.run_id, "run": run.short_id, "model": run.model, "tp": run.tp,
        "workload": run.workload, "stress": run.stress, "source": source,
        "expansion": expansion,
    }
    pairs = {"e2e_mean": ("e2e_mean_s", sim.e2e_mean), "e2e_p90": ("e2e_p90_s", sim.e2e_p90),
             "ttft_mean": ("ttft_mean_s", sim.ttft_mean), "ttft_p90": ("ttft_p90_s", sim.ttft_p90),
             "decode_interval": ("decode_interval_s", sim.decode_interval)}
    for m, (rk, sv) in pairs.items():
        row[f"real_{m}_s"] = real[rk]
        row[f"sim_{m}_s"] = sv
        row[f"err_{m}"] = rel_err(sv, real[rk])
    row.update({
        "real_output_len_mean": real["output_len_mean"], "sim_output_len_mean": sim.output_len_mean,
        "real_successes": int(real["successes"]), "real_count": int(real["count"]),
        "sim_completed": sim.completed, "sim_injected": sim.injected,
        "sim_timed_out": sim.timed_out, "sim_unfinished": sim.unfinished,
        "kv_blocks_per_gpu": kv, "blis_seconds": sim.seconds, "blis_cpu_seconds": sim.cpu_seconds,
    })
    return row


def _pooled_draws(runs: Sequence[RealRun], jobs: Sequence[_Job]
                  ) -> dict[tuple[str, str], list[tuple[int, SimStats]]]:
    """Per (run, expansion): ``(draw, pooled statistics)`` of each posterior draw simulated,
    by draw."""
    by: dict[tuple[str, str, int], list[StageResult]] = {}
    for j in jobs:
        if j.result is not None and j.source == "export-draw":
            by.setdefault((j.run.run_id, j.expansion, j.draw), []).append(j.result)
    out_len = {r.run_id: r.real["output_len_mean"] for r in runs}
    pooled: dict[tuple[str, str], list[tuple[int, SimStats]]] = {}
    for (rid, ex, i), v in sorted(by.items()):
        if rid in out_len:
            pooled.setdefault((rid, ex), []).append((i, pool_stages(v, out_len[rid])))
    return pooled


def _expansions(jobs: Sequence[_Job]) -> list[str]:
    """The expansions of ``jobs`` in :data:`EXPANSIONS` order."""
    have = {j.expansion for j in jobs}
    return [e for e in EXPANSIONS if e in have] + sorted(have - set(EXPANSIONS))


def _table(runs: Sequence[RealRun], jobs: Sequence[_Job], kv: Mapping[tuple[str, int], int],
           pooled: dict[tuple[str, str], list[tuple[int, SimStats]]] | None = None
           ) -> pd.DataFrame:
    """One row per run x point source x expansion (expansions in :data:`EXPANSIONS` order, the
    runs in order within each), with the bands of the draws (:func:`_pooled_draws`, computed
    here unless given)."""
    if pooled is None:
        pooled = _pooled_draws(runs, jobs)
    by: dict[tuple[str, str, str], dict[int, list[StageResult]]] = {}
    for j in jobs:
        if j.result is not None and j.draw < 0:
            by.setdefault((j.run.run_id, j.source, j.expansion), {}).setdefault(
                j.rep, []).append(j.result)
    rows = []
    points = ["blis-published", "export-mean"] + list(dict.fromkeys(
        j.source for j in jobs if j.draw < 0 and j.source not in ("blis-published",
                                                                   "export-mean")))
    for ex, r, src in ((ex, r, src) for ex in _expansions(jobs) for r in runs for src in points):
        if (r.run_id, src, ex) not in by:
            continue
        point, reps = _pool_reps(by[(r.run_id, src, ex)], r.real["output_len_mean"])
        row = _row(r, src, point, kv[(r.model, r.tp)], expansion=ex)
        row["point_seeds"] = len(reps)
        for m in ("e2e_mean", "ttft_mean"):  # relative sd over the realizations
            v = np.asarray([getattr(x, m) for x in reps], dtype=float)
            row[f"{m}_seed_sd"] = float(np.std(v, ddof=1) / np.mean(v)) \
                if len(v) > 1 and np.mean(v) > 0 else math.nan
        if src == "export-mean":
            draws = [st for _, st in pooled.get((r.run_id, ex), [])]
            row["n_draws"] = len(draws)
            for m in ("e2e_mean", "ttft_mean"):
                vals = [getattr(d, m) for d in draws]
                b = band(vals, r.real[f"{m}_s"])
                row[f"band_{m}_lo_s"], row[f"band_{m}_hi_s"] = b["lo"], b["hi"]
                row[f"{m}_in_band"], row[f"band_{m}_width"] = b["inside"], b["width"]
                # the draws' median: a point over arrival realizations too (draw seeds)
                med = float(np.nanmedian(vals)) if len(vals) else math.nan
                row[f"band_{m}_median_s"] = med
                row[f"err_{m}_draw_median"] = rel_err(med, r.real[f"{m}_s"])
            row["blis_seconds"] += sum(d.seconds for d in draws)
            row["blis_cpu_seconds"] += sum(d.cpu_seconds for d in draws)
        rows.append(row)
    return pd.DataFrame(rows)


def _pool_reps(reps: Mapping[int, Sequence[StageResult]], out_len: float
               ) -> tuple[SimStats, list[SimStats]]:
    """A point set's statistics over its arrival realizations, and each realization's: means and
    P90s of all their requests pooled (equal weight per realization), counts per realization
    (their mean)."""
    each = [pool_stages(v, out_len) for _, v in sorted(reps.items())]
    if len(each) == 1:
        return each[0], each
    st = pool_stages([s for v in reps.values() for s in v], out_len)
    n = len(each)
    return replace(st, completed=round(st.completed / n), injected=round(st.injected / n),
                   timed_out=round(st.timed_out / n), unfinished=round(st.unfinished / n)), each


def _draw_table(runs: Sequence[RealRun], jobs: Sequence[_Job], seed: int, draw_seeds: bool,
                pooled: dict[tuple[str, str], list[tuple[int, SimStats]]] | None = None
                ) -> pd.DataFrame:
    """Per (run, expansion, posterior draw): workload seed and pooled simulated means (s)."""
    if pooled is None:
        pooled = _pooled_draws(runs, jobs)
    rows = []
    for ex, r in ((ex, r) for ex in _expansions(jobs) for r in runs):
        for i, st in pooled.get((r.run_id, ex), []):
            rows.append({"run_id": r.run_id, "run": r.short_id, "expansion": ex, "draw": i,
                         "workload_seed": draw_seed(seed, i, draw_seeds),
                         "e2e_mean_s": st.e2e_mean, "ttft_mean_s": st.ttft_mean,
                         "decode_interval_s": st.decode_interval,
                         "real_e2e_mean_s": r.real["e2e_mean_s"],
                         "real_ttft_mean_s": r.real["ttft_mean_s"]})
    return pd.DataFrame(rows)
