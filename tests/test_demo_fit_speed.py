"""The demo-fit speed benchmark's report (no fit: the sections are built from stored runs)."""

from __future__ import annotations

from benchmark_module import load_benchmark


def _bench():
    return load_benchmark("demo_fit_speed")


def _run(seed: int, wall: float, **extra: object) -> dict:
    return {"seed": seed, "wall_s": wall, "max_rhat": 1.004, "min_ess_bulk": 700.0,
            "divergences": 0, "passed": True, "mean_leapfrog_steps": 145.0, "configs": 12,
            "rows": 80400, "timings": {"summaries_s": 0.5, "compile_s": 10.0, "sampling_s": 30.0,
                                       "arviz_groups_s": 3.0}, **extra}


def test_report_has_cpu_load_groups_and_ess_per_second():
    bench = _bench()
    args = {"cold": True, "tune": 500, "draws": 4000, "target_accept": 0.99}
    sec = {"command": "python benchmarks/demo_fit_speed.py --cold", "cpus": 2, "python": "3.12",
           "args": args,
           "runs": [_run(0, 50.0, cpu_s=70.0, load_before=1.0, load_after=2.5,
                         timings={"summaries_s": 0.5, "compile_s": 10.0, "sampling_s": 30.0,
                                  "arviz_groups_s": 3.0, "compile_cpu_s": 9.0,
                                  "sampling_cpu_s": 49.0}),
                    _run(1, 65.0)]}  # an older run without CPU time still renders
    text = bench.report({"cold": sec})
    assert "## Cold caches" in text and "## Warm caches" not in text
    # idle estimate: 70 CPU s less half of the 40 CPU s of the two sampling threads
    assert ("| 0 | 50.0 | 70.0 | 50.0 | 1.0-2.5 | 0.5 | 10.0 (9.0) | 20.0 (40.0) | 3.0 | 1.0040 "
            "| 700 | 35 | 0 |") in text
    assert "| 1 | 65.0 | n/a | n/a | n/a | 0.5 | 10.0 | 20.0 | 3.0 |" in text
    assert "idle-machine estimate: median 50.0 s, max 50.0 s" in text
    assert "2 of 2 runs pass the gates; 1 pass within 60 s of wall time." in text
