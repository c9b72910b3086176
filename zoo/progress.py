"""A one-line progress bar on stderr for downloads: ``[######------]  45%  12.3 / 27.1 MiB  5.2 MiB/s``."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["ProgressBar"]

MIB = 2**20


class ProgressBar:
    """A ``progress(done, total)`` callback for :func:`keras_vit.zoo.download.download` (``total`` None: unknown).

    Redraws at most every ``interval`` seconds; ends its line when ``done`` reaches ``total``. A ``done`` that
    goes down (a restarted transfer) restarts the rate. :meth:`end_line` ends a line left open (before an error).
    """

    _open: TextIO | None = None  # the stream whose last line is an unfinished bar, shared by all bars

    def __init__(self, label: str = "", stream: TextIO | None = None, width: int = 24, interval: float = 0.1):
        self.label, self.stream, self.width, self.interval = label, stream, width, interval
        self._start: tuple[float, int] | None = None
        self._done, self._drawn = 0, 0.0

    def __call__(self, done: int, total: int | None) -> None:
        now = time.monotonic()
        if self._start is None or done < self._done:
            self._start = (now, done)
        self._done = done
        finished = total is not None and done >= total
        if not finished and now - self._drawn < self.interval:
            return
        self._drawn = now
        seconds, first = self._start
        rate = (done - first) / max(now - seconds, 1e-6)
        if total:
            filled = min(self.width, self.width * done // total)
            text = f"[{'#' * filled}{'-' * (self.width - filled)}] {100 * done // total:3d}%  "
            text += f"{done / MIB:.1f} / {total / MIB:.1f} MiB"
        else:
            text = f"{done / MIB:.1f} MiB"
        line = f"{self.label + ' ' if self.label else ''}{text}  {rate / MIB:.1f} MiB/s"
        stream = self.stream or sys.stderr
        print(f"\r{line}", end="\n" if finished else "", file=stream, flush=True)
        ProgressBar._open = None if finished else stream

    @staticmethod
    def end_line() -> None:
        """End the line of a bar that stopped before it finished, so that what follows starts a line."""
        if ProgressBar._open is not None:
            print(file=ProgressBar._open, flush=True)
            ProgressBar._open = None
