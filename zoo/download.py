"""Downloads into a cache that only ever holds whole files: ``<dest>.part`` (resumed with ``Range`` and
``If-Range``), checked (size, sha256, ``validate``), recorded in ``<dest>.sha256`` and renamed onto ``dest``; one
downloader at a time holds ``<dest>.lock``. Every fault and what happens: docs/faults.md."""

from __future__ import annotations

import base64
import errno
import hashlib
import http.client
import json
import os
import re
import socket
import ssl
import stat
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

from keras_vit.files import atomic_open, open_regular

from .cache import ensure_intact, record, sha256sum
from .errors import CorruptCheckpointError, DownloadError
from .lock import file_lock

__all__ = [
    "DEADLINE_ENV",
    "DEFAULT_TIMEOUT",
    "CorruptCheckpointError",
    "DownloadError",
    "default_deadline",
    "download",
    "redact",
    "sha256sum",
]
# The disk is full, a file-size limit or a quota is reached: no room, not a permission.
_NO_ROOM = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)

CHUNK = 1 << 20
DEFAULT_TIMEOUT = 30.0
DEADLINE_ENV = "KERAS_VIT_ZOO_DEADLINE"
SLOWEST_RATE = 1 << 16  # bytes/s: the default deadline lets a file come at this rate ...
SHORTEST_DEADLINE = 600.0  # ... and never gives less than ten minutes
NETWORK_ERRORS = (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError, ssl.SSLError)
Progress = Callable[[int, "int | None"], None]


class _Retry(DownloadError):
    """A failed try that another one may fix."""


def redact(url: str) -> str:
    """``url`` as it may be shown: a password in it replaced by ``***`` (``http://user:***@host/``)."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _credentials(url: str) -> tuple[str, str | None]:
    """``url`` without its ``user:password@`` part, and that part (for HTTP basic authentication), if any."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None:
        return url, None
    netloc = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
    plain = urllib.parse.urlunsplit(parts._replace(netloc=netloc))
    return plain, f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"


def _origin(url: str) -> tuple[str, str | None, int | None]:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme, parts.hostname, parts.port or {"http": 80, "https": 443}.get(parts.scheme)


class _SameHostAuthorization(urllib.request.HTTPRedirectHandler):
    """Redirects that keep the ``Authorization`` header only on the URL's own scheme, host and port."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and _origin(newurl) != _origin(req.full_url):
            new.remove_header("Authorization")
        return new


def _url_key(url: str) -> str:
    """What the resume state keeps of the URL: its sha256 (the URL may hold credentials)."""
    return hashlib.sha256(url.encode()).hexdigest()


def _unresolvable(exc: BaseException) -> bool:
    """Whether a network error is a name that does not resolve (offline, or a mistyped host): no retry helps."""
    return isinstance(getattr(exc, "reason", None), socket.gaierror) or isinstance(exc, socket.gaierror)


def _validator(headers) -> str | None:
    etag = headers.get("ETag")
    return etag if etag and not etag.startswith("W/") else headers.get("Last-Modified")


def _discard(*paths: Path) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


def _resumable(part: Path, state: Path, url: str) -> tuple[int, str]:
    """How many bytes of ``part`` may be resumed, and the validator for ``If-Range``; ``(0, "")``: start over."""
    try:
        saved = json.loads(state.read_text())
        info = part.lstat()
    except (OSError, ValueError):
        return 0, ""
    have = info.st_size if stat.S_ISREG(info.st_mode) else 0  # a link or other file: replaced, never followed
    if isinstance(saved, dict) and saved.get("url_sha256") == _url_key(url) and saved.get("validator") and have:
        return have, saved["validator"]
    return 0, ""


def _save_state(state: Path, url: str, validator: str | None) -> None:
    with atomic_open(state, "w", owned=True) as file:
        json.dump({"url_sha256": _url_key(url), "validator": validator}, file)


def default_deadline(expected: int | None) -> float:
    """Seconds for a download of ``expected`` bytes (None: unknown): ``$KERAS_VIT_ZOO_DEADLINE`` when set, else
    the time at 64 KiB/s, at least ten minutes (an hour when the size is unknown). Raises ``DownloadError`` for a
    variable that is not a positive number."""
    value = os.environ.get(DEADLINE_ENV)
    if value is None:
        return max(SHORTEST_DEADLINE, expected / SLOWEST_RATE) if expected else 6 * SHORTEST_DEADLINE
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0 or seconds == float("inf"):
        raise DownloadError(f"{DEADLINE_ENV}={value!r} is not a positive number of seconds")
    return seconds


class _Deadline:
    """When the whole call must end; ``left(timeout)`` raises ``DownloadError`` naming it once it has passed."""

    def __init__(self, seconds: float):
        self.seconds, self.end = seconds, time.monotonic() + seconds

    def passed(self) -> str:
        return (
            f"the deadline passed ({self.seconds:g} s for the whole download; raise it with {DEADLINE_ENV}=SECONDS, "
            "deadline=SECONDS or --deadline SECONDS)"
        )

    def left(self, timeout: float) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise DownloadError(self.passed())
        return min(timeout, left)


def _attempt(url: str, part: Path, state: Path, size, limit, timeout: float, end: _Deadline, progress) -> bool:
    """One request into ``part``; True when its length is proven (``Content-Length`` or ``size``)."""
    have, validator = _resumable(part, state, url)
    headers: dict[str, str] = {}
    if have:
        headers = {"Range": f"bytes={have}-", "If-Range": validator}
    plain, credentials = _credentials(url)
    if credentials:
        headers["Authorization"] = f"Basic {base64.b64encode(credentials.encode()).decode()}"
    try:
        response = urllib.request.build_opener(_SameHostAuthorization).open(
            urllib.request.Request(plain, headers=headers), timeout=end.left(timeout)
        )
    except urllib.error.HTTPError as exc:
        if exc.code == 416:  # the .part does not fit the file (any more): start over
            _discard(part, state)
        raise
    with response:
        if have and response.status == 206:  # it must continue our ``.part`` of the same file
            match = re.fullmatch(r"bytes (\d+)-\d+/(?:\d+|\*)", response.headers.get("Content-Range", "").strip())
            etag = response.headers.get("ETag")
            if not match or int(match.group(1)) != have or (etag and validator.startswith('"') and etag != validator):
                _discard(part, state)
                raise _Retry("the server's partial answer does not continue the partial file; starting over")
        else:
            have = 0  # a fresh start: the file changed, or the server ignores Range
        kind, encoding = response.headers.get_content_type(), response.headers.get("Content-Encoding", "identity")
        if encoding.strip().lower() not in ("identity", ""):
            raise DownloadError(
                f"the server sent the file {encoding}-encoded (Content-Encoding: {encoding}), which was not asked "
                "for: serve it as it is (a mirror must not compress it)"
            )
        if kind == "text/html":
            raise DownloadError(f"the server answered with an HTML page (HTTP {response.status}, {kind}), not the file")
        length = response.headers.get("Content-Length", "")
        total = have + int(length) if length.isdigit() else size
        if size is not None and total != size:
            raise DownloadError(f"the server announces {total} bytes, the catalogue {size}")
        cap = limit if total is None else None
        if total is not None and limit is not None and total > limit:
            raise DownloadError(f"the server announces {total} bytes, more than the {limit} this file can be")
        if not have:
            _save_state(state, url, _validator(response.headers))
            _discard(part)  # the cache owns the name: a link found there is removed, its target left alone
        with open_regular(part, "ab" if have else "xb") as f:
            while chunk := response.read1(CHUNK):
                if cap is not None and f.tell() + len(chunk) > cap:
                    break
                f.write(chunk)
                if progress:
                    progress(f.tell(), total)
                end.left(timeout)
            done = f.tell()
    if chunk:  # stopped at the cap: not the file
        _discard(part, state)
        raise DownloadError(
            f"no Content-Length and more than {cap} bytes, the most the catalogue entry allows (4 bytes per "
            "parameter x 1.25 + 1 MiB): stopped, the partial file was deleted"
        )
    if total is not None and done < total:
        raise _Retry(f"connection closed after {done} of {total} bytes")
    if total is not None and done > total:
        _discard(part, state)
        raise DownloadError(f"the server sent {done} bytes, more than the {total} expected")
    if progress and total is None:
        progress(done, done)
    return total is not None


def _accept(
    url: str, part: Path, state: Path, dest: Path, sha256: str | None, validate: Callable[[Path], None] | None
) -> None:
    """Check the finished ``part`` (deleted when it fails), record its sha256 and move it onto ``dest``."""
    if not stat.S_ISREG(part.lstat().st_mode):
        raise DownloadError(f"{part} is not a regular file (a link?): refused, not moved into the cache")
    try:
        digest = sha256sum(part)
        if sha256 is not None and digest != sha256.lower():
            raise DownloadError(f"sha256 mismatch for {redact(url)}: expected {sha256}, got {digest}")
        if validate is not None:
            validate(part)
    except DownloadError as exc:
        _discard(part, state)
        raise type(exc)(f"{exc}; the file was deleted.") from None
    record(dest, digest)
    os.replace(part, dest)
    _discard(state)


def _transfer(url: str, dest: Path, sha256, size, limit, validate, retries, timeout, end: _Deadline, backoff, progress):
    """Up to ``retries`` tries into ``dest.part``, then :func:`_accept`; else a ``DownloadError`` saying why."""
    part = dest.with_name(dest.name + ".part")
    state = part.with_name(part.name + ".json")
    failures: list[str] = []
    for attempt in range(retries):
        pause = backoff * 2 ** (attempt - 1) if attempt else 0.0
        if time.monotonic() + pause >= end.end:
            failures.append(end.passed())
            break
        time.sleep(pause)
        try:
            proven = _attempt(url, part, state, size, limit, timeout, end, progress)
        except urllib.error.HTTPError as exc:
            failures.append(f"HTTP {exc.code} {exc.reason}")
            if 400 <= exc.code < 500 and exc.code not in (408, 416, 429):
                break  # not found, forbidden: retrying will not help
        except DownloadError as exc:
            failures.append(str(exc))
            if not isinstance(exc, _Retry):
                break
        except TimeoutError:
            failures.append(f"no data for {timeout:g} s")
        except NETWORK_ERRORS as exc:
            failures.append(f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}")
            if _unresolvable(exc):
                failures.append("the host name does not resolve: offline? a mirror is set with KERAS_VIT_ZOO_URL")
                break
        else:
            try:
                _accept(url, part, state, dest, sha256, validate)
                return
            except DownloadError as exc:
                if proven:
                    raise
                failures.append(f"the connection closed at an unknown length and the file is not whole ({exc})")
    failed = (
        f"Could not download {redact(url)} ({'; '.join(failures)}). If this machine is offline or the URL moved, "
        f"fetch the file elsewhere (e.g. `curl -L -o {dest.name} {redact(url)}`) and put it at {dest}, or give "
        "its path instead of the catalogue name: "
    )
    kept = f" The partial download {part} is kept and resumed next time." if part.exists() else ""
    raise DownloadError(
        f"{failed}weights='/path/to/file.npz'.{kept}", command_line=f"{failed}--weights /path/to/file.npz.{kept}"
    )


def download(
    url: str,
    dest: str | os.PathLike,
    *,
    sha256: str | None = None,
    size: int | None = None,
    validate: Callable[[Path], None] | None = None,
    retries: int = 5,
    timeout: float = DEFAULT_TIMEOUT,
    deadline: float | None = None,
    limit: int | None = None,
    backoff: float = 1.0,
    progress: Progress | None = None,
) -> Path:
    """``dest``, holding the whole file at ``url``: checked when already there, else downloaded (see the module).

    ``sha256``/``size``: expected, when known. ``validate(path)`` raises ``CorruptCheckpointError`` for a file
    that is not whole. ``retries`` tries, ``backoff`` * 2**n seconds apart. ``timeout``: idle seconds per try;
    ``deadline``: seconds for the whole call (None: :func:`default_deadline`); ``limit``: the most bytes of a body
    without a ``Content-Length``. ``progress(bytes_so_far, total_or_None)``.
    Raises ``DownloadError`` (``CorruptCheckpointError`` for a bad or changed file).
    """
    dest = Path(dest)
    if dest.is_file():  # files enter the cache by an atomic rename: no lock needed to read one
        return ensure_intact(dest, sha256=sha256, validate=validate)
    end = _Deadline(default_deadline(size or limit) if deadline is None else deadline)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        with file_lock(dest.with_name(dest.name + ".lock"), end.end):
            if dest.is_file():  # another downloader finished while we waited
                return ensure_intact(dest, sha256=sha256, validate=validate)
            _transfer(url, dest, sha256, size, limit, validate, retries, timeout, end, backoff, progress)
    except DownloadError:
        raise
    except OSError as exc:  # network errors are handled above: this is the local disk
        where = "another cache folder (KERAS_HOME, cache_dir=..., --cache-dir)"
        if exc.errno in _NO_ROOM:  # our partial file would only hold the disk full: it goes
            _discard(dest.with_name(dest.name + ".part"), dest.with_name(dest.name + ".part.json"))
            raise DownloadError(
                f"No room in the cache folder {dest.parent} for {dest.name} ({exc.strerror or exc}); the partial "
                f"download was removed. Free space (or raise the file-size limit), or use {where}."
            ) from exc
        raise DownloadError(
            f"Cannot write to the cache folder {dest.parent} ({exc.strerror or exc}). Make it writable or use {where}."
        ) from exc
    return dest
