"""Leave one GPU out: every Splitwise cell of one GPU out of the fleet, predicted zero-shot.

For each GPU of the fleet's Splitwise benchmark cells (A100-80GB, H100-SXM):

1. every row of that GPU's Splitwise cells out of the fleet (the GPU's other rows stay: the
   H100's traced vLLM steps and client rows when the H100's Splitwise cells are out, so the
   Splitwise stack on that GPU is what is unseen); the rest fitted as ``bayes-latency fit``
   does (the 11 default terms, 2 x 2000 draws after 1000 tuning steps, sampling on until the
   convergence gates pass);
2. **zero-shot**: every benchmark row of the held-out cells predicted by that fit, each cell
   drawn as an unseen configuration (a level the fit saw takes its fitted effect, an unseen
   level its factor's population draw: with the A100's cells out, the A100 is an unseen GPU);
3. **zero-shot with kernels** (when ``aiconfigurator-core`` is installed): the same with
   AIConfigurator's measured GEMM efficiency per GPU in the fit (``fit --kernels``,
   :mod:`bayes_latency.model.definition.kernels`): the held-out GPU's effect is its population
   conditioned on its kernels, plus a draw of its GPU x stack interaction;
4. **BLIS's vector**: the same rows timed by BLIS's published ``trained-physics`` coefficients
   (one global vector, fitted by BLIS on vLLM runs; no band), through the same features, which
   carry each GPU's datasheet;
5. beside them, when ``results/benchmarks/fewshot_cells.json`` was measured on the same fleet,
   its zero-shot scores (one cell out at a time, the GPU's other cells kept).

Scores per GPU and phase (prefill, decode) over the held-out rows: MdAPE of the predictive
median, the share inside the 90% band and the band's median relative width; the goals are
decode MdAPE <= 5%, prefill <= 10%, bands covering 85-95%.

Usage::

    python benchmarks/leave_one_gpu_out.py [--fleet PATH|real] [--gpus NAME,...] [--work DIR]
        [--out PREFIX] [--quick]

``--fleet``: as ``benchmarks/fewshot_cells.py`` (default: the calibrated real fleet of
``bayes-latency study client --out results/real``). ``--work`` (default
``/tmp/leave_one_gpu_out``) keeps each GPU's predicted rows and fit (``<gpu>/held.csv``,
``fits.csv``); a GPU whose files are there is not fitted again. Outputs ``PREFIX.md`` and
``PREFIX.json`` (default ``results/benchmarks/leave_one_gpu_out``). ``--quick``: 200 + 200
draws, no gates extension.
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
from benchmarks.fewshot_cells import (  # noqa: E402
    DEFAULT_FLEET,
    _fit,
    _predict,
    drop_unphysical,
    load_fleet,
    splitwise_cells,
)
from benchmarks.fewshot_cells_scores import (  # noqa: E402
    GOAL_COVERAGE,
    GOAL_MDAPE,
    PHASES,
    attach_points,
    score,
)

#: The settings of the rows of the report, in order.
SETTINGS = ("zero-shot, GPU out", "zero-shot, GPU out, kernels", "BLIS's vector",
            "zero-shot, cell out")


def gpu_of(cell: str) -> str:
    """The GPU of a configuration id (``model|gpu|tp<N>[|stack]``)."""
    return cell.split("|")[1]


def blis_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` timed by BLIS's published coefficients: ``pred_median_us`` (no band: NaN
    quantiles), with the columns :func:`benchmarks.fewshot_cells._predict` gives."""
    from bayes_latency.physics.basis import DEFAULT_TERMS
    from bayes_latency.study.baselines import blis_published_beta

    beta = blis_published_beta(DEFAULT_TERMS)
    x = rows[[f"x_{t}" for t in DEFAULT_TERMS]].to_numpy(float)
    keep = ["obs_id", "phase", "prompt_size", "batch_size", "token_size"]
    return rows[keep].reset_index(drop=True).assign(
        pred_median_us=x @ beta, q05_us=np.nan, q95_us=np.nan,
        observed_us=rows["value_us"].to_numpy(float))


def run_gpu(obs: pd.DataFrame, mb: pd.DataFrame, gpu: str, work: Path, settings: Any,
            kernels: Any = None, log: Any = print) -> None:
    """Fit the fleet without ``gpu``'s Splitwise cells and predict them (see the module
    docstring), also with ``kernels`` evidence when given; writes ``work/<gpu>/held.csv`` and
    ``fits.csv``."""
    from bayes_latency.physics.basis import DEFAULT_TERMS

    d = work / gpu
    d.mkdir(parents=True, exist_ok=True)
    cells = [c for c in splitwise_cells(obs) if gpu_of(c) == gpu]
    out = obs["config_id"].isin(cells)
    rest = obs[~out].reset_index(drop=True)
    log(f"[gpu] {gpu}: {int(out.sum())} rows of {len(cells)} cells out, fitting the fleet's "
        f"{len(rest)} rows")
    cell_rows = {c: attach_points(obs[obs["config_id"] == c].reset_index(drop=True), mb)
                 for c in cells}
    fitted = [(SETTINGS[0], None)] + ([(SETTINGS[1], kernels)] if kernels is not None else [])
    held, fits = [], []
    for setting, ev in fitted:
        m, f = _fit(rest, settings, tuple(DEFAULT_TERMS), None, f"fleet without {gpu}'s "
                    f"Splitwise cells{', kernels' if ev is not None else ''}", gpu,
                    splitwise_cells(rest), kernels=ev)
        log(f"[gpu]   fit ({setting}) {f['wall_s']:.0f} s, passed {f['passed']}")
        fits.append({**f, "setting": setting})
        held += [_predict(m, rows).assign(cell=c, setting=setting)
                 for c, rows in cell_rows.items()]
    held += [blis_rows(rows).assign(cell=c, setting=SETTINGS[2]) for c, rows in cell_rows.items()]
    pd.concat(held, ignore_index=True).assign(gpu=gpu).to_csv(d / "held.csv", index=False)
    pd.DataFrame(fits).to_csv(d / "fits.csv", index=False)


def cell_out_scores(fleet_text: str) -> list[dict[str, Any]]:
    """Zero-shot scores of ``results/benchmarks/fewshot_cells.json`` (one cell out at a time),
    per cell and phase, when it was measured on the fleet ``fleet_text``; else none."""
    f = ROOT / "results" / "benchmarks" / "fewshot_cells.json"
    if not f.exists():
        return []
    res = json.loads(f.read_text())
    if res.get("fleet") != fleet_text:
        return []
    return [r for r in res.get("scores", []) if r.get("setting") == "zero-shot"]


def summarise(work: Path, fleet_text: str) -> dict[str, Any]:
    """The scores per (GPU, setting, phase) and per (GPU, cell, setting, phase), and the fits."""
    held, fits = [], []
    meta = json.loads((work / "run.json").read_text())
    for gpu in meta["gpus"]:
        d = work / gpu
        if (d / "held.csv").exists():
            held.append(pd.read_csv(d / "held.csv"))
            fits.append(pd.read_csv(d / "fits.csv"))
    if not held:
        sys.exit(f"{work}: no GPU fitted yet")
    h = pd.concat(held, ignore_index=True)
    h = h[~h["obs_id"].isin([r["obs_id"] for r in meta.get("dropped_rows", [])])]
    inside = (h["observed_us"] >= h["q05_us"]) & (h["observed_us"] <= h["q95_us"])
    h["in_90"] = inside.astype(float).where(h["q05_us"].notna())  # no band: no coverage
    by_gpu, by_cell = [], []
    for (gpu, setting), g in h.groupby(["gpu", "setting"], sort=False):
        for ph, s in score(g).items():
            by_gpu.append({"gpu": gpu, "setting": setting, "phase": ph, **s})
        for cell, gc in g.groupby("cell", sort=False):
            for ph, s in score(gc).items():
                by_cell.append({"gpu": gpu, "cell": cell, "setting": setting, "phase": ph, **s})
    cell_out = cell_out_scores(fleet_text)
    for r in cell_out:
        by_cell.append({"gpu": gpu_of(r["cell"]), "cell": r["cell"], "setting": SETTINGS[3],
                        **{k: r[k] for k in ("phase", "n", "mdape_pct", "coverage90",
                                             "band_rel_width", "obs_over_pred")}})
    return {**meta, "by_gpu": by_gpu, "by_cell": by_cell,
            "fits": pd.concat(fits, ignore_index=True).to_dict(orient="records")}


def _pct(v: Any) -> str:
    return "" if v is None or not np.isfinite(v) else f"{v:.1f}%"


def _num(v: Any, fmt: str = ".2f") -> str:
    return "" if v is None or not np.isfinite(v) else format(v, fmt)


def render(res: dict[str, Any], machine: str) -> str:
    """The report's markdown."""
    lines = ["# Leave one GPU out: a GPU's Splitwise cells predicted from the rest of the fleet",
             "",
             "Regenerate: `python benchmarks/leave_one_gpu_out.py`. " + machine, "",
             f"Fleet: {res['fleet']}. Fits: {res['settings']}. Rows measured faster than their "
             f"compute at the GPU's peak are out of the fits and the scores "
             f"({len(res.get('dropped_rows', []))}).", "",
             "- `zero-shot, GPU out`: every Splitwise cell of the GPU out of the fit, each "
             "predicted as an unseen configuration (the GPU's effect on the Splitwise stack "
             "unseen);",
             "- `zero-shot, GPU out, kernels`: the same with the kernel evidence of "
             f"{res.get('kernels') or 'AIConfigurator (not installed: not measured)'} in the "
             "fit (`fit --kernels`): the held-out GPU's effect is drawn from its population "
             "conditioned on its kernels, plus a draw of its GPU x stack interaction (the "
             "kernels are vLLM's, the cells Splitwise's);",
             "- `BLIS's vector`: BLIS's published `trained-physics` coefficients through the same "
             "features (one global vector; no band);",
             "- `zero-shot, cell out`: `fewshot_cells.md`'s zero-shot (one cell out at a time, "
             "the GPU's other cells kept), when measured on the same fleet.", "",
             f"Goals: decode MdAPE <= {GOAL_MDAPE['decode']:g}%, prefill <= "
             f"{GOAL_MDAPE['prefill']:g}%, 90% bands covering {GOAL_COVERAGE[0]:.0%}-"
             f"{GOAL_COVERAGE[1]:.0%}.", "",
             "## Per GPU", "",
             "| GPU out | setting | phase | rows | MdAPE | 90% coverage | band width | "
             "observed / predicted |",
             "|---|---|---|---|---|---|---|---|"]
    for r in res["by_gpu"]:
        lines.append(f"| {r['gpu']} | {r['setting']} | {r['phase']} | {r['n']} | "
                     f"{_pct(r['mdape_pct'])} | {_num(r['coverage90'])} | "
                     f"{_num(r['band_rel_width'])} | {_num(r['obs_over_pred'], '.3f')} |")
    lines += ["", "## Per cell", "",
              "| cell | setting | phase | rows | MdAPE | 90% coverage | band width | "
              "observed / predicted |", "|---|---|---|---|---|---|---|---|"]
    order = {s: i for i, s in enumerate(SETTINGS)}
    cells = sorted({r["cell"] for r in res["by_cell"] if r["setting"] != SETTINGS[3]})
    for c in cells:
        for r in sorted((r for r in res["by_cell"] if r["cell"] == c),
                        key=lambda r: (PHASES.index(r["phase"]), order[r["setting"]])):
            lines.append(f"| {c} | {r['setting']} | {r['phase']} | {r['n']} | "
                         f"{_pct(r['mdape_pct'])} | {_num(r['coverage90'])} | "
                         f"{_num(r['band_rel_width'])} | {_num(r['obs_over_pred'], '.3f')} |")
    lines += ["", "## Fits", "", "| GPU out | setting | rows | passed | max R-hat | "
              "min bulk ESS | divergences | draws | wall s |",
              "|---|---|---|---|---|---|---|---|---|"]
    for f in res["fits"]:
        lines.append(f"| {f['cell']} | {f.get('setting', SETTINGS[0])} | {f['rows']} | "
                     f"{f['passed']} | {f['max_rhat']:.4f} | "
                     f"{f['min_ess_bulk']:.0f} | {f['divergences']} | {f['draws']} | "
                     f"{f['wall_s']:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fleet", default=str(DEFAULT_FLEET),
                    help="observations.parquet of `study client`, or 'real'")
    ap.add_argument("--gpus", default=None, help="comma-separated GPUs (default: every GPU of "
                    "the fleet's Splitwise cells)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/leave_one_gpu_out"))
    ap.add_argument("--out", type=Path, default=ROOT / "results/benchmarks/leave_one_gpu_out")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()

    from bayes_latency.data.kernel_evidence import kernel_evidence
    from bayes_latency.data.kernels import kernel_data_root
    from bayes_latency.data.microbench import read_splitwise
    from bayes_latency.io import atomic_write_text, check_output_path
    from bayes_latency.physics.basis import DEFAULT_TERMS
    from bayes_latency.study.realdata import real_data_dir
    from bayes_latency.study.settings import CLI_FIT, QUICK

    data = real_data_dir()
    if data is None:
        sys.exit("real data not found (../shared/data/real or $BAYES_LATENCY_REAL_DATA)")
    check_output_path(args.out.with_suffix(".md"), [Path(args.fleet)] if args.fleet != "real"
                      else [], kind="file")
    obs, fleet_text = load_fleet(args.fleet, tuple(DEFAULT_TERMS))
    obs, dropped = drop_unphysical(obs)
    mb = read_splitwise(data / "microbench" / "splitwise_perf_model.csv")
    all_gpus = sorted({gpu_of(c) for c in splitwise_cells(obs)})
    gpus = [g for g in (args.gpus or "").split(",") if g] or all_gpus
    if bad := sorted(set(gpus) - set(all_gpus)):
        sys.exit(f"--gpus: unknown {bad}; the fleet's Splitwise GPUs are {all_gpus}")
    settings = QUICK if args.quick else CLI_FIT
    kernels = None
    if kernel_data_root() is not None:
        kernels = kernel_evidence()
    else:
        print("aiconfigurator-core is not installed: the kernel setting is not measured")
    args.work.mkdir(parents=True, exist_ok=True)
    record_machine(args.work, "start" if not (args.work / "machine.json").exists()
                   else time.strftime("resumed %Y-%m-%d %H:%M"))
    (args.work / "run.json").write_text(json.dumps(
        {"fleet": fleet_text, "settings": settings.describe(), "gpus": gpus,
         "dropped_rows": dropped, "kernels": kernels.source if kernels else None}, indent=1))
    for gpu in gpus:
        if (args.work / gpu / "held.csv").exists():
            print(f"[gpu] {gpu}: kept from {args.work}")
            continue
        run_gpu(obs, mb, gpu, args.work, settings, kernels)
        record_machine(args.work, f"{gpu} end")
    res = summarise(args.work, fleet_text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out.with_suffix(".json"),
                      json.dumps(res, indent=1, default=str) + "\n")
    atomic_write_text(args.out.with_suffix(".md"), render(res, machine_line(args.work)))
    print(f"wrote {args.out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
