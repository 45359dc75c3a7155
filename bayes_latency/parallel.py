"""Running independent units of work inline or as tasks on Dask distributed.

Ingest (one unit per experiment, several per task: ``batch=True``) and stage 1 of the fit (one
task per configuration) are maps over independent units. :func:`run_units` runs such a map with **one** function for both ways,
so a unit gives the same result inline and on a worker:

- inline, in this process, when the work is small (a local cluster takes about 2 s to start; see
  :data:`INLINE_MAX_SECONDS`) or when asked (``scheduler="inline"``);
- on a :class:`distributed.LocalCluster` started for the call (processes, one worker per core,
  one thread per worker) when the work is large or ``scheduler="local"``;
- on an existing cluster: ``scheduler="tcp://host:8786"`` (``bayes-latency ingest/fit
  --scheduler ...``), the ``DASK_SCHEDULER_ADDRESS`` environment variable, or a
  :class:`distributed.Client` passed in (tests, notebooks).

Workers of an existing cluster must see the same file system paths as the client (the trace
files and the table folder), and run the same ``bayes_latency`` version.

A progress bar (tqdm, on stderr) is shown only when stderr is a terminal.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from typing import Any

from bayes_latency.errors import ConfigError

__all__ = [
    "BATCH_PER_WORKER",
    "INLINE_MAX_SECONDS",
    "LOCAL_WORKER_CONFIG",
    "SCHEDULER_ENV",
    "batches",
    "local_cluster",
    "resolve_scheduler",
    "run_units",
]

#: Environment variable naming an existing scheduler (Dask's own convention).
SCHEDULER_ENV = "DASK_SCHEDULER_ADDRESS"
#: Estimated serial work (seconds) below which ``scheduler=None`` runs inline instead of starting
#: a local cluster. Measured on the 2-core development machine (shared with other jobs, load
#: about 10): ``LocalCluster(2 workers, processes)`` starts in 4.0-4.1 s, the workers' first tasks
#: import the package in 1.6-2.9 s and closing takes 1.9-2.1 s, 7.6-8.9 s in all; two workers can
#: only win when ``t / 2 + overhead < t``, i.e. above about 10-16 s of serial work.
INLINE_MAX_SECONDS = 10.0
#: Tasks per worker at the start of a ``batch`` map (:func:`batches`): with 2 workers the
#: first task holds 1/16 of the work; 520 demo-sized experiments become about 70 tasks.
BATCH_PER_WORKER = 8
_INLINE = ("inline", "none", "sync", "synchronous")
_TRIM, _DASK_TRIM = "MALLOC_TRIM_THRESHOLD_", "65536"
#: Dask settings of the local clusters started here (:func:`local_cluster`). Dask spawns its
#: workers with ``MALLOC_TRIM_THRESHOLD_=65536``, which also switches off glibc's dynamic mmap
#: threshold: every array above 128 kB is then a fresh ``mmap`` and its pages faulted in again.
#: Ingest of the demo fleet (86 MB) with it: 10x the page faults (111,000 against 9,500-25,000)
#: and 0.4-0.55 system CPU-s against 0.18-0.25 (inline, same minutes). The statistical profiler
#: (a thread sampling the task thread every 10 ms) and the 0.5 s system monitor are for the
#: dashboard, which these clusters do not start. 130 experiments (431 MB) on one worker,
#: alternating, best of 2 (``results/benchmarks/ingest_scale.md``): 15.95 worker
#: CPU-s with Dask's defaults, 13.36 with these (27.0 -> 32.3 MB per CPU-s; system CPU 1.98 ->
#: 1.17 s), peak RSS 0.25 -> 0.28 GB (budget 3 GB). The event loop's tick (20 ms: a callback
#: that only measures the loop's own delay) and the memory monitor (100 ms: psutil reads of the
#: RSS, also in each nanny) wake every worker and the client process's scheduler and nannies
#: all the time: an idle 1-worker cluster spent 0.19 CPU-s per 10 s in the worker and 0.26 in
#: the client process with them, 0.05 and 0.06 with 1 s / 500 ms (ingest of 130 experiments on
#: one worker, with ``run_units``' batches and one gather at the end: the worker's event-loop
#: thread 0.56 -> 0.11-0.14 CPU-s, the client process 0.9 -> 0.27-0.30). An existing
#: cluster (``--scheduler``) keeps its own settings; ``MALLOC_TRIM_THRESHOLD_`` set in the
#: environment is kept as well, unless it is Dask's 65536 (which a Dask nanny started with
#: Dask's defaults leaves in ``os.environ``).
LOCAL_WORKER_CONFIG: dict[str, Any] = {
    "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None,
    "distributed.worker.profile.enabled": False,
    "distributed.admin.system-monitor.interval": "2s",
    "distributed.admin.tick.interval": "1s",
    "distributed.worker.memory.monitor-interval": "500ms",
}


def local_cluster(n_workers: int, **kwargs: Any) -> Any:
    """A :class:`distributed.LocalCluster` of ``n_workers`` processes of one thread each, without
    a dashboard, with :data:`LOCAL_WORKER_CONFIG`.

    Parameters
    ----------
    n_workers
        Worker processes.
    **kwargs
        Other :class:`distributed.LocalCluster` arguments (e.g. ``memory_limit``).
    """
    import dask
    from distributed import LocalCluster

    opts: dict[str, Any] = {"threads_per_worker": 1, "processes": True,
                            "dashboard_address": None, "silence_logs": 50}
    opts.update(kwargs)
    # a Dask nanny started earlier in this process (Dask's defaults) leaves its value in
    # os.environ, which the workers spawned here would inherit: hidden while they start
    leaked = os.environ.get(_TRIM) == _DASK_TRIM
    if leaked:
        del os.environ[_TRIM]
    try:
        with dask.config.set(LOCAL_WORKER_CONFIG):
            return LocalCluster(n_workers=n_workers, **opts)
    finally:
        if leaked:
            os.environ[_TRIM] = _DASK_TRIM


def resolve_scheduler(scheduler: Any = None) -> Any:
    """The scheduler to use: ``scheduler`` itself, else ``$DASK_SCHEDULER_ADDRESS``, else None.

    Parameters
    ----------
    scheduler
        None (automatic), ``"inline"``, ``"local"``, a scheduler address
        (``"tcp://host:8786"``) or a :class:`distributed.Client`.
    """
    if scheduler is None or scheduler == "":
        env = os.environ.get(SCHEDULER_ENV, "").strip()
        return env or None
    return scheduler


def _show_progress() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _bar(total: float, desc: str, unit: str) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not _show_progress(), leave=False,
                unit_scale=True, file=sys.stderr)


@contextmanager
def _client(scheduler: Any, n_units: int):
    """A ``distributed.Client`` for ``scheduler`` (closed on exit when made here)."""
    from distributed import Client

    if not isinstance(scheduler, str):  # a Client (or anything with .submit) given by the caller
        yield scheduler
        return
    if scheduler == "local":
        n = max(1, min(n_units, os.cpu_count() or 1))
        cluster = local_cluster(n)
        try:
            with Client(cluster) as client:
                yield client
        finally:
            cluster.close()
        return
    if not scheduler.startswith(("tcp://", "tls://", "ucx://", "inproc://", "ws://", "wss://")) \
            and ":" not in scheduler:
        raise ConfigError(f"unknown scheduler {scheduler!r}: expected 'inline', 'local' or an "
                          f"address such as tcp://host:8786")
    try:
        client = Client(scheduler, timeout="20s")
    except (OSError, TimeoutError) as exc:
        raise ConfigError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from exc
    try:
        yield client
    finally:
        client.close()


def run_units(fn: Callable[..., Any], units: Sequence[tuple], *, scheduler: Any = None,
              cost_s: float | None = None, weights: Sequence[float] | None = None,
              desc: str = "", unit: str = "it", scatter: bool = False, batch: bool = False,
              timings: dict[str, Any] | None = None) -> list[Any]:
    """``[fn(*u) for u in units]``, inline or as Dask tasks; results in the order of ``units``.

    Parameters
    ----------
    fn
        A module-level function (picklable), the same one inline and on workers.
    units
        Argument tuples, one per unit of work.
    scheduler
        None: ``$DASK_SCHEDULER_ADDRESS`` if set, else inline when there is one unit or
        ``cost_s < INLINE_MAX_SECONDS``, else a local cluster. ``"inline"``, ``"local"``, an
        address or a :class:`distributed.Client` force the choice.
    cost_s
        Estimated serial time of all units (seconds), for the automatic choice (unknown: local
        cluster when there is more than one unit).
    weights
        Progress weight of each unit (e.g. bytes); default 1 each.
    desc, unit
        Progress bar label and unit.
    scatter
        Send each unit's arguments to the cluster with ``Client.scatter`` first (large in-memory
        arguments such as a configuration's rows), instead of inside the task graph.
    batch
        On a cluster, run several units per task (:func:`batches`: largest units first, tasks
        of decreasing weight), for many small units whose per-task cost on the client, the
        scheduler and the worker's event loop (a few ms each) is not small against their work.
        Ignored with ``scatter``.
    timings
        If given, receives ``mode`` (``"inline"`` / ``"local"`` / the address), ``workers``,
        ``start_s`` (cluster start / connect) and ``run_s``.

    Returns
    -------
    list
        ``fn(*units[i])`` for every ``i``. The first exception of a unit is raised (with its
        original type) once that unit fails.
    """
    units = list(units)
    w = list(weights) if weights is not None else [1.0] * len(units)
    sched = resolve_scheduler(scheduler)
    if sched is None:
        small = len(units) <= 1 or (cost_s is not None and cost_s < INLINE_MAX_SECONDS)
        sched = "inline" if small else "local"
    t0 = time.perf_counter()
    if isinstance(sched, str) and sched.lower() in _INLINE:
        out = []
        with _bar(sum(w), desc, unit) as bar:
            for u, wi in zip(units, w, strict=True):
                out.append(fn(*u))
                bar.update(wi)
        if timings is not None:
            timings.update(mode="inline", workers=1, start_s=0.0,
                           run_s=time.perf_counter() - t0)
        return out
    with _client(sched, len(units)) as client:
        t1 = time.perf_counter()
        from distributed import as_completed

        info = client.scheduler_info(n_workers=-1).get("workers", {}) \
            if hasattr(client, "scheduler_info") else None
        nw = len(info) if info is not None else None
        batched = batch and not scatter
        groups = [[i] for i in range(len(units))]  # unit indices of each task
        if scatter:
            args = [client.scatter(list(u), hash=False) for u in units] if units else []
            futs = [client.submit(_apply, fn, a, pure=False) for a in args]
        elif batched:
            threads = sum(int(v.get("nthreads", 1)) for v in info.values()) if info else 1
            groups = batches(w, threads)
            # the first batches first (Dask runs the highest priority first)
            futs = [client.submit(_apply_batch, fn, [units[i] for i in g], pure=False,
                                  priority=len(groups) - j) for j, g in enumerate(groups)]
        else:
            futs = [client.submit(fn, *u, pure=False) for u in units]
        index = {f.key: j for j, f in enumerate(futs)}
        with _bar(sum(w), desc, unit) as bar:
            for fut in as_completed(futs):
                if fut.status != "finished":
                    fut.result()  # raises the unit's exception
                bar.update(sum(w[i] for i in groups[index[fut.key]]))
        # one gather at the end (a request per worker, not per task)
        got = client.gather(futs)
        results: list[Any] = [None] * len(units)
        for g, r in zip(groups, got, strict=True):
            if not batched:
                r = [r]
            for i, ri in zip(g, r, strict=True):
                results[i] = ri
        if timings is not None:
            timings.update(mode=sched if isinstance(sched, str) else "client", workers=nw,
                           start_s=t1 - t0, run_s=time.perf_counter() - t1)
        return results


def _apply(fn: Callable[..., Any], args: list) -> Any:
    """``fn(*args)`` (for scattered arguments)."""
    return fn(*args)


def _apply_batch(fn: Callable[..., Any], units: list[tuple]) -> list[Any]:
    """``[fn(*u) for u in units]`` (one task of several units)."""
    return [fn(*u) for u in units]


def batches(weights: Sequence[float], n_workers: int, per_worker: int = BATCH_PER_WORKER
            ) -> list[list[int]]:
    """Unit indices grouped into tasks: largest units first, each task about ``1 / (per_worker *
    n_workers)`` of the weight not yet grouped (guided self-scheduling), at least one unit.

    The first tasks are large (few tasks, little per-task cost), the last ones single small
    units (the workers finish together).

    Parameters
    ----------
    weights
        Weight (expected cost, e.g. bytes) of each unit.
    n_workers
        Workers (threads) that run the tasks.
    per_worker
        Tasks per worker at the start: a larger value makes more, smaller tasks.

    Returns
    -------
    list of list of int
        Indices into ``weights``; every index once, tasks in the order to run them.
    """
    k = max(1, per_worker * max(1, n_workers))
    order = sorted(range(len(weights)), key=lambda i: -float(weights[i]))  # stable
    left = float(sum(weights))
    out: list[list[int]] = []
    cur: list[int] = []
    cw = 0.0
    for i in order:
        cur.append(i)
        cw += float(weights[i])
        if cw >= left / k:
            out.append(cur)
            left -= cw
            cur, cw = [], 0.0
    if cur:
        out.append(cur)
    return out
