"""Files that appear whole or not at all: written under a temporary name beside the target (``.NAME.<random>.tmp.EXT``,
or inside a staging folder that records its writer), then ``os.replace``-d onto it; a folder the same way. See
docs/faults.md."""

from __future__ import annotations

import contextlib
import errno
import json
import lzma
import math
import os
import re
import shutil
import stat
import struct
import uuid
import zipfile
import zlib
from collections.abc import Callable, Iterator
from typing import IO, TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "OWNED_STAGING",
    "atomic_open",
    "atomic_path",
    "finite_json",
    "naming",
    "npz_arrays",
    "open_regular",
    "open_zip",
    "still_linked",
    "temporary_path",
    "temporary_target",
    "write_json",
]

# What zipfile (and the zlib, lzma, bz2 and numpy readers under it) raise for a damaged archive: a bit flipped in
# its directory gives BadZipFile, NotImplementedError ("zip file version 17.3"), ValueError, EOFError,
# OverflowError, struct.error; a member cut or flipped gives zlib.error, lzma.LZMAError, OSError (bz2), RuntimeError
# (flagged encrypted). MemoryError is not one: a member's header is checked before numpy allocates it.
ZIP_FAULTS = (
    zipfile.BadZipFile,
    NotImplementedError,
    ValueError,
    EOFError,
    OverflowError,
    struct.error,
    zlib.error,
    lzma.LZMAError,
    OSError,
    RuntimeError,
    IndexError,
)
# The staging folders of atomic_path(owned=True): the library's writers called from Python (exports, timm files,
# presets, figures) and the zoo cache's records, which no run's lock cleans up after.
OWNED_STAGING = ".keras_vit-write-"
_STEM = r"\.*[^.]*"  # a name up to its extensions, which are all kept: "vit.weights.h5" -> "vit", ".weights.h5"
_TEMPORARY = re.compile(rf"\.(?P<stem>{_STEM})\.[0-9a-f]{{12}}\.tmp(?P<suffix>(\..*)?)")


def temporary_path(path: str | os.PathLike) -> str:
    """A new hidden name in ``path``'s folder, with all of ``path``'s extensions (writers such as
    ``Model.save_weights`` and ``savefig`` check or choose the format by them): ``folder/vit.weights.h5`` ->
    ``folder/.vit.<random>.tmp.weights.h5``."""
    directory, name = os.path.split(os.path.abspath(path))
    stem = cast(re.Match[str], re.match(_STEM, name))[0]  # the pattern matches every name, if only its empty start
    return os.path.join(directory, f".{stem}.{uuid.uuid4().hex[:12]}.tmp{name[len(stem) :]}")


def temporary_target(name: str) -> str | None:
    """The name of the file that the :func:`temporary_path` named ``name`` was to become; None when ``name`` is
    not one."""
    match = _TEMPORARY.fullmatch(name)
    return match["stem"] + match["suffix"] if match else None


@contextlib.contextmanager
def naming(path: str | os.PathLike, temporary: str | None = None) -> Iterator[None]:
    """Name ``path`` in an ``OSError`` that names no file (or only ``temporary``, the name it is written under): a
    write to an open file that fails (a full disk, ``[Errno 28]``; a file over the size limit, ``[Errno 27]``) says
    which file it was writing."""
    try:
        yield
    except OSError as error:
        if error.errno is None or error.filename not in (None, temporary):
            raise
        raise OSError(error.errno, f"{error.strerror} while writing", os.fspath(path)) from error


def _umask() -> int:
    """The process's umask, read without changing it where Linux shows it (``/proc/self/status``)."""
    with contextlib.suppress(OSError), open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, durable: bool = False, owned: bool = False) -> Iterator[str]:
    """A temporary path for a file or new folder, renamed onto ``path`` when the ``with`` block ends without an error
    (an error removes it). ``durable``: flush to disk before the rename. ``owned``: the temporary lives in a staging
    folder beside ``path`` that records this process (:data:`OWNED_STAGING`, :mod:`keras_vit.staging`), so that what
    a writer killed half-way leaves is removed by the next owned write there. A file gets the umask's mode; the
    parent must exist, and a folder is renamed only onto a path that does not exist yet."""
    if not owned:
        with _renamed_onto(path, temporary_path(path), durable) as temporary:
            yield temporary
        return
    from keras_vit.staging import staging_folder

    with (
        staging_folder(os.path.dirname(os.path.abspath(path)), OWNED_STAGING) as folder,
        _renamed_onto(path, os.path.join(folder, os.path.basename(temporary_path(path))), durable) as temporary,
    ):
        yield temporary


@contextlib.contextmanager
def _renamed_onto(path: str | os.PathLike, temporary: str, durable: bool) -> Iterator[str]:
    """:func:`atomic_path` with its temporary name chosen."""
    if not os.path.isdir(os.path.dirname(temporary)):  # named as the user gave it, not by the temporary name
        raise FileNotFoundError(errno.ENOENT, "No such folder to write into", os.path.dirname(temporary))
    try:
        with naming(path, temporary):  # a full disk: the error names the file being written, which stays as it was
            yield temporary
            if os.path.isfile(temporary) and not os.path.islink(temporary):
                os.chmod(temporary, 0o666 & ~_umask())  # a writer's private 0600 file becomes a normal output
            if durable:
                with open(temporary, "r+b") as file:
                    os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.isdir(temporary) and not os.path.islink(temporary):
            shutil.rmtree(temporary, ignore_errors=True)  # the writer's new folder, under this call's own name
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            os.unlink(temporary)
        raise


@contextlib.contextmanager
def atomic_open(
    path: str | os.PathLike, mode: str = "wb", *, durable: bool = False, owned: bool = False
) -> Iterator[IO]:
    """A new file opened in ``mode`` (``"wb"`` or ``"w"``, UTF-8) that appears at ``path`` only when the
    ``with`` block ends without an error (:func:`atomic_path`, with ``durable`` and ``owned``)."""
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_open writes a new file: mode 'wb' or 'w', not {mode!r}")
    new, encoding = mode.replace("w", "x"), None if "b" in mode else "utf-8"
    with atomic_path(path, durable=durable, owned=owned) as temporary, open(temporary, new, encoding=encoding) as file:
        yield file


def open_regular(path: str | os.PathLike, mode: str = "xb") -> IO[bytes]:
    """``path`` opened without following a link (``O_NOFOLLOW``): ``"xb"`` a new file, ``"ab"`` an existing
    regular file to append to. Raises ``OSError`` naming ``path`` when it is a link or not a regular file."""
    flags = {"xb": os.O_CREAT | os.O_EXCL, "ab": os.O_APPEND}[mode] | os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags | getattr(os, "O_NONBLOCK", 0), 0o644)
    except OSError as error:
        if error.errno == errno.ELOOP or os.path.islink(path):
            raise OSError(errno.ELOOP, "is a symbolic link: not written through", os.fspath(path)) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "is not a regular file: not written", os.fspath(path))
    os.set_blocking(fd, True)
    return os.fdopen(fd, mode.replace("x", "w"))


def still_linked(fd: int, path: str | os.PathLike) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (a lock file its holder removed on release does not)."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def finite_json(value: Any) -> Any:
    """``value`` with NaN and infinite floats (also inside lists and dicts) replaced by ``None``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


def write_json(path: str | os.PathLike, value: Any) -> None:
    """Write ``value`` as strict JSON (NaN and infinite floats as ``null``: ``allow_nan=False``), indented,
    atomically. Every JSON file the commands write goes through here."""
    with atomic_open(path, "w") as file:
        json.dump(finite_json(value), file, indent=2, allow_nan=False)


@contextlib.contextmanager
def open_zip(
    path: str | os.PathLike,
    error: Callable[[str], Exception] = ValueError,
    what: str = "a readable zip archive",
    hint: str = "",
    keep: tuple[type[Exception], ...] = (),
) -> Iterator[zipfile.ZipFile]:
    """The zip archive at ``path`` open for reading in the ``with`` block; every fault zipfile finds in it there,
    in its directory or a member the block reads (:data:`ZIP_FAULTS`), raised as one ``error`` "PATH is not WHAT
    (KIND: DETAIL)HINT". ``keep``: exception types the block raises itself, passed as they are. A file
    that cannot be opened is ``open``'s ``OSError``."""
    with open(path, "rb") as file:
        try:
            with zipfile.ZipFile(file) as archive:
                yield archive
        except keep:
            raise
        except ZIP_FAULTS as fault:
            raise error(f"{os.fspath(path)} is not {what} ({type(fault).__name__}: {fault}){hint}") from fault


def npz_arrays(archive: zipfile.ZipFile) -> dict[str, np.ndarray]:
    """Every member of an ``.npz`` archive (:func:`open_zip`'s) as numpy's ``np.load`` reads it, by its name without
    ``.npy``; a pickled member is a ``ValueError`` (``allow_pickle=False``)."""
    import numpy as np

    arrays = {}
    for info in archive.infolist():
        with archive.open(info) as member:
            arrays[info.filename.removesuffix(".npy")] = np.lib.format.read_array(member, allow_pickle=False)
    return arrays
