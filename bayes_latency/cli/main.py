"""The ``bayes-latency`` command: simulate, ingest, fit, calibrate, check, export, demo.

Each subcommand parses its arguments here and calls one library function; errors of the package
(:class:`~bayes_latency.errors.BayesLatencyError`) become a one-line message and exit code 2,
failed quality gates (convergence, diagnostics) exit code 1. The machine's faults are mapped here
too (:func:`main`): a file-system error (no space left, file-size limit, not writable, I/O error)
is one line naming the path, exit 2; Ctrl-C, ``SIGTERM`` and ``SIGHUP`` end the command with one
line saying what was kept, exit 128 + the signal number, after every temporary file and lock
was removed; a closed standard output (``| head``) ends it quietly.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bayes_latency.errors import AdequacyError, BayesLatencyError, ConvergenceError


def _fleet_folders(out: Path) -> list[str]:
    """What an earlier ``simulate`` wrote into ``out``: its ``truth.yaml`` and the experiment
    folders it lists (nothing else of the folder is the command's)."""
    truth = out / "truth.yaml"
    if not truth.is_file():
        return []
    try:
        from bayes_latency.textfiles import load_yaml

        doc = load_yaml(truth.read_text(encoding="utf-8"))
        ids = [str(k) for k in (doc.get("experiments") or {})] if isinstance(doc, dict) else []
    except (OSError, ValueError, BayesLatencyError):
        ids = []
    return ["truth.yaml", *[i for i in ids if i and "/" not in i and i not in (".", "..")]]


def _cmd_simulate(args: argparse.Namespace) -> int:
    from bayes_latency.io import check_output_path, staged_folder
    from bayes_latency.synth.fleet import simulate_fleet

    out = check_output_path(args.out, kind="dir")
    # one fleet per folder: the experiments of an earlier fleet in ``out`` are replaced, not
    # mixed with this one's (an ``ingest out/*`` would read both)
    with staged_folder(out, owned=_fleet_folders(out)) as stage:
        folders = simulate_fleet(args.fleet, stage, seed=args.seed, progress=not args.quiet)
    print(f"simulated {len(folders)} experiments into {args.out}")
    return 0


def _cmd_ingest(args: argparse.Namespace) -> int:
    from bayes_latency.checks.host_overhead import ingest_notes
    from bayes_latency.data.experiment import ingest

    report = ingest([Path(p) for p in args.paths], Path(args.out),
                    config=Path(args.config) if args.config else None,
                    scheduler=args.scheduler, iteration_notes=ingest_notes)
    print(report.format())
    return 0


def _cmd_fit(args: argparse.Namespace) -> int:
    from bayes_latency.cli.fit import fit_command

    return fit_command(args)


def _cmd_check(args: argparse.Namespace) -> int:
    from bayes_latency.cli.check import check_command

    return check_command(args)


def _cmd_export(args: argparse.Namespace) -> int:
    from bayes_latency.cli.export import export_command

    return export_command(args)


def _cmd_demo(args: argparse.Namespace) -> int:
    from bayes_latency.io import check_output_path, staged_folder
    from bayes_latency.study.demo import run_demo

    out = check_output_path(args.out, kind="dir")
    # one run's files: staged, then moved in (files of the folder that are not the demo's kept)
    with staged_folder(out, owned=DEMO_FILES) as stage:
        return run_demo(stage, fleet=args.fleet, seed=args.seed, draws=args.draws, shown=out)


#: What ``demo --out`` writes into its folder (the command owns these names there).
DEMO_FILES = ("fleet", "tables", "posterior.nc", "diagnostics.md", "checks", "recovery.csv",
              "workload_vs_truth.csv", "exports", "README.md")


def _cmd_study(args: argparse.Namespace) -> int:
    from bayes_latency.io import check_output_path
    from bayes_latency.study.realdata import real_data_dir

    check_output_path(args.out, [p for p in (args.data, args.exports, args.blis_src,
                                             real_data_dir()) if p], kind="dir")
    if args.name == "blis":
        from bayes_latency.study.blis.report import main as study_blis

        return study_blis(Path(args.out), blis=args.blis, exports=args.exports,
                          n_draws=args.draws, runs=args.runs, data=args.data,
                          blis_src=args.blis_src, parallel=args.parallel,
                          expansion=args.expansion)
    if args.name == "fewshot":
        from bayes_latency.study.client.fewshot import main as study_fewshot

        return study_fewshot(Path(args.out), blis=args.blis or os.environ.get("BLIS_BIN"),
                             quick=args.quick, n_draws=args.draws,
                             models=[m_ for m_ in (args.models or "").split(",") if m_] or None,
                             shots=args.shots, kernels=args.kernels)
    if args.name == "client":
        from bayes_latency.study.client.blis import main as study_client

        return study_client(Path(args.out), blis=args.blis, quick=args.quick,
                            n_draws=args.draws, resume=args.resume,
                            parts=None if args.parts is None
                            else [p_ for p_ in args.parts.split(",") if p_],
                            kernels=args.kernels)
    from bayes_latency.study.real import main as study_real

    return study_real(Path(args.out), quick=args.quick)


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from bayes_latency.cli.calibrate import calibrate_command

    return calibrate_command(args)


_SCHEDULER_HELP = ("Dask scheduler for the per-experiment / per-configuration tasks: an address "
                   "(tcp://host:8786), 'local' (a local cluster, one worker per core) or 'inline' "
                   "(this process); default: $DASK_SCHEDULER_ADDRESS if set, else inline for "
                   "small inputs and a local cluster for large ones")


_PRIORS_OF_FILE_HELP = ("prior YAML the posterior was fitted with, checked against the priors "
                        "embedded in the file (default: the priors embedded in the posterior "
                        "file)")


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
    s.add_argument("--method", default="laplace-hierarchy", choices=["laplace-hierarchy", "full"],
                   help="laplace-hierarchy: per-configuration likelihood summaries under the "
                        "hierarchy (fast); full: every row in the likelihood "
                        "(default %(default)s)")
    s.add_argument("--sampler", default="nutpie", choices=["nutpie", "pymc", "numpyro", "laplace"],
                   help="NUTS via nutpie/PyMC/numpyro, or 'laplace' (fast, APPROXIMATE) "
                        "(default %(default)s)")
    s.add_argument("--priors", help="prior YAML (default: priors/default.yaml)")
    # model.definition.likelihood.NOISE_LOADS (literal here, checked by tests/test_noise_load.py)
    s.add_argument("--noise-load", default=None, choices=["none", "batch", "batch-growth", "kv"],
                   help="load covariate the noise scale grows with: requests per step "
                        "(batch; batch-growth: growth only), KV-cache reads per step (kv), or "
                        "none (default: the package's, model.definition.likelihood.DEFAULT_NOISE_LOAD)")
    # model.inference.sampler.DEFAULT_DRAWS / DEFAULT_TUNE / TARGET_ACCEPT (literal here: the CLI imports no
    # model code before a command runs; tests/test_fit_defaults.py checks they agree)
    s.add_argument("--draws", type=int, default=2000,
                   help="posterior draws per chain (default %(default)s)")
    s.add_argument("--max-draws", type=int, default=None,
                   help="while the convergence gates fail, keep sampling up to this many draws "
                        "per chain, checking every --draws/2 (default: 6 x --draws, 12000; "
                        "--max-draws 0: exactly --draws)")
    s.add_argument("--tune", type=int, default=1000,
                   help="tuning steps per chain (default %(default)s)")
    s.add_argument("--adaptation", default="low_rank", choices=["low_rank", "diag"],
                   help="nutpie mass-matrix adaptation (diag: cheaper when no coefficients are "
                        "identified only jointly; default %(default)s)")
    s.add_argument("--chains", type=int, default=2,
                   help="MCMC chains, run two at a time (default %(default)s)")
    s.add_argument("--seed", type=int, default=0,
                   help="seed of the sampler and of the predictive checks (default %(default)s)")
    s.add_argument("--max-rhat", type=float, default=1.01,
                   help="convergence gate: largest R-hat accepted (default %(default)s)")
    s.add_argument("--terms", help="comma-separated beta terms, or a term set: blis (the 11 "
                   "BLIS terms, the default) or regime (blis plus the compute knees)")
    s.add_argument("--target-accept", type=float, default=0.99,
                   help="NUTS step-size target (default %(default)s)")
    s.add_argument("--scheduler", default=None,
                   help=_SCHEDULER_HELP + " (stage 1 only; the hierarchy runs here)")
    s.add_argument("--population", default=None,
                   help="population file (`bayes-latency population`): the configurations of "
                        "the tables take the fleet's population as their prior")
    from bayes_latency.cli.population import KERNELS_HELP
    from bayes_latency.cli.population import add_parser as add_population

    s.add_argument("--kernels", action="store_true", help=KERNELS_HELP)
    s.set_defaults(func=_cmd_fit)

    add_population(sub)

    s = sub.add_parser("calibrate", help="coefficients with bands from one client benchmark "
                                         "result (no traces needed)")
    s.add_argument("result", help="client result: vllm bench serve JSON, inference-perf results "
                                  "folder / lifecycle JSON, or BLIS TraceV2 header YAML / CSV")
    s.add_argument("--model", required=True, help="known model name or config.json path")
    s.add_argument("--gpu", required=True)
    s.add_argument("--tp", type=int, default=1)
    s.add_argument("--out", required=True, help="posterior file (.nc)")
    s.add_argument("--tables", help="ingested trace tables whose rows join the same fit")
    s.add_argument("--population", default=None,
                   help="population file whose prior the configuration takes (`bayes-latency "
                        "population`); default without --tables: the shipped population of the "
                        "real H100 fleet; 'none': the roofline priors alone")
    s.add_argument("--export", help="BLIS YAML of the configuration (with run-level draws)")
    s.add_argument("--export-draws", type=int, default=20,
                   help="run-level coefficient draws in the export (for bands; 0: none)")
    s.add_argument("--kv-blocks", type=int, default=None,
                   help="KV-cache blocks per GPU (default: BLIS's formula from config.json and "
                        "the GPU memory)")
    s.add_argument("--max-num-seqs", type=int, default=128)
    s.add_argument("--max-num-batched-tokens", type=int, default=2048)
    s.add_argument("--method", default="laplace-hierarchy", choices=["laplace-hierarchy", "full"])
    s.add_argument("--sampler", default="nutpie", choices=["nutpie", "pymc", "numpyro", "laplace"])
    s.add_argument("--priors", help="prior YAML (default: priors/default.yaml)")
    s.add_argument("--terms", help="comma-separated beta terms, or a term set: blis (the 11 "
                   "BLIS terms, the default) or regime (blis plus the compute knees)")
    s.add_argument("--draws", type=int, default=2000,
                   help="draws per chain of the full fits (2000: on the synthetic test result "
                        "1000 gave R-hat 1.0136 on alpha_arrival + prefill_compute, which one "
                        "result identifies only as a sum; 2000 gave 1.0022, ESS 1015)")
    s.add_argument("--tune", type=int, default=1000)
    s.add_argument("--chains", type=int, default=2)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--max-rhat", type=float, default=1.01)
    s.add_argument("--target-accept", type=float, default=0.99,
                   help="NUTS target acceptance (0.99: a one-configuration fit with 0.95 left 1 "
                        "divergence in 2000 transitions on the synthetic test result)")
    s.add_argument("--tol", type=float, default=0.01,
                   help="stop when no replayed client mean moves more than this (relative)")
    s.add_argument("--max-iter", type=int, default=6, help="most replay/fit iterations")
    s.add_argument("--fast-iter", type=int, default=4,
                   help="most replay/fit iterations with a short fit (a quarter of --draws "
                        "and --tune) before full ones (0: none); convergence is judged on a "
                        "full fit")
    s.set_defaults(func=_cmd_calibrate)

    s = sub.add_parser("check", help="diagnostics report; non-zero exit when a gate fails")
    s.add_argument("posterior", help="posterior file written by `fit` or `calibrate` (.nc, .zarr)")
    s.add_argument("--tables", help="ingested tables for the predictive checks and the adequacy "
                                    "gate (default: none, diagnostics only)")
    s.add_argument("--out", help="folder for the report and plots (default: none; with --tables, "
                                 "<posterior folder>/check)")
    s.add_argument("--priors", help=_PRIORS_OF_FILE_HELP)
    s.set_defaults(func=_cmd_check)

    s = sub.add_parser("export", help="coefficients for a simulator configuration")
    s.add_argument("posterior", nargs="?", default=None,
                   help="posterior file written by `fit` or `calibrate` (.nc, .zarr); without "
                        "it, a zero-shot export from a fleet population (--population)")
    s.add_argument("--population", default=None,
                   help="population file (`bayes-latency population`) of a zero-shot export, "
                        "used when no posterior is given (default: the shipped population of "
                        "the real H100 fleet)")
    s.add_argument("--model", required=True, help="known model name or config.json path")
    s.add_argument("--gpu", required=True, help="GPU name (H100, H200, A100-80GB ...) or "
                                                "datasheet file")
    s.add_argument("--tp", type=int, default=None,
                   help="tensor-parallel degree; required when the model's weights do not fit "
                        "one GPU, else 1 by default (printed)")
    s.add_argument("--draws", type=int, default=0,
                   help="also write this many posterior draws of the coefficients, for "
                        "ensemble simulation (default %(default)s: none)")
    s.add_argument("--format", default="json", choices=["json", "blis"],
                   help="json: the export document (terms, bands, reference predictions); "
                        "blis: BLIS's trained_physics_coefficients YAML (default %(default)s)")
    s.add_argument("--priors", help=_PRIORS_OF_FILE_HELP)
    s.add_argument("--workload", default=None,
                   help="a client result (what `calibrate` reads) or a workload spec (an "
                        "inference-perf profile.yaml, or a BLIS workload spec with an "
                        "inference_perf section): replayed by the package's scheduler, its "
                        "steps are the operating point at which the compute knees of a regime "
                        "posterior are projected onto BLIS's prefill_compute (needed for "
                        "--format blis of a posterior fitted with --terms regime)")
    s.add_argument("--prompt-sharing", default=None, choices=["prompt", "system"],
                   help="--workload: prompt: a user's whole prompt repeats and is cached (the "
                        "prefix groups of the result's profile); system: only the system prompt "
                        "is shared, as BLIS's expansion of an inference-perf spec caches it "
                        "(default: prompt for a client result, system for a spec)")
    s.add_argument("--kv-blocks", type=int, default=None,
                   help="--workload: KV-cache blocks per GPU (default: BLIS's formula)")
    s.add_argument("--max-num-seqs", type=int, default=128, help="--workload: the server's")
    s.add_argument("--max-num-batched-tokens", type=int, default=2048,
                   help="--workload: the server's")
    s.add_argument("--out", required=True, help="file to write (.json or .yaml)")
    s.set_defaults(func=_cmd_export)

    s = sub.add_parser("demo", help="the whole path on the built-in synthetic fleet")
    s.add_argument("--out", default="results/")
    s.add_argument("--fleet", default="demo")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--draws", type=int, default=None,
                   help="posterior draws per chain (default: bayes_latency.study.demo.DEMO_DRAWS)")
    s.set_defaults(func=_cmd_demo)

    s = sub.add_parser("study", help="studies on the validation data set ($BAYES_LATENCY_REAL_DATA "
                                     "or study.realdata.real_data_dir's default location; blis "
                                     "also --data DIR; skipped when absent)")
    s.add_argument("name", choices=["real", "blis", "client", "fewshot"],
                   help="real: the fit study; blis: the 16 real runs simulated in BLIS; client: "
                        "the runs' client metrics in the fit, in-sample / leave-one-run-out / "
                        "leave-one-model-out through BLIS (with --blis); fewshot: each model out "
                        "of the fleet, zero-shot and one-shot from the fleet's population, in "
                        "BLIS (after client)")
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
    s.add_argument("--expansion", default="both", choices=["prefix", "inference-perf", "both"],
                   help="(blis) how a run becomes BLIS workloads: prefix (open-loop arrivals, "
                        "each user's whole prompt cached), inference-perf (BLIS's own expansion "
                        "of the profile: closed-loop sessions, system prompt shared) or both "
                        "(default %(default)s)")
    s.add_argument("--resume", action="store_true",
                   help="(client) reuse the calibrated posterior of an earlier run in OUT/client, "
                        "and the tables of the parts not run")
    s.add_argument("--parts", default=None,
                   help="(client) comma-separated parts to run: insample,loro,lomo (default all; "
                        "'' with --resume: only render the README from the saved tables)")
    s.add_argument("--kernels", action=argparse.BooleanOptionalAction, default=True,
                   help="(client, fewshot) every fit takes AIConfigurator's measured GEMM tables as "
                        "evidence on the GPU effects, as `fit --kernels` (the optional extra "
                        "kernels; the default); --no-kernels: without them")
    s.add_argument("--models", default=None,
                   help="(fewshot) comma-separated held-out models (default: all)")
    s.add_argument("--shots", type=int, default=None,
                   help="(fewshot) at most this many one-shot runs per model (default: each)")
    s.set_defaults(func=_cmd_study)
    return p


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or a termination signal (``SIGTERM``, ``SIGHUP``) raised in the main thread, so
    that every ``finally`` and context manager (temporary files, locks, Dask clusters) cleans
    up; ``signum`` is the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _on_signal(signum: int, _frame: object) -> None:
    """Raise :class:`Interrupted` at the first signal and record it
    (:func:`bayes_latency.io.mark_interrupted`: no output is moved into place afterwards, also
    when a library swallows the exception, e.g. a sampler returning its draws so far); later
    signals are ignored while the command cleans up (``SIGKILL`` still ends it)."""
    from bayes_latency.io import mark_interrupted

    if mark_interrupted(signum):
        raise Interrupted(signum)


@contextlib.contextmanager
def _signals() -> Iterator[None]:
    """Ctrl-C and termination signals raise :class:`Interrupted`; ``SIGXFSZ`` (over ``ulimit
    -f``) is ignored, so that the write fails with ``EFBIG`` (an error naming the file) instead
    of killing the process. The earlier handlers are restored afterwards (``main`` also runs
    inside other programs, e.g. tests)."""
    wanted = {signal.SIGINT: _on_signal, signal.SIGTERM: _on_signal,
              signal.SIGHUP: _on_signal, signal.SIGXFSZ: signal.SIG_IGN}
    old: dict[int, object] = {}
    try:
        for sig, handler in wanted.items():
            try:
                old[sig] = signal.signal(sig, handler)
            except (ValueError, OSError):  # not the main thread
                pass
        yield
    finally:
        for sig, handler in old.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(sig, handler)


#: Commands that compile model code (PyTensor, numba) and so need a writable compile cache.
_COMPILING = frozenset({"fit", "calibrate", "population", "check", "export", "demo", "study"})


def _writable_dir(path: Path) -> bool:
    """Whether ``path`` exists or can be made, and a file can be created in it."""
    from bayes_latency.io import probe_writable

    try:
        path.mkdir(parents=True, exist_ok=True)
        probe_writable(path)
    except OSError:
        return False
    return True


def _compile_cache() -> str | None:
    """When the home folder cannot hold PyTensor's compile cache (read-only, missing, a file),
    point PyTensor, numba and matplotlib at a temporary folder (before any of them is
    imported) and return the line that says so; None when the home folder is fine or the user
    chose the folders."""
    flags = os.environ.get("PYTENSOR_FLAGS", "")
    if "compiledir" in flags or "pytensor" in sys.modules:
        return None
    home = Path(os.path.expanduser("~"))
    if _writable_dir(home / ".pytensor"):
        return None
    try:
        tmp = tempfile.mkdtemp(prefix="bayes-latency-cache-")
    except OSError as exc:
        from bayes_latency.io import OutputWriteError, os_error_text

        raise OutputWriteError(f"the home folder {home} is not writable and no temporary "
                               f"folder can be made ({os_error_text(exc)}); set HOME or TMPDIR "
                               f"to a writable folder") from None
    os.environ["PYTENSOR_FLAGS"] = ",".join(f for f in (flags, f"base_compiledir={tmp}") if f)
    os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(tmp, "numba"))
    os.environ.setdefault("MPLCONFIGDIR", os.path.join(tmp, "matplotlib"))
    import atexit
    import shutil

    atexit.register(shutil.rmtree, tmp, True)
    return (f"bayes-latency: note: the home folder {home} is not writable; compiling in the "
            f"temporary folder {tmp} (removed at exit; set HOME to a writable folder to keep "
            f"the compile cache)")


def _kept_text() -> str:
    """What an interrupted command leaves: the outputs it had moved into place, or nothing."""
    from bayes_latency.io import written_paths

    kept = written_paths()
    if not kept:
        return "nothing written"
    names = ", ".join(str(p) for p in kept[:3]) + (f" and {len(kept) - 3} more"
                                                   if len(kept) > 3 else "")
    return f"kept what was complete: {names}"


class _Stdout:
    """Standard output that remembers the error of a failed write (a full device, an I/O
    error), so that the message names standard output rather than a file."""

    def __init__(self, inner: object) -> None:
        self._inner = inner
        self.error: OSError | None = None

    def write(self, text: str) -> int:
        try:
            return self._inner.write(text)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        try:
            self._inner.flush()
        except OSError as exc:
            self.error = exc
            raise

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


def _drop_stdout() -> None:
    """Point standard output at the null device: what is still buffered for a closed or failing
    stdout is dropped instead of failing again at exit."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script."""
    args = build_parser().parse_args(argv)
    from bayes_latency.io import mark_interrupted, os_error_text, written_paths

    written_paths(reset=True)
    mark_interrupted(None)
    stdout = sys.stdout = _Stdout(sys.stdout)
    with _signals():
        try:
            if args.command in _COMPILING:
                note = _compile_cache()
                if note:
                    print(note, file=sys.stderr)
            rc = int(args.func(args) or 0)
            sys.stdout.flush()  # a closed stdout fails here, not at exit
            return rc
        except ConvergenceError as e:
            print(f"bayes-latency: fit did not converge: {_one_line(e)}", file=sys.stderr)
            return 1
        except AdequacyError as e:
            print(f"bayes-latency: {_one_line(e)}", file=sys.stderr)
            return 1
        except BayesLatencyError as e:
            print(f"bayes-latency: error: {_one_line(e)}", file=sys.stderr)
            return 2
        except BrokenPipeError:
            # the reader of stdout is gone (``| head``): no more output, and no message there
            _drop_stdout()
            print(f"bayes-latency: error: standard output was closed (broken pipe); "
                  f"{_kept_text()}", file=sys.stderr)
            return 128 + signal.SIGPIPE
        except OSError as e:
            where = None
            if stdout.error is not None and getattr(e, "filename", None) is None:
                where = "standard output"
                _drop_stdout()
            print(f"bayes-latency: error: {_one_line(os_error_text(e, where))}"
                  + (f"; {_kept_text()}" if where else ""), file=sys.stderr)
            return 2
        except KeyboardInterrupt as e:
            signum = getattr(e, "signum", None) or mark_interrupted() or signal.SIGINT
            how = "interrupted" if signum == signal.SIGINT else \
                f"terminated ({signal.Signals(signum).name})"
            print(f"bayes-latency: {how}; {_kept_text()}; temporary files removed",
                  file=sys.stderr)
            return 128 + int(signum)
        finally:
            mark_interrupted(None)  # library calls after this command are not interrupted
            if sys.stdout is stdout:
                sys.stdout = stdout._inner


def _one_line(exc: BaseException) -> str:
    """The message of ``exc`` on one line (e.g. YAML parser errors span several)."""
    return " ".join(str(exc).split())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
