"""The zoo's error types: every failure of a download, or of a cached file, is a ``DownloadError``."""

from __future__ import annotations

__all__ = ["CorruptCheckpointError", "DownloadError"]


class DownloadError(OSError):
    """A download that failed (network error, incomplete transfer, hash mismatch) or a cache that cannot be written;
    ``command_line``: the message as a command shows it (``--weights PATH``, not ``weights='PATH'``)."""

    def __init__(self, message: str, *, command_line: str | None = None):
        super().__init__(message)
        self.command_line = command_line or message


class CorruptCheckpointError(DownloadError):
    """A file that is not a whole, valid checkpoint: bad zip structure, CRC, keys or arrays, or a changed sha256."""
