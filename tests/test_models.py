"""The core model family: shapes, parameter counts, serialisation, training, bad input."""

import keras
import numpy as np
import pytest

import keras_vit

TINY = dict(image_size=32, patch_size=8, hidden_size=32, depth=2, num_heads=4, mlp_dim=64, num_classes=5)

# Parameter counts of timm 1.0.31's vit_*_224 models with 1000 classes, counted with
# sum(p.numel() for p in timm.create_model(name).parameters()); they match the paper's Table 1.
TIMM_PARAMS = {
    "ViT_Ti16": 5_717_416,
    "ViT_S16": 22_050_664,
    "ViT_S32": 22_878_952,
    "ViT_B8": 86_576_872,
    "ViT_B16": 86_567_656,
    "ViT_B32": 88_224_232,
    "ViT_L16": 304_326_632,
    "ViT_L32": 306_535_400,
    "ViT_H14": 632_045_800,
}


def images(batch=2, size=32, channels=3, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (batch, size, size, channels)).astype("float32")


def vit_params(width, depth, mlp, patch, image=224, classes=1000):
    """The parameter count from the paper's equations, term by term."""
    tokens = (image // patch) ** 2 + 1
    embed = patch * patch * 3 * width + width
    block = 2 * 2 * width + (width * 3 * width + 3 * width) + (width * width + width) + (width * mlp + mlp) + (mlp * width + width)
    return embed + width + tokens * width + depth * block + 2 * width + width * classes + classes


@pytest.mark.parametrize("name", list(TIMM_PARAMS))
def test_parameter_counts_match_table_1(name):
    size, patch = name[4:].rstrip("0123456789"), int(name[4:].lstrip("TiSBLH"))
    cfg = keras_vit.SIZES[size]
    model = getattr(keras_vit, name)()
    assert model.count_params() == TIMM_PARAMS[name]
    assert model.count_params() == vit_params(cfg["hidden_size"], cfg["depth"], cfg["mlp_dim"], patch)
    keras.backend.clear_session()


@pytest.mark.parametrize(
    "kwargs, shape",
    [
        (dict(classifier="token"), (2, 5)),
        (dict(classifier="gap"), (2, 5)),
        (dict(classifier="token", representation_size=16), (2, 5)),
        (dict(include_top=False), (2, 17, 32)),
        (dict(include_top=False, classifier="gap"), (2, 16, 32)),
        (dict(include_top=False, pooling="token"), (2, 32)),
        (dict(include_top=False, pooling="avg"), (2, 32)),
        (dict(image_size=(32, 48)), (2, 5)),
    ],
)
def test_output_shapes(kwargs, shape):
    model = keras_vit.ViT(None, **{**TINY, **kwargs})
    h, w = keras_vit.layers._pair(kwargs.get("image_size", 32), "image_size")
    x = np.zeros((2, h, w, 3), "float32")
    assert tuple(model(x).shape) == shape


def test_gap_model_has_no_class_token():
    model = keras_vit.ViT(None, **TINY, classifier="gap")
    assert "class_token" not in [layer.name for layer in model.layers]
    assert model.get_layer("posembed_input").pos_embedding.shape == (1, 16, 32)


def test_head_and_class_token_are_zero_initialised_and_output_is_zero():
    model = keras_vit.ViT(None, **TINY)
    assert not np.any(model.get_layer("class_token").cls.numpy())
    assert np.all(model(images()).numpy() == 0.0)
    std = model.get_layer("posembed_input").pos_embedding.numpy().std()
    assert 0.015 < std < 0.025


def _block_reference(x, block, approximate):
    """One encoder block in numpy, straight from Eq. 2-3 of the paper."""

    def ln(v, layer):
        mu, var = v.mean(-1, keepdims=True), v.var(-1, keepdims=True)
        return (v - mu) / np.sqrt(var + 1e-6) * layer.gamma.numpy() + layer.beta.numpy()

    def dense(v, layer):
        return v @ layer.kernel.numpy() + layer.bias.numpy()

    def gelu(v):
        if approximate:
            return 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v**3)))
        from scipy.special import erf

        return 0.5 * v * (1 + erf(v / np.sqrt(2)))

    b, n, d = x.shape
    heads = block.num_heads
    q, k, v = np.split(dense(ln(x, block.norm1), block.attn.qkv), 3, axis=-1)
    split = lambda t: t.reshape(b, n, heads, d // heads).transpose(0, 2, 1, 3)  # noqa: E731
    logits = split(q) @ split(k).transpose(0, 1, 3, 2) / np.sqrt(d // heads)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    context = (probs @ split(v)).transpose(0, 2, 1, 3).reshape(b, n, d)
    x = x + dense(context, block.attn.out)
    return x + dense(gelu(dense(ln(x, block.norm2), block.mlp.fc1)), block.mlp.fc2)


@pytest.mark.parametrize("gelu", ["tanh", "exact"])
def test_transformer_block_matches_the_equations(gelu):
    block = keras_vit.TransformerBlock(num_heads=4, mlp_dim=64, gelu=gelu)
    x = np.random.default_rng(1).normal(size=(2, 7, 32)).astype("float32")
    block.build(x.shape)
    for w in block.weights:  # non-trivial LayerNorm parameters and biases
        w.assign(w.numpy() + np.random.default_rng(len(w.path)).normal(0, 0.1, w.shape))
    expected = _block_reference(x.astype("float64"), block, approximate=gelu == "tanh")
    np.testing.assert_allclose(block(x).numpy(), expected, atol=2e-5)
    y, probs = block(x, return_attention_scores=True)
    np.testing.assert_allclose(y.numpy(), expected, atol=2e-5)
    np.testing.assert_allclose(probs.numpy().sum(-1), 1.0, atol=1e-5)


def test_patch_embed_is_a_linear_projection_of_each_patch():
    layer = keras_vit.PatchEmbed(4, 6)
    x = images(1, 8)
    tokens = layer(x).numpy()
    patches = x.reshape(1, 2, 4, 2, 4, 3).transpose(0, 1, 3, 2, 4, 5).reshape(1, 4, 48)
    expected = patches @ layer.kernel.numpy().reshape(48, 6) + layer.bias.numpy()
    np.testing.assert_allclose(tokens, expected, atol=1e-5)


def test_save_and_load_round_trip_is_bit_identical(tmp_path):
    model = keras_vit.ViT(None, **TINY, representation_size=16, dropout=0.1, drop_path=0.1, attention_dropout=0.1)
    for w in model.weights:
        w.assign(np.random.default_rng(0).normal(0, 0.05, w.shape))
    path = tmp_path / "m.keras"
    model.save(path)
    restored = keras.models.load_model(path)
    x = images()
    np.testing.assert_array_equal(model.predict(x, verbose=0), restored.predict(x, verbose=0))
    assert [layer.get_config() for layer in restored.layers] == [layer.get_config() for layer in model.layers]


def test_layer_configs_round_trip():
    for layer in [
        keras_vit.PatchEmbed((4, 2), 8),
        keras_vit.AddPositionEmbs((3, 5), num_prefix_tokens=1),
        keras_vit.TransformerBlock(2, 16, dropout=0.1, attention_dropout=0.2, drop_path=0.3, gelu="exact"),
        keras_vit.TokenPooling("avg", num_prefix_tokens=1),
    ]:
        clone = type(layer).from_config(layer.get_config())
        assert clone.get_config() == layer.get_config()


def test_tiny_vit_overfits_a_small_batch():
    model = keras_vit.ViT(None, **TINY)
    x = images(16, seed=3)
    y = np.arange(16) % 5
    model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x, y, batch_size=16, epochs=150, verbose=0).history["loss"]
    assert history[-1] < history[0] / 10
    assert np.mean(np.argmax(model.predict(x, verbose=0), -1) == y) == 1.0


def test_mixed_bfloat16_runs_and_keeps_float32_logits():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    model = keras_vit.ViT(None, **TINY)
    assert model.get_layer("encoderblock_0").compute_dtype == "bfloat16"
    out = model(images())
    assert out.dtype == "float32" and out.shape == (2, 5)
    model.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    loss = model.fit(images(4), np.arange(4) % 5, epochs=2, verbose=0).history["loss"]
    assert np.all(np.isfinite(loss))


def test_attention_model_shares_weights_and_gives_probabilities():
    model = keras_vit.ViT(None, **TINY)
    probs = keras_vit.attention_model(model)(images())
    assert len(probs) == 2 and tuple(probs[0].shape) == (2, 4, 17, 17)
    np.testing.assert_allclose(probs[1].numpy().sum(-1), 1.0, atol=1e-5)
    block0 = model.get_layer("encoderblock_0")
    block0.attn.qkv.kernel.assign(np.zeros(block0.attn.qkv.kernel.shape))  # q = k = 0 -> uniform
    probs = keras_vit.attention_model(model)(images())
    np.testing.assert_allclose(probs[0].numpy(), 1 / 17, atol=1e-6)


def test_drop_path_drops_whole_samples_and_rescales():
    layer = keras_vit.DropPath(0.5, seed=1)
    x = np.ones((1000, 3, 4), "float32")
    y = layer(x, training=True).numpy()
    per_sample = y.reshape(1000, -1)
    assert set(np.unique(per_sample)) <= {0.0, 2.0}
    assert np.all(per_sample.min(1) == per_sample.max(1))
    assert 0.4 < (per_sample[:, 0] == 0).mean() < 0.6
    np.testing.assert_array_equal(layer(x, training=False).numpy(), x)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(image_size=30), "not divisible by the patch size 8"),
        (dict(image_size=(32, 36)), "32x36 is not divisible"),
        (dict(classifier="cls"), "Unknown classifier 'cls'"),
        (dict(pooling="max", include_top=False), "Unknown pooling 'max'"),
        (dict(classifier="gap", pooling="token", include_top=False), "needs classifier='token'"),
        (dict(gelu="relu"), "Unknown gelu 'relu'"),
        (dict(channels=1, weights="anything.npz"), "need 3 input channels"),
        (dict(image_size="big"), "`image_size` must be an int or a pair"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        keras_vit.ViT(None, **{**TINY, **kwargs})


@pytest.mark.parametrize("variant", ["X/16", "B/0", "B16", "B/sixteen", ""])
def test_unknown_variant(variant):
    with pytest.raises(ValueError, match="Unknown ViT variant"):
        keras_vit.ViT(variant)


def test_wrong_input_at_call_time():
    model = keras_vit.ViT(None, **TINY)
    with pytest.raises(ValueError, match="expected axis -1 of input shape to have value 3"):
        model(images(channels=1))
    with pytest.raises(ValueError, match=r"expected shape=\(None, 32, 32, 3\)"):
        model(images(size=64))
    layer = keras_vit.AddPositionEmbs(4)
    with pytest.raises(ValueError, match="Got 10 tokens but the position embeddings were built for 17"):
        layer(np.zeros((1, 10, 8), "float32"))


def test_non_square_images_and_channels():
    model = keras_vit.ViT(None, **{**TINY, "image_size": (16, 40)}, channels=1)
    assert model.get_layer("posembed_input").grid_size == (2, 5)
    assert tuple(model(np.zeros((1, 16, 40, 1), "float32")).shape) == (1, 5)


def test_named_constructors_forward_options():
    model = keras_vit.ViT_S32(64, depth=1, num_classes=3, classifier="gap")
    assert model.name == "vit_s32"
    assert model.get_layer("posembed_input").grid_size == (2, 2)
    assert tuple(model(np.zeros((1, 64, 64, 3), "float32")).shape) == (1, 3)


def test_preprocess_input_range():
    x = np.array([0, 127.5, 255], "float32")
    np.testing.assert_allclose(keras_vit.preprocess_input(x), [-1, 0, 1])
