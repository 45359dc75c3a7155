"""``bayes-latency population``: a fitted fleet's population as a file, the prior of new data.

``bayes-latency population TABLES --out population.nc [--leave-out model=llama-2-7b]`` fits the
hierarchy to an ingested table folder (the rows of the left-out level removed first), gates the
fit as ``fit`` does and writes the population (:mod:`bayes_latency.model.posterior.fleet`) only when
every gate passes; ``bayes-latency population POSTERIOR.nc --out population.nc`` takes the
population of a saved fit (its convergence gates checked). ``fit --population`` and
``calibrate --population`` use the file.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bayes_latency.errors import BayesLatencyError, ConvergenceError

#: Help of ``--kernels`` on ``fit`` and ``population``.
KERNELS_HELP = ("read AIConfigurator's measured GEMM tables (the optional extra kernels) as "
                "evidence on each GPU's effect in vLLM, with a GPU x stack interaction for other "
                "serving stacks (prior file: hierarchy.kernel, hierarchy.gpu_stack)")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``population`` subcommand's arguments (those of ``fit`` for the fit)."""
    s = sub.add_parser("population", help="the population of a fitted fleet (prior of new "
                                          "configurations for fit/calibrate --population)")
    s.add_argument("source", help="folder written by `ingest` (or an observations.parquet): "
                                  "fitted first; or a posterior file (.nc) of `fit`/`calibrate`")
    s.add_argument("--out", required=True, help="population file (.nc)")
    s.add_argument("--leave-out", default=None, metavar="KEY=VALUE",
                   help="fit without every row of one level: model=NAME, gpu=NAME, tp=N or "
                        "config=ID (tables only)")
    s.add_argument("--samples", type=int, default=500,
                   help="joint posterior draws kept in the file (default %(default)s)")
    s.add_argument("--rows", default=None,
                   help="(with a posterior) the observation table it was fitted on, checked "
                        "against its data hash: the fleet's noise scale of every noise class "
                        "is kept")
    s.add_argument("--label", default=None,
                   help="what the data are, recorded in the file (default: the source path)")
    s.add_argument("--method", default="laplace-hierarchy", choices=["laplace-hierarchy", "full"])
    s.add_argument("--sampler", default="nutpie", choices=["nutpie", "pymc", "numpyro"])
    s.add_argument("--priors", help="prior YAML (default: priors/default.yaml)")
    s.add_argument("--terms", help="comma-separated beta terms, or a term set: blis (the 11 "
                   "BLIS terms, the default) or regime (blis plus the compute knees)")
    s.add_argument("--draws", type=int, default=2000)
    s.add_argument("--max-draws", type=int, default=None,
                   help="as `fit` (default: 6 x --draws; 0: exactly --draws)")
    s.add_argument("--tune", type=int, default=1000)
    s.add_argument("--chains", type=int, default=2)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--max-rhat", type=float, default=1.01)
    s.add_argument("--target-accept", type=float, default=0.99)
    s.add_argument("--kernels", action="store_true", help=KERNELS_HELP)
    s.set_defaults(func=population_command)


def population_command(args: argparse.Namespace) -> int:
    """Write the population of a fit (see the module docstring); exit 1 with no file when a
    gate of the fit fails."""
    from bayes_latency.cli.fit import _check_sampler_args, _max_draws, parse_terms
    from bayes_latency.io import check_output_path
    from bayes_latency.model.posterior.fleet import (
        fleet_noise,
        leave_out,
        parse_leave_out,
        population_from_result,
    )

    _check_sampler_args(args)
    if not 10 <= args.samples <= 100_000:
        raise BayesLatencyError(f"--samples {args.samples}: must be in [10, 100000]")
    if args.leave_out is not None:
        parse_leave_out(args.leave_out)
    from bayes_latency.textfiles import refuse_special

    src = Path(args.source)
    refuse_special(src, "SOURCE", BayesLatencyError)
    if not src.exists():
        raise BayesLatencyError(f"SOURCE {src}: no such file or folder")
    from bayes_latency.cli.fit import table_inputs

    out = check_output_path(args.out, [*table_inputs(src), *table_inputs(args.rows)]
                            + ([Path(args.priors)] if args.priors else []), kind="file")
    label = args.label or str(src)
    if src.is_file() and src.suffix in (".nc", ".zarr"):
        from bayes_latency.model.estimator import LatencyModel

        if args.leave_out:
            raise BayesLatencyError("--leave-out needs a tables folder: a saved fit cannot leave "
                                    "out what it was fitted on")
        m = LatencyModel.load(src)
        if args.rows:
            from bayes_latency.data.tables import load_checked_observations

            m.attach_rows(load_checked_observations(args.rows))
        conv = m.convergence({"max_rhat": args.max_rhat})
        print(f"{src}: max R-hat {conv['max_rhat']:.4f}, min bulk ESS "
              f"{conv['min_ess_bulk']:.0f}, divergences {conv['divergences']}")
        if not conv["passed"]:
            raise ConvergenceError(f"{src}: " + "; ".join(conv["failures"])
                                   + f"; no population written to {out}")
        result, left = m.result, ""
    else:
        from bayes_latency.checks import gated
        from bayes_latency.data.tables import check_tables, load_checked_observations
        from bayes_latency.model.estimator import LatencyModel
        from bayes_latency.physics.basis import DEFAULT_TERMS

        if src.is_dir():
            check_tables(src)
        obs = load_checked_observations(src)
        left = ""
        if args.leave_out:
            obs, n = leave_out(obs, args.leave_out)
            left = args.leave_out
            print(f"--leave-out {left}: {n:,} rows removed, {len(obs):,} left")
        m = LatencyModel(priors=args.priors, terms=parse_terms(args.terms) or DEFAULT_TERMS,
                         method=args.method, sampler=args.sampler,
                         kernels=True if args.kernels else None)
        m, report = gated.fit(obs, None, model=m, on_failure="ignore",
                              gates={"max_rhat": args.max_rhat}, seed=args.seed,
                              draws=args.draws, tune=args.tune, chains=args.chains,
                              progress=True, target_accept=args.target_accept,
                              max_draws=_max_draws(args) or None)
        print(report.format())
        if not report.passed:
            print(f"no population written to {out}")
            report.raise_if_failed()  # ConvergenceError / AdequacyError: exit 1
        result = m.result
    pop = population_from_result(result, n_samples=args.samples, left_out=left, source=label,
                                 noise=fleet_noise(m))
    pop.save(out)
    d = pop.describe()
    print(f"population of {len(d['configs'])} configurations (models {d['models']}, GPUs "
          f"{d['gpus']}, TP {d['tps']}, stacks {d['stacks']}), {d['n_samples']} joint draws; "
          f"saved {out} ({out.stat().st_size / 1024:.0f} kB)")
    return 0
