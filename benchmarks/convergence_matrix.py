"""Does ``bayes-latency fit`` with no flags converge? A matrix of data sets and seeds.

Cases (default terms and sampler settings, i.e. exactly what ``bayes-latency fit TABLES`` does):
the tiny fleet for seeds 0-9, a table of one configuration and one of two (tiny seed 0), the
demo fleet (seed 0), and the real shared data (all of it; ``--cv`` adds every split of the
study's cross-validation). Per case: max R-hat, min bulk ESS (over the variables the fit gates
check), divergences, the posterior variables that fail (worst first) and the time.

    python benchmarks/convergence_matrix.py [--cases tiny,one,two,demo,real] [--cv]
        [--label TEXT] [--work /tmp/convergence_matrix] [--keep]

Writes ``results/benchmarks/convergence_matrix[_LABEL].md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bayes_latency.data.tables import load_observations  # noqa: E402
from bayes_latency.model.estimator import GATES, LatencyModel  # noqa: E402
from bayes_latency.model.inference.sampler import DEFAULT_MAX_DRAWS  # noqa: E402
from benchmarks._provenance import code_provenance  # noqa: E402


def tables(work: Path, fleet: str, seed: int) -> Path:
    """Simulate and ingest a fleet once (cached in ``work``)."""
    out = work / f"{fleet}_{seed}"
    t = out / "tables"
    if not (t / "observations.parquet").exists():
        cli = [sys.executable, "-m", "bayes_latency.cli.main"]
        subprocess.run(cli + ["simulate", "--fleet", fleet, "--seed", str(seed), "--out",
                              str(out / "fleet"), "--quiet"], check=True, cwd=ROOT,
                       stdout=subprocess.DEVNULL)
        exps = sorted(str(p) for p in (out / "fleet").iterdir() if p.is_dir())
        subprocess.run(cli + ["ingest", *exps, "--out", str(t)], check=True, cwd=ROOT,
                       stdout=subprocess.DEVNULL)
    return t


def requests(t: Path) -> pd.DataFrame | None:
    f = t / "requests.parquet"
    return pd.read_parquet(f) if f.exists() else None


def scrambled_tables(work: Path) -> Path:
    """Tiny fleet seed 0 with journey and step timestamps drawn at random (tests/scramble.py)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from scramble import scramble_experiment

    out = work / "tiny_0_scrambled"
    t = out / "tables"
    if not (t / "observations.parquet").exists():
        tables(work, "tiny", 0)
        exps = sorted(p for p in (work / "tiny_0" / "fleet").iterdir() if p.is_dir())
        dsts = [str(scramble_experiment(p, out / "fleet" / p.name, seed=i))
                for i, p in enumerate(exps)]
        subprocess.run([sys.executable, "-m", "bayes_latency.cli.main", "ingest", *dsts, "--out",
                        str(t)], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return t


def worst_variables(m: LatencyModel, k: int = 4) -> str:
    """The posterior variables with the worst R-hat / bulk ESS (all of them, not only gated)."""
    import arviz as az

    post = m._post()
    names = [v for v in post.data_vars if {"chain", "draw"} <= set(post[v].dims)
             and post[v].dtype.kind == "f"]
    with np.errstate(invalid="ignore", divide="ignore"):  # constant variables: R-hat NaN
        rhat, ess = az.rhat(post[names]), az.ess(post[names], method="bulk")
    rows = []
    for v in names:
        r, e = rhat[v], ess[v]
        if not np.isfinite(np.asarray(r)).any():  # constant (e.g. no effects with one level)
            continue
        i = int(np.nanargmax(np.asarray(r).ravel())) if r.size else 0
        idx = np.unravel_index(i, r.shape) if r.ndim else ()
        where = ",".join(str(r[d].values[j]) for d, j in zip(r.dims, idx, strict=True)
                         if d in r.coords)
        rows.append((float(np.nanmax(r)), float(np.nanmin(e)), f"{v}[{where}]"))
    rows.sort(key=lambda t: (-t[0], t[1]))
    return "; ".join(f"{n} {r:.3f}/{e:.0f}" for r, e, n in rows[:k])


def run_case(name: str, obs: pd.DataFrame, requests: pd.DataFrame | None = None,
             save: Path | None = None) -> dict:
    from bayes_latency.checks.adequacy import check_fit

    m = LatencyModel()
    t0 = time.perf_counter()
    m.fit(obs, max_draws=DEFAULT_MAX_DRAWS)  # what `bayes-latency fit` does
    dt = time.perf_counter() - t0
    load = os.getloadavg()[0]  # 1-minute load average at the end of the fit (2 cores)
    if save is not None:
        m.save(save / (name.replace(" ", "_").replace("/", "_").replace("|", "_")[:80] + ".nc"))
    c = m.convergence()
    adq, _, _ = check_fit(m, obs, requests)
    row = {"case": name, "configs": len(m.design.configs), "rows": len(m._rows),
           "max_rhat": round(c["max_rhat"], 4), "min_ess_bulk": round(c["min_ess_bulk"], 0),
           "divergences": c["divergences"], "passed": c["passed"], "seconds": round(dt, 1),
           "draws": int(m._post().sizes["draw"]),
           "stopped": (c.get("extension") or [{}])[-1].get("decision", ""),
           "target_accept": m._settings.get("target_accept"),
           "attempts": len({e.get("target_accept") for e in (c.get("extension") or [])}),
           "load": round(load, 1), "code": code_provenance(),
           "worst": worst_variables(m), "adequate": adq.passed,
           "adequacy_failures": adq.failures[:3]}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="tiny,one,two,scrambled,demo,real")
    ap.add_argument("--seeds", default="0-9")
    ap.add_argument("--cv", action="store_true", help="also every split of the real CV")
    ap.add_argument("--label", default="")
    ap.add_argument("--work", default="/tmp/convergence_matrix")
    ap.add_argument("--save", action="store_true", help="keep the posteriors in WORK/posteriors")
    ap.add_argument("--keep", action="store_true",
                    help="keep the rows of the cases not run this time from the current "
                         "convergence_matrix.json (their code field names the code they ran)")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    save = None
    if args.save:
        save = work / f"posteriors{('_' + args.label) if args.label else ''}"
        save.mkdir(exist_ok=True)
    cases = args.cases.split(",")
    a, _, b = args.seeds.partition("-")
    seeds = range(int(a), int(b or a) + 1)
    rows = []
    if "tiny" in cases:
        for s in seeds:
            t = tables(work, "tiny", s)
            rows.append(run_case(f"tiny seed {s}", load_observations(t), requests(t), save))
    if "one" in cases or "two" in cases:
        t = tables(work, "tiny", 0)
        obs = load_observations(t)
        cfgs = sorted(obs["config_id"].unique())
        if "one" in cases:
            rows.append(run_case(f"one config ({cfgs[0]})", obs[obs["config_id"] == cfgs[0]],
                                 requests(t), save))
        if "two" in cases:
            rows.append(run_case(f"two configs ({cfgs[0]}, {cfgs[2]})",
                                 obs[obs["config_id"].isin([cfgs[0], cfgs[2]])], requests(t), save))
    if "scrambled" in cases:
        t = scrambled_tables(work)
        rows.append(run_case("tiny seed 0, timestamps randomised", load_observations(t),
                             requests(t), save))
    if "demo" in cases:
        t = tables(work, "demo", 0)
        rows.append(run_case("demo seed 0", load_observations(t), requests(t), save))
    if "real" in cases:
        from bayes_latency.study.real import define_splits, load_real_data, real_data_dir

        d = real_data_dir()
        if d is None:
            print("real data not found: skipped")
        else:
            data = load_real_data(d)
            rows.append(run_case("real, all data", data.observations, None, save))
            if args.cv:
                for sp in define_splits(data.observations):
                    o = data.observations
                    rows.append(run_case(f"real CV: without {sp.name}",
                                         o[~o["experiment_id"].isin(sp.held_out)], None, save))
    out = ROOT / "results" / "benchmarks" / "convergence_matrix"  # one current file (label: title)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.keep and out.with_suffix(".json").exists():
        new = {r["case"]: r for r in rows}
        old = json.loads(out.with_suffix(".json").read_text())
        rows = [new.pop(r["case"], r) for r in old] + list(new.values())
    df = pd.DataFrame(rows)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = [f"# Convergence of `bayes-latency fit` with no flags{' (' + args.label + ')' if args.label else ''}",
             "", f"Gates: max R-hat <= {GATES['max_rhat']}, min bulk ESS >= "
             f"{GATES['min_ess_bulk']:.0f}, divergences <= {GATES['max_divergences']}. "
             "`worst`: posterior variables with the worst R-hat / bulk ESS (all variables).", "",
             "`s`: wall time of the fit; `load`: 1-minute load average when it ended (2 cores).", "",
             "`draws`: draws per chain kept; `stopped`: why sampling stopped (`pass`: the gates "
             "passed at that checkpoint; `max_draws`: the cap, "
             f"{DEFAULT_MAX_DRAWS}; otherwise the reason more draws would not help).", "",
             "`target_accept`: of the draws kept (0.995: the first attempt at 0.99 stopped on "
             "divergences and the fit sampled again, `sampler.RETRY_TARGET_ACCEPT`).", "",
             "| case | configs | rows | max R-hat | min bulk ESS | divergences | passed | draws "
             "| stopped | target_accept | s | load | worst | adequate |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['configs']} | {r['rows']:,} | {r['max_rhat']:.4f} | "
                     f"{r['min_ess_bulk']:.0f} | {r['divergences']} | "
                     f"{'yes' if r['passed'] else 'NO'} | {r.get('draws', '')} | "
                     f"{r.get('stopped', '')} | {r.get('target_accept', '')} | {r['seconds']} | "
                     f"{r.get('load', '')} | "
                     f"{r['worst']} | "
                     f"{'yes' if r['adequate'] else 'NO: ' + '; '.join(r['adequacy_failures'])} |")
    lines += ["", f"{int(df['passed'].sum())} of {len(df)} pass. Code: "
              f"{'; '.join(sorted(set(r.get('code', '?') for r in rows)))}."]
    if not args.cv:
        lines += ["", "The real study's cross-validation splits (`--cv`) are the fits of "
                  "`benchmarks/heldout_real.py`, which reports their gates with the held-out "
                  "bands (`heldout_real.md`)."]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
