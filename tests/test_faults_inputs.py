"""Odd input files: FIFOs, devices, folders, compressed or UTF-16 text, out-of-bounds sizes,
damaged package files (populations, posteriors) and the messages that refuse them.

Each refusal is exit 2 and one line ``bayes-latency: error: ...`` naming the file and what it
is; a case that could hang runs in a subprocess with a timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bayes_latency.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "tests" / "data" / "vllm_bench_small.json"
CAL = ["--model", "llama-2-7b", "--gpu", "H100", "--tp", "1"]


def run(argv: list, capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(err: str, *names: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("bayes-latency: error:"), err
    for n in names:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def run_cli(argv: list, timeout: float = 25, stdin: bytes | None = None,
            cwd: Path | None = None) -> tuple[int, str, str]:
    """The CLI in a subprocess, killed after ``timeout`` s (a hang fails the test)."""
    proc = subprocess.run([sys.executable, "-m", "bayes_latency.cli.main", *map(str, argv)],
                          capture_output=True, timeout=timeout, input=stdin, cwd=cwd)
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


@pytest.fixture()
def fifo(tmp_path: Path) -> Path:
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this platform")
    p = tmp_path / "pipe.yaml"
    os.mkfifo(p)
    return p


# ---------------------------------------------------------------------------------------------
# 7. Only regular files are read
# ---------------------------------------------------------------------------------------------

def test_fifo_config_is_refused_without_waiting(fifo: Path, tiny_fleet_seed5: Path,
                                                tmp_path: Path):
    exp = tiny_fleet_seed5 / "llama-2-7b-h100-tp1-general"
    rc, _, err = run_cli(["ingest", exp / "traces.jsonl", "--config", fifo,
                          "--out", tmp_path / "o"], timeout=25)
    assert rc == 2
    one_line_error(err, "pipe.yaml", "serving config is a FIFO")


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "stdin_pipe", "folder"])
def test_odd_result_files_say_what_they_are(kind: str, fifo: Path, tmp_path: Path):
    (tmp_path / "results").mkdir()
    path = {"fifo": fifo, "dev_zero": Path("/dev/zero"), "stdin_pipe": Path("/dev/stdin"),
            "folder": tmp_path / "results"}[kind]
    if kind == "dev_zero" and not path.exists():
        pytest.skip("no /dev/zero")
    rc, _, err = run_cli(["calibrate", path, *CAL, "--out", tmp_path / "c.nc"],
                         stdin=b"{}" if kind == "stdin_pipe" else None, timeout=25)
    assert rc == 2
    want = {"fifo": "is a FIFO", "dev_zero": "is a character device",
            "stdin_pipe": "is a FIFO", "folder": "no client results found"}[kind]
    one_line_error(err, str(path), want)


def test_dev_zero_config_is_refused_at_once(tiny_fleet_seed5: Path, tmp_path: Path, capsys):
    if not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero")
    exp = tiny_fleet_seed5 / "llama-2-7b-h100-tp1-general"
    rc, _, err = run(["ingest", exp / "traces.jsonl", "--config", "/dev/zero",
                      "--out", tmp_path / "o"], capsys)
    assert rc == 2
    one_line_error(err, "/dev/zero", "serving config is a character device")


def test_folder_named_serving_yaml_is_an_invalid_config(tiny_fleet_seed5: Path, tmp_path: Path,
                                                        capsys):
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "traces.jsonl").symlink_to(tiny_fleet_seed5 / "llama-2-7b-h100-tp1-general"
                                      / "traces.jsonl")
    (exp / "serving.yaml").mkdir()
    rc, _, err = run(["ingest", exp, "--out", tmp_path / "o"], capsys)
    assert rc == 2 and not list((tmp_path / "o").glob("*/*.parquet"))
    one_line_error(err, "serving.yaml", "serving config is a directory")


@pytest.mark.parametrize("option", ["--priors", "--population", "--gpu", "--model"])
def test_every_reader_refuses_a_fifo(option: str, fifo: Path, tmp_path: Path):
    args = {"--model": "llama-2-7b", "--gpu": "H100", option: fifo}
    argv = ["calibrate", BENCH, "--tp", "1", "--out", tmp_path / "c.nc"]
    for k, v in args.items():
        argv += [k, v]
    rc, _, err = run_cli(argv, timeout=25)
    assert rc == 2
    one_line_error(err, "pipe.yaml", "is a FIFO")


def test_fifo_posterior_and_trace(fifo: Path, tmp_path: Path):
    rc, _, err = run_cli(["export", fifo, *CAL, "--out", tmp_path / "x.yaml"], timeout=25)
    assert rc == 2
    one_line_error(err, "posterior file is a FIFO")
    rc, _, err = run_cli(["ingest", fifo, "--out", tmp_path / "o"], timeout=25)
    assert rc == 2
    one_line_error(err, "trace is a FIFO")


# ---------------------------------------------------------------------------------------------
# 9. calibrate --export-draws is bounded before any work
# ---------------------------------------------------------------------------------------------

def test_export_draws_bounded_before_work(tmp_path: Path, capsys):
    from bayes_latency.cli.export import MAX_EXPORT_DRAWS

    rc, _, err = run(["calibrate", BENCH, *CAL, "--out", tmp_path / "c.nc",
                      "--export", tmp_path / "x.yaml", "--export-draws", "100000000"], capsys)
    assert rc == 2 and not list(tmp_path.iterdir())
    one_line_error(err, "--export-draws 100000000", f"{MAX_EXPORT_DRAWS:,}")


# ---------------------------------------------------------------------------------------------
# 8. A --save-detailed result too large to replay whole: a stated window of its requests
# ---------------------------------------------------------------------------------------------

def _bench_doc(n: int) -> dict:
    doc = json.loads(BENCH.read_text())
    reps = -(-n // len(doc["ttfts"]))
    for k in ("input_lens", "output_lens", "ttfts", "itls", "latencies", "queue_times",
              "generated_texts", "errors"):
        doc[k] = (doc[k] * reps)[:n]
    doc["start_times"] = [0.25 * i for i in range(n)]
    doc["errors"] = [""] * n
    doc["num_prompts"] = doc["completed"] = n
    doc["failed"] = 0
    doc["duration"] = 0.25 * n
    return doc


def test_large_detailed_result_replays_a_stated_window(tmp_path: Path, monkeypatch):
    from bayes_latency.calibrate import stages as st
    from bayes_latency.data.client.read import read_client_results

    p = tmp_path / "big.json"
    p.write_text(json.dumps(_bench_doc(300)))
    tabs, _ = read_client_results(p)
    monkeypatch.setattr(st, "MAX_REPLAY_REQUESTS", 100)
    notes: list[str] = []
    (stage,) = st.client_stages(tabs, "llama-2-7b", "H100", 1, 5000, notes=notes)
    req = tabs["client_requests"]
    ok = req[(req["status"] == "ok") & (req["output_tokens"] >= 1)].sort_values("send_s")
    assert len(stage.arrival_s) == 100
    assert list(stage.arrival_s) == pytest.approx(list(ok["send_s"].head(100)))
    assert stage.observed["ttft_mean_us"] == pytest.approx(ok["ttft_s"].head(100).mean() * 1e6)
    assert len(notes) == 1 and f"{len(ok)} requests" in notes[0] and "first 100" in notes[0]
    # drawn stages (summary only) keep the same bound
    doc = _bench_doc(300)
    for k in ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times",
              "queue_times", "generated_texts", "errors"):
        doc.pop(k)
    doc["mean_e2el_ms"] = 1000.0
    p.write_text(json.dumps(doc))
    tabs, _ = read_client_results(p)
    notes.clear()
    (stage,) = st.client_stages(tabs, "llama-2-7b", "H100", 1, 5000, notes=notes)
    assert stage.count == 100 and len(notes) == 1


# ---------------------------------------------------------------------------------------------
# 10. Populations and posteriors read by dimension name, checked on load
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_population(tiny_posterior, tmp_path_factory) -> Path:
    """``bayes-latency population`` of the session's tiny fit."""
    out = tmp_path_factory.mktemp("pop") / "pop.nc"
    assert main(["population", str(tiny_posterior[1]), "--out", str(out)]) == 0
    return out


def _damaged_population(src: Path, dst: Path, how: str) -> Path:
    import numpy as np
    import xarray as xr

    ds = xr.open_dataset(src, engine="h5netcdf").load()
    if how == "trimmed":
        ds = ds.isel(coef=slice(0, -1))
    elif how == "transposed":
        ds = ds.transpose(*reversed(list(ds.dims)))
    elif how == "nan":
        mu = ds["mu"].values.copy()
        mu[0, 0] = np.nan
        ds["mu"] = (ds["mu"].dims, mu)
    ds.to_netcdf(dst, engine="h5netcdf")
    return dst


@pytest.mark.parametrize("how,want", [("trimmed", "dimension 'coef' of the population has"),
                                      ("nan", "variable mu has 1 of")])
def test_damaged_population_is_refused_naming_file_and_variable(how, want, tiny_population,
                                                                tmp_path, capsys):
    bad = _damaged_population(tiny_population, tmp_path / f"pop_{how}.nc", how)
    rc, _, err = run(["calibrate", BENCH, *CAL, "--population", bad, "--out",
                      tmp_path / "c.nc"], capsys)
    assert rc == 2 and not (tmp_path / "c.nc").exists()
    one_line_error(err, f"pop_{how}.nc", want, "bayes-latency population")


def test_transposed_population_reads_like_the_original(tiny_population, tmp_path):
    import numpy as np
    import pandas as pd

    from bayes_latency.model.posterior.population_file import load_population

    a = load_population(tiny_population)
    b = load_population(_damaged_population(tiny_population, tmp_path / "t.nc", "transposed"))
    cfg = pd.DataFrame({"model": ["llama-2-7b"], "gpu": ["H100"], "tp": [1]},
                       index=pd.Index(["x"], name="config_id"))
    pa, pb = a.config_prior(cfg), b.config_prior(cfg)
    assert np.array_equal(pa.mean, pb.mean) and np.array_equal(pa.chol, pb.chol)


def test_population_with_nan_is_not_written(tiny_population, tmp_path):
    import numpy as np

    from bayes_latency.errors import BayesLatencyError
    from bayes_latency.model.posterior.population_file import load_population

    pop = load_population(tiny_population)
    mu = pop.draws["mu"].values.copy()
    mu[1, 2] = np.inf
    pop.draws["mu"] = (pop.draws["mu"].dims, mu)
    with pytest.raises(BayesLatencyError, match=r"not written: variable mu has 1 of"):
        pop.save(tmp_path / "p.nc")
    assert not list(tmp_path.iterdir())


def _damaged_posterior(src: Path, dst: Path, how: str) -> Path:
    import numpy as np
    import xarray as xr

    dt = xr.open_datatree(src, engine="h5netcdf").load()
    post = dt["posterior"].to_dataset()
    if how == "transposed":
        post = post.transpose(*reversed(list(post.dims)))
    elif how == "trimmed":
        post = post.isel(term=slice(0, -1))
    elif how == "nan":
        beta = post["beta"].values.copy()
        beta[0, 0, 0, 0] = np.nan
        post["beta"] = (post["beta"].dims, beta)
    dt["posterior"] = xr.DataTree(post)
    dt.to_netcdf(dst, engine="h5netcdf")
    return dst


def test_damaged_posteriors(tiny_posterior, tmp_path, capsys):
    post = tiny_posterior[1]
    ref = tmp_path / "ref.yaml"
    rc, _, err = run(["export", post, *CAL, "--out", ref], capsys)
    assert rc == 0, err
    t = _damaged_posterior(post, tmp_path / "t.nc", "transposed")
    rc, _, err = run(["export", t, *CAL, "--out", tmp_path / "t.yaml"], capsys)
    assert rc == 0, err
    strip = lambda p: [ln for ln in p.read_text().splitlines()  # noqa: E731
                       if "posterior_file" not in ln and "posterior_sha256" not in ln]
    assert strip(tmp_path / "t.yaml") == strip(ref)
    for how, want in (("trimmed", "dimension 'term' of the posterior has"),
                      ("nan", "posterior variable beta has 1 of 6,600 draws NaN")):
        bad = _damaged_posterior(post, tmp_path / f"{how}.nc", how)
        rc, _, err = run(["export", bad, *CAL, "--out", tmp_path / f"{how}.yaml"], capsys)
        assert rc == 2 and not (tmp_path / f"{how}.yaml").exists()
        one_line_error(err, f"{how}.nc", want)


# ---------------------------------------------------------------------------------------------
# 11. Messages: one line, what is wrong and what to do
# ---------------------------------------------------------------------------------------------

DATA = ROOT / "tests" / "data"


def _tracev2_pair(tmp_path: Path, edit) -> Path:
    import pandas as pd

    df = pd.read_csv(DATA / "blis_observe.csv", keep_default_na=False, dtype=str)
    edit(df)
    (tmp_path / "obs.yaml").write_text((DATA / "blis_observe.yaml").read_text())
    df.to_csv(tmp_path / "obs.csv", index=False)
    return tmp_path / "obs.yaml"


def test_negative_tracev2_time_is_called_a_negative_time(tmp_path: Path):
    from bayes_latency.data.client.tracev2 import read_tracev2
    from bayes_latency.errors import TraceFormatError

    def neg(df):
        df.loc[0, "send_time_us"] = "-1500"

    with pytest.raises(TraceFormatError, match=r"a time in microseconds, and negative") as ei:
        read_tracev2(_tracev2_pair(tmp_path, neg), strict=True)
    assert ei.value.field == "send_time_us" and "token count" not in str(ei.value)

    def neg_tokens(df):
        df.loc[0, "output_tokens"] = "-3"

    with pytest.raises(TraceFormatError, match=r"a token count, and negative"):
        read_tracev2(_tracev2_pair(tmp_path, neg_tokens), strict=True)


def test_vllm_result_without_e2el_names_the_vllm_option(tmp_path: Path, capsys):
    doc = json.loads(BENCH.read_text())
    for k in ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times",
              "queue_times", "generated_texts", "errors"):
        doc.pop(k)
    p = tmp_path / "summary.json"
    p.write_text(json.dumps(doc))
    rc, _, err = run(["calibrate", p, *CAL, "--out", tmp_path / "c.nc"], capsys)
    assert rc == 2
    one_line_error(err, "summary.json", "mean_e2el_ms", "--percentile-metrics ttft,tpot,itl,e2el")


@pytest.mark.parametrize("flops,bw", [("1.0e-300", "1.0e300"), ("989", "3.35e12")])
def test_absurd_gpu_datasheet_one_line_no_numpy_warnings(flops, bw, tiny_posterior, tmp_path):
    gpu = tmp_path / "gpu.yaml"
    gpu.write_text(f"MyGPU:\n  peak_flops_bf16: {flops}\n  hbm_bandwidth: {bw}\n"
                   f"  memory_bytes: 85520809984\n  interconnect_bandwidth: 450.0e9\n")
    rc, _, err = run_cli(["export", tiny_posterior[1], "--model", "llama-2-7b", "--gpu", gpu,
                          "--tp", "1", "--out", tmp_path / "x.yaml"])
    assert rc == 2 and "RuntimeWarning" not in err
    one_line_error(err, "gpu.yaml", "peak_flops_bf16", "plausible range")


def test_laplace_draws_raise_no_future_warnings():
    import warnings

    import pymc as pm

    from bayes_latency.model.inference.sampler import _laplace_draws

    with pm.Model(coords={"k": [0, 1, 2]}) as model:
        s = pm.HalfNormal("s", 1.0, dims="k")
        z = pm.ZeroSumNormal("z", dims="k")
        pm.Normal("y", z, s, observed=[0.5, -0.2, -0.3])
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            ds = _laplace_draws(model, 20, 2, seed=0)
    assert ds["s_log__"].shape == (2, 10, 3)  # the value variables' draws, as nutpie's trace


# ---------------------------------------------------------------------------------------------
# New classes of odd inputs
# ---------------------------------------------------------------------------------------------

OTHER_TOOLS = {
    "genai-perf": {"request_throughput": {"unit": "requests/sec", "avg": 3.2},
                   "request_latency": {"unit": "ms", "avg": 950.1},
                   "time_to_first_token": {"unit": "ms", "avg": 40.2},
                   "input_config": {"model": ["meta-llama/Llama-2-7b-hf"]}},
    "SGLang": {"backend": "sglang", "request_rate": 4.0, "duration": 30.1, "completed": 120,
               "total_input_tokens": 66000, "total_output_tokens": 14880,
               "request_throughput": 3.98, "mean_e2e_latency_ms": 951.2,
               "mean_ttft_ms": 40.5, "mean_tpot_ms": 7.6},
    "LLMPerf": {"version": "2023-08-31", "model": "meta-llama/Llama-2-7b-hf",
                "num_concurrent_requests": 4, "results_ttft_s_mean": 0.0402,
                "results_end_to_end_latency_s_mean": 0.951},
    "GuideLLM": {"benchmarks": [{"type_": "generative_benchmark",
                                 "metrics": {"request_latency": {"successful": {"mean": 0.95}}}}]},
}


@pytest.mark.parametrize("tool", sorted(OTHER_TOOLS))
def test_other_tools_results_are_named(tool: str, tmp_path: Path, capsys):
    p = tmp_path / "result.json"
    text = json.dumps(OTHER_TOOLS[tool])
    p.write_text(text + "\n" if tool != "SGLang" else text + "\n" + text + "\n")  # JSON lines
    rc, _, err = run(["calibrate", p, *CAL, "--out", tmp_path / "c.nc"], capsys)
    assert rc == 2
    one_line_error(err, "result.json", tool, "vllm bench serve --save-result --save-detailed")


@pytest.mark.parametrize("kind,want", [("gzip", "gzip-compressed; decompress it first"),
                                       ("zstd", "zstd-compressed"),
                                       ("utf16", "UTF-16 text"),
                                       ("empty", "is empty (0 bytes)")])
def test_compressed_utf16_or_empty_result_and_config(kind: str, want: str, tmp_path: Path,
                                                     tiny_fleet_seed5: Path, capsys):
    import gzip

    def encode(data: bytes) -> bytes:
        return {"gzip": lambda: gzip.compress(data),
                "zstd": lambda: b"\x28\xb5\x2f\xfd" + data,  # the frame magic is enough
                "utf16": lambda: data.decode().encode("utf-16"),
                "empty": lambda: b""}[kind]()

    res = tmp_path / "res.json"
    res.write_bytes(encode(BENCH.read_bytes()))
    rc, _, err = run(["calibrate", res, *CAL, "--out", tmp_path / "c.nc"], capsys)
    assert rc == 2
    one_line_error(err, "res.json", f"client result {'is ' if kind != 'empty' else ''}", want)
    exp = tiny_fleet_seed5 / "llama-2-7b-h100-tp1-general"
    cfg = tmp_path / "serving.yaml"
    cfg.write_bytes(encode((exp / "serving.yaml").read_bytes()))
    rc, _, err = run(["ingest", exp / "traces.jsonl", "--config", cfg, "--out",
                      tmp_path / "o"], capsys)
    assert rc == 2
    one_line_error(err, "serving.yaml", "serving config")


def test_gzip_trace_without_gz_name_and_empty_trace(tiny_fleet_seed5: Path, tmp_path: Path,
                                                    capsys):
    import gzip

    exp = tiny_fleet_seed5 / "llama-2-7b-h100-tp1-general"
    trace = tmp_path / "traces.jsonl"
    trace.write_bytes(gzip.compress((exp / "traces.jsonl").read_bytes()[:20000]))
    rc, _, err = run(["ingest", trace, "--config", exp / "serving.yaml", "--out",
                      tmp_path / "o"], capsys)
    assert rc == 2
    one_line_error(err, "traces.jsonl", "trace is gzip-compressed")
    trace.write_bytes(b"")
    rc, _, err = run(["ingest", trace, "--config", exp / "serving.yaml", "--out",
                      tmp_path / "o2"], capsys)
    assert rc == 2
    one_line_error(err, "traces.jsonl", "trace is empty (0 bytes)")


def test_crlf_config_reads_like_lf(tiny_fleet_seed5: Path, tmp_path: Path):
    from bayes_latency.data.experiment import load_serving_yaml

    exp = tiny_fleet_seed5 / "llama-2-7b-h100-tp1-general"
    cfg = tmp_path / "serving.yaml"
    cfg.write_bytes((exp / "serving.yaml").read_bytes().replace(b"\n", b"\r\n"))
    a, b = load_serving_yaml(exp / "serving.yaml"), load_serving_yaml(cfg)
    a.pop("_source", None), b.pop("_source", None)
    assert {k: v for k, v in a.items() if "source" not in k} == \
        {k: v for k, v in b.items() if "source" not in k}


def test_file_that_grows_while_read_is_refused(tmp_path: Path, monkeypatch):
    from bayes_latency import textfiles
    from bayes_latency.errors import ConfigError

    p = tmp_path / "serving.yaml"
    p.write_text("model: llama-2-7b\ngpu: H100\n")
    real = os.fstat

    def shrunk(fd: int):
        st = real(fd)
        return os.stat_result((*st[:6], st.st_size - 5, *st[7:]))

    monkeypatch.setattr(textfiles.os, "fstat", shrunk)
    with pytest.raises(ConfigError, match="grew while being read"):
        textfiles.read_text(p, "serving config", ConfigError)


def test_unreadable_file_says_permission(tmp_path: Path, monkeypatch, capsys):
    from bayes_latency import textfiles

    p = tmp_path / "res.json"
    p.write_text(BENCH.read_text())

    real_open = textfiles.os.open

    def denied(path, *a, **k):  # the result file only: the output check still probes its folder
        if Path(path) == p:
            raise PermissionError(13, "Permission denied")
        return real_open(path, *a, **k)

    monkeypatch.setattr(textfiles, "open", denied, raising=False)
    monkeypatch.setattr(textfiles.os, "open", denied)
    rc, _, err = run(["calibrate", p, *CAL, "--out", tmp_path / "c.nc"], capsys)
    assert rc == 2
    one_line_error(err, "res.json", "not readable", "permission denied")


@pytest.mark.parametrize("option", ["--priors", "--population", "--gpu"])
def test_folder_where_a_file_is_read(option: str, tmp_path: Path, capsys):
    folder = tmp_path / "thing.yaml"
    folder.mkdir()
    args = {"--model": "llama-2-7b", "--gpu": "H100", option: folder}
    argv = ["calibrate", BENCH, "--tp", "1", "--out", tmp_path / "c.nc"]
    for k, v in args.items():
        argv += [k, v]
    rc, _, err = run(argv, capsys)
    assert rc == 2
    one_line_error(err, "thing.yaml", "is a directory", "not a folder")


def test_symlink_loop_is_named(tmp_path: Path, capsys):
    (tmp_path / "a.json").symlink_to(tmp_path / "b.json")
    (tmp_path / "b.json").symlink_to(tmp_path / "a.json")
    rc, _, err = run(["calibrate", tmp_path / "a.json", *CAL, "--out", tmp_path / "c.nc"],
                     capsys)
    assert rc == 2
    one_line_error(err, "a.json", "loop of symbolic links")


@pytest.mark.parametrize("field,value,want", [
    ("mean_e2el_ms", 1e300, "implausible mean E2E"),
    ("mean_e2el_ms", 10.0, "mean E2E 10 ms below mean TTFT"),
])
def test_implausible_client_means_are_refused_before_a_fit(field, value, want, tmp_path, capsys):
    doc = json.loads(BENCH.read_text())
    for k in ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times",
              "queue_times", "generated_texts", "errors"):
        doc.pop(k)
    doc[field] = value
    p = tmp_path / "r.json"
    p.write_text(json.dumps(doc))
    t0 = time.monotonic()
    rc, _, err = run(["calibrate", p, *CAL, "--out", tmp_path / "c.nc"], capsys)
    assert rc == 2 and time.monotonic() - t0 < 20
    one_line_error(err, "r.json", want)


def test_truncated_or_foreign_posterior(tiny_posterior, tmp_path, capsys):
    post = tiny_posterior[1]
    cut = tmp_path / "cut.nc"
    cut.write_bytes(post.read_bytes()[:20000])
    foreign = tmp_path / "foreign.nc"
    foreign.write_text(BENCH.read_text())
    for bad in (cut, foreign):
        rc, _, err = run(["export", bad, *CAL, "--out", tmp_path / "x.yaml"], capsys)
        assert rc == 2
        one_line_error(err, bad.name, "truncated, or not a netCDF file")


def test_newer_model_version_says_upgrade(tiny_posterior, tiny_population, tmp_path, capsys):
    import xarray as xr

    dt = xr.open_datatree(tiny_posterior[1], engine="h5netcdf").load()
    dt.attrs["model_version"] = "999"
    dt.to_netcdf(tmp_path / "new.nc", engine="h5netcdf")
    rc, _, err = run(["export", tmp_path / "new.nc", *CAL, "--out", tmp_path / "x.yaml"],
                     capsys)
    assert rc == 2
    one_line_error(err, "new.nc", "'999'", "Upgrade bayes-latency")
    ds = xr.open_dataset(tiny_population, engine="h5netcdf").load()
    ds.attrs["model_version"] = "999"
    ds.to_netcdf(tmp_path / "newpop.nc", engine="h5netcdf")
    rc, _, err = run(["calibrate", BENCH, *CAL, "--population", tmp_path / "newpop.nc",
                      "--out", tmp_path / "c.nc"], capsys)
    assert rc == 2
    one_line_error(err, "newpop.nc", "Upgrade bayes-latency")


def test_empty_parquet_partition_is_named(tiny_posterior, tmp_path, capsys):
    import shutil

    tables = tmp_path / "T"
    shutil.copytree(tiny_posterior[0], tables)
    part = sorted((tables / "observations").rglob("*.parquet"))[0]
    part.write_bytes(b"")
    rc, _, err = run(["fit", tables, "--out", tmp_path / "f.nc", "--sampler", "laplace"], capsys)
    assert rc == 2 and not (tmp_path / "f.nc").exists()
    one_line_error(err, part.name, "Parquet")


def test_million_identical_lines_trace_is_bounded(tiny_fleet_seed5: Path, tmp_path: Path):
    trace = tmp_path / "same.jsonl"
    trace.write_bytes(b"{}\n" * 1_000_000)
    exp = tiny_fleet_seed5 / "llama-2-7b-h100-tp1-general"
    t0 = time.monotonic()
    rc, _, err = run_cli(["ingest", trace, "--config", exp / "serving.yaml", "--out",
                          tmp_path / "o"], timeout=25)
    assert rc == 2 and time.monotonic() - t0 < 25
    one_line_error(err, "same.jsonl", "no valid OTLP JSON line")


def test_priors_duplicate_key_and_alias_bomb_config(tiny_fleet_seed5: Path, tmp_path: Path,
                                                   capsys):
    from bayes_latency.priors import DEFAULT_PRIORS_PATH

    pri = tmp_path / "p.yaml"
    pri.write_text(DEFAULT_PRIORS_PATH.read_text() + "\nschema_version: 1\n")
    rc, _, err = run(["calibrate", BENCH, *CAL, "--priors", pri, "--out", tmp_path / "c.nc"],
                     capsys)
    assert rc == 2
    one_line_error(err, "p.yaml", "duplicate key 'schema_version'")
    exp = tiny_fleet_seed5 / "llama-2-7b-h100-tp1-general"
    bomb = ["a0: &a0 [" + ", ".join(['"x"'] * 9) + "]"]
    bomb += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    cfg = tmp_path / "serving.yaml"
    cfg.write_text((exp / "serving.yaml").read_text() + "\n" + "\n".join(bomb) + "\n")
    rc, _, err = run(["ingest", exp / "traces.jsonl", "--config", cfg, "--out",
                      tmp_path / "o"], capsys)
    assert rc == 2
    one_line_error(err, "serving.yaml", "alias bomb")


def test_unknown_architecture_config_json(tmp_path: Path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "mamba", "hidden_size": 2560,
                               "num_hidden_layers": 64, "vocab_size": 50280}))
    rc, _, err = run(["calibrate", BENCH, "--model", cfg, "--gpu", "H100", "--tp", "1",
                      "--out", tmp_path / "c.nc"], capsys)
    assert rc == 2
    one_line_error(err, "config.json", "num_attention_heads")


def test_trace_that_grows_while_read_is_refused(tiny_fleet_seed5: Path, tmp_path: Path,
                                                monkeypatch, capsys):
    from bayes_latency.data import jsonl

    exp = tiny_fleet_seed5 / "llama-2-7b-h100-tp1-general"
    real = os.fstat

    def shrunk(fd: int):
        st = real(fd)
        return os.stat_result((*st[:6], st.st_size // 2, *st[7:]))

    import types

    monkeypatch.setattr(jsonl, "os", types.SimpleNamespace(fstat=shrunk))
    rc, _, err = run(["ingest", exp / "traces.jsonl", "--config", exp / "serving.yaml",
                      "--out", tmp_path / "o"], capsys)
    assert rc == 2 and not list((tmp_path / "o").glob("*/*.parquet"))
    one_line_error(err, "traces.jsonl", "grew while being read")


@pytest.mark.parametrize("reader", ["microbench", "steps"])
def test_fifo_step_or_microbench_table(reader: str, fifo: Path):
    code = ("from bayes_latency.data.microbench import read_splitwise as r" if reader ==
            "microbench" else "from bayes_latency.data.steps import load_step_table as r")
    proc = subprocess.run([sys.executable, "-c", f"{code}\ntry:\n    r({str(fifo)!r})\n"
                           f"except Exception as e:\n    print(type(e).__name__, e)"],
                          capture_output=True, text=True, timeout=25)
    assert "TraceFormatError" in proc.stdout and "is a FIFO" in proc.stdout, proc


def test_client_clock_jump_in_start_times_is_refused(tmp_path: Path, capsys):
    doc = json.loads(BENCH.read_text())
    doc["start_times"][3] = 1e12
    p = tmp_path / "jump.json"
    p.write_text(json.dumps(doc))
    t0 = time.monotonic()
    rc, _, err = run(["calibrate", p, *CAL, "--out", tmp_path / "c.nc"], capsys)
    assert rc == 2 and time.monotonic() - t0 < 20
    one_line_error(err, "jump.json", "send times span 1e+12 s", "clock jumped")
    doc = json.loads(BENCH.read_text())
    doc["start_times"][3] += 60.0  # a one-minute jump in a 3 s run
    p.write_text(json.dumps(doc))
    rc, _, err = run(["calibrate", p, *CAL, "--out", tmp_path / "c.nc"], capsys)
    assert rc == 2
    one_line_error(err, "jump.json", "recorded duration (3.01106 s)", "clock jumped")


def test_tracev2_far_future_times_are_refused(tmp_path: Path, capsys):
    def future(df):
        for c in ("send_time_us", "first_chunk_time_us", "last_chunk_time_us",
                  "arrival_time_us"):
            if c in df:
                df.loc[2, c] = str(int(df.loc[2, c]) + 10**18)

    hdr = _tracev2_pair(tmp_path, future)
    rc, _, err = run(["calibrate", hdr, *CAL, "--out", tmp_path / "c.nc"], capsys)
    assert rc == 2
    one_line_error(err, "obs", "send times span", "a week", "clock jumped")


@pytest.mark.parametrize("command", ["calibrate", "fit", "export", "check"])
def test_an_input_path_too_long_for_the_file_system(command: str, tmp_path: Path, capsys):
    long = tmp_path / ("a" * 5000)
    argv = {"calibrate": ["calibrate", long, *CAL, "--out", tmp_path / "c.nc"],
            "fit": ["fit", long, "--out", tmp_path / "c.nc"],
            "export": ["export", long, *CAL, "--out", tmp_path / "c.json"],
            "check": ["check", long]}[command]
    rc, _, err = run(argv, capsys)
    assert rc == 2
    one_line_error(err, "too long")
    assert not (tmp_path / "c.nc").exists() and not (tmp_path / "c.json").exists()
