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
from bayes_latency.io import atomic_write_text


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
    from bayes_latency.checks.sanity import coefficient_findings, load_posterior
    from bayes_latency.io import check_output_path

    out = Path(args.out) if getattr(args, "out", None) else None
    tables = getattr(args, "tables", None)
    priors = getattr(args, "priors", None)
    if tables and out is None:
        out = Path(args.posterior).resolve().parent / "check"
    if out is not None:  # before loading: a bad --out fails at once
        check_output_path(out, [p for p in (args.posterior, tables, priors) if p], kind="dir",
                          names=("diagnostics.md", "diagnostics.json", "findings.json"))
    if tables:  # every input checked before any output
        from bayes_latency.data.tables import check_tables, load_checked_observations

        if "observations" in check_tables(tables):
            load_checked_observations(tables)
    model = load_posterior(args.posterior, priors=priors)
    report = diagnose(model.result)
    print(report.to_markdown())
    findings = coefficient_findings(model.result)
    if out is not None:
        atomic_write_text(out / "diagnostics.md", report.to_markdown() + "\n")
        atomic_write_text(out / "diagnostics.json", json.dumps(report.to_dict(), indent=2) + "\n")
        from bayes_latency.checks.plots import plot_forest

        if not findings:
            plot_forest(model.result, out / "forest.png")
    written: dict[str, Path] = {}
    adequacy_failed = False
    if tables and not findings:
        written = run_checks(model, Path(tables), out)
        print("\n## Predictive checks\n")
        for name, path in written.items():
            print(f"- {name}: {path}")
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
        if out is not None:
            atomic_write_text(out / "findings.json", json.dumps(findings, indent=2) + "\n")
        return 1
    if adequacy_failed:
        return 1
    return 0 if report.passed else 1
