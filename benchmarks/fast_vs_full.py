"""Fast path (per-configuration summaries under the hierarchy) vs full-data NUTS, in one run.

Usage::

    python benchmarks/fast_vs_full.py [--fleet small] [--draws 1000] [--obs PATH]

Fits the same observation table twice, times both, prints the speed ratio and how far apart the
posteriors are: for every (configuration, coefficient) the difference of posterior means in units
of the full-data posterior sd. The claim checked: |difference| < 0.1 sd (most elements).
By default it simulates and ingests the synthetic ``small`` fleet; ``--obs`` takes an existing
observation table instead.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from bayes_latency.model.estimator import LatencyModel


def observations_for(fleet: str, seed: int) -> pd.DataFrame:
    from bayes_latency.data.experiment import ingest, load_tables
    from bayes_latency.synth.fleet import simulate_fleet

    tmp = Path(tempfile.mkdtemp(prefix="bl-bench-"))
    folders = simulate_fleet(fleet, tmp / "fleet", seed=seed, progress=False)
    ingest(folders, tmp / "tables")
    return load_tables(tmp / "tables")["observations"]


def compare(obs: pd.DataFrame, draws: int, tune: int, seed: int) -> dict:
    fast = LatencyModel(method="laplace-hierarchy")
    t0 = time.perf_counter()
    fast.fit(obs, draws=draws, tune=tune, seed=seed)
    t_fast = time.perf_counter() - t0
    full = LatencyModel(method="full")
    t0 = time.perf_counter()
    full.fit(obs, draws=draws, tune=tune, seed=seed)
    t_full = time.perf_counter() - t0
    out = {"rows": len(fast._rows), "configs": len(fast.design.configs),
           "fast_s": t_fast, "full_s": t_full, "ratio": t_full / t_fast,
           "fast_conv": fast.convergence(), "full_conv": full.convergence()}
    z = []
    for var in ("beta", "alpha"):
        a = fast.result["posterior"][var]
        b = full.result["posterior"][var]
        ma, mb = a.mean(("chain", "draw")), b.mean(("chain", "draw"))
        sd = b.std(("chain", "draw"))
        z.append(((ma - mb) / sd).values.ravel())
    z = np.concatenate(z)
    z = z[np.isfinite(z)]
    out.update({"n_elements": z.size, "max_abs_z": float(np.max(np.abs(z))),
                "median_abs_z": float(np.median(np.abs(z))),
                "share_within_0.1sd": float(np.mean(np.abs(z) < 0.1)),
                "share_within_0.2sd": float(np.mean(np.abs(z) < 0.2))})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fleet", default="small")
    ap.add_argument("--obs", help="observation table (Parquet) instead of simulating")
    ap.add_argument("--draws", type=int, default=1000)
    ap.add_argument("--tune", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    obs = pd.read_parquet(a.obs) if a.obs else observations_for(a.fleet, a.seed)
    r = compare(obs, a.draws, a.tune, a.seed)
    print(f"rows fitted: {r['rows']:,} over {r['configs']} configurations")
    print(f"fast (laplace-hierarchy): {r['fast_s']:.1f} s  R-hat {r['fast_conv']['max_rhat']:.3f} "
          f"ESS {r['fast_conv']['min_ess_bulk']:.0f} div {r['fast_conv']['divergences']}")
    print(f"full-data NUTS:           {r['full_s']:.1f} s  R-hat {r['full_conv']['max_rhat']:.3f} "
          f"ESS {r['full_conv']['min_ess_bulk']:.0f} div {r['full_conv']['divergences']}")
    print(f"speed-up: {r['ratio']:.1f}x")
    print(f"posterior means, |fast - full| / sd_full over {r['n_elements']} (config, coefficient) "
          f"elements: median {r['median_abs_z']:.3f}, max {r['max_abs_z']:.3f}, "
          f"share < 0.1 sd {r['share_within_0.1sd']:.1%}, < 0.2 sd {r['share_within_0.2sd']:.1%}")


if __name__ == "__main__":
    main()
