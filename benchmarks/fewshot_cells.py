"""Unseen Splitwise benchmark cells, zero-shot and one-shot from the fleet's population.

For each Splitwise (model, GPU, TP) cell of the real fleet in turn:

1. every row of the cell's configuration out of the fleet
   (:func:`~bayes_latency.model.posterior.fleet.leave_out` ``config=<id>``); the rest fitted as
   ``bayes-latency fit`` does (the 11 default terms, 2 x 2000 draws after 1000 tuning steps,
   sampling on until the convergence gates pass) and its population kept
   (:func:`~bayes_latency.model.posterior.fleet.population_from_result`, with the fleet's noise scale of
   every noise class, :func:`~bayes_latency.model.posterior.fleet.fleet_noise`);
2. **zero-shot**: every benchmark row of the cell predicted by that fit, the configuration drawn
   as an unseen one (its levels the fleet saw take their fitted effects, an unseen level its
   factor's population draw);
3. **one-shot population**: ONE benchmark point of the cell (its prefill row and its decode row)
   fitted under the population as the prior (``LatencyModel(population=...)``: the
   configuration's coefficients and its benchmark noise scales take the fleet's priors), the
   cell's other rows predicted; each point of :func:`choose_shots` in turn;
4. **one-shot roofline**: the same point fitted with the roofline priors
   (``priors/default.yaml``) and no population.

Once per run, **in-sample**: the whole fleet fitted (every cell seen with all its points) and
every cell's rows predicted (:func:`run_in_sample`): what the model reaches with a cell's every
point, beside the least-median error the terms allow there (``fewshot_cells_bound``).

A benchmark point is one ``(prompt_size, batch_size, token_size)`` of the Splitwise sweep: its
prefill row is the mean ``prompt_time`` of ``batch_size`` prompts of ``prompt_size`` tokens, its
decode row the mean ``token_time`` (:func:`attach_points`). Scores (:func:`score`), prefill and
decode apart: MdAPE of the predictive median (200 draws), the share of rows inside their 90%
band, the band's median relative width ``(q95 - q05) / median`` and the median observed /
predicted ratio.

The fleet (``--fleet``): the calibrated real fleet of ``bayes-latency study client --out
results/real`` (``results/real/client/observations.parquet``: step rows of the two real vLLM
runs, Splitwise benchmark rows, client rows of the normal runs at the calibrated schedule), or
``--fleet real``: the real-data study's step rows and Splitwise rows
(:func:`~bayes_latency.study.realdata.load_real_data`).

Usage::

    python benchmarks/fewshot_cells.py [--fleet PATH|real] [--cells ID,...] [--shots N]
        [--terms blis|regime] [--quick] [--work DIR] [--reuse DIR] [--against DIR]
        [--out PREFIX]

The scores and the report's markdown are in ``benchmarks/fewshot_cells_scores.py``; the
least-median prefill error the terms allow with every point of a cell known (no sampling) in
``benchmarks/fewshot_cells_bound.py``.

``--work`` keeps, per cell, the predicted rows (``<cell>/held.csv``) and the fits
(``<cell>/fits.csv``); a cell whose files are there is not fitted again, so an interrupted run
resumes; ``bounds.csv`` holds the cells' bounds and ``in-sample/`` the whole fleet's fit.
``--terms regime`` fits BLIS's terms plus the compute knees (needs ``--fleet real``: a client
fleet carries the terms it was calibrated with). ``--against DIR`` sets the summary of another
run's work folder on the same fleet (other terms) beside this run's. Rows measured faster than
their compute at the GPU's peak are out of the fits and the scores, named in the report.
``--reuse DIR`` renders the report from such a folder (computing ``bounds.csv`` from
``--fleet`` when the folder lacks it). Outputs ``PREFIX.md`` and ``PREFIX.json`` (default
``results/benchmarks/fewshot_cells``). ``--quick``: one cell, one shot, 200 + 200 draws (no
gates extension), no in-sample fit.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._provenance import machine_line, record_machine  # noqa: E402
from benchmarks.fewshot_cells_scores import (  # noqa: E402, F401 - re-exported for tests
    FACTORS,
    GOAL_COVERAGE,
    GOAL_MDAPE,
    NOISE_CLASS,
    PHASES,
    SETTINGS,
    against_lines,
    against_table,
    attach_points,
    batch_sweep_table,
    benchmark_noise_prior,
    cell_label,
    choose_shots,
    goal_lines,
    half_normal_text,
    miss_lines,
    point_label,
    pooled_coverage,
    render,
    score,
    score_table,
    shape_lines,
    shot_mask,
    summary_table,
    sweep_of,
    sweep_table,
    with_gates,
)

#: The work folder's table of :func:`write_bounds`.
BOUNDS_FILE = "bounds.csv"
#: The work folder's sub-folder of :func:`run_in_sample`, and its fit's name in ``fits.csv``.
IN_SAMPLE_DIR = "in-sample"
IN_SAMPLE_FIT = ("every cell", "in-sample: the whole fleet")

#: Default fleet: the calibrated rows of ``bayes-latency study client --out results/real``.
DEFAULT_FLEET = ROOT / "results" / "real" / "client" / "observations.parquet"


# ------------------------------------------------------------------------------ fitting
def load_fleet(spec: str, terms: tuple[str, ...] | None = None) -> tuple[pd.DataFrame, str]:
    """The fleet's observation table with the feature columns of ``terms`` (default: the 11
    BLIS terms) and a sentence on what it is (see the module docstring)."""
    from bayes_latency.physics.basis import DEFAULT_TERMS
    from bayes_latency.study.realdata import load_real_data, real_data_dir

    terms = tuple(terms or DEFAULT_TERMS)
    if spec == "real":
        d = real_data_dir()
        if d is None:
            sys.exit("real data not found (../shared/data/real or $BAYES_LATENCY_REAL_DATA)")
        return (load_real_data(d, terms=terms).observations,
                "the real-data study's rows: step rows of the two real vLLM runs on H100 and the "
                "Splitwise benchmark rows")
    p = Path(spec)
    if not p.is_file():
        sys.exit(f"fleet {p} not found: run `bayes-latency study client --out results/real` "
                 "first, or pass --fleet real (step rows + Splitwise rows)")
    obs = pd.read_parquet(p)
    if missing := [t for t in terms if f"x_{t}" not in obs.columns]:
        sys.exit(f"fleet {p} has no feature column of {missing}: a client fleet carries the "
                 "terms it was calibrated with; pass --fleet real")
    return (obs,
            "the calibrated real fleet of `bayes-latency study client`: step rows of the two "
            "real vLLM runs on H100, Splitwise benchmark rows, client rows of the normal runs "
            "at the calibrated schedule")


def drop_unphysical(obs: pd.DataFrame) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """``obs`` without the rows measured faster than their compute at the GPU's peak
    (:func:`~bayes_latency.data.observations.table.faster_than_peak_compute`; the fits drop them
    too), and those rows (``obs_id``, ``config_id``, ``ratio``): out of the fits and the scores."""
    from bayes_latency.data.observations.table import without_faster_than_peak

    kept, fast = without_faster_than_peak(obs)
    rows = [{"obs_id": str(r.obs_id), "config_id": str(r.config_id), "ratio": float(r.ratio)}
            for r in fast.itertuples()]
    return kept.reset_index(drop=True), rows


def splitwise_cells(obs: pd.DataFrame) -> list[str]:
    """Configuration ids of the fleet's Splitwise benchmark rows, sorted."""
    return sorted(obs.loc[obs["kind"] == "benchmark_mean", "config_id"].astype(str).unique())


def _fit(rows: pd.DataFrame, settings: Any, terms: tuple[str, ...], population: Any,
         label: str, cell: str, noise_of: list[str], kernels: Any = None
         ) -> tuple[Any, dict[str, Any]]:
    """Fit ``rows`` (with ``kernels`` evidence when given); the fit's row of the report, with
    the noise scale of each benchmark noise class (:data:`NOISE_CLASS`), the median over the
    configurations ``noise_of``."""
    from bayes_latency.study.cv import fit_ours

    t0, c0 = time.perf_counter(), time.process_time()
    m, conv = fit_ours(rows, settings, terms, population=population, kernels=kernels)
    row = {"cell": cell, "fit": label, "rows": len(rows), "passed": bool(conv.get("passed")),
           "max_rhat": float(conv["max_rhat"]), "min_ess_bulk": float(conv["min_ess_bulk"]),
           "divergences": int(conv["divergences"]), "draws": int(conv["draws"]),
           "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}
    for ph, kind in NOISE_CLASS.items():
        row[f"noise_sigma_{ph}"] = float(np.median([m.noise(c, kind).sigma for c in noise_of]))
    row.update(noise_prior_text(population))
    return m, row


def noise_prior_text(population: Any) -> dict[str, str]:
    """Per phase, ``noise_prior_<phase>``: the prior of the fit's benchmark noise scale of the
    phase, as text: the fleet's lognormal under a population that fitted the class
    (:meth:`~bayes_latency.model.posterior.fleet.Population.config_prior`), else the priors file's
    half-normal (:func:`benchmark_noise_prior`)."""
    from bayes_latency.model.posterior.fleet import noise_priors

    fleet = noise_priors(population.fleet_noise) if population is not None else {}
    hn = benchmark_noise_prior()
    out = {}
    for ph, kind in NOISE_CLASS.items():
        if kind in fleet:
            mu, sd = fleet[kind]
            out[f"noise_prior_{ph}"] = f"LogNormal(median {np.exp(mu):.3f}, sd {sd:.2f})"
        elif ph in hn:
            out[f"noise_prior_{ph}"] = half_normal_text(hn[ph])
    return out


def _predict(m: Any, rows: pd.DataFrame) -> pd.DataFrame:
    from bayes_latency.study.cv import ours_predictions

    band = ours_predictions(m, rows.reset_index(drop=True))
    keep = ["obs_id", "phase", "prompt_size", "batch_size", "token_size"]
    return pd.concat([rows[keep].reset_index(drop=True), band], axis=1).assign(
        observed_us=rows["value_us"].to_numpy(float))


def factor_scales(pop: Any, cell: str) -> list[dict[str, Any]]:
    """Per scale of ``pop`` (``sigma_<factor>``, ``sigma_config``): the posterior median, 5% and
    95% quantiles (medians over the terms) and the median over the terms of the posterior's
    90% width over the prior's (``width_ratio``). The priors (the population's prior file): a
    factor scale ``HalfNormal(s)``, 90% interval ``[0.063 s, 1.645 s]``; ``sigma_config``
    ``LogNormal(log median, sd)``, ``median exp(+-1.645 sd)``. A scale that the fit fixed (NaN
    draws) is left out."""
    from bayes_latency.model.definition.design import prior_arrays

    pa = prior_arrays(pop.priors, pop.coefs, [])
    out = []
    for f in (*FACTORS, "config"):
        v = pop.draws.get(f"sigma_{f}")
        if v is None:
            continue
        d = v.transpose("coef", "sample").values.astype(float)
        d = d[np.isfinite(d).all(axis=1)]
        if not len(d):
            continue
        if f == "config":
            med, sd = pa.sigma_config["median"], pa.sigma_config["sigma"]
            plo, phi = med * np.exp(-1.645 * sd), med * np.exp(1.645 * sd)
        else:
            s = float(getattr(pa, f"sigma_{f}"))
            plo, phi = 0.063 * s, 1.645 * s
        q05, q50, q95 = np.quantile(d, [0.05, 0.5, 0.95], axis=1)
        out.append({"cell": cell, "scale": f"sigma_{f}", "terms": int(len(d)),
                    "posterior_q05": float(np.median(q05)), "posterior_median": float(np.median(q50)),
                    "posterior_q95": float(np.median(q95)), "prior_q05": float(plo),
                    "prior_q95": float(phi),
                    "width_ratio": float(np.median((q95 - q05) / (phi - plo)))})
    return out


def run_cell(obs: pd.DataFrame, mb: pd.DataFrame, cell: str, work: Path, settings: Any,
             terms: tuple[str, ...], n_shots: int, log: Any = print) -> None:
    """Fit and predict one cell (see the module docstring); writes ``work/<cell>/held.csv``,
    ``fits.csv``, ``cell.json`` and ``scales.csv``."""
    from bayes_latency.model.posterior.fleet import fleet_noise, leave_out, population_from_result

    d = work / cell.replace("|", "_")
    d.mkdir(parents=True, exist_ok=True)
    rows = attach_points(obs[obs["config_id"] == cell].reset_index(drop=True), mb)
    rest, n_out = leave_out(obs, f"config={cell}")
    log(f"[cells] {cell}: {n_out} rows out, fitting the fleet's {len(rest)} rows")
    others = splitwise_cells(rest)
    m_pop, f_pop = _fit(rest, settings, terms, None, "population (fleet without the cell)", cell,
                        others)
    fits = [f_pop]
    log(f"[cells]   population fit {f_pop['wall_s']:.0f} s, passed {f_pop['passed']}")
    pop = population_from_result(m_pop.result, left_out=f"config={cell}", source="real fleet",
                                 noise=fleet_noise(m_pop))
    c = rows.iloc[0]
    cfg = pd.DataFrame({"model": [c["model"]], "gpu": [c["gpu"]], "tp": [int(c["tp"])],
                        "stack": [c.get("stack", "vllm")]}, index=pd.Index([cell], name="config_id"))
    unseen = pop.location_draws(cfg, n_draws=10)[1][cell]
    seen_in = {f: sorted(rest.loc[rest[f].astype(str) == str(c[f]), "config_id"].unique())
               for f in FACTORS if f in rest}
    held = [_predict(m_pop, rows).assign(setting="zero-shot", shot="")]
    shots = choose_shots(rows, n_shots)
    for pt in shots:
        mask = shot_mask(rows, pt)
        fitted, test = rows[mask].reset_index(drop=True), rows[~mask].reset_index(drop=True)
        for setting, prior in (("one-shot population", pop), ("one-shot roofline", None)):
            m1, f1 = _fit(fitted, settings, terms, prior, f"{setting}: {point_label(pt)}", cell,
                          [cell])
            fits.append(f1)
            held.append(_predict(m1, test).assign(setting=setting, shot=point_label(pt)))
            log(f"[cells]   {setting} on {point_label(pt)}: {f1['wall_s']:.0f} s, passed "
                f"{f1['passed']}")
    h = pd.concat(held, ignore_index=True).assign(cell=cell)
    h.to_csv(d / "held.csv", index=False)
    pd.DataFrame(fits).to_csv(d / "fits.csv", index=False)
    pd.DataFrame(factor_scales(pop, cell)).to_csv(d / "scales.csv", index=False)
    info = {"cell": cell, "rows": len(rows), "points": int((rows["phase"] == "decode").sum()),
            "unseen": ", ".join(unseen) if unseen else "none",
            **{f"{f} seen in": f"{len(v)} other configuration(s)" if v else "none"
               for f, v in seen_in.items()},
            "shots": [point_label(p) for p in shots]}
    (d / "cell.json").write_text(json.dumps(info, indent=1))


def run_in_sample(obs: pd.DataFrame, mb: pd.DataFrame, cells: list[str], work: Path,
                  settings: Any, terms: tuple[str, ...], log: Any = print) -> None:
    """**in-sample**: the whole fleet fitted once (every cell seen, every point of it fitted)
    and every cell's rows predicted: what the model reaches on a cell with all its points, the
    comparator of the one-shot fits. Writes ``work/in-sample/held.csv`` and ``fits.csv``."""
    d = work / IN_SAMPLE_DIR
    d.mkdir(parents=True, exist_ok=True)
    log(f"[cells] in-sample: fitting the fleet's {len(obs)} rows")
    m, f = _fit(obs, settings, terms, None, IN_SAMPLE_FIT[1], IN_SAMPLE_FIT[0], cells)
    log(f"[cells]   in-sample fit {f['wall_s']:.0f} s, passed {f['passed']}")
    held = [_predict(m, attach_points(obs[obs["config_id"] == c].reset_index(drop=True), mb))
            .assign(setting="in-sample", shot="", cell=c) for c in cells]
    pd.concat(held, ignore_index=True).to_csv(d / "held.csv", index=False)
    pd.DataFrame([f]).to_csv(d / "fits.csv", index=False)


def write_bounds(work: Path, obs: pd.DataFrame, cells: list[str], terms: tuple[str, ...]) -> None:
    """``work/bounds.csv``: per cell, the least-median prefill error the terms allow with every
    point known (:func:`benchmarks.fewshot_cells_bound.basis_bounds`; no sampling, about 5 s
    per cell)."""
    from bayes_latency.io import atomic_write_text
    from benchmarks.fewshot_cells_bound import basis_bounds

    t = basis_bounds(obs, cells, terms, decode_mean=GOAL_MDAPE["decode"] / 100)
    atomic_write_text(work / BOUNDS_FILE, t.to_csv(index=False))


def summarise(work: Path) -> dict[str, Any]:
    """The run's results from ``work`` (every cell folder with ``held.csv``)."""
    meta = json.loads((work / "run.json").read_text())
    held, fits, cells, scales = [], [], [], []
    for cell in meta["all_cells"]:
        d = work / cell.replace("|", "_")
        if not (d / "held.csv").exists():
            continue
        held.append(pd.read_csv(d / "held.csv", keep_default_na=False,
                                na_values=[""]).assign(shot=lambda t: t["shot"].fillna("")))
        fits.append(pd.read_csv(d / "fits.csv"))
        cells.append(json.loads((d / "cell.json").read_text()))
        if (d / "scales.csv").exists():
            scales.append(pd.read_csv(d / "scales.csv"))
    ins = work / IN_SAMPLE_DIR
    if (ins / "held.csv").exists():
        held.append(pd.read_csv(ins / "held.csv", keep_default_na=False, na_values=[""])
                    .assign(shot=""))
        fits.append(pd.read_csv(ins / "fits.csv"))
    h = pd.concat(held, ignore_index=True)
    h = h[~h["obs_id"].isin([r["obs_id"] for r in meta.get("dropped_rows", [])])]
    scores = score_table(h)
    bounds = (pd.read_csv(work / BOUNDS_FILE).to_dict(orient="records")
              if (work / BOUNDS_FILE).exists() else [])
    return {**meta, "cells_run": [c["cell"] for c in cells],
            "scores": scores.to_dict(orient="records"),
            "sweeps": sweep_table(h).to_dict(orient="records"),
            "batch_sweeps": batch_sweep_table(h).to_dict(orient="records"),
            "basis_bounds": bounds,
            "fits": pd.concat(fits, ignore_index=True).to_dict(orient="records"),
            "cells": cells,
            "scales": pd.concat(scales, ignore_index=True).to_dict(orient="records")
            if scales else []}


def run(work: Path, fleet: str, cells: list[str] | None, quick: bool, n_shots: int,
        terms: tuple[str, ...] | None = None, log: Any = print) -> None:
    """Fit every cell not yet in ``work`` with the term set ``terms`` (default: the 11 BLIS
    terms; see the module docstring)."""
    from bayes_latency.physics.basis import DEFAULT_TERMS

    terms = tuple(terms or DEFAULT_TERMS)
    from bayes_latency.data.microbench import read_splitwise
    from bayes_latency.study.realdata import real_data_dir
    from bayes_latency.study.settings import CLI_FIT, QUICK

    d = real_data_dir()
    if d is None:
        sys.exit("real data not found (../shared/data/real or $BAYES_LATENCY_REAL_DATA)")
    obs, fleet_text = load_fleet(fleet, terms)
    obs, dropped = drop_unphysical(obs)
    mb = read_splitwise(d / "microbench" / "splitwise_perf_model.csv")
    all_cells = splitwise_cells(obs)
    bad = sorted(set(cells or []) - set(all_cells))
    if bad:
        sys.exit(f"--cells: unknown {bad}; the fleet's Splitwise cells are {all_cells}")
    todo = cells or (all_cells[:1] if quick else all_cells)
    settings = QUICK if quick else CLI_FIT
    work.mkdir(parents=True, exist_ok=True)
    record_machine(work, "start" if not (work / "machine.json").exists()
                   else time.strftime("resumed %Y-%m-%d %H:%M"))
    (work / "run.json").write_text(json.dumps({
        "quick": quick, "fleet": fleet_text,
        "fleet_arg": "" if Path(fleet) == DEFAULT_FLEET else fleet,
        "terms": list(terms), "settings": settings.describe(),
        "all_cells": all_cells, "n_shots": n_shots, "dropped_rows": dropped}, indent=1))
    if not (work / BOUNDS_FILE).exists():
        write_bounds(work, obs, todo if quick else all_cells, terms)
    if not quick and not (work / IN_SAMPLE_DIR / "held.csv").exists():
        run_in_sample(obs, mb, all_cells, work, settings, terms, log)
        record_machine(work, "in-sample end")
    for cell in todo:
        if (work / cell.replace("|", "_") / "held.csv").exists():
            log(f"[cells] {cell}: kept from {work}")
            continue
        t0 = time.perf_counter()
        run_cell(obs, mb, cell, work, settings, terms, n_shots, log)
        log(f"[cells] {cell}: done in {(time.perf_counter() - t0) / 60:.1f} min")
        record_machine(work, "end")


def report(work: Path, out: Path, fleet: str | None = None,
           against: Path | None = None) -> dict[str, Any]:
    """Write ``out.md`` and ``out.json`` from ``work``; return the summary. A folder without
    the bounds' table gets it from ``fleet`` when that is readable (:func:`write_bounds`).
    ``against``: the work folder of a run with other terms on the same fleet, whose summary the
    report sets beside this one's."""
    from bayes_latency.io import atomic_write_text

    if fleet is not None and not (work / BOUNDS_FILE).exists() and (
            fleet == "real" or Path(fleet).is_file()):
        meta = json.loads((work / "run.json").read_text())
        terms = tuple(meta["terms"])
        write_bounds(work, drop_unphysical(load_fleet(fleet, terms)[0])[0], meta["all_cells"],
                     terms)
    res = summarise(work)
    if against is not None:
        ref = summarise(against)
        if ref.get("fleet") != res.get("fleet"):
            sys.exit(f"--against {against}: another fleet ({ref.get('fleet')!r})")
        res["against"] = {k: ref[k] for k in ("terms", "settings", "scores", "fits")}
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out.with_suffix(".json"), json.dumps(res, indent=1, default=str) + "\n")
    atomic_write_text(out.with_suffix(".md"), render(res, machine_line(work)))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fleet", default=str(DEFAULT_FLEET),
                    help="observations.parquet of `study client`, or 'real' (default %(default)s)")
    ap.add_argument("--cells", default=None, help="comma-separated configuration ids "
                                                  "(default: every Splitwise cell)")
    ap.add_argument("--shots", type=int, default=3, help="one-shot points per cell (1-3)")
    ap.add_argument("--terms", default="blis",
                    help="term set: blis (the 11 BLIS terms) or regime (blis plus the compute "
                         "knees); a term set other than blis needs --fleet real")
    ap.add_argument("--quick", action="store_true",
                    help="one cell, one shot, 200 + 200 draws (a smoke run)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/fewshot_cells"))
    ap.add_argument("--reuse", type=Path, default=None, help="render from a --work folder")
    ap.add_argument("--out", type=Path, default=ROOT / "results/benchmarks/fewshot_cells")
    ap.add_argument("--against", type=Path, default=None,
                    help="work folder of a run with other terms on the same fleet: its summary "
                         "beside this run's in the report")
    args = ap.parse_args()
    from bayes_latency.physics.basis import TERM_SETS

    if args.terms not in TERM_SETS:
        ap.error(f"--terms must be one of {sorted(TERM_SETS)}")
    if not 1 <= args.shots <= 3:
        ap.error("--shots must be 1, 2 or 3")
    work = args.reuse or args.work
    if args.reuse is None:
        cells = [c for c in args.cells.split(",") if c] if args.cells else None
        run(work, args.fleet, cells, args.quick, 1 if args.quick else args.shots,
            TERM_SETS[args.terms])
    res = report(work, args.out, args.fleet, args.against)
    print(pd.DataFrame(res["scores"]).round(3).to_string())
    failed = [f["fit"] + " (" + f["cell"] + ")" for f in res["fits"] if not f["passed"]]
    if failed:
        print(f"{len(failed)} of {len(res['fits'])} fits fail the convergence gates: "
              + "; ".join(failed), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
