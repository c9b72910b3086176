"""Resumable HTTP downloads into a cache: a ``.part`` file, Range requests, retries, sha256, atomic rename.

The final path only ever holds a complete file: bytes go to ``<dest>.part`` first; after a dropped
connection the next attempt asks for the rest with ``Range: bytes=<have>-`` (a server that ignores it
sends the whole file again, which restarts the ``.part``). Once the size matches, the sha256 is
checked (when known) and the ``.part`` file is renamed onto ``dest``.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

CHUNK = 1 << 20


class DownloadError(OSError):
    """A download that failed: network error, incomplete transfer or hash mismatch."""


def sha256sum(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _attempt(url: str, part: Path, timeout: float, progress) -> None:
    """One request, appending to ``part`` from where it ends; raises on a short or failed transfer."""
    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:  # the .part is already complete or longer than the file: start over
            part.unlink()
        raise
    with response:
        if have and response.status != 206:
            have = 0  # the server ignored the Range header and sends everything
        length = response.headers.get("Content-Length")
        total = None if length is None else have + int(length)
        with open(part, "ab" if have else "wb") as f:
            while chunk := response.read(CHUNK):
                f.write(chunk)
                if progress:
                    progress(f.tell(), total)
    size = part.stat().st_size
    if total is not None and size != total:
        raise DownloadError(f"connection closed after {size} of {total} bytes")


def download(
    url: str,
    dest: str | os.PathLike,
    *,
    sha256: str | None = None,
    retries: int = 5,
    timeout: float = 60.0,
    backoff: float = 1.0,
    progress=None,
) -> Path:
    """Download ``url`` to ``dest`` (resuming, retrying) and return ``dest``.

    ``sha256``, when given, must match or the partial file is deleted and a ``DownloadError`` raised.
    ``progress(bytes_so_far, total_or_None)`` is called after each chunk.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    failures: list[str] = []
    complete = False
    for attempt in range(retries):
        if attempt:
            time.sleep(backoff * 2 ** (attempt - 1))
        try:
            _attempt(url, part, timeout, progress)
            complete = True
            break
        except urllib.error.HTTPError as exc:
            failures.append(f"HTTP {exc.code} {exc.reason}")
            if 400 <= exc.code < 500 and exc.code not in (408, 416, 429):
                break  # not found, forbidden: retrying will not help
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            failures.append(f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}")
    if not complete:
        raise DownloadError(
            f"Could not download {url} ({'; '.join(failures)}).\n"
            f"If this machine is offline or the URL moved, fetch the file elsewhere (e.g. `curl -L -o "
            f"{dest.name} {url}`) and put it at {dest}, or pass weights='/path/to/file.npz'."
            + (f" The partial download {part} is kept and resumed next time." if part.exists() else "")
        )
    if sha256 is not None:
        actual = sha256sum(part)
        if actual != sha256.lower():
            part.unlink()
            raise DownloadError(f"sha256 mismatch for {url}: expected {sha256}, got {actual}; the file was deleted.")
    os.replace(part, dest)
    return dest


def print_progress(done: int, total: int | None) -> None:
    """A one-line progress report on stderr, for command-line use."""
    text = f"{done / 2**20:8.1f} MiB" + (f" / {total / 2**20:.1f} MiB" if total else "")
    print(f"\r{text}", end="" if total is None or done < total else "\n", file=sys.stderr, flush=True)
