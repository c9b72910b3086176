"""Checkpoints from timm (both ways), and the readers' refusals: unsupported variants, unreadable paths, Keras' files.
(Hugging Face: test_from_huggingface.py; keras-hub: test_keras_hub.py.)

timm and transformers run in subprocesses that never import TensorFlow (torch after TensorFlow in one
process crashes here): they build small random models, save them with their own libraries and write their
logits on real photo crops; keras-vit loads the files here and must give the same logits (float32, 1e-4).
Without timm / torch / transformers those tests skip.
"""

import json
import os
import sys
import threading
import warnings
import zipfile

import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy  # any backend's tensor (torch's track gradients)
from reference_runs import TIMM_SCRIPT, photos, run_reference, write_timm_files

import keras_vit

pytestmark = pytest.mark.backends("tensorflow")  # the default backend only: backend-independent or slow

TOLERANCE = 1e-4

TIMM_CASES = {
    "tiny": ("vit_tiny_patch16_224", dict(depth=1, img_size=32, num_classes=5), 32, ".safetensors"),
    "gap_fc_norm": (
        "vit_base_patch16_224",
        dict(
            depth=1,
            img_size=32,
            patch_size=8,
            embed_dim=64,
            num_heads=4,
            num_classes=5,
            global_pool="avg",
            class_token=False,
            fc_norm=True,
        ),
        32,
        ".pth",
    ),
    "hybrid": ("vit_small_r26_s32_224", dict(depth=1, img_size=64, num_classes=5), 64, ".safetensors"),
    "layer_scale": ("vit_tiny_patch16_224", dict(depth=2, img_size=32, num_classes=5, init_values=1e-5), 32, ".pth"),
    # 6 heads of width 192, where the usual (Ti) is 3: the state dict cannot tell
    "six_heads": (
        "vit_tiny_patch16_224",
        dict(depth=1, img_size=32, patch_size=8, num_heads=6, num_classes=5),
        32,
        ".pth",
    ),
    # timm pads the 29x29 photos to 32x32 (dynamic_img_pad; dynamic_img_size lifts its size check)
    "padded": (
        "vit_tiny_patch16_224",
        dict(depth=1, img_size=32, patch_size=8, num_classes=5, dynamic_img_size=True, dynamic_img_pad=True),
        29,
        ".safetensors",
    ),
}
OPTIONS = {"padded": dict(image_size=29, dynamic_img_pad=True)}  # what keras-vit needs besides the file


@pytest.fixture(scope="module")
def timm_files(tmp_path_factory):
    return write_timm_files(tmp_path_factory.mktemp("timm"), TIMM_CASES)


@pytest.mark.reference
@pytest.mark.requires("timm", "torch")
@pytest.mark.parametrize("case", list(TIMM_CASES))
def test_timm_state_dict_gives_timms_logits(timm_files, case):
    _, kwargs, size, suffix = TIMM_CASES[case]
    path = timm_files / f"{case}{suffix}"
    heads = dict(num_heads=kwargs["num_heads"]) if "num_heads" in kwargs else {}
    model = keras_vit.model_from_checkpoint(path, **heads, **OPTIONS.get(case, {}))
    logits = to_numpy(model(photos(size)))
    np.testing.assert_allclose(logits, np.load(timm_files / f"{case}.npy"), atol=TOLERANCE, rtol=0)
    if case == "gap_fc_norm":  # ViT(weights=...) with the same options loads it too
        again = keras_vit.ViT(
            None,
            patch_size=8,
            hidden_size=64,
            depth=1,
            num_heads=4,
            mlp_dim=256,
            classifier="gap",
            fc_norm=True,
            gelu="exact",
            weights=str(path),
        )
        np.testing.assert_allclose(to_numpy(again(photos(size))), logits, atol=1e-6)


@pytest.mark.reference
@pytest.mark.requires("timm", "torch")
def test_a_head_count_the_file_cannot_tell_is_given_or_the_guess_is_printed(timm_files, tmp_path):
    """timm's state dict of a 6-head model: read as 3 heads only with a warning saying so and how to say 6;
    ``num_heads=6`` (``predict --num-heads 6``, ``zoo convert --num-heads 6``) gives timm's logits."""
    from keras_vit import predict

    path, expected = timm_files / "six_heads.pth", np.load(timm_files / "six_heads.npy")
    with pytest.warns(
        UserWarning,
        match=r"six_heads.pth does not record its number of attention heads \(timm state "
        r"dict\): read as 3 heads, the usual for width 192\. .*num_heads=N \(the commands' --num-heads N\)",
    ):
        guessed = keras_vit.model_from_checkpoint(path)
    assert np.abs(to_numpy(guessed(photos(32))) - expected).max() > 1e-3  # the wrong grouping shows
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said: no guess, no warning
        model = predict._build_model(str(path), "none", num_heads=6)
    np.testing.assert_allclose(to_numpy(model(photos(32))), expected, atol=TOLERANCE, rtol=0)
    keras_vit.save_timm_safetensors(model, tmp_path / "six_heads.safetensors")  # keras-vit records them
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = keras_vit.model_from_checkpoint(tmp_path / "six_heads.safetensors")
    np.testing.assert_allclose(to_numpy(again(photos(32))), expected, atol=TOLERANCE, rtol=0)


@pytest.mark.reference
@pytest.mark.requires("timm", "torch")
@pytest.mark.parametrize("options", [dict(), dict(layer_scale_init=0.1)])
def test_keras_vit_to_timm_round_trip(tmp_path, options):
    model = keras_vit.ViT(
        None,
        patch_size=8,
        hidden_size=64,
        depth=2,
        num_heads=4,
        mlp_dim=128,
        image_size=32,
        num_classes=5,
        gelu="exact",
        **options,
    )
    rng = np.random.default_rng(0)
    for variable in model.weights:
        variable.assign(rng.normal(0, 0.1, variable.shape))
    keras_vit.save_timm_safetensors(model, tmp_path / "model.safetensors")
    np.save(tmp_path / "images.npy", photos(32))
    kwargs = keras_vit.checkpoints.timm_model_kwargs(model)
    job = dict(
        model=kwargs.pop("model_name"),
        kwargs=kwargs,
        load=str(tmp_path / "model.safetensors"),
        images=str(tmp_path / "images.npy"),
        logits=str(tmp_path / "logits.npy"),
    )
    (tmp_path / "jobs.json").write_text(json.dumps([job]))
    run_reference(TIMM_SCRIPT, tmp_path / "jobs.json")
    np.testing.assert_allclose(np.load(tmp_path / "logits.npy"), to_numpy(model(photos(32))), atol=TOLERANCE, rtol=0)


def small_model(**kwargs):
    return keras_vit.ViT(
        None, patch_size=8, hidden_size=32, depth=1, num_heads=2, mlp_dim=64, image_size=32, num_classes=5, **kwargs
    )


def randomised(model):
    rng = np.random.default_rng(1)
    for variable in model.weights:
        variable.assign(rng.normal(0, 0.1, variable.shape))
    return model


@pytest.mark.parametrize("options", [dict(), dict(classifier="gap", fc_norm=True), dict(layer_scale_init=0.1)])
def test_timm_safetensors_without_torch_round_trip(tmp_path, options):
    model = randomised(small_model(gelu="exact", **options))
    state = keras_vit.save_timm_safetensors(model, tmp_path / "m.safetensors")
    assert "patch_embed.proj.weight" in state and state["blocks.0.attn.qkv.weight"].shape == (96, 32)
    again = keras_vit.model_from_checkpoint(tmp_path / "m.safetensors", num_heads=2)
    np.testing.assert_allclose(to_numpy(again(photos(32))), to_numpy(model(photos(32))), atol=1e-6)
    loaded = small_model(**options)  # another GELU: loads, with a warning that says so
    with pytest.warns(UserWarning, match="gelu='exact'"):
        keras_vit.load_weights(loaded, tmp_path / "m.safetensors")


def test_layer_scale_loads_from_timm_keys_and_must_be_on_to_load(tmp_path):
    model = randomised(small_model(gelu="exact", layer_scale_init=0.1))
    state = keras_vit.save_timm_safetensors(model, tmp_path / "m.safetensors")
    assert state["blocks.0.ls1.gamma"].shape == state["blocks.0.ls2.gamma"].shape == (32,)
    again = keras_vit.model_from_checkpoint(tmp_path / "m.safetensors", num_heads=2)
    assert again.config.layer_scale_init is not None
    np.testing.assert_array_equal(again.get_layer("encoderblock_0").ls1.gamma.numpy(), state["blocks.0.ls1.gamma"])
    with pytest.raises(ValueError, match="layer_scale_init=1e-05, the model layer_scale_init=None"):
        keras_vit.load_weights(small_model(gelu="exact"), tmp_path / "m.safetensors")


def test_fc_norm_mismatch_is_an_error(tmp_path):
    keras_vit.save_timm_safetensors(randomised(small_model(classifier="gap", fc_norm=True)), tmp_path / "m.safetensors")
    with pytest.raises(ValueError, match="fc_norm=True"):
        keras_vit.load_weights(small_model(classifier="gap"), tmp_path / "m.safetensors")


def test_timm_keys_mismatch_lists_names(tmp_path):
    state = keras_vit.to_timm_state_dict(randomised(small_model()))
    state["blocks.0.mystery.weight"] = np.zeros(3, "float32")
    del state["blocks.0.mlp.fc1.bias"]
    with pytest.raises(ValueError) as info:
        keras_vit.load_weights(small_model(gelu="exact"), state)
    message = str(info.value)
    assert "unexpected" in message and "blocks.0.mystery.weight" in message
    assert "missing" in message and "MlpBlock_3/Dense_0/bias" in message


@pytest.mark.parametrize(
    "extra, feature",
    [
        ("blocks.0.attn.q_bias", "split q/k/v projections"),
        ("attn_pool.pos_embed", "an attention pool other than a MAP head"),
        ("blocks.0.mlp.fc1_g.weight", "two projections"),
    ],
)
def test_unsupported_timm_variants_are_named(tmp_path, extra, feature):
    from safetensors.numpy import save_file

    state = keras_vit.to_timm_state_dict(small_model())
    state[extra] = np.zeros((1, 1, 32), "float32")
    save_file(state, tmp_path / "m.safetensors")
    with pytest.raises(ValueError, match=feature):
        keras_vit.model_from_checkpoint(tmp_path / "m.safetensors")


@pytest.mark.backends("tensorflow", "jax")  # the torch backend needs torch itself
def test_torch_file_without_torch_says_so(tmp_path, monkeypatch):
    path = tmp_path / "model.pth"
    with zipfile.ZipFile(path, "w") as archive:  # the torch.save layout, enough to be recognised
        archive.writestr("model/data.pkl", b"\x80\x02}q\x00.")
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError, match="needs PyTorch"):
        keras_vit.load_weights(small_model(), path)


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda p: p / "missing.safetensors", FileNotFoundError, "No checkpoint file at"),
        (lambda p: p, ValueError, "folder without a checkpoint"),
        (
            lambda p: (p / "x.dat").write_bytes(b"hello world, not weights") and p / "x.dat",
            ValueError,
            "not a checkpoint keras-vit reads",
        ),
        (
            lambda p: (
                (p / "t.safetensors").write_bytes(b'\x10\x00\x00\x00\x00\x00\x00\x00{"a"') and p / "t.safetensors"
            ),
            ValueError,
            "not a readable safetensors",
        ),
    ],
)
def test_unreadable_paths_say_what_they_are(tmp_path, make, error, match):
    with pytest.raises(error, match=match):
        keras_vit.load_weights(small_model(), make(tmp_path))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this system")
def test_a_fifo_is_refused_not_waited_on(tmp_path):
    """Opening a named pipe would wait for a writer forever: it is named and refused without being opened."""
    fifo = tmp_path / "weights.npz"
    os.mkfifo(fifo)
    model, outcome = small_model(), {}

    def load():
        try:
            keras_vit.load_weights(model, fifo)
        except ValueError as error:
            outcome["error"] = str(error)

    reader = threading.Thread(target=load, daemon=True)
    reader.start()
    reader.join(timeout=30)
    if reader.is_alive():  # the regression: release the blocked reader, then fail
        with open(fifo, "wb"):
            pass
        pytest.fail("load_weights blocked on a FIFO")
    assert outcome["error"].startswith(f"{fifo} is not a regular file or folder")


def test_keras_files(tmp_path):
    model = randomised(small_model())
    model.save_weights(tmp_path / "m.weights.h5")
    model.save(tmp_path / "m.keras")
    again = small_model(weights=str(tmp_path / "m.weights.h5"))
    np.testing.assert_allclose(to_numpy(again(photos(32))), to_numpy(model(photos(32))), atol=1e-6)
    loaded = small_model()  # a saved keras-vit model is weights too (docs/weights.md)
    keras_vit.load_weights(loaded, tmp_path / "m.keras")
    np.testing.assert_allclose(to_numpy(loaded(photos(32))), to_numpy(model(photos(32))), atol=1e-6)
    with pytest.raises(ValueError, match="holds no architecture"):
        keras_vit.model_from_checkpoint(tmp_path / "m.weights.h5")


def test_convert_command_both_ways(tmp_path):
    from keras_vit.zoo.__main__ import main

    model = randomised(small_model(gelu="exact"))
    keras_vit.save_timm_safetensors(model, tmp_path / "timm.safetensors")
    main(["convert", str(tmp_path / "timm.safetensors"), str(tmp_path / "m.keras"), "--num-heads", "2"])
    converted = keras.saving.load_model(tmp_path / "m.keras")
    np.testing.assert_allclose(to_numpy(converted(photos(32))), to_numpy(model(photos(32))), atol=1e-6)
    main(["convert", str(tmp_path / "m.keras"), str(tmp_path / "back.safetensors")])
    again = keras_vit.model_from_checkpoint(tmp_path / "back.safetensors", num_heads=2)
    np.testing.assert_allclose(to_numpy(again(photos(32))), to_numpy(model(photos(32))), atol=1e-6)
