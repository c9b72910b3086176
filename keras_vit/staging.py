"""Staging folders ``PARENT/<prefix><12 hex>.tmp`` that hold their owner's record (``.owner``), written first, so
that a later run can remove those a killed run left; anything else is kept. See docs/faults.md."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import socket
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

__all__ = ["OWNER", "new_staging", "remove_stale", "staging_folder"]

OWNER = ".owner"  # the record inside a staging folder: {"pid": ..., "host": ..., "started": ..., "pids": ...}
_RECORD_BYTES = 4096  # more than a record ever holds: a longer file is not one


def _start_time(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, Linux's ``/proc/PID/stat``); None where not known."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            return file.read().rpartition(b")")[2].split()[19].decode()  # field 22; the name before ")" is free text
    except (OSError, IndexError, ValueError):
        return None


def _pid_namespace() -> str | None:
    """This process's PID namespace (Linux; a container has its own): process ids are only compared within one."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _alive(pid: int, started: str | None) -> bool:
    """Whether the process that wrote a record (``pid``, ``started``) still runs on this host: a live process of
    that id that started at another time took over a freed id."""
    try:
        os.kill(pid, 0)  # no signal is sent: only whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process
    return started is None or _start_time(pid) in (None, started)


def _record(folder: str) -> dict | None:
    """The owner record of ``folder``; None when it has none or it is not one (a link, damaged, too long)."""
    try:
        fd = os.open(os.path.join(folder, OWNER), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as file:
        data = file.read(_RECORD_BYTES + 1) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    try:
        record = json.loads(data) if 0 < len(data) <= _RECORD_BYTES else None
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict):
        return None
    pid, host = record.get("pid"), record.get("host")
    texts = all(isinstance(record.get(key), (str, type(None))) for key in ("started", "pids"))
    return record if type(pid) is int and 0 < pid < 2**31 and isinstance(host, str) and texts else None


def _stale(entry: os.DirEntry[str], pattern: re.Pattern[str]) -> bool:
    """Whether ``entry`` is a staging folder of ``pattern``'s name, this user's, with a record whose owner is gone
    from this host and PID namespace. Never on a system without POSIX signals (``os.kill(pid, 0)`` would end the
    process there)."""
    if os.name != "posix" or not pattern.fullmatch(entry.name) or not entry.is_dir(follow_symlinks=False):
        return False
    try:
        if entry.stat(follow_symlinks=False).st_uid != os.getuid():
            return False
    except OSError:  # gone meanwhile
        return False
    record = _record(entry.path)
    if record is None or (record["host"], record.get("pids")) != (socket.gethostname(), _pid_namespace()):
        return False
    return not _alive(record["pid"], record.get("started"))


def remove_stale(parent: str | os.PathLike, prefix: str) -> list[str]:
    """Remove the staging folders of ``prefix`` in ``parent`` whose owner is gone from this host (a killed run's);
    returns their paths. Anything else is kept; a folder that cannot be read or removed is left as it is."""
    pattern = re.compile(re.escape(prefix) + r"[0-9a-f]{12}\.tmp")
    try:
        with os.scandir(os.fspath(parent)) as listing:
            entries = list(listing)
    except OSError:
        return []
    stale = [entry.path for entry in entries if _stale(entry, pattern)]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


def new_staging(parent: str | os.PathLike, prefix: str) -> Path:
    """A new staging folder ``parent/<prefix><12 hex>.tmp`` (mode 0700) holding this process's record, after the
    stale ones of ``prefix`` were removed (:func:`remove_stale`). An ``OSError`` naming ``parent`` when the folder
    cannot be made there (missing, read-only)."""
    remove_stale(parent, prefix)
    path = Path(parent, f"{prefix}{uuid.uuid4().hex[:12]}.tmp")
    try:
        os.mkdir(path, 0o700)
    except OSError as error:  # named as the caller gave the folder, not by the staging folder's name
        why = "No such folder to write into" if error.errno == errno.ENOENT else error.strerror
        raise OSError(error.errno, why, os.fspath(parent)) from None
    try:
        with open(path / OWNER, "x") as file:
            pid = os.getpid()
            json.dump(
                {"pid": pid, "host": socket.gethostname(), "started": _start_time(pid), "pids": _pid_namespace()}, file
            )
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    return path


@contextlib.contextmanager
def staging_folder(parent: str | os.PathLike, prefix: str) -> Iterator[Path]:
    """A :func:`new_staging` folder, removed with what is left in it when the ``with`` block ends (move what is
    complete out of it first)."""
    path = new_staging(parent, prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
