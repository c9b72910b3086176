"""The BiT ResNet (weight-standardised convolutions, GroupNorm) that the hybrids put before the ViT, layers named
as in the Flax checkpoints. See docs/hybrids.md."""

from __future__ import annotations

from collections.abc import Sequence

import keras
import numpy as np
from keras import layers, ops

from keras_vit.checks import check_choice
from keras_vit.config import GROUP_NORM_EPSILON, ROOT_WIDTH, STD_CONV_EPSILON, WEIGHT_STANDARDIZATIONS
from keras_vit.layers import (
    TO_CHANNELS_FIRST,
    KeyMap,
    _pair,
    add_conv_kernel,
    channels_last_shape,
    check_data_format,
    conv_nhwc,
    format_shape,
    norm_policy,
    to_channels_last,
)
from keras_vit.variants import resnet_stride

__all__ = [
    "GROUP_NORM_EPSILON",
    "STD_CONV_EPSILON",
    "TIMM_RESNET",
    "BottleneckUnit",
    "ResNetStem",
    "StdConv2D",
    "standardize_kernel",
]

GROUP_NORM_GROUPS = 32
STANDARDIZATIONS = WEIGHT_STANDARDIZATIONS
# ResNet settings that reproduce timm's hybrids (StdConv2dSame(eps=1e-8), GroupNormAct(eps=1e-5)).
TIMM_RESNET = dict(std_conv_epsilon=1e-8, group_norm_epsilon=1e-5, weight_standardization="timm")


def standardize_kernel(kernel, epsilon: float, formula: str = "flax"):
    """Standardise an HWIO kernel per output channel over (H, W, Cin): ``"flax"`` ``(w - mean) / (std + epsilon)``,
    ``"timm"`` ``(w - mean) / sqrt(var + epsilon)`` (docs/hybrids.md)."""
    _check_standardization(formula)
    mean = ops.mean(kernel, axis=(0, 1, 2), keepdims=True)
    if formula == "timm":
        return (kernel - mean) * ops.rsqrt(ops.var(kernel, axis=(0, 1, 2), keepdims=True) + epsilon)
    return (kernel - mean) / (ops.std(kernel, axis=(0, 1, 2), keepdims=True) + epsilon)


def _check_standardization(formula: str) -> str:
    return check_choice(formula, STANDARDIZATIONS, "weight standardization")


@keras.saving.register_keras_serializable(package="keras_vit")
class StdConv2D(layers.Layer):
    """A bias-free, ``SAME``-padded 2-D convolution with a weight-standardised kernel (:func:`standardize_kernel`)."""

    def __init__(
        self,
        filters: int,
        kernel_size: int | tuple[int, int],
        strides: int | tuple[int, int] = 1,
        epsilon: float = STD_CONV_EPSILON,
        standardization: str = "flax",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if int(filters) < 1:
            raise ValueError(f"StdConv2D needs filters >= 1, got {filters!r}.")
        self.filters = int(filters)
        self.kernel_size = _pair(kernel_size, "kernel_size")
        self.strides = _pair(strides, "strides")
        self.epsilon = float(epsilon)
        self.standardization = _check_standardization(standardization)

    def build(self, input_shape):
        self.kernel = add_conv_kernel(self, input_shape, self.kernel_size, self.filters)

    def call(self, x):
        kernel = ops.cast(standardize_kernel(self.kernel, self.epsilon, self.standardization), x.dtype)
        return conv_nhwc(x, kernel, self.strides, "same")  # an empty batch gives an empty output

    def compute_output_shape(self, input_shape):
        b, h, w, _ = input_shape
        return (b, _ceil_div(h, self.strides[0]), _ceil_div(w, self.strides[1]), self.filters)

    def get_config(self):
        return {
            **super().get_config(),
            "filters": self.filters,
            "kernel_size": self.kernel_size,
            "strides": self.strides,
            "epsilon": self.epsilon,
            "standardization": self.standardization,
        }


def _ceil_div(size: int | None, stride: int) -> int | None:
    return None if size is None else -(-size // stride)


def group_norm(name: str, epsilon: float, zero_scale: bool = False, dtype=None) -> layers.GroupNormalization:
    """GroupNorm with 32 groups, as in BiT; ``zero_scale`` zero-initialises gamma (``gn3``)."""
    return layers.GroupNormalization(
        groups=GROUP_NORM_GROUPS,
        epsilon=epsilon,
        gamma_initializer="zeros" if zero_scale else "ones",
        name=name,
        dtype=norm_policy(dtype),
    )


def _conv_norm_entries(prefix: str, pairs) -> KeyMap:
    """Checkpoint entries of ``(conv, norm)`` pairs: ``{prefix}{conv}/kernel`` (HWIO in Flax and Keras alike),
    ``{prefix}{norm}/{scale,bias}`` (stored as ``(C,)`` or ``(1, 1, 1, C)``)."""
    entries: KeyMap = {}
    for conv, norm in pairs:
        entries[f"{prefix}{conv.name}/kernel"] = (conv.kernel, np.asarray)
        entries[f"{prefix}{norm.name}/scale"] = (norm.gamma, np.ravel)
        entries[f"{prefix}{norm.name}/bias"] = (norm.beta, np.ravel)
    return entries


_NUMERICS = ("std_conv_epsilon", "group_norm_epsilon", "weight_standardization")


class _BiTLayer(layers.Layer):
    """A layer of :class:`StdConv2D` and GroupNorm sub-layers sharing the numerics of :data:`_NUMERICS`."""

    def _set_numerics(self, std_conv_epsilon, group_norm_epsilon, weight_standardization: str) -> None:
        self.std_conv_epsilon = float(std_conv_epsilon)
        self.group_norm_epsilon = float(group_norm_epsilon)
        self.weight_standardization = weight_standardization  # checked by the StdConv2D layers built

    def _numerics(self) -> dict:
        return {name: getattr(self, name) for name in _NUMERICS}

    def _conv(self, filters: int, kernel_size: int, name: str, strides: int = 1) -> StdConv2D:
        standardization, policy = self.weight_standardization, self.dtype_policy
        return StdConv2D(filters, kernel_size, strides, self.std_conv_epsilon, standardization, name=name, dtype=policy)

    def _norm(self, name: str, zero_scale: bool = False) -> layers.GroupNormalization:
        return group_norm(name, self.group_norm_epsilon, zero_scale, self.dtype_policy)


@keras.saving.register_keras_serializable(package="keras_vit")
class BottleneckUnit(_BiTLayer):
    """A post-activation bottleneck unit, width ``features``, ``4 * features`` out: ``relu(shortcut(x) + branch(x))``,
    the shortcut a strided ``conv_proj`` + ``gn_proj`` where the shape changes; ``gn3``'s scale starts at zero."""

    def __init__(
        self,
        features: int,
        strides: int = 1,
        std_conv_epsilon: float = STD_CONV_EPSILON,
        group_norm_epsilon: float = GROUP_NORM_EPSILON,
        weight_standardization: str = "flax",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if int(features) < 1 or int(features) % GROUP_NORM_GROUPS:
            raise ValueError(
                f"BottleneckUnit features must be a positive multiple of {GROUP_NORM_GROUPS}, got {features!r}."
            )
        if int(strides) < 1:
            raise ValueError(f"BottleneckUnit strides must be >= 1, got {strides!r}.")
        self.features = int(features)
        self.strides = int(strides)
        self._set_numerics(std_conv_epsilon, group_norm_epsilon, weight_standardization)
        self.conv1, self.gn1 = self._conv(self.features, 1, "conv1"), self._norm("gn1")
        self.conv2, self.gn2 = self._conv(self.features, 3, "conv2", self.strides), self._norm("gn2")
        self.conv3, self.gn3 = self._conv(4 * self.features, 1, "conv3"), self._norm("gn3", zero_scale=True)
        self.conv_proj = self.gn_proj = None

    def build(self, input_shape):
        out_channels = 4 * self.features
        if input_shape[-1] != out_channels or self.strides != 1:
            self.conv_proj = self._conv(out_channels, 1, "conv_proj", self.strides)
            self.gn_proj = self._norm("gn_proj")
            self.conv_proj.build(input_shape)
            self.gn_proj.build(self.conv_proj.compute_output_shape(input_shape))
        shape = input_shape
        for conv, norm in self._pairs():
            conv.build(shape)
            shape = conv.compute_output_shape(shape)
            norm.build(shape)

    def _pairs(self):
        return ((self.conv1, self.gn1), (self.conv2, self.gn2), (self.conv3, self.gn3))

    def call(self, x):
        shortcut = x if self.conv_proj is None else self.gn_proj(self.conv_proj(x))
        y = ops.relu(self.gn1(self.conv1(x)))
        y = ops.relu(self.gn2(self.conv2(y)))
        y = self.gn3(self.conv3(y))
        return ops.relu(shortcut + y)

    def compute_output_shape(self, input_shape):
        b, h, w, _ = input_shape
        return (b, _ceil_div(h, self.strides), _ceil_div(w, self.strides), 4 * self.features)

    def checkpoint_entries(self, prefix: str) -> KeyMap:
        """This unit's ``.npz`` entries under ``prefix`` (e.g. ``"block1/unit1/"``)."""
        pairs = list(self._pairs())
        if self.conv_proj is not None:
            pairs.append((self.conv_proj, self.gn_proj))
        return _conv_norm_entries(prefix, pairs)

    def get_config(self):
        return {
            **super().get_config(),
            "features": self.features,
            "strides": self.strides,
            **self._numerics(),
        }


@keras.saving.register_keras_serializable(package="keras_vit")
class ResNetStem(_BiTLayer):
    """The hybrids' ResNet: the root block, then ``len(num_layers)`` stages of bottleneck units (stages, stride and
    channels: docs/hybrids.md).

    Args: ``num_layers``: units per stage (``()``: the root only); ``width``: root channels, a multiple of 32;
    ``std_conv_epsilon`` (1e-5; timm 1e-8), ``group_norm_epsilon`` (1e-6; timm 1e-5), ``weight_standardization``
    (``"flax"`` or ``"timm"``, :func:`standardize_kernel`): the published numerics, or :data:`TIMM_RESNET`'s;
    ``data_format``: the layout of the images and of the map returned (the layers inside are channels-last)."""

    def __init__(
        self,
        num_layers: Sequence[int] = (3, 4, 9),
        width: int = ROOT_WIDTH,
        std_conv_epsilon: float = STD_CONV_EPSILON,
        group_norm_epsilon: float = GROUP_NORM_EPSILON,
        weight_standardization: str = "flax",
        data_format: str = "channels_last",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.data_format = check_data_format(data_format)
        if (
            isinstance(num_layers, (str, bytes))
            or not isinstance(num_layers, Sequence)
            or not all(isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n >= 1 for n in num_layers)
        ):
            raise ValueError(f"num_layers must be a sequence of positive ints (units per stage), got {num_layers!r}.")
        if not isinstance(width, int) or width < 1 or width % GROUP_NORM_GROUPS:
            raise ValueError(
                f"width must be a positive multiple of {GROUP_NORM_GROUPS} (GroupNorm groups), got {width!r}."
            )
        self.num_layers = tuple(int(n) for n in num_layers)
        self.width = width
        self._set_numerics(std_conv_epsilon, group_norm_epsilon, weight_standardization)
        self.conv_root, self.gn_root = self._conv(width, 7, "conv_root", 2), self._norm("gn_root")
        self.unit_prefixes = []
        self.units = []
        for stage, units in enumerate(self.num_layers):
            for unit in range(units):
                self.unit_prefixes.append(f"block{stage + 1}/unit{unit + 1}/")
                strides = 2 if stage > 0 and unit == 0 else 1
                name = f"block{stage + 1}_unit{unit + 1}"
                self.units.append(
                    BottleneckUnit(width * 2**stage, strides, **self._numerics(), name=name, dtype=self.dtype_policy)
                )

    @property
    def stride(self) -> int:
        """How many times smaller than the image the output map is."""
        return resnet_stride(self.num_layers)

    @property
    def output_channels(self) -> int:
        return self.width if not self.num_layers else 4 * self.width * 2 ** (len(self.num_layers) - 1)

    def build(self, input_shape):
        input_shape = channels_last_shape(input_shape, self.data_format)
        self.conv_root.build(input_shape)
        shape = self.conv_root.compute_output_shape(input_shape)
        self.gn_root.build(shape)
        shape = (shape[0], _ceil_div(shape[1], 2), _ceil_div(shape[2], 2), shape[3])
        for unit in self.units:
            unit.build(shape)
            shape = unit.compute_output_shape(shape)

    def call(self, images):
        x = ops.relu(self.gn_root(self.conv_root(to_channels_last(images, self.data_format))))
        x = ops.max_pool(x, pool_size=3, strides=2, padding="same", data_format="channels_last")
        for unit in self.units:
            x = unit(x)
        return ops.transpose(x, TO_CHANNELS_FIRST) if self.data_format == "channels_first" else x

    def compute_output_shape(self, input_shape):
        b, h, w, _ = channels_last_shape(input_shape, self.data_format)
        shape = (b, _ceil_div(h, self.stride), _ceil_div(w, self.stride), self.output_channels)
        return format_shape(shape, self.data_format)

    def npz_key_map(self) -> KeyMap:
        """Map each Flax ``.npz`` key of the ResNet (``conv_root/kernel``, ``gn_root/scale``,
        ``block1/unit1/conv1/kernel``, ...) to ``(variable, transform)``, for the weights loader."""
        if not self.built:
            raise ValueError(f"ResNetStem {self.name!r} must be built before its checkpoint keys are known.")
        entries = _conv_norm_entries("", [(self.conv_root, self.gn_root)])
        for prefix, unit in zip(self.unit_prefixes, self.units):
            entries.update(unit.checkpoint_entries(prefix))
        return entries

    def get_config(self):
        return {
            **super().get_config(),
            "num_layers": list(self.num_layers),
            "width": self.width,
            **self._numerics(),
            "data_format": self.data_format,
        }
