"""Dynamic image size: one model for any multiple of the patch size, its position embeddings interpolated in
the graph exactly as loading at a fixed size resizes them (``zoom_linear``, corner aligned)."""

import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy  # any backend's tensor (torch's track gradients)

import keras_vit
from keras_vit.position import DynamicPositionEmbs, resample_position_embeddings

ARCH = dict(patch_size=8, hidden_size=32, depth=2, num_heads=2, mlp_dim=64)


def random_weights(model, seed=0):
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        variable.assign(rng.normal(0, 0.2, variable.shape))
    return model


def images(height, width, seed=1):
    return np.random.default_rng(seed).uniform(-1, 1, (2, height, width, 3)).astype("float32")


@pytest.fixture(scope="module")
def models():
    fixed = random_weights(keras_vit.ViT(None, image_size=32, num_classes=5, **ARCH))
    dynamic = keras_vit.ViT(None, image_size=32, num_classes=5, dynamic_image_size=True, **ARCH)
    dynamic.set_weights(fixed.get_weights())
    return fixed, dynamic


def test_input_is_any_size(models):
    assert models[1].input_shape == (None, None, None, 3)


@pytest.mark.parametrize("size", [(32, 32), (48, 48), (24, 56), (64, 16)])
def test_equals_the_resized_fixed_model(models, size):
    fixed, dynamic = models
    resized = keras_vit.resize_position_embeddings(fixed, size)  # zoom_linear, as weights= loading does
    x = images(*size)
    np.testing.assert_allclose(to_numpy(dynamic(x)), to_numpy(resized(x)), atol=1e-5, rtol=0)


@pytest.mark.parametrize("method", ["zoom_linear", "bilinear", "bicubic"])
def test_in_graph_resize_matches_resample(method):
    layer = DynamicPositionEmbs((4, 4), num_prefix_tokens=1, stride=8, method=method)
    layer.build((None, 17, 6))
    posemb = np.random.default_rng(0).normal(size=(1, 17, 6)).astype("float32")
    layer.pos_embedding.assign(posemb)
    tokens = np.zeros((1, 1 + 6 * 3, 6), "float32")
    got = layer(tokens, np.zeros((1, 48, 24, 3), "float32"))
    want = resample_position_embeddings(posemb, (6, 3), old_grid=(4, 4), method=method)
    np.testing.assert_allclose(to_numpy(got), to_numpy(want), atol=1e-5, rtol=0)


def test_saves_and_reloads_as_keras(models, tmp_path):
    dynamic = models[1]
    dynamic.save(tmp_path / "dynamic.keras")
    again = keras.saving.load_model(tmp_path / "dynamic.keras")
    for size in ((32, 32), (40, 24)):
        np.testing.assert_allclose(to_numpy(again(images(*size))), to_numpy(dynamic(images(*size))), atol=1e-6)


def test_other_position_kinds_are_named():
    with pytest.raises(NotImplementedError, match="learned_2d"):
        keras_vit.ViT(None, image_size=32, position_embedding="learned_2d", dynamic_image_size=True, **ARCH)
