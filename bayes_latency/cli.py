"""The ``bayes-latency`` command: simulate, ingest, fit, check, export, demo.

Each subcommand parses its arguments here and calls one library function; errors of the package
(:class:`~bayes_latency.errors.BayesLatencyError`) become a one-line message and exit code 2,
failed quality gates (convergence, diagnostics) exit code 1.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bayes_latency.errors import BayesLatencyError, ConvergenceError


def _cmd_simulate(args: argparse.Namespace) -> int:
    from bayes_latency.io import check_output_path
    from bayes_latency.synth.fleet import simulate_fleet

    check_output_path(args.out, kind="dir")
    folders = simulate_fleet(args.fleet, Path(args.out), seed=args.seed, progress=not args.quiet)
    print(f"simulated {len(folders)} experiments into {args.out}")
    return 0


def _cmd_ingest(args: argparse.Namespace) -> int:
    from bayes_latency.data.experiment import ingest

    report = ingest([Path(p) for p in args.paths], Path(args.out),
                    config=Path(args.config) if args.config else None,
                    scheduler=args.scheduler)
    print(report.format())
    return 0


def _cmd_fit(args: argparse.Namespace) -> int:
    from bayes_latency.model.estimator import fit_command

    return fit_command(args)


def _cmd_check(args: argparse.Namespace) -> int:
    from bayes_latency.checks.diagnostics import check_command

    return check_command(args)


def _cmd_export(args: argparse.Namespace) -> int:
    from bayes_latency.export import export_command

    return export_command(args)


def _cmd_demo(args: argparse.Namespace) -> int:
    from bayes_latency.demo import run_demo
    from bayes_latency.io import check_output_path

    check_output_path(args.out, kind="dir")
    return run_demo(Path(args.out), fleet=args.fleet, seed=args.seed, draws=args.draws)


def _cmd_study(args: argparse.Namespace) -> int:
    from bayes_latency.io import check_output_path

    check_output_path(args.out, kind="dir")
    if args.name == "blis":
        from bayes_latency.study.blis_e2e import main as study_blis

        return study_blis(Path(args.out), blis=args.blis, exports=args.exports,
                          n_draws=args.draws, runs=args.runs, data=args.data,
                          blis_src=args.blis_src, parallel=args.parallel)
    if args.name == "client":
        from bayes_latency.study.client_blis import main as study_client

        return study_client(Path(args.out), blis=args.blis, quick=args.quick,
                            n_draws=args.draws, resume=args.resume)
    from bayes_latency.study.real import main as study_real

    return study_real(Path(args.out), quick=args.quick)


_SCHEDULER_HELP = ("Dask scheduler for the per-experiment / per-configuration tasks: an address "
                   "(tcp://host:8786), 'local' (a local cluster, one worker per core) or 'inline' "
                   "(this process); default: $DASK_SCHEDULER_ADDRESS if set, else inline for "
                   "small inputs and a local cluster for large ones")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``bayes-latency`` (one subparser per subcommand)."""
    p = argparse.ArgumentParser(prog="bayes-latency", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("simulate", help="write a synthetic fleet of real-format experiments")
    s.add_argument("--fleet", default="demo", help="fleet preset (demo, tiny, small)")
    s.add_argument("--out", required=True)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--quiet", action="store_true")
    s.set_defaults(func=_cmd_simulate)

    s = sub.add_parser("ingest", help="turn traces / experiment folders into tables")
    s.add_argument("paths", nargs="+", help="trace files or experiment folders")
    s.add_argument("--config", help="serving config YAML (for loose trace files)")
    s.add_argument("--out", required=True)
    s.add_argument("--scheduler", default=None, help=_SCHEDULER_HELP)
    s.set_defaults(func=_cmd_ingest)

    s = sub.add_parser("fit", help="fit the hierarchical model to an ingested table folder")
    s.add_argument("tables", help="folder written by `ingest` (or an observations.parquet)")
    s.add_argument("--out", required=True, help="posterior file (.nc)")
    s.add_argument("--method", default="laplace-hierarchy", choices=["laplace-hierarchy", "full"])
    s.add_argument("--sampler", default="nutpie", choices=["nutpie", "pymc", "numpyro", "laplace"],
                   help="NUTS via nutpie/PyMC/numpyro, or 'laplace' (fast, APPROXIMATE)")
    s.add_argument("--priors", help="prior YAML (default: priors/default.yaml)")
    s.add_argument("--draws", type=int, default=1000)
    s.add_argument("--tune", type=int, default=500)
    s.add_argument("--adaptation", default="low_rank", choices=["low_rank", "diag"],
                   help="nutpie mass-matrix adaptation (diag: cheaper when no coefficients are "
                        "identified only jointly)")
    s.add_argument("--chains", type=int, default=2)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--max-rhat", type=float, default=1.01)
    s.add_argument("--terms", help="comma-separated beta terms (default: the 11 BLIS terms)")
    s.add_argument("--target-accept", type=float, default=0.95,
                   help="NUTS step-size target; 0.99 when a few divergences remain")
    s.add_argument("--scheduler", default=None,
                   help=_SCHEDULER_HELP + " (stage 1 only; the hierarchy runs here)")
    s.set_defaults(func=_cmd_fit)

    s = sub.add_parser("check", help="diagnostics report; non-zero exit when a gate fails")
    s.add_argument("posterior")
    s.add_argument("--tables", help="ingested tables for predictive checks")
    s.add_argument("--out", help="folder for the report and plots")
    s.add_argument("--priors", help="prior YAML the posterior was fitted with "
                                    "(default: priors/default.yaml)")
    s.set_defaults(func=_cmd_check)

    s = sub.add_parser("export", help="coefficients for a simulator configuration")
    s.add_argument("posterior")
    s.add_argument("--model", required=True, help="known model name or config.json path")
    s.add_argument("--gpu", required=True)
    s.add_argument("--tp", type=int, default=1)
    s.add_argument("--draws", type=int, default=0)
    s.add_argument("--format", default="json", choices=["json", "blis"])
    s.add_argument("--priors", help="prior YAML the posterior was fitted with "
                                    "(default: priors/default.yaml)")
    s.add_argument("--out", required=True)
    s.set_defaults(func=_cmd_export)

    s = sub.add_parser("demo", help="the whole path on the built-in synthetic fleet")
    s.add_argument("--out", default="results/")
    s.add_argument("--fleet", default="demo")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--draws", type=int, default=4000, help="posterior draws per chain")
    s.set_defaults(func=_cmd_demo)

    s = sub.add_parser("study", help="studies on the real data of ../shared/data/real")
    s.add_argument("name", choices=["real", "blis", "client"],
                   help="real: the fit study; blis: the 16 real runs simulated in BLIS; client: "
                        "the runs' client metrics in the fit, in-sample / leave-one-run-out / "
                        "leave-one-model-out through BLIS (with --blis)")
    s.add_argument("--out", default="results/real")
    s.add_argument("--quick", action="store_true", help="small settings (a few splits, few draws)")
    s.add_argument("--blis", default=None, help="(blis) BLIS binary (default: $BLIS_BIN)")
    s.add_argument("--blis-src", default=None,
                   help="(blis) folder with defaults.yaml and hardware_config.json")
    s.add_argument("--exports", default=None,
                   help="(blis) folder of <model>-h100-tp<N>.yaml exports (else published only)")
    s.add_argument("--draws", type=int, default=20,
                   help="(blis) posterior draws simulated per run, for the 90%% bands")
    s.add_argument("--runs", default=None, help="(blis) only runs whose name contains this")
    s.add_argument("--data", default=None, help="(blis) real-data folder")
    s.add_argument("--parallel", type=int, default=2, help="(blis) BLIS runs at a time")
    s.add_argument("--resume", action="store_true",
                   help="(client) reuse the calibrated posterior of an earlier run in OUT/client")
    s.set_defaults(func=_cmd_study)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ConvergenceError as e:
        print(f"bayes-latency: fit did not converge: {_one_line(e)}", file=sys.stderr)
        return 1
    except BayesLatencyError as e:
        print(f"bayes-latency: error: {_one_line(e)}", file=sys.stderr)
        return 2


def _one_line(exc: BaseException) -> str:
    """The message of ``exc`` on one line (e.g. YAML parser errors span several)."""
    return " ".join(str(exc).split())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
