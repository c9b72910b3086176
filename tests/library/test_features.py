"""feature_model: chosen blocks' tokens or (B, h, w, D) patch maps, sharing the model's weights."""

import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy  # any backend's tensor (torch's track gradients)

import keras_vit

ARCH = dict(patch_size=8, hidden_size=32, depth=3, num_heads=2, mlp_dim=64)


@pytest.fixture(scope="module")
def model():
    model = keras_vit.ViT(None, image_size=(32, 48), num_classes=5, **ARCH)
    rng = np.random.default_rng(0)
    for variable in model.weights:
        variable.assign(rng.normal(0, 0.2, variable.shape))
    return model


def images(height=32, width=48):
    return np.random.default_rng(1).uniform(-1, 1, (2, height, width, 3)).astype("float32")


def block_outputs(model, x):
    """Every block's tokens, computed by running the model's own layers one by one."""
    tokens = keras.Model(model.input, model.get_layer("posembed_dropout").output)(x)
    outputs = []
    for i in range(ARCH["depth"]):
        tokens = model.get_layer(f"encoderblock_{i}")(tokens)
        outputs.append(keras.ops.convert_to_numpy(tokens))
    return outputs


def test_maps_have_the_patch_grid_shape_and_equal_the_tokens(model):
    features = keras_vit.feature_model(model, blocks=(0, -2, -1))
    maps = features(images())
    want = block_outputs(model, images())
    assert [tuple(m.shape) for m in maps] == [(2, 4, 6, 32)] * 3
    for got, tokens in zip(maps, want):
        np.testing.assert_allclose(to_numpy(got), tokens[:, 1:].reshape(2, 4, 6, 32), atol=1e-6)


def test_tokens_default_last_block_and_norm(model):
    tokens = keras_vit.feature_model(model, spatial=False)(images())
    np.testing.assert_allclose(to_numpy(tokens), block_outputs(model, images())[-1], atol=1e-6)
    normed = keras_vit.feature_model(model, blocks=-1, spatial=False, norm=True)
    top = keras_vit.ViT(None, image_size=(32, 48), include_top=False, **ARCH)
    top.set_weights(model.get_weights()[:-2])  # all but the head
    np.testing.assert_allclose(to_numpy(normed(images())), to_numpy(top(images())), atol=1e-6)


def test_shares_the_weights(model):
    features = keras_vit.feature_model(model, blocks=1)
    assert {id(v) for v in features.weights} <= {id(v) for v in model.weights}


def test_dynamic_model_maps_follow_the_image():
    model = keras_vit.ViT(None, image_size=32, dynamic_image_size=True, **ARCH)
    features = keras_vit.feature_model(model, blocks=-1)
    assert tuple(features(images(40, 64)).shape) == (2, 5, 8, 32)


def test_maps_of_a_model_with_preprocessing_are_on_the_preprocessed_grid():
    model = keras_vit.ViT(None, image_size=32, include_preprocessing=True, **{**ARCH, "depth": 1})
    assert tuple(keras_vit.feature_model(model)(images(50, 70)).shape) == (2, 4, 4, 32)  # 32x32 once resized


def test_bad_block_index(model):
    with pytest.raises(IndexError, match="3 blocks"):
        keras_vit.feature_model(model, blocks=3)
