"""The user-facing ViT: ``ViT(variant, ...)`` and one named constructor per variant of :data:`NAMED_VARIANTS`.

A variant is a name from the one table in :mod:`keras_vit.variants`: ``"B/16"`` (size, patch size) or a
hybrid, ``"R50+B/16"`` (ResNet, size, total stride). ``ViT`` parses it into a :class:`~keras_vit.config.ViTConfig`,
replaces the fields given (any field is a keyword, the architecture's included: ``ViT("B/16", depth=2,
gelu="exact")``), builds (:func:`keras_vit.models.build_vit`) and loads ``weights=`` (:mod:`keras_vit.checkpoints`).
keras.applications habits work: ``input_shape=``, ``classes=``, ``input_tensor=`` and ``include_preprocessing=True``
(raw photos of any size in); ``include_top`` is keyword-only. The named constructors are written out below, each
with ``ViT``'s arguments.

    constructor   variant     ResNet units/stage   stride   encoder
    ViT_Ti16      Ti/16       -                    16       Ti: 192 wide, 12 blocks
    ViT_B16       B/16        -                    16       B: 768 wide, 12 blocks
    ViT_R50_B16   R50+B/16    (3, 4, 9)            16       B: 768 wide, 12 blocks
    ViT_R50_L32   R50+L/32    (3, 4, 6, 3)         32       L: 1024 wide, 24 blocks
    ViT_R26_S32   R26+S/32    (2, 2, 2, 2)         32       S: 384 wide, 12 blocks
    ViT_R26_B32   R26+B/32    (2, 2, 2, 2)         32       B: 768 wide, 12 blocks

(and ``ViT_S16``, ``ViT_S32``, ``ViT_B8``, ``ViT_B32``, ``ViT_L16``, ``ViT_L32``, ``ViT_H14``). The image towers of the
ViT family (:data:`~keras_vit.variants.FAMILY_VARIANTS`, docs/family.md) have theirs: ``CLIP_B32``, ``CLIP_B16``,
``CLIP_L14``, ``SigLIP_B16``, ``SigLIP_B16_384``, ``DeiT_Ti16`` ... ``DeiT_B16_Distilled``, ``DeiT3_S16`` ...,
``DINOv2_S14`` ... ``DINOv2_G14_Reg4``; the name also sets the family's config fields (tokens, layer scale, MLP,
GELU, image size), which any keyword overrides. A hybrid's
``/16`` or ``/32`` is its total stride; the embedding's patch size is 1 (``vit_jax/configs/models.py``;
timm's ``vit_base_r50_s16_224``, ``vit_large_r50_s32_224`` and ``vit_small_r26_s32_224`` agree).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import keras

from keras_vit import zoo
from keras_vit.checkpoints.load import checkpoint_defaults, load_weights, model_from_checkpoint
from keras_vit.checkpoints.read import CheckpointArrays, read_checkpoint
from keras_vit.config import DEFAULT_IMAGE_SIZE, GROUPS, ViTConfig, field_names, layer_field_names, resnet_fields
from keras_vit.models import build_vit
from keras_vit.variants import (
    FAMILY_VARIANTS,
    NAMED_VARIANTS,
    Architecture,
    constructor_name,
    family_variant,
    parse_timm_name,
    parse_variant,
)

DEFAULT_VARIANT = "B/16"  # ViT()'s model when neither a saved model nor the options give an architecture


def _config_fields(function: str, variant: str | None, resnet, options: Mapping[str, Any]) -> dict[str, Any]:
    """The config fields of ``options`` and ``resnet``; a ``TypeError`` for keywords that are none (a plain ViT's
    ResNet options included)."""
    unknown = sorted(set(options) - set(field_names(*GROUPS)))
    fields = dict(options)
    if resnet is not None:
        fields.update(resnet_fields(dict(resnet) if isinstance(resnet, Mapping) else {"num_layers": resnet}))
    stages = fields.get("resnet_stages", None if variant is None else parse_variant(variant).resnet_stages)
    if stages is None:
        unknown += sorted(set(options) & set(layer_field_names("resnet")))
        if isinstance(resnet, Mapping):
            raise ValueError(f"A resnet mapping needs 'num_layers' (units per stage), got keys {sorted(resnet)}.")
    if unknown:
        raise TypeError(
            f"{function}() got unexpected keyword arguments {unknown}; the options are the fields of "
            f"keras_vit.config.ViTConfig (a hybrid's ResNet options need resnet_stages): {list(field_names(*GROUPS))}."
        )
    return fields


def _model_name(variant: str | None, architecture: Architecture) -> str:
    """The variant's name with the patch and ResNet actually built (``ViT_S32(depth=1)`` is still ``vit_s32``)."""
    if variant is None:
        return architecture.model_name
    if family_variant(variant) is not None:
        return constructor_name(variant).lower()  # clip_b16, siglip_b16_384
    named = parse_variant(variant).replace(patch_size=architecture.patch_size, resnet_stages=architecture.resnet_stages)
    return named.model_name


def _name_parts(name: str | None) -> tuple[str | None, int | None, str | None]:
    """``(variant, image size, checkpoint tag)`` of what ``ViT``'s first argument names: a variant (``"B/16"``: no
    size, no tag), a timm model name (``"vit_base_patch16_224.augreg2_in21k_ft_in1k"``: its size and tag) or a
    catalogue name (``"B_16.augreg_in21k_ft_in1k_384"``: its variant and resolution, the name as the tag)."""
    timm = None if name is None else parse_timm_name(name)
    if timm is not None:
        return timm
    entry = None if name is None else zoo.find(name)
    if entry is not None:
        return entry.variant, entry.image_size, entry.name
    return name, None, None


def _catalogue_size(weights: str, variant: str | None, image_size) -> tuple[list, int]:
    """The catalogue entries of ``variant`` and the (square) resolution asked for, for ``weights=`` to choose from."""
    if variant is None:
        raise ValueError(f"weights={weights!r} needs a variant ('B/16', ...) to choose its checkpoint.")
    size = image_size or DEFAULT_IMAGE_SIZE
    height, width = (size, size) if isinstance(size, int) else size
    if height != width:
        raise ValueError(f"weights={weights!r}: the published checkpoints are square, got image_size={size}.")
    architecture = parse_variant(variant)
    entries = [e for e in zoo.catalogue() if e.variant in NAMED_VARIANTS and parse_variant(e.variant) == architecture]
    return entries, height


def _alias_checkpoint(alias: str, variant: str | None, image_size) -> str:
    """The catalogue name ``weights=alias`` (``"imagenet"``, ...) stands for with ``variant`` at ``image_size``."""
    return zoo.resolve_alias(alias, *_catalogue_size(alias, variant, image_size))


def _tag_checkpoint(tag: str, variant: str | None, image_size) -> str:
    """The catalogue entry of ``variant`` at ``image_size`` whose tag is timm's ``tag`` (``"augreg_in21k_ft_in1k"``;
    the catalogue writes a fine-tune's resolution after it, ``..._224``); a ``ValueError`` when there is none."""
    entries, size = _catalogue_size(tag, variant, image_size)
    for entry in entries:
        if entry.image_size == size and entry.name.partition(".")[2] in (tag, f"{tag}_{size}"):
            return entry.name
    there = ", ".join(f"{e.name} ({e.image_size} px)" for e in entries) or "none"
    raise ValueError(
        f"timm's tag {tag!r} of {variant} at {size} px has no checkpoint in the keras-vit catalogue (Google's "
        "files); a timm or Hugging Face file of it loads by its path (weights='model.safetensors'). The catalogue "
        f"has: {there}."
    )


def _checkpoint_name(weights: str, variant: str | None, image_size, tag: str | None) -> str:
    """What ``weights=`` names: an alias (``"imagenet"``: the model name's tag when it has one, else the catalogue's
    choice for the variant and size), a tagged timm name or a timm tag of the variant (its catalogue entry), or
    else itself (a catalogue name, a path)."""
    if weights in zoo.aliases():
        if tag is None:
            return _alias_checkpoint(weights, variant, image_size)
        return tag if zoo.find(tag) is not None else _tag_checkpoint(tag, variant, image_size)
    timm = parse_timm_name(weights)
    if timm is not None and timm[2] is not None:
        named, size, tag = timm
        if variant is not None and parse_variant(named) != parse_variant(variant):
            raise ValueError(f"weights={weights!r} is timm's {named}; the model is {variant}.")
        return _tag_checkpoint(tag, named, image_size or size)
    if zoo.find(weights) is not None or "/" in weights or "." in weights:
        return weights
    if variant is not None and any(e.name.partition(".")[2].startswith(weights) for e in zoo.catalogue()):
        return _tag_checkpoint(weights, variant, image_size)
    return weights


def _saved_fields(
    weights: CheckpointArrays, variant: str | None, fields: Mapping[str, Any], num_classes: int | None
) -> dict[str, Any]:
    """``fields`` over the options of the saved keras-vit model ``weights`` (its architecture, structure, numerics,
    training options, and its class names unless ``num_classes`` asks for another head); a ``ValueError`` naming what
    differs where ``variant``, an architecture field or a structure option (but the head's ``representation_size``)
    asks for another model than the file's."""
    saved = weights.config
    asked = {name: fields[name] for name in field_names("architecture") if name in fields}
    wanted = (saved.architecture if variant is None else parse_variant(variant)).replace(**asked)
    structure = [name for name in field_names("structure") if name in fields and name != "representation_size"]
    asked_model = {**dataclasses.asdict(wanted), **{name: fields[name] for name in structure}}
    file_model = {**dataclasses.asdict(saved.architecture), **{name: getattr(saved, name) for name in structure}}
    differ = [f"{k} {v!r} (the file's: {file_model[k]!r})" for k, v in asked_model.items() if v != file_model[k]]
    if differ:
        raise ValueError(
            f"{weights.source} holds a {saved.architecture.variant or saved.architecture.model_name} model; the model "
            f"asked for differs: {', '.join(differ)}. Leave the variant and those options out (keras_vit.ViT(None, "
            "weights=...); a command's --model) to take the file's."
        )
    kept = {k: v for k, v in saved.to_dict().items() if k in field_names("architecture", "structure", "numerics")}
    kept.update({k: getattr(saved, k) for k in field_names("training")})
    kept.pop("representation_size")  # the head's, with num_classes (checkpoint_defaults)
    if saved.include_top and num_classes in (None, saved.num_classes):
        kept["class_names"] = saved.class_names
    return {**kept, **fields}


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


def _on_tensor(model: keras.Model, input_tensor) -> keras.Model:
    """``model`` run on ``input_tensor``, starting at the ``keras.Input`` it comes from and keeping the layers in
    between: ``keras.Model(input_tensor, ...)`` would cut them off, so the model's layers run on it (flat, not
    nested) as a plain functional model."""
    sources = keras.utils.get_source_inputs(input_tensor)
    inputs = sources[0] if len(sources) == 1 else sources
    return keras.Model(inputs, model.call(input_tensor), name=model.name)


def ViT(
    variant: str | None = None,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = None,
    image_size: int | tuple[int, int] | None = None,
    num_classes: int | None = None,
    channels: int | None = None,
    include_preprocessing: bool = False,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> keras.Model:
    """Build a Vision Transformer (plain or hybrid) as a functional ``keras.Model``: parse the variant, replace
    the fields given, build, load the weights.

    Args:
        variant: a name of :mod:`keras_vit.variants`: ``"B/16"``, ``"ViT_B16"``, ``"R50+B/16"``,
            ``"ViT_R26_S32"``, ...; a timm model name (``"vit_base_patch16_224"``, ``"vit_base_r50_s16_384"``, with
            or without a tag: ``".augreg2_in21k_ft_in1k"``) or a catalogue name (``"B_16.augreg_in21k_ft_in1k_384"``),
            whose resolution is then the default image size. ``None``: the architecture of a saved keras-vit model
            given as ``weights``, or the one ``options`` give (``patch_size``, ``hidden_size``, ``depth``,
            ``num_heads``, ``mlp_dim``), else ``"B/16"``. A variant that differs from a saved model's is refused,
            naming what differs.
        include_top: end in the classification head; else return features (see ``pooling``).
        weights: ``None`` (random init), a zoo catalogue name (``python -m keras_vit.zoo list``; downloaded into
            the Keras cache), ``"imagenet"`` / ``"imagenet21k"`` / ``"augreg"`` (the catalogue's choice for the
            variant and size; with a tagged model name, that tag's checkpoint), a timm tag or tagged timm name
            (``"augreg_in21k_ft_in1k"``: its catalogue entry) or a path to a checkpoint (see
            :mod:`keras_vit.checkpoints`), a saved keras-vit model (``.keras``) included: its architecture, options
            and class names come with it. Position embeddings are resized to ``image_size``.
        input_tensor: a Keras tensor to build the model on (e.g. the output of other layers); the model starts
            at the ``keras.Input`` it comes from, keeping those layers. Its size is the image size when
            ``image_size`` is not given.
        input_shape: ``(image_size, image_size, channels)``, e.g. ``(384, 384, 3)``; ``(None, None, 3)`` means
            ``dynamic_image_size=True``.
        pooling: with ``include_top=False``: ``None`` returns all tokens ``(B, N, D)``, ``"token"`` the class
            token, ``"avg"`` / ``"max"`` the mean / channel-wise maximum of the patch tokens.
        classes: keras.applications' spelling of ``num_classes``.
        classifier_activation: activation of the head; ``None`` returns logits.
        image_size: input height and width (int or ``(h, w)``), a multiple of the stride (the patch size, times
            the ResNet's stride for a hybrid). ``None``: the checkpoint's resolution with ``weights``, else 224.
        num_classes: classes of the head. ``None``: the checkpoint's classifier with ``weights`` (its classes and
            its ``pre_logits`` layer), else 1000. Another number leaves the head (and an unused ``pre_logits``)
            at its initialisation, for fine-tuning.
        channels: input channels (``None``: ``input_shape``'s or ``input_tensor``'s, else 3); pretrained weights
            need 3.
        include_preprocessing: put a :class:`~keras_vit.preprocessing.ImagePreprocessor` (resize to the model's
            image size, scale to [-1, 1]) in front: the model then takes ``(B, H, W, channels)`` images in
            [0, 255] (uint8 or float) of any size.
        resnet: make (or tune) a hybrid: units per stage of a BiT ResNet (``(3, 4, 9)``) or a mapping of
            :class:`keras_vit.resnet.ResNetStem` arguments (``num_layers`` defaults to a hybrid variant's stages),
            run on the image before the embedding. ``patch_size`` then applies to its feature map.
        name: the model's name (default: the variant's, ``vit_b16``).
        **options: any field of :class:`keras_vit.config.ViTConfig` (its docs give each one's meaning and default):
            the architecture's (``depth=2``), ``classifier="gap"``, ``representation_size``, ``gelu="exact"``,
            ``position_embedding="sincos_2d"``, ``fc_norm``, ``dropout``, ``drop_path``,
            ``remat``, ``dynamic_image_size``, a hybrid's ``std_conv_epsilon``, ...

    Inputs are images scaled to [-1, 1] (see :func:`keras_vit.preprocess_input`), unless ``include_preprocessing``.
    Two spellings of one argument (``image_size`` and ``input_shape``, ``num_classes`` and ``classes``) must agree.
    The model is a :class:`keras_vit.models.VisionTransformer` (``model.config``), or with ``input_tensor`` a
    plain functional model.
    """
    _check_first_argument("ViT", "variant", variant)
    variant, name_size, tag = _name_parts(variant)
    if image_size is None and input_shape is None and input_tensor is None:
        image_size = name_size
    fields = _config_fields("ViT", variant, resnet, options)
    num_classes = _same("num_classes", num_classes, "classes", classes)
    new_head = not include_top or num_classes is not None  # the checkpoint's head dropped or replaced on purpose
    image_size, channels, dynamic = _input_size(
        image_size, channels, input_shape, None if include_preprocessing else input_tensor
    )
    if weights is not None:
        if channels not in (None, 3):
            raise ValueError(f"Pretrained weights need 3 input channels, got channels={channels}.")
        if isinstance(weights, str):
            weights = _checkpoint_name(weights, variant, image_size, tag)
            entry = zoo.find(weights)
            if entry is not None and include_preprocessing:  # the crop and resize its evaluation used
                fields.setdefault("crop_fraction", entry.preprocessing["crop_fraction"])
                fields.setdefault("interpolation", entry.preprocessing["interpolation"])
        weights = read_checkpoint(weights)
        if weights.config is not None:  # a saved keras-vit model: its architecture and options unless given
            fields, variant = _saved_fields(weights, variant, fields, num_classes), None
        image_size, num_classes, fields["representation_size"] = checkpoint_defaults(
            weights, image_size, num_classes, fields.get("representation_size")
        )
    given = dict(image_size=image_size, num_classes=num_classes, channels=channels)
    fields.update({key: value for key, value in given.items() if value is not None})
    fields["dynamic_image_size"] = fields.get("dynamic_image_size", False) or (dynamic and not include_preprocessing)
    if variant is None and not set(fields) & set(field_names("architecture")):
        variant = DEFAULT_VARIANT
    config = ViTConfig.from_variant(
        variant,
        include_top=include_top,
        pooling=pooling,
        classifier_activation=classifier_activation,
        include_preprocessing=include_preprocessing,
        **fields,
    )
    model = build_vit(config, name=name or _model_name(variant, config.architecture))
    if weights is not None:
        load_weights(model, weights, new_head=new_head, resize_method=config.position_interpolation)
    return model if input_tensor is None else _on_tensor(model, input_tensor)


def from_preset(preset: str | os.PathLike, **overrides: Any) -> keras.Model:
    """keras-hub's ``from_preset`` for keras-vit (also ``keras_vit.ViT.from_preset``): the model a name or folder
    holds, its architecture read from it. ``preset``: a catalogue name (``"B_16.augreg_in21k_ft_in1k_224"``), a
    tagged timm name (``"vit_base_patch16_224.augreg_in21k_ft_in1k"``: its catalogue entry), a preset folder (one
    :func:`~keras_vit.checkpoints.keras_hub.save_preset` wrote, or keras-hub's ``ViTBackbone``), or any checkpoint
    file. ``overrides``: fields of :class:`~keras_vit.config.ViTConfig` (``image_size``, ``num_classes``, ...)."""
    name = os.fspath(preset)
    timm = parse_timm_name(name)
    if timm is not None and timm[2] is not None:
        name = _tag_checkpoint(timm[2], timm[0], overrides.get("image_size") or timm[1])
    return model_from_checkpoint(name, **overrides)


ViT.from_preset = from_preset


def _named(variant: str, arguments: dict[str, Any]) -> keras.Model:
    """:func:`ViT` of ``variant`` with a named constructor's ``arguments`` (its ``locals()``)."""
    function, arguments = constructor_name(variant), dict(arguments)
    _check_first_argument(function, "image_size", arguments["image_size"])
    stages = parse_variant(variant).resnet_stages
    if stages is not None and arguments["resnet"] is not None:
        raise TypeError(f"{function}() fixes the ResNet to {stages}; use keras_vit.ViT(resnet=...) instead.")
    options = arguments.pop("options")
    return ViT(variant, **arguments, **options)


# The named constructors: ViT(variant, ...) with the keras.applications signature, image_size first.
# Each one's arguments are ViT's (tests/test_applications.py checks it).


def ViT_Ti16(
    image_size: int | tuple[int, int] | None = None,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = None,
    num_classes: int | None = None,
    channels: int | None = None,
    include_preprocessing: bool = False,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> keras.Model:
    """ViT-Ti/16: 192 wide, 12 blocks of 3 heads, 16-pixel patches.

    The arguments are :func:`ViT`'s."""
    return _named("Ti/16", locals())


def ViT_S16(
    image_size: int | tuple[int, int] | None = None,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = None,
    num_classes: int | None = None,
    channels: int | None = None,
    include_preprocessing: bool = False,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> keras.Model:
    """ViT-S/16: 384 wide, 12 blocks of 6 heads, 16-pixel patches.

    The arguments are :func:`ViT`'s."""
    return _named("S/16", locals())


def ViT_S32(
    image_size: int | tuple[int, int] | None = None,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = None,
    num_classes: int | None = None,
    channels: int | None = None,
    include_preprocessing: bool = False,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> keras.Model:
    """ViT-S/32: 384 wide, 12 blocks of 6 heads, 32-pixel patches.

    The arguments are :func:`ViT`'s."""
    return _named("S/32", locals())


def ViT_B8(
    image_size: int | tuple[int, int] | None = None,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = None,
    num_classes: int | None = None,
    channels: int | None = None,
    include_preprocessing: bool = False,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> keras.Model:
    """ViT-B/8: 768 wide, 12 blocks of 12 heads, 8-pixel patches.

    The arguments are :func:`ViT`'s."""
    return _named("B/8", locals())


def ViT_B16(
    image_size: int | tuple[int, int] | None = None,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = None,
    num_classes: int | None = None,
    channels: int | None = None,
    include_preprocessing: bool = False,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> keras.Model:
    """ViT-B/16: 768 wide, 12 blocks of 12 heads, 16-pixel patches.

    The arguments are :func:`ViT`'s."""
    return _named("B/16", locals())


def ViT_B32(
    image_size: int | tuple[int, int] | None = None,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = None,
    num_classes: int | None = None,
    channels: int | None = None,
    include_preprocessing: bool = False,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> keras.Model:
    """ViT-B/32: 768 wide, 12 blocks of 12 heads, 32-pixel patches.

    The arguments are :func:`ViT`'s."""
    return _named("B/32", locals())


def ViT_L16(
    image_size: int | tuple[int, int] | None = None,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = None,
    num_classes: int | None = None,
    channels: int | None = None,
    include_preprocessing: bool = False,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> keras.Model:
    """ViT-L/16: 1024 wide, 24 blocks of 16 heads, 16-pixel patches.

    The arguments are :func:`ViT`'s."""
    return _named("L/16", locals())


def ViT_L32(
    image_size: int | tuple[int, int] | None = None,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = None,
    num_classes: int | None = None,
    channels: int | None = None,
    include_preprocessing: bool = False,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> keras.Model:
    """ViT-L/32: 1024 wide, 24 blocks of 16 heads, 32-pixel patches.

    The arguments are :func:`ViT`'s."""
    return _named("L/32", locals())


def ViT_H14(
    image_size: int | tuple[int, int] | None = None,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = None,
    num_classes: int | None = None,
    channels: int | None = None,
    include_preprocessing: bool = False,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> keras.Model:
    """ViT-H/14: 1280 wide, 32 blocks of 16 heads, 14-pixel patches.

    The arguments are :func:`ViT`'s."""
    return _named("H/14", locals())


def ViT_R50_B16(
    image_size: int | tuple[int, int] | None = None,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = None,
    num_classes: int | None = None,
    channels: int | None = None,
    include_preprocessing: bool = False,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> keras.Model:
    """ViT-R50+B/16: a ResNet of (3, 4, 9) units (stride 16), then B (768 wide, 12 blocks) on its map.

    The arguments are :func:`ViT`'s."""
    return _named("R50+B/16", locals())


def ViT_R50_L32(
    image_size: int | tuple[int, int] | None = None,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = None,
    num_classes: int | None = None,
    channels: int | None = None,
    include_preprocessing: bool = False,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> keras.Model:
    """ViT-R50+L/32: a ResNet of (3, 4, 6, 3) units (stride 32), then L (1024 wide, 24 blocks) on its map.

    The arguments are :func:`ViT`'s."""
    return _named("R50+L/32", locals())


def ViT_R26_S32(
    image_size: int | tuple[int, int] | None = None,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = None,
    num_classes: int | None = None,
    channels: int | None = None,
    include_preprocessing: bool = False,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> keras.Model:
    """ViT-R26+S/32: a ResNet of (2, 2, 2, 2) units (stride 32), then S (384 wide, 12 blocks) on its map.

    The arguments are :func:`ViT`'s."""
    return _named("R26+S/32", locals())


def ViT_R26_B32(
    image_size: int | tuple[int, int] | None = None,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = None,
    num_classes: int | None = None,
    channels: int | None = None,
    include_preprocessing: bool = False,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> keras.Model:
    """ViT-R26+B/32: a ResNet of (2, 2, 2, 2) units (stride 32), then B (768 wide, 12 blocks) on its map.

    The arguments are :func:`ViT`'s."""
    return _named("R26+B/32", locals())


def CLIP_B32(
    image_size: int | tuple[int, int] | None = None,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = None,
    num_classes: int | None = None,
    channels: int | None = None,
    include_preprocessing: bool = False,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> keras.Model:
    """CLIP's ViT-B/32 image tower (OpenAI): B/32 with ``norm_pre``, QuickGELU, LayerNorm epsilon 1e-5 and the
    512-wide image projection as its head (``num_classes=512``): the image embedding.

    The arguments are :func:`ViT`'s."""
    return _named("CLIP-B/32", locals())


def CLIP_B16(
    image_size: int | tuple[int, int] | None = None,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = None,
    num_classes: int | None = None,
    channels: int | None = None,
    include_preprocessing: bool = False,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> keras.Model:
    """CLIP's ViT-B/16 image tower (OpenAI): B/16 with ``norm_pre``, QuickGELU, LayerNorm epsilon 1e-5 and the
    512-wide image projection as its head (``num_classes=512``): the image embedding.

    The arguments are :func:`ViT`'s."""
    return _named("CLIP-B/16", locals())


def CLIP_L14(
    image_size: int | tuple[int, int] | None = None,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = None,
    num_classes: int | None = None,
    channels: int | None = None,
    include_preprocessing: bool = False,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> keras.Model:
    """CLIP's ViT-L/14 image tower (OpenAI): L/14 with ``norm_pre``, QuickGELU, LayerNorm epsilon 1e-5 and the
    768-wide image projection as its head (``num_classes=768``): the image embedding.

    The arguments are :func:`ViT`'s."""
    return _named("CLIP-L/14", locals())


def SigLIP_B16(
    image_size: int | tuple[int, int] | None = None,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = None,
    num_classes: int | None = None,
    channels: int | None = None,
    include_preprocessing: bool = False,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> keras.Model:
    """SigLIP's ViT-B/16 image tower at 224: B/16 without class token, pooled by the MAP head
    (``classifier="map"``); its embedding is ``include_top=False, pooling="map"``.

    The arguments are :func:`ViT`'s."""
    return _named("SigLIP-B/16", locals())


def SigLIP_B16_384(
    image_size: int | tuple[int, int] | None = None,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = None,
    num_classes: int | None = None,
    channels: int | None = None,
    include_preprocessing: bool = False,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> keras.Model:
    """SigLIP's ViT-B/16 image tower at 384: B/16 without class token, pooled by the MAP head
    (``classifier="map"``, ``image_size=384``); its embedding is ``include_top=False, pooling="map"``.

    The arguments are :func:`ViT`'s."""
    return _named("SigLIP-B/16-384", locals())


def DeiT_Ti16(
    image_size: int | tuple[int, int] | None = None,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = None,
    num_classes: int | None = None,
    channels: int | None = None,
    include_preprocessing: bool = False,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> keras.Model:
    """DeiT-Ti/16 (Touvron et al. 2021): ViT-Ti/16 trained on ImageNet-1k alone, exact GELU.

    The arguments are :func:`ViT`'s."""
    return _named("DeiT-Ti/16", locals())


def DeiT_S16(
    image_size: int | tuple[int, int] | None = None,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = None,
    num_classes: int | None = None,
    channels: int | None = None,
    include_preprocessing: bool = False,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> keras.Model:
    """DeiT-S/16 (Touvron et al. 2021): ViT-S/16 trained on ImageNet-1k alone, exact GELU.

    The arguments are :func:`ViT`'s."""
    return _named("DeiT-S/16", locals())


def DeiT_B16(
    image_size: int | tuple[int, int] | None = None,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = None,
    num_classes: int | None = None,
    channels: int | None = None,
    include_preprocessing: bool = False,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> keras.Model:
    """DeiT-B/16 (Touvron et al. 2021): ViT-B/16 trained on ImageNet-1k alone, exact GELU.

    The arguments are :func:`ViT`'s."""
    return _named("DeiT-B/16", locals())


def DeiT_Ti16_Distilled(
    image_size: int | tuple[int, int] | None = None,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = None,
    num_classes: int | None = None,
    channels: int | None = None,
    include_preprocessing: bool = False,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> keras.Model:
    """DeiT-Ti/16 distilled: Ti/16 with a distillation token and its head (logits: the mean of both).

    The arguments are :func:`ViT`'s."""
    return _named("DeiT-Ti/16-Distilled", locals())


def DeiT_S16_Distilled(
    image_size: int | tuple[int, int] | None = None,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = None,
    num_classes: int | None = None,
    channels: int | None = None,
    include_preprocessing: bool = False,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> keras.Model:
    """DeiT-S/16 distilled: S/16 with a distillation token and its head (logits: the mean of both).

    The arguments are :func:`ViT`'s."""
    return _named("DeiT-S/16-Distilled", locals())


def DeiT_B16_Distilled(
    image_size: int | tuple[int, int] | None = None,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = None,
    num_classes: int | None = None,
    channels: int | None = None,
    include_preprocessing: bool = False,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> keras.Model:
    """DeiT-B/16 distilled: B/16 with a distillation token and its head (logits: the mean of both).

    The arguments are :func:`ViT`'s."""
    return _named("DeiT-B/16-Distilled", locals())


def DeiT3_S16(
    image_size: int | tuple[int, int] | None = None,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = None,
    num_classes: int | None = None,
    channels: int | None = None,
    include_preprocessing: bool = False,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> keras.Model:
    """DeiT III S/16 (Touvron et al. 2022): S/16, layer scale 1e-6, no position embedding on the class token.

    The arguments are :func:`ViT`'s."""
    return _named("DeiT3-S/16", locals())


def DeiT3_B16(
    image_size: int | tuple[int, int] | None = None,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = None,
    num_classes: int | None = None,
    channels: int | None = None,
    include_preprocessing: bool = False,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> keras.Model:
    """DeiT III B/16 (Touvron et al. 2022): B/16, layer scale 1e-6, no position embedding on the class token.

    The arguments are :func:`ViT`'s."""
    return _named("DeiT3-B/16", locals())


def DeiT3_L16(
    image_size: int | tuple[int, int] | None = None,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = None,
    num_classes: int | None = None,
    channels: int | None = None,
    include_preprocessing: bool = False,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> keras.Model:
    """DeiT III L/16 (Touvron et al. 2022): L/16, layer scale 1e-6, no position embedding on the class token.

    The arguments are :func:`ViT`'s."""
    return _named("DeiT3-L/16", locals())


def DINOv2_S14(
    image_size: int | tuple[int, int] | None = None,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = None,
    num_classes: int | None = None,
    channels: int | None = None,
    include_preprocessing: bool = False,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> keras.Model:
    """DINOv2 S/14 (Oquab et al. 2024): S/14, layer scale, 518 px, bicubic position interpolation.

    The arguments are :func:`ViT`'s."""
    return _named("DINOv2-S/14", locals())


def DINOv2_B14(
    image_size: int | tuple[int, int] | None = None,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = None,
    num_classes: int | None = None,
    channels: int | None = None,
    include_preprocessing: bool = False,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> keras.Model:
    """DINOv2 B/14 (Oquab et al. 2024): B/14, layer scale, 518 px, bicubic position interpolation.

    The arguments are :func:`ViT`'s."""
    return _named("DINOv2-B/14", locals())


def DINOv2_L14(
    image_size: int | tuple[int, int] | None = None,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = None,
    num_classes: int | None = None,
    channels: int | None = None,
    include_preprocessing: bool = False,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> keras.Model:
    """DINOv2 L/14 (Oquab et al. 2024): L/14, layer scale, 518 px, bicubic position interpolation.

    The arguments are :func:`ViT`'s."""
    return _named("DINOv2-L/14", locals())


def DINOv2_G14(
    image_size: int | tuple[int, int] | None = None,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = None,
    num_classes: int | None = None,
    channels: int | None = None,
    include_preprocessing: bool = False,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> keras.Model:
    """DINOv2 g/14 (Oquab et al. 2024): 1536 wide, 40 blocks of 24 heads, SwiGLU MLP, layer scale, 518 px.

    The arguments are :func:`ViT`'s."""
    return _named("DINOv2-G/14", locals())


def DINOv2_S14_Reg4(
    image_size: int | tuple[int, int] | None = None,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = None,
    num_classes: int | None = None,
    channels: int | None = None,
    include_preprocessing: bool = False,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> keras.Model:
    """DINOv2 S/14 with 4 register tokens (Darcet et al. 2024).

    The arguments are :func:`ViT`'s."""
    return _named("DINOv2-S/14-Reg4", locals())


def DINOv2_B14_Reg4(
    image_size: int | tuple[int, int] | None = None,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = None,
    num_classes: int | None = None,
    channels: int | None = None,
    include_preprocessing: bool = False,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> keras.Model:
    """DINOv2 B/14 with 4 register tokens (Darcet et al. 2024).

    The arguments are :func:`ViT`'s."""
    return _named("DINOv2-B/14-Reg4", locals())


def DINOv2_L14_Reg4(
    image_size: int | tuple[int, int] | None = None,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = None,
    num_classes: int | None = None,
    channels: int | None = None,
    include_preprocessing: bool = False,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> keras.Model:
    """DINOv2 L/14 with 4 register tokens (Darcet et al. 2024).

    The arguments are :func:`ViT`'s."""
    return _named("DINOv2-L/14-Reg4", locals())


def DINOv2_G14_Reg4(
    image_size: int | tuple[int, int] | None = None,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: Sequence[int | None] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = None,
    num_classes: int | None = None,
    channels: int | None = None,
    include_preprocessing: bool = False,
    resnet: Sequence[int] | Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> keras.Model:
    """DINOv2 g/14 (SwiGLU MLP) with 4 register tokens (Darcet et al. 2024).

    The arguments are :func:`ViT`'s."""
    return _named("DINOv2-G/14-Reg4", locals())


NAMED_CONSTRUCTORS = {name: globals()[name] for name in map(constructor_name, (*NAMED_VARIANTS, *FAMILY_VARIANTS))}

__all__ = ["NAMED_CONSTRUCTORS", "ViT", *NAMED_CONSTRUCTORS]
