"""What a fit shows while it samples: a progress bar (nutpie's or tqdm's), one line per
checkpoint on stderr, or nothing (:func:`progress_mode`, :class:`_Progress`).

Importing this module is light (no PyMC, nutpie or tqdm).
"""

from __future__ import annotations

import sys
import time

PROGRESS_MODES = ("bar", "lines", "none")


def _in_notebook() -> bool:
    """Whether the code runs in a Jupyter kernel (nutpie's own test)."""
    try:
        from nutpie.sample import in_notebook
    except ImportError:  # pragma: no cover - nutpie is a dependency
        return False
    return bool(in_notebook())


def progress_mode(progress: bool | str) -> str:
    """The progress display of a fit: ``"bar"``, ``"lines"`` or ``"none"``.

    ``True`` picks for the place the fit runs in: a bar in a notebook or when stderr is a
    terminal, else ``"lines"`` (one line on stderr per checkpoint and at the end, so a fit piped
    to a file or run by a job scheduler is not silent for minutes); ``False`` is ``"none"``; a
    mode name is taken as it is.
    """
    if isinstance(progress, str):
        if progress not in PROGRESS_MODES:
            from bayes_latency.errors import ConfigError

            raise ConfigError(f"progress={progress!r}: expected True, False or one of "
                              f"{PROGRESS_MODES}")
        return progress
    if not progress:
        return "none"
    return "bar" if _in_notebook() or sys.stderr.isatty() else "lines"


class _Progress:
    """Progress of nutpie's chains, read from its progress callback by :func:`_sample_until`.

    ``"bar"``: a tqdm bar (a widget in a notebook) whose total is the tuning steps plus the draws
    up to the next checkpoint: it grows by a checkpoint's step only when the gates fail there, so
    its total and remaining time are those of what will run. ``"lines"``: one line on stderr when
    tuning ends, at each checkpoint and at the end. ``"none"``: nothing.
    """

    def __init__(self, mode: str, tune: int, draws: int, chains: int,
                 max_draws: int | None = None) -> None:
        self.mode, self.tune, self.target, self.chains = mode, tune, draws, chains
        self.t0 = time.perf_counter()
        self.tuned = False
        self.n = 0  # iterations of the slowest chain so far
        self.bar = None
        if mode == "bar":
            from tqdm.auto import tqdm

            size: dict = {}
            if not _in_notebook():  # a terminal that reports no size (0 x 0) gets 80 x 24
                import shutil

                cols, rows = shutil.get_terminal_size()
                size = {"ncols": cols, "nrows": rows}
            self.bar = tqdm(total=tune + draws, unit="it", file=sys.stderr, smoothing=0.05,
                            desc=f"sampling ({chains} chains, tuning)", **size)
        elif mode == "lines":
            more = (f" (up to {max_draws} while the convergence gates fail)"
                    if max_draws and max_draws > draws else "")
            self.line(f"{chains} chains, {tune} tuning steps then {draws} draws each{more}")

    def elapsed(self) -> str:
        return f"{time.perf_counter() - self.t0:.0f} s"

    def update(self, done: list[tuple[int, bool]] | None) -> None:
        """``done``: (iterations finished, still tuning) of each chain."""
        if not done:
            return
        n = self.n = min(d for d, _ in done)
        if not self.tuned and all(not tuning for _, tuning in done):
            self.tuned = True
            if self.mode == "lines":
                self.line(f"tuning done ({self.tune} steps per chain), {self.elapsed()}")
            elif self.bar is not None:
                self.bar.set_description(f"sampling ({self.chains} chains)")
        if self.bar is not None:
            self.bar.n = min(n, self.bar.total)
            self.bar.refresh()

    def checkpoint(self, n: int, decision: str, next_n: int | None) -> None:
        """The gates' ``decision`` at ``n`` draws per chain; ``next_n``: the next checkpoint."""
        if decision == "continue" and next_n is not None:
            text = f"convergence gates fail, on to {next_n}"
            self.target = next_n
            if self.bar is not None:
                self.bar.total = self.tune + next_n
                self.bar.n = min(self.n, self.bar.total)  # chains may have run ahead
                self.bar.set_description(f"sampling (gates failed at {n}, on to {next_n})")
                self.bar.refresh()
        elif decision == "pass":
            text = "convergence gates pass"
            if self.bar is not None:
                self.bar.set_description(f"sampling (gates pass at {n})")
        elif decision == "max_draws":
            text = "the most draws per chain (max_draws)"
        else:
            text = f"stopping: {decision}"
        if self.mode == "lines":
            self.line(f"{n} draws per chain, {self.elapsed()}: {text}")

    def done(self, n: int) -> None:
        if self.bar is not None:
            self.bar.n = self.bar.total = self.tune + n
            self.bar.refresh()
            self.bar.close()
        elif self.mode == "lines":
            self.line(f"done, {n} draws per chain in {self.elapsed()}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    @staticmethod
    def line(text: str) -> None:
        print(f"sampling: {text}", file=sys.stderr, flush=True)
