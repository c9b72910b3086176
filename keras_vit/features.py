"""Intermediate features: the tokens of chosen blocks, or ``(B, h, w, D)`` maps for dense tasks, like timm's
``forward_intermediates``. Examples: docs/foreign-weights.md."""

from __future__ import annotations

from collections.abc import Sequence

import keras
from keras import layers, ops

from keras_vit.config import grid_length
from keras_vit.layers import PatchEmbed, TransformerBlock
from keras_vit.quantization import arguments_config
from keras_vit.resnet import ResNetStem
from keras_vit.tokens import num_prefix_tokens

__all__ = ["PatchTokenMap", "feature_model", "model_stride"]


@keras.saving.register_keras_serializable(package="keras_vit")
class PatchTokenMap(layers.Layer):
    """``call(tokens, images)``: tokens ``(B, prefix + h * w, D)`` -> patch tokens ``(B, h, w, D)``, the
    grid being the NHWC images' height and width divided by ``stride`` (rounded up with ``dynamic_img_pad``, the
    images being padded), so any image size works."""

    def __init__(self, num_prefix_tokens: int, stride: int, dynamic_img_pad: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.stride = int(stride)
        self.dynamic_img_pad = bool(dynamic_img_pad)

    def call(self, tokens, images):
        height, width = (grid_length(ops.shape(images)[axis], self.stride, self.dynamic_img_pad) for axis in (1, 2))
        patches = tokens[:, self.num_prefix_tokens :]
        return ops.reshape(patches, (ops.shape(tokens)[0], height, width, tokens.shape[-1]))

    def compute_output_shape(self, tokens_shape, images_shape):
        height, width = (
            None if size is None else grid_length(size, self.stride, self.dynamic_img_pad) for size in images_shape[1:3]
        )
        return (tokens_shape[0], height, width, tokens_shape[-1])

    def get_config(self):
        return {**super().get_config(), **arguments_config(self, PatchTokenMap)}


def _embedding(model: keras.Model) -> tuple[PatchEmbed, ResNetStem | None]:
    """``model``'s :class:`PatchEmbed` (with square patches) and its hybrid's :class:`ResNetStem` (else ``None``)."""
    flat = list(model._flatten_layers(include_self=False))
    embeds = [layer for layer in flat if isinstance(layer, PatchEmbed)]
    if not embeds or embeds[0].patch_size[0] != embeds[0].patch_size[1]:
        raise ValueError(f"Model {model.name!r} has no PatchEmbed with square patches.")
    stems = [layer for layer in flat if isinstance(layer, ResNetStem)]
    return embeds[0], stems[0] if stems else None


def model_stride(model: keras.Model) -> int:
    """How many pixels one patch token covers along each side: the patch size (times a hybrid's ResNet stride)."""
    embed, stem = _embedding(model)
    return embed.patch_size[0] * (stem.stride if stem is not None else 1)


def feature_model(
    model: keras.Model,
    blocks: int | Sequence[int] = (-1,),
    *,
    spatial: bool = True,
    norm: bool = False,
    name: str | None = None,
) -> keras.Model:
    """A model sharing ``model``'s weights (plain or hybrid, fixed or dynamic size) that returns encoder ``blocks``.

    Args: ``blocks``: 0-based indices (negative from the last), one int for one output; ``spatial``: the patch tokens
    as ``(B, h, w, D)`` maps, else the block's ``(B, prefix + h * w, D)`` tokens; ``norm``: apply ``encoder_norm``
    (timm's ``norm=True``); ``name``: default ``{model.name}_features``. Returns one output per block, in order."""
    encoder = [layer for layer in model.layers if isinstance(layer, TransformerBlock)]
    if not encoder:
        raise ValueError(f"Model {model.name!r} has no TransformerBlock layers.")
    indices = [blocks] if isinstance(blocks, int) else list(blocks)
    for index in indices:
        if not -len(encoder) <= index < len(encoder):
            raise IndexError(f"Block {index} does not exist: model {model.name!r} has {len(encoder)} blocks.")
    outputs = [encoder[index].output for index in indices]
    if norm:
        encoder_norm = model.get_layer("encoder_norm")
        outputs = [encoder_norm(x) for x in outputs]
    if spatial:
        embed, stem = _embedding(model)
        images = (embed if stem is None else stem).input  # channels-last, after any preprocessing
        pad = embed.dynamic_img_pad
        to_map = PatchTokenMap(num_prefix_tokens(model), model_stride(model), pad, name="patch_token_map")
        outputs = [to_map(x, images) for x in outputs]
    single = isinstance(blocks, int)
    return keras.Model(model.input, outputs[0] if single else outputs, name=name or f"{model.name}_features")
