"""keras.applications' spellings of a model's input (``input_shape``, ``input_tensor``, ``classes``) turned into the
config's ``image_size``, ``channels`` and ``num_classes``."""

from __future__ import annotations

from typing import Any

import keras


def same(name: str, value, alias: str, alias_value):
    """``value`` or ``alias_value`` (two spellings of one argument); a ``ValueError`` when both are given and differ."""
    if value is not None and alias_value is not None and value != alias_value:
        raise ValueError(f"{name}={value!r} and {alias}={alias_value!r} disagree; pass one of them.")
    return alias_value if value is None else value


def input_size(image_size, channels, input_shape, input_tensor) -> tuple[Any, int | None, bool]:
    """``(image_size, channels, dynamic)`` from ``image_size``, ``channels``, ``input_shape`` and ``input_tensor``."""
    dynamic = False
    for what, shape in (("input_shape", input_shape), ("input_tensor", input_tensor)):
        if shape is None:
            continue
        shape = tuple(shape) if what == "input_shape" else tuple(shape.shape[1:])
        if len(shape) != 3:
            raise ValueError(f"{what} must be (height, width, channels), got {shape}.")
        height, width, depth = shape
        if (height is None) != (width is None):
            raise ValueError(f"{what} {shape}: give both height and width, or neither (any size).")
        if height is None:
            dynamic = True
        else:
            size = height if height == width else (height, width)
            known = None if image_size is None else pair(image_size)
            if known is not None and known != (height, width):
                raise ValueError(f"image_size={image_size!r} and {what} {shape} disagree; pass one of them.")
            image_size = image_size if image_size is not None else size
        if depth is not None:
            if channels is not None and channels != depth:
                raise ValueError(f"channels={channels} and {what} {shape} disagree; pass one of them.")
            channels = depth
    return image_size, channels, dynamic


def pair(size) -> tuple:
    return tuple(size) if isinstance(size, (tuple, list)) else (size, size)


def on_tensor(model: keras.Model, input_tensor) -> keras.Model:
    """``model`` run on ``input_tensor`` from the ``keras.Input`` it comes from, keeping the layers between."""
    sources = keras.utils.get_source_inputs(input_tensor)
    inputs = sources[0] if len(sources) == 1 else sources
    return keras.Model(inputs, model.call(input_tensor), name=model.name)
