"""LoRA: only the adapters and the head train; merging gives a plain model with the same outputs."""

import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy  # any backend's tensor (torch's track gradients)

import keras_vit
from keras_vit.lora import lora_layers

ARCH = dict(patch_size=8, hidden_size=32, depth=2, num_heads=2, mlp_dim=64)
RANK = 4


def images(seed=1):
    return np.random.default_rng(seed).uniform(-1, 1, (16, 32, 32, 3)).astype("float32")


@pytest.fixture
def adapted():
    model = keras_vit.ViT(None, image_size=32, num_classes=3, **ARCH)
    return keras_vit.enable_lora(model, RANK)


@pytest.mark.backends("tensorflow")  # backend-independent
def test_parameter_count(adapted):
    d, m = ARCH["hidden_size"], ARCH["mlp_dim"]
    per_block = RANK * ((d + 3 * d) + (d + d) + (d + m) + (m + d))  # qkv, out, fc1, fc2: rank * (in + out)
    assert keras_vit.lora_parameter_count(adapted) == ARCH["depth"] * per_block
    head = d * 3 + 3
    assert sum(int(np.prod(v.shape)) for v in adapted.trainable_weights) == ARCH["depth"] * per_block + head


def test_fit_trains_only_adapters_and_head(adapted, tmp_path):
    frozen = {v.path: np.array(v).copy() for v in adapted.weights if not v.trainable}
    trained = {v.path: np.array(v).copy() for v in adapted.trainable_weights}
    assert all("lora_kernel" in path or path.startswith("head/") for path in trained)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    adapted.compile(optimizer=keras.optimizers.Adam(1e-2), loss=loss)
    labels = np.arange(16) % 3
    adapted.fit(images(), labels, epochs=2, batch_size=8, verbose=0)
    for v in adapted.weights:
        if v.path in frozen:
            np.testing.assert_array_equal(np.array(v), frozen[v.path], err_msg=v.path)
    changed = [path for path, before in trained.items() if "lora_kernel_b" in path or path.startswith("head/")]
    current = {v.path: np.array(v) for v in adapted.weights}
    unchanged = [path for path in changed if np.array_equal(current[path], trained[path])]
    assert not unchanged

    merged = keras_vit.merge_lora(adapted)
    assert keras_vit.lora_parameter_count(merged) == 0
    np.testing.assert_allclose(to_numpy(merged(images(2))), to_numpy(adapted(images(2))), atol=1e-5)
    adapted.save(tmp_path / "adapted.keras")  # Keras saves the merged kernels
    reloaded = keras.saving.load_model(tmp_path / "adapted.keras")
    np.testing.assert_allclose(to_numpy(reloaded(images(2))), to_numpy(adapted(images(2))), atol=1e-5)


def test_enable_twice_only_refreezes(adapted):
    before = keras_vit.lora_parameter_count(adapted)
    keras_vit.enable_lora(adapted, RANK)
    assert keras_vit.lora_parameter_count(adapted) == before
    assert all(layer.lora_enabled for layer in lora_layers(adapted))


def test_bad_arguments():
    model = keras_vit.ViT(None, image_size=32, num_classes=3, **ARCH)
    with pytest.raises(ValueError, match="rank"):
        keras_vit.enable_lora(model, 0)
    with pytest.raises(ValueError, match="targets"):
        keras_vit.enable_lora(model, 2, targets=("mlp",))
    with pytest.raises(ValueError, match=r"no layers named \['classifier'\]"):
        keras_vit.enable_lora(model, 2, trainable_layers=("classifier",))
    assert keras_vit.lora_parameter_count(model) == 0  # a refused call leaves the model as it was
    assert all(v.trainable for v in model.weights)


def test_predict_after_enabling_runs_the_adapters():
    """``predict_on_batch`` traced before ``enable_lora`` must not keep running the graph without the adapters."""
    model = keras_vit.ViT(None, image_size=32, num_classes=3, **ARCH)
    head = model.get_layer("head")
    head.kernel.assign(np.random.default_rng(0).normal(0, 0.1, head.kernel.shape))
    before = np.asarray(model.predict_on_batch(images()))
    keras_vit.enable_lora(model, RANK)
    for layer in lora_layers(model):
        layer.lora_kernel_b.assign(np.random.default_rng(1).normal(0, 0.05, layer.lora_kernel_b.shape))
    after = np.asarray(model.predict_on_batch(images()))
    np.testing.assert_allclose(after, to_numpy(model(images())), atol=1e-5)
    assert np.abs(after - before).max() > 0.01
