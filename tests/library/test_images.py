"""One image reader (keras_vit.images) for training, predict and the analyses, on real files: EXIF orientation,
16-bit PNGs, a decompression bomb, folders."""

import json
import os
import re
import struct
import subprocess
import sys
import threading
import zlib

import numpy as np
import pytest
from PIL import Image

import keras_vit
from keras_vit.images import image_files, image_problem, read_image
from keras_vit.predict import main as predict
from keras_vit.training.data import CorruptDataError, load_folder

pytestmark = pytest.mark.backend_independent  # files, names and checks: the same on every backend

ORIENTATION = 0x0112  # the EXIF tag; 6: the stored pixels are shown turned 90 degrees clockwise


def _photo(height=20, width=40, seed=0) -> np.ndarray:
    gradient = np.linspace(0, 255, width)[None, :, None] * np.ones((height, 1, 3))
    return np.clip(gradient + np.random.default_rng(seed).normal(0, 5, (height, width, 3)), 0, 255).astype(np.uint8)


def _rotated_jpeg(path, pixels) -> None:
    exif = Image.Exif()
    exif[ORIENTATION] = 6
    Image.fromarray(pixels).save(path, quality=95, exif=exif)


def _bomb_png(path, side: int = 30_000) -> None:
    """A valid PNG header declaring side x side pixels (900 megapixels), a few bytes long."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)))


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    model = keras_vit.ViT(None, image_size=32, patch_size=16, hidden_size=32, depth=1, num_heads=2, mlp_dim=64)
    rng = np.random.default_rng(0)
    for variable in model.weights:
        variable.assign(rng.normal(0, 0.2, variable.shape))
    path = tmp_path_factory.mktemp("model") / "model.keras"
    model.save(path)
    return str(path)


def _scores(capsys, *argv) -> list[list[float]]:
    assert predict([*argv, "--json", "--scores", "logits", "--top", "3", "--mixed-precision", "none"]) == 0
    return [[p["score"] for p in image["predictions"]] for image in json.loads(capsys.readouterr().out)]


def test_exif_orientation_is_applied_in_training_and_predict(tmp_path, model_path, capsys):
    stored = _photo()
    for name in ("a", "b"):
        (tmp_path / "data" / name).mkdir(parents=True)
        for i in range(3):
            _rotated_jpeg(tmp_path / "data" / name / f"{i}.jpg", stored)
    path = tmp_path / "data" / "a" / "0.jpg"
    upright = read_image(path)
    assert upright.shape == (40, 20, 3)  # turned: 20 wide, 40 high, as a viewer shows it
    np.testing.assert_allclose(upright.astype(float).mean(axis=(1, 2)), np.linspace(0, 255, 40), atol=12)
    source = load_folder(str(tmp_path / "data"), eval_fraction=0.34)
    trained_on = [image.numpy() for image, _ in source.train.examples()]
    assert all(image.shape == (40, 20, 3) for image in trained_on)
    np.testing.assert_array_equal(trained_on[0], read_image(source.train.items[0]))  # the same reader, pixel for pixel
    Image.fromarray(upright).save(tmp_path / "upright.png")  # lossless: the very pixels read from the JPEG
    rotated, plain = (
        _scores(capsys, str(path), "--weights", model_path),
        _scores(capsys, str(tmp_path / "upright.png"), "--weights", model_path),
    )
    assert rotated == plain


def test_a_16_bit_png_is_scaled_not_saturated_in_predict(tmp_path, model_path, capsys):
    wide = np.random.default_rng(0).integers(0, 65536, (32, 32), dtype=np.uint16)
    Image.fromarray(wide).save(tmp_path / "deep.png")
    with Image.open(tmp_path / "deep.png") as written:
        assert written.mode == "I;16"
    eight = ((wide.astype(np.uint32) + 128) // 257).astype(np.uint8)  # round(v / 257)
    Image.fromarray(np.repeat(eight[..., None], 3, axis=-1)).save(tmp_path / "eight.png")
    np.testing.assert_array_equal(read_image(tmp_path / "deep.png")[..., 0], eight)
    deep = _scores(capsys, str(tmp_path / "deep.png"), "--weights", model_path)
    assert deep == _scores(capsys, str(tmp_path / "eight.png"), "--weights", model_path)
    white = tmp_path / "white.png"  # what a saturating reader would have seen
    Image.fromarray(np.full((32, 32, 3), 255, np.uint8)).save(white)
    assert deep != _scores(capsys, str(white), "--weights", model_path)


def test_a_decompression_bomb_is_one_named_line_in_predict_and_skipped_named_in_training(tmp_path, model_path, capsys):
    bomb = tmp_path / "bomb.png"
    _bomb_png(bomb)
    assert bomb.stat().st_size < 200
    with pytest.raises(SystemExit) as exited:
        predict([str(bomb), "--weights", model_path])
    err = capsys.readouterr().err
    assert exited.value.code == 1 and err.count("\n") == 1 and str(bomb) in err
    assert "too large to decode safely" in err and "900000000 pixels" in err
    for name in ("a", "b"):
        (tmp_path / "data" / name).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(_photo(seed=i)).save(tmp_path / "data" / name / f"{i}.png")
    _bomb_png(tmp_path / "data" / "a" / "huge.png")
    with pytest.raises(CorruptDataError, match=r"1 of 7 image files do not decode: .*huge.png \(too large to decode"):
        load_folder(str(tmp_path / "data"), eval_fraction=0.34)
    source = load_folder(str(tmp_path / "data"), eval_fraction=0.34, skip_corrupt=True)
    assert "skipping 1 of 7 image files" in capsys.readouterr().err
    assert source.train.num_examples + source.eval.num_examples == 6


def test_folders_stand_for_their_images(tmp_path):
    (tmp_path / "photos" / "sub").mkdir(parents=True)
    (tmp_path / "photos" / ".cache").mkdir()
    for name in ("b.JPG", "sub/a.png", ".cache/x.png", ".hidden.png", "notes.txt"):
        (tmp_path / "photos" / name).write_bytes(b"")
    listed = image_files([tmp_path / "photos", tmp_path / "one.png"])
    assert listed == [
        str(tmp_path / "photos" / "b.JPG"),
        str(tmp_path / "photos" / "sub" / "a.png"),
        str(tmp_path / "one.png"),
    ]
    with pytest.raises(FileNotFoundError, match=r"nope\.png: no such file"):
        read_image(tmp_path / "nope.png")
    with pytest.raises(ValueError, match="photos: not a regular file"):
        read_image(tmp_path / "photos")


def _within(seconds: float, fifo, call):
    """``call()``'s error (or None), failing the test if it blocks (then the FIFO is opened to release it)."""
    outcome = {}

    def run():
        try:
            call()
        except Exception as error:  # the outcome is asserted by the caller
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():  # the regression: release the blocked reader, then fail
        with open(fifo, "wb"):
            pass
        pytest.fail(f"blocked on the FIFO {fifo}")
    return outcome.get("error")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this system")
def test_a_fifo_named_like_an_image_in_a_class_folder_is_refused_not_waited_on(tmp_path):
    for label in ("a", "b"):
        (tmp_path / "data" / label).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(_photo(seed=i)).save(tmp_path / "data" / label / f"{i}.png")
    fifo = tmp_path / "data" / "a" / "x.png"
    os.mkfifo(fifo)
    assert image_problem(fifo) == "not a regular file (a folder, pipe or device)"
    error = _within(30, fifo, lambda: read_image(fifo))
    assert (
        isinstance(error, ValueError)
        and str(error) == f"{fifo}: not a regular file (a folder, pipe or device), not an image."
    )
    error = _within(60, fifo, lambda: load_folder(str(tmp_path / "data"), eval_fraction=0.34))
    assert isinstance(error, CorruptDataError)
    assert re.search(r"1 of 7 image files do not decode: .*x\.png \(not a regular", str(error))


# In the child: the library's reader under the commands' error handler, so that what it prints is what a command
# prints; its own address space at the start (VmPeak, in kB) first, so the test can size the limit.
READ_UNDER_A_LIMIT = """
import sys
from keras_vit.cli import command_errors
from keras_vit.images import read_image
peak = next(line for line in open("/proc/self/status") if line.startswith("VmPeak"))
print(peak.split()[1], flush=True)
if len(sys.argv) > 2:
    with command_errors():
        read_image(sys.argv[1])
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the address space from Linux's /proc")
def test_a_large_image_under_a_memory_limit_is_one_line_naming_the_file(tmp_path):
    """The issue's case: a large PNG read under ``ulimit -v`` gave PIL's ``MemoryError`` traceback in ``predict``.
    A real process under ``RLIMIT_AS`` (its start-up plus 200 MB) reads a 9000 x 9000 PNG (81 MB grey, 243 MB as
    RGB) with the library's reader: one line naming the file, exit 1; TensorFlow is not loaded."""
    import resource
    import subprocess
    import sys

    path = tmp_path / "large.png"
    Image.new("L", (9000, 9000)).save(path)  # under PIL's 89-megapixel warning: the one line is the error's
    environment = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    start = subprocess.run(
        [sys.executable, "-c", READ_UNDER_A_LIMIT, str(path)], capture_output=True, text=True, env=environment
    )
    limit = (int(start.stdout) << 10) + (200 << 20)

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    done = subprocess.run(
        [sys.executable, "-c", READ_UNDER_A_LIMIT, str(path), "read"],
        capture_output=True,
        text=True,
        env=environment,
        preexec_fn=limited,
        timeout=60,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"error: Cannot read image file '{path}'")
    assert "does not fit in memory" in done.stderr


def test_the_commands_report_a_memory_error_in_one_line(capsys):
    """A ``MemoryError`` in a command, with a message (the image reader's) or without (most of Python's): one line,
    exit 1; with ``--debug`` the error itself."""
    import argparse

    from keras_vit.cli import OUT_OF_MEMORY, command_errors

    named = "Cannot read image file 'x.png': it does not fit in memory"
    for error, line in [(MemoryError(named), named), (MemoryError(), OUT_OF_MEMORY)]:
        with pytest.raises(SystemExit) as exited, command_errors():
            raise error
        assert exited.value.code == 1 and capsys.readouterr().err == f"error: {line}\n"
    with pytest.raises(MemoryError), command_errors(argparse.Namespace(debug=True)):
        raise MemoryError()


@pytest.mark.backend_independent
def test_a_command_under_a_memory_limit_too_low_for_tensorflow_says_so_in_one_line():
    """Under ``ulimit -v`` 500 MB TensorFlow's shared library cannot be mapped: one line naming the library and the
    memory limit as the likely cause, exit 1 (a real process; it fails at once)."""
    import resource

    from keras_vit.cli import LIBRARY_MEMORY

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (500 << 20, 500 << 20))

    code = "from keras_vit.cli import command_errors\nwith command_errors():\n    import tensorflow\n"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=limit, env=env, timeout=120
    )
    assert run.returncode == 1 and run.stdout == "", run.stderr
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr
    assert run.stderr.startswith("error: ") and "libtensorflow" in run.stderr and LIBRARY_MEMORY in run.stderr
