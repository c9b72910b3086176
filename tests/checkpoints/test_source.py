"""Weight files that are not what they claim (issue 25), mostly through the checkpoint pipeline's first step
(``keras_vit.checkpoints.source``: the format told from the content, a zip's members checked before anything is
unpacked, bfloat16 widened): each refused with one line naming the file and the cause, or read correctly; written with
numpy, safetensors and Keras themselves in the published layouts.

The timm and Hugging Face cases (files written by timm and transformers) are in ``test_timm.py`` and
``test_from_huggingface.py``; a catalogue name served by a mirror on 127.0.0.1 in ``zoo/test_download.py``.
"""

import gzip
import io
import resource
import zipfile

import ml_dtypes
import numpy as np
import pytest
from npz_layout import vit_checkpoint, write_checkpoint

import keras_vit
from keras_vit.checkpoints.load import read_checkpoint
from keras_vit.zoo.__main__ import main as zoo_main

pytestmark = pytest.mark.backend_independent  # files, names and checks: the same on every backend

TINY = dict(patch=8, width=32, depth=1, heads=2, mlp=64, grid=(2, 2), num_classes=3)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny checkpoint in the published layout, its arrays and its model."""
    arrays = vit_checkpoint(**TINY)
    path = write_checkpoint(tmp_path_factory.mktemp("tiny") / "tiny.npz", arrays)
    return path, arrays, keras_vit.model_from_checkpoint(path)


def images(size=16):
    return np.random.default_rng(0).uniform(-1, 1, (2, size, size, 3)).astype("float32")


def savez(path, arrays):
    np.savez(path, **arrays)
    return path


# --- dtypes ---------------------------------------------------------------------------------------


def test_a_bfloat16_npz_is_read_as_bfloat16(tiny, tmp_path):
    _, arrays, model = tiny
    bf16 = savez(tmp_path / "bf16.npz", {key: value.astype(ml_dtypes.bfloat16) for key, value in arrays.items()})
    read = read_checkpoint(bf16)
    assert read["embedding/kernel"].dtype == np.float32
    np.testing.assert_array_equal(read["cls"], arrays["cls"].astype(ml_dtypes.bfloat16).astype("float32"))
    rounded = keras_vit.model_from_checkpoint(bf16).predict_on_batch(images())
    np.testing.assert_allclose(rounded, model.predict_on_batch(images()), atol=0.05)  # bfloat16's 8-bit mantissa


def test_integer_and_object_arrays_are_refused_naming_the_array(tiny, tmp_path, capsys):
    _, arrays, model = tiny
    ints = savez(tmp_path / "ints.npz", {**arrays, "embedding/bias": np.arange(32, dtype="int32")})
    with pytest.raises(
        ValueError,
        match=r"ints.npz holds arrays that are not floating-point weights \(1\): "
        r"embedding/bias \(int32\)",
    ):
        keras_vit.load_weights(model, ints)
    pickled = savez(tmp_path / "pickled.npz", {**arrays, "cls": np.array([{"a": 1}], dtype=object)})
    with pytest.raises(
        ValueError,
        match=r"pickled.npz is refused: cls.npy holds pickled Python objects.*refused for "
        "safety",
    ):
        keras_vit.load_weights(model, pickled)
    with pytest.raises(SystemExit) as exit_:  # zoo info: not numpy's allow_pickle hint
        zoo_main(["info", str(pickled)])
    err = capsys.readouterr().err
    assert exit_.value.code == 1 and "holds pickled Python objects" in err and "allow_pickle" not in err


# --- another architecture, a stray key, a missing class token -----------------------------------------


def test_another_architecture_is_refused_naming_what_differs_in_every_format(tiny, tmp_path):
    _, _, model = tiny
    before = [w.numpy() for w in model.weights]
    deeper = write_checkpoint(tmp_path / "deeper.npz", vit_checkpoint(**{**TINY, "depth": 2}))
    with pytest.raises(ValueError, match=r"deeper.npz into model .*, another architecture: depth 2 \(the model: 1\):"):
        keras_vit.load_weights(model, deeper)
    wider = keras_vit.model_from_checkpoint(vit_checkpoint(**{**TINY, "width": 64}))
    keras_vit.save_timm_safetensors(wider, tmp_path / "wider.safetensors")
    with pytest.raises(ValueError, match=r"another architecture: width 64 \(the model: 32\):"):
        keras_vit.load_weights(model, tmp_path / "wider.safetensors")
    wider.save_weights(tmp_path / "wider.weights.h5")
    with pytest.raises(ValueError, match=r"another architecture: width 64 \(the model: 32\)\. Build the model it"):
        keras_vit.load_weights(model, tmp_path / "wider.weights.h5")
    finer = keras_vit.model_from_checkpoint(vit_checkpoint(**{**TINY, "grid": (3, 3)}))
    finer.save_weights(tmp_path / "finer.weights.h5")
    with pytest.raises(ValueError, match=r"another architecture: tokens 10 \(the model: 5\)"):
        keras_vit.load_weights(model, tmp_path / "finer.weights.h5")
    assert all(np.array_equal(a, w.numpy()) for a, w in zip(before, model.weights))  # nothing was assigned


@pytest.mark.parametrize("stray", ["Transformer/encoderblock_1/notes", "blocks.1.notes"])
def test_one_stray_key_is_named_as_the_one_unexpected_key(tiny, tmp_path, stray):
    _, arrays, model = tiny
    if stray.startswith("blocks."):  # in a timm state dict
        keras_vit.save_timm_safetensors(model, tmp_path / "timm.safetensors")
        from safetensors.numpy import load_file, save_file

        state = {**load_file(tmp_path / "timm.safetensors"), stray: np.zeros(3, "float32")}
        save_file(state, tmp_path / "stray.safetensors")
        file = tmp_path / "stray.safetensors"
    else:
        file = savez(tmp_path / "stray.npz", {**arrays, stray: np.zeros(3, "float32")})
    with pytest.raises(ValueError) as error:
        keras_vit.model_from_checkpoint(file, num_heads=2)
    message = str(error.value)
    assert "unexpected in the checkpoint (no such variable in the model) (1):" in message and stray in message
    assert "missing" not in message


def test_a_missing_class_token_is_named_as_such(tiny, tmp_path):
    _, arrays, model = tiny
    no_cls = savez(tmp_path / "no_cls.npz", {key: value for key, value in arrays.items() if key != "cls"})
    named = r"no_cls.npz has 5 position embeddings, a 2x2 grid and a class token's, but no class token: the array 'cls'"
    with pytest.raises(ValueError, match=named):
        keras_vit.model_from_checkpoint(no_cls)
    with pytest.raises(ValueError, match=named):
        keras_vit.load_weights(model, no_cls)


# --- files that are not what their name says -------------------------------------------------------------


def test_misnamed_and_compressed_files_are_named(tiny, tmp_path):
    path, _, model = tiny
    (tmp_path / "text.h5").write_text("just some text\n")
    with pytest.raises(ValueError, match=r"text.h5 is named .h5 but is not an HDF5 file: it starts b'just som'"):
        keras_vit.load_weights(model, tmp_path / "text.h5")
    (tmp_path / "packed.npz").write_bytes(gzip.compress(path.read_bytes()))
    with pytest.raises(ValueError, match=r"packed.npz is gzip-compressed data, not a checkpoint: decompress it first"):
        keras_vit.load_weights(model, tmp_path / "packed.npz")


def test_an_npy_header_declaring_terabytes_is_refused_before_allocating(tiny, tmp_path):
    _, arrays, model = tiny
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (1 << 40,)})
    with zipfile.ZipFile(tmp_path / "huge.npz", "w") as archive:
        for key, value in arrays.items():
            member = io.BytesIO()
            np.save(member, value)
            archive.writestr(key + ".npy", member.getvalue())
        archive.writestr("Transformer/encoderblock_0/huge.npy", header.getvalue())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(
        ValueError,
        match=r"huge.npz is refused: Transformer/encoderblock_0/huge.npy: its header "
        r"declares 4,398,046,511,\d+ bytes \(shape \(1099511627776,\), float32\), the member holds",
    ):
        keras_vit.load_weights(model, tmp_path / "huge.npz")
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 200_000  # KB: nothing near 4 TB was asked for
    (tmp_path / "huge.npy").write_bytes(header.getvalue())  # a bare .npy is not a checkpoint format
    with pytest.raises(ValueError, match=r"huge.npy \(128 bytes, .*is not a checkpoint keras-vit reads"):
        keras_vit.load_weights(model, tmp_path / "huge.npy")


# --- archives refused from what they declare, and bfloat16 safetensors (issue 36) --------------------------------


def _declare_size(path, member: str, size: int) -> None:
    """Rewrite the zip's central directory so that ``member`` declares ``size`` bytes unpacked."""
    data = bytearray(path.read_bytes())
    end = data.rfind(b"PK\x05\x06")
    at = int.from_bytes(data[end + 16 : end + 20], "little")  # the central directory's first entry
    while data[at : at + 4] == b"PK\x01\x02":
        named, extra, comment = (int.from_bytes(data[at + i : at + i + 2], "little") for i in (28, 30, 32))
        if data[at + 46 : at + 46 + named] == member.encode():
            data[at + 24 : at + 28] = size.to_bytes(4, "little")
            return path.write_bytes(bytes(data))
        at += 46 + named + extra + comment
    raise AssertionError(f"no member {member}")


def test_a_keras_archive_whose_weights_declare_gigabytes_is_refused_at_once(tiny, tmp_path):
    import time

    _, _, model = tiny
    saved = tmp_path / "bomb.keras"
    model.save(saved)
    with zipfile.ZipFile(saved) as archive:
        members = {info.filename: archive.read(info) for info in archive.infolist()}
    with zipfile.ZipFile(saved, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in members.items():
            archive.writestr(name, content)
    _declare_size(saved, "model.weights.h5", 3 << 30)
    peak, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.monotonic()
    refused = r"bomb.keras is refused: model.weights.h5 would unpack to 3,221,225,472 bytes from"
    with pytest.raises(ValueError, match=refused):
        keras_vit.model_from_checkpoint(saved)
    assert time.monotonic() - start < 1
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 200_000  # KB


def test_an_npz_with_two_members_of_one_name_is_refused_naming_it(tiny, tmp_path):
    _, arrays, model = tiny
    with pytest.warns(UserWarning, match="Duplicate name"), zipfile.ZipFile(tmp_path / "twice.npz", "w") as archive:
        for key, value in [*arrays.items(), ("cls", np.zeros_like(arrays["cls"]))]:
            member = io.BytesIO()
            np.save(member, value)
            archive.writestr(key + ".npy", member.getvalue())
    with pytest.raises(ValueError, match=r"twice.npz is refused: two members are named cls.npy"):
        keras_vit.load_weights(model, tmp_path / "twice.npz")


def test_a_bfloat16_safetensors_loads_as_a_bfloat16_npz_does(tiny, tmp_path):
    from safetensors.numpy import save_file

    from keras_vit.checkpoints import save_timm_safetensors, to_timm_state_dict

    _, _, model = tiny
    save_timm_safetensors(model, tmp_path / "f32.safetensors")
    state = {key: value.astype(ml_dtypes.bfloat16) for key, value in to_timm_state_dict(model).items()}
    save_file(state, tmp_path / "bf16.safetensors")
    read = read_checkpoint(tmp_path / "bf16.safetensors")
    assert read["embedding/kernel"].dtype == np.float32
    full = keras_vit.model_from_checkpoint(tmp_path / "f32.safetensors", num_heads=2)
    rounded = keras_vit.model_from_checkpoint(tmp_path / "bf16.safetensors", num_heads=2)
    assert not np.array_equal(rounded.predict_on_batch(images()), full.predict_on_batch(images()))
    np.testing.assert_allclose(rounded.predict_on_batch(images()), full.predict_on_batch(images()), atol=0.05)
