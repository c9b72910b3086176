"""Structural checks of checkpoint files, reading no array: every zip archive from its declared members
(:func:`check_members`), a whole ``.npz`` (:func:`check_npz`), a ``.safetensors`` header. Faults: docs/faults.md."""

from __future__ import annotations

import contextlib
import io
import math
import os
import struct
import tokenize
import warnings
import zipfile
from typing import IO, TYPE_CHECKING, BinaryIO

from keras_vit.files import ZIP_FAULTS, open_zip

from .errors import CorruptCheckpointError

if TYPE_CHECKING:
    import numpy as np
    from typing_extensions import TypeIs

__all__ = [
    "MAX_MEMBER_BYTES",
    "MAX_MODEL_BYTES",
    "REQUIRED_KEYS",
    "check_archive",
    "check_members",
    "check_npz",
    "check_safetensors",
    "npz_shapes",
    "safetensors_shapes",
    "validator",
]

REQUIRED_KEYS = ("embedding/kernel", "Transformer/posembed_input/pos_embedding")
# What a member may unpack to. The largest published tensor, H/14's ImageNet-21k head (1280 x 21843 float32), is
# 112 MB; float weights compress by a few percent, so a large member that shrank 20-fold is zeros: a zip bomb.
MAX_MEMBER_BYTES = 1 << 30
# A saved Keras model holds all its weights in one member: H/14 with its ImageNet-21k head is 2.7 GB in float32.
MAX_MODEL_BYTES = 4 << 30
_UNSUPPORTED_FLAGS = 0x1 | 0x20 | 0x40  # encrypted, compressed patched data, strong encryption
_COMPRESSIONS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA)
_BOMB_RATIO, _BOMB_FROM = 20, 64 << 20
_END_RECORD = b"PK\x05\x06"  # the zip's end-of-central-directory record: 22 bytes and a comment
_BROKEN = (*ZIP_FAULTS, KeyError)  # what a damaged archive, or an .npy header in it, raises


def _check_ends_with_archive(f: IO[bytes], size: int) -> None:
    """The zip must end the file: a body longer than the archive (appended bytes) is not the file we asked for."""
    tail_size = min(size, 22 + 0xFFFF)
    f.seek(size - tail_size)
    tail = f.read(tail_size)
    at = tail.rfind(_END_RECORD)
    while at >= 0:
        if at + 22 <= len(tail) and at + 22 + int.from_bytes(tail[at + 20 : at + 22], "little") == len(tail):
            return
        at = tail.rfind(_END_RECORD, 0, at)
    if tail.lstrip()[:1] == b"<":
        raise CorruptCheckpointError("it is an HTML or XML page, not an .npz archive")
    f.seek(0)
    if f.read(2) == b"\x1f\x8b":
        raise CorruptCheckpointError("it is gzip-compressed data, not an .npz archive: decompress it first")
    raise CorruptCheckpointError("it does not end with a zip directory (truncated, or followed by other bytes)")


def _read_header(member: IO[bytes], name: str) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype from an ``.npy`` header: Python-literal text that numpy tokenizes and parses, so a
    damaged one can fail in many ways, each of them a corrupt file."""
    import numpy as np

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            version = np.lib.format.read_magic(member)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(member)
            elif version == (2, 0):
                shape, _, dtype = np.lib.format.read_array_header_2_0(member)
            else:
                raise CorruptCheckpointError(f"{name}: unsupported .npy version {version}")
    except (ValueError, SyntaxError, TypeError, tokenize.TokenError, RecursionError) as exc:
        raise CorruptCheckpointError(f"{name}: unreadable .npy header ({type(exc).__name__}: {exc})") from exc
    return shape, dtype


def check_members(archive: zipfile.ZipFile) -> None:
    """Refuse a zip archive (``.npz``, ``.keras``, zip-based ``.pth``) from what its directory declares, before any
    member is unpacked: two members of one name, an unknown compression or encryption, more packed bytes than the
    file holds, a member larger than any checkpoint's or compressed as no weights are (a zip bomb). An ``.npz``'s
    members must be plain ``.npy`` arrays of the size their headers state (pickled objects are refused).
    Raises ``CorruptCheckpointError``."""
    infos = archive.infolist()
    names = [info.filename for info in infos]
    if len(set(names)) != len(names):
        twice = sorted({name for name in names if names.count(name) > 1})
        raise CorruptCheckpointError(f"two members are named {twice[0]}: which one holds the weights is ambiguous")
    packed_total = sum(info.compress_size for info in infos)
    size = _archive_size(archive)
    if size is not None and packed_total > size:
        raise CorruptCheckpointError(f"its members declare {packed_total:,} packed bytes, the file has {size:,}")
    kind = _kind(names)
    for info in infos:
        _check_declared(info, MAX_MODEL_BYTES if kind == "keras" else MAX_MEMBER_BYTES)
    if kind == "npz":
        for info in infos:
            if not info.filename.endswith(".npy"):
                raise CorruptCheckpointError(f"{info.filename}: not an .npy array")
            try:
                _check_member(archive, info)
            except CorruptCheckpointError:
                raise
            except _BROKEN as exc:
                raise CorruptCheckpointError(f"{info.filename}: unreadable ({type(exc).__name__}: {exc})") from exc


def _archive_size(archive: zipfile.ZipFile) -> int | None:
    """The archive file's size in bytes; None when it cannot be told (a stream without ``seek``)."""
    fp = archive.fp
    if fp is None:  # a closed archive
        return None
    try:
        at = fp.tell()
        size = fp.seek(0, io.SEEK_END)
        fp.seek(at)
    except (AttributeError, OSError, ValueError):
        return None
    return size


def _kind(names: list[str]) -> str:
    """``"keras"`` (a saved Keras model), ``"torch"`` (``torch.save``'s zip) or ``"npz"`` (anything else)."""
    if "config.json" in names and any(name.endswith(".h5") for name in names):
        return "keras"
    if any(name.endswith("/data.pkl") for name in names):
        return "torch"
    return "npz"


def _check_declared(info: zipfile.ZipInfo, limit: int) -> None:
    """Refuse a member whose declared compression, encryption or sizes no checkpoint has."""
    if info.compress_type not in _COMPRESSIONS:
        raise CorruptCheckpointError(f"{info.filename}: unknown compression method {info.compress_type}")
    if info.flag_bits & _UNSUPPORTED_FLAGS:
        raise CorruptCheckpointError(f"{info.filename}: encrypted or patched (flags {info.flag_bits:#x})")
    unpacked, packed = info.file_size, max(info.compress_size, 1)
    what = "array" if limit == MAX_MEMBER_BYTES else "model"
    if unpacked > limit or (unpacked > _BOMB_FROM and unpacked > _BOMB_RATIO * packed):
        raise CorruptCheckpointError(
            f"{info.filename} would unpack to {unpacked:,} bytes from {packed:,}: no checkpoint {what} is that "
            f"large or compresses that well (limit {limit:,} bytes; a zip bomb?)"
        )


def _check_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> None:
    with archive.open(info) as member:
        shape, dtype = _read_header(member, info.filename)
        if dtype.hasobject:
            raise CorruptCheckpointError(
                f"{info.filename} holds pickled Python objects, not a plain array: keras-vit never unpickles a "
                "checkpoint (refused for safety)"
            )
        expected = member.tell() + math.prod(shape) * dtype.itemsize
    if expected != info.file_size:
        raise CorruptCheckpointError(
            f"{info.filename}: its header declares {expected:,} bytes (shape {shape}, {dtype}), the member holds "
            f"{info.file_size:,}"
        )


def _is_file(source: str | os.PathLike | BinaryIO) -> TypeIs[BinaryIO]:
    return hasattr(source, "read")


def check_npz(source: str | os.PathLike | BinaryIO, required: tuple[str, ...] = REQUIRED_KEYS) -> None:
    """Raise ``CorruptCheckpointError`` (naming ``source`` and the fault) unless it is a whole ``.npz`` checkpoint.

    ``source``: a path or a seekable binary file. Reads the data once (the CRC check) and allocates no array;
    a path that cannot be opened is an ``OSError`` as usual, not a verdict on its bytes.
    """
    label = str(getattr(source, "name", "the data")) if _is_file(source) else os.fspath(source)
    invalid = f"{label} is not a valid .npz checkpoint"
    with contextlib.nullcontext(source) if _is_file(source) else open(source, "rb") as f:
        try:
            _check_ends_with_archive(f, f.seek(0, io.SEEK_END))
            f.seek(0)
            with zipfile.ZipFile(f) as archive:
                check_members(archive)
                bad = archive.testzip()
                if bad is not None:
                    raise CorruptCheckpointError(f"{bad}: CRC-32 or header mismatch")
                missing = [key for key in required if key + ".npy" not in archive.namelist()]
                if missing:
                    raise CorruptCheckpointError(
                        f"missing the arrays {missing} (has {len(archive.infolist())} members)"
                    )
        except CorruptCheckpointError as exc:
            raise CorruptCheckpointError(f"{invalid}: {exc}") from None
        except _BROKEN as exc:
            raise CorruptCheckpointError(f"{invalid} ({type(exc).__name__}: {exc})") from exc


def check_archive(path: str | os.PathLike) -> None:
    """:func:`check_members` of the zip archive at ``path`` (a ``.keras``, a zip-based ``.pth``), before a loader
    unpacks it; a ``CorruptCheckpointError`` naming ``path`` and the fault (a damaged zip directory too)."""
    with open_zip(path, CorruptCheckpointError, "a readable archive", keep=(CorruptCheckpointError,)) as archive:
        try:
            check_members(archive)
        except CorruptCheckpointError as exc:
            raise CorruptCheckpointError(f"{os.fspath(path)} is refused: {exc}") from None


def npz_shapes(path: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """``{key: shape}`` of an ``.npz`` from its members' headers, reading no array (keys without ``.npy``); a
    ``CorruptCheckpointError`` naming the file where they cannot be read."""
    shapes = {}
    with open_zip(path, CorruptCheckpointError, "a valid .npz checkpoint", keep=(CorruptCheckpointError,)) as archive:
        try:
            check_members(archive)
            for info in archive.infolist():
                with archive.open(info) as member:
                    shapes[info.filename.removesuffix(".npy")] = tuple(_read_header(member, info.filename)[0])
        except CorruptCheckpointError as exc:
            raise CorruptCheckpointError(f"{path} is not a valid .npz checkpoint: {exc}") from None
    return shapes


def _safetensors_header(path: str | os.PathLike) -> tuple[dict, int]:
    """The JSON header of a ``.safetensors`` file (its tensors without ``__metadata__``) and where their data ends;
    a ``CorruptCheckpointError`` naming the file and the fault."""
    import json

    size = os.path.getsize(path)
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > size - 8:
                raise CorruptCheckpointError(f"its header claims {length} bytes, the file has {size}")
            header = {name: t for name, t in json.loads(f.read(length)).items() if name != "__metadata__"}
        end = 8 + length + max((int(t["data_offsets"][1]) for t in header.values()), default=0)
        if end != size:
            raise CorruptCheckpointError(f"its tensors end at byte {end}, the file has {size} (truncated?)")
    except CorruptCheckpointError as exc:
        raise CorruptCheckpointError(f"{os.fspath(path)} is not a valid .safetensors file: {exc}") from None
    except (struct.error, ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise CorruptCheckpointError(
            f"{os.fspath(path)} is not a valid .safetensors file ({type(exc).__name__}: {exc})"
        ) from exc
    return header, end


def check_safetensors(path: str | os.PathLike) -> None:
    """Raise ``CorruptCheckpointError`` (naming ``path`` and the fault) unless it is a whole ``.safetensors`` file:
    an 8-byte header length, a JSON header of tensors, and exactly the bytes their offsets end at. Reads the header
    only."""
    _safetensors_header(path)


def safetensors_shapes(path: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """``{key: shape}`` of a whole ``.safetensors`` file from its header, reading no tensor."""
    header, _ = _safetensors_header(path)
    try:
        return {name: tuple(int(n) for n in t["shape"]) for name, t in header.items()}
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptCheckpointError(
            f"{os.fspath(path)} is not a valid .safetensors file (a bad shape: {exc})"
        ) from exc


def validator(path: str):
    """The structural check of a catalogue file, by its suffix: :func:`check_npz` or :func:`check_safetensors`."""
    return check_safetensors if path.endswith(".safetensors") else check_npz
