"""The zoo's command line (``list``, ``verify``, ``info``, ``convert``, errors). The catalogue: ``test_catalogue.py``;
downloads: ``test_download.py``."""

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

import keras
import pytest
from npz_layout import TI_16, vit_checkpoint, write_checkpoint

from keras_vit import zoo
from keras_vit.zoo.__main__ import main as zoo_main

pytestmark = pytest.mark.backend_independent  # files, names and checks: the same on every backend

GCS = "https://storage.googleapis.com/vit_models/"


# --- listing the catalogue --------------------------------------------------------------------------------


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
    parser.read(Path(__file__).parents[2] / "setup.cfg")
    scripts = dict(line.split(" = ") for line in parser["options.entry_points"]["console_scripts"].split("\n") if line)
    module, _, function = scripts["keras-vit-zoo"].partition(":")
    getattr(importlib.import_module(module), function)(["list", "--family", "original"])
    assert "B_16.orig_in21k_ft_in1k_224" in capsys.readouterr().out


# --- the cache, on the command line ---------------------------------------------------------------


def test_verify_command_reports_ok_unrecorded_and_corrupt_files(tmp_path, capsys):
    cache = ["--cache-dir", str(tmp_path)]
    first, second = zoo.get("Ti_16.augreg_in21k"), zoo.get("Ti_16.augreg_in21k_ft_in1k_224")
    for entry in (first, second):  # each of its entry's architecture, as the zoo caches only those
        zoo.cache_path(entry, tmp_path).parent.mkdir(parents=True, exist_ok=True)
        write_checkpoint(zoo.cache_path(entry, tmp_path), vit_checkpoint(**TI_16, num_classes=entry.num_classes))
    toy = zoo.get("B_16.orig_in21k")  # a file of another architecture, put there by hand: corrupt, named
    zoo.cache_path(toy, tmp_path).parent.mkdir(parents=True, exist_ok=True)
    write_checkpoint(zoo.cache_path(toy, tmp_path), vit_checkpoint(patch=16, width=32, depth=1, heads=2, mlp=64))
    with pytest.raises(SystemExit):
        zoo_main([*cache, "verify"])
    out = capsys.readouterr().out
    assert re.search(r"^unrecorded +Ti_16.augreg_in21k: .*no sha256 recorded, structure OK", out, re.M)
    assert re.search(r"^corrupt +B_16.orig_in21k: .*is not the checkpoint B_16.orig_in21k .*width 32", out, re.M)
    assert "3 cached files checked, 1 corrupt; 3 by their architecture only, with no public size or sha256" in out
    assert re.search(r"^unrecorded +Ti_16.augreg_in21k: .*; checked by its architecture only \(no public", out, re.M)
    zoo.cache_path(toy, tmp_path).unlink()
    assert zoo.fetch(first, tmp_path) == zoo.cache_path(first, tmp_path)  # checked and recorded
    path = zoo.cache_path(second, tmp_path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))  # unrecorded and damaged: the structural check finds it
    with pytest.raises(SystemExit) as exit_:
        zoo_main([*cache, "verify"])
    out = capsys.readouterr().out
    assert exit_.value.code == 1 and re.search(r"^OK +Ti_16.augreg_in21k: .*sha256 [0-9a-f]{64}", out, re.M)
    assert re.search(r"^corrupt +Ti_16.augreg_in21k_ft_in1k_224: .*CRC-32", out, re.M) and "1 corrupt" in out
    path = zoo.cache_path(first, tmp_path)
    path.write_bytes(path.read_bytes() + b"\0")  # recorded and changed
    with pytest.raises(SystemExit):
        zoo_main([*cache, "verify", first.name, "B_16.orig_in21k"])
    out = capsys.readouterr().out
    assert re.search(r"^corrupt +Ti_16.augreg_in21k: .*recorded when it was downloaded", out, re.M)
    assert re.search(r"^missing +B_16.orig_in21k: not cached", out, re.M) and "ft_in1k" not in out


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


# --- listing the model cards --------------------------------------------------------------------------------


def test_list_shows_parameters_top1_and_licence(capsys):
    zoo_main(["list", "--family", "augreg"])
    out = capsys.readouterr().out
    assert re.search(r"^Ti_16\.augreg_in21k_ft_in1k_224 .* 224 +75\.45\* +5\.7M +Apache-2\.0", out, re.M)
    assert re.search(r"^Ti_16\.augreg_in21k +Ti/16 .* 224 +- +9\.7M +Apache-2\.0", out, re.M)
    assert "* top-1 of timm's own evaluation" in out


def test_names_and_list_take_shell_style_patterns(capsys):
    every = zoo.names()
    assert zoo.names("Ti_16*") == [n for n in every if n.startswith("Ti_16")] and len(zoo.names("Ti_16*")) == 3
    assert zoo.names("*.orig_in21k") == [n for n in every if n.endswith(".orig_in21k")] != []
    assert zoo.names("B_16.orig_in21k") == ["B_16.orig_in21k"] and zoo.names("nothing*") == []
    zoo_main(["list", "Ti_16*"])
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.startswith("Ti_16")]
    assert rows == zoo.names("Ti_16*")
    zoo_main(["list", "*_in21k", "--family", "original", "--json"])
    listed = [entry["name"] for entry in json.loads(capsys.readouterr().out)]
    assert listed == [e.name for e in zoo.catalogue() if e.family == "original" and e.name.endswith("_in21k")] != []


# --- convert: the export formats ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """A 32 px, one-block checkpoint in the published layout, its Keras model and images for it."""
    import numpy as np

    from keras_vit import model_from_checkpoint

    path = write_checkpoint(tmp_path_factory.mktemp("npz") / "tiny.npz", vit_checkpoint(depth=1, grid=(2, 2)))
    images = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    return path, model_from_checkpoint(path), images


def _convert_and_compare(tiny_checkpoint, out, *argv, atol=1e-4):
    import numpy as np

    from keras_vit import export

    path, model, images = tiny_checkpoint
    zoo_main(["convert", str(path), str(out), *argv])
    np.testing.assert_allclose(export.load(out)(images), model.predict_on_batch(images), atol=atol)
    assert [p.name for p in out.parent.iterdir()] == [out.name]  # nothing else left beside it


@pytest.mark.backends("tensorflow")  # the formats this backend exports: docs/backends.md
def test_convert_to_litert_by_suffix_and_quantized(tiny_checkpoint, tmp_path, capsys):
    (tmp_path / "a").mkdir()
    _convert_and_compare(tiny_checkpoint, tmp_path / "a" / "vit.tflite")
    assert "LiteRT" in capsys.readouterr().out
    (tmp_path / "b").mkdir()
    _convert_and_compare(tiny_checkpoint, tmp_path / "b" / "int8.tflite", "--quantize", "dynamic_int8", atol=0.3)


@pytest.mark.backends("tensorflow", "jax")  # the formats this backend exports: docs/backends.md
def test_convert_to_saved_model_folder(tiny_checkpoint, tmp_path):
    (tmp_path / "out").mkdir()
    _convert_and_compare(tiny_checkpoint, tmp_path / "out" / "vit_savedmodel", "--format", "saved_model")
    with pytest.raises(SystemExit):  # an existing folder is not replaced
        zoo_main(
            ["convert", str(tiny_checkpoint[0]), str(tmp_path / "out" / "vit_savedmodel"), "--format", "saved_model"]
        )


def test_convert_refuses_an_existing_output_unless_overwrite_and_writes_it_whole(tiny_checkpoint, tmp_path, capsys):
    import numpy as np
    from staging_support import killed_staging

    from keras_vit import model_from_checkpoint
    from keras_vit.zoo.__main__ import STAGING

    path, model, images = tiny_checkpoint
    out = tmp_path / "vit.weights.h5"
    out.write_bytes(b"the user's own file")
    with pytest.raises(SystemExit) as exit_:
        zoo_main(["convert", str(path), str(out)])
    err = capsys.readouterr().err
    assert exit_.value.code == 1 and f"error: The output {out} exists (a file): pass --overwrite" in err
    assert out.read_bytes() == b"the user's own file"
    killed_staging(tmp_path, STAGING)  # what a convert killed by SIGKILL left: the next one removes it
    zoo_main(["convert", str(path), str(out), "--overwrite"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vit.weights.h5"]  # replaced whole, nothing beside it
    again = model_from_checkpoint(path)
    again.load_weights(out)
    np.testing.assert_array_equal(again.predict_on_batch(images), model.predict_on_batch(images))


@pytest.mark.backends("tensorflow")  # the formats this backend exports: docs/backends.md
@pytest.mark.requires("tf2onnx", "onnxruntime")
def test_convert_to_onnx(tiny_checkpoint, tmp_path):
    _convert_and_compare(tiny_checkpoint, tmp_path / "vit.onnx")


@pytest.mark.parametrize("output, method", [("vit.tflite", "export"), ("vit.keras", "save")])
def test_a_failing_convert_leaves_no_partial_output(tiny_checkpoint, tmp_path, monkeypatch, capsys, output, method):
    def broken(model, path, *args, **kwargs):  # Keras' converter or saver, failing half-way through its file
        Path(path).write_bytes(b"half a file")
        raise ValueError("the converter failed")

    monkeypatch.setattr(keras.Model, method, broken)
    keep = tmp_path / "notes.txt"
    keep.write_text("the user's")
    with pytest.raises(SystemExit) as exit_:
        zoo_main(["convert", str(tiny_checkpoint[0]), str(tmp_path / output)])
    assert exit_.value.code == 1 and "the converter failed" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"] and keep.read_text() == "the user's"
    monkeypatch.undo()
    for argv in (["vit.unknown"], ["vit.keras", "--quantize", "dynamic_int8"], ["vit.onnx", "--format", "litert"]):
        with pytest.raises(SystemExit):
            zoo_main(["convert", str(tiny_checkpoint[0]), str(tmp_path / argv[0]), *argv[1:]])
        assert capsys.readouterr().err.startswith("error: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_convert_writes_every_file_with_the_mode_the_umask_gives(tiny_checkpoint, tmp_path):
    old = os.umask(0o022)
    try:
        for name in ("vit.safetensors", "vit.keras", "vit.weights.h5"):  # safetensors' writer makes 0600 files
            zoo_main(["convert", str(tiny_checkpoint[0]), str(tmp_path / name)])
            assert oct((tmp_path / name).stat().st_mode & 0o777) == "0o644", name
    finally:
        os.umask(old)


@pytest.mark.parametrize("command", ["info", "convert"])
def test_a_missing_file_is_named_as_a_missing_file_and_an_unknown_name_as_not_in_the_catalogue(
    tmp_path, capsys, monkeypatch, command
):
    monkeypatch.chdir(tmp_path)
    out = ["out.keras"] if command == "convert" else []
    for source, said in [
        ("missing.npz", "error: No checkpoint file at missing.npz (nor a folder); expected a Google .npz"),
        ("models/B_16.npz", "error: No checkpoint file at models/B_16.npz (nor a folder)"),
        ("B_16_nope", "error: No checkpoint 'B_16_nope' in the zoo catalogue."),
    ]:
        with pytest.raises(SystemExit) as exited:
            zoo_main([command, source, *out])
        err = capsys.readouterr().err
        assert exited.value.code == 1 and err.startswith(said) and err.count("\n") == 1, err
    assert os.listdir(tmp_path) == []


def test_info_on_random_bytes_is_one_line_naming_the_file_without_numpys_hint(tmp_path, capsys):
    path = tmp_path / "random.npz"
    path.write_bytes(bytes(range(256)) * 12)
    with pytest.raises(SystemExit) as exited:
        zoo_main(["info", str(path)])
    err = capsys.readouterr().err
    assert exited.value.code == 1 and err.count("\n") == 1 and f"{path} is not a valid .npz checkpoint" in err
    assert "allow_pickle" not in err
