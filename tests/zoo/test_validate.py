"""The structural checks of checkpoint files (``keras_vit.zoo.validate``): whole ``.npz`` archives, every zip
archive's declared members (``.npz``, ``.keras``, zip-based ``.pth``) before anything is unpacked, with hypothesis."""

import contextlib
import io
import re
import struct
import subprocess
import sys
import tempfile
import time
import tracemalloc
import warnings
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from npz_layout import vit_checkpoint, write_checkpoint

from keras_vit.zoo.__main__ import main as zoo_main
from keras_vit.zoo.errors import CorruptCheckpointError
from keras_vit.zoo.validate import check_archive, check_npz, npz_shapes

pytestmark = pytest.mark.backend_independent


def npz_bytes(arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


# --- the structural check -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    """A real checkpoint small enough that random mutations often hit its zip and .npy headers."""
    return npz_bytes(vit_checkpoint(patch=2, width=4, depth=1, heads=1, mlp=4, grid=(1, 1), num_classes=2))


def test_the_structural_check_accepts_a_real_checkpoint_and_names_each_fault(tmp_path, tiny):
    check_npz(io.BytesIO(tiny))
    check_npz(write_checkpoint(tmp_path / "real.npz", vit_checkpoint(width=8, depth=1, heads=1, mlp=8)))
    without = io.BytesIO()
    np.savez(without, **{"cls": np.zeros(3)})
    objects = io.BytesIO()
    with zipfile.ZipFile(objects, "w") as archive:
        for key in ("embedding/kernel", "Transformer/posembed_input/pos_embedding"):
            with archive.open(key + ".npy", "w") as member:
                np.lib.format.write_array(member, np.array([None, 1], dtype=object), allow_pickle=True)
    for data, message in [
        (tiny[:-1], "does not end with a zip directory"),
        (tiny + b"x", "does not end"),
        (without.getvalue(), "missing the arrays"),
        (objects.getvalue(), "Python objects"),
    ]:
        with pytest.raises(CorruptCheckpointError, match=message):
            check_npz(io.BytesIO(data))
    flipped = bytearray(tiny)
    flipped[tiny.index(b"\x93NUMPY") + 200] ^= 1  # inside the first array's data
    with pytest.raises(CorruptCheckpointError, match="CRC-32"):
        check_npz(io.BytesIO(bytes(flipped)))
    with pytest.raises(FileNotFoundError):
        check_npz(tmp_path / "absent.npz")


def judge(data: bytes) -> None:
    """The check passes or raises the project's own error: any other exception fails the test."""
    with contextlib.suppress(CorruptCheckpointError):
        check_npz(io.BytesIO(data))


FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FAST
@given(st.binary(max_size=3000))
def test_random_bytes_are_only_ever_a_corrupt_checkpoint(data):
    with pytest.raises(CorruptCheckpointError):
        check_npz(io.BytesIO(data))


@FAST
@given(
    flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 255)), max_size=4),
    keep=st.one_of(st.none(), st.floats(0, 1, exclude_max=True)),
    tail=st.binary(max_size=30),
)
def test_mutated_checkpoints_are_only_ever_a_corrupt_checkpoint(tiny, flips, keep, tail):
    data = bytearray(tiny)
    for where, mask in flips:
        data[int(where * len(data))] ^= mask
    if keep is not None:
        data = data[: int(keep * len(data))] + tail
    judge(bytes(data))


def npy(array) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array)
    return buffer.getvalue()


@settings(max_examples=300, deadline=None)
@given(edits=st.lists(st.tuples(st.integers(0, 127), st.integers(0, 255)), min_size=1, max_size=4))
def test_zips_of_damaged_npy_headers_are_only_ever_a_corrupt_checkpoint(edits):
    """A whole zip (CRCs verify) whose members' ``.npy`` headers (Python-literal text) are damaged."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for key in ("embedding/kernel", "Transformer/posembed_input/pos_embedding"):
            member = bytearray(npy(np.zeros((2, 3), "float32")))
            for where, value in edits:
                member[where] = value
            archive.writestr(key + ".npy", bytes(member))
    judge(buffer.getvalue())


# --- every zip archive, from its declared members (issue 36) -------------------------------------------------


def raw_zip(members: list[tuple[str, bytes, int, int, int]]) -> bytes:
    """A zip written by hand: ``(name, stored bytes, method, crc, unpacked size)`` per member, as declared."""
    body, directory = b"", b""
    for name, data, method, crc, size in members:
        fields = struct.pack("<HHHHHIII", 20, 0, method, 0, 0x21, crc, len(data), size)
        directory += b"PK\x01\x02" + struct.pack("<H", 20) + fields
        directory += struct.pack("<HHHHHII", len(name), 0, 0, 0, 0, 0, len(body)) + name.encode()
        body += b"PK\x03\x04" + fields[2:] + struct.pack("<HH", len(name), 0) + name.encode() + data
    end = struct.pack("<HHHHIIH", 0, 0, len(members), len(members), len(directory), len(body), 0)
    return body + directory + b"PK\x05\x06" + end


def zeros_deflated(size: int) -> bytes:
    """A raw deflate stream of ``size`` zero bytes (a multiple of 8 MiB) in about ``size / 1000`` bytes."""
    chunk = 8 << 20
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = compressor.compress(bytes(chunk)) + compressor.flush(zlib.Z_FULL_FLUSH)
    return block * (size // chunk) + compressor.flush()


KERAS_MEMBERS = [("config.json", b"{}", 0, zlib.crc32(b"{}"), 2), ("metadata.json", b"{}", 0, zlib.crc32(b"{}"), 2)]


@pytest.fixture(scope="module")
def keras_bomb(tmp_path_factory):
    """The issue's ``.keras``: 3.1 MB whose weights member unpacks to 3 GiB of zeros (its CRC left 0: computing it
    takes seconds, and a loader that unpacks it has spent the 3 GiB before it finds out)."""
    path = tmp_path_factory.mktemp("bomb") / "bomb.keras"
    path.write_bytes(raw_zip([*KERAS_MEMBERS, ("model.weights.h5", zeros_deflated(3 << 30), 8, 0, 3 << 30)]))
    return path


def test_a_keras_archive_unpacking_to_3_gib_is_refused_within_a_second_and_200_mb(keras_bomb):
    assert keras_bomb.stat().st_size < 3_200_000
    tracemalloc.start()
    started = time.monotonic()
    with pytest.raises(CorruptCheckpointError, match=re.escape(str(keras_bomb)) + r" is refused: model\.weights\.h5 "):
        check_archive(keras_bomb)
    assert time.monotonic() - started < 1
    assert tracemalloc.get_traced_memory()[1] < 200e6
    tracemalloc.stop()


def test_zoo_convert_refuses_the_keras_bomb_in_one_line_naming_it(keras_bomb, tmp_path, capsys):
    started = time.monotonic()
    with pytest.raises(SystemExit) as exited:
        zoo_main(["convert", str(keras_bomb), str(tmp_path / "out.safetensors")])
    err = capsys.readouterr().err
    assert exited.value.code == 1 and err.count("\n") == 1 and str(keras_bomb) in err and "3,221,225,472" in err
    assert time.monotonic() - started < 5 and not (tmp_path / "out.safetensors").exists()


def test_an_archive_declaring_more_packed_bytes_than_it_holds_is_refused(tmp_path):
    data = bytearray(raw_zip([*KERAS_MEMBERS, ("model.weights.h5", b"x" * 100, 0, zlib.crc32(b"x" * 100), 100)]))
    path = tmp_path / "model.keras"
    path.write_bytes(data)
    check_archive(path)
    at = data.rindex(b"PK\x01\x02") + 20  # the weights member's packed size in the directory
    data[at : at + 4] = struct.pack("<I", 3 << 30)
    path.write_bytes(data)
    with pytest.raises(CorruptCheckpointError, match=r"declare 3,221,225,\d+ packed bytes, the file has"):
        check_archive(path)


def test_two_members_of_one_name_are_refused_by_every_reader(tmp_path, capsys):
    arrays = vit_checkpoint(width=8, depth=1, heads=1, mlp=8)
    path = write_checkpoint(tmp_path / "twice.npz", arrays)
    with zipfile.ZipFile(path, "a") as archive, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate name it writes
        archive.writestr("head/bias.npy", npy(np.ones_like(arrays["head/bias"])))
    twice = "two members are named head/bias.npy"
    for read in (check_npz, npz_shapes):
        with pytest.raises(CorruptCheckpointError, match=re.escape(str(path)) + ".*" + twice):
            read(path)
    with pytest.raises(SystemExit) as exited:
        zoo_main(["info", str(path)])
    err = capsys.readouterr().err
    assert exited.value.code == 1 and err.count("\n") == 1 and str(path) in err and twice in err
    keras_twice = tmp_path / "twice.keras"
    keras_twice.write_bytes(raw_zip([*KERAS_MEMBERS, *KERAS_MEMBERS[:1]]))
    with pytest.raises(CorruptCheckpointError, match=r"two members are named config\.json"):
        check_archive(keras_twice)


@pytest.fixture(scope="module")
def saved_keras(tmp_path_factory) -> bytes:
    """A real saved Keras model, small enough that a flip often hits its zip directory."""
    import keras

    path = tmp_path_factory.mktemp("keras") / "tiny.keras"
    keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)]).save(path)
    return path.read_bytes()


@pytest.mark.parametrize("kind", ["npz", "keras"])
def test_a_bit_flip_anywhere_in_the_zip_directory_is_a_corrupt_checkpoint_naming_the_file(kind, saved_keras, tmp_path):
    two = {"embedding/kernel": np.ones((2, 2), "float32"), "Transformer/posembed_input/pos_embedding": np.zeros(3)}
    data = npz_bytes(two) if kind == "npz" else saved_keras
    path = tmp_path / f"flipped.{kind}"
    checks = (check_npz, npz_shapes, check_archive) if kind == "npz" else (check_archive,)
    refused = 0
    for offset in range(data.index(b"PK\x01\x02"), len(data)):
        for bit in range(8):
            flipped = bytearray(data)
            flipped[offset] ^= 1 << bit
            path.write_bytes(flipped)
            for check in checks:
                try:
                    check(path)
                except CorruptCheckpointError as exc:
                    assert str(path) in str(exc) and "\n" not in str(exc)
                    refused += 1
    assert refused > 100


def directory_flips(data: bytes, bits: tuple[int, ...]):
    """``data`` with one bit flipped, for every byte of its zip directory and end record and each of ``bits``
    (rotated by the byte's offset, so that every bit position is flipped somewhere)."""
    for offset in range(data.index(b"PK\x01\x02"), len(data)):
        for bit in bits:
            flipped = bytearray(data)
            flipped[offset] ^= 1 << (bit + offset) % 8
            yield bytes(flipped)


@pytest.mark.parametrize("kind", ["npz", "keras"])
def test_a_bit_flip_in_the_zip_directory_through_the_loader_is_a_corrupt_checkpoint_or_a_refusal(
    kind, saved_keras, tmp_path
):
    """What ``ViT(weights=F)`` and ``model_from_checkpoint(F)`` read F with (``read_checkpoint``): a flip anywhere in
    the directory gave ``NotImplementedError`` ("zip file version 17.3") from zipfile. Now a damaged zip is one
    ``CorruptCheckpointError`` (``keras_vit.files.open_zip``), a file that reads but is not a model's a
    ``ValueError``, each one line naming the file; or it reads. The ``.keras`` flips load a real model (slower):
    two bit positions per byte."""
    from keras_vit.checkpoints import read_checkpoint

    two = {"embedding/kernel": np.ones((2, 2), "float32"), "Transformer/posembed_input/pos_embedding": np.zeros(3)}
    data = npz_bytes(two) if kind == "npz" else saved_keras
    path = tmp_path / f"flipped.{kind}"
    started, corrupt = time.monotonic(), 0
    for flipped in directory_flips(data, (0, 3, 6) if kind == "npz" else (0, 4)):
        path.write_bytes(flipped)
        try:
            read_checkpoint(path)  # a flip in a date or an attribute: it reads
        except (CorruptCheckpointError, ValueError) as exc:
            assert str(path) in str(exc) and "\n" not in str(exc)
            corrupt += type(exc) is CorruptCheckpointError
    assert corrupt > 20 and time.monotonic() - started < 10


def test_zoo_convert_of_a_flipped_zip_directory_is_one_line_and_exit_1(tmp_path):
    """The issue's case on a real process: the flip that gave ``NotImplementedError: zip file version`` (the
    version needed to extract, in the directory entry)."""
    data = bytearray(npz_bytes({"embedding/kernel": np.ones((2, 2), "float32")}))
    data[data.index(b"PK\x01\x02") + 6] ^= 0x80  # the version needed to extract: 2.0 -> 14.8
    path = tmp_path / "flipped.npz"
    path.write_bytes(data)
    with pytest.raises(NotImplementedError, match="zip file version"):
        zipfile.ZipFile(path)
    done = subprocess.run(
        [sys.executable, "-m", "keras_vit.zoo", "convert", str(path), str(tmp_path / "out.safetensors")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("error: ") and str(path) in line and "NotImplementedError: zip file version" in line


@FAST
@given(
    flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 255)), max_size=4),
    keep=st.one_of(st.none(), st.floats(0, 1, exclude_max=True)),
)
def test_mutated_keras_archives_are_only_ever_a_corrupt_checkpoint(saved_keras, flips, keep):
    data = bytearray(saved_keras)
    for where, mask in flips:
        data[int(where * len(data))] ^= mask
    if keep is not None:
        data = data[: int(keep * len(data))]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.keras"
        path.write_bytes(bytes(data))
        with contextlib.suppress(CorruptCheckpointError):
            check_archive(path)
