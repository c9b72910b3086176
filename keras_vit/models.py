"""The graph of a Vision Transformer from a :class:`~keras_vit.config.ViTConfig` (no files, no checkpoints);
:class:`VisionTransformer`'s ``get_config()`` holds the config. The path of an image: docs/design.md."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import keras
from keras import layers

from keras_vit.cloning import copy_layer_weights, copy_weights
from keras_vit.config import ViTConfig, options_of_layer
from keras_vit.heads import MAPHead
from keras_vit.layers import (
    ChannelsLast,
    ClassToken,
    PatchEmbed,
    TokenPooling,
    TransformerBlock,
    format_shape,
    layer_norm,
    mixed_norms,
)
from keras_vit.memory import check_model_fits
from keras_vit.position import dynamic_position_embedding_layer, position_embedding_layer, transformer_block
from keras_vit.precision import global_policy
from keras_vit.preprocessing import ImagePreprocessor
from keras_vit.quantization import check_head_dtype, dtype_config, is_quantized, layer_policy
from keras_vit.resnet import ResNetStem
from keras_vit.tokens import PrefixTokens, TokenAt

__all__ = [
    "VisionTransformer",
    "attention_model",
    "build_vit",
    "embed",
    "encode",
    "for_inference",
    "head",
    "model_options",
    "set_trainable_layers",
    "trainable_layers",
    "uses_fc_norm",
    "with_new_head",
]


@keras.saving.register_keras_serializable(package="keras_vit")
class VisionTransformer(keras.Model):
    """The functional ``keras.Model`` of a :class:`~keras_vit.config.ViTConfig` (or its ``to_dict()``), kept as
    ``model.config``. ``dtype``: the layers' policy (a quantized model's: a ``DTypePolicyMap``); ``head_dtype``: the
    head's (default: ``dtype``'s variable dtype). Weights that would not fit the memory left: a ``ValueError``."""

    def __init__(
        self,
        config: ViTConfig | Mapping[str, Any],
        *,
        trainable: bool = True,
        trainable_layers: Mapping[str, bool] | None = None,
        head_dtype: str | keras.DTypePolicy | None = None,
        **kwargs,
    ):
        config = config if isinstance(config, ViTConfig) else ViTConfig.from_dict(config)
        head_dtype = check_head_dtype(head_dtype)
        policy = kwargs.pop("dtype", None)
        policy = None if policy is None else keras.dtype_policies.get(policy)
        kwargs["name"] = kwargs.get("name") or config.architecture.model_name
        # before any layer is built; a DTypePolicyMap is a mapping: an empty one is falsy, yet the model's policy
        check_model_fits(config, keras.mixed_precision.dtype_policy() if policy is None else policy)
        with contextlib.nullcontext() if policy is None else global_policy(policy):  # the model's policy too
            inputs, outputs = _graph(config, head_dtype)
            super().__init__(inputs, outputs, **kwargs)
        self.config = config
        self.head_dtype = head_dtype
        self.trainable = trainable  # the setter reaches every layer and variable (an __init__ argument does not)
        set_trainable_layers(self, trainable_layers or {})

    def get_config(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "trainable": self.trainable,
            "trainable_layers": trainable_layers(self),
            **dtype_config(self),  # with the policies of its quantized layers
            "head_dtype": self.head_dtype,
            "config": self.config.to_dict(),
        }

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects=None) -> VisionTransformer:
        return cls(**config)


def _layer_paths(layer: keras.Layer, prefix: str = "") -> Iterator[tuple[str, keras.Layer, keras.Layer]]:
    """``(path, sublayer, its parent)`` for every layer inside ``layer``, parents first; a path joins the names
    (``encoderblock_0/MlpBlock_3/Dense_0``), which keras-vit gives every layer it builds."""
    for sublayer in layer._flatten_layers(include_self=False, recursive=False):
        path = f"{prefix}{sublayer.name}"
        yield path, sublayer, layer
        yield from _layer_paths(sublayer, f"{path}/")


def trainable_layers(model: keras.Layer) -> dict[str, bool]:
    """``{path: trainable}`` of every layer inside ``model`` whose ``trainable`` differs from its parent's: what
    :func:`set_trainable_layers` needs, after ``model.trainable`` is set, to restore them all."""
    return {path: layer.trainable for path, layer, parent in _layer_paths(model) if layer.trainable != parent.trainable}


def set_trainable_layers(model: keras.Layer, flags: Mapping[str, bool]) -> None:
    """Set ``trainable`` of the layers :func:`trainable_layers` named (parents first, so a child's own flag wins)."""
    layers_by_path = {path: layer for path, layer, _ in _layer_paths(model)}
    unknown = sorted(set(flags) - set(layers_by_path))
    if unknown:
        raise ValueError(f"Model {model.name!r} has no layers {unknown} to set trainable.")
    for path, layer in layers_by_path.items():
        if path in flags:
            layer.trainable = flags[path]


def for_inference(model: keras.Model) -> keras.Model:
    """``model`` to run inference only: a :class:`VisionTransformer` under a mixed policy (``mixed_bfloat16``) as a new
    one of the same config that stores its weights in the compute dtype, cast once here instead of in every call (the
    same outputs, half the weight memory; docs/performance.md), its norms and head in float32 as the mixed model
    computes them. Any other model, or a quantized one, is returned as it is. Do not train or save the copy. Not a
    Keras model: a ``TypeError``."""
    if not isinstance(model, keras.Model):
        raise TypeError(f"for_inference takes a Keras model, got {type(model).__name__}.")
    policy = model.dtype_policy
    mixed = type(policy) is keras.DTypePolicy and policy.variable_dtype != policy.compute_dtype
    if not (isinstance(model, VisionTransformer) and mixed):
        return model
    if is_quantized(model):
        return model  # its blocks' sublayers take their policies from the model's map, which a rebuild would lose
    head_dtype = model.head_dtype or policy.variable_dtype
    with mixed_norms():
        new = VisionTransformer(model.config, name=model.name, dtype=policy.compute_dtype, head_dtype=head_dtype)
    return copy_weights(model, new)


def with_new_head(model: keras.Model, classes: int, *, classifier_activation: str | None = None) -> keras.Model:
    """``model`` (with a head or not) with a fresh zero-initialised head of ``classes``, as the paper fine-tunes: a new
    :class:`VisionTransformer` of the same config and policy with a copy of the backbone's weights and flags."""
    if not isinstance(model, VisionTransformer):
        raise ValueError(
            f"with_new_head needs a keras_vit model (VisionTransformer); {model.name!r} is a "
            f"{type(model).__name__}. Build it with keras_vit.ViT(..., classes={classes}) instead."
        )
    config = model.config.replace(
        include_top=True,
        num_classes=classes,
        classifier_activation=classifier_activation,
        pooling=None,
        representation_size=None,
    )
    new = VisionTransformer(config, name=model.name, dtype=model.dtype_policy, head_dtype=model.head_dtype)
    old_layers = {path: layer for path, layer, _ in _layer_paths(model)}
    kept = {path: layer for path, layer, _ in _layer_paths(new) if path in old_layers and path != "head"}
    for path, layer in kept.items():
        copy_layer_weights(old_layers[path], layer)
    new.trainable = model.trainable
    set_trainable_layers(new, {path: flag for path, flag in trainable_layers(model).items() if path in kept})
    return new


def build_vit(config: ViTConfig, *, name: str | None = None, dtype=None, head_dtype=None) -> VisionTransformer:
    """The model of ``config``, randomly initialised, named ``name`` (default: ``config.architecture.model_name``:
    ``vit_b16``, ``vit_r50_b16``), under the dtype policy ``dtype`` (default: the global one), its head under
    ``head_dtype`` (default: the policy's variable dtype)."""
    return VisionTransformer(config, name=name, dtype=dtype, head_dtype=head_dtype)


def _graph(config: ViTConfig, head_dtype: str | None = None) -> tuple:
    """``(inputs, outputs)`` of the model of ``config``: images in ``config.data_format``, channels-last after the
    first step (:class:`~keras_vit.layers.ChannelsLast`), so the layers and weights do not depend on it."""
    any_size = config.dynamic_image_size or config.include_preprocessing
    height, width = (None, None) if any_size else config.image_size
    shape = format_shape((None, height, width, config.channels), config.data_format)[1:]
    inputs = keras.Input(shape, name="images")
    images = ChannelsLast(name="channels_last")(inputs) if config.data_format == "channels_first" else inputs
    if config.include_preprocessing:
        options = dict(config.layer_options("preprocessing"), data_format="channels_last")
        images = ImagePreprocessor(config.image_size, name="preprocessing", **options)(images)
    x = encode(embed(images, config), config, images=images if config.dynamic_image_size else None)
    return inputs, head(x, config, head_dtype)


def embed(images, config: ViTConfig):
    """Images ``(B, H, W, C)`` -> patch tokens ``x_p E`` ``(B, N, D)``; a hybrid embeds its ResNet's feature map,
    padded to a multiple of the patch size with ``dynamic_img_pad`` (as timm's)."""
    architecture, x = config.architecture, images
    if architecture.resnet_stages is not None:
        x = ResNetStem(architecture.resnet_stages, name="resnet", **config.layer_options("resnet"))(x)
    return PatchEmbed(
        architecture.patch_size, architecture.hidden_size, dynamic_img_pad=config.dynamic_img_pad, name="embedding"
    )(x)


def encode(x, config: ViTConfig, images=None):
    """Tokens ``(B, N, D)`` -> encoded tokens: prefix tokens, position embeddings (interpolated to ``images``' grid
    when given), [``norm_pre``], the blocks, the final LN (unless ``fc_norm``)."""
    architecture, prefix = config.architecture, config.num_prefix_tokens
    embedded = int(config.classifier == "token") + int(config.distillation_token)  # class and distillation tokens
    if config.class_position_embedding:
        x = _class_tokens(x, config)
    embedded_prefix = embedded if config.class_position_embedding else 0
    if images is None:
        position = position_embedding_layer(config.position_embedding, config.grid_size, embedded_prefix)
        x = x if position is None else position(x)
    else:
        position = dynamic_position_embedding_layer(
            config.position_embedding,
            config.grid_size,
            embedded_prefix,
            architecture.stride,
            method=config.position_interpolation,
            dynamic_img_pad=config.dynamic_img_pad,
        )
        x = x if position is None else position(x, images)
    if not config.class_position_embedding:
        x = _class_tokens(x, config)
    if config.num_register_tokens:
        x = PrefixTokens(config.num_register_tokens, offset=embedded, name="register_tokens")(x)
    x = layers.Dropout(config.dropout, name="posembed_dropout")(x)
    if config.norm_pre:
        x = layer_norm("norm_pre", epsilon=config.layer_norm_epsilon)(x)
    depth = architecture.depth
    for i in range(depth):
        x = transformer_block(
            config.position_embedding,
            config.grid_size,
            prefix,
            architecture.num_heads,
            architecture.mlp_dim,
            drop_path=config.drop_path * i / max(1, depth - 1),  # stochastic depth rises linearly with depth
            name=f"encoderblock_{i}",
            **config.layer_options("block"),
        )(x)
    return x if config.fc_norm else layer_norm("encoder_norm", epsilon=config.layer_norm_epsilon)(x)


def _class_tokens(x, config: ViTConfig):
    """``[x_class; x_dist; x]``, each token where the config has it."""
    if config.classifier == "token":
        x = ClassToken(name="class_token")(x)
    return PrefixTokens(1, offset=1, name="distillation_token")(x) if config.distillation_token else x


def head(x, config: ViTConfig, head_dtype: str | keras.DTypePolicy | None = None):
    """Encoded tokens -> logits (``include_top``) or features (``pooling``); ``fc_norm`` applies the final
    LayerNorm to the pooled features (the tokens stay unnormalised); the head layer's policy: :func:`_head_layer`."""
    if not config.include_top and config.pooling is None:
        return x
    pooling = config.pooling if not config.include_top else {"token": "token", "gap": "avg"}.get(config.classifier)
    tokens = x
    if pooling in (None, "map"):  # classifier "map": its head pools
        arch = config.architecture
        x = MAPHead(arch.num_heads, arch.mlp_dim, config.gelu, config.layer_norm_epsilon, name="map_head")(x)
    else:
        x = TokenPooling(pooling, num_prefix_tokens=config.num_prefix_tokens, name=f"{pooling}_pool")(x)
    if config.fc_norm:
        x = layer_norm("encoder_norm", epsilon=config.layer_norm_epsilon)(x)
    if not config.include_top:
        return x
    if config.representation_size is not None:
        policy = layer_policy(keras.mixed_precision.dtype_policy(), "pre_logits")
        x = layers.Dense(config.representation_size, activation="tanh", name="pre_logits", dtype=policy)(x)
    if config.distillation_token:  # DeiT: the mean of the class token's head and the distillation token's
        heads = [
            _head_layer(config, name, head_dtype)(z)
            for name, z in (("head", x), ("head_dist", TokenAt(1, name="dist_pool")(tokens)))
        ]
        return layers.Average(name="distilled_mean", dtype=heads[0].dtype)(heads)
    return _head_layer(config, "head", head_dtype)(x)


def _head_layer(config: ViTConfig, name: str, head_dtype: str | keras.DTypePolicy | None = None) -> layers.Dense:
    """The classification head: zero-initialised, under ``head_dtype`` (default: the policy's variable dtype, so
    float32 under mixed precision), or quantized where the model's policy map records it (``model.quantize``)."""
    policy = keras.mixed_precision.dtype_policy()
    return layers.Dense(
        config.num_classes,
        kernel_initializer="zeros",
        activation=config.classifier_activation,
        name=name,
        dtype=layer_policy(policy, name, head_dtype or policy.variable_dtype),
    )


def uses_fc_norm(model: keras.Model) -> bool:
    """Whether ``model`` was built with ``fc_norm=True`` (its ``encoder_norm`` normalises pooled features)."""
    norms = [layer for layer in model.layers if layer.name == "encoder_norm"]
    return bool(norms) and len(norms[0].input.shape) == 2


def model_options(model: keras.Model) -> dict[str, Any]:
    """The config fields ``model`` was built with: its whole config (a :class:`VisionTransformer`), else what its
    layers show (``fc_norm``; its blocks' and ResNet's arguments), for a model made around keras-vit layers."""
    if isinstance(model, VisionTransformer):
        return model.config.to_dict()
    options: dict[str, Any] = {"fc_norm": uses_fc_norm(model)}
    found = list(model._flatten_layers(include_self=False))
    for cls, layer in ((TransformerBlock, "block"), (ResNetStem, "resnet")):
        first = next((candidate for candidate in found if isinstance(candidate, cls)), None)
        if first is not None:
            options.update(options_of_layer(layer, first.get_config()))
    return options


class _AttentionProbs(layers.Layer):
    """Runs a shared :class:`TransformerBlock` and returns only its attention probabilities."""

    def __init__(self, block: TransformerBlock, **kwargs):
        super().__init__(name=f"{block.name}_attention", dtype=block.dtype_policy, **kwargs)
        self.block = block

    def call(self, x):
        return self.block(x, return_attention_scores=True)[1]


def attention_model(model: keras.Model) -> keras.Model:
    """A model sharing ``model``'s weights that maps its inputs to a list of every block's attention probabilities,
    one ``(B, heads, N, N)`` tensor per :class:`TransformerBlock`, in depth order."""
    blocks = [layer for layer in model.layers if isinstance(layer, TransformerBlock)]
    if not blocks:
        raise ValueError(f"Model {model.name!r} has no TransformerBlock layers.")
    outputs = [_AttentionProbs(block)(block.input) for block in blocks]
    return keras.Model(model.input, outputs, name=f"{model.name}_attention")
