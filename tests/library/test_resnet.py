"""The BiT ResNet layers of the hybrids: weight standardisation, SAME padding, units, the stem's keys."""

import keras
import numpy as np
import pytest

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
    """(``ViT(resnet=...)``, which builds the stem from units per stage or arguments: tests/test_hybrid.py.)"""
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
