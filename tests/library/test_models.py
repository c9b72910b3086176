"""The core model family: shapes, parameter counts, serialisation, training, bad input."""

import inspect

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.precision import global_policy
from keras_vit.variants import NAMED_VARIANTS, constructor_name

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


def to_numpy(x) -> np.ndarray:
    """A layer's output as numpy, on any backend (JAX arrays have no ``.numpy()``)."""
    return keras.ops.convert_to_numpy(x)


def images(batch=2, size=32, channels=3, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (batch, size, size, channels)).astype("float32")


def vit_params(width, depth, mlp, patch, image=224, classes=1000):
    """The parameter count from the paper's equations, term by term."""
    tokens = (image // patch) ** 2 + 1
    embed = patch * patch * 3 * width + width
    norms, attention = 2 * 2 * width, (width * 3 * width + 3 * width) + (width * width + width)
    block = norms + attention + (width * mlp + mlp) + (mlp * width + width)
    return embed + width + tokens * width + depth * block + 2 * width + width * classes + classes


FAST_FULL_BUILDS = ("ViT_Ti16", "ViT_S16", "ViT_S32")  # the others take 3-18 s each to build: slow tier


def _variant_of(name):
    size, patch = name[4:].rstrip("0123456789"), int(name[4:].lstrip("TiSBLH"))
    return keras_vit.SIZES[size], patch


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=[] if n in FAST_FULL_BUILDS else [pytest.mark.slow]) for n in TIMM_PARAMS]
)
@pytest.mark.backends("tensorflow")  # backend-independent
def test_parameter_counts_match_table_1(name):
    cfg, patch = _variant_of(name)
    model = getattr(keras_vit, name)()
    assert model.count_params() == TIMM_PARAMS[name]
    assert model.count_params() == vit_params(cfg["hidden_size"], cfg["depth"], cfg["mlp_dim"], patch)
    keras.backend.clear_session()


@pytest.mark.parametrize("name", list(TIMM_PARAMS))
@pytest.mark.backends("tensorflow")  # backend-independent
def test_parameter_counts_of_every_variant_from_a_one_block_build(name):
    """Fast for every size: the model with one block, plus ``depth - 1`` more blocks of the same size."""
    cfg, patch = _variant_of(name)
    one_block = getattr(keras_vit, name)(depth=1)
    block = one_block.get_layer("encoderblock_0").count_params()
    assert one_block.count_params() + (cfg["depth"] - 1) * block == TIMM_PARAMS[name]
    assert TIMM_PARAMS[name] == vit_params(cfg["hidden_size"], cfg["depth"], cfg["mlp_dim"], patch)
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
    assert np.all(to_numpy(model(images())) == 0.0)
    std = model.get_layer("posembed_input").pos_embedding.numpy().std()
    assert 0.015 < std < 0.025


def _block_reference(x, block, approximate):
    """One encoder block in numpy, straight from Eq. 2-3 of the paper (with layer scale: each branch times its
    ``gamma`` before the residual addition)."""

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
    gammas = [1.0 if scale is None else scale.gamma.numpy() for scale in (block.ls1, block.ls2)]
    x = x + gammas[0] * dense(context, block.attn.out)
    return x + gammas[1] * dense(gelu(dense(ln(x, block.norm2), block.mlp.fc1)), block.mlp.fc2)


@pytest.mark.parametrize("gelu, layer_scale_init", [("tanh", None), ("exact", None), ("tanh", 0.1)])
def test_transformer_block_matches_the_equations(gelu, layer_scale_init):
    block = keras_vit.TransformerBlock(num_heads=4, mlp_dim=64, gelu=gelu, layer_scale_init=layer_scale_init)
    x = np.random.default_rng(1).normal(size=(2, 7, 32)).astype("float32")
    block.build(x.shape)
    for w in block.weights:  # non-trivial LayerNorm parameters and biases
        w.assign(w.numpy() + np.random.default_rng(len(w.path)).normal(0, 0.1, w.shape))
    expected = _block_reference(x.astype("float64"), block, approximate=gelu == "tanh")
    np.testing.assert_allclose(to_numpy(block(x)), expected, atol=2e-5)
    y, probs = block(x, return_attention_scores=True)
    np.testing.assert_allclose(to_numpy(y), expected, atol=2e-5)
    np.testing.assert_allclose(to_numpy(probs).sum(-1), 1.0, atol=1e-5)


def test_layer_scale_is_off_by_default_and_at_one_changes_nothing():
    """Off (the default): no LayerScale layers, the same weights as before; on at 1.0: the same numbers, bit for bit."""
    plain = keras_vit.ViT(None, **TINY)
    assert not [v for v in plain.weights if "/ls" in v.path]
    scaled = keras_vit.ViT(None, **TINY, layer_scale_init=1.0)
    assert len(scaled.weights) == len(plain.weights) + 2 * TINY["depth"]
    assert scaled.get_layer("encoderblock_0").ls1.gamma.shape == (32,)
    by_path = {v.path: v for v in scaled.weights}
    for variable in plain.weights:
        variable.assign(np.random.default_rng(len(variable.path)).normal(0, 0.1, variable.shape))
        by_path[variable.path].assign(variable.numpy())
    np.testing.assert_array_equal(to_numpy(scaled(images())), to_numpy(plain(images())))


def test_patch_embed_is_a_linear_projection_of_each_patch():
    layer = keras_vit.PatchEmbed(4, 6)
    x = images(1, 8)
    tokens = to_numpy(layer(x))
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


# Every serialisable layer of keras_vit, with a NON-default value for every constructor argument.
NON_DEFAULT_ARGUMENTS = {
    "PatchEmbed": dict(patch_size=(4, 2), hidden_size=8, data_format="channels_first", dynamic_img_pad=True),
    "ChannelsLast": dict(),
    "ClassToken": dict(),
    "PrefixTokens": dict(count=3, offset=2),
    "TokenAt": dict(index=1),
    "AddPositionEmbs": dict(grid_size=(3, 5), num_prefix_tokens=2),
    "AddPositionEmbs2D": dict(grid_size=(3, 5), num_prefix_tokens=2),
    "DynamicPositionEmbs": dict(
        grid_size=(3, 5), num_prefix_tokens=0, stride=8, method="bilinear", dynamic_img_pad=True
    ),
    "PatchTokenMap": dict(num_prefix_tokens=0, stride=8, dynamic_img_pad=True),
    "ImagePreprocessor": dict(
        image_size=(48, 64),
        crop_fraction=0.875,
        interpolation="bicubic",
        mean=[0.485, 0.456, 0.406],
        std=[0.25, 0.25, 0.25],
        data_format="channels_first",
    ),
    "SinCosPositionEmbs": dict(grid_size=(3, 5), num_prefix_tokens=0, temperature=100.0),
    "RelativePositionBias": dict(num_heads=3, grid_size=(3, 5), num_prefix_tokens=0),
    "RelativeTransformerBlock": dict(
        num_heads=2,
        mlp_dim=16,
        grid_size=(3, 5),
        num_prefix_tokens=0,
        dropout=0.1,
        attention_dropout=0.2,
        drop_path=0.3,
        gelu="exact",
        remat=True,
        layer_scale_init=0.1,
        qk_norm=True,
        mlp_type="swiglu",
        layer_norm_epsilon=1e-5,
    ),
    "TokenPooling": dict(mode="avg", num_prefix_tokens=2),
    "MultiHeadSelfAttention": dict(num_heads=3, attention_dropout=0.2, qk_norm=True, layer_norm_epsilon=1e-5),
    "MAPHead": dict(num_heads=3, mlp_dim=16, gelu="quick", layer_norm_epsilon=1e-5),
    "MlpBlock": dict(mlp_dim=16, dropout=0.1, gelu="exact", mlp_type="swiglu"),
    "DropPath": dict(rate=0.3, seed=7),
    "LayerScale": dict(init_value=0.1),
    "TransformerBlock": dict(
        num_heads=2,
        mlp_dim=16,
        dropout=0.1,
        attention_dropout=0.2,
        drop_path=0.3,
        gelu="exact",
        remat=True,
        layer_scale_init=0.1,
        qk_norm=True,
        mlp_type="swiglu",
        layer_norm_epsilon=1e-5,
    ),
    "StdConv2D": dict(filters=8, kernel_size=(3, 5), strides=(2, 1), epsilon=1e-8, standardization="timm"),
    "BottleneckUnit": dict(
        features=64, strides=2, std_conv_epsilon=1e-8, group_norm_epsilon=1e-5, weight_standardization="timm"
    ),
    "ResNetStem": dict(
        num_layers=(1, 2),
        width=96,
        std_conv_epsilon=1e-8,
        group_norm_epsilon=1e-5,
        weight_standardization="timm",
        data_format="channels_first",
    ),
    # the model: the config record (tests/test_config.py sets every field of it) and what was frozen or thawed
    "VisionTransformer": dict(
        config=keras_vit.ViTConfig.from_variant(
            None, image_size=16, patch_size=8, hidden_size=8, depth=1, num_heads=2, mlp_dim=8, gelu="exact"
        ).to_dict(),
        trainable=False,
        trainable_layers={"encoderblock_0/MlpBlock_3": True},
        head_dtype="bfloat16",
    ),
}


def _keras_vit_layers() -> dict[str, type]:
    """Every layer class registered for serialisation under the ``keras_vit`` package."""
    return {
        name.partition(">")[2]: cls
        for name, cls in keras.saving.get_custom_objects().items()
        if name.startswith("keras_vit>") and issubclass(cls, keras.layers.Layer)
    }


def _constructor_arguments(cls) -> dict[str, inspect.Parameter]:
    """The named arguments of ``cls(...)``, including those its ``**kwargs`` pass to a keras_vit base class."""
    arguments = {}
    for klass in cls.__mro__:
        if not klass.__module__.startswith("keras_vit") or "__init__" not in vars(klass):
            continue
        parameters = list(inspect.signature(klass.__init__).parameters.values())[1:]  # without self
        arguments.update(
            {
                p.name: p
                for p in parameters
                if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name not in arguments
            }
        )
        if not any(p.kind == p.VAR_KEYWORD for p in parameters):
            break
    return arguments


def _plain(value):
    """Tuples as lists, as configs store them."""
    return [_plain(v) for v in value] if isinstance(value, (tuple, list)) else value


def test_every_layer_class_is_in_the_round_trip_table():
    assert set(_keras_vit_layers()) == set(NON_DEFAULT_ARGUMENTS)


@pytest.mark.parametrize("name", sorted(NON_DEFAULT_ARGUMENTS))
def test_layer_config_keeps_every_constructor_argument(name):
    """Built with a non-default value for every argument, a layer's config holds each of them, and
    ``from_config(get_config())`` gives the same config: an argument left out of ``get_config`` fails here."""
    cls, arguments = _keras_vit_layers()[name], NON_DEFAULT_ARGUMENTS[name]
    parameters = _constructor_arguments(cls)
    assert set(arguments) == set(parameters), f"{name}: give a non-default value for every constructor argument"
    for argument, value in arguments.items():
        default = parameters[argument].default
        assert default is inspect.Parameter.empty or _plain(value) != _plain(default), f"{name}.{argument} is default"
    layer = cls(**arguments, name="layer")
    config = layer.get_config()
    for argument, value in arguments.items():
        assert argument in config, f"{name}.get_config() drops {argument!r}"
        assert _plain(config[argument]) == _plain(value), f"{name}.get_config()[{argument!r}]"
    clone = cls.from_config(config)
    assert clone.get_config() == config


def test_tiny_vit_overfits_a_small_batch():
    model = keras_vit.ViT(None, **TINY)
    x = images(16, seed=3)
    y = np.arange(16) % 5
    model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    before = model.evaluate(x, y, verbose=0)
    # 150 steps on the one batch, in one epoch (150 epochs cost Keras' per-epoch work 150 times)
    model.fit(np.tile(x, (150, 1, 1, 1)), np.tile(y, 150), batch_size=16, shuffle=False, verbose=0)
    assert model.evaluate(x, y, verbose=0) < before / 10
    assert np.mean(np.argmax(model.predict(x, verbose=0), -1) == y) == 1.0


def test_mixed_bfloat16_runs_and_keeps_float32_logits():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    model = keras_vit.ViT(None, **TINY)
    assert model.get_layer("encoderblock_0").compute_dtype == "bfloat16"
    out = model(images())
    assert keras.backend.standardize_dtype(out.dtype) == "float32" and tuple(out.shape) == (2, 5)
    model.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    loss = model.fit(images(4), np.arange(4) % 5, epochs=2, verbose=0).history["loss"]
    assert np.all(np.isfinite(loss))


def test_attention_model_shares_weights_and_gives_probabilities():
    model = keras_vit.ViT(None, **TINY)
    probs = keras_vit.attention_model(model)(images())
    assert len(probs) == 2 and tuple(probs[0].shape) == (2, 4, 17, 17)
    np.testing.assert_allclose(to_numpy(probs[1]).sum(-1), 1.0, atol=1e-5)
    block0 = model.get_layer("encoderblock_0")
    block0.attn.qkv.kernel.assign(np.zeros(block0.attn.qkv.kernel.shape))  # q = k = 0 -> uniform
    probs = keras_vit.attention_model(model)(images())
    np.testing.assert_allclose(to_numpy(probs[0]), 1 / 17, atol=1e-6)


def test_drop_path_drops_whole_samples_and_rescales():
    layer = keras_vit.DropPath(0.5, seed=1)
    x = np.ones((1000, 3, 4), "float32")
    y = to_numpy(layer(x, training=True))
    per_sample = y.reshape(1000, -1)
    assert set(np.unique(per_sample)) <= {0.0, 2.0}
    assert np.all(per_sample.min(1) == per_sample.max(1))
    assert 0.4 < (per_sample[:, 0] == 0).mean() < 0.6
    np.testing.assert_array_equal(to_numpy(layer(x, training=False)), x)


@pytest.mark.backend_independent  # argument checks, before any tensor
@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(image_size=30), "not divisible by the patch size 8"),
        (dict(image_size=(32, 36)), "32x36 is not divisible"),
        (dict(classifier="cls"), "Unknown classifier 'cls'"),
        (dict(pooling="min", include_top=False), "Unknown pooling 'min'"),
        (dict(classifier="gap", pooling="token", include_top=False), "needs classifier='token'"),
        (dict(gelu="relu"), "Unknown gelu 'relu'"),
        (dict(channels=1, weights="anything.npz"), "need 3 input channels"),
        (dict(image_size="big"), "`image_size` must be an int or a pair"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        keras_vit.ViT(None, **{**TINY, **kwargs})


@pytest.mark.backend_independent  # argument checks, before any tensor
@pytest.mark.parametrize("variant", ["X/16", "B/0", "B/16/2", "B/sixteen", ""])
def test_unknown_variant(variant):
    with pytest.raises(ValueError, match="Unknown ViT variant"):
        keras_vit.ViT(variant)


def test_variant_spellings_build_the_same_model():
    for spelling in ("ViT_B16", "ViT-B/16", "vit-b16", "B16"):
        assert keras_vit.parse_variant(spelling) == keras_vit.parse_variant("B/16")
    model = keras_vit.ViT("ViT_B16", image_size=32, depth=1)
    assert model.name == "vit_b16" and model.get_layer("embedding").kernel.shape == (16, 16, 3, 768)


def test_every_named_variant_has_its_exported_constructor():
    exported = {name for name in keras_vit.__all__ if name.startswith("ViT_")}
    assert exported == {constructor_name(variant) for variant in NAMED_VARIANTS}
    for variant in NAMED_VARIANTS:
        constructor = getattr(keras_vit, constructor_name(variant))
        assert constructor.__name__ == constructor_name(variant) and variant in constructor.__doc__


@pytest.mark.backend_independent  # argument checks, before any tensor
def test_overrides_are_checked():
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['width'\]"):
        keras_vit.ViT("B/16", width=3)
    with pytest.raises(ValueError, match=r"variant=None needs \['depth'\]"):
        keras_vit.ViT(None, **{k: v for k, v in TINY.items() if k != "depth"})


def test_wrong_input_at_call_time():
    model = keras_vit.ViT(None, **TINY)
    with pytest.raises(ValueError, match="expected axis -1 of input shape to have value 3"):
        model(images(channels=1))
    with pytest.raises(ValueError, match=r"expected shape=\(None, 32, 32, 3\)"):
        model(images(size=64))
    # the same through predict_on_batch (a compiled function): the model's expected input, not a graph error
    channels = r"expected (shape=\(None, 32, 32, 3\)|axis -1 of input shape to have value 3)"  # by backend
    for wrong in (1, 4):
        with pytest.raises(ValueError, match=channels):
            model.predict_on_batch(images(channels=wrong))
    size = r"expected shape=\(None, 32, 32, 3\), found shape=\(2, 64, 64, 3\)|built for 17 .* the image_size you feed"
    with pytest.raises(ValueError, match=size):
        model.predict_on_batch(images(size=64))
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


SMALL = dict(image_size=32, patch_size=8, hidden_size=32, depth=1, num_heads=2, mlp_dim=64, num_classes=5)


def _same_random_weights(source, *targets):
    """Random weights (not the zero head) in ``source``, copied into each of ``targets``."""
    rng = np.random.default_rng(0)
    for variable in source.weights:
        variable.assign(rng.normal(0, 0.1, variable.shape).astype("float32"))
    for target in targets:
        target.set_weights(source.get_weights())


HYBRID_ANY_SIZE = dict(resnet_stages=(1,), patch_size=2, dynamic_image_size=True)


@pytest.mark.parametrize(
    "options",
    [dict(), pytest.param(HYBRID_ANY_SIZE, marks=pytest.mark.backends("tensorflow"))],  # JAX: 20 s of ResNet
    ids=["plain", "hybrid, any size"],
)
def test_channels_first_takes_the_same_weights_and_gives_the_channels_last_logits(options):
    last = keras_vit.ViT(None, **{**SMALL, **options}, data_format="channels_last")
    first = keras_vit.ViT(None, **{**SMALL, **options}, data_format="channels_first")
    _same_random_weights(last, first)
    assert first.config.data_format == "channels_first" and first.input_shape[1] == 3
    x = images(size=32 if not options else 40)
    np.testing.assert_allclose(to_numpy(first(x.transpose(0, 3, 1, 2))), to_numpy(last(x)), atol=1e-6)
    maps = [
        to_numpy(keras_vit.feature_model(model, 0)(batch))
        for model, batch in ((last, x), (first, x.transpose(0, 3, 1, 2)))
    ]
    np.testing.assert_allclose(maps[1], maps[0], atol=1e-6)


def test_the_default_layout_is_keras_image_data_format(channels_first):
    assert keras_vit.ViT_Ti16(depth=1, include_top=False).input_shape == (None, 3, 224, 224)
    model = keras_vit.ViT_Ti16(input_shape=(3, 128, 96), depth=1)
    assert model.input_shape == (None, 3, 128, 96) and model.config.image_size == (128, 96)
    assert keras_vit.ViT(None, **SMALL, data_format="channels_last").input_shape == (None, 32, 32, 3)
    with pytest.raises(ValueError, match=r"input_shape must be \(channels, height, width\)"):
        keras_vit.ViT(None, **SMALL, input_shape=(32, 32))
    with pytest.raises(ValueError, match="Unknown data_format 'nchw'"):
        keras_vit.ViT_S16(data_format="nchw")


def test_dynamic_img_pad_is_zero_padding_to_the_next_patch_multiple():
    """27x30 images (patch 8) in a padding model: the logits of the 32x32 model on the images padded with zeros below
    and right (timm's dynamic_img_pad), at a fixed size and at any size; without the option, the size is refused."""
    plain = keras_vit.ViT(None, **SMALL)
    padded = keras_vit.ViT(None, **{**SMALL, "image_size": (27, 30)}, dynamic_img_pad=True)
    any_size = keras_vit.ViT(None, **SMALL, dynamic_image_size=True, dynamic_img_pad=True)
    _same_random_weights(plain, padded, any_size)
    assert padded.config.grid_size == (4, 4) and padded.input_shape == (None, 27, 30, 3)
    x = np.random.default_rng(1).uniform(-1, 1, (2, 27, 30, 3)).astype("float32")
    expected = to_numpy(plain(np.pad(x, [(0, 0), (0, 5), (0, 2), (0, 0)])))
    np.testing.assert_allclose(to_numpy(padded(x)), expected, atol=1e-6)
    np.testing.assert_allclose(to_numpy(any_size(x)), expected, atol=1e-6)
    assert keras_vit.feature_model(any_size, 0)(x).shape == (2, 4, 4, 32)
    with pytest.raises(ValueError, match=r"27x30 is not divisible by the patch size 8.*dynamic_img_pad=True"):
        keras_vit.ViT(None, **{**SMALL, "image_size": (27, 30)})


# Each kind of layer for_inference casts: plain blocks, a hybrid's ResNet (GroupNorm, StdConv), the options that add
# layers or variables, two heads, attention pooling, registers.
INFERENCE_MODELS = {
    "plain": ("Ti/16", {}),
    "hybrid": ("Ti/16", {"resnet_stages": (1,), "resnet_width": 32, "patch_size": 2}),  # R26's layers, one unit
    "options": ("Ti/16", {"qk_norm": True, "layer_scale_init": 0.1, "position_embedding": "relative"}),
    "gap, fc_norm, pre_logits": ("Ti/16", {"classifier": "gap", "fc_norm": True, "representation_size": 16}),
    "distilled": ("DeiT_Ti16_Distilled", {}),
    "map, registers, swiglu": ("Ti/16", {"num_register_tokens": 4, "classifier": "map", "mlp_type": "swiglu"}),
}


@pytest.mark.parametrize("kind", INFERENCE_MODELS)
def test_for_inference_stores_the_weights_cast_and_computes_what_the_mixed_model_does(kind):
    """``for_inference`` of a ``mixed_bfloat16`` model: every weight the blocks cast is stored in bfloat16, the norms'
    and the heads' stay float32 (what the mixed model computes with), and the logits of photo crops are the mixed
    model's to the bit; the original is untouched, and a model with nothing mixed left is returned as it is."""
    from sklearn.datasets import load_sample_image

    variant, options = INFERENCE_MODELS[kind]
    size = options.get("image_size", 32)
    with global_policy("mixed_bfloat16"):
        model = keras_vit.ViT(
            variant, **{"image_size": 32, "depth": 2, "num_classes": 3, "class_names": ("a", "b", "c"), **options}
        )
    rng = np.random.default_rng(0)
    for variable in model.weights:  # away from any initial value a bfloat16 copy could keep exactly
        variable.assign(rng.normal(1.0 if "gamma" in variable.path else 0.0, 0.2, variable.shape))
    image = load_sample_image("china.jpg").astype("float32")
    x = (np.stack([image[:size, :size], image[200 : 200 + size, 300 : 300 + size]]) - 127.5) / 127.5
    expected = np.asarray(model.predict_on_batch(x), dtype="float32")
    fast = keras_vit.for_inference(model)
    np.testing.assert_array_equal(np.asarray(fast.predict_on_batch(x), dtype="float32"), expected)
    assert np.abs(expected).max() > 0.1
    kept = (keras.layers.LayerNormalization, keras.layers.GroupNormalization)
    for layer in fast._flatten_layers(include_self=False):
        if not list(layer._flatten_layers(include_self=False)):  # a layer of its own weights
            dtype = "float32" if isinstance(layer, kept) or layer.name.startswith("head") else "bfloat16"
            assert {v.dtype for v in layer.weights} <= {dtype}, layer.path
    assert {v.dtype for v in fast.weights} == {"float32", "bfloat16"}
    assert {v.dtype for v in model.weights} == {"float32"}
    assert type(fast) is keras_vit.VisionTransformer and fast.config == model.config  # the class names too
    assert keras_vit.for_inference(fast) is fast


def test_for_inference_keeps_float32_and_quantized_models():
    """A float32 model and an int8-quantized mixed one (its blocks' sublayers take their policies from the model's
    map, which a copy under another policy would lose), and a plain functional model are returned as they are; a path is
    a ``TypeError``."""
    model = keras_vit.ViT("Ti/16", image_size=32, depth=1, num_classes=5)
    assert keras_vit.for_inference(model) is model
    with global_policy("mixed_bfloat16"):
        quantized = keras_vit.ViT("Ti/16", image_size=32, depth=1, num_classes=5)
    plain = keras.Model(quantized.inputs, quantized.outputs)  # not a VisionTransformer: no config to rebuild from
    assert keras_vit.for_inference(plain) is plain
    quantized.quantize("int8")
    assert keras_vit.for_inference(quantized) is quantized
    with pytest.raises(TypeError, match=r"^for_inference takes a Keras model, got str"):
        keras_vit.for_inference("model.keras")
