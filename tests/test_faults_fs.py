"""Faults of the machine and the file system: outputs over inputs, full disks, file-size limits,
unwritable places, signals, output sets, locks, odd output paths.

Each test runs the command as a user would (in-process through ``main``, or as a subprocess
where a signal, a resource limit or an environment variable matters) and checks the promise:
exit 2 and one line ``bayes-latency: error: ...`` naming the path (128 + N for signal N), no
traceback, no temporary file or lock left behind, earlier outputs and every input untouched.
Fixtures: ``tiny_fleet_seed5`` and ``tiny_posterior`` of ``conftest.py``.
"""

from __future__ import annotations

import errno
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from mutate import copy_exp, tree_hash

from bayes_latency.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "tests" / "data" / "vllm_bench_small.json"
EXPORT = ["--model", "llama-2-7b", "--gpu", "H100", "--tp", "1"]
#: Leftovers of an interrupted or failed run: temporary files, staging folders, locks.
LEFTOVER = re.compile(r"\.tmp|\.bayes_latency\.(stage|lock|probe)")


# -- helpers ------------------------------------------------------------------------------------
def run(argv: list, capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(err: str, *names: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("bayes-latency: error:"), err
    assert "Traceback" not in err, err
    for n in names:
        assert n in lines[-1], (n, lines[-1])
    return lines[-1]


def leftovers(*folders: Path) -> list[str]:
    return [str(p) for f in folders if Path(f).exists() for p in Path(f).rglob("*")
            if LEFTOVER.search(p.name)]


def _limit_fsize(nbytes: int):
    def set_limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))
    return set_limit


def cli(argv: list, *, inject: str = "", env: dict | None = None, limit_fsize: int | None = None,
        timeout: float = 120, stdout=subprocess.PIPE, cwd: Path | None = None
        ) -> subprocess.CompletedProcess:
    """The command line in a subprocess; ``inject``: Python run first (a fault to inject)."""
    code = inject + "\nimport sys\nfrom bayes_latency.cli.main import main\nsys.exit(main(sys.argv[1:]))\n"
    return subprocess.run([sys.executable, "-c", code, *map(str, argv)], stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=cwd,
                          preexec_fn=_limit_fsize(limit_fsize) if limit_fsize else None)


def cli_signal(argv: list, sig: int, marker: str, *, inject: str = "", delay: float = 0.0,
               timeout: float = 60) -> tuple[int, str, float]:
    """Run the command line, send ``sig`` once ``marker`` appears on stderr; (rc, stderr,
    seconds from the signal to the exit)."""
    code = inject + "\nimport sys\nfrom bayes_latency.cli.main import main\nsys.exit(main(sys.argv[1:]))\n"
    p = subprocess.Popen([sys.executable, "-c", code, *map(str, argv)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    seen = threading.Event()

    def pump() -> None:
        for ln in p.stderr:
            lines.append(ln)
            if marker in ln:
                seen.set()

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    try:
        assert seen.wait(timeout), f"marker {marker!r} not seen: {''.join(lines)}"
        time.sleep(delay)
        t0 = time.perf_counter()
        p.send_signal(sig)
        rc = p.wait(timeout=timeout)
        took = time.perf_counter() - t0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    t.join(5)
    return rc, "".join(lines), took


#: Injected into a subprocess: every Parquet partition write prints MARK and then works on for
#: 30 s (a slow disk), so that a signal arrives while the ingest is writing. Short sleeps: a
#: signal that a library thread (pyarrow's pool) receives runs Python's handler in the main
#: thread only when it next runs Python code, as it does in a real ingest.
SLOW_PARQUET = """
import sys, time
import bayes_latency.data.tables as _t
_orig = _t._write_parquet
def _slow(df, path):
    _orig(df, path)
    print("MARK writing", path, file=sys.stderr, flush=True)
    for _ in range(300):
        time.sleep(0.1)
_t._write_parquet = _slow
"""


@pytest.fixture()
def exp(tiny_fleet_seed5, tmp_path) -> Path:
    return copy_exp(tiny_fleet_seed5, tmp_path / "in")


@pytest.fixture()
def work(tiny_posterior, tmp_path) -> dict[str, Path]:
    """Copies of the tiny tables ``T``, their small observation table ``S`` and the posterior
    ``P`` (so a test may damage them)."""
    tables, post = tiny_posterior
    t = tmp_path / "T"
    shutil.copytree(tables, t)
    s = tmp_path / "S"
    shutil.copytree(post.parent / "small", s)
    p = tmp_path / "P.nc"
    shutil.copy(post, p)
    return {"T": t, "S": s, "P": p}


# -- 1: outputs that land on inputs -----------------------------------------------------------------
def test_01_outputs_inside_any_input_are_refused(work, exp, tmp_path, capsys, monkeypatch):
    t, s, p = work["T"], work["S"], work["P"]
    eid = sorted(d.name for d in (t / "observations").iterdir())[0]
    part = t / "observations" / eid / "part.parquet"
    (tmp_path / "Tlink").symlink_to(t)
    os.link(part, tmp_path / "hard.parquet")
    os.link(p, tmp_path / "hard.nc")
    monkeypatch.chdir(tmp_path)
    before = tree_hash(t, s, p, exp, BENCH)
    cases = [
        (["fit", t, "--out", part], "lies inside the input"),
        (["fit", t, "--out", t / "posterior.nc"], "lies inside the input"),
        (["fit", t, "--out", "Tlink/observations.parquet"], "lies inside the input"),
        (["fit", "./T/../T", "--out", "T/tables.json"], "lies inside the input"),
        (["fit", t, "--out", tmp_path / "hard.parquet"], "hard link of the input"),
        (["fit", s, "--out", s / "observations.parquet"], "input"),
        (["calibrate", BENCH, *EXPORT, "--tables", t, "--out", part], "lies inside the input"),
        (["calibrate", BENCH, *EXPORT, "--out", tmp_path / "c.nc", "--export", BENCH],
         "--export"),
        (["population", p, "--rows", t, "--out", t / "tables.json"], "lies inside the input"),
        (["population", t, "--out", part], "lies inside the input"),
        (["export", p, *EXPORT, "--out", tmp_path / "hard.nc"], "input"),
        (["export", p, *EXPORT, "--out", "./T/../P.nc"], "input"),
        (["check", p, "--tables", t, "--out", t / "check"], "lies inside the input"),
        (["check", p, "--out", p], "input"),
        (["ingest", exp, "--out", exp / "tables"], "lies inside the input"),
        (["ingest", t, "--out", t], "input"),
    ]
    for argv, why in cases:
        t0 = time.perf_counter()
        rc, _, err = run(argv, capsys)
        assert rc == 2, (argv, err)
        one_line_error(err, why)
        assert time.perf_counter() - t0 < 10, argv  # refused before any long work
    assert tree_hash(t, s, p, exp, BENCH) == before


# -- 2: fit on a full file system / over the file-size limit ------------------------------------
def test_02_fit_over_the_file_size_limit_is_one_line_and_keeps_the_old_file(work, tmp_path):
    out = tmp_path / "post.nc"
    out.write_text("an earlier posterior")
    r = cli(["fit", work["S"], "--out", out, "--sampler", "laplace", "--draws", "100",
             "--chains", "2"], limit_fsize=64 * 1024)
    assert r.returncode == 2, r.stderr[-2000:]
    line = one_line_error(r.stderr, str(out), "file too large")
    assert "ulimit -f" in line
    assert out.read_text() == "an earlier posterior"
    assert not leftovers(tmp_path)


def test_02_population_save_on_a_full_disk(work, tmp_path, capsys, monkeypatch):
    import bayes_latency.io as bio

    def full(path, data):
        Path(path).write_bytes(bytes(data)[:100])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(bio, "write_bytes", full)
    out = tmp_path / "pop.nc"
    rc, _, err = run(["population", work["P"], "--out", out, "--max-rhat", "9"], capsys)
    assert rc == 2, err
    one_line_error(err, str(out), "no space left")
    assert not out.exists() and not leftovers(tmp_path)


# -- 3: ingest, export, check on a full disk ------------------------------------------------------
def test_03_ingest_export_check_over_the_file_size_limit(work, exp, tmp_path):
    t, p = work["T"], work["P"]
    check = tmp_path / "C"
    r = cli(["check", p, "--out", check])
    assert r.returncode in (0, 1), r.stderr
    before = tree_hash(t, check)
    for argv in (["ingest", exp, "--out", t], ["export", p, *EXPORT, "--out", tmp_path / "e.json"],
                 ["check", p, "--out", check]):
        r = cli(argv, limit_fsize=1024)
        assert r.returncode == 2, (argv, r.stderr[-2000:])
        one_line_error(r.stderr, "file too large")
    assert tree_hash(t, check) == before  # earlier outputs untouched, no partial partitions
    assert not (tmp_path / "e.json").exists()
    assert not leftovers(tmp_path)


def test_03_ingest_export_check_on_a_full_tmpfs(work, exp, tmp_path):
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not available: no private tmpfs")
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs "
                            f"{tmp_path}"], capture_output=True, text=True)
    if probe.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {probe.stderr.strip()}")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    py = sys.executable
    script = f"""
set -u
mount -t tmpfs -o size=2m tmpfs {mnt} || exit 9
cp -r {work['T']} {mnt}/T && cp {work['P']} {mnt}/P.nc
{py} -m bayes_latency.cli.main check {mnt}/P.nc --out {mnt}/C >/dev/null 2>&1
find {mnt}/T {mnt}/C -type f | sort | xargs sha256sum > {tmp_path}/before.txt
dd if=/dev/zero of={mnt}/fill bs=1k count=4096 2>/dev/null
{py} -m bayes_latency.cli.main ingest {exp} --out {mnt}/T > /dev/null 2> {tmp_path}/ingest.err
echo $? > {tmp_path}/ingest.rc
{py} -m bayes_latency.cli.main export {mnt}/P.nc {' '.join(EXPORT)} --out {mnt}/e.json \\
    > /dev/null 2> {tmp_path}/export.err
echo $? > {tmp_path}/export.rc
{py} -m bayes_latency.cli.main check {mnt}/P.nc --out {mnt}/C > /dev/null 2> {tmp_path}/check.err
echo $? > {tmp_path}/check.rc
find {mnt}/T {mnt}/C -type f | sort | xargs sha256sum > {tmp_path}/after.txt
find {mnt} -name '*.tmp*' -o -name '.bayes_latency*' > {tmp_path}/left.txt
"""
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    for cmd in ("ingest", "export", "check"):
        assert (tmp_path / f"{cmd}.rc").read_text().strip() == "2", cmd
        one_line_error((tmp_path / f"{cmd}.err").read_text(), "no space left")
    assert (tmp_path / "before.txt").read_text() == (tmp_path / "after.txt").read_text()
    assert (tmp_path / "left.txt").read_text().strip() == ""


# -- 4: unwritable home folder --------------------------------------------------------------------
def test_04_unwritable_home_compiles_in_a_temporary_folder(work, tmp_path):
    home = work["P"] / "home"  # below a file: cannot be created
    code = ("from bayes_latency.cli.main import _compile_cache\nprint(_compile_cache())\n"
            "import pytensor\nprint(pytensor.config.compiledir)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "HOME": str(home)}, timeout=120)
    assert r.returncode == 0, r.stderr
    note, compiledir = r.stdout.strip().splitlines()[-2:]
    assert "not writable" in note and str(home) in note
    tmp = note.split("temporary folder ")[1].split()[0]
    assert compiledir.startswith(tmp)
    assert not Path(tmp).exists()  # removed at exit
    r = cli(["export", work["P"], *EXPORT, "--out", tmp_path / "e.json"], env={"HOME": str(home)})
    assert r.returncode == 0, r.stderr
    notes = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(notes) == 1 and "not writable" in notes[0] and "Traceback" not in r.stderr


# -- 5: signals ---------------------------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_05_signal_mid_ingest_cleans_up(work, exp, sig):
    t = work["T"]
    before = tree_hash(t)
    rc, err, took = cli_signal(["ingest", exp, "--out", t], sig, "MARK", inject=SLOW_PARQUET)
    assert rc == 128 + sig, err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("MARK")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert ("interrupted" if sig == signal.SIGINT else "terminated") in lines[0]
    assert "nothing written" in lines[0] and "temporary files removed" in lines[0]
    assert took < 20
    assert tree_hash(t) == before and not leftovers(t)


def test_05_sigint_mid_sampling_writes_nothing(work, tmp_path):
    out = tmp_path / "post.nc"
    rc, err, took = cli_signal(["fit", work["S"], "--out", out, "--draws", "50000",
                                "--tune", "500", "--max-draws", "0"],
                               signal.SIGINT, "tuning done", delay=0.3, timeout=90)
    assert rc == 130, err
    assert err.strip().splitlines()[-1] == ("bayes-latency: interrupted; nothing written; "
                                            "temporary files removed")
    assert "Traceback" not in err and took < 20
    assert not out.exists() and not leftovers(tmp_path)


def test_05_sigterm_while_the_posterior_is_written(work, tmp_path):
    slow = """
import sys, time
import bayes_latency.io as _io
def _slow(path, data):
    with open(path, "wb") as fh:
        fh.write(bytes(data)[:1000])
    print("MARK", path, file=sys.stderr, flush=True)
    for _ in range(300):
        time.sleep(0.1)
_io.write_bytes = _slow
"""
    out = tmp_path / "pop.nc"
    out.write_text("earlier")
    rc, err, _ = cli_signal(["population", work["P"], "--out", out, "--max-rhat", "9"],
                            signal.SIGTERM, "MARK", inject=slow)
    assert rc == 143, err
    assert "terminated (SIGTERM); nothing written" in err.strip().splitlines()[-1]
    assert out.read_text() == "earlier" and not leftovers(tmp_path)


def test_05_lock_of_a_killed_ingest_is_named_and_taken_over(work, exp, capsys):
    t = work["T"]
    before = tree_hash(t)
    code = SLOW_PARQUET + "\nimport sys\nfrom bayes_latency.cli.main import main\nsys.exit(main(sys.argv[1:]))\n"
    p = subprocess.Popen([sys.executable, "-c", code, "ingest", str(exp), "--out", str(t)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for ln in p.stderr:
            if "MARK" in ln:
                break
        p.kill()
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    lock = t / ".bayes_latency.lock"
    assert lock.read_text().split()[0] == str(p.pid)
    # the killed run wrote only into its staging folder (and its lock)
    assert {k: v for k, v in tree_hash(t).items() if not LEFTOVER.search(k)} == before
    rc, out, err = run(["ingest", exp, "--out", t], capsys)
    assert rc == 0, err
    assert f"stale lock {lock} of process {p.pid}, which no longer runs" in out
    assert not leftovers(t)


# -- 6: an output folder holds one run's files ------------------------------------------------------
def test_06_check_out_never_mixes_two_runs(work, tmp_path, capsys):
    import xarray as xr

    p = work["P"]
    dt = xr.open_datatree(p, engine="h5netcdf").load()
    pst = dt["posterior"].to_dataset()
    pst["beta"] = pst["beta"] * 1e300
    dt["posterior"] = xr.DataTree(pst)
    bad = tmp_path / "bad.nc"
    dt.to_netcdf(bad, engine="h5netcdf")
    out = tmp_path / "C"
    out.mkdir()
    (out / "my_notes.txt").write_text("mine")
    rc, _, err = run(["check", bad, "--out", out], capsys)
    assert rc == 1 and (out / "findings.json").is_file(), err
    rc, stdout, err = run(["check", p, "--out", out], capsys)
    assert "Findings" not in stdout
    assert not (out / "findings.json").exists()  # the failed run's findings are gone
    assert (out / "my_notes.txt").read_text() == "mine"  # not the command's: kept
    assert {f.name for f in out.iterdir()} == {"diagnostics.md", "diagnostics.json",
                                              "forest.png", "my_notes.txt"}
    assert not leftovers(out)


def test_06_a_failed_ingest_leaves_the_earlier_tables(work, exp, tmp_path, capsys, monkeypatch):
    import pyarrow.parquet as pq

    t = work["T"]
    before = tree_hash(t)
    calls = {"n": 0}
    orig = pq.write_table

    def full_on_third(table, where, **kw):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return orig(table, where, **kw)

    monkeypatch.setattr(pq, "write_table", full_on_third)
    rc, _, err = run(["ingest", exp, "--out", t], capsys)
    assert rc == 2, err
    one_line_error(err, str(t), "no space left")
    assert ".bayes_latency.stage" not in err
    assert tree_hash(t) == before and not leftovers(t)


# -- a new round: further machine and file-system faults ------------------------------------------
def test_n01_rename_across_file_systems_is_one_line(work, tmp_path, capsys, monkeypatch):
    import bayes_latency.io as bio

    def exdev(src, dst):
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), str(src), str(dst))

    monkeypatch.setattr(bio.os, "replace", exdev)
    out = tmp_path / "e.json"
    rc, _, err = run(["export", work["P"], *EXPORT, "--out", out], capsys)
    assert rc == 2
    one_line_error(err, str(out), "across file systems")
    assert not out.exists() and not leftovers(tmp_path)


def test_n02_two_runs_on_one_output(work, exp, tmp_path):
    # two exports into one file at once: each move is atomic, the file is one whole document
    out = tmp_path / "e.json"
    code = "import sys\nfrom bayes_latency.cli.main import main\nsys.exit(main(sys.argv[1:]))"
    procs = [subprocess.Popen([sys.executable, "-c", code, "export", str(work["P"]), *EXPORT,
                               "--draws", str(n), "--out", str(out)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for n in (0, 5)]
    errs = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    doc = json.loads(out.read_text())
    assert doc and not leftovers(tmp_path)
    # two ingests into one folder at once: the second is refused, naming the first
    t = work["T"]
    code = SLOW_PARQUET + code
    first = subprocess.Popen([sys.executable, "-c", code, "ingest", str(exp), "--out", str(t)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for ln in first.stderr:
            if "MARK" in ln:
                break
        r = cli(["ingest", exp, "--out", t])
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=30)
    assert r.returncode == 2
    one_line_error(r.stderr, f"another run (process {first.pid})")
    assert first.returncode == 143 and not leftovers(t)


def test_n03_names_too_long_are_refused_up_front(work, tmp_path, capsys):
    for out in (tmp_path / ("x" * 250 + ".json"), tmp_path / ("d" * 300) / "e.json"):
        rc, _, err = run(["export", work["P"], *EXPORT, "--out", out], capsys)
        assert rc == 2
        one_line_error(err, "bytes", "shorter")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["P.nc", "S", "T"]


def test_n04_missing_output_parents_are_created(work, tmp_path, capsys):
    out = tmp_path / "a" / "b" / "c" / "e.json"
    rc, _, err = run(["export", work["P"], *EXPORT, "--out", out], capsys)
    assert rc == 0, err
    assert json.loads(out.read_text())


def test_n05_folder_for_a_file_and_file_for_a_folder(work, tmp_path, capsys):
    a_dir, a_file = tmp_path / "d", tmp_path / "f"
    a_dir.mkdir()
    a_file.write_text("x")
    for argv, why in ((["export", work["P"], *EXPORT, "--out", a_dir], "existing folder"),
                      (["check", work["P"], "--out", a_file], "is a file"),
                      (["fit", work["S"], "--out", a_file / "p.nc"], "is a file")):
        rc, _, err = run(argv, capsys)
        assert rc == 2
        one_line_error(err, why)
    assert a_file.read_text() == "x" and not any(a_dir.iterdir())


def test_n06_permission_denied_on_the_output_folder(work, tmp_path, capsys):
    if os.geteuid() == 0:
        pytest.skip("root writes into any folder: permission bits cannot be tested as root")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        rc, _, err = run(["export", work["P"], *EXPORT, "--out", ro / "e.json"], capsys)
    finally:
        ro.chmod(0o700)
    assert rc == 2
    one_line_error(err, str(ro), "not writable")


def test_n07_output_symlink_pointing_at_an_input(work, tmp_path, capsys):
    link = tmp_path / "link.nc"
    link.symlink_to(work["P"])
    before = tree_hash(work["P"])
    rc, _, err = run(["export", work["P"], *EXPORT, "--out", link], capsys)
    assert rc == 2
    one_line_error(err, "input")
    dlink = tmp_path / "dlink"
    dlink.symlink_to(work["T"])
    rc, _, err = run(["check", work["P"], "--tables", work["T"], "--out", dlink / "c"], capsys)
    assert rc == 2
    one_line_error(err, "lies inside the input")
    assert tree_hash(work["P"]) == before and link.is_symlink()


def test_n08_output_equal_to_an_input_spelled_differently(work, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = tree_hash(work["T"])
    for argv in (["ingest", "T", "--out", "./T/../T"], ["fit", "T", "--out", "T/./../T"],
                 ["check", "P.nc", "--out", "./S/../P.nc"]):
        rc, _, err = run(argv, capsys)
        assert rc == 2, argv
        one_line_error(err, "input")
    assert tree_hash(work["T"]) == before


def test_n09_read_only_output_file_is_not_replaced(work, tmp_path, capsys):
    out = tmp_path / "e.json"
    out.write_text("keep me")
    out.chmod(0o444)
    rc, _, err = run(["export", work["P"], *EXPORT, "--out", out], capsys)
    assert rc == 2
    one_line_error(err, str(out), "read-only")
    assert out.read_text() == "keep me"


def test_n10_sighup_mid_population_write(work, tmp_path):
    slow = """
import sys, time
import bayes_latency.io as _io
def _slow(path, data):
    open(path, "wb").write(bytes(data)[:10])
    print("MARK", file=sys.stderr, flush=True)
    for _ in range(300):
        time.sleep(0.1)
_io.write_bytes = _slow
"""
    rc, err, took = cli_signal(["population", work["P"], "--out", tmp_path / "pop.nc",
                                "--max-rhat", "9"], signal.SIGHUP, "MARK", inject=slow)
    assert rc == 129 and "terminated (SIGHUP); nothing written" in err, err
    assert took < 10 and not leftovers(tmp_path) and not (tmp_path / "pop.nc").exists()


def test_n11_closed_stdout_ends_quietly(work, tmp_path):
    code = "import sys\nfrom bayes_latency.cli.main import main\nsys.exit(main(sys.argv[1:]))"
    p = subprocess.Popen([sys.executable, "-c", code, "check", str(work["P"])],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # `| head -0`: the reader is gone
    err = p.stderr.read().decode()
    p.wait(timeout=120)
    assert p.returncode == 141, err
    one_line_error(err, "broken pipe")
    assert "Exception ignored" not in err


def test_n12_input_output_error_on_read(work, tmp_path, capsys, monkeypatch):
    import xarray as xr

    def eio(path, *a, **k):
        raise OSError(errno.EIO, os.strerror(errno.EIO), str(path))

    monkeypatch.setattr(xr, "open_datatree", eio)
    rc, _, err = run(["export", work["P"], *EXPORT, "--out", tmp_path / "e.json"], capsys)
    assert rc == 2
    one_line_error(err, str(work["P"]), "Input/output error")
    monkeypatch.undo()
    import bayes_latency.data.tables as tables_mod

    def eio_parquet(*a, **k):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(tables_mod.pd, "read_parquet", eio_parquet)
    rc, _, err = run(["fit", work["S"], "--out", tmp_path / "p.nc"], capsys)
    assert rc == 2
    one_line_error(err, "observations.parquet")


def test_n14_unwritable_tmpdir(work, tmp_path):
    r = cli(["export", work["P"], *EXPORT, "--out", tmp_path / "e.json"],
            env={"TMPDIR": str(work["P"] / "tmp")})
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and (tmp_path / "e.json").is_file()


def test_n15_outputs_in_system_folders_are_refused(work, capsys):
    for out in ("/dev/null", "/dev/shm/x/e.json", "/proc/self/e.json", "/sys/e.json"):
        rc, _, err = run(["export", work["P"], *EXPORT, "--out", out], capsys)
        assert rc == 2, out
        one_line_error(err, "system folder")


def _lock(folder: Path, text: str, age_s: float = 0.0) -> Path:
    lock = folder / ".bayes_latency.lock"
    lock.write_text(text, encoding="utf-8")
    t = time.time() - age_s
    os.utime(lock, (t, t))
    return lock


def test_n16_garbage_lock_files(work, exp, capsys):
    t = work["T"]
    lock = _lock(t, "garbage", age_s=0)  # fresh: perhaps being written right now
    rc, _, err = run(["ingest", exp, "--out", t], capsys)
    assert rc == 2
    one_line_error(err, "unknown process", str(lock))
    for text in ("garbage", "", "12ab host\n"):
        _lock(t, text, age_s=3600)
        rc, out, err = run(["ingest", exp, "--out", t], capsys)
        assert rc == 0, err
        assert "holds no process id" in out and not lock.exists()


def test_n17_lock_of_another_host(work, exp, capsys):
    t = work["T"]
    lock = _lock(t, f"{os.getpid()} other-host-{socket.gethostname()}\n", age_s=7200)
    rc, _, err = run(["ingest", exp, "--out", t], capsys)
    assert rc == 2
    one_line_error(err, f"on host other-host-{socket.gethostname()}", str(lock))
    assert lock.is_file()


def test_n18_clock_set_back(work, exp, capsys):
    t = work["T"]
    lock = _lock(t, "", age_s=-86400)  # dated tomorrow: the clock went back since
    rc, out, err = run(["ingest", exp, "--out", t], capsys)
    assert rc == 0, err
    assert "holds no process id" in out and not lock.exists()
    # outputs dated in the future are replaced like any other
    p = tmp = t / "ingest_report.json"
    os.utime(p, (time.time() + 86400, time.time() + 86400))
    rc, _, err = run(["ingest", exp, "--out", t], capsys)
    assert rc == 0 and tmp.stat().st_mtime <= time.time() + 5, err


def test_n19_fifo_as_output_does_not_hang(work, tmp_path, capsys):
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    t0 = time.perf_counter()
    rc, _, err = run(["export", work["P"], *EXPORT, "--out", fifo], capsys)
    assert rc == 2 and time.perf_counter() - t0 < 10
    one_line_error(err, "special file")


def test_n20_stdout_on_a_full_device(work, tmp_path):
    with open("/dev/full", "w") as full:
        r = cli(["check", work["P"]], stdout=full)
    assert r.returncode == 2
    one_line_error(r.stderr, "standard output", "no space left")
    assert "Exception ignored" not in r.stderr


def test_n21_staging_folder_of_a_killed_run_is_cleared(work, exp, capsys):
    t = work["T"]
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    stale = t / f".bayes_latency.stage.{int(dead.stdout)}.abc"
    (stale / "steps").mkdir(parents=True)
    rc, _, err = run(["ingest", exp, "--out", t], capsys)
    assert rc == 0, err
    assert not stale.exists() and not leftovers(t)


def test_n22_non_utf8_output_name(work, tmp_path):
    out = os.fsencode(str(tmp_path)) + b"/e\xff.json"
    code = "import sys\nfrom bayes_latency.cli.main import main\nsys.exit(main(sys.argv[1:]))"
    r = subprocess.run([sys.executable, "-c", code, "export", str(work["P"]), *EXPORT,
                        "--out", out], capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert b"Traceback" not in r.stderr and os.path.exists(out)


def test_n23_few_file_descriptors(work, exp, tmp_path):
    def few() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (24, 24))
    code = "import sys\nfrom bayes_latency.cli.main import main\nsys.exit(main(sys.argv[1:]))"
    r = subprocess.run([sys.executable, "-c", code, "ingest", str(exp), "--out",
                        str(tmp_path / "T2")], capture_output=True, text=True, timeout=120,
                       preexec_fn=few)
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    if r.returncode:
        one_line_error(r.stderr, "too many open files")
    assert not leftovers(tmp_path / "T2")


def test_n24_output_folder_removed_under_a_running_check(work, tmp_path, capsys, monkeypatch):
    import bayes_latency.cli.check as check_mod

    out = tmp_path / "C"
    orig = check_mod.diagnose

    def vanish(result):
        shutil.rmtree(out)  # another user cleans up the folder meanwhile
        return orig(result)

    monkeypatch.setattr(check_mod, "diagnose", vanish)
    rc, _, err = run(["check", work["P"], "--out", out], capsys)
    assert rc == 2
    one_line_error(err, str(out))


def test_06_simulate_replaces_an_earlier_fleet_and_keeps_other_files(tmp_path, capsys):
    out = tmp_path / "F"
    (out / "old-experiment").mkdir(parents=True)
    (out / "old-experiment" / "traces.jsonl").write_text("{}\n")
    (out / "truth.yaml").write_text("fleet: other\nexperiments:\n  old-experiment: {}\n")
    (out / "my_notes.txt").write_text("mine")
    rc, _, err = run(["simulate", "--fleet", "tiny", "--out", out, "--quiet"], capsys)
    assert rc == 0, err
    names = {p.name for p in out.iterdir()}
    assert "old-experiment" not in names and "my_notes.txt" in names
    assert len([p for p in out.iterdir() if p.is_dir()]) == 3 and not leftovers(out)


def test_n26_dangling_symlink_as_output_becomes_the_file(work, tmp_path, capsys):
    link = tmp_path / "e.json"
    link.symlink_to(tmp_path / "nowhere" / "x.json")
    rc, _, err = run(["export", work["P"], *EXPORT, "--out", link], capsys)
    assert rc == 0, err
    assert not link.is_symlink() and json.loads(link.read_text())
    assert not (tmp_path / "nowhere").exists()


def test_n27_home_unset(work, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "HOME"}
    code = "import sys\nfrom bayes_latency.cli.main import main\nsys.exit(main(sys.argv[1:]))"
    r = subprocess.run([sys.executable, "-c", code, "export", str(work["P"]), *EXPORT, "--out",
                        str(tmp_path / "e.json")], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
