"""keras_vit.files: a file appears whole or not at all, also when its writer fails or is killed half-way; and
the places that write users' files through it (training outputs, checkpoints, the zoo's records)."""

import json
import os
import re
import signal
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from staging_support import killed_staging

from keras_vit.files import OWNED_STAGING, atomic_open, atomic_path, temporary_path, temporary_target
from keras_vit.staging import OWNER
from keras_vit.training.loop import save_outputs
from keras_vit.training.outputs import write_json
from keras_vit.zoo.cache import record, recorded

pytestmark = pytest.mark.backend_independent  # files, names and checks: the same on every backend


@pytest.fixture
def target(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"the old file")
    return path


@pytest.mark.parametrize("mode, data", [("wb", b"new bytes"), ("w", "nouveau fichier \u00e9\n")])
def test_a_finished_write_replaces_the_file(target, mode, data):
    with atomic_open(target, mode) as file:
        file.write(data)
        assert target.read_bytes() == b"the old file"  # not there before the block ends
    assert (target.read_bytes() if mode == "wb" else target.read_text(encoding="utf-8")) == data
    assert os.listdir(target.parent) == ["weights.bin"]


def test_an_error_while_writing_leaves_the_old_file_and_no_temporary(target):
    with pytest.raises(KeyError, match="while writing"), atomic_open(target, durable=True) as file:
        file.write(b"half of it")
        raise KeyError("while writing")
    assert target.read_bytes() == b"the old file"
    assert os.listdir(target.parent) == ["weights.bin"]


def _kill_a_writer(target, owned: bool) -> None:
    """A child process writing 1 MB to ``target`` through ``atomic_open(owned=owned)``, killed (SIGKILL) half-way."""
    code = (
        "import sys, time\n"
        "from keras_vit.files import atomic_open\n"
        f"with atomic_open(sys.argv[1], owned={owned}) as file:\n"
        "    file.write(b'x' * 1_000_000); file.flush()\n"
        "    print('writing', flush=True); time.sleep(60)\n"
    )
    writer = subprocess.Popen([sys.executable, "-c", code, str(target)], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline() == "writing\n"
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    assert target.read_bytes() == b"the old file"


def test_a_killed_writer_leaves_the_old_file_and_a_temporary_that_names_it(target):
    _kill_a_writer(target, owned=False)
    (left,) = set(os.listdir(target.parent)) - {"weights.bin"}
    assert os.path.getsize(target.parent / left) == 1_000_000
    assert temporary_target(left) == "weights.bin"


def test_a_killed_library_writers_staging_folder_is_removed_by_the_next_library_write_there(target):
    """``owned``, as the writers called from Python write (exports, timm files, presets, figures): the temporary
    sits in a staging folder that records its writer, which the next of them writing into that folder removes."""
    import keras_vit

    _kill_a_writer(target, owned=True)
    (left,) = set(os.listdir(target.parent)) - {"weights.bin"}
    assert re.fullmatch(re.escape(OWNED_STAGING) + r"[0-9a-f]{12}\.tmp", left)
    (half,) = set(os.listdir(target.parent / left)) - {OWNER}
    assert os.path.getsize(target.parent / left / half) == 1_000_000 and temporary_target(half) == "weights.bin"
    model = keras_vit.ViT("Ti/16", image_size=32, depth=1, num_classes=5)
    keras_vit.save_timm_safetensors(model, target.parent / "vit.safetensors")
    assert sorted(os.listdir(target.parent)) == ["vit.safetensors", "weights.bin"]
    assert target.read_bytes() == b"the old file"


def test_temporary_names_keep_the_extension_and_are_told_from_users_files(tmp_path):
    name = os.path.basename(temporary_path(tmp_path / "model.keras"))
    assert name.startswith(".model.") and name.endswith(".tmp.keras")
    assert temporary_target(name) == "model.keras"
    assert temporary_target(os.path.basename(temporary_path(tmp_path / "README"))) == "README"
    assert temporary_path(tmp_path / "a.npz") != temporary_path(tmp_path / "a.npz")
    for users in ["model.keras", ".model.keras.tmp", ".model.tmp.keras", "notes.1234567890ab.tmp.txt", ".x.tmp"]:
        assert temporary_target(users) is None, users


def test_atomic_open_refuses_modes_that_read_or_append(target):
    for mode in ["ab", "r+b", "x"]:
        with pytest.raises(ValueError, match=re.escape(f"not '{mode}'")), atomic_open(target, mode):
            pass
    assert os.listdir(target.parent) == ["weights.bin"]


def _tiny_model():
    inputs = keras.Input((4,))
    return keras.Model(inputs, keras.layers.Dense(3, name="head")(inputs))


def test_atomic_path_gives_keras_a_name_it_saves_to(tmp_path):
    model, path = _tiny_model(), tmp_path / "model.keras"
    with atomic_path(path) as temporary:
        model.save(temporary)
    x = np.arange(8, dtype="float32").reshape(2, 4)
    np.testing.assert_array_equal(keras.saving.load_model(path).predict_on_batch(x), model.predict_on_batch(x))
    assert os.listdir(tmp_path) == ["model.keras"]


def test_a_failed_save_keeps_the_runs_previous_outputs(tmp_path, monkeypatch):
    model, strategy = _tiny_model(), tf.distribute.get_strategy()
    save_outputs(model, {"accuracy": 0.5}, str(tmp_path), strategy)
    before = {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)}
    assert sorted(before) == ["metrics.json", "model.keras"]

    def save_half_then_fail(self, path, *args, **kwargs):
        with open(path, "wb") as file:
            file.write(b"PK\x03\x04 half a zip")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(keras.Model, "save", save_half_then_fail)
    with pytest.raises(OSError, match="No space left"):
        save_outputs(model, {"accuracy": 0.9}, str(tmp_path), strategy)
    monkeypatch.undo()
    with pytest.raises(TypeError, match="not JSON serializable"):
        write_json(str(tmp_path / "metrics.json"), {"accuracy": 0.9, "model": model})
    assert {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)} == before
    assert json.loads(before["metrics.json"]) == {"accuracy": 0.5}


def test_the_zoo_records_a_sha256_whole_and_removes_what_a_killed_record_left(tmp_path):
    path = tmp_path / "a.npz"
    path.write_bytes(b"weights")
    left = killed_staging(tmp_path, OWNED_STAGING)  # a process killed while it wrote a record (or download state)
    record(path, "ab" * 32)
    assert recorded(path) == "ab" * 32
    assert sorted(os.listdir(tmp_path)) == ["a.npz", "a.npz.sha256"] and not left.exists()


def test_a_failed_timm_save_keeps_the_old_file(tmp_path, monkeypatch):
    import safetensors.numpy

    import keras_vit

    model = keras_vit.ViT("Ti/16", image_size=32, depth=1, num_classes=5)
    path = tmp_path / "vit.safetensors"
    keras_vit.save_timm_safetensors(model, path)
    before = path.read_bytes()

    def save_half_then_fail(state, filename, metadata=None):
        with open(filename, "wb") as file:
            file.write(before[:100])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.numpy, "save_file", save_half_then_fail)
    with pytest.raises(OSError, match="No space left"):
        keras_vit.save_timm_safetensors(model, path)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["vit.safetensors"]


@pytest.mark.parametrize("owned", [False, True])
def test_a_missing_folder_is_named_and_nothing_is_created(tmp_path, owned):
    missing = tmp_path / "no" / "such"
    message = re.escape(f"No such folder to write into: '{missing}'")
    with pytest.raises(FileNotFoundError, match=message), atomic_open(missing / "m.json", "w", owned=owned) as file:
        file.write("{}")
    assert os.listdir(tmp_path) == []


def test_a_private_file_of_its_writer_gets_the_umasks_mode(target):
    old = os.umask(0o027)
    try:
        with atomic_path(target) as temporary:
            os.close(os.open(temporary, os.O_CREAT | os.O_WRONLY, 0o600))
        assert oct(os.stat(target).st_mode & 0o777) == "0o640"
    finally:
        os.umask(old)
