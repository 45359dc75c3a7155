"""Time the synthetic fleet generator: ``python benchmarks/simulate_speed.py [--fleet demo]``.

Runs :func:`bayes_latency.synth.fleet.simulate_fleet` into a temporary folder and prints the total
time, the engine steps and requests written, and steps per second (target for ``demo``: >= 100k
steps in <= 60 s on 2 cores).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import yaml

# this checkout's package, also when the installed one is another worktree's
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bayes_latency.synth.fleet import simulate_fleet


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print one summary line per measure."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fleet", default="demo")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--progress", action="store_true")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / args.fleet
        t0 = time.perf_counter()
        cpu0 = time.process_time()
        folders = simulate_fleet(args.fleet, out, seed=args.seed, progress=args.progress)
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        totals = yaml.safe_load((out / "truth.yaml").read_text())["totals"]
        size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    steps, reqs = totals["steps"], totals["requests"]
    print(f"fleet            {args.fleet}")
    print(f"experiments      {len(folders)} ({totals['configurations']} configurations)")
    print(f"steps            {steps:,}")
    print(f"requests         {reqs:,}")
    print(f"output           {size / 2**20:.1f} MiB")
    print(f"total time       {wall:.2f} s wall, {cpu:.2f} s CPU")
    print(f"steps/s          {steps / wall:,.0f} (wall), {steps / cpu:,.0f} (CPU)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
