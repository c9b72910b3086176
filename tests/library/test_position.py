"""Position-embedding variants (keras_vit.position): shapes, save/load, structure, resizing, bad input; dynamic
image size: one model for any multiple of the patch size, its position embeddings interpolated in the graph exactly
as loading at a fixed size resizes them (``zoom_linear``, corner aligned)."""

import os

import keras
import numpy as np
import pytest
import scipy.ndimage
from keras.ops import convert_to_numpy as to_numpy  # any backend's tensor (torch's track gradients)

import keras_vit
from keras_vit.layers import MultiHeadSelfAttention
from keras_vit.position import (
    POSITION_EMBEDDINGS,
    AddPositionEmbs2D,
    DynamicPositionEmbs,
    RelativePositionBias,
    RelativeTransformerBlock,
    SinCosPositionEmbs,
    relative_position_index,
    resample_position_embeddings,
    resize_grid,
    sincos_2d_embedding,
)

TINY = dict(patch_size=8, depth=1, hidden_size=32, num_heads=2, mlp_dim=64, num_classes=5)


def tiny(position_embedding: str, image_size: int = 32, **kwargs) -> keras.Model:
    return keras_vit.ViT("Ti/16", image_size=image_size, position_embedding=position_embedding, **{**TINY, **kwargs})


def randomise(model: keras.Model, seed: int = 0) -> None:
    """Give every variable random values (zero-initialised heads and tokens would hide differences)."""
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        variable.assign(rng.normal(0.0, 0.2, variable.shape).astype("float32"))


def images(n: int = 2, size: int = 32, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, (n, size, size, 3)).astype("float32")


@pytest.mark.parametrize(
    "position_embedding, classifier",
    [(p, "token") for p in POSITION_EMBEDDINGS] + [(p, "gap") for p in ("learned_2d", "sincos_2d", "relative")],
)
def test_every_variant_has_the_right_shape_and_saves_bit_identically(position_embedding, classifier, tmp_path):
    model = tiny(position_embedding, classifier=classifier)
    randomise(model)
    x = images()
    out = keras.ops.convert_to_numpy(model(x))
    assert out.shape == (2, 5)
    path = os.path.join(tmp_path, "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(loaded(x)), out)
    assert [w.path for w in loaded.weights] == [w.path for w in model.weights]


@pytest.mark.backends("tensorflow")  # backend-independent
def test_parameter_counts_of_the_variants():
    """D=32, a 4x4 grid, class token, 2 blocks of 2 heads: each variant's position parameters exactly."""
    counts = {p: tiny(p, depth=2).count_params() for p in POSITION_EMBEDDINGS}
    base = counts["none"]
    assert counts["sincos_2d"] == base  # fixed, no weights
    assert counts["learned_1d"] - base == (1 + 16) * 32
    assert counts["learned_2d"] - base == 4 * 16 + 4 * 16 + 32  # rows, columns (D/2 each), class token
    assert counts["relative"] - base == 2 * (7 * 7 * 2 + 3 * 2)  # per block: (2*4-1)^2 offsets x heads + 3 x heads


def test_learned_2d_embedding_is_row_concat_column():
    layer = AddPositionEmbs2D((3, 4), num_prefix_tokens=1)
    layer.build((None, 13, 6))
    rng = np.random.default_rng(0)
    rows, cols, cls = rng.normal(size=(3, 3)), rng.normal(size=(4, 3)), rng.normal(size=(1, 1, 6))
    layer.row_embedding.assign(rows)
    layer.col_embedding.assign(cols)
    layer.prefix_embedding.assign(cls)
    embedding = keras.ops.convert_to_numpy(layer.pos_embedding)[0]
    np.testing.assert_allclose(embedding[0], cls[0, 0], rtol=1e-6)
    for i in range(3):
        for j in range(4):
            np.testing.assert_allclose(embedding[1 + i * 4 + j], np.concatenate([rows[i], cols[j]]), rtol=1e-6)
    # and it is what the layer adds
    added = keras.ops.convert_to_numpy(layer(np.zeros((2, 13, 6), "float32")))
    np.testing.assert_allclose(added, np.broadcast_to(embedding, (2, 13, 6)), rtol=1e-6)


def test_sincos_embedding_is_fixed_and_follows_the_formula():
    model = tiny("sincos_2d")
    layer = model.get_layer("posembed_input")
    assert isinstance(layer, SinCosPositionEmbs) and layer.weights == []
    embedding = keras.ops.convert_to_numpy(layer.pos_embedding)[0]
    np.testing.assert_array_equal(embedding[0], 0.0)  # class token: zeros
    # patch (y=2, x=3) of the 4x4 grid, width 32: quarter = 8, w_k = 10000 ** (-k / 8)
    k = np.arange(8)
    w = 10000.0 ** (-k / 8)
    expected = np.concatenate([np.sin(2 * w), np.cos(2 * w), np.sin(3 * w), np.cos(3 * w)])
    np.testing.assert_allclose(embedding[1 + 2 * 4 + 3], expected, rtol=1e-6, atol=1e-7)


def test_relative_bias_depends_only_on_the_offset():
    layer = RelativePositionBias(num_heads=3, grid_size=(3, 4), num_prefix_tokens=1)
    layer.build((None, 13, 8))
    rng = np.random.default_rng(0)
    table, prefix = rng.normal(size=(5, 7, 3)), rng.normal(size=(3, 3))
    layer.relative_table.assign(table)
    layer.prefix_bias.assign(prefix)
    bias = keras.ops.convert_to_numpy(layer(np.zeros((1, 13, 8), "float32")))
    assert bias.shape == (1, 3, 13, 13)

    def token(y, x):
        return 1 + y * 4 + x

    # two query/key pairs with the same offset (dy, dx) = (-1, -2) get the same bias, the table's entry
    first, second = bias[0, :, token(0, 0), token(1, 2)], bias[0, :, token(1, 1), token(2, 3)]
    np.testing.assert_array_equal(first, second)
    np.testing.assert_allclose(first, table[-1 + 2, -2 + 3], rtol=1e-6)
    # every patch pair reads the entry of its offset; another offset reads another entry
    for qy, qx, ky, kx in np.ndindex(3, 4, 3, 4):
        np.testing.assert_allclose(bias[0, :, token(qy, qx), token(ky, kx)], table[qy - ky + 2, qx - kx + 3], rtol=1e-6)
    # class-token rows and columns: a learned per-head bias each
    np.testing.assert_allclose(bias[0, :, 0, 5], prefix[0], rtol=1e-6)
    np.testing.assert_allclose(bias[0, :, 5, 0], prefix[1], rtol=1e-6)
    np.testing.assert_allclose(bias[0, :, 0, 0], prefix[2], rtol=1e-6)


def test_relative_index_without_prefix_tokens_covers_only_the_table():
    index = relative_position_index((2, 3), num_prefix_tokens=0)
    assert index.shape == (6, 6) and index.max() < 3 * 5
    assert np.all(np.diag(index) == (2 - 1) * 5 + (3 - 1))  # offset (0, 0) is the table's centre


def test_attention_bias_is_added_to_the_logits_on_both_paths():
    layer = MultiHeadSelfAttention(num_heads=2)
    x = np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32")
    bias = np.random.default_rng(1).normal(size=(1, 2, 5, 5)).astype("float32") * 3
    fast = keras.ops.convert_to_numpy(layer(x, attention_bias=bias))
    slow, probs = layer(x, attention_bias=bias, return_attention_scores=True)
    np.testing.assert_allclose(fast, keras.ops.convert_to_numpy(slow), atol=1e-5)
    q, k, _ = np.split(keras.ops.convert_to_numpy(layer.qkv(x)).reshape(2, 5, 3, 2, 4), 3, axis=2)
    logits = np.einsum("bqhd,bkhd->bhqk", q[:, :, 0], k[:, :, 0]) / 2.0 + bias
    expected = np.exp(logits - logits.max(-1, keepdims=True))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(probs), expected / expected.sum(-1, keepdims=True), atol=1e-5)


def test_relative_bias_steers_attention():
    """A large bias at offset (0, 0) makes every patch attend to itself."""
    model = tiny("relative", depth=2)
    block = model.get_layer("encoderblock_0")
    assert isinstance(block, RelativeTransformerBlock)
    table = np.zeros(block.relative_bias.relative_table.shape, "float32")
    table[3, 3] = 50.0  # the centre of the 7x7 table of a 4x4 grid
    block.relative_bias.relative_table.assign(table)
    probs = keras.ops.convert_to_numpy(keras_vit.attention_model(model)(images())[0])
    patches = probs[:, :, 1:, 1:]
    np.testing.assert_allclose(np.diagonal(patches, axis1=2, axis2=3), 1.0, atol=1e-4)


def test_resizing_each_variant():
    x = images(size=48)
    for name in POSITION_EMBEDDINGS:
        model = tiny(name)
        randomise(model)
        same = keras_vit.resize_position_embeddings(model, 32)
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(same(images())), keras.ops.convert_to_numpy(model(images()))
        )
        bigger = keras_vit.resize_position_embeddings(model, 48)
        assert bigger(x).shape == (2, 5), name


def test_resized_learned_2d_interpolates_rows_and_columns():
    model = tiny("learned_2d")
    randomise(model)
    old = model.get_layer("posembed_input")
    new = keras_vit.resize_position_embeddings(model, (48, 64)).get_layer("posembed_input")
    assert new.grid_size == (6, 8)
    rows, new_rows = keras.ops.convert_to_numpy(old.row_embedding), keras.ops.convert_to_numpy(new.row_embedding)
    cols, new_cols = keras.ops.convert_to_numpy(old.col_embedding), keras.ops.convert_to_numpy(new.col_embedding)
    assert new_rows.shape == (6, 16) and new_cols.shape == (8, 16)
    # corner-aligned linear: the ends stay, row 1 of 6 sits at 0.6 of the way from old row 0 to old row 1
    np.testing.assert_allclose(new_rows[[0, -1]], rows[[0, -1]], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new_rows[1], 0.4 * rows[0] + 0.6 * rows[1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new_cols[[0, -1]], cols[[0, -1]], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(new.prefix_embedding), keras.ops.convert_to_numpy(old.prefix_embedding)
    )


def test_resized_sincos_is_recomputed_and_relative_table_interpolated():
    sincos = keras_vit.resize_position_embeddings(tiny("sincos_2d"), 48).get_layer("posembed_input")
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(sincos.pos_embedding)[0, 1:], sincos_2d_embedding(6, 32), rtol=1e-6
    )
    model = tiny("relative", depth=2)
    randomise(model)
    old = keras.ops.convert_to_numpy(model.get_layer("encoderblock_1").relative_bias.relative_table)
    block = keras_vit.resize_position_embeddings(model, 48).get_layer("encoderblock_1")
    new = keras.ops.convert_to_numpy(block.relative_bias.relative_table)
    assert block.grid_size == (6, 6) and new.shape == (11, 11, 2)
    np.testing.assert_allclose(new[5, 5], old[3, 3], rtol=1e-5)  # offset (0, 0) stays offset (0, 0)
    np.testing.assert_allclose(new[0, 0], old[0, 0], rtol=1e-5)  # the largest offsets map onto each other


@pytest.mark.backend_independent  # argument checks
def test_bad_input_is_named():
    with pytest.raises(ValueError, match="position_embedding"):
        tiny("learned_3d")
    with pytest.raises(ValueError, match="divisible by 4"):
        tiny("sincos_2d", hidden_size=30, num_heads=3)
    with pytest.raises(ValueError, match="even hidden size"):
        tiny("learned_2d", hidden_size=33, num_heads=3)
    with pytest.raises(ValueError, match="not a multiple"):
        keras_vit.resize_position_embeddings(tiny("relative"), 36)
    layer = RelativePositionBias(2, (2, 2))
    layer.build((None, 5, 8))
    with pytest.raises(ValueError, match="built for 5"):
        layer(np.zeros((1, 10, 8), "float32"))


def test_variants_run_in_mixed_bfloat16():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    for name in ("learned_2d", "sincos_2d", "relative"):
        out = keras.ops.convert_to_numpy(tiny(name)(images()))
        assert out.dtype == np.float32 and np.all(np.isfinite(out)), name


def test_published_checkpoints_load_into_learned_1d_only():
    """The published .npz files hold 1-D embeddings; other variants reject them, naming the key."""
    from npz_layout import vit_checkpoint

    arrays = vit_checkpoint(patch=8, width=32, depth=1, heads=2, mlp=64, grid=(4, 4), num_classes=5)
    model = tiny("learned_1d")
    keras_vit.load_weights(model, arrays)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(model.get_layer("posembed_input").pos_embedding),
        arrays["Transformer/posembed_input/pos_embedding"],
    )
    for name in ("learned_2d", "sincos_2d", "relative", "none"):
        with pytest.raises(ValueError, match="posembed_input/pos_embedding"):
            keras_vit.load_weights(tiny(name), arrays)


# --- dynamic image size ----------------------------------------------------------------------------------

DYNAMIC_ARCH = dict(patch_size=8, hidden_size=32, depth=2, num_heads=2, mlp_dim=64)


def dynamic_random_weights(model, seed=0):
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        variable.assign(rng.normal(0, 0.2, variable.shape))
    return model


def sized_images(height, width, seed=1):
    return np.random.default_rng(seed).uniform(-1, 1, (2, height, width, 3)).astype("float32")


@pytest.fixture(scope="module")
def dynamic_models():
    fixed = dynamic_random_weights(keras_vit.ViT(None, image_size=32, num_classes=5, **DYNAMIC_ARCH))
    dynamic = keras_vit.ViT(None, image_size=32, num_classes=5, dynamic_image_size=True, **DYNAMIC_ARCH)
    dynamic.set_weights(fixed.get_weights())
    return fixed, dynamic


def test_dynamic_input_is_any_size(dynamic_models):
    assert dynamic_models[1].input_shape == (None, None, None, 3)


TENSORFLOW_ONLY = pytest.mark.backends("tensorflow")  # the other sizes: the same resize on the other backends


@pytest.mark.parametrize(
    "size", [(24, 56), *(pytest.param(s, marks=TENSORFLOW_ONLY) for s in [(32, 32), (48, 48), (64, 16)])]
)
def test_dynamic_equals_the_resized_fixed_model(dynamic_models, size):
    fixed, dynamic = dynamic_models
    resized = keras_vit.resize_position_embeddings(fixed, size)  # zoom_linear, as weights= loading does
    x = sized_images(*size)
    np.testing.assert_allclose(to_numpy(dynamic(x)), to_numpy(resized(x)), atol=1e-5, rtol=0)


@pytest.mark.parametrize("method", ["zoom_linear", "bilinear", "bicubic"])
def test_dynamic_in_graph_resize_matches_resample(method):
    layer = DynamicPositionEmbs((4, 4), num_prefix_tokens=1, stride=8, method=method)
    layer.build((None, 17, 6))
    posemb = np.random.default_rng(0).normal(size=(1, 17, 6)).astype("float32")
    layer.pos_embedding.assign(posemb)
    tokens = np.zeros((1, 1 + 6 * 3, 6), "float32")
    got = layer(tokens, np.zeros((1, 48, 24, 3), "float32"))
    want = resample_position_embeddings(posemb, (6, 3), old_grid=(4, 4), method=method)
    np.testing.assert_allclose(to_numpy(got), to_numpy(want), atol=1e-5, rtol=0)


def test_dynamic_saves_and_reloads_as_keras(dynamic_models, tmp_path):
    dynamic = dynamic_models[1]
    dynamic.save(tmp_path / "dynamic.keras")
    again = keras.saving.load_model(tmp_path / "dynamic.keras")
    for size in ((32, 32), (40, 24)):
        np.testing.assert_allclose(
            to_numpy(again(sized_images(*size))), to_numpy(dynamic(sized_images(*size))), atol=1e-6
        )


def test_dynamic_other_position_kinds_are_named():
    with pytest.raises(NotImplementedError, match="learned_2d"):
        keras_vit.ViT(None, image_size=32, position_embedding="learned_2d", dynamic_image_size=True, **DYNAMIC_ARCH)


# --- resizing: the original's zoom, the class token, models at another image size -----------------------------

RESIZE_TINY = dict(patch_size=8, hidden_size=32, depth=1, num_heads=2, mlp_dim=64, num_classes=3)


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


@pytest.mark.backend_independent  # argument checks, before any tensor
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
    model = keras_vit.ViT(None, image_size=32, **RESIZE_TINY)
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
    model = keras_vit.ViT(None, image_size=32, **RESIZE_TINY)
    same = keras_vit.resize_position_embeddings(model, 32, method="bicubic")
    images = np.random.default_rng(1).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    np.testing.assert_allclose(same.predict(images, verbose=0), model.predict(images, verbose=0), atol=1e-6)
    bilinear = keras_vit.resize_position_embeddings(model, 64, method="bilinear")
    expected = resample_position_embeddings(
        model.get_layer("posembed_input").pos_embedding.numpy(), 8, method="bilinear"
    )
    np.testing.assert_allclose(bilinear.get_layer("posembed_input").pos_embedding.numpy(), expected, atol=1e-6)


def test_resize_position_embeddings_rejects_bad_sizes():
    model = keras_vit.ViT(None, image_size=32, **RESIZE_TINY)
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
    model = keras_vit.ViT(None, image_size=32, position_embedding="none", **RESIZE_TINY)
    resized = keras_vit.resize_position_embeddings(model, 64)
    assert resized.input_shape == (None, 64, 64, 3)
    for old, new in zip(model.weights, resized.weights):
        np.testing.assert_array_equal(new.numpy(), old.numpy())
