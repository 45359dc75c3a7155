"""Fuzz the commands: mutated traces, configs, lifecycle files, priors, tables and posteriors.

From one small synthetic base (the smallest experiment of ``simulate --fleet tiny --seed 5`` and a
Laplace fit of the tiny fleet, ``conftest.py``) a seeded list of mutation functions makes damaged
inputs (the trace, config and lifecycle mutations are in ``fuzz_cases.py``); each is run
through ``bayes_latency.cli.main.main`` in-process. Every run must end in

- exit 0 with books that add up (``read = kept + dropped`` per record type), every numeric column
  of every written Parquet table finite and within its domain, and (for inputs known to be
  invalid) the damage counted in ``ingest_report.json``; or
- exit 2 with one line naming the file (or the option) at fault; or
- exit 1 from ``check`` (a failed gate or a finding);

never an uncaught exception, and no input file may change (hashed before and after). ``fit`` is
fuzzed on its validation only: sampling is replaced by a sentinel, so a damaged table that would
reach the sampler counts as a wrong result accepted.

The counts are printed (``pytest -s``): runs, clean errors, counted drops, tracebacks, silent
losses, wrong results accepted.
"""

from __future__ import annotations

import json
import random
import shutil
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from fuzz_cases import config_cases as _config_cases
from fuzz_cases import trace_cases as _trace_cases
from mutate import Sampled as _Sampled
from mutate import (
    copy_exp,
    tree_hash,
)
from mutate import one_line_error as _one_line

from bayes_latency.cli.main import main
from bayes_latency.data.experiment import load_tables as _load_tables
from bayes_latency.data.tables import read_table as _read_table

SEED = 16
ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PRIORS = ROOT / "priors" / "default.yaml"
#: numeric columns allowed to be negative (inference-perf's schedule delay is send - planned)
SIGNED = {"schedule_delay_mean_s"}
#: ``kept`` counters that flag records (beside the table counters)
FLAGS = ("incomplete_request", "aborted_request", "ts_backwards", "damaged_request",
         "unknown_finish_status", "lone_surrogate_repaired", "inconsistent_request:max_tokens_0",
         "core_without_api", "api_only_span")

STATS: Counter = Counter()


# ---------------------------------------------------------------------------------------------
# Checks of one run
# ---------------------------------------------------------------------------------------------
def _table_domain(folder: Path) -> list[str]:
    """Numeric values of written tables outside their domain (non-finite, or negative)."""
    bad = []
    for name, df in (_load_tables(folder) if any(folder.iterdir()) else {}).items():
        for c in df.columns:
            s = df[c]
            if pd.api.types.is_bool_dtype(s) or not pd.api.types.is_numeric_dtype(s):
                continue
            v = s.to_numpy(dtype=float, na_value=np.nan)
            v = v[~np.isnan(v)]
            if np.isinf(v).any() or (c not in SIGNED and (v < 0).any()):
                bad.append(f"{name}:{c}")
    return bad


def _invoke(argv: list, capsys) -> tuple[int | None, str, str]:
    capsys.readouterr()
    try:
        rc = main([str(a) for a in argv])
    except _Sampled:
        rc = None
    except SystemExit as e:  # argparse rejecting an option: a clean usage error
        rc = int(e.code or 0)
    except BaseException:  # noqa: BLE001 - the point of the suite
        STATS["tracebacks"] += 1
        out, err = capsys.readouterr()
        return -1, out, traceback.format_exc()
    out, err = capsys.readouterr()
    return rc, out, err


def _all_finite(doc: object) -> bool:
    if isinstance(doc, dict):
        return all(_all_finite(v) for v in doc.values())
    if isinstance(doc, list):
        return all(_all_finite(v) for v in doc)
    if isinstance(doc, str):
        return doc.strip().lower() not in ("nan", "inf", "-inf", "infinity", "-infinity")
    return not isinstance(doc, float) or bool(np.isfinite(doc))


# ---------------------------------------------------------------------------------------------
# The suites
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def base_ingest(tiny_fleet_seed5, tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzzbase")
    exp = copy_exp(tiny_fleet_seed5, root)
    out = root / "out"
    assert main(["ingest", str(exp), "--out", str(out)]) == 0
    rep = json.loads((out / "ingest_report.json").read_text())["total"]
    tabs = _load_tables(out)
    return rep, tabs


def test_fuzz_ingest(tiny_fleet_seed5, base_ingest, tmp_path, capsys):
    base_rep, base_tabs = base_ingest
    rng = random.Random(SEED)
    problems: list[str] = []
    cases = _trace_cases() + _config_cases()
    for k, (name, mutate, expect) in enumerate(cases):
        work = tmp_path / f"c{k:03d}"
        exp = copy_exp(tiny_fleet_seed5, work)
        mutate(exp, rng)
        before = tree_hash(exp)
        out = work / "out"
        rc, _, err = _invoke(["ingest", exp, "--out", out], capsys)
        STATS["runs"] += 1
        if tree_hash(exp) != before:
            problems.append(f"{name}: input changed")
        if rc == 2:
            STATS["clean_errors"] += 1
            msg = _one_line(err, (exp.name, "traces.jsonl", "serving.yaml", "config.json"))
            if msg:
                problems.append(f"{name}: {msg}")
            continue
        if rc != 0:
            problems.append(f"{name}: exit {rc}: {err[-2000:]}")
            continue
        rep = json.loads((out / "ingest_report.json").read_text())["total"]
        from bayes_latency.data.report import IngestReport

        for kind, (r, kk) in IngestReport.BALANCES.items():
            if rep["read"].get(r, 0) != rep["kept"].get(kk, 0) + rep.get(
                    "dropped_by_record", {}).get(kind, 0):
                STATS["silent_losses"] += 1
                problems.append(f"{name}: {kind} books do not add up: {rep}")
        dom = _table_domain(out)
        if dom:
            STATS["wrong_accepted"] += 1
            problems.append(f"{name}: out-of-domain values in {dom}")
        n_drop = sum(rep["dropped"].values())
        STATS["counted_drops"] += n_drop
        STATS["runs_with_drops"] += bool(n_drop)
        flagged = {f: rep["kept"].get(f, 0) for f in FLAGS}
        signal = n_drop > 0 or flagged != {f: base_rep["kept"].get(f, 0) for f in FLAGS} \
            or len(rep["notes"]) != len(base_rep["notes"])
        if expect == "signal" and not signal:
            STATS["wrong_accepted"] += 1
            problems.append(f"{name}: damaged input accepted without a count or note")
        if expect == "same":
            for t, df in base_tabs.items():
                other = _read_table(out, t)
                if not df.equals(other):
                    problems.append(f"{name}: table {t} differs from the base")
        # lost rows must be accounted for: fewer requests / steps only with counted drops
        for t in ("requests", "steps"):
            n_t = len(_read_table(out, t))
            if n_t < len(base_tabs[t]) and not n_drop and expect != "same":
                if not any(rep["kept"].get(f, 0) for f in FLAGS):
                    STATS["silent_losses"] += 1
                    problems.append(f"{name}: {t} lost rows without a count")
    print(f"\nfuzz ingest: {dict(STATS)}")
    assert not problems, "\n".join(problems[:20])


def _obs_cases() -> list[tuple[str, Callable]]:
    def col(c: str, v: object) -> Callable:
        def fn(df: pd.DataFrame, rng: random.Random) -> pd.DataFrame:
            df = df.copy()
            if c not in df:
                return df
            if isinstance(v, str) and c != "kind":
                df[c] = df[c].astype(str)  # a text column where numbers belong
            df.loc[rng.randrange(len(df)), c] = v
            return df
        return fn

    cases = [(f"obs_{c}_{v}", col(c, v)) for c, v in [
        ("value_us", np.nan), ("value_us", -1.0), ("value_us", np.inf), ("value_us", "fast"),
        ("x_per_step", -3.0), ("x_weight_loading", np.inf), ("x_alpha_per_token", -100.0),
        ("tp", 0), ("x_decode_kv", np.nan)]]
    cases += [
        ("obs_no_value", lambda df, r: df.drop(columns="value_us")),
        ("obs_no_kind", lambda df, r: df.drop(columns="kind")),
        ("obs_no_features", lambda df, r: df[[c for c in df.columns
                                              if not c.startswith("x_")]]),
        ("obs_empty", lambda df, r: df.iloc[:0]),
        ("obs_strings", lambda df, r: df.astype(str)),
    ]
    return cases


def test_fuzz_fit_validation(tiny_posterior, tmp_path, capsys, monkeypatch):
    """fit on damaged tables, priors and arguments: exit 2 before sampling, inputs unchanged."""
    from bayes_latency.model import estimator

    def no_sampling(self, *a, **k):
        raise _Sampled()

    monkeypatch.setattr(estimator.LatencyModel, "fit", no_sampling)
    tables, post = tiny_posterior
    base = _read_table(tables, "observations")
    rng = random.Random(SEED + 1)
    problems: list[str] = []
    runs: list[tuple[str, list, Path, tuple[str, ...]]] = []
    for k, (name, fn) in enumerate(_obs_cases()):
        t = tmp_path / f"t{k:02d}"
        t.mkdir()
        fn(base, rng).to_parquet(t / "observations.parquet")
        runs.append((name, ["fit", t, "--out", tmp_path / f"p{k}.nc"], t,
                     ("observations.parquet",)))
    for k, content in enumerate([b"PAR1garbage", b"", b"\x00" * 100]):
        t = tmp_path / f"g{k}"
        t.mkdir()
        (t / "observations.parquet").write_bytes(content)
        runs.append((f"obs_bytes_{k}", ["fit", t, "--out", tmp_path / "g.nc"], t,
                     ("observations.parquet",)))
    good = tmp_path / "good"
    good.mkdir()
    base.to_parquet(good / "observations.parquet")
    pri = DEFAULT_PRIORS.read_text()
    for k, text in enumerate([pri.replace("sigma: 0.7", "sigma: -0.7", 1),
                              pri.replace("median: 2.0", "median: fast", 1),
                              pri.replace("schema_version: 1", "schema_version: 7"),
                              "{{{", "", "terms: 3\n",
                              pri.replace("dist: lognormal", "dist: cauchy", 1)]):
        f = tmp_path / f"priors{k}.yaml"
        f.write_text(text)
        runs.append((f"priors_{k}", ["fit", good, "--priors", f, "--out", tmp_path / "q.nc"],
                     f, (f.name,)))
    for k, extra in enumerate([["--draws", "0"], ["--draws", "-5"], ["--tune", "-1"],
                               ["--chains", "0"], ["--target-accept", "2"], ["--seed", "-1"],
                               ["--max-rhat", "0.5"], ["--terms", "bogus_term"]]):
        runs.append((f"args_{k}", ["fit", good, "--out", tmp_path / "r.nc", *extra], good,
                     (extra[0], "bogus_term")))
    a_file = tmp_path / "a_file"
    a_file.write_text("keep")
    for k, out in enumerate([good / "observations.parquet", good, a_file / "p.nc", tmp_path]):
        runs.append((f"out_{k}", ["fit", good, "--out", out], good, ("--out",)))
    for name, argv, inp, names in runs:
        before = tree_hash(inp, a_file)
        rc, _, err = _invoke(argv, capsys)
        STATS["runs"] += 1
        if tree_hash(inp, a_file) != before:
            problems.append(f"{name}: input changed")
        if rc == 2:
            STATS["clean_errors"] += 1
            msg = _one_line(err, names)
            if msg:
                problems.append(f"{name}: {msg}")
        elif rc is None:
            STATS["wrong_accepted"] += 1
            problems.append(f"{name}: damaged input reached the sampler")
        else:
            problems.append(f"{name}: exit {rc}: {err[-1500:]}")
    print(f"\nfuzz fit: {dict(STATS)}")
    assert not problems, "\n".join(problems[:20])


def _posterior_cases(post: Path, tmp: Path) -> list[tuple[str, Path]]:
    import xarray as xr

    out = []
    for k, content in enumerate([b"", b"garbage", post.read_bytes()[:2000]]):
        p = tmp / f"bytes{k}.nc"
        p.write_bytes(content)
        out.append((f"post_bytes_{k}", p))
    dt = xr.open_datatree(post, engine="h5netcdf").load()

    def variant(name: str, fn: Callable) -> None:
        d = dt.copy(deep=True)
        fn(d)
        p = tmp / f"{name}.nc"
        d.to_netcdf(p, engine="h5netcdf")
        out.append((name, p))

    def scale(v: str, f: float) -> Callable:
        def fn(d):
            ds = d["posterior"].to_dataset()
            ds[v] = ds[v] * f
            d["posterior"] = xr.DataTree(ds)
        return fn

    variant("post_no_version", lambda d: d.attrs.pop("model_version"))
    variant("post_old_version", lambda d: d.attrs.__setitem__("model_version", -1))
    variant("post_bad_terms", lambda d: d.attrs.__setitem__("terms", "{not json"))
    variant("post_other_priors", lambda d: d.attrs.__setitem__("priors_hash", "0" * 64))
    variant("post_beta_inf", scale("beta", np.inf))
    variant("post_beta_nan", scale("beta", np.nan))
    variant("post_beta_huge", scale("beta", 1e300))
    variant("post_beta_negative", scale("beta", -1.0))
    variant("post_alpha_zero", scale("alpha", 0.0))
    return out


def test_fuzz_check_export(tiny_posterior, tmp_path, capsys):
    """check / export on damaged posteriors, priors and arguments; never a traceback."""
    tables, post = tiny_posterior
    problems: list[str] = []
    runs: list[tuple[str, list, tuple[str, ...], tuple[int, ...]]] = []
    for name, p in _posterior_cases(post, tmp_path):
        out = ["--out", tmp_path / f"ck_{name}"] if name in ("post_beta_inf", "post_bytes_0") \
            else []  # the report and forest plot on two only (plots are slow)
        runs.append((f"check_{name}", ["check", p, *out], (p.name,), (0, 1, 2)))
        for fmt in ("json", "blis"):
            runs.append((f"export_{fmt}_{name}",
                         ["export", p, "--model", "llama-2-7b", "--gpu", "H100", "--format",
                          fmt, "--out", tmp_path / f"e_{name}.{fmt}"], (p.name,), (0, 2)))
    # the predictive checks on the two most damaged posteriors (slower: posterior predictive)
    for name in ("post_beta_huge",):
        p = tmp_path / f"{name}.nc"
        runs.append((f"check_tables_{name}", ["check", p, "--tables", tables, "--out",
                                              tmp_path / f"ckt_{name}"], (p.name,), (1, 2)))
    pri = DEFAULT_PRIORS.read_text()
    for k, text in enumerate(["{{{", pri.replace("median: 2.0", "median: 2.5", 1)]):
        f = tmp_path / f"pr{k}.yaml"
        f.write_text(text)
        runs.append((f"export_priors_{k}", ["export", post, "--model", "llama-2-7b", "--gpu",
                                            "H100", "--priors", f, "--out", tmp_path / "x.json"],
                     (f.name, "priors"), (2,)))
        runs.append((f"check_priors_{k}", ["check", post, "--priors", f], (f.name, "priors"),
                     (2,)))
    for k, extra in enumerate([["--tp", "0"], ["--tp", "-1"], ["--tp", "3"], ["--tp", "4096"],
                               ["--draws", "100000000"], ["--draws", "-1"],
                               ["--model", "no-such-model"], ["--gpu", "Z9000"],
                               ["--out", post], ["--out", tmp_path]]):
        for fmt in ("json", "blis"):
            argv = ["export", post, "--model", "llama-2-7b", "--gpu", "H100", "--format", fmt,
                    "--out", tmp_path / f"a{k}.{fmt}", *extra]
            runs.append((f"export_args_{k}_{fmt}", argv,
                         (extra[0], "model", "GPU", "gpu", "no-such-model", "Z9000"), (2,)))
    for name, argv, names, allowed in runs:
        before = tree_hash(post, tables)
        rc, out, err = _invoke(argv, capsys)
        STATS["runs"] += 1
        if tree_hash(post, tables) != before:
            problems.append(f"{name}: input changed")
        if rc == 2:
            STATS["clean_errors"] += 1
            msg = _one_line(err, names)
            if msg:
                problems.append(f"{name}: {msg}")
        if rc not in allowed:
            if rc == 0:
                STATS["wrong_accepted"] += 1
            problems.append(f"{name}: exit {rc} not in {allowed}: {err[-1500:]}")
        if rc == 0 and argv[0] == "export":
            text = Path(argv[argv.index("--out") + 1]).read_text()
            doc = yaml.safe_load(text)  # JSON is YAML too; .nan / .inf parse as floats
            if not _all_finite(doc):
                STATS["wrong_accepted"] += 1
                problems.append(f"{name}: export wrote non-finite numbers")
    print(f"\nfuzz check/export: {dict(STATS)}")
    assert not problems, "\n".join(p.splitlines()[0] + " ... " + p.splitlines()[-1]
                                    for p in problems[:30])
    shutil.rmtree(tmp_path, ignore_errors=True)
