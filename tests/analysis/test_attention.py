"""Attention rollout and mean attention distance on hand-made attention with known answers."""

import itertools
import math

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.analysis import TokenGeometry, attention, token_geometry

# rollout and distance are numpy on arrays; the tests that run a model are marked for the backends below
pytestmark = pytest.mark.backend_independent

TINY = dict(image_size=32, patch_size=8, hidden_size=32, depth=2, num_heads=2, mlp_dim=64, include_top=False)


def stochastic(rng, *shape):
    """Random attention probabilities: positive, rows summing to 1."""
    a = rng.uniform(0.01, 1.0, shape)
    return a / a.sum(axis=-1, keepdims=True)


def uniform_attention(blocks, batch, heads, tokens):
    return [np.full((batch, heads, tokens, tokens), 1.0 / tokens) for _ in range(blocks)]


@pytest.mark.parametrize("residual", [True, False])
def test_rollout_of_identity_attention_is_identity(residual):
    eye = np.broadcast_to(np.eye(5), (2, 3, 5, 5))
    rollout = attention.attention_rollout([eye] * 4, residual=residual)
    np.testing.assert_array_equal(rollout, np.broadcast_to(np.eye(5), (2, 5, 5)))


def test_rollout_averages_heads_adds_residual_and_multiplies_first_block_last():
    rng = np.random.default_rng(0)
    a1, a2 = stochastic(rng, 1, 2, 4, 4), stochastic(rng, 1, 2, 4, 4)
    m1 = 0.5 * (a1[0, 0] + a1[0, 1]) / 2 + 0.5 * np.eye(4)
    m2 = 0.5 * (a2[0, 0] + a2[0, 1]) / 2 + 0.5 * np.eye(4)
    rollout = attention.attention_rollout([a1, a2])
    np.testing.assert_allclose(rollout[0], m2 @ m1, atol=1e-12)
    assert not np.allclose(m2 @ m1, m1 @ m2)  # the order is really tested
    np.testing.assert_allclose(rollout.sum(axis=-1), 1.0, atol=1e-12)
    np.testing.assert_allclose(attention.attention_rollout([a1, a2], residual=False)[0], a2[0].mean(0) @ a1[0].mean(0))
    np.testing.assert_allclose(attention.attention_rollout([a1], head_fusion="max")[0].sum(-1), 1.0)


def test_rollout_map_of_class_token_attending_to_one_patch():
    grid, blocks, target = (2, 3), 3, 4  # patch 4 = row 1, col 1
    a = np.broadcast_to(np.eye(7), (1, 2, 7, 7)).copy()
    a[:, :, 0] = 0.0
    a[:, :, 0, 1 + target] = 1.0
    grid_map = attention.rollout_map(attention.attention_rollout([a] * blocks), grid, num_prefix_tokens=1)
    expected = np.zeros(grid)
    expected[1, 1] = 1 - 0.5**blocks  # the rest stays on the class token itself
    np.testing.assert_allclose(grid_map[0], expected, atol=1e-12)


def test_rollout_map_without_class_token_averages_all_outputs():
    rollout = np.arange(16, dtype=float).reshape(1, 4, 4)
    np.testing.assert_allclose(attention.rollout_map(rollout, 2, num_prefix_tokens=0)[0], [[6, 7], [8, 9]])


def test_overlay_weights_the_image_by_the_upsampled_map():
    image = np.full((16, 24, 3), 0.8)
    grid_map = np.zeros((2, 3))
    grid_map[1, 2] = 2.0
    out = attention.overlay(image, grid_map)
    assert out.shape == image.shape
    assert np.all(out <= image + 1e-6) and np.all(out >= 0)
    np.testing.assert_allclose(out[12, 20], 0.8, rtol=1e-5)  # the centre of the attended patch keeps its pixel
    np.testing.assert_allclose(out[2, 2], 0.0, atol=1e-6)  # far from it: dark
    np.testing.assert_array_equal(attention.overlay(image, np.zeros((2, 3))), 0.0)


def test_patch_distances_are_pixel_distances_between_centres():
    d = attention.patch_distances((2, 3), (8, 16))
    assert d.shape == (6, 6)
    assert d[0, 1] == 16 and d[0, 3] == 8 and d[0, 2] == 32
    assert d[0, 5] == pytest.approx(math.hypot(8, 32))
    np.testing.assert_array_equal(np.diag(d), 0.0)


@pytest.mark.parametrize("prefix", [0, 1])
def test_uniform_attention_gives_the_mean_pairwise_patch_distance(prefix):
    (gh, gw), patch = (3, 4), 16
    cells = list(itertools.product(range(gh), range(gw)))
    brute = np.mean([math.dist(p, q) * patch for p in cells for q in cells])
    attn = uniform_attention(blocks=2, batch=2, heads=3, tokens=prefix + gh * gw)
    result = attention.mean_attention_distance(attn, (gh, gw), patch, num_prefix_tokens=prefix)
    assert result.shape == (2, 3)
    np.testing.assert_allclose(result, brute, rtol=1e-12)


def test_attention_to_self_gives_zero_distance_whatever_goes_to_the_class_token():
    a = np.zeros((2, 2, 10, 10))
    a[:, :, 0, :] = 0.1  # the class token's own row does not count
    a[:, :, np.arange(1, 10), np.arange(1, 10)] = 0.3
    a[:, :, 1:, 0] = 0.7
    np.testing.assert_array_equal(attention.mean_attention_distance([a], 3, 16), 0.0)


def test_weight_on_the_class_token_is_renormalised_away():
    grid, patch = (2, 4), (8, 12)
    n = grid[0] * grid[1]
    a = np.zeros((1, 1, n + 1, n + 1))
    a[..., 1:, 0] = 0.5
    for q in range(n):
        row, col = divmod(q, grid[1])
        neighbour = row * grid[1] + (col + 1 if col + 1 < grid[1] else col - 1)
        a[0, 0, 1 + q, 1 + q] = 0.25
        a[0, 0, 1 + q, 1 + neighbour] = 0.25
    # half the patch weight sits 12 px away (one patch across); without renormalising it would be 3 px
    np.testing.assert_allclose(attention.mean_attention_distance([a], grid, patch), [[6.0]])


def test_bad_attention_input_is_rejected_with_the_shape():
    with pytest.raises(ValueError, match="batch, heads, N, N"):
        attention.attention_rollout([np.ones((2, 5, 5))])
    with pytest.raises(ValueError, match="at least one block"):
        attention.attention_rollout([])
    with pytest.raises(ValueError, match="17 tokens does not match 1 prefix"):
        attention.mean_attention_distance(uniform_attention(1, 1, 1, 17), (3, 3), 8)
    with pytest.raises(ValueError, match="head_fusion"):
        attention.attention_rollout(uniform_attention(1, 1, 1, 4), head_fusion="median")


@pytest.mark.parametrize(
    "classifier",
    ["token", pytest.param("gap", marks=pytest.mark.backends("tensorflow"))],  # one probe for both
)
@pytest.mark.backends("tensorflow", "jax")
def test_analyse_attention_on_a_model_matches_the_array_functions(classifier):
    model = keras_vit.ViT("Ti/16", classifier=classifier, **TINY)
    images = np.random.default_rng(0).uniform(-1, 1, (3, 32, 32, 3)).astype("float32")
    found = attention.analyse_attention(model, images, batch_size=2)
    blocks = [keras.ops.convert_to_numpy(a) for a in keras_vit.attention_model(model)(images)]
    prefix = int(classifier == "token")
    assert found.maps.shape == (3, 4, 4) and found.distances.shape == (2, 2)
    expected_maps = attention.rollout_map(attention.attention_rollout(blocks), 4, prefix)
    np.testing.assert_allclose(found.maps, expected_maps, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(found.distances, attention.mean_attention_distance(blocks, 4, 8, prefix), rtol=1e-4)
    # an untrained model attends almost uniformly: close to the mean pairwise distance of a 4x4 grid
    uniform = attention.mean_attention_distance(uniform_attention(1, 1, 1, 16 + prefix), 4, 8, prefix)
    np.testing.assert_allclose(found.distances, uniform[0, 0], rtol=0.2)


@pytest.mark.backends("tensorflow")  # backend-independent
def test_hybrid_patches_are_measured_in_input_pixels():
    model = keras_vit.ViT("Ti/16", resnet=(1, 1), **{**TINY, "image_size": 64, "patch_size": 2, "depth": 1})
    geometry = token_geometry(model)
    assert geometry == TokenGeometry((4, 4), (16, 16), 1)  # ResNet stride 8 x embedding patch 2
    images = np.random.default_rng(0).uniform(-1, 1, (2, 64, 64, 3)).astype("float32")
    found = attention.analyse_attention(model, images)
    uniform = attention.mean_attention_distance(uniform_attention(1, 1, 1, 17), 4, 16)
    assert found.maps.shape == (2, 4, 4)
    np.testing.assert_allclose(found.distances, uniform[0, 0], rtol=0.2)


@pytest.mark.backends("tensorflow")  # backend-independent
def test_a_channels_first_model_takes_its_own_images_and_a_padding_model_measures_whole_patches():
    last = keras_vit.ViT("Ti/16", **{**TINY, "depth": 1})
    first = keras_vit.ViT("Ti/16", data_format="channels_first", **{**TINY, "depth": 1})
    first.set_weights(last.get_weights())
    assert token_geometry(first) == token_geometry(last) == TokenGeometry((4, 4), (8, 8), 1)
    images = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    found = attention.analyse_attention(first, images.transpose(0, 3, 1, 2))
    np.testing.assert_allclose(found.maps, attention.analyse_attention(last, images).maps, atol=1e-6)
    padded = keras_vit.ViT("Ti/16", dynamic_img_pad=True, **{**TINY, "image_size": (27, 30), "depth": 1})
    assert token_geometry(padded) == TokenGeometry((4, 4), (8, 8), 1)  # 27x30 padded to 32x32
