"""Files that appear whole or not at all: each is written under a temporary name beside its target, then
``os.replace``-d onto it (atomic within one folder on POSIX and Windows). A reader, a resumed run or a cache
check never sees a partial file; a failure, or a process killed half-way, leaves the target as it was and at
most a temporary file (``.NAME.<random>.tmp.EXT``) that :func:`temporary_target` recognises."""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from collections.abc import Iterator
from typing import IO

__all__ = ["atomic_open", "atomic_path", "temporary_path", "temporary_target"]

_TEMPORARY = re.compile(r"\.(?P<stem>.+)\.[0-9a-f]{12}\.tmp(?P<suffix>(\.[^.]*)?)")


def temporary_path(path: str | os.PathLike) -> str:
    """A new hidden name in ``path``'s folder, with ``path``'s extension (writers such as ``Model.save`` and
    ``savefig`` choose the format by it): ``folder/model.keras`` -> ``folder/.model.<random>.tmp.keras``."""
    directory, name = os.path.split(os.path.abspath(path))
    stem, suffix = os.path.splitext(name)
    return os.path.join(directory, f".{stem}.{uuid.uuid4().hex[:12]}.tmp{suffix}")


def temporary_target(name: str) -> str | None:
    """The name of the file that the :func:`temporary_path` named ``name`` was to become; None when ``name`` is
    not one."""
    match = _TEMPORARY.fullmatch(name)
    return match["stem"] + match["suffix"] if match else None


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, durable: bool = False) -> Iterator[str]:
    """A temporary path to write, renamed onto ``path`` when the ``with`` block ends without an error; an error
    removes it and leaves ``path`` as it was. ``durable``: flush the file to the disk before the rename (for a
    file a crash must not lose, such as a checkpoint). The folder must exist."""
    temporary = temporary_path(path)
    try:
        yield temporary
        if durable:
            with open(temporary, "r+b") as file:
                os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb", *, durable: bool = False) -> Iterator[IO]:
    """A new file opened in ``mode`` (``"wb"`` or ``"w"``, UTF-8) that appears at ``path`` only when the
    ``with`` block ends without an error (:func:`atomic_path`)."""
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_open writes a new file: mode 'wb' or 'w', not {mode!r}")
    new, encoding = mode.replace("w", "x"), None if "b" in mode else "utf-8"
    with atomic_path(path, durable=durable) as temporary, open(temporary, new, encoding=encoding) as file:
        yield file
