"""Position-embedding similarity and embedding-filter PCA on embeddings built from known patterns."""

import itertools

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.analysis import embeddings

# numpy on arrays and on weights read from a model: the same on every backend
pytestmark = pytest.mark.backend_independent

TINY = dict(image_size=24, patch_size=8, hidden_size=32, depth=1, num_heads=2, mlp_dim=64, include_top=False)


def row_column_code(gh, gw, prefix_rows=()):
    """Patch (i, j) -> one-hot(i) concatenated with one-hot(j), after the given prefix rows."""
    rows = [np.concatenate([np.eye(gh)[i], np.eye(gw)[j]]) for i, j in itertools.product(range(gh), range(gw))]
    return np.stack([*prefix_rows, *rows])


def expected_row_column_similarity(gh, gw):
    """cos((i, j), (k, l)) = ([i == k] + [j == l]) / 2 for the row-column code, by loops."""
    out = np.zeros((gh, gw, gh, gw))
    for i, j, k, m in itertools.product(range(gh), range(gw), range(gh), range(gw)):
        out[i, j, k, m] = ((i == k) + (j == m)) / 2
    return out


def test_position_similarity_of_a_row_column_code():
    code = row_column_code(3, 4, prefix_rows=[np.full(7, 5.0)])
    similarity = embeddings.position_similarity(code[None], (3, 4), num_prefix_tokens=1)
    np.testing.assert_allclose(similarity, expected_row_column_similarity(3, 4), atol=1e-12)


def test_position_similarity_is_scale_invariant_and_orthogonal_codes_give_identity():
    similarity = embeddings.position_similarity(np.diag(np.arange(1.0, 7.0)), (2, 3))
    np.testing.assert_allclose(similarity.reshape(6, 6), np.eye(6), atol=1e-12)


def test_model_position_similarity_reads_the_posembed_input_layer():
    model = keras_vit.ViT("Ti/16", **TINY)
    layer = model.get_layer("posembed_input")
    code = row_column_code(3, 3, prefix_rows=[np.ones(6)])
    layer.pos_embedding.assign(np.pad(code, ((0, 0), (0, 26)))[None].astype("float32"))
    expected = expected_row_column_similarity(3, 3)
    np.testing.assert_allclose(embeddings.model_position_similarity(model), expected, atol=1e-6)


def test_model_position_similarity_of_learned_2d_embeddings_set_to_one_hot_rows_and_columns():
    model = keras_vit.ViT("Ti/16", position_embedding="learned_2d", **TINY)
    layer = model.get_layer("posembed_input")
    layer.row_embedding.assign(np.eye(3, 16, dtype="float32"))
    layer.col_embedding.assign(np.eye(3, 16, dtype="float32"))
    expected = expected_row_column_similarity(3, 3)
    np.testing.assert_allclose(embeddings.model_position_similarity(model), expected, atol=1e-6)


def test_position_similarity_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="1 prefix \\+ 2x2 patch"):
        embeddings.position_similarity(np.ones((4, 3)), 2, num_prefix_tokens=1)
    with pytest.raises(ValueError, match="all zeros"):
        embeddings.position_similarity(np.zeros((4, 3)), 2)


def planted_kernel(seed=0, patch=4, channels=3, filters=200):
    """Filters = mean + 3 * a * c1 + 1 * b * c2 + tiny noise, c1 and c2 orthonormal."""
    rng = np.random.default_rng(seed)
    size = patch * patch * channels
    basis, _ = np.linalg.qr(rng.normal(size=(size, 2)))
    c1, c2 = basis.T
    a, b = rng.normal(size=(2, filters))
    a = (a - a.mean()) / a.std()
    b = b - b.mean() - (b @ a) / (a @ a) * a  # centred and uncorrelated with a: variances exactly 9 and 1
    b = b / b.std()
    flat = rng.normal(size=size) + np.outer(3 * a, c1) + np.outer(b, c2) + 1e-6 * rng.normal(size=(filters, size))
    return flat.T.reshape(patch, patch, channels, filters), c1, c2


def test_filter_components_recover_planted_directions_and_variances():
    kernel, c1, c2 = planted_kernel()
    components, ratio = embeddings.filter_components(kernel, num_components=2)
    assert components.shape == (2, 4, 4, 3)
    np.testing.assert_allclose(np.abs(components.reshape(2, -1) @ np.stack([c1, c2]).T), np.eye(2), atol=1e-6)
    np.testing.assert_allclose(ratio, [0.9, 0.1], atol=1e-6)  # variances 9 : 1
    flat = components.reshape(2, -1)
    assert np.all(flat[np.arange(2), np.abs(flat).argmax(1)] > 0)  # sign convention


@pytest.mark.parametrize("seed, k", [(1, 5), (2, 11), (3, 1)])
def test_filter_components_equal_the_svd_of_the_centred_filters_signed_by_their_peak(seed, k):
    kernel = np.random.default_rng(seed).normal(size=(2, 2, 3, 40)) * np.arange(1, 13).reshape(2, 2, 3, 1)
    filters = kernel.reshape(-1, 40).T
    _, singular, axes = np.linalg.svd(filters - filters.mean(axis=0), full_matrices=False)
    axes = axes[:k] * np.sign(axes[np.arange(k), np.abs(axes[:k]).argmax(axis=1)])[:, None]
    components, ratio = embeddings.filter_components(kernel, num_components=k)
    np.testing.assert_allclose(components.reshape(k, -1), axes, atol=1e-12)
    np.testing.assert_allclose(ratio, singular[:k] ** 2 / np.sum(singular**2), rtol=1e-12)


@pytest.mark.filterwarnings("error")
def test_filter_components_of_identical_filters_explain_nothing():
    components, ratio = embeddings.filter_components(np.ones((2, 2, 3, 8)), num_components=3)
    assert components.shape == (3, 2, 2, 3)
    np.testing.assert_array_equal(ratio, 0.0)


def test_model_filter_components_and_rgb_tiles():
    model = keras_vit.ViT("Ti/16", **TINY)
    kernel, _, _ = planted_kernel(patch=8, filters=32)
    model.get_layer("embedding").kernel.assign(kernel.astype("float32"))
    components, ratio = embeddings.model_filter_components(model, num_components=4)
    np.testing.assert_allclose(ratio[:2], [0.9, 0.1], atol=1e-4)
    tiles = embeddings.to_rgb_tiles(components)
    assert tiles.shape == (4, 8, 8, 3)
    np.testing.assert_allclose(tiles.min(axis=(1, 2, 3)), 0.0)
    np.testing.assert_allclose(tiles.max(axis=(1, 2, 3)), 1.0)
    grey = embeddings.to_rgb_tiles(components[..., :1])
    assert grey.shape == (4, 8, 8, 3) and np.array_equal(grey[..., 0], grey[..., 2])


def test_filter_components_reject_bad_input():
    with pytest.raises(ValueError, match=r"num_components must be in \[1, 9\]"):
        embeddings.filter_components(np.ones((2, 2, 3, 10)), num_components=10)
    with pytest.raises(ValueError, match="P, P, channels, filters"):
        embeddings.filter_components(np.ones((4, 3, 10)))
    with pytest.raises(ValueError, match="hybrid"):
        embeddings.to_rgb_tiles(np.ones((2, 1, 1, 64)))
    with pytest.raises(ValueError, match="has no layer 'embedding' \\(a PatchEmbed\\)"):
        embeddings.model_filter_components(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]))
    with pytest.raises(ValueError, match="no absolute position embeddings"):
        embeddings.model_position_similarity(keras_vit.ViT("Ti/16", position_embedding="relative", **TINY))
