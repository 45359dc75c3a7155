"""File helpers shared by the commands: output-path validation, atomic writes, checked reads.

Every command validates its ``--out`` with :func:`check_output_path` before doing any long work,
so that a bad path fails in a second with one line instead of after a fit; and writes its files
with :func:`atomic_write` (a temporary file in the same folder, then :func:`os.replace`), so that
an interrupted run never leaves a half-written file and never replaces an input.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from bayes_latency.errors import BayesLatencyError, TraceFormatError

__all__ = ["OutputPathError", "atomic_path", "atomic_write", "atomic_write_text",
           "check_output_path", "folder_lock", "read_parquet"]


class OutputPathError(BayesLatencyError):
    """An output path that cannot be written, or that would overwrite an input."""


def _same(a: Path, b: Path) -> bool:
    """Whether two paths name the same file or folder (resolved, or same inode when both exist)."""
    if a.resolve() == b.resolve():
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _inside(child: Path, parent: Path) -> bool:
    try:
        child.resolve().relative_to(parent.resolve())
    except ValueError:
        return False
    return True


def check_output_path(out: str | Path, inputs: Iterable[str | Path] = (), kind: str = "file",
                      names: Iterable[str] = ()) -> Path:
    """Validate an output path before the work that produces it; create its folder.

    Parameters
    ----------
    out
        The ``--out`` path.
    inputs
        Files and folders the command reads: ``out`` may not be one of them, may not lie inside an
        input *file* and (for ``kind="dir"``) none of the files it writes (``names``) may be an
        input file.
    kind
        ``"file"`` (one file is written at ``out``) or ``"dir"`` (a folder of files).
    names
        For ``kind="dir"``: names of the files written inside ``out``.

    Returns
    -------
    Path
        ``out``; for ``kind="dir"`` the folder exists afterwards, for ``"file"`` its parent does.

    Raises
    ------
    OutputPathError
        Naming the path and the reason (an input, a folder where a file is needed or the reverse,
        a parent that is a file, not writable).
    """
    if kind not in ("file", "dir"):
        raise ValueError(f"kind must be 'file' or 'dir', got {kind!r}")
    out = Path(out)
    if not str(out).strip():
        raise OutputPathError("--out is empty")
    ins = [Path(p) for p in inputs]
    for p in ins:
        if _same(out, p):
            raise OutputPathError(f"--out {out} is an input of this command; refusing to "
                                  f"overwrite it (choose another path)")
        if p.is_file() and _inside(out, p):
            raise OutputPathError(f"--out {out} lies inside the input file {p}")
    if kind == "dir":
        for name in names:
            target = out / name
            for p in ins:
                if p.exists() and target.exists() and _same(target, p):
                    raise OutputPathError(f"--out {out} would overwrite the input {p}; "
                                          f"choose another folder")
    # the first existing ancestor must be a folder
    parent = out if kind == "dir" else out.parent
    anc = parent
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    if anc.exists() and not anc.is_dir():
        raise OutputPathError(f"--out {out}: {anc} is a file, not a folder")
    if kind == "file" and out.is_dir():
        raise OutputPathError(f"--out {out} is an existing folder; give a file path")
    if kind == "dir" and out.exists() and not out.is_dir():
        raise OutputPathError(f"--out {out} is an existing file; give a folder path")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputPathError(f"--out {out}: cannot create folder {parent}: "
                              f"{exc.strerror or exc}") from None
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputPathError(f"--out {out}: folder {parent} is not writable")
    return out


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path next to ``path``; moved onto ``path`` when the block ends without error.

    Works for files and for folders (e.g. zarr stores): an existing folder at ``path`` is removed
    just before the move. On error the temporary file is removed and ``path`` is untouched.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=f".tmp{path.suffix}",
                               dir=path.parent)
    os.close(fd)
    os.unlink(tmp)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        os.replace(tmp_path, path)
    except BaseException:
        if tmp_path.is_dir():
            shutil.rmtree(tmp_path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                tmp_path.unlink()
        raise


def atomic_write(path: str | Path, writer: Callable[[Path], Any]) -> Path:
    """Call ``writer(tmp)`` to write a temporary file, then move it onto ``path`` atomically."""
    path = Path(path)
    with atomic_path(path) as tmp:
        writer(tmp)
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def read_parquet(path: str | Path, **kwargs: Any) -> Any:
    """:func:`pandas.read_parquet` that turns any read failure into a one-line error.

    Raises
    ------
    TraceFormatError
        Naming the file, when it is missing, unreadable or not a valid Parquet file.
    """
    import pandas as pd

    path = Path(path)
    try:
        return pd.read_parquet(path, **kwargs)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for corrupt files
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TraceFormatError(f"cannot read Parquet table: {msg}", file=str(path)) from None


def _pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this machine (one of another user counts)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


@contextlib.contextmanager
def folder_lock(folder: str | Path, what: str = "write",
                name: str = ".bayes_latency.lock") -> Iterator[list[str]]:
    """Hold ``folder/name`` while the block writes ``folder``; refuse a folder another run holds.

    The lock file is created atomically (``O_CREAT | O_EXCL``) and holds ``pid host``; it is
    removed when the block ends. A lock left by a process of this host that no longer runs is
    taken over, with a note.

    Yields
    ------
    list[str]
        Notes (the takeover of a stale lock), for the command's report.

    Raises
    ------
    OutputPathError
        When another running process (or one on another host) holds the folder.
    """
    path = Path(folder) / name
    host = socket.gethostname()
    me = f"{os.getpid()} {host}\n"
    notes: list[str] = []
    for attempt in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                owner = path.read_text(encoding="utf-8", errors="replace").split()
            except OSError:
                owner = []
            pid = int(owner[0]) if owner and owner[0].isdigit() else -1
            other_host = owner[1] if len(owner) > 1 else host
            if attempt == 0 and other_host == host and not _pid_alive(pid) and owner:
                notes.append(f"took over the stale lock {path} of process {pid}, which no "
                             f"longer runs")
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                continue
            who = f"process {pid}" + ("" if other_host == host else f" on host {other_host}")
            raise OutputPathError(
                f"--out {folder}: another run ({who}) is writing this folder ({path} exists); "
                f"wait for it to finish, or remove {path} if it is not running") from None
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(me)
        break
    try:
        yield notes
    finally:
        try:
            if path.read_text(encoding="utf-8") == me:
                path.unlink()
        except OSError:
            pass
