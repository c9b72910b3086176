"""Where a ViT's tokens come from: the patch grid, the pixels per patch and the prefix tokens, read from the
model's ``"embedding"`` layer and input (hybrids and every position-embedding kind included)."""

from __future__ import annotations

import dataclasses

import keras
import numpy as np

from keras_vit.checks import check_choice
from keras_vit.config import grid_length
from keras_vit.features import model_stride
from keras_vit.inputs import model_image_shape
from keras_vit.layers import PatchEmbed
from keras_vit.tokens import num_prefix_tokens

__all__ = ["TokenGeometry", "check_choice", "get_layer", "positive_pair", "token_geometry"]


@dataclasses.dataclass(frozen=True)
class TokenGeometry:
    """``grid_size`` (rows, cols) of patch tokens, ``patch_size`` in input pixels (h, w), and
    ``num_prefix_tokens`` before them (the class, distillation and register tokens; 0 for ``classifier="gap"``)."""

    grid_size: tuple[int, int]
    patch_size: tuple[int, int]
    num_prefix_tokens: int

    @property
    def num_patches(self) -> int:
        return self.grid_size[0] * self.grid_size[1]

    @property
    def num_tokens(self) -> int:
        return self.num_prefix_tokens + self.num_patches


def positive_pair(value, name: str) -> tuple[int, int]:
    """``(h, w)`` from a positive int or a pair of them; a ``ValueError`` naming ``name`` otherwise."""
    pair = np.asarray(value)
    if pair.ndim > 1 or pair.size not in (1, 2) or not np.issubdtype(pair.dtype, np.integer) or pair.min() < 1:
        raise ValueError(f"`{name}` must be a positive int or a pair of them (height, width), got {value!r}.")
    height, width = np.broadcast_to(pair, (2,))
    return int(height), int(width)


def get_layer(model: keras.Model, name: str, cls: type | None = None) -> keras.layers.Layer:
    """``model.get_layer(name)``, with a ``ValueError`` naming the layer when it is missing or of another type."""
    try:
        layer = model.get_layer(name)
    except ValueError:
        layer = None
    if layer is None or (cls is not None and not isinstance(layer, cls)):
        expected = f" (a {cls.__name__})" if cls is not None else ""
        raise ValueError(f"Model {model.name!r} has no layer {name!r}{expected}; is it a keras_vit ViT?")
    return layer


def token_geometry(model: keras.Model) -> TokenGeometry:
    """The :class:`TokenGeometry` of a keras_vit model (plain or hybrid)."""
    embed = get_layer(model, "embedding", PatchEmbed)
    feature_h, feature_w = embed.input.shape[1:3]
    height, width = model_image_shape(model)[:2]
    if None in (height, width, feature_h, feature_w):
        raise ValueError(f"Model {model.name!r} needs a fixed input image size for the analyses.")
    pad = embed.dynamic_img_pad  # the grid rounded up, each token still a stride of pixels
    gh, gw = (grid_length(size, patch, pad) for size, patch in zip((feature_h, feature_w), embed.patch_size))
    stride = (model_stride(model),) * 2 if pad else (height // gh, width // gw)
    return TokenGeometry((gh, gw), stride, num_prefix_tokens(model))
