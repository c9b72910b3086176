"""The user-facing ViT: ``ViT(variant, ...)`` and one named constructor per variant of :data:`NAMED_VARIANTS`.

A variant is a name from the one table in :mod:`keras_vit.variants`: ``"B/16"`` (size, patch size) or a
hybrid, ``"R50+B/16"`` (ResNet, size, total stride). Any field of its
:class:`~keras_vit.variants.Architecture` can be overridden: ``ViT("B/16", depth=2)``.
``weights=`` goes through :mod:`keras_vit.checkpoints`; the graph itself is :func:`keras_vit.models.build_vit`.
keras.applications habits work: ``input_shape=``, ``classes=``, ``input_tensor=`` and ``include_preprocessing=True``
(raw photos of any size in); ``include_top`` is keyword-only.

    constructor   variant     ResNet units/stage   stride   encoder
    ViT_Ti16      Ti/16       -                    16       Ti: 192 wide, 12 blocks
    ViT_B16       B/16        -                    16       B: 768 wide, 12 blocks
    ViT_R50_B16   R50+B/16    (3, 4, 9)            16       B: 768 wide, 12 blocks
    ViT_R50_L32   R50+L/32    (3, 4, 6, 3)         32       L: 1024 wide, 24 blocks
    ViT_R26_S32   R26+S/32    (2, 2, 2, 2)         32       S: 384 wide, 12 blocks
    ViT_R26_B32   R26+B/32    (2, 2, 2, 2)         32       B: 768 wide, 12 blocks

(and ``ViT_S16``, ``ViT_S32``, ``ViT_B8``, ``ViT_B32``, ``ViT_L16``, ``ViT_L32``, ``ViT_H14``). A hybrid's
``/16`` or ``/32`` is its total stride; the embedding's patch size is 1 (``vit_jax/configs/models.py``;
timm's ``vit_base_r50_s16_224``, ``vit_large_r50_s32_224`` and ``vit_small_r26_s32_224`` agree).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import keras

from keras_vit.checkpoints.load import checkpoint_defaults, load_weights
from keras_vit.checkpoints.read import read_checkpoint
from keras_vit.models import DEFAULT_IMAGE_SIZE, DEFAULT_NUM_CLASSES, build_vit, check_options
from keras_vit.preprocessing import ImagePreprocessor
from keras_vit.resnet import GROUP_NORM_EPSILON, STD_CONV_EPSILON
from keras_vit.variants import NAMED_VARIANTS, Architecture, constructor_name, parse_variant

# The ResNet numerics a hybrid's named constructor takes as keywords (see keras_vit.resnet.ResNetStem).
RESNET_NUMERICS = dict(
    std_conv_epsilon=STD_CONV_EPSILON, group_norm_epsilon=GROUP_NORM_EPSILON, weight_standardization="flax"
)


def _architecture(variant: str | None, resnet, overrides: Mapping[str, Any]) -> tuple[Architecture, dict]:
    """The architecture to build and the ResNet's other options, from a variant, ``resnet`` and overrides."""
    fields = {field.name: field for field in dataclasses.fields(Architecture)}
    unknown = set(overrides) - set(fields)
    if unknown:
        raise TypeError(f"ViT() got unexpected keyword arguments {sorted(unknown)}; overridable: {list(fields)}.")
    overrides = dict(overrides)
    options = dict(resnet) if isinstance(resnet, Mapping) else {}
    stages = options.pop("num_layers", None) if isinstance(resnet, Mapping) else resnet
    if stages is not None:
        overrides["resnet_stages"] = tuple(stages)
    if variant is None:
        required = {name for name, field in fields.items() if field.default is dataclasses.MISSING}
        missing = required - set(overrides)
        if missing:
            raise ValueError(f"variant=None needs {sorted(missing)} as keyword arguments.")
        architecture = Architecture(**overrides)
    else:
        architecture = parse_variant(variant).replace(**overrides)
    if options and architecture.resnet_stages is None:
        raise ValueError(f"A resnet mapping needs 'num_layers' (units per stage), got keys {sorted(options)}.")
    return architecture, options


def _model_name(variant: str | None, architecture: Architecture) -> str:
    """The variant's name with the patch and ResNet actually built (``ViT_S32(depth=1)`` is still ``vit_s32``)."""
    if variant is None:
        return architecture.model_name
    named = parse_variant(variant).replace(patch_size=architecture.patch_size, resnet_stages=architecture.resnet_stages)
    return named.model_name


def _check_first_argument(function: str, name: str, value) -> None:
    """keras.applications' ``include_top``-first habit (``ViT_B16(False)``) is an error, not a 0-pixel model."""
    if isinstance(value, bool):  # bool is an int: check it before anything takes it for a size
        raise ValueError(
            f"{function}() got {name}={value!r}: the first argument is {name}, not include_top as in "
            f"keras.applications; pass include_top={value} by keyword."
        )


def _same(name: str, value, alias: str, alias_value):
    """``value`` or ``alias_value`` (two spellings of one argument); a ``ValueError`` when both are given and differ."""
    if value is not None and alias_value is not None and value != alias_value:
        raise ValueError(f"{name}={value!r} and {alias}={alias_value!r} disagree; pass one of them.")
    return alias_value if value is None else value


def _input_size(image_size, channels, input_shape, input_tensor) -> tuple[Any, int | None, bool]:
    """``(image_size, channels, dynamic)`` from ``image_size``/``channels`` and their other spellings:
    keras.applications' ``input_shape`` and the shape of ``input_tensor``."""
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
            known = None if image_size is None else _pair(image_size)
            if known is not None and known != (height, width):
                raise ValueError(f"image_size={image_size!r} and {what} {shape} disagree; pass one of them.")
            image_size = image_size if image_size is not None else size
        if depth is not None:
            if channels is not None and channels != depth:
                raise ValueError(f"channels={channels} and {what} {shape} disagree; pass one of them.")
            channels = depth
    return image_size, channels, dynamic


def _pair(size) -> tuple:
    return tuple(size) if isinstance(size, (tuple, list)) else (size, size)


def _preprocessed(images, image_size, channels: int | None):
    """An :class:`ImagePreprocessor` of ``image_size`` on ``images`` (or on a new ``(None, None, channels)`` input)."""
    if images is None:
        images = keras.Input((None, None, 3 if channels is None else channels), name="images")
    return ImagePreprocessor(image_size, name="preprocessing")(images)


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
    channels: int | None = None,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    fc_norm: bool = False,
    dynamic_image_size: bool = False,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    classes: int | None = None,
    include_preprocessing: bool = False,
    remat: bool = False,
    name: str | None = None,
    **overrides: int,
) -> keras.Model:
    """Build a Vision Transformer (plain or hybrid) as a functional ``keras.Model``.

    Args:
        variant: a name of :mod:`keras_vit.variants`: ``"B/16"``, ``"ViT_B16"``, ``"R50+B/16"``,
            ``"ViT_R26_S32"``, ... ``overrides`` (``patch_size``, ``hidden_size``, ``depth``, ``num_heads``,
            ``mlp_dim``, ``resnet_stages``) replace fields of it. ``None`` needs the first five.
        image_size: input height and width (int or ``(h, w)``), a multiple of the stride (the patch size,
            times the ResNet's stride for a hybrid). ``None``: the checkpoint's resolution with ``weights``, else 224.
        include_top: end in the classification head; else return features (see ``pooling``).
        weights: ``None`` (random init), a zoo catalogue name (``python -m keras_vit.zoo list``; downloaded into
            the Keras cache) or a path to a Google ``.npz`` checkpoint (see :mod:`keras_vit.checkpoints`).
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
        channels: input channels (``None``: ``input_shape``'s or ``input_tensor``'s, else 3); pretrained weights
            need 3.
        resnet: make (or tune) a hybrid: units per stage of a BiT ResNet (``(3, 4, 9)``) or a mapping of
            :class:`keras_vit.resnet.ResNetStem` arguments (``num_layers`` defaults to a hybrid variant's
            stages), run on the image before the embedding. ``patch_size`` then applies to its feature
            map (1 for the published hybrids).
        fc_norm: apply the final LayerNorm after the pooling (timm's ``fc_norm``, for its GAP models).
        dynamic_image_size: take images of any size (a multiple of the stride): input ``(None, None,
            channels)``, position embeddings (learned for ``image_size``) interpolated in the graph
            (corner-aligned linear, as loading at a fixed size; see :class:`keras_vit.position.DynamicPositionEmbs`).
        input_tensor: a Keras tensor to build the model on (e.g. the output of other layers); the model starts
            at the ``keras.Input`` it comes from, keeping those layers. Its size is the image size when
            ``image_size`` is not given.
        input_shape: keras.applications' spelling of ``(image_size, image_size, channels)``, e.g. ``(384, 384, 3)``;
            ``(None, None, 3)`` means ``dynamic_image_size=True``.
        classes: keras.applications' spelling of ``num_classes``.
        include_preprocessing: put a :class:`~keras_vit.preprocessing.ImagePreprocessor` (resize to the model's
            image size, scale to [-1, 1]) in front: the model then takes ``(B, H, W, channels)`` images in
            [0, 255] (uint8 or float) of any size.
        remat: rematerialise every encoder block while training (recompute its activations in the backward
            pass instead of keeping them): less memory for one more forward pass of the encoder; results are
            unchanged. Saved in the model's config.

    Inputs are images scaled to [-1, 1] (see :func:`keras_vit.preprocess_input`), unless ``include_preprocessing``.
    Two spellings of one argument (``image_size`` and ``input_shape``, ``num_classes`` and ``classes``) must agree.
    """
    _check_first_argument("ViT", "variant", variant)
    architecture, resnet_options = _architecture(variant, resnet, overrides)
    check_options(classifier, pooling, position_embedding)
    num_classes = _same("num_classes", num_classes, "classes", classes)
    raw_tensor, input_tensor = input_tensor, None if include_preprocessing else input_tensor
    image_size, channels, dynamic = _input_size(image_size, channels, input_shape, input_tensor)
    if include_preprocessing and dynamic_image_size:
        raise ValueError("include_preprocessing resizes every image to image_size: leave dynamic_image_size off.")
    dynamic_image_size = dynamic_image_size or (dynamic and not include_preprocessing)
    if weights is not None:
        if channels not in (None, 3):
            raise ValueError(f"Pretrained weights need 3 input channels, got channels={channels}.")
        weights = read_checkpoint(weights)
        image_size, num_classes, representation_size = checkpoint_defaults(
            weights, image_size, num_classes, representation_size
        )
    image_size = DEFAULT_IMAGE_SIZE if image_size is None else image_size
    if include_preprocessing:
        input_tensor = _preprocessed(raw_tensor, image_size, channels)
    model = build_vit(
        architecture,
        image_size=image_size,
        num_classes=DEFAULT_NUM_CLASSES if num_classes is None else num_classes,
        include_top=include_top,
        classifier=classifier,
        representation_size=representation_size,
        pooling=pooling,
        classifier_activation=classifier_activation,
        dropout=dropout,
        attention_dropout=attention_dropout,
        drop_path=drop_path,
        gelu=gelu,
        position_embedding=position_embedding,
        channels=3 if channels is None else channels,
        resnet_options=resnet_options,
        fc_norm=fc_norm,
        dynamic_image_size=dynamic_image_size,
        input_tensor=input_tensor,
        remat=remat,
        name=name or _model_name(variant, architecture),
    )
    if input_tensor is not None:  # start at the keras.Input behind it, keeping the layers in between:
        # keras.Model(input_tensor, ...) would cut them off, so run the layers (flat, not nested) on it again
        sources = keras.utils.get_source_inputs(input_tensor)
        inputs = sources[0] if len(sources) == 1 else sources
        model = keras.Model(inputs, model.call(input_tensor), name=model.name)
    if weights is not None:
        load_weights(model, weights)
    return model


def _named_constructor(variant: str) -> Callable[..., keras.Model]:
    """``ViT_B16``, ``ViT_R50_B16``, ...: :func:`ViT` with ``variant`` fixed; a hybrid's also takes its
    ResNet's numerics (:data:`RESNET_NUMERICS`) as keywords."""
    architecture = parse_variant(variant)
    name = constructor_name(variant)
    hybrid = architecture.resnet_stages is not None

    def constructor(
        image_size: int | tuple[int, int] | None = None,
        *,
        include_top: bool = True,
        weights: str | None = None,
        num_classes: int | None = None,
        **kwargs,
    ) -> keras.Model:
        _check_first_argument(name, "image_size", image_size)
        if hybrid:
            if "resnet" in kwargs:
                raise TypeError(
                    f"{name}() fixes the ResNet to {architecture.resnet_stages}; use keras_vit.ViT(resnet=...) instead."
                )
            kwargs["resnet"] = {option: kwargs.pop(option, default) for option, default in RESNET_NUMERICS.items()}
        return ViT(
            variant, image_size=image_size, include_top=include_top, weights=weights, num_classes=num_classes, **kwargs
        )

    constructor.__name__ = constructor.__qualname__ = name
    constructor.__doc__ = f"ViT-{variant}: {architecture}.\n\nEvery keyword argument of :func:`keras_vit.ViT` applies."
    if hybrid:
        constructor.__doc__ += (
            " ``std_conv_epsilon``, ``group_norm_epsilon`` and ``weight_standardization`` set the ResNet's numerics "
            "(see :class:`keras_vit.ResNetStem`); the defaults are the published ones, "
            "``**keras_vit.resnet.TIMM_RESNET`` gives timm's."
        )
        signature = inspect.signature(constructor)
        *named, var_keyword = signature.parameters.values()
        numerics = [
            inspect.Parameter(option, inspect.Parameter.KEYWORD_ONLY, default=default)
            for option, default in RESNET_NUMERICS.items()
        ]
        constructor.__signature__ = signature.replace(parameters=[*named, *numerics, var_keyword])
    return constructor


# One constructor per row of the table, named by keras_vit.variants.constructor_name: ViT_B16, ViT_R50_B16, ...
NAMED_CONSTRUCTORS: dict[str, Callable[..., keras.Model]] = {
    constructor_name(variant): _named_constructor(variant) for variant in NAMED_VARIANTS
}
globals().update(NAMED_CONSTRUCTORS)

__all__ = ["NAMED_CONSTRUCTORS", "RESNET_NUMERICS", "ViT", *NAMED_CONSTRUCTORS]
