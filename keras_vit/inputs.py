"""keras.applications' spellings of a model's input (``input_shape``, ``input_tensor``, ``classes``, ``data_format``)
turned into the config's ``image_size``, ``channels``, ``num_classes`` and ``data_format``; a built model's input read
back (:func:`model_data_format`, :func:`model_image_shape`)."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from keras_vit.layers import TO_CHANNELS_FIRST, ChannelsLast, channels_last_shape, check_data_format


def image_data_format(data_format: str | None) -> str:
    """``data_format``, ``None`` being ``keras.config.image_data_format()``; a ``ValueError`` for another value."""
    return check_data_format(keras.config.image_data_format() if data_format is None else data_format)


def model_data_format(model: keras.Model) -> str:
    """The layout of ``model``'s images: ``"channels_first"`` where its graph turns them channels-last first (a
    :class:`~keras_vit.layers.ChannelsLast` step, as a channels-first keras-vit model has), else ``"channels_last"``."""
    steps = model._flatten_layers(include_self=False)
    return "channels_first" if any(isinstance(step, ChannelsLast) for step in steps) else "channels_last"


def model_image_shape(model: keras.Model) -> tuple:
    """``(height, width, channels)`` of the images ``model`` takes, whatever its data format (``None``: any size)."""
    return channels_last_shape(model.inputs[0].shape, model_data_format(model))[1:]


def in_data_format(images: np.ndarray, data_format: str) -> np.ndarray:
    """A batch of ``(B, H, W, C)`` images in ``data_format``: transposed to ``(B, C, H, W)`` for channels-first."""
    return images if data_format == "channels_last" else np.transpose(images, TO_CHANNELS_FIRST)


def for_model(images: np.ndarray, model: keras.Model) -> np.ndarray:
    """A batch of ``(B, H, W, C)`` images as ``model`` takes them (:func:`model_data_format`)."""
    return in_data_format(images, model_data_format(model))


def same(name: str, value, alias: str, alias_value):
    """``value`` or ``alias_value`` (two spellings of one argument); a ``ValueError`` when both are given and differ."""
    if value is not None and alias_value is not None and value != alias_value:
        raise ValueError(f"{name}={value!r} and {alias}={alias_value!r} disagree; pass one of them.")
    return alias_value if value is None else value


def input_size(
    image_size, channels, input_shape, input_tensor, data_format: str = "channels_last"
) -> tuple[Any, int | None, bool]:
    """``(image_size, channels, dynamic)`` from ``image_size``, ``channels``, ``input_shape`` and ``input_tensor``
    (shapes in ``data_format``: ``(channels, height, width)`` when channels-first)."""
    dynamic = False
    for what, shape in (("input_shape", input_shape), ("input_tensor", input_tensor)):
        if shape is None:
            continue
        shape = tuple(shape) if what == "input_shape" else tuple(shape.shape[1:])
        if len(shape) != 3:
            expected = "(height, width, channels)" if data_format == "channels_last" else "(channels, height, width)"
            raise ValueError(f"{what} must be {expected} ({data_format}), got {shape}.")
        height, width, depth = channels_last_shape((None, *shape), data_format)[1:]
        if (height is None) != (width is None):
            raise ValueError(f"{what} {shape}: give both height and width, or neither (any size).")
        if height is None:
            dynamic = True
        else:
            size = height if height == width else (height, width)
            known = tuple(image_size) if isinstance(image_size, (tuple, list)) else (image_size, image_size)
            if image_size is not None and known != (height, width):
                raise ValueError(f"image_size={image_size!r} and {what} {shape} disagree; pass one of them.")
            image_size = image_size if image_size is not None else size
        if depth is not None:
            if channels is not None and channels != depth:
                raise ValueError(f"channels={channels} and {what} {shape} disagree; pass one of them.")
            channels = depth
    return image_size, channels, dynamic


def on_tensor(model: keras.Model, input_tensor) -> keras.Model:
    """``model`` run on ``input_tensor`` from the ``keras.Input`` it comes from, keeping the layers between."""
    sources = keras.utils.get_source_inputs(input_tensor)
    inputs = sources[0] if len(sources) == 1 else sources
    return keras.Model(inputs, model.call(input_tensor), name=model.name)
