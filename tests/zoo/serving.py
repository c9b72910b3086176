"""A misbehaving HTTP server on 127.0.0.1 and the helpers the zoo's download and cache tests share."""

import gzip
import hashlib
import http.server
import io
import re
import socket
import threading

import numpy as np
from npz_layout import vit_checkpoint

from keras_vit.zoo.download import download
from keras_vit.zoo.validate import check_npz

HOLD = 5.0  # the longest a stalled or slow handler keeps its connection


class Server:
    """``http.server`` in a thread serving ``files`` with ``ETag``/``If-Range``/``Range`` support.

    ``faults``: one per request, in order (then none): ``"drop"`` half the body then a closed connection,
    ``"drop-nolength"`` the same without ``Content-Length``, ``"truncate"``/``"long"`` a shorter/longer body with
    a matching ``Content-Length``, ``"html"`` an HTML page with status 200, ``"stall"`` headers and half the
    body then silence, ``"trickle"`` a byte every 50 ms, ``"slow"`` half the body, a pause of 1.5 s, the rest,
    ``"zeros"`` zeros without ``Content-Length`` (64 MiB at most), ``"gzip"`` the body gzip-compressed with
    ``Content-Encoding: gzip``, ``"gzip-unlabelled"`` the same without the header.
    ``changes``: ``{path: new bytes}`` served after the first dropped answer. ``etag=False``: no validators;
    ``ranges=False``: Range headers are ignored.
    """

    def __init__(self, files, faults=(), changes=None, etag=True, ranges=True):
        self.files, self.faults, self.changes = dict(files), list(faults), dict(changes or {})
        self.etag, self.ranges, self.requests, self.stop = etag, ranges, [], threading.Event()
        self.authorizations = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                server.requests.append((self.path, self.headers.get("Range"), self.headers.get("If-Range")))
                server.authorizations.append(self.headers.get("Authorization"))
                data = server.files.get(self.path)
                if data is None:
                    self.send_error(404)
                    return
                fault = server.faults.pop(0) if server.faults else None
                if fault == "html":
                    self.reply(200, b"<!DOCTYPE html><html><body>Sign in to continue</body></html>", "text/html")
                    return
                tag = f'"{hashlib.sha256(data).hexdigest()[:16]}"'
                start, status = 0, 200
                match = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
                if match and server.ranges and self.headers.get("If-Range") in (None, tag):
                    start, status = int(match.group(1)), 206
                body = data[start:]
                body = {"truncate": body[: len(body) // 2], "long": body + b"\0" * 100}.get(fault, body)
                extra = {"ETag": tag} if server.etag else {}
                if fault in ("gzip", "gzip-unlabelled"):
                    body = gzip.compress(body)
                    extra.update({"Content-Encoding": "gzip"} if fault == "gzip" else {})
                if status == 206:
                    extra["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
                self.reply(status, body, "application/octet-stream", fault, **extra)
                if fault and fault.startswith("drop") and self.path in server.changes:
                    server.files[self.path] = server.changes.pop(self.path)

            def reply(self, status, body, kind, fault=None, **headers):
                self.send_response(status)
                self.send_header("Content-Type", kind)
                if fault not in ("drop-nolength", "zeros"):
                    self.send_header("Content-Length", str(len(body)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                half = len(body) // 2
                if fault == "zeros":
                    for _ in range(256):
                        if server.stop.is_set():
                            return
                        self.wfile.write(bytes(1 << 18))
                    return
                if fault == "trickle":
                    for i in range(len(body)):
                        if server.stop.wait(0.05):
                            return
                        self.wfile.write(body[i : i + 1])
                        self.wfile.flush()
                    return
                self.wfile.write(body[:half] if fault in ("drop", "drop-nolength", "stall", "slow") else body)
                self.wfile.flush()
                if fault in ("drop", "drop-nolength"):
                    self.connection.shutdown(socket.SHUT_RDWR)
                elif fault == "stall":
                    server.stop.wait(HOLD)
                elif fault == "slow":
                    server.stop.wait(1.5)
                    self.wfile.write(body[half:])

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.handle_error = lambda request, address: None  # a client that hung up on a stalled answer
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def gets(self, path):
        return [r for r in self.requests if r[0] == path]

    def close(self):
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def checkpoint_bytes(seed=0, **kwargs) -> bytes:
    """A real (tiny) checkpoint in the published layout, as bytes."""
    shape = dict(patch=16, width=32, depth=1, heads=2, mlp=64, grid=(2, 2), seed=seed)
    arrays = vit_checkpoint(**dict(shape, **kwargs))
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def fetch_file(server, tmp_path, **kwargs):
    """``download`` as ``zoo.fetch`` does it (structural check), quick retries."""
    kwargs = dict(dict(backoff=0, timeout=5, validate=check_npz), **kwargs)
    return download(server.url + "/a.npz", tmp_path / "cache" / "a.npz", **kwargs)


def cache_listing(tmp_path):
    folder = tmp_path / "cache"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []
