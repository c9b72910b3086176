"""The zoo: the catalogue and the command line (``list``, ``verify``, errors). Downloads: ``test_download.py``."""

import configparser
import importlib
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from npz_layout import vit_checkpoint, write_checkpoint

from keras_vit import zoo
from keras_vit.variants import parse_variant
from keras_vit.zoo.__main__ import main as zoo_main

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


def test_list_command_prints_the_catalogue(capsys):
    run = subprocess.run([sys.executable, "-m", "keras_vit.zoo", "list"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len([line for line in lines if line.split()[:1] and zoo.find(line.split()[0])]) == len(zoo.catalogue())
    assert re.search(r"^B_16\.orig_in21k_ft_in1k\s+B/16\s+imagenet21k\s+imagenet2012\s+384\s+84\.62", run.stdout, re.M)
    zoo_main(["list", "--family", "augreg", "--json"])  # in-process: one interpreter start (TensorFlow) is enough
    rows = json.loads(capsys.readouterr().out)
    assert rows and all(row["family"] == "augreg" and row["url"].startswith(GCS) for row in rows)


def test_console_script_entry_point_resolves(capsys):
    parser = configparser.ConfigParser()
    parser.read(Path(__file__).parents[1] / "setup.cfg")
    scripts = dict(line.split(" = ") for line in parser["options.entry_points"]["console_scripts"].split("\n") if line)
    module, _, function = scripts["keras-vit-zoo"].partition(":")
    getattr(importlib.import_module(module), function)(["list", "--family", "original"])
    assert "B_16.orig_in21k_ft_in1k_224" in capsys.readouterr().out


# --- the cache, on the command line ---------------------------------------------------------------


def test_verify_command_reports_ok_unrecorded_and_corrupt_files(tmp_path, capsys):
    cache = ["--cache-dir", str(tmp_path)]
    first, second = zoo.get("Ti_16.augreg_in21k"), zoo.get("S_16.augreg_in21k")
    arrays = vit_checkpoint(patch=16, width=32, depth=1, heads=2, mlp=64, grid=(2, 2))
    for entry in (first, second):
        zoo.cache_path(entry, tmp_path).parent.mkdir(parents=True, exist_ok=True)
        write_checkpoint(zoo.cache_path(entry, tmp_path), arrays)
    zoo_main([*cache, "verify"])
    out = capsys.readouterr().out
    assert re.search(r"^unrecorded +Ti_16.augreg_in21k: .*no sha256 recorded, structure OK", out, re.M)
    assert "2 cached files checked, 0 corrupt" in out
    assert zoo.fetch(first, tmp_path) == zoo.cache_path(first, tmp_path)  # checked and recorded
    path = zoo.cache_path(second, tmp_path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))  # unrecorded and damaged: the structural check finds it
    with pytest.raises(SystemExit) as exit_:
        zoo_main([*cache, "verify"])
    out = capsys.readouterr().out
    assert exit_.value.code == 1 and re.search(r"^OK +Ti_16.augreg_in21k: .*sha256 [0-9a-f]{64}", out, re.M)
    assert re.search(r"^corrupt +S_16.augreg_in21k: .*CRC-32", out, re.M) and "1 corrupt" in out
    path = zoo.cache_path(first, tmp_path)
    path.write_bytes(path.read_bytes() + b"\0")  # recorded and changed
    with pytest.raises(SystemExit):
        zoo_main([*cache, "verify", first.name, "B_16.orig_in21k"])
    out = capsys.readouterr().out
    assert re.search(r"^corrupt +Ti_16.augreg_in21k: .*recorded when it was downloaded", out, re.M)
    assert re.search(r"^missing +B_16.orig_in21k: not cached", out, re.M) and "S_16" not in out


def _as_another_user(function) -> tuple[int, str]:
    """``function()`` in a child process without root's rights (permissions mean nothing to root):
    its exit status and what it printed on stderr."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: everything it needs is imported already
        code = 99
        try:
            os.close(read)
            os.setgid(65534)
            os.setuid(65534)
            sys.stderr = io.StringIO()
            try:
                function()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            os.write(write, sys.stderr.getvalue().encode())
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as f:
        printed = f.read()
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), printed


def test_a_read_only_cache_is_a_clear_one_line_error(monkeypatch, capsys):
    with socket.socket() as s:  # were it taken for a network problem, the message would say connection refused
        s.bind(("127.0.0.1", 0))
        monkeypatch.setenv(zoo.MIRROR_ENV, f"http://127.0.0.1:{s.getsockname()[1]}/")
    folder = Path(tempfile.mkdtemp(prefix="read-only-cache-"))  # not under pytest's root-only tmp_path
    try:
        (folder / "models").mkdir()
        for path in (folder / "models", folder):
            path.chmod(0o555)
        argv = ["--cache-dir", str(folder), "download", "Ti_16.augreg_in21k", "--timeout", "1"]
        if os.geteuid() == 0:
            status, printed = _as_another_user(lambda: zoo_main(argv))
        else:
            with pytest.raises(SystemExit) as exit_:
                zoo_main(argv)
            status, printed = exit_.value.code, capsys.readouterr().err
    finally:
        for path in (folder, folder / "models"):
            path.chmod(0o755)
        shutil.rmtree(folder)
    assert status == 1 and printed.count("\n") == 1 and "Traceback" not in printed
    assert printed.startswith(f"error: Cannot write to the cache folder {folder / 'models' / 'vit_models'}")
    assert "Permission denied" in printed and "refused" not in printed


def test_command_line_errors_are_one_line(capsys):
    for argv in (["download", "B_16.orig_in21"], ["verify", "nothing-like-it"]):
        with pytest.raises(SystemExit) as exit_:
            zoo_main(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 1 and err.startswith("error: No checkpoint") and err.count("\n") == 1
