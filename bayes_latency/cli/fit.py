"""``bayes-latency fit``: the command that reads an observation table, fits, saves and gates.

:func:`fit_command` validates the sampler arguments (:func:`_check_sampler_args`), the output path
and the observation table (:func:`load_observations`) before sampling, fits a
:class:`~bayes_latency.model.estimator.LatencyModel`, writes the posterior atomically and applies
the convergence and adequacy gates (exit 1 when one fails).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

from bayes_latency.data.tables import (
    check_tables,
    load_checked_observations,
    read_table,
    table_names,
    table_source,
)
from bayes_latency.errors import BayesLatencyError, ConvergenceError
from bayes_latency.model.sampler import MAX_DRAWS_FACTOR, NUTPIE_ADAPTATION, TARGET_ACCEPT
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
    """``--terms a,b,c`` -> the term names; None when the option is not given.

    Raises
    ------
    BayesLatencyError
        When the option is given but names no term (``--terms ""``).
    """
    if value is None:
        return None
    terms = tuple(t.strip() for t in str(value).split(",") if t.strip())
    if not terms:
        raise BayesLatencyError(f"--terms {value!r}: names no term (give a comma-separated "
                                f"list, or leave the option out for the default terms)")
    return terms


def _max_draws(args: argparse.Namespace) -> int | None:
    """``--max-draws``: 6 x ``--draws`` when not given (:data:`DEFAULT_MAX_DRAWS` at the
    defaults), ``None`` (no extension) for 0."""
    md = getattr(args, "max_draws", None)
    if md is None:
        return MAX_DRAWS_FACTOR * int(args.draws)
    return int(md) or None


def fit_command(args: argparse.Namespace) -> int:
    """``bayes-latency fit``: fit, save, and exit 1 when the convergence gates fail.

    The arguments, the output path and the observation table are validated before sampling; the
    posterior is written atomically (never over an input).
    """
    from bayes_latency.io import atomic_path, check_output_path
    from bayes_latency.model.estimator import LatencyModel

    _check_sampler_args(args)
    terms = parse_terms(getattr(args, "terms", None)) or DEFAULT_TERMS
    tables = Path(args.tables)
    f_in = table_source(tables, "observations")
    # the tables' own file names count as inputs too: a posterior written as
    # tables/observations.parquet would shadow the partitioned table it was fitted to
    from bayes_latency.data.experiment import TABLES

    own = ([tables / f"{n}.parquet" for n in TABLES] + [tables / n for n in TABLES]
           + [tables / "tables.json"]) if tables.is_dir() else []
    inputs = [tables, f_in, *own] + ([Path(args.priors)] if getattr(args, "priors", None) else [])
    out_path = check_output_path(args.out, inputs,
                                 kind="dir" if Path(args.out).suffix == ".zarr" else "file")
    if out_path.suffix == ".zarr" and out_path.exists():
        raise BayesLatencyError(f"--out {out_path}: zarr store exists; remove it or choose "
                                f"another path")
    if tables.is_dir():  # every table of the folder agrees with its manifest, before any work
        check_tables(tables)
    obs = load_checked_observations(args.tables)
    m = LatencyModel(priors=args.priors, terms=terms, method=args.method, sampler=args.sampler,
                     scheduler=getattr(args, "scheduler", None))
    t0 = time.perf_counter()
    m.fit(obs, draws=args.draws, tune=args.tune, chains=args.chains, seed=args.seed,
          progress=sys.stderr.isatty(),  # sampling progress on a terminal only
          target_accept=getattr(args, "target_accept", TARGET_ACCEPT),
          adaptation=getattr(args, "adaptation", NUTPIE_ADAPTATION),
          max_draws=_max_draws(args),
          gates={"max_rhat": args.max_rhat})
    with atomic_path(out_path) as tmp:
        m.save(tmp)
    out = out_path
    conv = m.convergence({"max_rhat": args.max_rhat})
    print(m.report.format())
    print(f"fitted {len(m.design.configs)} configurations, {len(m._rows):,} rows in "
          f"{time.perf_counter() - t0:.1f} s ({m.method}, {m.sampler}); saved {out}")
    print(f"max R-hat {conv['max_rhat']:.4f}, min bulk ESS {conv['min_ess_bulk']:.0f}, "
          f"divergences {conv['divergences']}" + (" [APPROXIMATE: no MCMC diagnostics]"
                                                  if conv["approximate"] else ""))
    if conv.get("extension"):
        print("sampling extended while the gates failed: "
              + ", ".join(f"{e['draws']} draws (target_accept {e.get('target_accept', '?')}): "
                          f"{e['decision']}" for e in conv["extension"]))
    # adequacy gate (posterior predictive checks of the fitted rows and workload means)
    from bayes_latency.checks.adequacy import check_fit

    requests = (read_table(tables, "requests")
                if tables.is_dir() and "requests" in table_names(tables) else None)
    adq, _, _ = check_fit(m, obs, requests, seed=args.seed)
    checked = gate_summary(adq.table, requests)
    if not conv["passed"]:
        extra = ([f"and the model does not explain the data: {'; '.join(adq.failures)}"]
                 if not adq.passed else [])
        raise ConvergenceError("; ".join(conv["failures"] + conv["hints"] + extra))
    if not adq.passed:
        print("bayes-latency: the model does not explain the data (adequacy gate):\n"
              + "\n".join(f"- {f}" for f in adq.failures), file=sys.stderr)
        return 1
    print(f"adequacy gate passed ({checked})")
    return 0


def gate_summary(table: pd.DataFrame, requests: pd.DataFrame | None) -> str:
    """What the adequacy gate checked, in words: the step-level and workload checks it ran.

    ``table`` is the gate's table of checks (column ``level``: ``step`` or ``workload``);
    ``requests`` the requests table given to it (None when the tables have none), so that a gate
    that had requests but could check no workload mean says so.
    """
    n_step = int((table["level"] == "step").sum())
    n_wl = int((table["level"] == "workload").sum())
    text = f"{n_step} step-level checks (LOO-PIT, band coverage)"
    if n_wl:
        return text + f", {n_wl} workload-mean checks"
    if requests is None:
        return text + "; no requests table, so no workload-mean checks"
    return text + f"; no workload mean could be checked from {len(requests):,} request rows"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(fit_command(argparse.Namespace()))
