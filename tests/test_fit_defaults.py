"""The fit's sampler defaults agree between the estimator and the CLI."""

from __future__ import annotations

import inspect

from bayes_latency.cli.main import build_parser
from bayes_latency.model.estimator import LatencyModel
from bayes_latency.model.inference.sampler import DEFAULT_DRAWS, DEFAULT_TUNE, TARGET_ACCEPT


def test_cli_fit_defaults_match_the_estimator():
    args = build_parser().parse_args(["fit", "tables", "--out", "p.nc"])
    sig = inspect.signature(LatencyModel.fit)
    assert args.draws == DEFAULT_DRAWS == sig.parameters["draws"].default == 2000
    assert args.target_accept == TARGET_ACCEPT == sig.parameters["target_accept"].default == 0.99
    assert args.tune == sig.parameters["tune"].default == DEFAULT_TUNE == 1000
    assert args.chains == sig.parameters["chains"].default


def test_cli_extends_sampling_by_default():
    from bayes_latency.cli.fit import _max_draws
    from bayes_latency.model.inference.sampler import DEFAULT_MAX_DRAWS, checkpoints

    args = build_parser().parse_args(["fit", "tables", "--out", "p.nc"])
    assert _max_draws(args) == DEFAULT_MAX_DRAWS == 6 * DEFAULT_DRAWS == 12000
    assert _max_draws(build_parser().parse_args(["fit", "t", "--out", "p", "--draws", "20"])) == 120
    assert _max_draws(build_parser().parse_args(["fit", "t", "--out", "p",
                                                 "--max-draws", "0"])) is None
    # the estimator samples on by default too, as far as the CLI
    assert inspect.signature(LatencyModel.fit).parameters["max_draws"].default == "auto"
    assert checkpoints(2000, 8000) == [2000, 3000, 4000, 5000, 6000, 7000, 8000]
    assert checkpoints(100, 120) == [100, 120]
