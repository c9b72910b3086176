"""The zoo: the catalogue, ``python -m keras_vit.zoo list``, and downloads from a real HTTP server on 127.0.0.1."""

import configparser
import hashlib
import http.server
import importlib
import json
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import keras_vit
from keras_vit import zoo
from keras_vit.models import parse_variant
from npz_layout import vit_checkpoint, write_checkpoint
from keras_vit.zoo.download import DownloadError, download

GCS = "https://storage.googleapis.com/vit_models/"


# --- the catalogue --------------------------------------------------------------------------------


def test_catalogue_rows_are_complete_and_consistent():
    entries = zoo.catalogue()
    assert len({e.name for e in entries}) == len(entries) == len({e.path for e in entries})
    for e in entries:
        assert e.url == GCS + e.path and e.path.endswith(".npz")
        assert e.family in ("original", "augreg") and e.pretrain in ("imagenet21k", "imagenet2012")
        assert e.image_size in (224, 384) and e.num_classes == (21843 if e.finetune is None else 1000)
        assert e.sha256 is None or re.fullmatch(r"[0-9a-f]{64}", e.sha256)
        assert (e.top1 is None) == (e.top1_source is None)
        resnet, _, vit = e.variant.rpartition("+")
        if resnet:
            assert re.fullmatch(r"R\d*", resnet) and e.name.startswith(resnet)
        else:
            parse_variant(vit)
        if e.finetune and e.family == "augreg":
            assert e.path.endswith(f"res_{e.image_size}.npz")


def test_catalogue_holds_the_published_files():
    paths = {e.path for e in zoo.catalogue()}
    assert {
        "imagenet21k/ViT-B_16.npz", "imagenet21k/ViT-L_16.npz", "imagenet21k/ViT-H_14.npz",
        "imagenet21k+imagenet2012/ViT-B_16.npz", "imagenet21k+imagenet2012/ViT-B_16-224.npz",
        "imagenet21k/R50+ViT-B_16.npz", "imagenet21k+imagenet2012/R50+ViT-B_16.npz",
        "augreg/B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0--imagenet2012-steps_20k-lr_0.01-res_384.npz",
    } <= paths
    assert zoo.get("imagenet21k+imagenet2012/ViT-B_16") is zoo.get("B_16.orig_in21k_ft_in1k")
    assert zoo.get("B_16.orig_in21k_ft_in1k").image_size == 384
    with pytest.raises(ValueError, match=r"Did you mean \['B_16.orig_in21k'"):
        zoo.get("B_16.orig_in21")


def test_list_command_prints_the_catalogue():
    run = subprocess.run([sys.executable, "-m", "keras_vit.zoo", "list"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len([line for line in lines if line.split()[:1] and zoo.find(line.split()[0])]) == len(zoo.catalogue())
    assert re.search(r"^B_16\.orig_in21k_ft_in1k\s+B/16\s+imagenet21k\s+imagenet2012\s+384\s+84\.62", run.stdout, re.M)
    as_json = subprocess.run([sys.executable, "-m", "keras_vit.zoo", "list", "--family", "augreg", "--json"],
                             capture_output=True, text=True, timeout=60)
    rows = json.loads(as_json.stdout)
    assert rows and all(row["family"] == "augreg" and row["url"].startswith(GCS) for row in rows)


def test_console_script_entry_point_resolves(capsys):
    parser = configparser.ConfigParser()
    parser.read(Path(__file__).parents[1] / "setup.cfg")
    scripts = dict(line.split(" = ") for line in parser["options.entry_points"]["console_scripts"].split("\n") if line)
    module, _, function = scripts["keras-vit-zoo"].partition(":")
    getattr(importlib.import_module(module), function)(["list", "--family", "original"])
    assert "B_16.orig_in21k_ft_in1k_224" in capsys.readouterr().out


# --- downloads --------------------------------------------------------------------------------------


class Server:
    """``http.server`` in a thread serving ``files`` with Range support; ``cuts`` drops the connection
    halfway through that many first responses; ``ranges=False`` ignores Range headers."""

    def __init__(self, files, cuts=0, ranges=True):
        self.files, self.cuts, self.ranges, self.requests = files, cuts, ranges, []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                server.requests.append((self.path, self.headers.get("Range")))
                data = server.files.get(self.path)
                if data is None:
                    self.send_error(404)
                    return
                start = 0
                match = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
                if match and server.ranges:
                    start = int(match.group(1))
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                body = data[start:]
                if server.cuts > 0:
                    server.cuts -= 1
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def payload():
    return np.random.default_rng(0).bytes(300_000)


@pytest.fixture
def serve():
    servers = []

    def start(files, **kwargs):
        servers.append(Server(files, **kwargs))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def test_download_writes_the_file_and_no_partial(tmp_path, payload, serve):
    server = serve({"/a.npz": payload})
    sha = hashlib.sha256(payload).hexdigest()
    path = download(server.url + "/a.npz", tmp_path / "cache" / "a.npz", sha256=sha, backoff=0)
    assert path.read_bytes() == payload and sorted(p.name for p in path.parent.iterdir()) == ["a.npz"]
    assert server.requests == [("/a.npz", None)]


def test_a_cut_connection_resumes_with_a_range_request(tmp_path, payload, serve):
    server = serve({"/a.npz": payload}, cuts=1)
    path = download(server.url + "/a.npz", tmp_path / "a.npz", backoff=0)
    assert path.read_bytes() == payload
    (first, no_range), (second, resumed) = server.requests
    assert no_range is None and re.fullmatch(r"bytes=(\d+)-", resumed)
    assert 0 < int(resumed[6:-1]) < len(payload)
    assert not (tmp_path / "a.npz.part").exists()


def test_a_server_ignoring_range_restarts_the_file(tmp_path, payload, serve):
    server = serve({"/a.npz": payload}, cuts=1, ranges=False)
    assert download(server.url + "/a.npz", tmp_path / "a.npz", backoff=0).read_bytes() == payload
    assert len(server.requests) == 2 and server.requests[1][1] is not None


def test_too_many_cuts_keep_the_partial_file_for_later(tmp_path, payload, serve):
    server = serve({"/a.npz": payload}, cuts=5)
    kept = r"(?s)connection closed after .* The partial download .*a\.npz\.part is kept"
    with pytest.raises(DownloadError, match=kept):
        download(server.url + "/a.npz", tmp_path / "a.npz", retries=2, backoff=0)
    assert not (tmp_path / "a.npz").exists() and 0 < (tmp_path / "a.npz.part").stat().st_size < len(payload)
    server.cuts = 0
    assert download(server.url + "/a.npz", tmp_path / "a.npz", backoff=0).read_bytes() == payload


def test_a_hash_mismatch_is_an_error_and_leaves_no_file(tmp_path, payload, serve):
    server = serve({"/a.npz": payload})
    with pytest.raises(DownloadError, match="sha256 mismatch .* expected 0000.*the file was deleted"):
        download(server.url + "/a.npz", tmp_path / "a.npz", sha256="0" * 64, backoff=0)
    assert list(tmp_path.iterdir()) == []


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
    server = serve({})
    with pytest.raises(DownloadError, match=r"HTTP 404"):
        download(server.url + "/absent.npz", tmp_path / "absent.npz", retries=3, backoff=0)
    assert len(server.requests) == 1  # not found: no retries


def test_a_catalogue_name_downloads_into_the_keras_cache_once_and_loads(tmp_path, serve, monkeypatch):
    arrays = vit_checkpoint(patch=16, width=32, depth=1, heads=2, mlp=64, grid=(2, 2), num_classes=21843)
    entry = zoo.get("Ti_16.augreg_in21k")
    data = write_checkpoint(tmp_path / "source.npz", arrays).read_bytes()
    server = serve({"/" + entry.path: data}, cuts=1)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras_home"))
    monkeypatch.setenv(zoo.MIRROR_ENV, server.url)
    tiny = dict(hidden_size=32, depth=1, num_heads=2, mlp_dim=64)
    model = keras_vit.ViT_Ti16(weights="Ti_16.augreg_in21k", **tiny)
    cached = tmp_path / "keras_home" / "models" / "vit_models" / entry.path
    assert cached.read_bytes() == data and model.input_shape == (None, 32, 32, 3)
    assert model.output_shape == (None, 21843)
    np.testing.assert_array_equal(model.get_layer("head").bias.numpy(), arrays["head/bias"])
    requests = len(server.requests)
    with pytest.warns(UserWarning, match="include_top=False"):
        keras_vit.ViT_Ti16(weights="Ti_16.augreg_in21k", include_top=False, **tiny)
    assert len(server.requests) == requests  # served from the cache


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
