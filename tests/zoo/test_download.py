"""Downloads into the zoo's cache, against a misbehaving HTTP server on 127.0.0.1: every fault of
``docs/faults.md`` (drops, short and long bodies, HTML pages, a file that changes, stalls and trickles,
concurrent clients) and the sha256 records. The structural check: ``test_validate.py``.

Every server is stopped by the ``serve`` fixture; a stalled or trickling handler waits at most ``HOLD`` seconds.
"""

import base64
import hashlib
import http.server
import os
import re
import socket
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from npz_layout import TI_16, vit_checkpoint, write_checkpoint

import keras_vit
from keras_vit import zoo
from keras_vit.zoo.__main__ import main as zoo_main
from keras_vit.zoo.cache import record_path, recorded
from keras_vit.zoo.download import CorruptCheckpointError, DownloadError, download, redact
from keras_vit.zoo.validate import check_npz

from .serving import cache_listing, checkpoint_bytes, fetch_file

pytestmark = pytest.mark.backends("tensorflow")  # the default backend only: backend-independent or slow

ROOT = Path(__file__).resolve().parents[2]


# --- the normal path and the existing behaviour ---------------------------------------------------------


def test_download_records_the_sha256_and_leaves_no_partial_or_lock(tmp_path, payload, serve):
    server = serve({"/a.npz": payload})
    sha = hashlib.sha256(payload).hexdigest()
    path = fetch_file(server, tmp_path, sha256=sha, size=len(payload))
    assert path.read_bytes() == payload and cache_listing(tmp_path) == ["a.npz", "a.npz.sha256"]
    assert recorded(path) == sha and record_path(path).read_text() == f"{sha}  a.npz\n"
    assert server.requests == [("/a.npz", None, None)]
    assert fetch_file(server, tmp_path) == path and len(server.requests) == 1  # cached: checked, not fetched


def test_a_cut_connection_resumes_with_range_and_if_range(tmp_path, payload, serve):
    server = serve({"/a.npz": payload}, faults=["drop"])
    assert fetch_file(server, tmp_path).read_bytes() == payload
    (_, no_range, _), (_, resumed, validator) = server.requests
    assert no_range is None and 0 < int(re.fullmatch(r"bytes=(\d+)-", resumed).group(1)) < len(payload)
    assert validator.startswith('"') and cache_listing(tmp_path) == ["a.npz", "a.npz.sha256"]


def test_credentials_in_a_mirror_url_are_sent_as_a_header_and_never_shown_or_stored(tmp_path, payload, serve):
    server = serve({"/a.npz": payload}, faults=["drop"] * 3)
    url = server.url.replace("http://", "http://reader:s3cret@") + "/a.npz"
    dest = tmp_path / "cache" / "a.npz"
    with pytest.raises(DownloadError) as failed:
        download(url, dest, backoff=0, timeout=5, validate=check_npz, retries=2)
    message = str(failed.value)
    assert "s3cret" not in message and "http://reader:***@127.0.0.1:" in message  # in the error and its curl line
    assert message.count("reader:***@") == 2
    assert all("s3cret" not in path.read_text(errors="replace") for path in dest.parent.glob("*.json"))
    assert set(server.authorizations) == {"Basic cmVhZGVyOnMzY3JldA=="}  # base64 of reader:s3cret
    assert download(url, dest, backoff=0, timeout=5, validate=check_npz).read_bytes() == payload  # resumed, whole
    assert redact("https://u:p@host:8/x") == "https://u:***@host:8/x" and redact("https://host/x") == "https://host/x"


def test_a_host_that_does_not_resolve_fails_at_once_naming_the_mirror_variable(tmp_path):
    start = time.monotonic()
    with pytest.raises(DownloadError, match=r"does not resolve.*KERAS_VIT_ZOO_URL"):
        download("http://keras-vit-mirror.invalid/a.npz", tmp_path / "a.npz", backoff=30, retries=5)
    assert time.monotonic() - start < 20  # one try: a retry would have waited 30 s first


def test_a_command_names_its_flag_and_python_its_argument_when_a_download_fails(tmp_path, monkeypatch, capsys):
    """The same failure through ``python -m keras_vit.zoo convert`` (a command) and ``ViT_Ti16(weights=)`` (Python)."""
    monkeypatch.setenv(zoo.MIRROR_ENV, "http://keras-vit-mirror.invalid/")  # fails at once (no retries)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    with pytest.raises(SystemExit) as exited:
        zoo_main(["convert", "Ti_16.augreg_in21k", str(tmp_path / "out.keras")])
    err = capsys.readouterr().err
    assert exited.value.code == 1 and "KERAS_VIT_ZOO_URL" in err
    assert "--weights /path/to/file.npz" in err and "weights='" not in err
    with pytest.raises(DownloadError, match=r"instead of the catalogue name: weights='/path/to/file\.npz'"):
        keras_vit.ViT_Ti16(weights="Ti_16.augreg_in21k")


def test_without_a_validator_a_partial_file_restarts_from_zero(tmp_path, payload, serve):
    server = serve({"/a.npz": payload}, faults=["drop"], etag=False)
    assert fetch_file(server, tmp_path).read_bytes() == payload
    assert [r[1] for r in server.requests] == [None, None]  # no If-Range possible: no Range either


def test_a_server_ignoring_range_restarts_the_file(tmp_path, payload, serve):
    server = serve({"/a.npz": payload}, faults=["drop"], ranges=False)
    assert fetch_file(server, tmp_path).read_bytes() == payload
    assert len(server.requests) == 2 and server.requests[1][1] is not None


def test_too_many_cuts_keep_the_partial_file_for_later(tmp_path, payload, serve):
    server = serve({"/a.npz": payload}, faults=["drop"] * 5)
    kept = r"connection closed after .* The partial download .*a\.npz\.part is kept"
    with pytest.raises(DownloadError, match=kept):
        fetch_file(server, tmp_path, retries=2)
    assert not (tmp_path / "cache" / "a.npz").exists()
    assert 0 < (tmp_path / "cache" / "a.npz.part").stat().st_size < len(payload)
    server.faults.clear()
    assert fetch_file(server, tmp_path).read_bytes() == payload
    assert server.requests[-1][1] is not None  # resumed


def test_a_hash_mismatch_is_an_error_and_leaves_no_file(tmp_path, payload, serve):
    server = serve({"/a.npz": payload})
    with pytest.raises(DownloadError, match=r"sha256 mismatch .* expected 0000.*the file was deleted"):
        fetch_file(server, tmp_path, sha256="0" * 64)
    assert cache_listing(tmp_path) == [] and len(server.requests) == 1  # a proven-length body: no retry


def test_unreachable_and_missing_urls_say_which_url_and_where_to_put_the_file(tmp_path, serve):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/imagenet21k/ViT-B_16.npz"
    with pytest.raises(DownloadError) as info:
        download(url, tmp_path / "ViT-B_16.npz", retries=2, backoff=0, timeout=5)
    message = str(info.value)
    assert f"Could not download {url}" in message and "Connection refused" in message
    assert f"put it at {tmp_path / 'ViT-B_16.npz'}" in message and "weights='/path/to/file.npz'" in message
    command_line = info.value.command_line  # what a command prints: its flag, not Python's argument
    assert "--weights /path/to/file.npz" in command_line and "weights='" not in command_line
    server = serve({})
    with pytest.raises(DownloadError, match=r"HTTP 404"):
        download(server.url + "/absent.npz", tmp_path / "absent.npz", retries=3, backoff=0)
    assert len(server.requests) == 1  # not found: no retries


# --- faults: bodies that are not the file ---------------------------------------------------------------


def test_a_drop_without_content_length_is_not_cached_and_is_retried_from_zero(tmp_path, payload, serve):
    server = serve({"/a.npz": payload}, faults=["drop-nolength", "drop-nolength"])
    with pytest.raises(DownloadError, match="unknown length and the file is not whole"):
        fetch_file(server, tmp_path, retries=1)
    assert cache_listing(tmp_path) == []  # the broken .part was ours: deleted
    assert fetch_file(server, tmp_path, retries=2).read_bytes() == payload
    assert [r[1] for r in server.requests] == [None, None, None]


def test_a_drop_without_content_length_stops_at_the_known_size_and_resumes(tmp_path, payload, serve):
    server = serve({"/a.npz": payload}, faults=["drop-nolength"])
    assert fetch_file(server, tmp_path, size=len(payload)).read_bytes() == payload
    assert server.requests[1][1] == f"bytes={len(payload) // 2}-"


@pytest.mark.parametrize(
    "fault, message", [("truncate", "does not end with a zip directory"), ("long", "does not end with a zip directory")]
)
def test_a_short_or_long_body_is_refused_and_deleted(tmp_path, payload, serve, fault, message):
    server = serve({"/a.npz": payload}, faults=[fault] * 3)
    with pytest.raises(CorruptCheckpointError, match=f"{message}.*the file was deleted"):
        fetch_file(server, tmp_path)
    assert cache_listing(tmp_path) == [] and len(server.requests) == 1


@pytest.mark.parametrize("fault", ["truncate", "long"])
def test_a_body_of_the_wrong_size_is_refused_before_it_is_read_when_the_size_is_known(tmp_path, payload, serve, fault):
    server = serve({"/a.npz": payload}, faults=[fault])
    with pytest.raises(DownloadError, match=f"announces \\d+ bytes, the catalogue {len(payload)}"):
        fetch_file(server, tmp_path, size=len(payload))
    assert cache_listing(tmp_path) == []


def test_an_html_page_with_status_200_is_refused(tmp_path, payload, serve):
    server = serve({"/a.npz": payload}, faults=["html"])
    with pytest.raises(DownloadError, match=r"HTML page \(HTTP 200, text/html\), not the file"):
        fetch_file(server, tmp_path)
    assert cache_listing(tmp_path) == [] and len(server.requests) == 1


def test_a_gzip_encoded_answer_is_named_as_such_not_called_a_truncated_zip(tmp_path, payload, serve):
    server = serve({"/a.npz": payload}, faults=["gzip", "gzip-unlabelled"])
    with pytest.raises(DownloadError, match=r"gzip-encoded \(Content-Encoding: gzip\), which was not asked for"):
        fetch_file(server, tmp_path)
    assert len(server.requests) == 1 and cache_listing(tmp_path) == []  # not retried: it would not heal
    with pytest.raises(CorruptCheckpointError, match=r"gzip-compressed data, not an \.npz archive.*was deleted"):
        fetch_file(server, tmp_path)
    assert cache_listing(tmp_path) == []


def test_an_html_body_without_an_html_type_fails_the_structural_check(tmp_path, serve):
    server = serve({"/a.npz": b"<!DOCTYPE html>\n<html>Sign in</html>\n"})
    with pytest.raises(CorruptCheckpointError, match=r"an HTML or XML page, not an \.npz archive"):
        fetch_file(server, tmp_path)
    assert cache_listing(tmp_path) == []


def test_a_file_that_changes_between_a_drop_and_the_resume_restarts_from_zero(tmp_path, payload, serve):
    new = checkpoint_bytes(seed=1)
    server = serve({"/a.npz": payload}, faults=["drop"], changes={"/a.npz": new})
    path = fetch_file(server, tmp_path)
    assert path.read_bytes() == new and recorded(path) == hashlib.sha256(new).hexdigest()
    (_, _, _), (_, resumed, validator) = server.requests
    assert resumed is not None and validator == f'"{hashlib.sha256(payload).hexdigest()[:16]}"'  # answered 200


# --- faults: stalls, trickles, deadlines --------------------------------------------------------------


def test_a_stalled_server_fails_after_the_idle_timeout(tmp_path, payload, serve):
    server = serve({"/a.npz": payload}, faults=["stall"])
    start = time.monotonic()
    with pytest.raises(DownloadError, match=r"no data for 0\.5 s.*partial download .* is kept"):
        fetch_file(server, tmp_path, retries=1, timeout=0.5)
    assert 0.4 < time.monotonic() - start < 2.0


def test_a_trickling_server_fails_at_the_deadline(tmp_path, payload, serve):
    server = serve({"/a.npz": payload}, faults=["trickle"])
    start = time.monotonic()
    with pytest.raises(DownloadError, match="the deadline passed"):
        fetch_file(server, tmp_path, timeout=1.0, deadline=0.6)
    assert 0.5 < time.monotonic() - start < 1.6  # the deadline, overshot by less than the idle timeout
    assert len(server.requests) == 1


@pytest.mark.backend_independent
def test_a_trickling_mirror_ends_at_the_default_deadline_set_by_the_environment(
    tmp_path, payload, serve, monkeypatch, capsys
):
    entry = zoo.get("Ti_16.augreg_in21k")
    server = serve({"/" + entry.path: payload}, faults=["trickle", "trickle"])
    monkeypatch.setenv(zoo.MIRROR_ENV, server.url)
    monkeypatch.setenv("KERAS_VIT_ZOO_DEADLINE", "2")
    start = time.monotonic()
    with pytest.raises(DownloadError, match=r"the deadline passed \(2 s .*KERAS_VIT_ZOO_DEADLINE=SECONDS.*--deadline"):
        zoo.fetch(entry, tmp_path)  # default options: no deadline argument
    assert 1.9 < time.monotonic() - start < 4.0 and len(server.requests) == 1
    monkeypatch.setenv("KERAS_VIT_ZOO_DEADLINE", "1")
    with pytest.raises(SystemExit):
        zoo_main(["--cache-dir", str(tmp_path), "download", entry.name])
    assert re.search(r"error: .*the deadline passed \(1 s .*KERAS_VIT_ZOO_DEADLINE", capsys.readouterr().err)
    assert time.monotonic() - start < 7.0 and len(server.requests) == 2
    monkeypatch.setenv("KERAS_VIT_ZOO_DEADLINE", "soon")
    with pytest.raises(DownloadError, match="KERAS_VIT_ZOO_DEADLINE='soon' is not a positive number of seconds"):
        zoo.fetch(entry, tmp_path)


@pytest.mark.backend_independent
def test_a_trickling_mirror_ends_at_the_computed_default_deadline_and_names_it(tmp_path, payload, serve, monkeypatch):
    """No deadline given and none in the environment: ``default_deadline`` of the entry's size ends the download,
    and the message names it (its rate raised and its floor lowered from ten minutes to 2 s here)."""
    from keras_vit.zoo import download as download_module

    entry = zoo.get("Ti_16.augreg_in21k")
    server = serve({"/" + entry.path: payload}, faults=["trickle"])
    monkeypatch.setenv(zoo.MIRROR_ENV, server.url)
    monkeypatch.delenv("KERAS_VIT_ZOO_DEADLINE", raising=False)
    monkeypatch.setattr(download_module, "SHORTEST_DEADLINE", 2.0)
    monkeypatch.setattr(download_module, "SLOWEST_RATE", 1 << 40)
    start = time.monotonic()
    with pytest.raises(DownloadError, match=r"the deadline passed \(2 s for the whole download"):
        zoo.fetch(entry, tmp_path)
    assert 1.9 < time.monotonic() - start < 4.0 and len(server.requests) == 1


@pytest.mark.backend_independent
def test_the_default_deadline_scales_with_the_size_from_ten_minutes(monkeypatch):
    from keras_vit.zoo.download import default_deadline

    monkeypatch.delenv("KERAS_VIT_ZOO_DEADLINE", raising=False)
    assert default_deadline(1 << 20) == 600 and default_deadline(None) == 3600
    assert default_deadline(1 << 30) == (1 << 30) / (1 << 16)  # 64 KiB/s: about 4.5 hours for 1 GiB


@pytest.mark.backend_independent
def test_zeros_without_a_length_stop_at_the_size_the_parameters_imply(tmp_path, serve, monkeypatch):
    import dataclasses

    entry = dataclasses.replace(zoo.get("Ti_16.augreg_in21k"), parameters=1000, size=None, sha256=None)
    limit = 1000 * 5 + (1 << 20)
    assert entry.most_bytes == limit
    server = serve({"/" + entry.path: b""}, faults=["zeros"])
    monkeypatch.setenv(zoo.MIRROR_ENV, server.url.replace("://", "://user:secret@") + "/")
    start = time.monotonic()
    with pytest.raises(DownloadError) as caught:
        zoo.fetch(entry, tmp_path, backoff=0)
    message = str(caught.value)
    assert f"more than {limit} bytes" in message and "4 bytes per parameter x 1.25 + 1 MiB" in message
    assert f"Could not download http://user:***@127.0.0.1:{server.url.rsplit(':', 1)[1]}/{entry.path}" in message
    assert "secret" not in message and "partial download" not in message
    assert time.monotonic() - start < 5 and len(server.requests) == 1  # refused, not retried
    folder = zoo.cache_path(entry, tmp_path).parent
    assert sorted(p.name for p in folder.iterdir()) == []  # no partial file, no resume state, no lock left


def test_no_room_in_the_cache_removes_the_partial_download_and_says_so(tmp_path, payload, serve):
    """A real process whose file-size limit (``ulimit -f``: as a full disk, EFBIG) stops the download half-way: one
    ``DownloadError`` saying there is no room (not "make it writable"), and no partial file left to hold the disk."""
    import resource

    entry = zoo.get("Ti_16.augreg_in21k")
    server = serve({"/" + entry.path: payload})

    def half():
        resource.setrlimit(resource.RLIMIT_FSIZE, (len(payload) // 2, len(payload) // 2))

    code = (
        "import sys\nfrom keras_vit import zoo\ntry:\n    zoo.fetch(zoo.get(sys.argv[1]), sys.argv[2], backoff=0)\n"
        "except zoo.DownloadError as error:\n    print(error)\n"
    )
    env = {**os.environ, zoo.MIRROR_ENV: server.url + "/"}
    run = subprocess.run(
        [sys.executable, "-c", code, entry.name, str(tmp_path)],
        env=env,
        preexec_fn=half,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    folder = zoo.cache_path(entry, tmp_path).parent
    assert f"No room in the cache folder {folder} for {entry.path.rsplit('/', 1)[-1]}" in run.stdout, run.stdout
    assert "File too large" in run.stdout and "the partial download was removed" in run.stdout
    assert "writable" not in run.stdout
    assert sorted(p.name for p in folder.iterdir()) == []  # no partial file, no resume state, no lock left


def test_fetch_takes_timeout_and_deadline(tmp_path, payload, serve, monkeypatch):
    entry = zoo.get("Ti_16.augreg_in21k")
    server = serve({"/" + entry.path: payload}, faults=["stall", "stall"])
    monkeypatch.setenv(zoo.MIRROR_ENV, server.url)
    start = time.monotonic()
    with pytest.raises(DownloadError, match="the deadline passed"):
        zoo.fetch(entry, tmp_path, timeout=0.3, deadline=0.8, backoff=0.1)
    assert time.monotonic() - start < 1.5 and len(server.requests) == 2


# --- concurrent clients ---------------------------------------------------------------------------------


def test_three_threads_share_one_download(tmp_path, payload, serve):
    server = serve({"/a.npz": payload}, faults=["slow"])
    barrier, results = threading.Barrier(3), []

    def client():
        barrier.wait()
        results.append(fetch_file(server, tmp_path))

    threads = [threading.Thread(target=client) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(results) == 3 and len(set(results)) == 1 and results[0].read_bytes() == payload
    assert server.requests == [("/a.npz", None, None)]
    assert cache_listing(tmp_path) == ["a.npz", "a.npz.sha256"]


def test_three_processes_share_one_download(tmp_path, payload, serve):
    server = serve({"/a.npz": payload}, faults=["slow"])
    dest = tmp_path / "cache" / "a.npz"
    # zoo/ imports nothing of the models: run it as a top-level package, without loading TensorFlow
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r}); from zoo.download import download; "
        f"from zoo.validate import check_npz; "
        f"print(download({server.url + '/a.npz'!r}, {str(dest)!r}, validate=check_npz, backoff=0, timeout=5))"
    )
    clients = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outputs = [client.communicate(timeout=30) for client in clients]
    assert [client.returncode for client in clients] == [0, 0, 0], [err for _, err in outputs]
    assert [out.strip() for out, _ in outputs] == [str(dest)] * 3 and dest.read_bytes() == payload
    assert server.requests == [("/a.npz", None, None)]
    assert cache_listing(tmp_path) == ["a.npz", "a.npz.sha256"]


def test_a_lock_held_past_the_deadline_is_an_error(tmp_path, payload, serve):
    from keras_vit.zoo.lock import file_lock

    server = serve({"/a.npz": payload})
    (tmp_path / "cache").mkdir()
    waiting = pytest.raises(DownloadError, match=r"Gave up waiting for .*a\.npz\.lock")
    with file_lock(tmp_path / "cache" / "a.npz.lock"), waiting:
        fetch_file(server, tmp_path, deadline=0.3)
    assert server.requests == [] and fetch_file(server, tmp_path).read_bytes() == payload


# --- the cache: records checked on later reads ----------------------------------------------------------


def test_a_catalogue_name_downloads_into_the_keras_cache_once_and_loads(tmp_path, serve, monkeypatch, capsys):
    arrays = vit_checkpoint(**TI_16, num_classes=21843)  # the entry's own architecture (a toy file is refused)
    entry = zoo.get("Ti_16.augreg_in21k")
    data = write_checkpoint(tmp_path / "source.npz", arrays).read_bytes()
    server = serve({"/" + entry.path: data}, faults=["drop"])
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras_home"))
    monkeypatch.setenv(zoo.MIRROR_ENV, server.url)
    model = keras_vit.ViT_Ti16(weights="Ti_16.augreg_in21k")
    cached = tmp_path / "keras_home" / "models" / "vit_models" / entry.path
    assert cached.read_bytes() == data and model.input_shape == (None, 224, 224, 3)
    assert model.output_shape == (None, 21843) and recorded(cached) == hashlib.sha256(data).hexdigest()
    np.testing.assert_array_equal(model.get_layer("head").bias.numpy(), arrays["head/bias"])
    checked = "Ti_16.augreg_in21k: downloaded and checked by its architecture only (no public size or sha256"
    assert checked in capsys.readouterr().err
    requests = len(server.requests)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # the head was asked to be dropped: nothing to warn about
        keras_vit.ViT_Ti16(weights="Ti_16.augreg_in21k", include_top=False, image_size=32)
    assert len(server.requests) == requests and "downloaded" not in capsys.readouterr().err  # served from the cache


def test_a_file_of_another_architecture_is_neither_cached_nor_loaded_under_a_catalogue_name(
    tmp_path, payload, serve, monkeypatch, capsys
):
    """A mirror's toy file (width 32, one block, 10 classes) served as ``B_16.orig_in21k``: refused from its array
    headers, naming what differs, before it enters the cache; one put in the cache by hand is named and kept."""
    from keras_vit.zoo.__main__ import main as zoo_main

    entry = zoo.get("B_16.orig_in21k")
    server = serve({"/" + entry.path: payload})
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    monkeypatch.setenv(zoo.MIRROR_ENV, server.url)
    differs = (
        r"is not the checkpoint B_16.orig_in21k \(B/16 at 224 px\): another architecture: width 32 \(B_16.orig_in21k: "
        r"768\), depth 1 \(B_16.orig_in21k: 12\), heads 2 \(B_16.orig_in21k: 12\), mlp 64 \(B_16.orig_in21k: 3072\), "
        r"grid \(2, 2\) \(B_16.orig_in21k: \(14, 14\)\), classes 10 \(B_16.orig_in21k: 21843\), pre_logits None "
        r"\(B_16.orig_in21k: 768\)"
    )
    with pytest.raises(CorruptCheckpointError, match=differs + r".*the file was deleted"):
        keras_vit.ViT_B16(weights=entry.name)
    cached = zoo.cache_path(entry)
    assert not cached.parent.exists() or sorted(p.name for p in cached.parent.iterdir()) == []
    with pytest.raises(SystemExit):
        zoo_main(["download", entry.name])
    assert re.search("error: .*" + differs, capsys.readouterr().err) and not cached.exists()
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_bytes(payload)  # by hand, or cached by an older keras-vit
    with pytest.raises(CorruptCheckpointError, match=re.escape(str(cached)) + " " + differs):
        keras_vit.load_weights(keras_vit.ViT_B16(include_top=False, image_size=32), entry.name)
    assert cached.read_bytes() == payload  # named, not deleted: the user put it there


def test_weights_imagenet_and_imagenet21k_resolve_per_variant_and_resolution(tmp_path, serve, monkeypatch, capsys):
    """keras.applications' ``weights="imagenet"``: the catalogue's recommended entry for the variant and size."""
    from keras_vit.names import alias_checkpoint as _alias_checkpoint

    assert _alias_checkpoint("imagenet", "B/16", None) == "B_16.augreg_in21k_ft_in1k_224"
    assert _alias_checkpoint("imagenet", "ViT_B16", 384) == "B_16.augreg_in21k_ft_in1k_384"
    assert _alias_checkpoint("imagenet", "L/32", (384, 384)) == "L_32.orig_in21k_ft_in1k"  # no AugReg fine-tune
    assert _alias_checkpoint("imagenet21k", "R50+B/16", None) == "R50_B_16.orig_in21k"
    assert _alias_checkpoint("augreg", "ViT_R26_S32", 384) == "R26_S_32.augreg_in21k_ft_in1k_384"
    with pytest.raises(ValueError, match=r"No 'imagenet' checkpoint of this variant at 224 px.*H_14\.orig_in21k"):
        _alias_checkpoint("imagenet", "H/14", None)
    with pytest.raises(ValueError, match="square"):
        _alias_checkpoint("imagenet", "B/16", (224, 320))

    entry = zoo.get("Ti_16.augreg_in21k_ft_in1k_224")  # what ViT_Ti16(weights="imagenet") loads, from a mirror
    arrays = vit_checkpoint(**TI_16, num_classes=1000)
    server = serve({"/" + entry.path: write_checkpoint(tmp_path / "source.npz", arrays).read_bytes()})
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras_home"))
    monkeypatch.setenv(zoo.MIRROR_ENV, server.url)
    model = keras_vit.ViT_Ti16(weights="imagenet")
    assert [r[0] for r in server.requests] == ["/" + entry.path]
    bar = capsys.readouterr().err  # the Python API shows the command's progress bar while it downloads
    assert re.search(rf"{entry.name} \[#+\] 100%  (\d+\.\d) / \1 MiB", bar), bar
    assert model.input_shape == (None, 224, 224, 3) and model.output_shape == (None, 1000)
    np.testing.assert_array_equal(model.get_layer("head").bias.numpy(), arrays["head/bias"])
    # timm's name and tag: the same catalogue entry, from the cache
    tagged = keras_vit.ViT("vit_tiny_patch16_224.augreg_in21k_ft_in1k", weights="imagenet")
    np.testing.assert_array_equal(tagged.get_layer("head").bias.numpy(), arrays["head/bias"])
    # include_preprocessing: the checkpoint's own (timm's crop_pct 0.9, bicubic)
    raw = keras_vit.ViT_Ti16(weights="imagenet", include_preprocessing=True)
    layer = raw.get_layer("preprocessing")
    assert (layer.image_size, layer.crop_fraction, layer.interpolation) == ((224, 224), 0.9, "bicubic")
    assert (raw.config.crop_fraction, raw.config.interpolation) == (0.9, "bicubic")
    assert len(server.requests) == 1


def test_offline_catalogue_name_fails_naming_the_url_and_the_cache_path(tmp_path, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv(zoo.MIRROR_ENV, f"http://127.0.0.1:{port}/vit_models")
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    entry = zoo.get("B_16.orig_in21k")
    with pytest.raises(DownloadError) as info:
        zoo.fetch(entry, retries=1, backoff=0)
    assert f"http://127.0.0.1:{port}/vit_models/imagenet21k/ViT-B_16.npz" in str(info.value)
    assert str(tmp_path / "models" / "vit_models" / "imagenet21k" / "ViT-B_16.npz") in str(info.value)


# --- links in the cache and credentials on redirects (issue 36) ---------------------------------------------


def _download_with_credentials(tmp_path, redirect_to, payload=None, seen=None):
    """``download`` of ``http://reader:s3cret@127.0.0.1:PORT/a.npz`` from a server on 127.0.0.1 that redirects
    ``/a.npz`` to ``redirect_to(port)`` and serves ``payload`` elsewhere, noting Authorization headers in ``seen``."""

    class Mirror(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/a.npz":
                self.send_response(302)
                self.send_header("Location", redirect_to(self.server.server_address[1]))
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            seen.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    mirror = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Mirror)
    threading.Thread(target=mirror.serve_forever, args=(0.05,), daemon=True).start()
    try:
        url = f"http://reader:s3cret@127.0.0.1:{mirror.server_address[1]}/a.npz"
        return download(url, tmp_path / "cache" / "a.npz", backoff=0, timeout=5, deadline=20, validate=check_npz)
    finally:
        mirror.shutdown()
        mirror.server_close()


@pytest.mark.backend_independent
@pytest.mark.parametrize("other_host", ["localhost", "127.0.0.1"])
def test_credentials_are_not_sent_to_the_host_a_redirect_names(tmp_path, payload, serve, other_host):
    target = serve({"/a.npz": payload})
    port = target.url.rsplit(":", 1)[1]
    dest = _download_with_credentials(tmp_path, lambda _: f"http://{other_host}:{port}/a.npz")
    assert dest.read_bytes() == payload
    assert target.authorizations == [None]  # another port (or host) than the URL's: no Authorization header


@pytest.mark.backend_independent
@pytest.mark.parametrize("same_origin", [True, False], ids=["same-host-and-port", "other-host-same-port"])
def test_credentials_follow_a_redirect_only_on_the_urls_own_host_and_port(tmp_path, payload, same_origin):
    """``/a.npz`` redirects to ``/b.npz`` on the same server, by path (the header is kept, as ``requests`` and
    ``curl`` keep it) or by the name ``localhost`` and the same port (another host: the header is dropped)."""
    seen: list = []
    where = (lambda _: "/b.npz") if same_origin else (lambda port: f"http://localhost:{port}/b.npz")
    dest = _download_with_credentials(tmp_path, where, payload, seen)
    assert dest.read_bytes() == payload
    expected = "Basic " + base64.b64encode(b"reader:s3cret").decode()
    assert seen == ([expected] if same_origin else [None])
