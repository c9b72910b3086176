"""Writing the analyses' outputs so that no reader ever sees a partial file: write a temporary file next to the
target, then ``os.replace`` it (atomic on POSIX and Windows within one folder)."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from typing import BinaryIO

__all__ = ["atomic_open", "temporary_path"]


def temporary_path(path: str) -> str:
    """A new hidden name in ``path``'s folder (``.NAME.<random>.tmp``), for a file to be renamed onto ``path``."""
    directory, name = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{name}.{uuid.uuid4().hex[:12]}.tmp")


@contextlib.contextmanager
def atomic_open(path: str) -> Iterator[BinaryIO]:
    """A binary file that appears at ``path`` only when the ``with`` block ends without an error; an error
    removes it and leaves ``path`` as it was. The folder must exist."""
    temporary = temporary_path(path)
    try:
        with open(temporary, "xb") as file:
            yield file
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
