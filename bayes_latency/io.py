"""File helpers shared by the commands: output-path validation, atomic writes, checked reads.

Every command validates its ``--out`` with :func:`check_output_path` before doing any long work,
so that a bad path fails in a second with one line instead of after a fit; and writes its files
with :func:`atomic_write` (a temporary file in the same folder, then :func:`os.replace`), so that
an interrupted run never leaves a half-written file and never replaces an input.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from bayes_latency.errors import BayesLatencyError, TraceFormatError

__all__ = ["OutputPathError", "OutputWriteError", "atomic_path", "atomic_write",
           "atomic_write_text", "check_output_path", "folder_lock", "os_error_text",
           "probe_writable", "read_parquet", "staged_folder", "write_bytes", "written_paths"]


class OutputPathError(BayesLatencyError):
    """An output path that cannot be written, or that would overwrite an input."""


class OutputWriteError(OutputPathError):
    """Writing an output failed (no space left, file-size limit, not writable, I/O error);
    the temporary file was removed and the earlier file at the path is untouched."""


#: What an errno means to a user, with what to do (``os_error_text``).
_ERRNO_TEXT = {
    errno.ENOSPC: "no space left on device (free some space, or choose another --out)",
    errno.EDQUOT: "disk quota exceeded (free some space, or choose another --out)",
    errno.EFBIG: "file too large: over the file-size limit of this shell (ulimit -f), or of "
                 "the file system",
    errno.EROFS: "not writable (read-only file system)",
    errno.EACCES: "not writable (permission denied)",
    errno.EPERM: "not writable (operation not permitted)",
    errno.ENAMETOOLONG: "file name too long (each part of a path at most 255 bytes)",
    errno.EXDEV: "cannot move a file across file systems",
    errno.EIO: "input/output error (a failing disk or network file system)",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EISDIR: "is a folder, not a file",
    errno.ENOENT: "no such file or folder",
    errno.ENOTEMPTY: "folder not empty",
    errno.EMFILE: "too many open files (raise ulimit -n)",
    errno.ENFILE: "too many open files on this machine",
    errno.ESTALE: "stale file handle (network file system)",
    errno.ELOOP: "too many levels of symbolic links",
}

#: Paths written by :func:`atomic_path` in this process (reset by the command line at its start):
#: what an interrupted command names as kept.
_WRITTEN: list[Path] = []


#: The signal that interrupted this process's command (None: none yet); set by the command
#: line's signal handler, reset when a command starts.
_INTERRUPTED: list[int | None] = [None]


def mark_interrupted(signum: int | None = -1) -> int | None:
    """Record the signal that interrupts the command; ``None`` resets, no argument only reads.

    Returns
    -------
    int or None
        For a signal: it (truthy) when it is the first one, else 0. Without argument: the
        recorded signal.
    """
    if signum == -1:
        return _INTERRUPTED[0]
    if signum is None:
        _INTERRUPTED[0] = None
        return None
    if _INTERRUPTED[0] is not None:
        return 0
    _INTERRUPTED[0] = int(signum)
    return int(signum)


def _check_interrupted() -> None:
    """Raise KeyboardInterrupt when a signal arrived (a library may have swallowed it): no
    output of an interrupted command is moved into place."""
    if _INTERRUPTED[0] is not None:
        raise KeyboardInterrupt(f"signal {_INTERRUPTED[0]}")


def written_paths(reset: bool = False) -> list[Path]:
    """Files and folders this process has written (moved into place) so far; ``reset``
    forgets them (the command line does so when a command starts)."""
    if reset:
        _WRITTEN.clear()
    return list(_WRITTEN)


def os_error_text(exc: BaseException, path: str | Path | None = None) -> str:
    """One line for an :class:`OSError`: the path and what the error means.

    ``path`` (else the error's ``filename``) is named; the errno is also read from messages of
    libraries that put it in the text only (pyarrow: ``[errno 28] No space left on device``).
    """
    code = getattr(exc, "errno", None)
    text = str(exc)
    if code is None:
        m = re.search(r"errno[ =]?(\d+)", text, re.IGNORECASE)
        code = int(m.group(1)) if m else None
    where = path if path is not None else getattr(exc, "filename", None)
    reason = _ERRNO_TEXT.get(code) if code is not None else None
    if reason is None:
        reason = (getattr(exc, "strerror", None) or " ".join(text.split())
                  or type(exc).__name__)
    other = getattr(exc, "filename2", None)
    if where is not None and other is not None and str(other) != str(where):
        return f"{where} -> {other}: {reason}"
    return f"{where}: {reason}" if where is not None else reason


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


#: Folders of the operating system that are no place for results (devices, kernel tables).
SYSTEM_FOLDERS = ("/proc", "/sys", "/dev")

#: Longest file name :func:`atomic_path` adds to a name for its temporary file (``.`` + name +
#: ``.XXXXXXXX.tmp`` + suffix): the name given must leave room for it.
_TMP_EXTRA = 24

#: Files looked at under an input folder when the output is a hard link (same inode).
_HARDLINK_SCAN_MAX = 200_000


def _hardlinked_input(out: Path, inputs: list[Path]) -> Path | None:
    """The input file (or a file under an input folder) that is the same inode as ``out``."""
    try:
        st = out.stat()
    except OSError:
        return None
    if not out.is_file() or st.st_nlink < 2:
        return None
    key, seen = (st.st_dev, st.st_ino), 0
    for p in inputs:
        if p.is_file():
            with contextlib.suppress(OSError):
                if (p.stat().st_dev, p.stat().st_ino) == key:
                    return p
        elif p.is_dir():
            for root, _dirs, files in os.walk(p):
                for f in files:
                    seen += 1
                    if seen > _HARDLINK_SCAN_MAX:
                        return None
                    with contextlib.suppress(OSError):
                        fs = os.lstat(os.path.join(root, f))
                        if (fs.st_dev, fs.st_ino) == key:
                            return Path(root) / f
    return None


def _check_name_lengths(out: Path) -> None:
    """Each part of ``out`` fits the file system's name limit, with room for a temporary name."""
    try:
        limit = os.pathconf(out.parent if out.parent.exists() else "/", "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    for part in out.parts:
        n = len(os.fsencode(part))
        if n + (_TMP_EXTRA if part == out.name else 0) > limit:
            raise OutputPathError(f"--out {str(out)[:80]}...: the name {part[:40]}... is {n} "
                                  f"bytes; the file system allows {limit} per name (less "
                                  f"{_TMP_EXTRA} for the temporary file): choose a shorter one")
    if len(os.fsencode(str(out.absolute()))) + _TMP_EXTRA > 4000:
        raise OutputPathError(f"--out {str(out)[:80]}...: the path is longer than the file "
                              f"system allows (4096 bytes): choose a shorter one")


def check_output_path(out: str | Path, inputs: Iterable[str | Path] = (), kind: str = "file",
                      names: Iterable[str] = (), option: str = "--out") -> Path:
    """Validate an output path before the work that produces it; create its folder.

    Parameters
    ----------
    out
        The ``--out`` path.
    inputs
        Files and folders the command reads (a folder stands for everything under it): ``out``
        may not be one of them, lie inside one, or be a hard link of one of their files; for
        ``kind="dir"``, none of the files it writes (``names``) may be, or hold, an input.
        Compared by resolved path (symbolic links, ``..``) and by inode.
    kind
        ``"file"`` (one file is written at ``out``) or ``"dir"`` (a folder of files).
    names
        For ``kind="dir"``: names of the files written inside ``out``.
    option
        The option named in messages (``--out``, ``--export``).

    Returns
    -------
    Path
        ``out``; for ``kind="dir"`` the folder exists afterwards, for ``"file"`` its parent does.

    Raises
    ------
    OutputPathError
        Naming the path and the reason (an input, a folder where a file is needed or the reverse,
        a parent that is a file, a system folder, a special file, a name too long, not writable).
    """
    if kind not in ("file", "dir"):
        raise ValueError(f"kind must be 'file' or 'dir', got {kind!r}")
    out = Path(out)
    if not str(out).strip():
        raise OutputPathError(f"{option} is empty")
    _check_name_lengths(out)
    try:
        resolved = out.resolve()
    except (OSError, RuntimeError) as exc:
        raise OutputPathError(f"{option} {out}: {os_error_text(exc, out)}") from None
    for sysdir in SYSTEM_FOLDERS:
        if resolved == Path(sysdir) or Path(sysdir) in resolved.parents:
            raise OutputPathError(f"{option} {out}: lies in the system folder {sysdir}, no "
                                  f"place for results; choose a path in your own folders")
    if out.exists() and not (out.is_file() or out.is_dir()):
        raise OutputPathError(f"{option} {out}: is a special file (FIFO, device or socket), "
                              f"not a regular file or folder; choose another path")
    ins = [Path(p) for p in inputs if p is not None and str(p).strip()]
    for p in ins:
        if _same(out, p):
            raise OutputPathError(f"{option} {out} is an input of this command ({p}); refusing "
                                  f"to overwrite it (choose another path)")
        if _inside(out, p):
            raise OutputPathError(f"{option} {out} lies inside the input {p}; refusing to write "
                                  f"into what this command reads (choose another path)")
    linked = _hardlinked_input(out, ins)
    if linked is not None:
        raise OutputPathError(f"{option} {out} is a hard link of the input {linked}; refusing to "
                              f"overwrite it (choose another path)")
    if kind == "dir":
        for name in names:
            target = out / name
            for p in ins:
                if _same(target, p) or _inside(p, target):
                    raise OutputPathError(f"{option} {out} would overwrite the input {p}; "
                                          f"choose another folder")
    # the first existing ancestor must be a folder
    parent = out if kind == "dir" else out.parent
    anc = parent
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    if anc.exists() and not anc.is_dir():
        raise OutputPathError(f"{option} {out}: {anc} is a file, not a folder")
    if kind == "file" and out.is_dir():
        raise OutputPathError(f"{option} {out} is an existing folder; give a file path")
    if kind == "dir" and out.exists() and not out.is_dir():
        raise OutputPathError(f"{option} {out} is an existing file; give a folder path")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputPathError(f"{option} {out}: cannot create folder "
                              f"{os_error_text(exc, parent)}") from None
    try:
        probe_writable(parent)
    except OSError as exc:
        raise OutputPathError(f"{option} {out}: folder {os_error_text(exc, parent)}") from None
    if kind == "file" and out.is_file() and not out.stat().st_mode & 0o222:
        raise OutputPathError(f"{option} {out}: the existing file is read-only; make it "
                              f"writable (chmod u+w) or choose another path")
    return out


def probe_writable(folder: str | Path) -> None:
    """Create and remove a file in ``folder``: a real write, not :func:`os.access` (root passes
    ``access()`` on folders it cannot write to, e.g. on a read-only file system).

    Raises
    ------
    OSError
        When no file can be created there.
    """
    fd, probe = tempfile.mkstemp(prefix=".bayes_latency.probe.", dir=folder)
    os.close(fd)
    os.unlink(probe)


def _remove(path: Path) -> None:
    """Remove a file, link or folder tree; a missing one is fine."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path next to ``path``; moved onto ``path`` when the block ends without error.

    Works for files and for folders (e.g. zarr stores): an existing folder at ``path`` is removed
    just before the move. On error (also an interrupt) the temporary file is removed and
    ``path`` is untouched; an :class:`OSError` of the write (no space left, file-size limit, not
    writable) becomes an :class:`OutputWriteError` naming ``path``.
    """
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=f".tmp{path.suffix}",
                                   dir=path.parent)
    except OSError as exc:
        raise OutputWriteError(f"cannot write {os_error_text(exc, path)}") from None
    os.close(fd)
    os.unlink(tmp)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        _check_interrupted()
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        os.replace(tmp_path, path)
    except OSError as exc:
        _remove(tmp_path)
        raise OutputWriteError(f"cannot write {os_error_text(exc, path)}; nothing written "
                               f"there") from None
    except BaseException:
        _remove(tmp_path)
        raise
    _WRITTEN.append(path)


def atomic_write(path: str | Path, writer: Callable[[Path], Any]) -> Path:
    """Call ``writer(tmp)`` to write a temporary file, then move it onto ``path`` atomically."""
    path = Path(path)
    with atomic_path(path) as tmp:
        writer(tmp)
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_bytes(path: str | Path, data: bytes | memoryview) -> Path:
    """Write ``data`` to ``path`` with plain writes, flushed to disk (``fsync``).

    Libraries that write files through their own C layers (HDF5) can crash the process when the
    disk fills up under them; building the file in memory and writing its bytes here turns a
    full disk or a file-size limit into an :class:`OSError` like any other.
    """
    path = Path(path)
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    return path


def write_netcdf(obj: Any, path: str | Path, **kwargs: Any) -> Path:
    """``obj.to_netcdf(path, engine="h5netcdf", **kwargs)`` (a Dataset or DataTree) built in
    memory, then written with :func:`write_bytes`."""
    return write_bytes(path, _netcdf_bytes(obj, **kwargs))


def _netcdf_bytes(obj: Any, **kwargs: Any) -> bytes:
    """The netCDF file of ``obj`` as bytes (HDF5 on an in-memory buffer, closed here: no HDF5
    object outlives the buffer, also when the write that follows fails)."""
    import io as _io

    with _io.BytesIO() as buf:
        obj.to_netcdf(buf, engine="h5netcdf", **kwargs)
        return buf.getvalue()


#: Prefix of the staging folders of :func:`staged_folder` (``<prefix><pid>.<random>``).
STAGE_PREFIX = ".bayes_latency.stage."


def _clear_dead_stages(out: Path) -> None:
    """Remove staging folders in ``out`` left by processes that no longer run (killed)."""
    with contextlib.suppress(OSError):
        for p in out.iterdir():
            if not (p.name.startswith(STAGE_PREFIX) and p.is_dir()):
                continue
            pid = p.name[len(STAGE_PREFIX):].split(".")[0]
            if pid.isdigit() and not _pid_alive(int(pid)):
                shutil.rmtree(p, ignore_errors=True)


@contextlib.contextmanager
def staged_folder(out: str | Path, owned: Iterable[str], last: Iterable[str] = ()
                  ) -> Iterator[Path]:
    """A fresh staging folder whose files become the contents of ``out`` when the block ends.

    The command writes every output into the staging folder (inside ``out``, so on the same
    file system). When the block ends without error, the names in ``last`` (a manifest) are
    removed from ``out`` first, then every name of ``owned`` that this run did not write (a
    ``findings.json`` of an earlier run), then each staged entry is moved into ``out``
    (replacing the earlier one) and ``last`` at the end: ``out`` holds one run's outputs, never
    a mix. Files in ``out`` that the command does not own are kept. On error or interrupt the
    staging folder is removed and ``out`` is untouched.

    Yields
    ------
    Path
        The staging folder.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _clear_dead_stages(out)
    try:
        stage = Path(tempfile.mkdtemp(prefix=f"{STAGE_PREFIX}{os.getpid()}.", dir=out))
    except OSError as exc:
        raise OutputWriteError(f"cannot write {os_error_text(exc, out)}") from None
    n_written = len(_WRITTEN)
    try:
        yield stage
        _check_interrupted()
        last = list(last)
        owned = set(owned)
        for name in last:
            _remove(out / name)
        made = {p.name for p in stage.iterdir()}
        for name in sorted(owned - made):
            _remove(out / name)
        for name in sorted(made - set(last)) + [n for n in last if n in made]:
            target = out / name
            if target.exists() or target.is_symlink():
                _remove(target)
            os.replace(stage / name, target)
        stage.rmdir()
    except OSError as exc:
        shutil.rmtree(stage, ignore_errors=True)
        del _WRITTEN[n_written:]
        raise OutputWriteError(f"cannot write {os_error_text(exc)}; the outputs of this run "
                               f"were not moved into {out}") from None
    except OutputPathError as exc:  # name the output, not the staging folder
        shutil.rmtree(stage, ignore_errors=True)
        del _WRITTEN[n_written:]
        msg = str(exc).replace(str(stage), str(out))
        if msg == str(exc):
            raise
        raise type(exc)(msg) from None
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        del _WRITTEN[n_written:]
        raise
    del _WRITTEN[n_written:]
    _WRITTEN.append(out)


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


#: A lock file without a readable ``pid host`` line older than this (seconds) is taken over:
#: its writer died between creating and filling it, or it is not a lock of this package.
GARBAGE_LOCK_AGE_S = 10.0


@contextlib.contextmanager
def folder_lock(folder: str | Path, what: str = "write",
                name: str = ".bayes_latency.lock") -> Iterator[list[str]]:
    """Hold ``folder/name`` while the block writes ``folder``; refuse a folder another run holds.

    The lock file is created atomically (``O_CREAT | O_EXCL``) and holds ``pid host``; it is
    removed when the block ends (also on error, interrupt or termination). A lock left by a
    process of this host that no longer runs (killed) is taken over, with a note naming its
    process; so is a lock file without a ``pid host`` line that is older than
    :data:`GARBAGE_LOCK_AGE_S` (or dated in the future: a clock set back). A lock of a running
    process, or of another host (its process cannot be checked from here), is refused.

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
                age = time.time() - path.stat().st_mtime
            except OSError:
                owner, age = [], 0.0
            valid = len(owner) == 2 and owner[0].isdigit()
            pid = int(owner[0]) if valid else -1
            other_host = owner[1] if valid else host
            stale = None
            if not valid and (age > GARBAGE_LOCK_AGE_S or age < -1.0):
                stale = (f"took over the lock file {path}, which holds no process id (left by "
                         f"a process that died while creating it, or not a lock of this "
                         f"package)")
            elif valid and other_host == host and not _pid_alive(pid):
                stale = (f"took over the stale lock {path} of process {pid}, which no longer "
                         f"runs (killed?)")
            if attempt == 0 and stale is not None:
                notes.append(stale)
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                continue
            who = (f"process {pid}" if valid else "an unknown process") \
                + ("" if other_host == host else f" on host {other_host}")
            raise OutputPathError(
                f"--out {folder}: another run ({who}) is writing this folder ({path} exists); "
                f"wait for it to finish, or remove {path} if it is not running") from None
        except OSError as exc:
            raise OutputWriteError(f"--out {folder}: cannot create the lock file "
                                   f"{os_error_text(exc, path)}") from None
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(me)
        except OSError as exc:
            with contextlib.suppress(OSError):
                path.unlink()
            raise OutputWriteError(f"--out {folder}: cannot write the lock file "
                                   f"{os_error_text(exc, path)}") from None
        break
    try:
        yield notes
    finally:
        try:
            if path.read_text(encoding="utf-8") == me:
                path.unlink()
        except OSError:
            pass
