"""``bayes-latency fit``: the command that reads an observation table, fits, saves and gates.

:func:`fit_command` validates the sampler arguments (:func:`_check_sampler_args`), the output path
and the observation table (:func:`load_observations`) before sampling, then runs
:func:`bayes_latency.fit` (:mod:`bayes_latency.checks.gated`, the function a notebook calls too):
the fit, the posterior written atomically, the convergence and adequacy gates (exit 1 when one
fails)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bayes_latency.data.tables import (
    check_tables,
    load_checked_observations,
    read_table,
    table_names,
    table_source,
)
from bayes_latency.errors import BayesLatencyError
from bayes_latency.model.inference.sampler import (
    NUTPIE_ADAPTATION,
    TARGET_ACCEPT,
    resolve_max_draws,
)
from bayes_latency.physics.basis import DEFAULT_TERMS


def _check_sampler_args(args: argparse.Namespace) -> None:
    """Sampler arguments of ``fit`` in range, before any work (exit 2 with the option named)."""
    def bad(opt: str, value: object, need: str) -> BayesLatencyError:
        return BayesLatencyError(f"{opt} {value!r}: must be {need}")

    ints = (("--draws", "draws", 1, 1_000_000), ("--tune", "tune", 0, 1_000_000),
            ("--chains", "chains", 1, 64), ("--max-draws", "max_draws", 0, 10_000_000))
    for opt, name, lo, hi in ints:
        v = getattr(args, name, None)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise bad(opt, v, f"an integer in [{lo}, {hi:,}]")
    seed = getattr(args, "seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise bad("--seed", seed, "an integer in [0, 2**32)")
    ta = getattr(args, "target_accept", None)
    if ta is not None and not (isinstance(ta, (int, float)) and 0.5 <= ta < 1.0):
        raise bad("--target-accept", ta, "a number in [0.5, 1)")
    md, draws = getattr(args, "max_draws", None), getattr(args, "draws", None)
    if md and isinstance(draws, int) and md < draws:
        raise bad("--max-draws", md, f"0 (no extension) or at least --draws ({draws})")
    parse_terms(getattr(args, "terms", None))
    mr = getattr(args, "max_rhat", None)
    if mr is not None and not (isinstance(mr, (int, float)) and 1.0 <= mr < 10.0):
        raise bad("--max-rhat", mr, "a number in [1, 10)")


def parse_terms(value: str | None) -> tuple[str, ...] | None:
    """``--terms a,b,c`` or a term set's name (``blis``, ``regime``:
    :data:`~bayes_latency.physics.basis.TERM_SETS`) -> the term names; None when the option is
    not given.

    Raises
    ------
    BayesLatencyError
        When the option is given but names no term (``--terms ""``).
    """
    if value is None:
        return None
    from bayes_latency.physics.basis import TERM_SETS

    if str(value).strip() in TERM_SETS:
        return TERM_SETS[str(value).strip()]
    terms = tuple(t.strip() for t in str(value).split(",") if t.strip())
    if not terms:
        raise BayesLatencyError(f"--terms {value!r}: names no term (give a comma-separated "
                                f"list, or leave the option out for the default terms)")
    return terms


def table_inputs(path: str | Path | None) -> list[Path]:
    """What a command reading the tables at ``path`` reads, for the output check
    (:func:`~bayes_latency.io.check_output_path`).

    A folder written by ``ingest`` (a manifest or a table's partition folder) stands for
    everything under it: no output may be written anywhere in it. A plain folder holding
    ``observations.parquet`` (and the other tables' single files) stands for those files and
    the names of the partitioned layout, so that a posterior may sit next to its table (a file
    output is never the folder itself: an existing folder is refused as a file path). A file
    is itself.
    """
    if path is None:
        return []
    from bayes_latency.data.experiment import TABLES
    from bayes_latency.data.tables import MANIFEST

    p = Path(path)
    if not p.is_dir():
        return [p]
    if (p / MANIFEST).exists() or any((p / n).is_dir() for n in TABLES):
        return [p]
    return [*(p / f"{n}.parquet" for n in TABLES), *(p / n for n in TABLES), p / MANIFEST]


def _max_draws(args: argparse.Namespace) -> int | None:
    """``--max-draws``: the estimator's default when not given (``max_draws="auto"`` of
    :meth:`~bayes_latency.model.estimator.LatencyModel.fit`, 6 x ``--draws``:
    :data:`DEFAULT_MAX_DRAWS` at the defaults), ``None`` (no extension) for 0."""
    md = getattr(args, "max_draws", None)
    return resolve_max_draws("auto" if md is None else md, int(args.draws))


def fit_command(args: argparse.Namespace) -> int:
    """``bayes-latency fit``: :func:`bayes_latency.fit` (fit, save, gates); exit 1 when a gate
    fails.

    The arguments, the output path and the tables are validated before sampling; the posterior
    is written atomically (never over an input) right after sampling, before the gates.
    """
    from bayes_latency.checks import gated
    from bayes_latency.io import check_output_path
    from bayes_latency.model.estimator import LatencyModel

    _check_sampler_args(args)
    terms = parse_terms(getattr(args, "terms", None)) or DEFAULT_TERMS
    tables = Path(args.tables)
    pop = getattr(args, "population", None)
    # the tables' own file names count as inputs too: a posterior written as
    # tables/observations.parquet would shadow the partitioned table it was fitted to
    inputs = [*table_inputs(tables), table_source(tables, "observations")] \
        + ([Path(args.priors)] if getattr(args, "priors", None) else []) \
        + ([Path(pop)] if pop and Path(pop).exists() else [])
    out_path = check_output_path(args.out, inputs,
                                 kind="dir" if Path(args.out).suffix == ".zarr" else "file")
    if out_path.suffix == ".zarr" and out_path.exists():
        raise BayesLatencyError(f"--out {out_path}: zarr store exists; remove it or choose "
                                f"another path")
    if tables.is_dir():  # every table of the folder agrees with its manifest, before any work
        check_tables(tables)
    obs = load_checked_observations(args.tables)
    requests = (read_table(tables, "requests")
                if tables.is_dir() and "requests" in table_names(tables) else None)
    from bayes_latency.model.definition.likelihood import DEFAULT_NOISE_LOAD

    if pop:
        from bayes_latency.model.posterior.population_file import load_population

        pop = load_population(pop)
        print(f"prior of the configurations: the population {pop.name!r} ({pop.describe()['configs']})")
    m = LatencyModel(priors=args.priors, terms=terms, method=args.method, sampler=args.sampler,
                     scheduler=getattr(args, "scheduler", None), population=pop or None,
                     noise_load=getattr(args, "noise_load", None) or DEFAULT_NOISE_LOAD,
                     kernels=True if getattr(args, "kernels", False) else None)
    m, report = gated.fit(
        obs, requests, model=m, out=out_path, on_failure="ignore",
        gates={"max_rhat": args.max_rhat}, seed=args.seed,
        draws=args.draws, tune=args.tune, chains=args.chains,
        progress=True,  # a bar on a terminal, a line per checkpoint otherwise
        target_accept=getattr(args, "target_accept", TARGET_ACCEPT),
        adaptation=getattr(args, "adaptation", NUTPIE_ADAPTATION),
        max_draws=_max_draws(args) or None)
    print(m.report.format())
    print(f"fitted {len(m.design.configs)} configurations, {len(m._rows):,} rows in "
          f"{report.seconds['fit_s']:.1f} s ({m.method}, {m.sampler}); saved {out_path}")
    print(report.format())
    report.raise_if_failed()  # ConvergenceError / AdequacyError: exit 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(fit_command(argparse.Namespace()))
