"""The fit's sampler defaults agree between the estimator and the CLI (issue 15 retune)."""

from __future__ import annotations

import inspect

from bayes_latency.cli import build_parser
from bayes_latency.model.estimator import LatencyModel
from bayes_latency.model.sampler import DEFAULT_DRAWS, TARGET_ACCEPT


def test_cli_fit_defaults_match_the_estimator():
    args = build_parser().parse_args(["fit", "tables", "--out", "p.nc"])
    sig = inspect.signature(LatencyModel.fit)
    assert args.draws == DEFAULT_DRAWS == sig.parameters["draws"].default == 2000
    assert args.target_accept == TARGET_ACCEPT == sig.parameters["target_accept"].default == 0.99
    assert args.tune == sig.parameters["tune"].default
    assert args.chains == sig.parameters["chains"].default
