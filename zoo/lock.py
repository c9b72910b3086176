"""An exclusive lock file shared by threads and processes (``fcntl.flock``; no locking where there is no fcntl)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

from keras_vit.files import still_linked

from .errors import DownloadError

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; concurrent downloads of one file may then collide
    fcntl = None  # type: ignore[assignment]

__all__ = ["file_lock"]

POLL = 0.05


def _try_lock(fd: int) -> bool:
    if fcntl is None:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def file_lock(path: str | os.PathLike, end: float | None = None) -> Iterator[None]:
    """Hold ``path`` (created, and removed on release) exclusively; wait for it at most until ``time.monotonic()``
    reaches ``end``, then raise a ``DownloadError``. ``OSError`` when the file cannot be created."""
    path = Path(path)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        try:
            while not _try_lock(fd):
                if end is not None and time.monotonic() >= end:
                    raise DownloadError(f"Gave up waiting for {path}: another download of the file holds it.")
                time.sleep(POLL)
        except BaseException:
            os.close(fd)
            raise
        if still_linked(fd, path):
            break
        os.close(fd)  # we locked a file the previous holder had already removed: lock the new one
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)
