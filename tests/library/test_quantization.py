"""Keras quantization (``model.quantize``) of keras-vit models kept through a ``.keras`` file
(keras_vit/quantization.py): every mode Keras 3.15 offers without calibration, on every backend (all three run them
on CPUs), the head included; the head's own precision (``head_dtype``); predict and export of a quantized file.
On JAX a mode's first quantized call compiles its ops one by one (2-5 s of the round trip on a loaded 2-vCPU host)."""

import json

import keras
import numpy as np
import pytest
from PIL import Image

import keras_vit
from keras_vit import export, predict
from keras_vit.quantization import QUANTIZATION_MODES, own_policy

TINY = dict(image_size=32, patch_size=8, hidden_size=32, depth=1, num_heads=2, mlp_dim=64, num_classes=10)
DENSE = [
    "encoderblock_0/MultiHeadDotProductAttention_1/qkv",
    "encoderblock_0/MultiHeadDotProductAttention_1/out",
    "encoderblock_0/MlpBlock_3/Dense_0",
    "encoderblock_0/MlpBlock_3/Dense_1",
    "head",
]


def tiny(**options) -> keras.Model:
    """A one-block model whose head has weights (zero-initialised, as published, its logits would all be 0)."""
    model = keras_vit.ViT(**TINY, **options)
    head = model.get_layer("head")
    head.kernel.assign(np.random.default_rng(1).normal(0, 0.3, head.kernel.shape).astype(head.kernel.dtype))
    return model


def images(count: int = 2) -> np.ndarray:
    return np.random.default_rng(0).uniform(-1, 1, (count, 32, 32, 3)).astype("float32")


def outputs(model: keras.Model, x: np.ndarray) -> np.ndarray:
    return keras.ops.convert_to_numpy(model(x)).astype("float32")  # eager: no compiled predict step per model


def modes(model: keras.Model) -> dict[str, str | None]:
    """``{path: quantization mode}`` of the model's Dense layers."""
    dense = (layer for layer in model._flatten_layers() if isinstance(layer, keras.layers.Dense))
    return {layer.path: layer.quantization_mode for layer in dense}


@pytest.mark.parametrize("mode", QUANTIZATION_MODES)
def test_a_quantized_model_saves_loads_and_predicts_the_same(mode, tmp_path):
    """Every Dense, head included, quantized; the config records each one's policy (a model built from it is the
    quantized model, not a float one), and the ``.keras`` file loads into the same predictions."""
    model = tiny()
    float_logits = outputs(model, images())
    model.quantize(mode)
    logits = outputs(model, images())
    assert modes(model) == dict.fromkeys(DENSE, mode)
    assert 0 < np.abs(logits - float_logits).max() < 0.3 * np.abs(float_logits).max()  # quantized, close
    recorded = keras.dtype_policies.deserialize(model.get_config()["dtype"])
    assert isinstance(recorded, keras.dtype_policies.DTypePolicyMap) and sorted(recorded) == sorted(DENSE)
    model.save(tmp_path / "quantized.keras")
    loaded = keras.saving.load_model(tmp_path / "quantized.keras")  # VisionTransformer.from_config(get_config())
    assert modes(loaded) == modes(model) and len(loaded.weights) == len(model.weights)
    np.testing.assert_allclose(outputs(loaded, images()), logits, atol=1e-6)


@pytest.mark.backend_independent  # the policies recorded; each backend's quantized call: above
def test_the_float32_head_of_a_mixed_model_quantizes_and_stays_float32_based(tmp_path):
    """Under mixed_bfloat16 the head keeps float32 (the mixed-precision rule) and quantizes as any Dense:
    ``int8_from_float32`` beside the blocks' ``int8_from_mixed_bfloat16``, both kept by the file, also when the
    loaded model is saved again; float32 logits."""
    model = tiny(dtype="mixed_bfloat16")
    model.quantize("int8")
    model.save(tmp_path / "mixed.keras")
    keras.saving.load_model(tmp_path / "mixed.keras").save(tmp_path / "again.keras")
    loaded = keras.saving.load_model(tmp_path / "again.keras")
    for layer in (model, loaded):
        assert own_policy(layer.get_layer("head")).name == "int8_from_float32"
        assert own_policy(layer.get_layer("encoderblock_0").mlp.fc1).name == "int8_from_mixed_bfloat16"
        assert layer.get_layer("encoderblock_0").compute_dtype == "bfloat16"
    logits = loaded(images())
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    np.testing.assert_allclose(keras.ops.convert_to_numpy(logits), outputs(model, images()), atol=1e-6)


@pytest.mark.backend_independent  # the policies recorded; each backend's quantized call: above
def test_quantized_keras_vit_layers_in_a_plain_model_save_and_load(tmp_path):
    """A layer that builds its own Dense layers (a block's attention and MLP; MAPHead alike) records their quantized
    policies itself: a plain functional model of it (not a VisionTransformer) loads quantized too."""
    inputs = keras.Input((5, 32))
    model = keras.Model(inputs, keras_vit.TransformerBlock(2, 64, name="block")(inputs))
    model.quantize("int8")
    tokens = np.random.default_rng(0).normal(size=(2, 5, 32)).astype("float32")
    model.save(tmp_path / "plain.keras")
    loaded = keras.saving.load_model(tmp_path / "plain.keras")
    assert modes(loaded) == {path.replace("encoderblock_0", "block"): "int8" for path in DENSE[:4]}
    np.testing.assert_allclose(outputs(loaded, tokens), outputs(model, tokens), atol=1e-6)


@pytest.mark.backend_independent
def test_head_dtype_is_the_heads_policy_kept_by_the_file(tmp_path):
    """``head_dtype``: the head's policy, recorded; default the model policy's variable dtype (float32 under a mixed
    policy, bfloat16 under bfloat16); a ``ValueError`` for a name that is no float policy."""
    assert keras_vit.ViT(**TINY, dtype="mixed_bfloat16").get_layer("head").dtype_policy.name == "float32"
    assert keras_vit.ViT(**TINY, dtype="bfloat16").get_layer("head").dtype_policy.name == "bfloat16"
    model = keras_vit.ViT_Ti16(32, patch_size=8, depth=1, num_classes=10, dtype="bfloat16", head_dtype="float32")
    assert model.get_config()["head_dtype"] == "float32"
    model.save(tmp_path / "head.keras")
    loaded = keras.saving.load_model(tmp_path / "head.keras")
    assert {w.dtype for w in loaded.get_layer("head").weights} == {"float32"}
    assert {w.dtype for w in loaded.get_layer("encoderblock_0").weights} == {"bfloat16"}
    assert keras_vit.with_new_head(loaded, 3).get_layer("head").dtype_policy.name == "float32"
    for bad, message in (("float33", "head_dtype must be a Keras dtype policy"), ("int8_from_float32", "quantize")):
        with pytest.raises(ValueError, match=message):
            keras_vit.ViT(**TINY, head_dtype=bad)


@pytest.mark.backends("tensorflow")  # export runs from TensorFlow (other backends: test_export.py's reasons)
def test_predict_and_export_take_a_quantized_keras_file(tmp_path, capsys):
    """``model_from_checkpoint`` (the commands' --weights) loads the file as saved: ``predict`` ranks by the
    quantized logits; a SavedModel export runs them exactly; LiteRT, whose converter has no int8 x int8 matmul, is
    refused saying so (as OpenVINO is, by the same check); the file's weights do not load into another model."""
    model = tiny()
    model.quantize("int8")
    path = tmp_path / "int8.keras"
    model.save(path)
    loaded = keras_vit.model_from_checkpoint(path)
    assert modes(loaded) == modes(model)
    photo = export.photo_images(32, 1)  # the crop below, preprocessed as predict does
    (tmp_path / "classes.txt").write_text("".join(f"class{i}\n" for i in range(10)))
    Image.fromarray(export.photo_crops(1)[0]).save(tmp_path / "photo.png")
    argv = [str(tmp_path / "photo.png"), "--weights", str(path), "--labels", str(tmp_path / "classes.txt"), "--json"]
    assert predict.main([*argv, "--scores", "logits", "--top", "1"]) == 0
    (best,) = json.loads(capsys.readouterr().out)[0]["predictions"]
    logits = outputs(model, photo)[0]
    assert best["name"] == f"class{logits.argmax()}" and best["score"] == pytest.approx(logits.max(), abs=1e-5)
    run = export.load(export.export_saved_model(loaded, tmp_path / "saved_model"))
    np.testing.assert_allclose(run(images()), outputs(model, images()), atol=1e-6)
    with pytest.raises(ValueError, match=r"litert export of a model quantized by Keras \(int8\) does not run"):
        export.export_litert(loaded, tmp_path / "int8.tflite")
    with pytest.raises(ValueError, match="holds a quantized model"):
        keras_vit.ViT(weights=str(path))
    with pytest.raises(ValueError, match=r"loads as saved: leave out \['num_classes'\]"):
        keras_vit.model_from_checkpoint(path, num_classes=3)
