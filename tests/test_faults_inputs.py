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
    path = {"fifo": fifo, "dev_zero": Path("/dev/zero"), "stdin_pipe": Path("/dev/stdin"),
            "folder": tmp_path}[kind]
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
