"""Position-embedding resizing: the original's zoom, the class token, models at another image size."""

import keras
import numpy as np
import pytest
import scipy.ndimage

import keras_vit
from keras_vit.position import resample_position_embeddings, resize_grid

TINY = dict(patch_size=8, hidden_size=32, depth=1, num_heads=2, mlp_dim=64, num_classes=3)


def posemb(grid, prefix=1, width=6, seed=0):
    return np.random.default_rng(seed).normal(size=(1, prefix + grid[0] * grid[1], width)).astype("float32")


@pytest.mark.parametrize("old, new", [((14, 14), (24, 24)), ((14, 14), (20, 12)), ((6, 4), (3, 9)), ((7, 7), (4, 4))])
def test_zoom_linear_is_scipy_zoom_order_1_on_the_grid_and_keeps_the_class_token(old, new):
    table = posemb(old)
    out = resample_position_embeddings(table, new, old_grid=old, method="zoom_linear")
    assert out.shape == (1, 1 + new[0] * new[1], 6)
    np.testing.assert_array_equal(out[:, :1], table[:, :1])
    grid = table[0, 1:].reshape(*old, 6)
    expected = scipy.ndimage.zoom(grid, (new[0] / old[0], new[1] / old[1], 1), order=1)
    np.testing.assert_allclose(out[0, 1:], expected.reshape(-1, 6), rtol=0, atol=1e-6)
    # Corner aligned: the four corner embeddings are kept exactly.
    out_grid = out[0, 1:].reshape(*new, 6)
    for (i, j), (k, m) in zip([(0, 0), (0, -1), (-1, 0), (-1, -1)], [(0, 0), (0, -1), (-1, 0), (-1, -1)]):
        np.testing.assert_allclose(out_grid[i, j], grid[k, m], atol=1e-6)


def test_no_prefix_tokens_and_square_default_grid():
    table = posemb((4, 4), prefix=0)
    out = resample_position_embeddings(table, 6, num_prefix_tokens=0)
    assert out.shape == (1, 36, 6)
    np.testing.assert_allclose(out[0, 0], table[0, 0], atol=1e-6)


@pytest.mark.parametrize("method", ["zoom_linear", "bilinear", "bicubic"])
def test_same_size_is_unchanged(method):
    grid = posemb((3, 5))[0, 1:].reshape(3, 5, 6)
    np.testing.assert_array_equal(resize_grid(grid, (3, 5), method), grid)


def test_constant_grid_stays_constant_under_every_method():
    grid = np.full((5, 5, 2), 0.7, dtype="float32")
    for method in ("zoom_linear", "bilinear", "bicubic"):
        np.testing.assert_allclose(resize_grid(grid, (9, 3), method), 0.7, atol=1e-5)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="resize method 'nearest'"):
        resize_grid(np.zeros((2, 2, 1)), (3, 3), "nearest")
    with pytest.raises(ValueError, match="not a square number"):
        resample_position_embeddings(posemb((2, 3)), 4)
    with pytest.raises(ValueError, match=r"old_grid \(3, 3\) does not hold"):
        resample_position_embeddings(posemb((2, 3)), 4, old_grid=3)
    with pytest.raises(ValueError, match="shape"):
        resample_position_embeddings(np.zeros((5, 4)), 4)


def test_resize_position_embeddings_returns_a_model_at_the_new_size_with_the_same_weights():
    model = keras_vit.ViT(None, image_size=32, **TINY)
    resized = keras_vit.resize_position_embeddings(model, (48, 24))
    assert resized is not model and resized.name == model.name
    assert resized.input_shape == (None, 48, 24, 3) and resized.output_shape == (None, 3)
    assert resized.get_layer("posembed_input").grid_size == (6, 3)
    for old, new in zip(model.weights, resized.weights):
        assert old.path == new.path
        if old.path == "posembed_input/pos_embedding":
            expected = resample_position_embeddings(old.numpy(), (6, 3), old_grid=(4, 4))
            np.testing.assert_allclose(new.numpy(), expected, atol=1e-6)
        else:
            np.testing.assert_array_equal(new.numpy(), old.numpy())
    # Same config apart from the image size.
    configs = [{layer.name: layer.get_config() for layer in m.layers} for m in (model, resized)]
    changed = {name for name in configs[0] if configs[0][name] != configs[1][name]}
    assert changed == {"images", "posembed_input"}
    images = np.random.default_rng(0).uniform(-1, 1, (2, 48, 24, 3)).astype("float32")
    assert np.isfinite(resized.predict(images, verbose=0)).all()


def test_resize_with_a_method_by_name_and_back_to_the_same_size():
    model = keras_vit.ViT(None, image_size=32, **TINY)
    same = keras_vit.resize_position_embeddings(model, 32, method="bicubic")
    images = np.random.default_rng(1).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    np.testing.assert_allclose(same.predict(images, verbose=0), model.predict(images, verbose=0), atol=1e-6)
    bilinear = keras_vit.resize_position_embeddings(model, 64, method="bilinear")
    expected = resample_position_embeddings(
        model.get_layer("posembed_input").pos_embedding.numpy(), 8, method="bilinear"
    )
    np.testing.assert_allclose(bilinear.get_layer("posembed_input").pos_embedding.numpy(), expected, atol=1e-6)


def test_resize_position_embeddings_rejects_bad_sizes():
    model = keras_vit.ViT(None, image_size=32, **TINY)
    with pytest.raises(ValueError, match="not a multiple of the model's stride 8x8"):
        keras_vit.resize_position_embeddings(model, 36)
    with pytest.raises(ValueError, match="resize method"):
        keras_vit.resize_position_embeddings(model, 64, method="area")
    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match=r"one \(batch, h, w, c\) input"):
        keras_vit.resize_position_embeddings(plain, 64)
    conv = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(2, 3)])
    with pytest.raises(ValueError, match="no layer with a patch grid"):
        keras_vit.resize_position_embeddings(conv, 64)


def test_a_model_without_position_embeddings_only_changes_its_input():
    model = keras_vit.ViT(None, image_size=32, position_embedding="none", **TINY)
    resized = keras_vit.resize_position_embeddings(model, 64)
    assert resized.input_shape == (None, 64, 64, 3)
    for old, new in zip(model.weights, resized.weights):
        np.testing.assert_array_equal(new.numpy(), old.numpy())
