"""The sha256 record of each cached file: a ``<file>.sha256`` sidecar (``sha256sum`` format), written atomically
when the file enters the cache and checked on every later read. A cached file is ``OK`` (matches its record),
``corrupt`` (differs from its record or the catalogue's sha256, or fails the structural check) or ``unrecorded``
(no record, or a damaged one, and it passed the structural check; a fetch records it again)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from keras_vit.files import atomic_open

from .errors import CorruptCheckpointError

__all__ = [
    "CORRUPT",
    "OK",
    "UNRECORDED",
    "FileCheck",
    "check_file",
    "ensure_intact",
    "record",
    "record_path",
    "recorded",
    "sha256sum",
]

OK, CORRUPT, UNRECORDED = "OK", "corrupt", "unrecorded"
CHUNK = 1 << 20
Validator = Callable[[Path], None]


def sha256sum(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def record_path(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path.with_name(path.name + ".sha256")


def record(path: str | os.PathLike, digest: str) -> None:
    """Write ``path``'s sidecar atomically (a killed writer's leftovers: removed by the next record there)."""
    with atomic_open(record_path(path), "w", owned=True) as file:
        file.write(f"{digest}  {Path(path).name}\n")


def recorded(path: str | os.PathLike) -> str | None:
    """The sha256 recorded for ``path``; None when there is no record, "" when the record is unreadable."""
    try:
        text = record_path(path).read_text()
    except FileNotFoundError:
        return None
    match = re.match(r"([0-9a-f]{64})\s", text)
    return match.group(1) if match else ""


class FileCheck(NamedTuple):
    status: str  # OK, CORRUPT or UNRECORDED
    detail: str  # why, for people
    sha256: str  # the file's actual hash


def check_file(path: str | os.PathLike, *, sha256: str | None = None, validate: Validator | None = None) -> FileCheck:
    """The status of a cached file: ``OK``, ``CORRUPT`` or ``UNRECORDED``, see the module's docstring.

    ``sha256``: the catalogue's hash when known; ``validate(path)`` raises ``CorruptCheckpointError`` (run on
    unrecorded files only: a recorded file passed it before its hash was recorded).
    """
    path = Path(path)
    expected = recorded(path)
    actual = sha256sum(path)
    if sha256 is not None and actual != sha256.lower():
        return FileCheck(CORRUPT, f"sha256 {actual}, the catalogue says {sha256}", actual)
    unrecorded = "no sha256 recorded"
    if expected == "":  # the record is damaged, not necessarily the file: check the file as if unrecorded
        expected, unrecorded = None, f"its record {record_path(path)} is damaged (not a sha256 line)"
    if expected is not None:
        if actual != expected:
            return FileCheck(CORRUPT, f"sha256 {actual}, recorded when it was downloaded: {expected}", actual)
        return FileCheck(OK, f"sha256 {actual}", actual)
    if validate is not None:
        try:
            validate(path)
        except CorruptCheckpointError as exc:
            return FileCheck(CORRUPT, f"{exc}; {unrecorded}", actual)
    return FileCheck(UNRECORDED, unrecorded + (", structure OK" if validate is not None else ""), actual)


def ensure_intact(path: str | os.PathLike, *, sha256: str | None = None, validate: Validator | None = None) -> Path:
    """``path`` when :func:`check_file` finds it OK; an unrecorded file that passes is recorded (where the folder
    is writable). A corrupt file is a ``CorruptCheckpointError`` naming it; it is left in place."""
    path = Path(path)
    check = check_file(path, sha256=sha256, validate=validate)
    if check.status == CORRUPT:
        raise CorruptCheckpointError(
            f"The cached file {path} is corrupt ({check.detail}). Delete it to download it again: rm '{path}'"
        )
    if check.status == UNRECORDED:
        with contextlib.suppress(OSError):  # a read-only cache: nothing to record, the file is still good
            record(path, check.sha256)
    return path
