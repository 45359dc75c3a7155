"""``bayes-latency check``: diagnostics report, predictive checks and adequacy gate of a posterior.

:func:`check_command` loads a posterior, prints and writes the diagnostics report
(:func:`~bayes_latency.checks.diagnostics.diagnose`) and, with ``--tables``, runs
:func:`~bayes_latency.checks.run.run_checks`: the step, request and workload predictive checks
with their tables and plots and the adequacy gate.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from bayes_latency.checks.diagnostics import diagnose
from bayes_latency.checks.run import run_checks
from bayes_latency.io import atomic_write_text, staged_folder


def check_command(args: argparse.Namespace) -> int:
    """``bayes-latency check posterior.nc [--tables DIR] [--out DIR]``.

    Loads the posterior, prints the diagnostics report and, with ``--out``, writes
    ``diagnostics.md`` / ``diagnostics.json`` and the coefficient forest plot ``forest.png`` there. With ``--tables`` it also runs the predictive
    checks and writes their tables and plots (into ``--out``, default ``<posterior dir>/check``).

    Returns
    -------
    int
        1 when a diagnostics gate or (with ``--tables``) the adequacy gate of
        :mod:`~bayes_latency.checks.adequacy` fails, 0 otherwise.
    """
    from bayes_latency.checks.sanity import load_posterior
    from bayes_latency.io import check_output_path

    out = Path(args.out) if getattr(args, "out", None) else None
    tables = getattr(args, "tables", None)
    priors = getattr(args, "priors", None)
    if tables and out is None:
        out = Path(args.posterior).resolve().parent / "check"
    if out is not None:  # before loading: a bad --out fails at once
        from bayes_latency.cli.fit import table_inputs

        check_output_path(out, [p for p in (args.posterior, priors) if p] + table_inputs(tables),
                          kind="dir",
                          names=CHECK_FILES)
    if tables:  # every input checked before any output
        from bayes_latency.data.tables import check_tables, load_checked_observations

        if "observations" in check_tables(tables):
            load_checked_observations(tables)
    model = load_posterior(args.posterior, priors=priors)
    if out is None:
        return _check(model, args, None, None)
    # one run's files: written into a staging folder, moved into ``out`` together (a
    # findings.json of an earlier run is removed when this one has none)
    with staged_folder(out, owned=CHECK_FILES) as stage:
        return _check(model, args, stage, out)


#: Every file ``check --out`` may write (the command owns these names in its folder).
CHECK_FILES = (
    "diagnostics.md", "diagnostics.json", "forest.png", "findings.json", "adequacy.md",
    "adequacy.json", "faster_than_compute.csv", "step_ppc.csv", "step_ppc_rows.csv",
    "coverage_by_load.csv", "coverage_by_load.md", "ppc_iterations.png", "pit.png",
    "calibration.png", "step_observed_vs_predicted.png", "request_ppc.csv",
    "request_ppc_rows.csv", "workload_ppc.csv", "workload_observed_vs_predicted.png",
    "host_overhead.csv", "host_overhead.md",
)


def _check(model: object, args: argparse.Namespace, stage: Path | None, out: Path | None) -> int:
    """:func:`check_command`'s report, files written into ``stage`` (shown as in ``out``)."""
    from bayes_latency.checks.sanity import coefficient_findings

    tables = getattr(args, "tables", None)
    report = diagnose(model.result)
    print(report.to_markdown())
    findings = coefficient_findings(model.result)
    if stage is not None:
        atomic_write_text(stage / "diagnostics.md", report.to_markdown() + "\n")
        atomic_write_text(stage / "diagnostics.json",
                          json.dumps(report.to_dict(), indent=2) + "\n")
        from bayes_latency.checks.plots import plot_forest

        if not findings:
            plot_forest(model.result, stage / "forest.png")
    written: dict[str, Path] = {}
    adequacy_failed = False
    if tables and not findings:
        written = run_checks(model, Path(tables), stage)
        print("\n## Predictive checks\n")
        for name, path in written.items():
            shown = out / Path(path).name if out is not None and stage is not None and \
                Path(path).parent == stage else path
            print(f"- {name}: {shown}")
        if "workload_ppc" in written:
            wl = pd.read_csv(written["workload_ppc"])
            e2e = wl[(wl["metric"] == "e2e_mean") & (wl["stage"].astype(str) == "all")]
            print("\nmean E2E error per experiment (target < 10%):")
            for r in e2e.itertuples():
                vals = (r.observed_us, r.pred_mean_us, r.q05_us, r.q95_us)
                if not (np.all(np.isfinite(vals)) and abs(r.pred_mean_us) < 1e6 * abs(
                        r.observed_us)):
                    print(f"- {r.experiment_id}: prediction not finite or absurd (see findings)")
                    continue
                print(f"- {r.experiment_id}: {r.error_pct:+.1f}% "
                      f"(observed {r.observed_us / 1e3:.1f} ms, predicted {r.pred_median_us / 1e3:.1f} ms "
                      f"[{r.q05_us / 1e3:.1f}, {r.q95_us / 1e3:.1f}])")
        if "faster_than_compute" in written:
            from bayes_latency.data.observations.table import peak_compute_note

            print("\ndata (not a gate): "
                  + peak_compute_note(pd.read_csv(written["faster_than_compute"])))
        if "host_overhead_notes" in written:
            print("\nhost CPU (schedule() time in the step traces; not a gate):")
            print(written["host_overhead_notes"].read_text().rstrip())
        adq = json.loads(written["adequacy"].read_text())
        adequacy_failed = not adq["passed"]
        if adq["passed"]:
            print("\nadequacy gate: passed (LOO-PIT, band coverage, workload means)")
        else:
            print("\nadequacy gate: FAILED, the model does not explain these data:")
            for f in adq["failures"]:
                print(f"- {f}")
    if "findings" in written:
        findings += json.loads(written["findings"].read_text())
    if findings:
        print("\n## Findings (exit 1)\n")
        for f in findings:
            print(f"- {f}")
        if stage is not None:
            atomic_write_text(stage / "findings.json", json.dumps(findings, indent=2) + "\n")
        return 1
    if adequacy_failed:
        return 1
    return 0 if report.passed else 1
