"""The graph of a Vision Transformer, built from an :class:`~keras_vit.variants.Architecture`.

    z_0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos     embed: [ResNet], PatchEmbed, ClassToken, E_pos
    z_l = TransformerBlock(z_{l-1}),  l = 1 ... L      encode
    y = LN(z_L^0)                                      encode: encoder_norm
    logits = head(y)                                   head: [pre_logits], head

Pure graph building: no files, no network, no checkpoints (those are :mod:`keras_vit.checkpoints`;
the user-facing ``ViT`` that reads variant names and weights is :mod:`keras_vit.applications`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import keras
from keras import layers

from keras_vit.checks import check_fraction, check_positive_int
from keras_vit.layers import ClassToken, PatchEmbed, TokenPooling, TransformerBlock, _pair, layer_norm
from keras_vit.position import (
    check_position_embedding,
    dynamic_position_embedding_layer,
    position_embedding_layer,
    transformer_block,
)
from keras_vit.resnet import ResNetStem
from keras_vit.variants import Architecture

__all__ = [
    "CLASSIFIERS",
    "DEFAULT_IMAGE_SIZE",
    "DEFAULT_NUM_CLASSES",
    "POOLINGS",
    "attention_model",
    "build_vit",
    "check_numbers",
    "check_options",
    "embed",
    "encode",
    "head",
    "uses_fc_norm",
]

CLASSIFIERS = ("token", "gap")
POOLINGS = (None, "token", "avg")
DEFAULT_IMAGE_SIZE, DEFAULT_NUM_CLASSES = 224, 1000


def check_options(classifier: str, pooling: str | None, position_embedding: str) -> None:
    """A ``ValueError`` naming the choices for an unknown classifier, pooling or position embedding."""
    for value, allowed, name in ((classifier, CLASSIFIERS, "classifier"), (pooling, POOLINGS, "pooling")):
        if value not in allowed:
            raise ValueError(f"Unknown {name} {value!r}; expected one of {allowed}.")
    check_position_embedding(position_embedding)
    if pooling == "token" and classifier != "token":
        raise ValueError("pooling='token' needs classifier='token' (a 'gap' model has no class token).")


def check_numbers(
    *,
    image_size: int | tuple[int, int],
    channels: int = 3,
    num_classes: int | None = None,
    representation_size: int | None = None,
    dropout: float = 0.0,
    attention_dropout: float = 0.0,
    drop_path: float = 0.0,
) -> tuple[int, int]:
    """A ``ValueError`` naming the argument and its value for a size that is not a positive int (a bool
    included) or a rate outside [0, 1); returns ``image_size`` as ``(height, width)``."""
    size = _pair(image_size, "image_size")
    check_positive_int(channels, "channels")
    for value, name in ((num_classes, "num_classes"), (representation_size, "representation_size")):
        if value is not None:
            check_positive_int(value, name)
    for value, name in ((dropout, "dropout"), (attention_dropout, "attention_dropout"), (drop_path, "drop_path")):
        check_fraction(value, name)
    return size


def build_vit(
    architecture: Architecture,
    *,
    image_size: int | tuple[int, int] = DEFAULT_IMAGE_SIZE,
    num_classes: int = DEFAULT_NUM_CLASSES,
    include_top: bool = True,
    classifier: str = "token",
    representation_size: int | None = None,
    pooling: str | None = None,
    classifier_activation: str | None = None,
    dropout: float = 0.0,
    attention_dropout: float = 0.0,
    drop_path: float = 0.0,
    gelu: str = "tanh",
    position_embedding: str = "learned_1d",
    channels: int = 3,
    resnet_options: Mapping[str, Any] | None = None,
    fc_norm: bool = False,
    dynamic_image_size: bool = False,
    input_tensor=None,
    remat: bool = False,
    name: str | None = None,
) -> keras.Model:
    """The functional ``keras.Model`` of ``architecture`` (randomly initialised).

    ``resnet_options`` are :class:`~keras_vit.resnet.ResNetStem` arguments other than the stages
    (``width``, epsilons) for a hybrid. ``fc_norm`` moves the final LayerNorm after the pooling (timm's
    ``fc_norm``, MAE-style GAP models). ``dynamic_image_size`` takes ``(None, None, channels)`` inputs of
    any multiple of the stride and interpolates the position embeddings (learned for ``image_size``) in the
    graph (:class:`~keras_vit.position.DynamicPositionEmbs`). ``remat`` rematerialises every encoder block
    while training (:class:`~keras_vit.layers.TransformerBlock`). ``name`` defaults to
    ``architecture.model_name``. Every other argument is documented at :func:`keras_vit.ViT`.
    """
    check_options(classifier, pooling, position_embedding)
    height, width = check_numbers(
        image_size=image_size,
        channels=channels,
        num_classes=num_classes if include_top else None,
        representation_size=representation_size,
        dropout=dropout,
        attention_dropout=attention_dropout,
        drop_path=drop_path,
    )
    stride = architecture.stride
    if height % stride or width % stride:
        what = (
            "the patch size"
            if architecture.resnet_stages is None
            else (f"the ResNet stride {stride // architecture.patch_size} x patch size {architecture.patch_size} =")
        )
        raise ValueError(
            f"image_size {height}x{width} is not divisible by {what} {stride}; "
            f"use a multiple of {stride}, e.g. {max(1, height // stride) * stride}."
        )
    shape = (None, None, channels) if dynamic_image_size else (height, width, channels)
    if input_tensor is None:
        inputs = keras.Input(shape, name="images")
    elif tuple(input_tensor.shape[1:]) != shape:
        expected = ", ".join(map(str, shape))
        raise ValueError(f"input_tensor has shape {tuple(input_tensor.shape)}, expected (batch, {expected}).")
    else:
        inputs = input_tensor
    x = embed(inputs, architecture, resnet_options)
    x = encode(
        x,
        (height // stride, width // stride),
        architecture,
        class_token=classifier == "token",
        dropout=dropout,
        attention_dropout=attention_dropout,
        drop_path=drop_path,
        gelu=gelu,
        position_embedding=position_embedding,
        final_norm=not fc_norm,
        images=inputs if dynamic_image_size else None,
        stride=stride,
        remat=remat,
    )
    outputs = head(
        x,
        include_top=include_top,
        classifier=classifier,
        pooling=pooling,
        num_classes=num_classes,
        representation_size=representation_size,
        classifier_activation=classifier_activation,
        fc_norm=fc_norm,
    )
    return keras.Model(inputs, outputs, name=name or architecture.model_name)


def embed(images, architecture: Architecture, resnet_options: Mapping[str, Any] | None = None):
    """Images ``(B, H, W, C)`` -> patch tokens ``x_p E`` ``(B, N, D)``; a hybrid embeds its ResNet's feature map."""
    x = images
    if architecture.resnet_stages is not None:
        x = ResNetStem(architecture.resnet_stages, name="resnet", **(resnet_options or {}))(x)
    return PatchEmbed(architecture.patch_size, architecture.hidden_size, name="embedding")(x)


def encode(
    x,
    grid,
    architecture: Architecture,
    *,
    class_token: bool,
    dropout: float,
    attention_dropout: float,
    drop_path: float,
    gelu: str,
    position_embedding: str = "learned_1d",
    final_norm: bool = True,
    images=None,
    stride: int | None = None,
    remat: bool = False,
):
    """Tokens ``(B, N, D)`` -> encoded tokens: [class token], position embeddings, L blocks, final LN
    (unless ``final_norm=False``). With ``images`` (and their ``stride``) the position embeddings are
    interpolated in the graph to the images' patch grid. ``remat`` rematerialises each block while training."""
    if class_token:
        x = ClassToken(name="class_token")(x)
    if images is None:
        position = position_embedding_layer(position_embedding, grid, num_prefix_tokens=int(class_token))
        x = x if position is None else position(x)
    else:
        position = dynamic_position_embedding_layer(position_embedding, grid, int(class_token), stride)
        x = x if position is None else position(x, images)
    x = layers.Dropout(dropout, name="posembed_dropout")(x)
    depth = architecture.depth
    for i in range(depth):
        x = transformer_block(
            position_embedding,
            grid,
            int(class_token),
            architecture.num_heads,
            architecture.mlp_dim,
            dropout=dropout,
            attention_dropout=attention_dropout,
            drop_path=drop_path * i / max(1, depth - 1),  # stochastic depth rises linearly with depth
            gelu=gelu,
            remat=remat,
            name=f"encoderblock_{i}",
        )(x)
    return layer_norm("encoder_norm")(x) if final_norm else x


def head(
    x,
    *,
    include_top: bool,
    classifier: str,
    pooling: str | None,
    num_classes: int,
    representation_size: int | None,
    classifier_activation: str | None,
    fc_norm: bool = False,
):
    """Encoded tokens -> logits (``include_top``) or features (``pooling``); ``fc_norm`` applies the final
    LayerNorm to the pooled features (the tokens stay unnormalised)."""
    if not include_top and pooling is None:
        return x
    x = _pool(x, pooling if not include_top else ("token" if classifier == "token" else "avg"), classifier)
    if fc_norm:
        x = layer_norm("encoder_norm")(x)
    if not include_top:
        return x
    if representation_size is not None:
        x = layers.Dense(representation_size, activation="tanh", name="pre_logits")(x)
    variable_dtype = keras.mixed_precision.dtype_policy().variable_dtype
    return layers.Dense(
        num_classes,
        kernel_initializer="zeros",
        activation=classifier_activation,
        name="head",
        dtype=variable_dtype,
    )(x)


def uses_fc_norm(model: keras.Model) -> bool:
    """Whether ``model`` was built with ``fc_norm=True`` (its ``encoder_norm`` normalises pooled features)."""
    norms = [layer for layer in model.layers if layer.name == "encoder_norm"]
    return bool(norms) and len(norms[0].input.shape) == 2


def _pool(x, pooling: str, classifier: str):
    prefix = int(classifier == "token")
    return TokenPooling(pooling, num_prefix_tokens=prefix, name=f"{pooling}_pool")(x)


class _AttentionProbs(layers.Layer):
    """Runs a shared :class:`TransformerBlock` and returns only its attention probabilities."""

    def __init__(self, block: TransformerBlock, **kwargs):
        super().__init__(name=f"{block.name}_attention", dtype=block.dtype_policy, **kwargs)
        self.block = block

    def call(self, x):
        return self.block(x, return_attention_scores=True)[1]


def attention_model(model: keras.Model) -> keras.Model:
    """A model sharing ``model``'s weights that maps its inputs to every block's attention probabilities.

    Returns a list, one ``(B, heads, N, N)`` tensor per :class:`TransformerBlock`, in depth order.
    """
    blocks = [layer for layer in model.layers if isinstance(layer, TransformerBlock)]
    if not blocks:
        raise ValueError(f"Model {model.name!r} has no TransformerBlock layers.")
    outputs = [_AttentionProbs(block)(block.input) for block in blocks]
    return keras.Model(model.input, outputs, name=f"{model.name}_attention")
