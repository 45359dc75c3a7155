"""The predictive checks of a posterior against its ingest tables, written as files.

:func:`run_checks` runs the step, request and workload predictive checks, writes their tables and
plots and the adequacy gate's verdict (``adequacy.json``) atomically, and returns what it wrote.
``bayes-latency check --tables`` and the demo call it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["run_checks"]


def _read_file(path: Path) -> pd.DataFrame:
    """A Parquet or CSV table; a corrupt file is a one-line error naming it."""
    from bayes_latency.errors import TraceFormatError
    from bayes_latency.io import read_parquet

    if path.suffix == ".parquet":
        return read_parquet(path)
    try:
        return pd.read_csv(path)
    except Exception as exc:  # noqa: BLE001 - any parser failure is a bad file for the user
        raise TraceFormatError(f"cannot read CSV table: {exc}", file=str(path)) from None


def _read_table(folder: Path, name: str) -> pd.DataFrame | None:
    from bayes_latency.data.tables import read_table, table_files

    if table_files(folder, name):  # ingest's layout (partitioned, or one Parquet file)
        return read_table(folder, name)
    cand = folder / f"{name}.csv"
    return _read_file(cand) if cand.is_file() else None


def run_checks(model: Any, tables: Path, out: Path, seed: int = 0) -> dict[str, Path]:
    """Run the step, request and workload predictive checks and write tables and plots.

    Parameters
    ----------
    model
        A fitted :class:`~bayes_latency.model.estimator.LatencyModel`.
    tables
        Folder written by ``bayes-latency ingest`` (``observations``, ``requests`` and optionally
        ``lifecycle`` tables, Parquet or CSV); a path to an observations file also works.
    out
        Output folder (created).
    seed
        Seed of the posterior predictive draws.

    Returns
    -------
    dict
        Name -> written file.
    """
    from bayes_latency.checks import adequacy, plots, ppc
    from bayes_latency.errors import BayesLatencyError

    tables = Path(tables)
    folder = tables if tables.is_dir() else tables.parent
    if tables.is_file():
        obs = _read_file(tables)
    else:
        obs = _read_table(folder, "observations")
    if obs is None:
        raise BayesLatencyError(f"no observations table in {tables}")
    from bayes_latency.data.observations.build import validate_observations

    validate_observations(obs, source=str(tables))
    requests = _read_table(folder, "requests")
    lifecycle = _read_table(folder, "lifecycle")
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    from bayes_latency.data.observations.table import faster_than_peak_compute

    fast = faster_than_peak_compute(obs)  # rows no GPU can have measured: reported, not a gate
    if len(fast):
        written["faster_than_compute"] = _write_csv(fast, out / "faster_than_compute.csv")

    from bayes_latency.checks.sanity import prediction_findings

    findings: list[str] = []  # non-finite / absurd predictions: reported, never plotted
    step_rows = obs[obs["kind"].isin(ppc.STEP_KINDS)].reset_index(drop=True)
    if len(step_rows):
        draws = model.sample_posterior_predictive(step_rows, seed=seed)
        bad = prediction_findings("step rows", step_rows["value_us"], draws.values)
        findings += bad
        rows = ppc.ppc_rows(step_rows, draws, kinds=ppc.STEP_KINDS)
        summary = ppc.summarize_rows(rows, by=ppc.STEP_GROUPS)
        written["step_ppc"] = _write_csv(summary, out / "step_ppc.csv")
        written["step_rows"] = _write_csv(rows, out / "step_ppc_rows.csv")
        by_load = ppc.coverage_by_load(step_rows, rows)
        if len(by_load):
            written["coverage_by_load"] = _write_csv(by_load, out / "coverage_by_load.csv")
            written["coverage_by_load_md"] = _write_text(out / "coverage_by_load.md",
                                                         load_coverage_markdown(by_load))
    if len(step_rows) and not bad:
        written["ppc_plot"] = plots.plot_ppc_iterations(step_rows, draws,
                                                        out / "ppc_iterations.png")
        written["pit_plot"] = plots.plot_pit(step_rows, draws, out / "pit.png",
                                             kinds=ppc.STEP_KINDS)
        written["calibration_plot"] = plots.plot_calibration(rows, out / "calibration.png")
        written["step_scatter"] = plots.plot_observed_vs_predicted(
            rows, out / "step_observed_vs_predicted.png", title="Steps: observed vs predicted")
    wl = None
    if requests is not None and len(requests):
        req = ppc.request_ppc(model, obs, requests, seed=seed)
        written["request_ppc"] = _write_csv(req.summary(), out / "request_ppc.csv")
        written["request_rows"] = _write_csv(req.rows, out / "request_ppc_rows.csv")
        wl = ppc.workload_ppc(req, lifecycle=lifecycle)
        written["workload_ppc"] = _write_csv(wl, out / "workload_ppc.csv")
        bad = (prediction_findings("request rows", req.rows["observed_us"],
                                   req.rows["pred_mean_us"]) if len(req.rows) else [])
        bad += prediction_findings("workload means", wl["observed_us"], wl["pred_mean_us"]) \
            if len(wl) and "observed_us" in wl else []
        findings += bad
        if not bad:
            written["workload_scatter"] = plots.plot_observed_vs_predicted(
                wl, out / "workload_observed_vs_predicted.png", facet="metric",
                predicted="pred_median_us",
                title="Workload means: observed vs predicted (90% band)")
    iterations = _read_table(folder, "iterations")
    if iterations is not None and len(iterations):
        from bayes_latency.checks.diagnostics_report import _markdown_table
        from bayes_latency.checks.host_overhead import host_overhead_and_mask, host_overhead_notes

        host, hot = host_overhead_and_mask(iterations)
        if len(host):
            written["host_overhead"] = _write_csv(host, out / "host_overhead.csv")
            notes = host_overhead_notes(host)
            if notes:
                cov = _host_coverage(rows, step_rows, iterations, hot) if len(step_rows) else None
                text = "".join(f"- {n}\n" for n in notes)
                if cov is not None and len(cov):
                    text += ("\nIteration rows inside their predictive bands, host-bound and quiet "
                             "steps apart:\n\n" + _markdown_table(cov) + "\n")
                written["host_overhead_notes"] = _write_text(out / "host_overhead.md", text)
    if findings:
        written["findings"] = _write_text(out / "findings.json",
                                          json.dumps(findings, indent=2) + "\n")
    # adequacy gate: LOO-PIT and band coverage of the fitted rows, workload means (a model
    # without posterior coefficient draws is judged on the in-sample PIT of the step check)
    if hasattr(model, "design") and hasattr(model, "coefficients"):
        fitted = obs[obs["config_id"].isin(set(model.design.configs.index))]
        step_rows = adequacy.step_checks(model, fitted, seed=seed)
    else:
        step_rows = rows if len(step_rows) else None
    adq = adequacy.assess(step_rows, wl)
    _write_text(out / "adequacy.md", adq.to_markdown())
    written["adequacy"] = _write_text(out / "adequacy.json",
                                      json.dumps(adq.to_dict(), indent=2) + "\n")
    return written


#: Rows of a load bin below which :func:`load_coverage_markdown` does not call a miss.
MIN_BIN_ROWS = 20


def load_coverage_markdown(by_load: pd.DataFrame) -> str:
    """The report of :func:`~bayes_latency.checks.ppc.bands.coverage_by_load`: the bins (of at
    least :data:`MIN_BIN_ROWS` rows) whose 90% band holds less than 85% or more than 95% of
    their rows, then the whole table."""
    from bayes_latency.checks.diagnostics_report import _markdown_table

    t = by_load.round(3)
    big = t[t["n"] >= MIN_BIN_ROWS]
    miss = big[(big["coverage_90"] < 0.85) | (big["coverage_90"] > 0.95)]
    lines = ["# Band coverage by load", "",
             "Share of the step rows inside their 50% / 90% posterior predictive bands, by "
             "batch size (requests per step) and by part of the run (thirds of each traced "
             "run's steps: a run that raises its request rate stage by stage is heaviest last). "
             "`median_band_rel_width`: the 90% band's width over the predictive median.", ""]
    if len(miss):
        lines += [f"Bins of {MIN_BIN_ROWS} rows or more whose 90% band holds outside 85-95%:", ""]
        lines += [f"- `{r.config_id}` {r.kind}, {r.by} {r.bin}: {r.coverage_90:.3f} of {r.n} "
                  f"(50% band: {r.coverage_50:.3f})" for r in miss.itertuples()]
    else:
        lines.append(f"Every bin of {MIN_BIN_ROWS} rows or more holds 85-95% of its rows in its "
                     "90% band.")
    return "\n".join([*lines, "", _markdown_table(t), ""])


def _host_coverage(rows: pd.DataFrame, step_rows: pd.DataFrame, iterations: pd.DataFrame,
                   mask: np.ndarray) -> pd.DataFrame:
    """Per experiment, the share of ``iteration`` rows inside their 90% / 50% bands, host-bound
    steps (``mask``, row-aligned with ``iterations``:
    :func:`~bayes_latency.checks.host_overhead.host_overhead_and_mask`) and quiet ones apart."""
    hot = set(zip(iterations["experiment_id"].astype(str).to_numpy()[mask],
                  iterations["step_id"].to_numpy(dtype=np.int64)[mask], strict=True))
    it = step_rows[(step_rows["kind"] == "iteration") & step_rows["step_first"].notna()]
    flag = {o: (str(e), int(f)) in hot
            for o, e, f in zip(it["obs_id"], it["experiment_id"], it["step_first"], strict=True)}
    r = rows[rows["kind"] == "iteration"]
    r = r.assign(steps=r["obs_id"].map(flag).map({True: "host-bound", False: "quiet"}))
    r = r[r["steps"].notna()]
    return (r.groupby(["experiment_id", "steps"])
            .agg(n=("in_90", "size"), in_90=("in_90", "mean"), in_50=("in_50", "mean"))
            .round(3).reset_index())


def _write_csv(df: pd.DataFrame, path: Path) -> Path:
    from bayes_latency.io import atomic_write

    return atomic_write(path, lambda tmp: df.to_csv(tmp, index=False))


def _write_text(path: Path, text: str) -> Path:
    from bayes_latency.io import atomic_write_text

    return atomic_write_text(path, text)
