"""Every checkpoint reader on random and mutated files: only the project's error types come out, quickly.

Files of each accepted format are written once in their real layout (a Google ``.npz``, in float32 and bfloat16, a
timm ``.safetensors``, a Keras ``.weights.h5``, a Hugging Face folder, a training checkpoint, a training run's
folder); hypothesis then flips, cuts, overwrites and inserts bytes (or removes a run's file), and draws ``.npz`` files
of any keys and shapes and ``config.json`` files of any values; each reader must either read the file or raise one
of the errors the commands report in one line (:data:`keras_vit.cli.REPORTED`: an ``ImportError`` too, for a torch
file without torch) within a time and memory bound, never another exception, a hang or a crash.
"""

import contextlib
import json
import os
import resource
import shutil
import time
from pathlib import Path

import keras
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from npz_layout import vit_checkpoint, write_checkpoint

import keras_vit
from keras_vit import zoo
from keras_vit.checkpoints.load import read_checkpoint
from keras_vit.checkpoints.read import catalogue_check
from keras_vit.cli import REPORTED
from keras_vit.training.checkpoint import Checkpointer

pytestmark = pytest.mark.backend_independent  # files, names and checks: the same on every backend

EXPECTED = REPORTED  # what a command reports in one line: ValueError, OSError, ImportError, CommandError
SECONDS = 10.0  # per read: a malformed header must not make a reader loop for long...
MEMORY_KB = 1 << 20  # ...nor allocate much: the process's peak may grow by 1 GiB at most during one read


def fuzz(examples: int) -> settings:
    """Hypothesis' settings for ``examples`` examples. Its deadline is off (None): it would time an example's whole
    body, the writing and copying of its files included (a run folder), which a loaded machine slows at random.
    What is asserted stays bounded: each read by :func:`read_within_bound`, the files by their originals' size (a
    few KB) and at most 4 edits of 16 bytes, the run by ``examples``."""
    return settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


SUFFIXES = [".npz", ".safetensors", ".pth", ".weights.h5", ".bin"]


@pytest.fixture(scope="module", autouse=True)
def warm_readers(tmp_path_factory):
    """Every reader run once before the first example, outside its bound: a first call's imports (torch for a
    ``.pth`` where it is installed: seconds on a loaded machine) and Keras' first model build are paid once per
    process, not per file, and are not what the bound measures."""
    folder = tmp_path_factory.mktemp("warm")
    for suffix in SUFFIXES:
        (folder / f"empty{suffix}").write_bytes(b"")
        with contextlib.suppress(*EXPECTED):
            read_checkpoint(folder / f"empty{suffix}")
    tiny = write_checkpoint(folder / "tiny.npz", vit_checkpoint(patch=8, width=16, depth=1, heads=2, mlp=32))
    keras_vit.model_from_checkpoint(tiny, num_heads=2)


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    """One small, valid file of each format, by name."""
    folder = tmp_path_factory.mktemp("originals")
    arrays = vit_checkpoint(patch=8, width=16, depth=1, heads=2, mlp=32, grid=(2, 2), num_classes=3)
    model = keras_vit.model_from_checkpoint(write_checkpoint(folder / "google.npz", arrays), gelu="exact")
    keras_vit.save_timm_safetensors(model, folder / "timm.safetensors")
    model.save_weights(folder / "keras.weights.h5")
    model.save(folder / "saved.keras")
    np.savez(folder / "bfloat16.npz", **{key: value.astype(ml_dtypes.bfloat16) for key, value in arrays.items()})
    files = {path.name: path for path in folder.iterdir()}
    for path in files.values():
        reader(model)(path)  # the originals read: what the mutations start from is valid
    files["model"] = model
    return files


def reader(model):
    """What reads a file: the checkpoint reader, or for Keras' ``.weights.h5`` (no architecture) loading into
    ``model``."""
    return lambda path: (
        keras_vit.load_weights(model, path) if path.name.endswith(".weights.h5") else read_checkpoint(path)
    )


def loader(model):
    """What ``ViT(weights=PATH)`` does with Keras' own files: a ``.keras`` file built as the model it saved, a
    ``.weights.h5`` loaded into ``model`` (no architecture of its own)."""
    return lambda path: (
        keras_vit.load_weights(model, path)
        if path.name.endswith(".weights.h5")
        else keras_vit.model_from_checkpoint(path)
    )


mutations = st.lists(
    st.tuples(st.sampled_from(["flip", "cut", "overwrite", "insert"]), st.floats(0, 1), st.binary(max_size=16)),
    min_size=1,
    max_size=4,
)


def mutate(data: bytes, edits) -> bytes:
    for kind, where, payload in edits:
        at = int(where * len(data))
        if kind == "flip" and data:
            at = min(at, len(data) - 1)
            data = data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]
        elif kind == "cut":
            data = data[:at]
        elif kind == "overwrite":
            data = data[:at] + payload + data[at + len(payload) :]
        else:
            data = data[:at] + payload + data[at:]
    return data


def read_within_bound(reader, path: Path) -> None:
    """``reader(path)`` raises nothing but :data:`EXPECTED`, within :data:`SECONDS`, and raises the process's peak
    memory by less than :data:`MEMORY_KB` (measured from the peak before the read: tests that ran earlier in the
    process, a training run, may have raised it by more)."""
    start, peak = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with contextlib.suppress(*EXPECTED):
        reader(path)
    assert time.monotonic() - start < SECONDS, f"reading a mutated {path.name} took too long"
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < peak + MEMORY_KB, f"{path.name}: memory"


@fuzz(40)
@given(name=st.sampled_from(["google.npz", "bfloat16.npz", "timm.safetensors", "keras.weights.h5"]), edits=mutations)
def test_mutated_checkpoints_give_only_the_projects_errors(originals, tmp_path, name, edits):
    path = tmp_path / name
    path.write_bytes(mutate(originals[name].read_bytes(), edits))
    read_within_bound(reader(originals["model"]), path)


@fuzz(30)
@given(name=st.sampled_from(["saved.keras", "keras.weights.h5"]), edits=mutations)
def test_mutated_keras_files_through_the_loader_give_only_the_projects_errors(originals, tmp_path, name, edits):
    """Keras' own files (a ``.keras`` archive, a ``.weights.h5``) damaged anywhere, through the loader as
    ``ViT(weights=...)`` runs it: they load, or fail with the project's errors, within the time and memory bound."""
    path = tmp_path / name
    path.write_bytes(mutate(originals[name].read_bytes(), edits))
    read_within_bound(loader(originals["model"]), path)


@fuzz(20)
@given(edits=mutations)
def test_mutated_files_under_a_catalogue_name_give_only_the_zoos_error(originals, tmp_path, edits):
    """What the zoo meets before a download enters the cache: the architecture check on what the headers declare."""
    path = tmp_path / "B_16.npz"
    path.write_bytes(mutate(originals["google.npz"].read_bytes(), edits))
    read_within_bound(catalogue_check(zoo.get("B_16.orig_in21k")), path)


@fuzz(20)
@given(
    shapes=st.dictionaries(
        st.sampled_from(sorted(vit_checkpoint(depth=1, num_classes=3))) | st.text(max_size=12),
        st.lists(st.integers(0, 70), max_size=4).map(tuple),
        max_size=6,
    )
)
def test_random_arrays_in_an_npz_give_only_the_projects_errors(tmp_path, shapes):
    """Any keys and shapes: the loader names what is missing, unexpected or of another shape."""
    arrays = {key.replace("\x00", ""): np.ones(shape, "float32") for key, shape in shapes.items() if key.strip("\x00")}
    path = tmp_path / "random.npz"
    np.savez(path, **arrays)
    read_within_bound(lambda file: keras_vit.model_from_checkpoint(file, num_heads=2), path)


@fuzz(20)
@given(data=st.binary(max_size=256), suffix=st.sampled_from(SUFFIXES))
@example(data=b"", suffix=".pth")  # a legacy torch file: a ValueError with torch, the install's ImportError without
def test_random_bytes_under_any_checkpoint_name_give_only_the_projects_errors(tmp_path, data, suffix):
    path = tmp_path / f"random{suffix}"
    path.write_bytes(data)
    read_within_bound(read_checkpoint, path)


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    """A compiled model and one real training checkpoint of it (``checkpoints/ckpt-4.npz``)."""
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    model.optimizer.build(model.trainable_variables)
    folder = tmp_path_factory.mktemp("run") / "checkpoints"
    Checkpointer(str(folder)).save(model, 4)
    return model, folder / "ckpt-4.npz"


@fuzz(30)
@given(edits=mutations)
def test_mutated_training_checkpoints_restore_or_give_a_training_error(saved_run, tmp_path, edits):
    """What a resumed run meets: a checkpoint that does not read is passed over; with none left, a TrainingError."""
    model, original = saved_run
    folder = tmp_path / "checkpoints"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    (folder / original.name).write_bytes(mutate(original.read_bytes(), edits))
    read_within_bound(lambda path: Checkpointer(str(path)).restore(model), folder)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 100) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=5,
)
HF_FIELDS = ["hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
             "layer_norm_eps", "qkv_bias", "image_size", "patch_size", "num_channels", "hidden_dropout_prob",
             "pooler_act", "pooler_output_size", "model_type", "id2label"]  # fmt: skip


@fuzz(30)
@given(config=st.dictionaries(st.sampled_from(HF_FIELDS), json_values, max_size=5) | json_values)
def test_hugging_face_configs_of_any_values_give_only_the_projects_errors(originals, tmp_path, config):
    """A config.json that parses, with any JSON in its fields (a string for a count, a list for an epsilon)."""
    folder = tmp_path / "hf"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    shutil.copy(originals["timm.safetensors"], folder / "model.safetensors")
    read_within_bound(read_checkpoint, folder)


@fuzz(20)
@given(config=st.binary(max_size=200), edits=mutations)
def test_mutated_hugging_face_folders_give_only_the_projects_errors(originals, tmp_path, config, edits):
    folder = tmp_path / "hf"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    (folder / "config.json").write_bytes(config)
    (folder / "model.safetensors").write_bytes(mutate(originals["timm.safetensors"].read_bytes(), edits))
    read_within_bound(read_checkpoint, folder)
    assert os.path.isdir(folder)


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    """A finished tiny run (checkpoints 1 and 2, the log, run.json, metrics.json), its model and its settings."""
    from training_support import TINY

    from keras_vit.training.finetune import finetune

    out = tmp_path_factory.mktemp("run") / "run"
    result = finetune(output_dir=str(out), steps=2, checkpoint_every=1, log_every=1, **TINY)
    return out, result.model, result.config


RUN_FILES = [
    "run.json",
    "metrics.json",
    "train_log.jsonl",
    ".keras_vit_run",
    "checkpoints/ckpt-1.npz",
    "checkpoints/ckpt-2.npz",
]


def read_run(folder: Path, model, config) -> None:
    """What a run reads of its folder before its first step: its settings and metrics, its checkpoints, its log."""
    from keras_vit.training.loop import truncate_log
    from keras_vit.training.resume import prepare_output

    prepare_output(config.replace(output_dir=str(folder)), chief=True)
    step = Checkpointer(str(folder / "checkpoints")).restore(model)
    truncate_log(str(folder / "train_log.jsonl"), step)


@fuzz(40)
@given(name=st.sampled_from(RUN_FILES), edits=mutations, delete=st.booleans())
def test_mutated_run_folders_give_only_the_projects_errors(run_folder, tmp_path, name, edits, delete):
    """A run folder with one file mutated or gone: it reads, or one of the project's errors says which file."""
    original, model, config = run_folder
    folder = tmp_path / "run"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(original, folder)
    path = folder / name
    if delete:
        path.unlink()
    else:
        path.write_bytes(mutate(path.read_bytes(), edits))
    read_within_bound(lambda run: read_run(run, model, config), folder)


def test_a_bit_flip_anywhere_in_the_hdf5_superblock_loads_or_is_one_error_naming_the_file(originals, tmp_path):
    """Every bit of the first 96 bytes of a Keras ``.weights.h5`` (the HDF5 superblock: signature, versions, sizes,
    addresses) flipped in turn, loaded into its model as ``ViT(weights=F)`` does: it loads, or raises one of
    :data:`EXPECTED` naming the file in one line (h5py's ``RuntimeError: Object visitation failed`` is not one)."""
    data, model = originals["keras.weights.h5"].read_bytes(), originals["model"]
    path, started, refused = tmp_path / "flipped.weights.h5", time.monotonic(), 0
    for bit in range(96 * 8):
        flipped = bytearray(data)
        flipped[bit // 8] ^= 1 << bit % 8
        path.write_bytes(flipped)
        try:
            keras_vit.load_weights(model, path)
        except EXPECTED as error:
            assert str(path) in str(error) and "\n" not in str(error), error
            refused += 1
    assert refused > 100 and time.monotonic() - started < 30


def test_a_truncated_weights_file_is_one_error_naming_the_file(originals, tmp_path):
    """A Keras ``.weights.h5`` cut at 64 places (h5py's error named no file): one error naming it."""
    data, model = originals["keras.weights.h5"].read_bytes(), originals["model"]
    path = tmp_path / "cut.weights.h5"
    for at in np.linspace(1, len(data) - 1, 64).astype(int):
        path.write_bytes(data[:at])
        with pytest.raises(EXPECTED) as raised:
            keras_vit.load_weights(model, path)
        assert str(path) in str(raised.value) and "\n" not in str(raised.value), raised.value


TINY_R_TI = dict(patch=8, width=32, depth=1, heads=2, mlp=64, grid=(2, 2))


def test_the_catalogue_check_of_a_variant_the_table_does_not_build_holds_its_head(tmp_path):
    """AugReg's R+Ti/16 is not in keras-vit's variant table: its files are held to the entry's classes and head."""
    from keras_vit.zoo import CorruptCheckpointError

    entry = zoo.get("R_Ti_16.augreg_in21k_ft_in1k_384")
    path = write_checkpoint(tmp_path / "r_ti.npz", vit_checkpoint(**TINY_R_TI, num_classes=10))
    with pytest.raises(CorruptCheckpointError, match=rf"another architecture: classes 10 \({entry.name}: 1000\)$"):
        catalogue_check(entry)(path)
    catalogue_check(entry)(write_checkpoint(tmp_path / "head.npz", vit_checkpoint(**TINY_R_TI, num_classes=1000)))
