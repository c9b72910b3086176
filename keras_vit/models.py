"""The ViT model family: one builder, ``ViT``, and a named constructor per published variant.

A variant is a short string, ``"B/16"``: the size (Ti, S, B, L, H) decoded from one table, and the
patch size after the slash. Any field can be overridden, e.g. ``ViT("B/16", depth=2)``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import keras
from keras import layers, ops

from keras_vit.layers import (
    ClassToken,
    PatchEmbed,
    TokenPooling,
    TransformerBlock,
    _pair,
    layer_norm,
)
from keras_vit.position import check_position_embedding, position_embedding_layer, transformer_block
from keras_vit.resnet import resnet_stem

# Table 1 of the paper (and "How to train your ViT" for Ti and S).
SIZES: dict[str, dict[str, int]] = {
    "Ti": dict(hidden_size=192, depth=12, num_heads=3, mlp_dim=768),
    "S": dict(hidden_size=384, depth=12, num_heads=6, mlp_dim=1536),
    "B": dict(hidden_size=768, depth=12, num_heads=12, mlp_dim=3072),
    "L": dict(hidden_size=1024, depth=24, num_heads=16, mlp_dim=4096),
    "H": dict(hidden_size=1280, depth=32, num_heads=16, mlp_dim=5120),
}
NAMED_VARIANTS = ("Ti/16", "S/16", "S/32", "B/8", "B/16", "B/32", "L/16", "L/32", "H/14")
CLASSIFIERS = ("token", "gap")
DEFAULT_IMAGE_SIZE, DEFAULT_NUM_CLASSES = 224, 1000  # without weights (with them: the checkpoint's)
POOLINGS = (None, "token", "avg")


@dataclasses.dataclass(frozen=True)
class ViTConfig:
    """The architecture of an encoder: patch size and the transformer's shape."""

    patch_size: int
    hidden_size: int
    depth: int
    num_heads: int
    mlp_dim: int


def parse_variant(variant: str) -> ViTConfig:
    """Decode ``"B/16"`` into a :class:`ViTConfig`; a clear ``ValueError`` for anything else."""
    size, _, patch = str(variant).partition("/")
    if size not in SIZES or not patch.isdigit() or int(patch) < 1:
        raise ValueError(
            f"Unknown ViT variant {variant!r}: expected '<size>/<patch>' with size one of "
            f"{sorted(SIZES)} and a positive patch size, e.g. 'B/16'. Named variants: {NAMED_VARIANTS}."
        )
    return ViTConfig(patch_size=int(patch), **SIZES[size])


def _choice(value, allowed, name: str):
    if value not in allowed:
        raise ValueError(f"Unknown {name} {value!r}; expected one of {allowed}.")
    return value


def ViT(
    variant: str | None = "B/16",
    *,
    image_size: int | tuple[int, int] | None = None,
    include_top: bool = True,
    weights: str | None = None,
    num_classes: int | None = None,
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
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    input_tensor=None,
    name: str | None = None,
    **overrides: int,
) -> keras.Model:
    """Build a Vision Transformer as a functional ``keras.Model``.

    Args:
        variant: ``"<size>/<patch>"`` (``"B/16"``); ``overrides`` (``patch_size``, ``hidden_size``,
            ``depth``, ``num_heads``, ``mlp_dim``) replace fields of it. ``None`` needs all five.
        image_size: input height and width (int or ``(h, w)``), a multiple of the patch size.
            ``None``: the checkpoint's resolution with ``weights``, else 224.
        include_top: end in the classification head; else return features (see ``pooling``).
        weights: ``None`` (random init), a zoo catalogue name (``python -m keras_vit.zoo list``; downloaded into
            the Keras cache) or a path to a Google ``.npz`` checkpoint (see :mod:`keras_vit.weights`).
            Position embeddings are resized to ``image_size``.
        num_classes: classes of the head. ``None``: the checkpoint's classifier with ``weights`` (its
            classes and its ``pre_logits`` layer), else 1000. Another number leaves the head (and an
            unused ``pre_logits``) at its initialisation, for fine-tuning.
        classifier: ``"token"`` (class token, the paper's default) or ``"gap"`` (global average
            pooling of the patch tokens, no class token).
        representation_size: width of the tanh ``pre_logits`` layer before the head; ``None`` skips it.
        pooling: with ``include_top=False``: ``None`` returns all tokens ``(B, N, D)``, ``"token"``
            the class token, ``"avg"`` the mean of the patch tokens.
        classifier_activation: activation of the head; ``None`` returns logits.
        dropout, attention_dropout, drop_path: regularisation rates (drop_path rises linearly with depth).
        gelu: ``"tanh"`` (the approximation the published Flax models were trained with; default)
            or ``"exact"`` (what timm, keras-hub and vit-keras use).
        position_embedding: ``"learned_1d"`` (the published models), ``"learned_2d"``, ``"sincos_2d"``,
            ``"relative"`` or ``"none"`` (the paper's Appendix D.4 ablation; see :mod:`keras_vit.position`).
        channels: input channels; pretrained weights need 3.
        resnet: make a hybrid: units per stage of a BiT ResNet (``(3, 4, 9)``) or a mapping of
            :class:`keras_vit.resnet.ResNetStem` arguments, run on the image before the embedding.
            ``patch_size`` then applies to its feature map (1 for the published hybrids) and
            ``image_size`` must be a multiple of the ResNet's stride times the patch size.

    Inputs are images scaled to [-1, 1] (see :func:`keras_vit.preprocess_input`).
    """
    fields = dataclasses.asdict(parse_variant(variant)) if variant is not None else {}
    unknown = set(overrides) - {f.name for f in dataclasses.fields(ViTConfig)}
    if unknown:
        raise TypeError(f"ViT() got unexpected keyword arguments {sorted(unknown)}.")
    fields.update(overrides)
    missing = {f.name for f in dataclasses.fields(ViTConfig)} - set(fields)
    if missing:
        raise ValueError(f"variant=None needs {sorted(missing)} as keyword arguments.")
    config = ViTConfig(**fields)
    _choice(classifier, CLASSIFIERS, "classifier")
    _choice(pooling, POOLINGS, "pooling")
    check_position_embedding(position_embedding)
    if weights is not None:
        from keras_vit.weights import checkpoint_defaults, read_checkpoint

        if channels != 3:
            raise ValueError(f"Pretrained weights need 3 input channels, got channels={channels}.")
        weights = read_checkpoint(weights)
        image_size, num_classes, representation_size = checkpoint_defaults(
            weights, image_size, num_classes, representation_size
        )
    image_size = DEFAULT_IMAGE_SIZE if image_size is None else image_size
    num_classes = DEFAULT_NUM_CLASSES if num_classes is None else num_classes
    if pooling == "token" and classifier != "token":
        raise ValueError("pooling='token' needs classifier='token' (a 'gap' model has no class token).")
    height, width = _pair(image_size, "image_size")
    stem = None if resnet is None else resnet_stem(resnet)
    stride = config.patch_size * (1 if stem is None else stem.stride)
    if height % stride or width % stride:
        what = "the patch size" if stem is None else f"the ResNet stride {stem.stride} x patch size {config.patch_size} ="
        raise ValueError(
            f"image_size {height}x{width} is not divisible by {what} {stride}; "
            f"use a multiple of {stride}, e.g. {max(1, height // stride) * stride}."
        )

    if input_tensor is None:
        inputs = keras.Input((height, width, channels), name="images")
    else:
        inputs = input_tensor
        if tuple(input_tensor.shape[1:]) != (height, width, channels):
            raise ValueError(
                f"input_tensor has shape {tuple(input_tensor.shape)}, expected (batch, {height}, {width}, {channels})."
            )
    grid = (height // stride, width // stride)
    features = inputs if stem is None else stem(inputs)
    x = PatchEmbed(config.patch_size, config.hidden_size, name="embedding")(features)
    x = encode(
        x,
        grid,
        config,
        class_token=classifier == "token",
        dropout=dropout,
        attention_dropout=attention_dropout,
        drop_path=drop_path,
        gelu=gelu,
        position_embedding=position_embedding,
    )
    outputs = head(
        x,
        include_top=include_top,
        classifier=classifier,
        pooling=pooling,
        num_classes=num_classes,
        representation_size=representation_size,
        classifier_activation=classifier_activation,
    )
    model = keras.Model(inputs, outputs, name=name or _model_name(variant, config, stem))
    if weights is not None:
        from keras_vit.weights import load_weights

        load_weights(model, weights)
    return model


def encode(x, grid, config: ViTConfig, *, class_token: bool, dropout: float, attention_dropout: float,
           drop_path: float, gelu: str, position_embedding: str = "learned_1d"):
    """Tokens ``(B, N, D)`` -> encoded tokens: [class token], position embeddings, L blocks, final LN."""
    if class_token:
        x = ClassToken(name="class_token")(x)
    position = position_embedding_layer(position_embedding, grid, num_prefix_tokens=int(class_token))
    x = x if position is None else position(x)
    x = layers.Dropout(dropout, name="posembed_dropout")(x)
    for i in range(config.depth):
        rate = drop_path * i / max(1, config.depth - 1)
        x = transformer_block(
            position_embedding,
            grid,
            int(class_token),
            config.num_heads,
            config.mlp_dim,
            dropout=dropout,
            attention_dropout=attention_dropout,
            drop_path=rate,
            gelu=gelu,
            name=f"encoderblock_{i}",
        )(x)
    return layer_norm("encoder_norm")(x)


def head(x, *, include_top: bool, classifier: str, pooling: str | None, num_classes: int,
         representation_size: int | None, classifier_activation: str | None):
    """Encoded tokens -> logits (``include_top``) or features (``pooling``)."""
    if not include_top:
        return x if pooling is None else _pool(x, pooling, classifier)
    x = _pool(x, "token" if classifier == "token" else "avg", classifier)
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


def _pool(x, pooling: str, classifier: str):
    prefix = int(classifier == "token")
    return TokenPooling(pooling, num_prefix_tokens=prefix, name=f"{pooling}_pool")(x)


def _model_name(variant: str | None, config: ViTConfig, stem=None) -> str:
    size = variant.partition("/")[0] if variant else f"d{config.hidden_size}"
    if stem is None:
        return f"vit_{size.lower()}{config.patch_size}"
    # hybrids as the paper names them: R<conv layers>+<size>/<total stride>, e.g. vit_r50_b16
    return f"vit_r{2 + 3 * sum(stem.num_layers)}_{size.lower()}{config.patch_size * stem.stride}"


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


def preprocess_input(images):
    """Scale pixel values in [0, 255] to [-1, 1], the range the published checkpoints expect."""
    return (ops.cast(images, "float32") - 127.5) / 127.5


def _named_constructor(variant: str):
    def constructor(
        image_size: int | tuple[int, int] | None = None,
        *,
        include_top: bool = True,
        weights: str | None = None,
        num_classes: int | None = None,
        **kwargs,
    ) -> keras.Model:
        return ViT(variant, image_size=image_size, include_top=include_top, weights=weights,
                   num_classes=num_classes, **kwargs)

    size, patch = variant.split("/")
    constructor.__name__ = constructor.__qualname__ = f"ViT_{size}{patch}"
    constructor.__doc__ = f"ViT-{variant} ({SIZES[size]}); every keyword argument of :func:`ViT` applies."
    return constructor


ViT_Ti16 = _named_constructor("Ti/16")
ViT_S16 = _named_constructor("S/16")
ViT_S32 = _named_constructor("S/32")
ViT_B8 = _named_constructor("B/8")
ViT_B16 = _named_constructor("B/16")
ViT_B32 = _named_constructor("B/32")
ViT_L16 = _named_constructor("L/16")
ViT_L32 = _named_constructor("L/32")
ViT_H14 = _named_constructor("H/14")
