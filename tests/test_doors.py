"""One behaviour through both doors: ``bayes_latency.fit`` and ``bayes-latency fit`` run the same
gated fit; progress is honest and quiet; ``predict`` has one return type; exports say what is
unseen; every option of ``fit``, ``check`` and ``export`` has help text."""

from __future__ import annotations

import inspect
import json
import warnings

import numpy as np
import pandas as pd
import pytest
from obs_factory import make_observations

import bayes_latency
from bayes_latency.checks import gated
from bayes_latency.cli.main import build_parser, main
from bayes_latency.model.estimator import LatencyModel
from bayes_latency.model.inference.sampler import (
    DEFAULT_MAX_DRAWS,
    MAX_DRAWS_FACTOR,
    Until,
    progress_mode,
    resolve_max_draws,
    sample,
)

CONFIGS = [("llama-2-7b", "H100", 1), ("llama-2-7b", "A100", 1), ("mixtral-8x7b", "H100", 2)]


@pytest.fixture(scope="module")
def obs():
    o, _ = make_observations(CONFIGS, n_iter=60, n_win=40, n_alpha=20, seed=2)
    return o


# ----------------------------------------------------------------------- one behaviour, two doors
def test_both_doors_run_the_same_gate(obs, tmp_path, monkeypatch, capsys):
    calls: list[str] = []
    real = gated.gate

    def spy(model, observations, requests=None, **kw):
        calls.append(type(model).__name__)
        return real(model, observations, requests, **kw)

    monkeypatch.setattr(gated, "gate", spy)
    # the notebook door
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", bayes_latency.errors.GateWarning)
        m, report = bayes_latency.fit(obs, model=LatencyModel(sampler="laplace"), draws=50,
                                      prior_draws=0, progress=False)
    assert calls == ["LatencyModel"] and isinstance(report, gated.GateReport)
    assert m.result is not None and isinstance(report.passed, bool)
    assert "max R-hat" in report.format() and "adequacy gate" in report.format()
    # the CLI door
    obs.to_parquet(tmp_path / "observations.parquet")
    rc = main(["fit", str(tmp_path), "--out", str(tmp_path / "p.nc"), "--sampler", "laplace",
               "--draws", "50"])
    assert calls == ["LatencyModel", "LatencyModel"]
    assert rc == (0 if report.passed else 1) and (tmp_path / "p.nc").is_file()
    out = capsys.readouterr().out
    assert "max R-hat" in out and "adequacy gate" in out


def test_gated_fit_raises_or_warns_on_a_failed_gate(obs, monkeypatch):
    conv = {"passed": False, "failures": ["max R-hat 1.2000 > 1.01"], "hints": [],
            "max_rhat": 1.2, "min_ess_bulk": 10.0, "divergences": 0, "approximate": False}
    adq = gated.AdequacyReport(passed=True, failures=[], table=pd.DataFrame({"level": []}))
    monkeypatch.setattr(gated, "gate", lambda *a, **k: gated.GateReport(conv, adq))
    model = LatencyModel(sampler="laplace")
    with pytest.warns(bayes_latency.errors.GateWarning, match="R-hat"):
        bayes_latency.fit(obs, model=model, draws=20, prior_draws=0, progress=False)
    with pytest.raises(bayes_latency.ConvergenceError, match="R-hat"):
        bayes_latency.fit(obs, model=LatencyModel(sampler="laplace"), draws=20, prior_draws=0,
                          progress=False, on_failure="raise")
    bad = gated.GateReport({**conv, "passed": True, "failures": []},
                           gated.AdequacyReport(False, ["x / iteration: LOO-PIT"], adq.table))
    with pytest.raises(bayes_latency.AdequacyError, match="LOO-PIT"):
        bad.raise_if_failed()


def test_the_estimator_samples_on_by_default_as_the_cli():
    from bayes_latency.cli.fit import _max_draws

    assert inspect.signature(LatencyModel.fit).parameters["max_draws"].default == "auto"
    assert resolve_max_draws("auto", 2000) == DEFAULT_MAX_DRAWS == MAX_DRAWS_FACTOR * 2000
    assert resolve_max_draws(None, 2000) is None and resolve_max_draws(0, 2000) is None
    args = build_parser().parse_args(["fit", "t", "--out", "p.nc", "--draws", "30"])
    assert _max_draws(args) == resolve_max_draws("auto", 30)
    assert "bayes_latency.fit" in LatencyModel.fit.__doc__


# ----------------------------------------------------------------------- progress
@pytest.fixture(scope="module")
def toy():
    pm = pytest.importorskip("pymc")
    pytest.importorskip("nutpie")
    with pm.Model() as m:
        mu = pm.Normal("mu", 0.0, 1.0)
        pm.Normal("y", mu, 1.0, observed=np.array([0.3, -0.2, 0.5]))
    return m


def test_progress_off_a_terminal_is_one_line_per_checkpoint(toy, capsys):
    assert progress_mode(True) == "lines"  # capsys: stderr is not a terminal
    assert progress_mode(False) == "none" and progress_mode("bar") == "bar"
    calls = iter(["continue", "pass"])
    dt = sample(toy, "nutpie", draws=100, tune=50, chains=2, seed=1, progress=True,
                target_accept=0.9, adaptation="diag", timings={},
                until=Until(400, lambda post, div: next(calls)))
    assert dt["posterior"].sizes["draw"] == 150
    err = capsys.readouterr().err.splitlines()
    lines = [ln for ln in err if ln.startswith("sampling: ")]
    assert lines[0] == ("sampling: 2 chains, 50 tuning steps then 100 draws each (up to 400 "
                        "while the convergence gates fail)")
    assert any(ln.startswith("sampling: tuning done (50 steps per chain)") for ln in lines)
    assert any(ln.startswith("sampling: 100 draws per chain") and "on to 150" in ln
               for ln in lines)
    assert any(ln.startswith("sampling: 150 draws per chain") and "gates pass" in ln
               for ln in lines)
    assert lines[-1].startswith("sampling: done, 150 draws per chain in ")


def test_a_plain_run_off_a_terminal_says_when_it_is_done(toy, capsys):
    timings: dict = {}
    sample(toy, "nutpie", draws=60, tune=30, chains=2, seed=1, progress="lines",
           target_accept=0.9, adaptation="diag", timings=timings)
    err = capsys.readouterr().err
    assert "sampling: done, 60 draws per chain" in err and "extension" not in timings


def test_no_pymc_sampling_line_on_stderr(obs, capfd):
    LatencyModel(sampler="laplace").fit(obs, draws=20, prior_draws=20, progress=False)
    err = capfd.readouterr().err
    assert "Sampling:" not in err


# ----------------------------------------------------------------------- exports
def test_export_notes_say_what_is_unseen(tiny_posterior, tmp_path, capsys):
    _, post = tiny_posterior
    out = tmp_path / "e.json"
    assert main(["export", str(post), "--model", "llama-3.1-8b", "--gpu", "H200", "--tp", "2",
                 "--out", str(out)]) == 0
    notes = json.loads(out.read_text())["notes"]
    assert any(n.startswith("unseen configuration") for n in notes)
    unseen = next(n for n in notes if n.startswith("unseen levels"))
    assert "model llama-3.1-8b" in unseen and "GPU H200" in unseen and "sigma_model" in unseen
    assert "TP" not in unseen  # the tiny fleet has TP 1 and 2
    assert any(n.startswith("seen levels") and "TP 2" in n for n in notes)
    printed = capsys.readouterr().out
    assert "note: unseen configuration" in printed
    # a seen configuration has no such note
    seen = tmp_path / "s.yaml"
    assert main(["export", str(post), "--model", "llama-2-7b", "--gpu", "H100", "--tp", "1",
                 "--format", "blis", "--out", str(seen)]) == 0
    assert "unseen" not in seen.read_text()


def test_export_tp_required_when_the_weights_need_more_than_one_gpu(tiny_posterior, tmp_path,
                                                                   capsys):
    _, post = tiny_posterior
    assert main(["export", str(post), "--model", "llama-2-70b", "--gpu", "H100",
                 "--out", str(tmp_path / "a.json")]) == 2
    assert "--tp is required" in capsys.readouterr().err
    assert not (tmp_path / "a.json").exists()
    assert main(["export", str(post), "--model", "llama-2-7b", "--gpu", "H100",
                 "--out", str(tmp_path / "b.json")]) == 0
    assert "--tp not given: TP 1" in capsys.readouterr().out
    assert json.loads((tmp_path / "b.json").read_text())["configuration"]["tp"] == 1


# ----------------------------------------------------------------------- help texts
@pytest.mark.parametrize("command", ["fit", "check", "export"])
def test_every_option_has_help(command, capsys):
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for action in sub.choices[command]._actions:
        if action.dest == "help":
            continue
        assert action.help, f"{command} {action.option_strings or action.dest}: no help text"
    with pytest.raises(SystemExit):
        parser.parse_args([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    if command in ("check", "export"):
        assert "priors/default.yaml" not in text
        assert "default: the priors embedded in the posterior file" in text
