"""The BiT ResNet layers of the hybrids (``keras_vit.resnet``): weight standardisation, SAME padding, units, the
stem's keys; and the hybrids built on them (ResNet feature map + ViT): sizes, parameter counts, checkpoints, parity
with timm, saving."""

import json
from pathlib import Path

import keras
import numpy as np
import pytest
from npz_layout import flax_hybrid_checkpoint
from reference_runs import run_reference

import keras_vit
from keras_vit.checkpoints.load import load_weights
from keras_vit.resnet import (
    TIMM_RESNET,
    BottleneckUnit,
    ResNetStem,
    StdConv2D,
    standardize_kernel,
)
from keras_vit.variants import resnet_depth, resnet_stride

pytestmark = pytest.mark.backends("tensorflow")  # the default backend only: backend-independent or slow

RNG = np.random.default_rng(0)


def _numpy_standardize(kernel, eps, formula="flax"):
    centred = kernel - kernel.mean(axis=(0, 1, 2), keepdims=True)
    if formula == "timm":
        return centred / np.sqrt(kernel.var(axis=(0, 1, 2), keepdims=True) + eps)
    return centred / (kernel.std(axis=(0, 1, 2), keepdims=True) + eps)


def _numpy_same_conv(x, kernel, stride):
    """TF/Flax 'SAME' convolution by loops: pad total (out-1)*s + k - n, the smaller half before."""
    n, h, w, _ = x.shape
    kh, kw, _, cout = kernel.shape
    oh, ow = -(-h // stride), -(-w // stride)
    pad_h, pad_w = max((oh - 1) * stride + kh - h, 0), max((ow - 1) * stride + kw - w, 0)
    xp = np.pad(x, ((0, 0), (pad_h // 2, pad_h - pad_h // 2), (pad_w // 2, pad_w - pad_w // 2), (0, 0)))
    out = np.zeros((n, oh, ow, cout))
    for i in range(oh):
        for j in range(ow):
            window = xp[:, i * stride : i * stride + kh, j * stride : j * stride + kw, :]
            out[:, i, j] = np.einsum("nhwc,hwco->no", window, kernel)
    return out


def _std_conv_1x1(kernel, x, **kwargs):
    conv = StdConv2D(kernel.shape[-1], 1, **kwargs)
    conv.build(x.shape)
    conv.kernel.assign(kernel)
    return np.asarray(conv(x))


@pytest.mark.parametrize("formula", ["flax", "timm"])
@pytest.mark.parametrize("eps", [1e-5, 1e-8])
def test_std_conv_matches_hand_computation(eps, formula):
    # a kernel with a small spread (std ~1e-3), where the epsilon matters
    kernel = (RNG.normal(size=(1, 1, 8, 4)) * 1e-3 + 2e-3).astype("float32")
    x = RNG.normal(size=(2, 5, 5, 8)).astype("float32")
    expected = x @ _numpy_standardize(kernel.astype("float64"), eps, formula)[0, 0]
    y = _std_conv_1x1(kernel, x, epsilon=eps, standardization=formula)
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)


def test_std_conv_defaults_are_the_published_numerics_and_differ_from_timms():
    kernel = (RNG.normal(size=(1, 1, 8, 4)) * 1e-3).astype("float32")
    x = RNG.normal(size=(1, 3, 3, 8)).astype("float32")
    conv = StdConv2D(4, 1)
    assert (conv.epsilon, conv.standardization) == (1e-5, "flax")
    published = np.abs(_std_conv_1x1(kernel, x)).sum()
    # std ~1e-3: dividing by std + 1e-5 instead of std + 1e-8 shrinks the output by ~1 %
    assert 0.98 < published / np.abs(_std_conv_1x1(kernel, x, epsilon=1e-8)).sum() < 0.999
    # timm's sqrt(var + 1e-8) is within ~0.5 % of std here, but not equal to std + 1e-8
    timm = np.abs(_std_conv_1x1(kernel, x, epsilon=1e-8, standardization="timm")).sum()
    assert 0.98 < published / timm < 0.999


@pytest.mark.parametrize("size, stride, kernel_size", [(8, 2, 3), (7, 2, 3), (9, 2, 7), (6, 1, 3)])
def test_std_conv_same_padding_matches_tf_convention(size, stride, kernel_size):
    x = RNG.normal(size=(1, size, size, 3)).astype("float32")
    conv = StdConv2D(5, kernel_size, strides=stride)
    y = np.asarray(conv(x))
    kernel = _numpy_standardize(np.asarray(conv.kernel, dtype="float64"), 1e-5)
    assert y.shape == (1, -(-size // stride), -(-size // stride), 5) == conv.compute_output_shape(x.shape)
    np.testing.assert_allclose(y, _numpy_same_conv(x.astype("float64"), kernel, stride), atol=1e-4)


def test_standardize_kernel_has_zero_mean_unit_std_per_output_channel():
    kernel = RNG.normal(3.0, 2.0, size=(3, 3, 4, 6)).astype("float32")
    w = np.asarray(standardize_kernel(kernel, 0.0))
    np.testing.assert_allclose(w.mean(axis=(0, 1, 2)), 0.0, atol=1e-5)
    np.testing.assert_allclose(w.std(axis=(0, 1, 2)), 1.0, atol=1e-5)


@pytest.mark.parametrize(
    "in_channels, strides, projects",
    [(128, 1, False), (64, 1, True), (128, 2, True)],
)
def test_unit_projects_only_when_the_shape_changes(in_channels, strides, projects):
    unit = BottleneckUnit(32, strides=strides)
    x = RNG.normal(size=(1, 8, 8, in_channels)).astype("float32")
    y = unit(x)
    assert y.shape == (1, 8 // strides, 8 // strides, 128)
    assert (unit.conv_proj is not None) == projects
    keys = set(unit.checkpoint_entries("block1/unit1/"))
    assert ("block1/unit1/conv_proj/kernel" in keys) == projects
    assert ("block1/unit1/gn_proj/scale" in keys) == projects
    assert len(keys) == 9 + 3 * projects
    # the stride sits on the 3x3 conv2 (and the projection), not on conv1
    assert unit.conv1.strides == (1, 1) and unit.conv2.strides == (strides, strides)


def test_fresh_unit_passes_relu_of_its_input():
    """gn3's scale starts at zero, so the residual branch adds only gn3's (zero) bias."""
    unit = BottleneckUnit(32)
    x = RNG.normal(size=(2, 4, 4, 128)).astype("float32")
    np.testing.assert_allclose(np.asarray(unit(x)), np.maximum(x, 0.0), atol=1e-6)
    assert not np.any(np.asarray(unit.gn3.gamma))
    assert np.all(np.asarray(unit.gn1.gamma) == 1.0)


@pytest.mark.parametrize(
    "num_layers, stride, channels",
    [((), 4, 32), ((1,), 4, 128), ((1, 1), 8, 256), ((1, 1, 1), 16, 512), ((1, 1, 1, 1), 32, 1024)],
)
def test_stem_stride_and_channels(num_layers, stride, channels):
    stem = ResNetStem(num_layers, width=32)
    y = stem(RNG.normal(size=(1, 64, 64, 3)).astype("float32"))
    assert (stem.stride, stem.output_channels) == (stride, channels)
    assert y.shape == (1, 64 // stride, 64 // stride, channels) == stem.compute_output_shape((1, 64, 64, 3))
    assert np.all(np.asarray(y) >= 0)  # every unit ends in a relu


def test_stem_npz_key_map_names_every_variable_once():
    stem = ResNetStem((2, 1), width=32)
    stem.build((None, 32, 32, 3))
    entries = stem.npz_key_map()
    unit = [
        "conv1/kernel",
        "gn1/scale",
        "gn1/bias",
        "conv2/kernel",
        "gn2/scale",
        "gn2/bias",
        "conv3/kernel",
        "gn3/scale",
        "gn3/bias",
    ]
    proj = ["conv_proj/kernel", "gn_proj/scale", "gn_proj/bias"]
    expected = {"conv_root/kernel", "gn_root/scale", "gn_root/bias"}
    expected |= {f"block1/unit1/{k}" for k in unit + proj}  # 32 -> 128 channels
    expected |= {f"block1/unit2/{k}" for k in unit}
    expected |= {f"block2/unit1/{k}" for k in unit + proj}  # stride 2
    assert set(entries) == expected
    variables = [id(v) for v, _ in entries.values()]
    assert len(set(variables)) == len(stem.weights) == len(expected)
    assert entries["block2/unit1/conv2/kernel"][0].shape == (3, 3, 64, 64)
    assert entries["block2/unit1/conv_proj/kernel"][0].shape == (1, 1, 128, 256)


def test_stem_npz_transforms_accept_flax_and_bit_layouts():
    stem = ResNetStem((), width=32)
    stem.build((None, 32, 32, 3))
    entries = stem.npz_key_map()
    kernel = RNG.normal(size=(7, 7, 3, 32)).astype("float32")
    scale = RNG.normal(size=(1, 1, 1, 32)).astype("float32")  # BiT stores GroupNorm params as (1, 1, 1, C)
    bias = RNG.normal(size=(32,)).astype("float32")  # the ViT hybrids as (C,)
    for key, value in [("conv_root/kernel", kernel), ("gn_root/scale", scale), ("gn_root/bias", bias)]:
        variable, transform = entries[key]
        variable.assign(transform(value))
    np.testing.assert_array_equal(np.asarray(stem.conv_root.kernel), kernel)
    np.testing.assert_array_equal(np.asarray(stem.gn_root.gamma), scale.reshape(-1))
    np.testing.assert_array_equal(np.asarray(stem.gn_root.beta), bias)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_layers=3), "sequence of positive ints"),
        (dict(num_layers=(2, 0)), "sequence of positive ints"),
        (dict(num_layers="34"), "sequence of positive ints"),
        (dict(num_layers=(2,), width=48), "multiple of 32"),
    ],
)
def test_stem_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ResNetStem(**kwargs)


def test_bad_unit_and_stem_arguments_raise():
    """(``ViT(resnet=...)``, which builds the stem from units per stage or arguments: the hybrids' tests below.)"""
    with pytest.raises(ValueError, match="multiple of 32"):
        BottleneckUnit(40)
    with pytest.raises(ValueError, match="Unknown weight standardization 'torch'"):
        ResNetStem((1,), weight_standardization="torch")
    with pytest.raises(ValueError, match="must be built"):
        ResNetStem((1,), width=32).npz_key_map()


@pytest.mark.parametrize("stages", [(), (1,), (3, 4, 9), (3, 4, 6, 3), (2, 2, 2, 2)])
def test_stem_stride_and_depth_are_the_variants_table(stages):
    stem = ResNetStem(stages, width=32)
    assert stem.stride == resnet_stride(stages) == 4 * 2 ** max(0, len(stages) - 1)
    assert resnet_depth(stages) == 2 + 3 * sum(stages)
    assert (resnet_depth((3, 4, 6, 3)), resnet_depth((3, 4, 9)), resnet_depth((2, 2, 2, 2))) == (50, 50, 26)


def test_epsilons_reach_every_sublayer():
    stem = ResNetStem((1, 1), width=32, **TIMM_RESNET)
    stem.build((None, 32, 32, 3))
    convs = [layer for layer in stem._flatten_layers() if isinstance(layer, StdConv2D)]
    norms = [layer for layer in stem._flatten_layers() if isinstance(layer, keras.layers.GroupNormalization)]
    assert len(convs) == 1 + 2 * 4 and len(norms) == len(convs)
    assert {c.epsilon for c in convs} == {1e-8} and {n.epsilon for n in norms} == {1e-5}
    assert {c.standardization for c in convs} == {"timm"}
    assert {n.groups for n in norms} == {32}


@pytest.mark.parametrize(
    "layer",
    [
        StdConv2D(8, 3, strides=2, epsilon=1e-8, standardization="timm", name="conv"),
        BottleneckUnit(32, strides=2, name="unit", **TIMM_RESNET),
        ResNetStem((1, 1), width=32, name="resnet", **TIMM_RESNET),
    ],
    ids=["StdConv2D", "BottleneckUnit", "ResNetStem"],
)
def test_layers_round_trip_through_their_config(layer):
    x = RNG.normal(size=(1, 16, 16, 32)).astype("float32")
    y = np.asarray(layer(x))
    clone = type(layer).from_config(layer.get_config())
    clone.build(x.shape)
    clone.set_weights(layer.get_weights())
    assert clone.get_config() == layer.get_config()
    np.testing.assert_array_equal(np.asarray(clone(x)), y)


def test_stem_takes_channels_first_images_and_returns_a_channels_first_map():
    x = RNG.normal(size=(1, 3, 40, 24)).astype("float32")
    last, first = ResNetStem((1,), width=32), ResNetStem((1,), width=32, data_format="channels_first")
    expected = np.asarray(last(x.transpose(0, 2, 3, 1))).transpose(0, 3, 1, 2)
    first.build(x.shape)
    first.set_weights(last.get_weights())
    y = first(x)
    assert y.shape == (1, 128, 10, 6) == first.compute_output_shape(x.shape)
    np.testing.assert_allclose(np.asarray(y), expected, atol=1e-5)


def test_stem_gives_the_same_map_under_a_global_channels_first(channels_first):
    """The stem's convolutions and max pool run channels-last whatever ``keras.config.image_data_format()`` says
    (ops.conv and ops.max_pool default to the global layout: they raised under "channels_first")."""
    x = RNG.normal(size=(1, 40, 24, 3)).astype("float32")
    stem = ResNetStem((1,), width=32)
    under_channels_first = np.asarray(stem(x))
    keras.config.set_image_data_format("channels_last")  # the fixture restores its own setting after
    np.testing.assert_array_equal(under_channels_first, np.asarray(stem(x)))
    assert under_channels_first.shape == (1, 10, 6, 128)


# === the hybrids: ResNet feature map + ViT ==========================================================================
# (tests/test_hybrid.py until it joined this file; its file-level mark was this file's, the TensorFlow pass only.)

REFERENCE = Path(__file__).parents[1] / "reference" / "timm_hybrid.py"
CONSTRUCTORS = {
    "R50+B/16": keras_vit.ViT_R50_B16,
    "R50+L/32": keras_vit.ViT_R50_L32,
    "R26+S/32": keras_vit.ViT_R26_S32,
    "R26+B/32": keras_vit.ViT_R26_B32,
}


def _resnet_features(model, images):
    stem = model.get_layer("resnet")
    return keras.ops.convert_to_numpy(keras.Model(model.input, stem.output)(images))


# --- parameter counts -----------------------------------------------------------------------------

# Measured from timm 1.0.31 in a subprocess (tests/reference/timm_hybrid.py, kwargs
# num_classes=1000, img_size=224 / 384) for vit_base_r50_s16_224, vit_large_r50_s32_224 and
# vit_small_r26_s32_224; written here as the reference values.
TIMM_PARAMS = {
    ("R26+S/32", 224): 36_431_912,
    ("R26+S/32", 384): 36_468_392,
    ("R50+B/16", 224): 98_659_112,
    ("R50+B/16", 384): 98_950_952,
    ("R50+L/32", 224): 328_994_856,
    ("R50+L/32", 384): 329_092_136,
}
_FAST_FULL_BUILDS = {("R26+S/32", 224)}  # the others take up to a minute to build: slow tier


@pytest.mark.parametrize(
    "name, image_size",
    [pytest.param(*key, marks=[] if key in _FAST_FULL_BUILDS else [pytest.mark.slow]) for key in TIMM_PARAMS],
)
def test_parameter_count_equals_timms(name, image_size):
    model = CONSTRUCTORS[name](image_size)
    assert model.count_params() == TIMM_PARAMS[(name, image_size)]
    assert model.name == "vit_" + name.lower().replace("+", "_").replace("/", "")  # e.g. vit_r50_b16


@pytest.mark.parametrize("name, image_size", list(TIMM_PARAMS))
def test_parameter_count_equals_timms_from_a_one_block_build(name, image_size):
    """Fast for every hybrid: the model with one block, plus ``depth - 1`` more blocks of the same size."""
    one_block = CONSTRUCTORS[name](image_size, depth=1)
    block = one_block.get_layer("encoderblock_0").count_params()
    depth = keras_vit.parse_variant(name).depth
    assert one_block.count_params() + (depth - 1) * block == TIMM_PARAMS[(name, image_size)]
    keras.backend.clear_session()


def test_resnet_parameter_count_of_r50_b16():
    """The ResNet alone: timm's 98,659,112 minus ViT-B/16's transformer and the 1x1 embedding."""
    stem = keras_vit.ResNetStem((3, 4, 9))
    stem.build((None, 224, 224, 3))
    vit_b16_without_patch_embedding = 86_567_656 - (16 * 16 * 3 * 768 + 768)
    assert stem.count_params() == 98_659_112 - vit_b16_without_patch_embedding - (1024 * 768 + 768)


# --- shapes ---------------------------------------------------------------------------------------


SHAPES = [("R50+B/16", 16, 1024, 768), ("R26+S/32", 32, 2048, 384), ("R50+L/32", 32, 2048, 1024)]


def _check_shapes(name, stride, channels, hidden, image_size, run):
    model = CONSTRUCTORS[name](image_size, depth=1, include_top=False)
    grid = image_size // stride
    assert model.get_layer("resnet").output.shape == (None, grid, grid, channels)
    assert model.get_layer("embedding").kernel.shape == (1, 1, channels, hidden)
    assert model.output.shape == (None, 1 + grid * grid, hidden)
    if run:
        images = np.random.default_rng(1).uniform(-1, 1, (1, image_size, image_size, 3)).astype("float32")
        assert _resnet_features(model, images).shape == (1, grid, grid, channels)
        tokens = keras.ops.convert_to_numpy(model(images))
        assert tokens.shape == (1, 1 + grid * grid, hidden)
        assert np.all(np.isfinite(tokens))


@pytest.mark.parametrize("image_size", [224, 384])
@pytest.mark.parametrize(
    "name, stride, channels, hidden", [*SHAPES[:2], pytest.param(*SHAPES[2], marks=pytest.mark.slow)]
)
def test_output_shapes(name, stride, channels, hidden, image_size):
    """Symbolic shapes at 224 and 384, and a real run at 224 (runs at 384: the slow test below)."""
    _check_shapes(name, stride, channels, hidden, image_size, run=image_size == 224)


@pytest.mark.slow
@pytest.mark.parametrize("name, stride, channels, hidden", SHAPES)
def test_output_shapes_of_a_run_at_384(name, stride, channels, hidden):
    _check_shapes(name, stride, channels, hidden, 384, run=True)


def test_constructors_accept_every_vit_option():
    model = keras_vit.ViT_R26_S32(
        64,
        num_classes=7,
        classifier="gap",
        representation_size=16,
        dropout=0.1,
        attention_dropout=0.1,
        drop_path=0.1,
        gelu="exact",
        depth=2,
        hidden_size=32,
        num_heads=2,
        mlp_dim=64,
        name="small_hybrid",
        classifier_activation="softmax",
    )
    assert model.name == "small_hybrid"
    assert model.get_layer("pre_logits").units == 16 and model.get_layer("head").units == 7
    assert model.get_layer("posembed_input").pos_embedding.shape == (1, 4, 32)  # gap: no class token, 2x2 grid
    probs = keras.ops.convert_to_numpy(model(np.zeros((2, 64, 64, 3), "float32")))
    np.testing.assert_allclose(probs.sum(axis=-1), 1.0, atol=1e-5)
    features = keras_vit.ViT_R26_S32(
        128, include_top=False, pooling="avg", depth=1, hidden_size=32, num_heads=2, mlp_dim=64
    )
    assert features.output.shape == (None, 32)
    attention = keras_vit.attention_model(features)
    assert [tuple(a.shape) for a in attention.outputs] == [(None, 2, 17, 17)]  # class token + a 4x4 grid


def test_vit_builder_makes_hybrids_from_any_resnet():
    """``ViT(resnet=...)``: the patch size applies to the map; () keeps only the root (stride 4)."""
    model = keras_vit.ViT("Ti/16", image_size=64, patch_size=2, depth=1, resnet={"num_layers": (), "width": 32})
    assert model.get_layer("resnet").stride == 4 and model.name == "vit_r2_ti8"
    assert model.get_layer("embedding").kernel.shape == (2, 2, 32, 192)
    assert model.get_layer("posembed_input").grid_size == (8, 8)  # 64 / (4 * 2)
    assert model(np.zeros((1, 64, 64, 3), "float32")).shape == (1, 1000)


# --- the variants table --------------------------------------------------------------------------

# variant -> (ResNet units per stage, channels of its map, encoder width, heads, MLP), from the paper and vit_jax
HYBRIDS = {
    "R50+B/16": ((3, 4, 9), 1024, 768, 12, 3072),
    "R50+L/32": ((3, 4, 6, 3), 2048, 1024, 16, 4096),
    "R26+S/32": ((2, 2, 2, 2), 2048, 384, 6, 1536),
    "R26+B/32": ((2, 2, 2, 2), 2048, 768, 12, 3072),
}


def _check_hybrid(model, variant, image_size=64):
    stages, channels, width, heads, mlp = HYBRIDS[variant]
    stem, block = model.get_layer("resnet"), model.get_layer("encoderblock_0")
    assert stem.num_layers == stages and stem.output_channels == channels
    assert model.get_layer("embedding").kernel.shape == (1, 1, channels, width)  # patch size 1 on the map
    assert (block.num_heads, block.mlp_dim) == (heads, mlp)
    grid = image_size // int(variant.rpartition("/")[2])
    assert model.get_layer("posembed_input").grid_size == (grid, grid)
    assert model.name == "vit_" + variant.lower().replace("+", "_").replace("/", "")


@pytest.mark.parametrize("variant", list(HYBRIDS))
def test_the_named_hybrid_constructors_build_the_tables_hybrids(variant):
    _check_hybrid(CONSTRUCTORS[variant](64, depth=1), variant)
    keras.backend.clear_session()


@pytest.mark.parametrize(
    "name, variant",
    [("R50+B/16", "R50+B/16"), ("ViT_R26_S32", "R26+S/32"), ("R50+ViT-L/32", "R50+L/32"), ("vit_r26_b32", "R26+B/32")],
)
def test_vit_builds_hybrids_by_name(name, variant):
    """``ViT("R50+B/16")``: the ResNet's stages from the table, patch size 1; every spelling of the name."""
    assert keras_vit.parse_variant(name) == keras_vit.parse_variant(variant)
    if name in ("R50+B/16", "ViT_R26_S32"):  # building each spelling again would only repeat the above
        _check_hybrid(keras_vit.ViT(name, image_size=64, depth=1), variant)


def test_the_hybrid_constructors_keep_their_resnet_numerics():
    model = keras_vit.ViT_R26_B32(64, depth=1, **TIMM_RESNET)
    stem = model.get_layer("resnet")
    assert (stem.std_conv_epsilon, stem.group_norm_epsilon, stem.weight_standardization) == (1e-8, 1e-5, "timm")
    stem = keras_vit.ViT_R26_B32(64, depth=1).get_layer("resnet")
    assert (stem.std_conv_epsilon, stem.group_norm_epsilon, stem.weight_standardization) == (1e-5, 1e-6, "flax")
    with pytest.raises(TypeError, match="unexpected keyword arguments"):
        keras_vit.ViT_B32(64, std_conv_epsilon=1e-8)  # a plain ViT has no ResNet


def test_vit_resnet_argument_sets_the_stem():
    """``resnet=`` as units per stage or as ResNetStem arguments; a hybrid variant's stages are the default."""
    small = dict(image_size=32, patch_size=1, depth=1, hidden_size=32, num_heads=2, mlp_dim=64)
    assert keras_vit.ViT("S/32", resnet=(1, 2), **small).get_layer("resnet").num_layers == (1, 2)
    stem = keras_vit.ViT(
        "S/32", resnet={"num_layers": [1], "std_conv_epsilon": 1e-8, "width": 32}, **{**small, "image_size": 16}
    ).get_layer("resnet")
    assert stem.std_conv_epsilon == 1e-8 and stem.num_layers == (1,)
    stem = keras_vit.ViT("R26+S/32", resnet={"width": 32}, **small).get_layer("resnet")
    assert stem.num_layers == (2, 2, 2, 2) and stem.width == 32
    with pytest.raises(ValueError, match="needs 'num_layers'"):
        keras_vit.ViT("S/16", resnet={"width": 32}, **small)


def test_model_from_checkpoint_names_hybrids_from_the_table():
    """An R26 ResNet and a Ti encoder (12 blocks, 192 wide): named from the table's ResNet depth and size."""
    arrays = flax_hybrid_checkpoint(
        9, num_layers=(2, 2, 2, 2), width=64, hidden=192, depth=12, heads=3, mlp=768, grid=2, num_classes=3
    )
    model = keras_vit.model_from_checkpoint(arrays)
    assert model.name == "vit_r26_ti32" and model.input_shape == (None, 64, 64, 3)
    assert model.get_layer("resnet").num_layers == (2, 2, 2, 2)


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: keras_vit.ViT_R50_B16(200), "not divisible by the ResNet stride 16 x patch size 1 = 16"),
        (lambda: keras_vit.ViT_R26_S32(224, patch_size=2), "stride 32 x patch size 2 = 64"),
        (lambda: keras_vit.ViT("B/16", resnet=(3, 4, 9)), "ResNet stride 16 x patch size 16 = 256"),
        (lambda: keras_vit.ViT("S/16", image_size=32, resnet=(1, 0)), "positive ints"),
    ],
)
def test_bad_hybrid_arguments_raise(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_constructor_refuses_another_resnet():
    with pytest.raises(TypeError, match="fixes the ResNet"):
        keras_vit.ViT_R26_S32(64, resnet=(1, 1))


# --- checkpoints ----------------------------------------------------------------------------------

SMALL = dict(num_layers=(1, 2), width=32, hidden=32, depth=1, heads=2, mlp=64, num_classes=5)


def _small_hybrid(image_size, **kwargs):
    kwargs.setdefault("num_classes", 5)
    return keras_vit.ViT(
        "S/32",
        image_size=image_size,
        patch_size=1,
        depth=1,
        hidden_size=32,
        num_heads=2,
        mlp_dim=64,
        resnet={"num_layers": (1, 2), "width": 32},
        **kwargs,
    )


def test_loader_fills_every_resnet_variable_from_a_checkpoint():
    arrays = flax_hybrid_checkpoint(3, grid=4, **SMALL)
    model = _small_hybrid(32)  # stride 8: a 4x4 grid
    result = load_weights(model, arrays)
    assert set(result.loaded) == set(arrays) and not result.skipped
    stem = model.get_layer("resnet")
    np.testing.assert_array_equal(np.asarray(stem.conv_root.kernel), arrays["conv_root/kernel"])
    np.testing.assert_array_equal(np.asarray(stem.gn_root.gamma), arrays["gn_root/scale"].reshape(-1))
    unit = stem.units[1]  # block2/unit1 (after block1/unit1)
    assert unit.name == "block2_unit1"
    np.testing.assert_array_equal(np.asarray(unit.conv_proj.kernel), arrays["block2/unit1/conv_proj/kernel"])
    np.testing.assert_array_equal(np.asarray(unit.gn3.beta), arrays["block2/unit1/gn3/bias"])


def test_loader_resizes_position_embeddings_of_a_hybrid():
    arrays = flax_hybrid_checkpoint(4, grid=4, **SMALL)
    model = _small_hybrid(64)  # an 8x8 grid
    load_weights(model, arrays)
    pos = np.asarray(model.get_layer("posembed_input").pos_embedding)
    assert pos.shape == (1, 65, 32)
    np.testing.assert_array_equal(pos[0, 0], arrays["Transformer/posembed_input/pos_embedding"][0, 0])
    np.testing.assert_array_equal(
        np.asarray(model.get_layer("resnet").units[-1].conv2.kernel), arrays["block2/unit2/conv2/kernel"]
    )


def test_loader_names_missing_and_unexpected_resnet_keys():
    arrays = flax_hybrid_checkpoint(5, grid=4, **SMALL)
    del arrays["block2/unit2/conv2/kernel"]
    arrays["block3/unit1/conv1/kernel"] = np.zeros((1, 1, 128, 128), "float32")
    model = _small_hybrid(32)
    before = [np.asarray(w) for w in model.weights]
    with pytest.raises(
        ValueError, match=r"(?s)missing.*block2/unit2/conv2/kernel.*unexpected.*block3/unit1/conv1/kernel"
    ):
        load_weights(model, arrays)
    assert all(np.array_equal(a, np.asarray(w)) for a, w in zip(before, model.weights))


def test_constructor_loads_weights_by_path(tmp_path):
    arrays = flax_hybrid_checkpoint(6, grid=2, **SMALL)
    path = tmp_path / "hybrid.npz"
    np.savez(path, **arrays)
    model = _small_hybrid(None, num_classes=None, weights=str(path))
    # the checkpoint's resolution (a 2x2 grid at the ResNet's stride 8) and classes
    assert model.input_shape == (None, 16, 16, 3) and model.output_shape == (None, 5)
    np.testing.assert_array_equal(np.asarray(model.get_layer("head").bias), arrays["head/bias"])
    np.testing.assert_array_equal(
        np.asarray(model.get_layer("resnet").units[0].gn_proj.gamma), arrays["block1/unit1/gn_proj/scale"]
    )


# --- saving ---------------------------------------------------------------------------------------


def test_keras_file_round_trip_gives_identical_outputs(tmp_path):
    model = _small_hybrid(32, gelu="exact")
    load_weights(model, flax_hybrid_checkpoint(7, grid=4, **SMALL))  # gn3 scales non-zero
    stem_config = model.get_layer("resnet").get_config()
    images = np.random.default_rng(2).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    path = tmp_path / "hybrid.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded.get_layer("resnet"), keras_vit.ResNetStem)
    assert loaded.get_layer("resnet").get_config() == stem_config
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(loaded(images)), keras.ops.convert_to_numpy(model(images)))
    assert set(loaded.get_layer("resnet").npz_key_map()) == set(model.get_layer("resnet").npz_key_map())


# --- parity with timm -----------------------------------------------------------------------------

# Full ResNets as published, a shallow and narrow transformer (timm's hybrid names, reduced by kwargs).
R26 = dict(timm="vit_small_r26_s32_224", num_layers=(2, 2, 2, 2), stride=32)
PARITY_CASES = {"R26+S/32": R26, "R50+B/16": dict(timm="vit_base_r50_s16_224", num_layers=(3, 4, 9), stride=16)}
SMALL_KERNELS = "R26+S/32, kernels of spread ~1e-3"
PARITY = dict(image_size=64, hidden=64, depth=2, heads=2, mlp=128, num_classes=10)


def _our_parity_model(name, **resnet_numerics):
    return CONSTRUCTORS[name](
        PARITY["image_size"],
        num_classes=PARITY["num_classes"],
        depth=PARITY["depth"],
        hidden_size=PARITY["hidden"],
        num_heads=PARITY["heads"],
        mlp_dim=PARITY["mlp"],
        gelu="exact",
        **resnet_numerics,
    )


@pytest.fixture(scope="module")
def timm_parity(tmp_path_factory):
    """Runs timm once (in a subprocess) on every parity case; returns the checkpoints, images and outputs."""
    folder = tmp_path_factory.mktemp("timm_hybrid")
    size = PARITY["image_size"]
    images = np.random.default_rng(8).uniform(-1, 1, (2, size, size, 3)).astype("float32")
    np.savez(folder / "images.npz", images=images)
    jobs, cases = [], {}
    for i, (name, case) in enumerate({**PARITY_CASES, SMALL_KERNELS: dict(R26, kernel_scale=1e-3)}.items()):
        grid = PARITY["image_size"] // case["stride"]
        arrays = flax_hybrid_checkpoint(
            10 + i,
            num_layers=case["num_layers"],
            width=64,
            grid=grid,
            kernel_scale=case.get("kernel_scale"),
            **{k: PARITY[k] for k in ("hidden", "depth", "heads", "mlp", "num_classes")},
        )
        checkpoint, output = folder / f"checkpoint_{i}.npz", folder / f"timm_{i}.npz"
        np.savez(checkpoint, **arrays)
        kwargs = dict(
            img_size=PARITY["image_size"],
            num_classes=PARITY["num_classes"],
            embed_dim=PARITY["hidden"],
            depth=PARITY["depth"],
            num_heads=PARITY["heads"],
            mlp_ratio=PARITY["mlp"] / PARITY["hidden"],
        )
        jobs.append(
            dict(
                model=case["timm"],
                kwargs=kwargs,
                checkpoint=str(checkpoint),
                images=str(folder / "images.npz"),
                output=str(output),
            )
        )
        cases[name] = (checkpoint, output)
    (folder / "jobs.json").write_text(json.dumps(jobs))
    run_reference(REFERENCE.read_text(), folder / "jobs.json")
    return images, {name: (checkpoint, dict(np.load(output))) for name, (checkpoint, output) in cases.items()}


@pytest.mark.reference
@pytest.mark.requires("timm", "torch")
@pytest.mark.parametrize("name", list(PARITY_CASES))
def test_parity_with_timm(timm_parity, name):
    images, cases = timm_parity
    checkpoint, reference = cases[name]
    model = _our_parity_model(name, **TIMM_RESNET)
    load_weights(model, str(checkpoint))
    assert model.count_params() == int(reference["num_params"])
    features = _resnet_features(model, images)
    assert features.shape == reference["resnet"].shape
    scale = np.abs(reference["resnet"]).max()
    assert np.abs(features - reference["resnet"]).max() <= 1e-4 * scale
    logits = keras.ops.convert_to_numpy(model(images))
    assert np.abs(reference["logits"]).max() > 0.5  # the head is not degenerate
    assert np.abs(logits - reference["logits"]).max() <= 1e-4


@pytest.mark.reference
@pytest.mark.requires("timm", "torch")
def test_published_numerics_differ_measurably_from_timms(timm_parity):
    """Our defaults are the Flax code's (``(w - m) / (std + 1e-5)``, GroupNorm 1e-6), not timm's
    (``(w - m) / sqrt(var + 1e-8)``, GroupNorm 1e-5): with kernels of small spread the standardisation
    rescales channels unevenly, which GroupNorm cannot undo."""
    images, cases = timm_parity
    checkpoint, reference = cases[SMALL_KERNELS]
    arrays = dict(np.load(checkpoint))
    settings = {
        "timm": TIMM_RESNET,
        "published": {},
        "flax formula, timm epsilons": dict(TIMM_RESNET, weight_standardization="flax"),
    }
    errors = {}
    for label, numerics in settings.items():
        stem = keras_vit.ResNetStem(R26["num_layers"], **numerics)
        stem.build(images.shape)
        for key, (variable, transform) in stem.npz_key_map().items():
            variable.assign(transform(arrays[key]))
        features = keras.ops.convert_to_numpy(stem(images))
        errors[label] = np.abs(features - reference["resnet"]).max() / np.abs(reference["resnet"]).max()
    assert errors["timm"] <= 1e-4
    assert errors["published"] > 1e-2
    assert errors["flax formula, timm epsilons"] > 1e-2


def test_model_from_checkpoint_reads_the_resnet_width_from_the_file():
    """A hybrid whose ResNet is 32 channels wide at the root (not the published 64): built at that width and loaded
    whole, with no ``resnet_options``; a width given explicitly still wins (and then the file does not fit)."""
    arrays = flax_hybrid_checkpoint(6, grid=4, **SMALL)
    model = keras_vit.model_from_checkpoint(arrays, image_size=32)
    stem = model.get_layer("resnet")
    assert (stem.width, stem.num_layers) == (32, (1, 2))
    np.testing.assert_array_equal(np.asarray(stem.units[-1].conv2.kernel), arrays["block2/unit2/conv2/kernel"])
    with pytest.raises(ValueError, match="conv_root/kernel"):
        keras_vit.model_from_checkpoint(arrays, image_size=32, resnet_options={"width": 64})
