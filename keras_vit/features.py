"""Intermediate features: the tokens of chosen blocks, or ``(B, h, w, D)`` maps for dense tasks, like timm's
``forward_intermediates``. Examples: docs/foreign-weights.md."""

from __future__ import annotations

from collections.abc import Sequence

import keras
from keras import layers, ops

from keras_vit.layers import PatchEmbed, TransformerBlock
from keras_vit.resnet import ResNetStem
from keras_vit.tokens import num_prefix_tokens

__all__ = ["PatchTokenMap", "feature_model", "model_stride"]


@keras.saving.register_keras_serializable(package="keras_vit")
class PatchTokenMap(layers.Layer):
    """``call(tokens, images)``: tokens ``(B, prefix + h * w, D)`` -> patch tokens ``(B, h, w, D)``, the
    grid being the images' height and width divided by ``stride`` (so any image size works)."""

    def __init__(self, num_prefix_tokens: int, stride: int, **kwargs):
        super().__init__(**kwargs)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.stride = int(stride)

    def call(self, tokens, images):
        height, width = ops.shape(images)[1] // self.stride, ops.shape(images)[2] // self.stride
        patches = tokens[:, self.num_prefix_tokens :]
        return ops.reshape(patches, (ops.shape(tokens)[0], height, width, tokens.shape[-1]))

    def compute_output_shape(self, tokens_shape, images_shape):
        height, width = (None if size is None else size // self.stride for size in images_shape[1:3])
        return (tokens_shape[0], height, width, tokens_shape[-1])

    def get_config(self):
        return {**super().get_config(), "num_prefix_tokens": self.num_prefix_tokens, "stride": self.stride}


def model_stride(model: keras.Model) -> int:
    """How many pixels one patch token covers along each side: the patch size (times a hybrid's ResNet stride)."""
    flat = list(model._flatten_layers(include_self=False))
    embeds = [layer for layer in flat if isinstance(layer, PatchEmbed)]
    if not embeds or embeds[0].patch_size[0] != embeds[0].patch_size[1]:
        raise ValueError(f"Model {model.name!r} has no PatchEmbed with square patches.")
    stems = [layer for layer in flat if isinstance(layer, ResNetStem)]
    return embeds[0].patch_size[0] * (stems[0].stride if stems else 1)


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
        prefix = num_prefix_tokens(model)
        to_map = PatchTokenMap(prefix, model_stride(model), name="patch_token_map")
        outputs = [to_map(x, model.input) for x in outputs]
    single = isinstance(blocks, int)
    return keras.Model(model.input, outputs[0] if single else outputs, name=name or f"{model.name}_features")
