"""Command-line input errors: refused arguments, messages that name the right file and row,
no output before an input error, and plausibility notes of client results."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bayes_latency.cli.main import main
from bayes_latency.data.tables import partition_path, write_manifest, write_partition
from tests.obs_factory import make_observations

CFG = [("llama-2-7b", "H100", 1)]


def obs_tables(tmp_path: Path) -> Path:
    """An observation table in two partitions (experiments e1, e2) of 22 rows each."""
    obs, _ = make_observations(CFG, n_iter=20, n_win=5, n_alpha=10, seed=3)
    obs = obs.head(44).reset_index(drop=True)
    obs["experiment_id"] = ["e1"] * 22 + ["e2"] * 22
    d = tmp_path / "T"
    for e in ("e1", "e2"):
        write_partition(d, "observations", e, obs[obs["experiment_id"] == e])
    write_manifest(d, ["e1", "e2"], {"observations": ["e1", "e2"]})
    return d


def one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("extra, needle", [
    (["--terms", ""], "--terms '': names no term"),
    (["--terms", " , "], "names no term"),
    (["--draws", "100", "--max-draws", "10"], "--max-draws 10: must be 0 (no extension) or at "
                                              "least --draws (100)"),
])
def test_fit_refuses_arguments(tmp_path, capsys, extra, needle):
    err = one_line_error(capsys, ["fit", str(tmp_path / "T"), "--out", str(tmp_path / "p.nc"),
                                  *extra])
    assert needle in err


def test_fit_nan_names_the_partition_file_and_its_row(tmp_path, capsys):
    d = obs_tables(tmp_path)
    f = partition_path(d, "observations", "e2")
    import pandas as pd

    df = pd.read_parquet(f)
    df.loc[3, "value_us"] = np.nan
    df.to_parquet(f, index=False)
    err = one_line_error(capsys, ["fit", str(d), "--out", str(tmp_path / "p.nc")])
    assert str(f) in err and "row 3" in err and "'value_us'" in err
    assert "observations.parquet" not in err


def test_partition_with_foreign_columns_names_them(tmp_path, capsys):
    d = obs_tables(tmp_path)
    f = partition_path(d, "observations", "e2")
    import pandas as pd

    pd.read_parquet(f).rename(columns={"value_us": "latency_ms"}).to_parquet(f, index=False)
    err = one_line_error(capsys, ["fit", str(d), "--out", str(tmp_path / "p.nc")])
    assert str(f) in err and "lacks column(s) 'value_us'" in err and "'latency_ms'" in err
    assert "NaN" not in err


def test_check_validates_tables_before_any_output(tmp_path, capsys):
    d = obs_tables(tmp_path)
    partition_path(d, "observations", "e2").write_bytes(b"garbage, not Parquet")
    out = tmp_path / "check"
    err = one_line_error(capsys, ["check", str(tmp_path / "post.nc"), "--tables", str(d),
                                  "--out", str(out)])
    assert "part.parquet" in err and "experiment_id=e2" in err
    assert not (out / "diagnostics.md").exists()
    assert capsys.readouterr().out == ""


def test_netcdf_of_another_tool_is_not_a_posterior(tmp_path, capsys):
    import xarray as xr

    p = tmp_path / "other.nc"
    xr.Dataset({"a": ("x", np.arange(3.0))}).to_netcdf(p, engine="h5netcdf")
    err = one_line_error(capsys, ["check", str(p)])
    assert "is not a bayes_latency posterior" in err and "model version" not in err


def test_a_population_file_where_a_posterior_belongs_is_named_as_such(tmp_path, capsys):
    from bayes_latency.model.posterior.population_file import SHIPPED_POPULATION

    for cmd in (["check", str(SHIPPED_POPULATION)],
                ["export", str(SHIPPED_POPULATION), "--model", "llama-2-7b", "--gpu", "H100",
                 "--tp", "1", "--out", str(tmp_path / "a.json")]):
        err = one_line_error(capsys, cmd)
        assert "is a population file" in err and "--population" in err
    assert not (tmp_path / "a.json").exists()


def _bench(tmp_path: Path, **kw) -> dict:
    from bayes_latency.synth.client_result import synthetic_vllm_bench

    beta = np.array([0.5, 1.0, 0.5, 1.4, 1.5, 15.0, 30.0, 4.0, 120.0, 0.0, 0.0])
    alpha = {"alpha_arrival": 15000.0, "alpha_post_decode": 800.0, "alpha_per_token": 40.0}
    return synthetic_vllm_bench("llama-2-7b", "H100", 1, beta, alpha, num_prompts=12, **kw)


def test_vllm_bench_json_with_a_bom_is_read(tmp_path):
    from bayes_latency.data.client.read import read_client_results

    p = tmp_path / "bench.json"
    p.write_text(json.dumps(_bench(tmp_path)), encoding="utf-8-sig")
    tabs, rep = read_client_results(p)
    assert len(tabs["client_requests"]) == 12 and not rep.dropped


def test_latencies_in_the_wrong_unit_get_a_plausibility_note(tmp_path):
    from bayes_latency.data.client.read import read_client_results

    doc = _bench(tmp_path)
    for k in [k for k in doc if k.endswith("_ms")]:
        doc[k] = doc[k] * 1000
    for k in ("ttfts", "latencies"):
        doc[k] = [v * 1000 for v in doc[k]]
    p = tmp_path / "bench.json"
    p.write_text(json.dumps(doc), encoding="utf-8")
    _, rep = read_client_results(p)
    notes = [n for n in rep.notes if "implausible" in n]
    # E2E 1.2 s -> 20 min (under MAX_PLAUSIBLE_LATENCY_S); 7.7 ms mean TPOT -> a 7.65 s decode interval
    assert len(notes) == 1 and "implausible mean decode interval 7.6" in notes[0]
    p.write_text(json.dumps(_bench(tmp_path)), encoding="utf-8")
    _, rep = read_client_results(p)
    assert not [n for n in rep.notes if "implausible" in n]
