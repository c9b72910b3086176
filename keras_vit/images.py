"""Image files to pixels, the one reader of training, ``predict`` and the analyses: uint8 RGB, EXIF orientation and
16-bit scaling applied, regular files only; errors name the file (docs/weights.md)."""

from __future__ import annotations

import os
import stat
from typing import BinaryIO

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

__all__ = ["IMAGE_EXTENSIONS", "image_files", "image_problem", "read_image"]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp")  # what an image folder's files end with

# What PIL raises for a file it cannot read: unidentified, truncated or malformed data, or over its pixel limit.
_ERRORS = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)


def _pixels(image: Image.Image) -> np.ndarray:
    """An opened PIL image as uint8 RGB, EXIF orientation applied, 16 bits scaled to 8."""
    image = ImageOps.exif_transpose(image)
    if image.mode.startswith("I;16"):
        wide = np.asarray(image).astype(np.uint32)
        grey = ((wide + 128) // 257).astype(np.uint8)  # round(v / 257): the inverse of v * 257
        return np.repeat(grey[..., None], 3, axis=-1)
    return np.asarray(image.convert("RGB"))


def _failure(error: BaseException) -> str:
    """Why PIL could not read a file, in words."""
    if isinstance(error, MemoryError):
        return (
            "it does not fit in memory: decoded, it needs more than this process may still allocate (free memory, "
            "or raise the limit: ulimit -v, the container's)"
        )
    if isinstance(error, Image.DecompressionBombError):
        return f"too large to decode safely ({error})"
    if isinstance(error, UnidentifiedImageError):
        return "not an image"
    return str(error) or type(error).__name__


_NOT_REGULAR = "not a regular file (a folder, pipe or device)"


def _open_regular(path: str | os.PathLike) -> BinaryIO | None:
    """``path`` opened for reading; None when it is not a regular file (a FIFO is never waited on). Raises
    ``FileNotFoundError`` naming it."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file") from None
    except IsADirectoryError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_image(path: str | os.PathLike) -> np.ndarray:
    """An image file as uint8 RGB ``(H, W, 3)``. Raises ``FileNotFoundError``, ``ValueError`` naming the file (not a
    regular file, not an image, truncated, over PIL's pixel limit), or ``MemoryError`` naming it when its pixels do
    not fit in the memory left (a memory limit)."""
    file = _open_regular(path)
    if file is None:
        raise ValueError(f"{path}: {_NOT_REGULAR}, not an image.")
    try:
        with file, Image.open(file) as image:
            image.load()  # decode now: a truncated file fails here, not later
            return _pixels(image)
    except _ERRORS as error:
        raise ValueError(f"Cannot read image file {str(path)!r}: {_failure(error)}.") from None
    except MemoryError as error:
        raise MemoryError(f"Cannot read image file {str(path)!r}: {_failure(error)}.") from None


def image_problem(path: str | os.PathLike, formats: tuple[str, ...] | None = None) -> str | None:
    """Why ``path`` would not read (``None`` if it does): decoded in full, JPEGs at 1/8 scale. ``formats``: the PIL
    format names accepted (default: any)."""
    try:
        file = _open_regular(path)
        if file is None:
            return _NOT_REGULAR
        with file, Image.open(file) as image:
            if formats is not None and image.format not in formats:
                return f"a {image.format} image, not one of {', '.join(formats)}"
            image.draft("RGB", (1, 1))  # JPEG: decode at the smallest scale, still reading every byte
            image.load()
    except (*_ERRORS, MemoryError) as error:
        return _failure(error)
    return None


def _images_in(folder: str) -> list[str]:
    """The image files (:data:`IMAGE_EXTENSIONS`) in ``folder`` and its sub-folders, sorted; hidden ones left out."""
    found = []
    for parent, subfolders, names in os.walk(folder):
        subfolders[:] = [name for name in subfolders if not name.startswith(".")]
        found += [os.path.join(parent, n) for n in names if n.lower().endswith(IMAGE_EXTENSIONS) and n[0] != "."]
    return sorted(found)


def image_files(paths: list[str | os.PathLike]) -> list[str]:
    """``paths`` with every folder replaced by the image files in it and its sub-folders (sorted; hidden ones left
    out); a ``ValueError`` naming a folder without images."""
    files = []
    for path in map(str, paths):
        found = _images_in(path) if os.path.isdir(path) else [path]
        if not found:
            raise ValueError(f"{path}: a folder without image files ({', '.join(IMAGE_EXTENSIONS)}).")
        files += found
    return files
