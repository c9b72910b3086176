"""The Google ``.npz`` loader: the key map, a numpy reference forward pass, errors, head skipping,
checkpoint defaults, saving and the convert command; and parity with an independent implementation, timm's
VisionTransformer and its own ``.npz`` loader (the ``reference`` tests at the end)."""

import json
import warnings
from pathlib import Path

import keras
import numpy as np
import pytest
import scipy.ndimage
from npz_layout import vit_checkpoint, write_checkpoint
from reference_runs import run_reference

import keras_vit
from keras_vit.checkpoints.infer import checkpoint_info
from keras_vit.checkpoints.keymap import model_arrays, npz_key_map
from keras_vit.checkpoints.load import load_weights
from keras_vit.checkpoints.source import read_npz
from keras_vit.zoo.__main__ import main as zoo_main
from keras_vit.zoo.errors import CorruptCheckpointError

ARCH = dict(patch_size=8, hidden_size=32, depth=2, num_heads=4, mlp_dim=64)
CKPT = dict(patch=8, width=32, depth=2, heads=4, mlp=64, grid=(4, 4))  # the same, as stored; 32 px images


def images(size=32, batch=2, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (batch, size, size, 3)).astype("float32")


def run(model, x):
    """Eager forward pass (tiny models: faster than tracing ``predict``)."""
    return keras.ops.convert_to_numpy(model(x, training=False))


def layer_norm(x, scale, bias):
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-6) * scale + bias


def flax_forward(a, x):
    """The published model (vit_jax/models_vit.py) in float64 numpy, from the checkpoint arrays."""
    p, _, c, width = a["embedding/kernel"].shape
    b, h, w, _ = x.shape
    patches = x.reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5).reshape(b, -1, p * p * c)
    x = patches @ a["embedding/kernel"].reshape(-1, width).astype("float64") + a["embedding/bias"]
    if "cls" in a:
        x = np.concatenate([np.broadcast_to(a["cls"], (b, 1, width)), x], axis=1)
    x = x + a["Transformer/posembed_input/pos_embedding"]
    for i in range(checkpoint_info(a).architecture.depth):
        blk = f"Transformer/encoderblock_{i}"
        att = f"{blk}/MultiHeadDotProductAttention_1"
        y = layer_norm(x, a[f"{blk}/LayerNorm_0/scale"], a[f"{blk}/LayerNorm_0/bias"])
        q, k, v = (
            np.einsum("bnd,dhk->bnhk", y, a[f"{att}/{n}/kernel"]) + a[f"{att}/{n}/bias"]
            for n in ("query", "key", "value")
        )
        logits = np.einsum("bqhk,bthk->bhqt", q, k) / np.sqrt(q.shape[-1])
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        y = np.einsum("bhqt,bthk->bqhk", probs, v)
        x = x + np.einsum("bqhk,hkd->bqd", y, a[f"{att}/out/kernel"]) + a[f"{att}/out/bias"]
        y = layer_norm(x, a[f"{blk}/LayerNorm_2/scale"], a[f"{blk}/LayerNorm_2/bias"])
        y = y @ a[f"{blk}/MlpBlock_3/Dense_0/kernel"] + a[f"{blk}/MlpBlock_3/Dense_0/bias"]
        y = 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y**3)))  # flax nn.gelu (tanh)
        x = x + y @ a[f"{blk}/MlpBlock_3/Dense_1/kernel"] + a[f"{blk}/MlpBlock_3/Dense_1/bias"]
    x = layer_norm(x, a["Transformer/encoder_norm/scale"], a["Transformer/encoder_norm/bias"])
    x = x[:, 0] if "cls" in a else x.mean(axis=1)
    if "pre_logits/kernel" in a:
        x = np.tanh(x @ a["pre_logits/kernel"] + a["pre_logits/bias"])
    return x @ a["head/kernel"] + a["head/bias"]


@pytest.fixture
def token_ckpt(tmp_path):
    arrays = vit_checkpoint(**CKPT, representation_size=16, num_classes=10)
    return write_checkpoint(tmp_path / "token.npz", arrays), arrays


@pytest.mark.parametrize("classifier, pre_logits", [("token", 16), ("gap", None)])
def test_loaded_model_matches_a_numpy_forward_pass_of_the_published_model(tmp_path, classifier, pre_logits):
    arrays = vit_checkpoint(**CKPT, classifier=classifier, representation_size=pre_logits, num_classes=10)
    path = write_checkpoint(tmp_path / "ckpt.npz", arrays)
    model = keras_vit.ViT(None, weights=str(path), classifier=classifier, **ARCH)
    x = images()
    expected = flax_forward(arrays, x.astype("float64"))
    assert np.abs(expected).max() > 0.5
    np.testing.assert_allclose(run(model, x), expected, rtol=0, atol=1e-4)


def test_key_map_maps_every_variable_and_every_checkpoint_key(token_ckpt):
    _, arrays = token_ckpt
    model = keras_vit.ViT(None, image_size=32, num_classes=10, representation_size=16, **ARCH)
    key_map = npz_key_map(model)
    assert set(key_map) == set(arrays)
    assert {id(variable) for variable, _ in key_map.values()} == {id(v) for v in model.weights}
    result = load_weights(model, arrays)
    assert set(result.loaded) == set(arrays) and result.skipped == ()


@pytest.mark.backend_independent  # file checks and config; the numbers per backend: the forward-pass parity
def test_b16_checkpoint_into_s16_fails_naming_keys_and_shapes_and_changes_nothing(tmp_path):
    arrays = vit_checkpoint(patch=16, width=768, depth=1, heads=12, mlp=3072, grid=(14, 14), num_classes=1000)
    model = keras_vit.ViT_S16(depth=1)
    before = [v.numpy().copy() for v in model.weights]
    with pytest.raises(ValueError) as info:
        load_weights(model, arrays)
    message = str(info.value)
    assert "shape mismatches" in message
    assert "embedding/kernel (16, 16, 3, 768): the model's embedding/kernel is (16, 16, 3, 384)" in message
    assert (
        "encoderblock_0/MlpBlock_3/Dense_0/kernel (768, 3072): the model's "
        "encoderblock_0/MlpBlock_3/Dense_0/kernel is (384, 1536)" in message
    )
    assert (
        "MultiHeadDotProductAttention_1/query/kernel: shape (768, 12, 64) does not split into the model's 6 "
        "heads" in message
    )
    assert "looks like custom: patch 16, width 768, depth 1, heads 12, mlp 3072" in message
    assert all(np.array_equal(v.numpy(), b) for v, b in zip(model.weights, before))
    path = write_checkpoint(tmp_path / "b16.npz", arrays)
    with pytest.raises(ValueError, match="the model's embedding/kernel is"):
        keras_vit.ViT_S16(weights=path, depth=1)


@pytest.mark.backend_independent  # file checks and config; the numbers per backend: the forward-pass parity
def test_missing_and_unexpected_keys_are_listed_by_name(token_ckpt):
    _, arrays = token_ckpt
    arrays = dict(arrays)
    del arrays["Transformer/encoderblock_1/LayerNorm_2/scale"]
    arrays["Transformer/encoderblock_7/LayerNorm_0/scale"] = np.ones(32, "float32")
    model = keras_vit.ViT(None, image_size=32, num_classes=10, representation_size=16, **ARCH)
    with pytest.raises(ValueError) as info:
        load_weights(model, arrays)
    message = str(info.value)
    assert "missing from the checkpoint (1):\n    Transformer/encoderblock_1/LayerNorm_2/scale" in message
    assert (
        "unexpected in the checkpoint (no such variable in the model) (1):\n    "
        "Transformer/encoderblock_7/LayerNorm_0/scale" in message
    )


@pytest.mark.backend_independent  # file checks and config; the numbers per backend: the forward-pass parity
def test_a_deeper_checkpoint_reports_its_extra_blocks(token_ckpt):
    _, arrays = token_ckpt
    model = keras_vit.ViT(None, image_size=32, num_classes=10, representation_size=16, **{**ARCH, "depth": 1})
    with pytest.raises(ValueError, match=r"unexpected in the checkpoint \(no such variable in the model\) \(16\)"):
        load_weights(model, arrays)


@pytest.mark.backend_independent  # file checks and config; the numbers per backend: the forward-pass parity
def test_include_top_false_skips_the_head_on_purpose_and_says_so_only_when_not_asked(token_ckpt):
    """ViT(include_top=False) asked for no head: no warning; load_weights into a headless model says what it skips."""
    path, _ = token_ckpt
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        features = keras_vit.ViT(None, weights=path, include_top=False, pooling="token", **ARCH)
    with pytest.warns(
        UserWarning,
        match=r"without head/bias, head/kernel, pre_logits/bias, pre_logits/kernel: "
        r"the model has no classification head \(include_top=False\)",
    ):
        load_weights(keras_vit.ViT(None, include_top=False, pooling="token", image_size=32, **ARCH), path)
    full = keras_vit.ViT(None, weights=path, **ARCH)
    expected = run(keras.Model(full.input, full.get_layer("token_pool").output), images())
    np.testing.assert_allclose(run(features, images()), expected, atol=1e-6)


@pytest.mark.backend_independent  # file checks and config; the numbers per backend: the forward-pass parity
def test_another_num_classes_leaves_the_head_at_its_initialisation(token_ckpt):
    path, arrays = token_ckpt
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a new head of 7 classes was asked for
        model = keras_vit.ViT(None, weights=path, num_classes=7, representation_size=16, **ARCH)
    with pytest.warns(UserWarning, match="the checkpoint's head has 10 classes, the model's 7"):
        load_weights(model, path)  # into a model built elsewhere: said
    assert not model.get_layer("head").kernel.numpy().any()
    np.testing.assert_array_equal(model.get_layer("pre_logits").kernel.numpy(), arrays["pre_logits/kernel"])
    np.testing.assert_array_equal(model.get_layer("embedding").kernel.numpy(), arrays["embedding/kernel"])


@pytest.mark.backend_independent  # file checks and config; the numbers per backend: the forward-pass parity
def test_a_model_without_pre_logits_drops_the_checkpoints_classifier(token_ckpt):
    path, _ = token_ckpt
    skipped = r"the model has no pre_logits layer \(the checkpoint's is 16 wide; representation_size=16 keeps it\)"
    with pytest.warns(UserWarning, match=skipped):
        model = keras_vit.ViT(None, weights=path, num_classes=10, **ARCH)
    assert "pre_logits" not in [layer.name for layer in model.layers]
    assert not model.get_layer("head").kernel.numpy().any()


@pytest.mark.backend_independent  # file checks and config; the numbers per backend: the forward-pass parity
def test_checkpoint_defaults_fill_image_size_classes_and_pre_logits(token_ckpt):
    path, arrays = token_ckpt
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the whole classifier loads: no warning
        model = keras_vit.ViT(None, weights=path, **ARCH)
    assert model.input_shape == (None, 32, 32, 3) and model.output_shape == (None, 10)
    assert model.get_layer("pre_logits").units == 16
    larger = keras_vit.ViT(None, weights=path, image_size=(48, 64), **ARCH)
    expected = keras_vit.resample_position_embeddings(arrays["Transformer/posembed_input/pos_embedding"], (6, 8))
    np.testing.assert_allclose(larger.get_layer("posembed_input").pos_embedding.numpy(), expected, atol=1e-6)
    np.testing.assert_array_equal(
        larger.get_layer("posembed_input").pos_embedding.numpy()[:, 0],
        arrays["Transformer/posembed_input/pos_embedding"][:, 0],
    )


@pytest.mark.backend_independent  # file checks and config; the numbers per backend: the forward-pass parity
def test_vit_without_a_variant_builds_the_files_model_as_model_from_checkpoint(token_ckpt, tmp_path):
    """One path for a file's defaults: ``ViT(None, weights=...)`` is ``model_from_checkpoint``, the file's
    architecture and options included (a timm file's exact GELU, its head count guessed and said)."""
    from safetensors.numpy import save_file

    path, _ = token_ckpt
    ours, theirs = keras_vit.ViT(weights=path), keras_vit.model_from_checkpoint(path)
    assert ours.config == theirs.config and ours.name == theirs.name
    assert ours.config.architecture == checkpoint_info(read_npz(path)).architecture
    np.testing.assert_array_equal(run(ours, images()), run(theirs, images()))
    timm = tmp_path / "timm.safetensors"  # without keras-vit's metadata: the head count is not recorded
    save_file(keras_vit.to_timm_state_dict(ours), timm)
    models = []
    for build in (lambda: keras_vit.ViT(weights=str(timm)), lambda: keras_vit.model_from_checkpoint(timm)):
        with pytest.warns(UserWarning, match=r"timm.safetensors does not record its number of attention heads"):
            models.append(build())
    assert models[0].config == models[1].config and models[0].config.gelu == "exact"
    np.testing.assert_array_equal(run(models[0], images()), run(models[1], images()))


@pytest.mark.backend_independent  # file checks and config; the numbers per backend: the forward-pass parity
def test_without_weights_the_defaults_are_unchanged():
    model = keras_vit.ViT(None, **ARCH)
    assert model.input_shape == (None, 224, 224, 3) and model.output_shape == (None, 1000)
    assert "pre_logits" not in [layer.name for layer in model.layers]
    assert keras_vit.ViT_Ti16(depth=1).input_shape == (None, 224, 224, 3)


@pytest.mark.backend_independent  # file checks and config; the numbers per backend: the forward-pass parity
def test_corrupt_truncated_and_foreign_files_fail_clearly(tmp_path, token_ckpt):
    path, _ = token_ckpt
    data = path.read_bytes()
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(data[: len(data) // 2])
    corrupt = CorruptCheckpointError  # a damaged zip, since issue 36 (it was a ValueError)
    with pytest.raises(corrupt, match=r"truncated\.npz is not a readable \.npz checkpoint \(BadZipFile.*delete it"):
        read_npz(truncated)
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"PK\x03\x04" + bytes(range(256)) * 8)
    with pytest.raises(corrupt, match=r"garbage\.npz is not a readable \.npz checkpoint"):
        keras_vit.ViT(None, weights=garbage, **ARCH)
    single = tmp_path / "single.npy"
    np.save(single, np.zeros(3))
    with pytest.raises(ValueError, match="holds one array, not named arrays"):
        read_npz(single)
    other = tmp_path / "other.npz"
    np.savez(other, weights=np.zeros(3))
    with pytest.raises(ValueError, match=r"not a ViT checkpoint: it has no 'embedding/kernel' key \(keys: weights\)"):
        read_npz(other)
    with pytest.raises(FileNotFoundError, match="No checkpoint file at"):
        keras_vit.ViT(None, weights=tmp_path / "absent.npz", **ARCH)
    with pytest.raises(ValueError, match=r"No checkpoint 'B_16.orig_in22k' in the zoo catalogue\. Did you mean"):
        keras_vit.ViT_B16(weights="B_16.orig_in22k")


@pytest.mark.backend_independent  # file checks and config; the numbers per backend: the forward-pass parity
def test_parameters_saved_with_their_optimizer_state_load(tmp_path, token_ckpt):
    _, arrays = token_ckpt
    nested = {f"opt/target/{key}": value for key, value in arrays.items()}
    nested["opt/state/step"] = np.array(3)
    path = write_checkpoint(tmp_path / "with_state.npz", nested)
    assert set(read_npz(path)) == set(arrays)


def test_a_loaded_model_saves_as_keras_and_weights_h5_and_reloads_identically(tmp_path, token_ckpt):
    path, _ = token_ckpt
    model = keras_vit.ViT(None, weights=path, **ARCH)
    expected = run(model, images())
    model.save(tmp_path / "model.keras")
    reloaded = keras.models.load_model(tmp_path / "model.keras")
    np.testing.assert_array_equal(run(reloaded, images()), expected)
    model.save_weights(tmp_path / "model.weights.h5")
    fresh = keras_vit.ViT(None, image_size=32, num_classes=10, representation_size=16, **ARCH)
    fresh.load_weights(tmp_path / "model.weights.h5")
    np.testing.assert_array_equal(run(fresh, images()), expected)


@pytest.mark.backend_independent  # file checks and config; the numbers per backend: the forward-pass parity
def test_convert_command_infers_the_architecture_and_writes_keras_files(tmp_path, token_ckpt, capsys):
    path, arrays = token_ckpt
    zoo_main(["convert", str(path), str(tmp_path / "out.keras")])
    assert "-> " in capsys.readouterr().out and not list(tmp_path.glob(".*"))  # no temporary file left
    converted = keras.models.load_model(tmp_path / "out.keras")
    assert converted.input_shape == (None, 32, 32, 3) and converted.get_layer("pre_logits").units == 16
    np.testing.assert_allclose(run(converted, images()), flax_forward(arrays, images().astype("float64")), atol=1e-4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # --no-top asked for no head: no warning about skipping it
        zoo_main(
            [
                "convert",
                str(path),
                str(tmp_path / "features.weights.h5"),
                "--no-top",
                "--image-size",
                "48",
                "--resize-method",
                "bicubic",
            ]
        )
    features = keras_vit.ViT(None, image_size=48, include_top=False, **ARCH)
    features.load_weights(tmp_path / "features.weights.h5")
    expected = keras_vit.resample_position_embeddings(
        arrays["Transformer/posembed_input/pos_embedding"], 6, method="bicubic"
    )
    np.testing.assert_allclose(features.get_layer("posembed_input").pos_embedding.numpy(), expected, atol=1e-6)
    with pytest.raises(SystemExit):
        zoo_main(["convert", str(path), str(tmp_path / "out.h5")])
    zoo_main(["info", str(path)])
    assert (
        "patch 8, width 32, depth 2, heads 4, mlp 64, classifier 'token', grid (4, 4), image size 32"
        in capsys.readouterr().out
    )


def hybrid_arrays(model):
    """A hybrid checkpoint: the ResNet's keys as the published files store them (GroupNorm (1, 1, 1, C)),
    the transformer's from npz_layout."""
    resnet = model.get_layer("resnet")
    arrays = {}
    for key, (variable, _) in resnet.npz_key_map().items():
        value = np.random.default_rng(len(arrays)).normal(0, 0.1, variable.shape).astype("float32")
        arrays[key] = value.reshape(1, 1, 1, -1) if key.startswith("gn") or "/gn" in key else value
    channels = resnet.output_channels
    arrays.update(
        vit_checkpoint(patch=1, width=32, depth=1, heads=2, mlp=64, grid=(4, 4), channels=channels, num_classes=3)
    )
    return arrays


@pytest.mark.backends("tensorflow", "torch")  # slow to compile on JAX
def test_hybrid_layers_contribute_their_own_keys_and_a_hybrid_converts():
    model = keras_vit.ViT(
        None,
        resnet=(1, 1),
        image_size=32,
        num_classes=3,
        patch_size=1,
        hidden_size=32,
        depth=1,
        num_heads=2,
        mlp_dim=64,
    )
    key_map = npz_key_map(model)
    assert {
        "conv_root/kernel",
        "gn_root/scale",
        "block1/unit1/conv1/kernel",
        "block2/unit1/conv_proj/kernel",
        "embedding/kernel",
    } <= set(key_map)
    assert {id(variable) for variable, _ in key_map.values()} == {id(v) for v in model.weights}
    arrays = hybrid_arrays(model)
    info = checkpoint_info(arrays)
    assert info.architecture.resnet_stages == (1, 1) and info.architecture.stride == 8 and info.image_size == 32
    load_weights(model, arrays)
    built = keras_vit.model_from_checkpoint(arrays)
    assert built.get_layer("resnet").num_layers == (1, 1) and built.input_shape == (None, 32, 32, 3)
    np.testing.assert_allclose(run(built, images()), run(model, images()), atol=1e-5)


@pytest.mark.backend_independent  # file checks and config; the numbers per backend: the forward-pass parity
def test_checkpoint_info_names_published_variants():
    b16 = vit_checkpoint(patch=16, width=768, depth=12, heads=12, mlp=3072, grid=(24, 24), num_classes=1000, zeros=True)
    info = checkpoint_info(b16)
    assert (info.variant, info.image_size, info.num_classes, info.representation_size) == ("B/16", 384, 1000, None)
    shapes = {
        k: np.zeros((1, 1, 1, 1))
        for k in (
            "conv_root/kernel",
            "block1/unit1/conv1/kernel",
            "block1/unit2/conv1/kernel",
            "block2/unit1/conv1/kernel",
        )
    }
    with pytest.raises(ValueError, match="not a ViT checkpoint in the published layout"):
        checkpoint_info(shapes)


@pytest.mark.backend_independent  # file checks and config; the numbers per backend: the forward-pass parity
def test_model_from_checkpoint_names_models_from_the_table():
    ti16 = vit_checkpoint(patch=16, width=192, depth=12, heads=3, mlp=768, grid=(2, 2), num_classes=4)
    model = keras_vit.model_from_checkpoint(ti16)
    assert model.name == "vit_ti16" and model.input_shape == (None, 32, 32, 3) and model.output_shape == (None, 4)
    custom = keras_vit.model_from_checkpoint(vit_checkpoint(**CKPT))  # no size of the table: width and patch
    assert custom.name == "vit_d328"


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.backend_independent  # file checks and config; the numbers per backend: the forward-pass parity
def test_non_finite_weights_are_refused_naming_the_file_and_arrays(tmp_path, bad):
    """NaN or inf in a file would make every output NaN: refused before anything is assigned, in every format."""
    from npz_layout import vit_checkpoint, write_checkpoint

    arrays = vit_checkpoint(patch=8, width=32, depth=2, heads=2, mlp=64, grid=(4, 4), num_classes=5)
    arrays["Transformer/encoderblock_1/MlpBlock_3/Dense_0/kernel"][3, 7] = bad
    path = write_checkpoint(tmp_path / "bad.npz", arrays)
    with pytest.raises(ValueError, match=r"bad\.npz holds NaN or infinite values in 1 arrays: .*encoderblock_1/Mlp"):
        keras_vit.model_from_checkpoint(path)
    arrays["Transformer/encoderblock_1/MlpBlock_3/Dense_0/kernel"][3, 7] = 0.0
    good = keras_vit.model_from_checkpoint(arrays)
    before = [np.array(v) for v in good.get_weights()]
    keras_vit.save_timm_safetensors(good, tmp_path / "timm.safetensors")
    from safetensors.numpy import load_file, save_file

    state = load_file(tmp_path / "timm.safetensors")
    state["blocks.0.attn.qkv.weight"][0, 0] = bad
    save_file(state, tmp_path / "timm.safetensors")
    with pytest.raises(ValueError, match=r"timm\.safetensors holds NaN or infinite values"):
        keras_vit.load_weights(good, tmp_path / "timm.safetensors")
    assert all(np.array_equal(a, b) for a, b in zip(before, good.get_weights()))  # nothing was assigned


@pytest.mark.backend_independent  # file checks and config; the numbers per backend: the forward-pass parity
def test_a_zip_bomb_npz_is_refused_before_anything_is_unpacked(tmp_path):
    """A small .npz whose member unpacks to 96 MiB of zeros (and one that declares 2 GiB): named and refused from
    the sizes the archive declares, by the loader and the zoo's check, without the memory it would take."""
    import resource
    import zipfile

    from keras_vit.zoo.validate import check_npz

    header = np.lib.format.header_data_from_array_1_0(np.zeros(1, "float32"))
    header["shape"] = (24 << 20,)  # 96 MiB of float32
    bomb = tmp_path / "bomb.npz"
    with (
        zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as archive,
        archive.open("embedding/kernel.npy", "w", force_zip64=True) as member,
    ):
        np.lib.format.write_array_header_1_0(member, header)
        for _ in range(6):
            member.write(bytes(16 << 20))
    assert bomb.stat().st_size < 1 << 20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for load in (keras_vit.model_from_checkpoint, check_npz):
        with pytest.raises(ValueError if load is keras_vit.model_from_checkpoint else OSError, match="would unpack to"):
            load(bomb)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 64 << 10  # KiB: nothing was unpacked


def test_model_arrays_split_every_attention_into_heads_and_load_back(tmp_path):
    """The key map read backwards, a MAP head's attention too: a saved ``.keras`` SigLIP-style model loads."""
    model = keras_vit.ViT(None, image_size=32, num_classes=10, classifier="map", **ARCH)
    arrays = model_arrays(model)
    assert arrays["Transformer/encoderblock_1/MultiHeadDotProductAttention_1/key/kernel"].shape == (32, 4, 8)
    assert arrays["MAPHead_0/MultiHeadDotProductAttention_0/value/bias"].shape == (4, 8)
    assert arrays["MAPHead_0/MultiHeadDotProductAttention_0/out/kernel"].shape == (4, 8, 32)
    model.save(tmp_path / "map.keras")
    loaded = keras_vit.ViT(None, image_size=32, num_classes=10, classifier="map", **ARCH)
    load_weights(loaded, tmp_path / "map.keras")
    np.testing.assert_array_equal(run(loaded, images()), run(model, images()))


# --- parity with timm ---------------------------------------------------------------------------------------------
# Checkpoints are written with numpy in the published layout (``npz_layout.py``), loaded into keras-vit here and into
# timm in a subprocess (``reference/timm_vit.py``: TensorFlow and timm in one process crash), and both run on the same
# images. timm has no ``pre_logits`` layer, so the token model's pre-head features are compared with timm and
# ``pre_logits`` + head with a numpy computation. Each test carries the marks the former tests/test_reference_timm.py
# set for its whole file: the TensorFlow pass only, ``reference``, and ``requires("timm", "torch")``.

REFERENCE = Path(__file__).parents[1] / "reference" / "timm_vit.py"
B16 = dict(patch_size=16, hidden_size=768, depth=2, num_heads=12, mlp_dim=3072)  # B/16, 2 blocks
TOLERANCE = 1e-4
RESAMPLES = [
    ((24, 24), "bilinear"),
    ((24, 24), "bicubic"),
    ((7, 7), "bilinear"),
    ((7, 7), "bicubic"),
    ((20, 12), "bilinear"),
    ((20, 12), "bicubic"),
]


def timm_model(image_size, classifier, num_classes):
    return dict(
        img_size=image_size,
        patch_size=16,
        embed_dim=768,
        depth=2,
        num_heads=12,
        mlp_ratio=4.0,
        num_classes=num_classes,
        class_token=classifier == "token",
        global_pool="token" if classifier == "token" else "avg",
        fc_norm=False,
    )


@pytest.fixture(scope="module")
def timm_runs(tmp_path_factory):
    """Write the checkpoints and inputs, run timm once on all jobs, return paths and timm's outputs."""
    tmp = tmp_path_factory.mktemp("timm")
    rng = np.random.default_rng(1)
    images = {size: rng.uniform(-1, 1, (2, size, size, 3)).astype("float32") for size in (224, 384)}
    for size, array in images.items():
        np.savez(tmp / f"images{size}.npz", images=array)
    cases = {
        "token": (
            vit_checkpoint(patch=16, width=768, heads=12, mlp=3072, grid=(14, 14), representation_size=768, seed=2),
            224,
            "token",
            0,
        ),
        "gap": (
            vit_checkpoint(patch=16, width=768, heads=12, mlp=3072, grid=(14, 14), classifier="gap", seed=3),
            224,
            "gap",
            10,
        ),
        "resized": (vit_checkpoint(patch=16, width=768, heads=12, mlp=3072, grid=(14, 14), seed=4), 384, "token", 10),
    }
    jobs = []
    for name, (arrays, size, classifier, classes) in cases.items():
        write_checkpoint(tmp / f"{name}.npz", arrays)
        jobs.append(
            dict(
                kind="vit",
                checkpoint=str(tmp / f"{name}.npz"),
                images=str(tmp / f"images{size}.npz"),
                output=str(tmp / f"{name}_out.npz"),
                model=timm_model(size, classifier, classes),
            )
        )
    posemb = rng.normal(size=(1, 1 + 14 * 14, 16)).astype("float32")
    np.savez(tmp / "posemb.npz", posemb=posemb)
    for i, (size, method) in enumerate(RESAMPLES):
        jobs.append(
            dict(
                kind="resample",
                input=str(tmp / "posemb.npz"),
                output=str(tmp / f"resample{i}.npz"),
                new_size=list(size),
                num_prefix_tokens=1,
                interpolation=method,
                antialias=method == "bicubic",
            )
        )
    (tmp / "jobs.json").write_text(json.dumps(jobs))
    run_reference(REFERENCE.read_text(), tmp / "jobs.json")
    outputs = {name: dict(np.load(tmp / f"{name}_out.npz")) for name in cases}
    resampled = [np.load(tmp / f"resample{i}.npz")["posemb"] for i in range(len(RESAMPLES))]
    return dict(tmp=tmp, images=images, cases=cases, outputs=outputs, posemb=posemb, resampled=resampled)


def report(name, error):
    """Print a measured parity error (shown with ``pytest -s``; the README quotes these)."""
    print(f"\nparity {name}: max |keras-vit - reference| = {error:.2e}")
    return error


def features_and_logits(model, pool, images):
    features = keras.Model(model.input, model.get_layer(pool).output)
    return features.predict(images, verbose=0), model.predict(images, verbose=0)


@pytest.mark.backends("tensorflow")
@pytest.mark.reference
@pytest.mark.requires("timm", "torch")
def test_token_model_with_pre_logits_matches_timm_and_numpy(timm_runs):
    arrays = timm_runs["cases"]["token"][0]
    images = timm_runs["images"][224]
    model = keras_vit.ViT(None, weights=timm_runs["tmp"] / "token.npz", gelu="exact", **B16)
    assert model.get_layer("pre_logits").units == 768 and model.output_shape == (None, 10)
    features, logits = features_and_logits(model, "token_pool", images)
    reference = timm_runs["outputs"]["token"]["features"]
    assert report("token B/16 features vs timm", np.abs(features - reference).max()) <= TOLERANCE
    assert np.abs(reference).max() > 0.5  # the comparison is not between two near-zero vectors

    # pre_logits (tanh) and head by hand, on timm's features.
    pre = np.tanh(reference.astype("float64") @ arrays["pre_logits/kernel"] + arrays["pre_logits/bias"])
    expected = pre @ arrays["head/kernel"] + arrays["head/bias"]
    assert report("token B/16 pre_logits+head logits vs numpy", np.abs(logits - expected).max()) <= TOLERANCE
    keras.backend.clear_session()


@pytest.mark.backends("tensorflow")
@pytest.mark.reference
@pytest.mark.requires("timm", "torch")
def test_gap_model_matches_timm(timm_runs):
    images = timm_runs["images"][224]
    model = keras_vit.ViT(None, weights=timm_runs["tmp"] / "gap.npz", classifier="gap", gelu="exact", **B16)
    assert "class_token" not in [layer.name for layer in model.layers]
    features, logits = features_and_logits(model, "avg_pool", images)
    out = timm_runs["outputs"]["gap"]
    assert report("gap B/16 features vs timm", np.abs(features - out["features"]).max()) <= TOLERANCE
    assert report("gap B/16 logits vs timm", np.abs(logits - out["logits"]).max()) <= TOLERANCE
    assert np.abs(out["logits"]).max() > 0.5
    keras.backend.clear_session()


@pytest.mark.backends("tensorflow")
@pytest.mark.reference
@pytest.mark.requires("timm", "torch")
def test_224_checkpoint_in_384_model_matches_timm_bilinear_resize(timm_runs):
    images = timm_runs["images"][384]
    model = keras_vit.ViT(None, image_size=384, num_classes=10, gelu="exact", **B16)
    load_weights(model, timm_runs["tmp"] / "resized.npz", resize_method="bilinear")
    assert model.get_layer("posembed_input").pos_embedding.shape == (1, 1 + 24 * 24, 768)
    logits = model.predict(images, verbose=0)
    error = np.abs(logits - timm_runs["outputs"]["resized"]["logits"]).max()
    assert report("224 checkpoint -> 384 model (bilinear) logits vs timm", error) <= TOLERANCE
    keras.backend.clear_session()


@pytest.mark.backends("tensorflow")
@pytest.mark.reference
@pytest.mark.requires("timm", "torch")
@pytest.mark.parametrize("index", range(len(RESAMPLES)), ids=[f"{s[0]}x{s[1]}-{m}" for s, m in RESAMPLES])
def test_resample_methods_match_timm_resample_abs_pos_embed(timm_runs, index):
    size, method = RESAMPLES[index]
    ours = keras_vit.resample_position_embeddings(timm_runs["posemb"], size, method=method)
    assert ours.shape == timm_runs["resampled"][index].shape == (1, 1 + size[0] * size[1], 16)
    assert report(f"resample {size} {method} vs timm", np.abs(ours - timm_runs["resampled"][index]).max()) <= 1e-5


@pytest.mark.backends("tensorflow")
@pytest.mark.reference
@pytest.mark.requires("timm", "torch")
def test_zoom_linear_differs_from_timm_bilinear(timm_runs):
    """The original's corner-aligned zoom and timm's half-pixel bilinear are different resizes."""
    ours = keras_vit.resample_position_embeddings(timm_runs["posemb"], (24, 24), method="zoom_linear")
    grid = scipy.ndimage.zoom(timm_runs["posemb"][0, 1:].reshape(14, 14, 16), (24 / 14, 24 / 14, 1), order=1)
    np.testing.assert_allclose(ours[0, 1:], grid.reshape(-1, 16), atol=1e-6)
    assert np.abs(ours - timm_runs["resampled"][0]).max() > 1e-2
