"""What one BLIS simulation yields: per-request records, pooled statistics, errors and bands.

:func:`parse_metrics` reads one BLIS invocation's ``--metrics-path`` JSON into a
:class:`StageResult`; :func:`pool_stages` pools the stages of a run into its :class:`SimStats`
(means, p90s, decode interval); :func:`rel_err` and :func:`band` compare simulated with real
numbers. Part of the BLIS end-to-end study (:mod:`bayes_latency.study.blis.e2e`, which
re-exports these names).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bayes_latency.study.blis.spec import BlisSetupError


@dataclass
class StageResult:
    """Per-request results of one BLIS invocation (completed requests; seconds, tokens)."""

    ttft_s: np.ndarray
    e2e_s: np.ndarray
    output_tokens: np.ndarray
    injected: int
    completed: int
    timed_out: int
    unfinished: int
    seconds: float = math.nan
    cpu_seconds: float = math.nan


def parse_metrics(path: str | Path) -> StageResult:
    """Read BLIS's ``--metrics-path`` JSON (``requests`` records in ms): completed requests.

    Requests that hit the deadline are listed with ``e2e_ms == 0``; they are left out, as the
    real client's statistics cover successes only.

    Raises
    ------
    BlisSetupError
        When the file is missing, not JSON, or has no ``requests`` list.
    """
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError) as exc:
        raise BlisSetupError(f"BLIS metrics {path}: {exc}") from exc
    reqs = doc.get("requests") if isinstance(doc, dict) else None
    if not isinstance(reqs, list):
        raise BlisSetupError(f"BLIS metrics {path}: no requests list")
    try:
        ttft = np.array([r["ttft_ms"] for r in reqs], dtype=float) / 1e3
        e2e = np.array([r["e2e_ms"] for r in reqs], dtype=float) / 1e3
        out = np.array([r.get("num_decode_tokens", 0) for r in reqs], dtype=float)
    except (KeyError, TypeError, ValueError) as exc:
        raise BlisSetupError(f"BLIS metrics {path}: bad request record ({exc})") from exc
    done = e2e > 0  # timed-out requests are listed with e2e_ms = 0 (and their TTFT, if any)
    return StageResult(ttft_s=ttft[done], e2e_s=e2e[done], output_tokens=out[done],
                       injected=int(doc.get("injected_requests", len(reqs))),
                       completed=int(doc.get("completed_requests", len(reqs))),
                       timed_out=int(doc.get("timed_out_requests", 0)),
                       unfinished=int(doc.get("still_queued", 0)) + int(doc.get("still_running", 0)))


@dataclass
class SimStats:
    """A run's simulated statistics, pooled over its stages (seconds, tokens)."""

    e2e_mean: float
    e2e_p90: float
    ttft_mean: float
    ttft_p90: float
    decode_interval: float
    output_len_mean: float
    completed: int
    injected: int
    timed_out: int
    unfinished: int
    seconds: float
    cpu_seconds: float = math.nan


def _p90(x: np.ndarray) -> float:
    return float(np.percentile(x, 90)) if x.size else math.nan


def pool_stages(stages: Sequence[StageResult], real_output_len_mean: float) -> SimStats:
    """Pool the per-request results of a run's stages, as the client's summary does.

    The mean decode interval is ``(mean E2E - mean TTFT) / (L - 1)`` with ``L`` the REAL mean
    output length (the same denominator on both sides).
    """
    ttft = np.concatenate([s.ttft_s for s in stages])
    e2e = np.concatenate([s.e2e_s for s in stages])
    out = np.concatenate([s.output_tokens for s in stages])
    e_m = float(e2e.mean()) if e2e.size else math.nan
    t_m = float(ttft.mean()) if ttft.size else math.nan
    di = (e_m - t_m) / (real_output_len_mean - 1.0) if real_output_len_mean > 1 else math.nan
    return SimStats(e2e_mean=e_m, e2e_p90=_p90(e2e), ttft_mean=t_m, ttft_p90=_p90(ttft),
                    decode_interval=di,
                    output_len_mean=float(out.mean()) if out.size else math.nan,
                    completed=sum(s.completed for s in stages),
                    injected=sum(s.injected for s in stages),
                    timed_out=sum(s.timed_out for s in stages),
                    unfinished=sum(s.unfinished for s in stages),
                    seconds=float(sum(s.seconds for s in stages)),
                    cpu_seconds=float(sum(s.cpu_seconds for s in stages)))


def rel_err(sim: float, real: float) -> float:
    """Signed relative error ``sim / real - 1`` (NaN when ``real`` is not positive)."""
    if not (real > 0) or not math.isfinite(sim):
        return math.nan
    return sim / real - 1.0


def band(values: Sequence[float], real: float, prob: float = 0.9) -> dict[str, float]:
    """``prob`` prediction band of a new run's mean from simulated means over posterior draws,
    and whether ``real`` is in.

    The band is the order-statistic (distribution-free) prediction interval
    ``[v_(k), v_(n+1-k)]`` of the ``n`` sorted values with ``k = floor((n + 1)(1 - prob) / 2)``
    (at least 1): a further value exchangeable with them falls inside with probability
    ``(n + 1 - 2k) / (n + 1)``, returned as ``nominal`` (20 draws, ``prob`` 0.9: the smallest
    and largest, 90.5%). The interpolated 5% and 95% quantiles of 20 values, used before,
    estimate the draws' distribution, not where a new value falls: about the 2nd smallest and
    2nd largest, an interval a new value falls into with probability 17/21 = 81%.

    Returns ``lo``, ``hi``, ``inside`` (1.0 / 0.0), ``width`` = ``(hi - lo) / ((hi + lo) / 2)``
    (relative full width) and ``nominal``.
    """
    v = np.sort(np.asarray([x for x in values if math.isfinite(x)], dtype=float))
    n = v.size
    if n < 2:
        return {"lo": math.nan, "hi": math.nan, "inside": math.nan, "width": math.nan,
                "nominal": math.nan}
    k = max(1, int(math.floor((n + 1) * (1.0 - prob) / 2.0 + 1e-9)))
    lo, hi = float(v[k - 1]), float(v[n - k])
    return {"lo": lo, "hi": hi, "inside": float(lo <= real <= hi),
            "width": float((hi - lo) / ((hi + lo) / 2)), "nominal": (n + 1 - 2 * k) / (n + 1)}
