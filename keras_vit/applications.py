"""``ViT(variant, ...)``, ``from_preset`` and one named constructor per variant (``ViT_B16``, ``CLIP_B16``, ...)
with the keras.applications signature (image size first). Arguments and variants: docs/models.md."""

from __future__ import annotations

import difflib
import inspect
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

import keras

from keras_vit import zoo
from keras_vit.checkpoints.keras_files import keras_weights_file
from keras_vit.checkpoints.load import checkpoint_model_config, load_weights, model_from_checkpoint, read_checkpoint
from keras_vit.checkpoints.source import CheckpointArrays
from keras_vit.config import GROUPS, ViTConfig, field_names, layer_field_names, resnet_fields
from keras_vit.inputs import image_data_format, input_size, on_tensor, same
from keras_vit.models import build_vit
from keras_vit.names import checkpoint_name, name_parts, tag_checkpoint
from keras_vit.variants import (
    FAMILY_VARIANTS,
    NAMED_VARIANTS,
    Architecture,
    constructor_name,
    family_variant,
    parse_timm_name,
    parse_variant,
)

if sys.version_info >= (3, 11):  # at run time too, so typing.get_type_hints reads the constructors
    from typing import Unpack
elif TYPE_CHECKING:
    from typing_extensions import Unpack

DEFAULT_VARIANT = "B/16"  # ViT()'s model when neither a saved model nor the options give an architecture


def _config_fields(function: str, variant: str | None, resnet, options: Mapping[str, Any]) -> dict[str, Any]:
    """The config fields of ``options`` and ``resnet``; a ``TypeError`` for keywords that are none."""
    unknown = sorted(set(options) - set(field_names(*GROUPS)))
    fields = dict(options)
    if resnet is not None:
        fields.update(resnet_fields(dict(resnet) if isinstance(resnet, Mapping) else {"num_layers": resnet}))
    stages = fields.get("resnet_stages", None if variant is None else parse_variant(variant).resnet_stages)
    if stages is None:
        unknown += sorted(set(options) & set(layer_field_names("resnet")))
        if isinstance(resnet, Mapping):
            raise ValueError(f"A resnet mapping needs 'num_layers' (units per stage), got keys {sorted(resnet)}.")
    _refuse_unknown(function, unknown)
    return fields


def _refuse_unknown(function: str, unknown: Sequence[str]) -> None:
    """A ``TypeError`` naming ``function``'s ``unknown`` keywords, the closest known spelling of each, and the
    options."""
    if not unknown:
        return
    known = [*_VIT_PARAMETERS, *field_names(*GROUPS)]
    close = {name: difflib.get_close_matches(name, known, n=1) for name in unknown}
    hints = "".join(f" ({name}: did you mean {match[0]!r}?)" for name, match in close.items() if match)
    raise TypeError(
        f"{function}() got unexpected keyword arguments {sorted(unknown)}{hints}; the options are the fields of "
        f"keras_vit.config.ViTConfig (a hybrid's ResNet options need resnet_stages): {list(field_names(*GROUPS))}."
    )


def _model_name(variant: str | None, architecture: Architecture) -> str:
    """The variant's name with the patch and ResNet actually built (``ViT_S32(depth=1)`` is still ``vit_s32``)."""
    if variant is None:
        return architecture.model_name
    if family_variant(variant) is not None:
        return constructor_name(variant).lower()  # clip_b16, siglip_b16_384
    named = parse_variant(variant).replace(patch_size=architecture.patch_size, resnet_stages=architecture.resnet_stages)
    return named.model_name


def _check_first_argument(function: str, name: str, value) -> None:
    """keras.applications' ``include_top``-first habit (``ViT_B16(False)``) is an error, not a 0-pixel model."""
    if isinstance(value, bool):  # bool is an int: check it before anything takes it for a size
        raise ValueError(
            f"{function}() got {name}={value!r}: the first argument is {name}, not include_top as in "
            f"keras.applications; pass include_top={value} by keyword."
        )


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
    dtype: str | keras.DTypePolicy | None = None,
    data_format: str | None = None,
    head_dtype: str | keras.DTypePolicy | None = None,
    **options: Any,
) -> keras.Model:
    """Build a Vision Transformer (plain or hybrid): parse the variant, replace the fields given, build, load.

    Args:
        variant: ``"B/16"``, ``"R50+B/16"``, a timm or catalogue name; ``None``: the model ``weights`` holds (its
            architecture and options, as :func:`~keras_vit.checkpoints.load.model_from_checkpoint`), else the
            architecture ``options`` give, else B/16.
        include_top, pooling, classes, classifier_activation, input_tensor, input_shape: as keras.applications.
        weights: ``None``, a catalogue name, ``"imagenet"``-style alias, timm tag, or a checkpoint path.
        image_size, num_classes, channels: default to the checkpoint's (else 224, 1000, 3).
        include_preprocessing: resize and scale raw ``[0, 255]`` images inside the model.
        resnet: units per stage (or ``ResNetStem`` arguments) to make a hybrid.
        name: the model's name.
        dtype: a Keras dtype policy or its name (``"mixed_bfloat16"``) the layers compute and keep weights in
            (default: the global policy); the head's logits stay float32 under a mixed policy (docs/performance.md).
        data_format: ``"channels_last"`` or ``"channels_first"`` images (and ``input_shape``); default
            ``keras.config.image_data_format()``. The weights are the same either way.
        head_dtype: the classification head's policy or its name (default: ``dtype``'s variable dtype, float32 under
            a mixed policy): ``"float32"`` keeps a ``"bfloat16"`` model's logits float32, ``"mixed_bfloat16"`` makes
            the head compute in bfloat16 too. Quantization (``model.quantize``) takes the head as any other layer.
        **options: any field of :class:`keras_vit.config.ViTConfig` (``dynamic_img_pad=True``: any image size).

    Returns:
        A :class:`keras_vit.models.VisionTransformer` (with ``input_tensor``, a plain functional model).

    Raises:
        ValueError: an argument out of range, two spellings that disagree, a checkpoint that does not fit.
        TypeError: an unknown keyword.
    """
    _check_first_argument("ViT", "variant", variant)
    variant, name_size, tag = name_parts(variant)
    if image_size is None and input_shape is None and input_tensor is None:
        image_size = name_size
    fields = _config_fields("ViT", variant, resnet, options)
    fields["data_format"] = image_data_format(data_format)
    num_classes = same("num_classes", num_classes, "classes", classes)
    new_head = not include_top or num_classes is not None  # the checkpoint's head dropped or replaced on purpose
    image_size, channels, dynamic = input_size(
        image_size, channels, input_shape, None if include_preprocessing else input_tensor, fields["data_format"]
    )
    checkpoint: str | CheckpointArrays | None = weights  # weights=, then the arrays read from it
    if checkpoint is not None:
        if channels not in (None, 3):
            raise ValueError(f"Pretrained weights need 3 input channels, got channels={channels}.")
        if isinstance(checkpoint, str):
            checkpoint = checkpoint_name(checkpoint, variant, image_size, tag)
            entry = zoo.find(checkpoint)
            if entry is not None and include_preprocessing:  # the crop and resize its evaluation used
                fields.setdefault("crop_fraction", entry.preprocessing["crop_fraction"])
                fields.setdefault("interpolation", entry.preprocessing["interpolation"])
        if keras_weights_file(checkpoint) is None:  # a .weights.h5 has no shapes to read before the model exists
            checkpoint = read_checkpoint(checkpoint)
    given = dict(image_size=image_size, num_classes=num_classes, channels=channels)
    fields.update({key: value for key, value in given.items() if value is not None})
    fields["dynamic_image_size"] = fields.get("dynamic_image_size", False) or (dynamic and not include_preprocessing)
    fields.update(
        include_top=include_top,
        pooling=pooling,
        classifier_activation=classifier_activation,
        include_preprocessing=include_preprocessing,
    )
    if isinstance(checkpoint, CheckpointArrays):  # the file's head and size, and without a variant its model
        config = checkpoint_model_config(checkpoint, variant, **fields)
        variant = None if checkpoint.config is not None else variant
    else:
        if variant is None and not set(fields) & set(field_names("architecture")):
            variant = DEFAULT_VARIANT
        config = ViTConfig.from_variant(variant, **fields)
    model = build_vit(
        config, name=name or _model_name(variant, config.architecture), dtype=dtype, head_dtype=head_dtype
    )
    if checkpoint is not None:
        load_weights(model, checkpoint, new_head=new_head, resize_method=config.position_interpolation)
    return model if input_tensor is None else on_tensor(model, input_tensor)


def from_preset(preset: str | os.PathLike, **overrides: Any) -> keras.Model:
    """The model ``preset`` holds (a catalogue name, tagged timm name, preset folder or checkpoint file), its
    architecture read from it; ``overrides``: config fields. Also ``keras_vit.ViT.from_preset``."""
    name = os.fspath(preset)
    timm = parse_timm_name(name)
    if timm is not None and timm[2] is not None:
        name = tag_checkpoint(timm[2], timm[0], overrides.get("image_size") or timm[1])
    return model_from_checkpoint(name, **overrides)


_VIT_PARAMETERS = frozenset(inspect.signature(ViT).parameters)  # ViT's own keywords, beside the config fields

ViT.from_preset = from_preset  # type: ignore[attr-defined]


class ViTArguments(TypedDict, total=False):
    """``ViT``'s keyword arguments for type checkers and IDEs; config fields (``depth=2``) are accepted too."""

    include_top: bool
    weights: str | None
    input_tensor: Any
    input_shape: Sequence[int | None] | None
    pooling: str | None
    classes: int | None
    classifier_activation: str | None
    num_classes: int | None
    channels: int | None
    include_preprocessing: bool
    resnet: Sequence[int] | Mapping[str, Any] | None
    name: str | None
    dtype: str | keras.DTypePolicy | None
    data_format: str | None
    head_dtype: str | keras.DTypePolicy | None


def _named(variant: str, image_size: int | tuple[int, int] | None, arguments: ViTArguments) -> keras.Model:
    """:func:`ViT` of ``variant`` with a named constructor's arguments."""
    function = constructor_name(variant)
    _check_first_argument(function, "image_size", image_size)
    if "variant" in arguments:
        raise TypeError(f"{function}() got an unexpected keyword argument 'variant': it builds {variant}.")
    _refuse_unknown(function, sorted(set(arguments) - _VIT_PARAMETERS - set(field_names(*GROUPS))))
    stages = parse_variant(variant).resnet_stages
    if stages is not None and arguments.get("resnet") is not None:
        raise TypeError(f"{function}() fixes the ResNet to {stages}; use keras_vit.ViT(resnet=...) instead.")
    return ViT(variant, image_size=image_size, **arguments)


def _named_signature() -> inspect.Signature:
    """``ViT``'s signature with ``image_size`` first (positional or keyword) in place of ``variant``."""
    parameters = dict(inspect.signature(ViT).parameters)
    del parameters["variant"]
    first = parameters.pop("image_size").replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return inspect.signature(ViT).replace(parameters=[first, *parameters.values()])


# The named constructors: ViT(variant, ...) with image_size first; each one's signature is ViT's, set below.


def ViT_Ti16(image_size: int | tuple[int, int] | None = None, **kwargs: Unpack[ViTArguments]) -> keras.Model:
    """ViT-Ti/16: 192 wide, 12 blocks of 3 heads, 16-pixel patches."""
    return _named("Ti/16", image_size, kwargs)


def ViT_S16(image_size: int | tuple[int, int] | None = None, **kwargs: Unpack[ViTArguments]) -> keras.Model:
    """ViT-S/16: 384 wide, 12 blocks of 6 heads, 16-pixel patches."""
    return _named("S/16", image_size, kwargs)


def ViT_S32(image_size: int | tuple[int, int] | None = None, **kwargs: Unpack[ViTArguments]) -> keras.Model:
    """ViT-S/32: 384 wide, 12 blocks of 6 heads, 32-pixel patches."""
    return _named("S/32", image_size, kwargs)


def ViT_B8(image_size: int | tuple[int, int] | None = None, **kwargs: Unpack[ViTArguments]) -> keras.Model:
    """ViT-B/8: 768 wide, 12 blocks of 12 heads, 8-pixel patches."""
    return _named("B/8", image_size, kwargs)


def ViT_B16(image_size: int | tuple[int, int] | None = None, **kwargs: Unpack[ViTArguments]) -> keras.Model:
    """ViT-B/16: 768 wide, 12 blocks of 12 heads, 16-pixel patches."""
    return _named("B/16", image_size, kwargs)


def ViT_B32(image_size: int | tuple[int, int] | None = None, **kwargs: Unpack[ViTArguments]) -> keras.Model:
    """ViT-B/32: 768 wide, 12 blocks of 12 heads, 32-pixel patches."""
    return _named("B/32", image_size, kwargs)


def ViT_L16(image_size: int | tuple[int, int] | None = None, **kwargs: Unpack[ViTArguments]) -> keras.Model:
    """ViT-L/16: 1024 wide, 24 blocks of 16 heads, 16-pixel patches."""
    return _named("L/16", image_size, kwargs)


def ViT_L32(image_size: int | tuple[int, int] | None = None, **kwargs: Unpack[ViTArguments]) -> keras.Model:
    """ViT-L/32: 1024 wide, 24 blocks of 16 heads, 32-pixel patches."""
    return _named("L/32", image_size, kwargs)


def ViT_H14(image_size: int | tuple[int, int] | None = None, **kwargs: Unpack[ViTArguments]) -> keras.Model:
    """ViT-H/14: 1280 wide, 32 blocks of 16 heads, 14-pixel patches."""
    return _named("H/14", image_size, kwargs)


def ViT_R50_B16(image_size: int | tuple[int, int] | None = None, **kwargs: Unpack[ViTArguments]) -> keras.Model:
    """ViT-R50+B/16: a ResNet of (3, 4, 9) units (stride 16), then B (768 wide, 12 blocks) on its map."""
    return _named("R50+B/16", image_size, kwargs)


def ViT_R50_L32(image_size: int | tuple[int, int] | None = None, **kwargs: Unpack[ViTArguments]) -> keras.Model:
    """ViT-R50+L/32: a ResNet of (3, 4, 6, 3) units (stride 32), then L (1024 wide, 24 blocks) on its map."""
    return _named("R50+L/32", image_size, kwargs)


def ViT_R26_S32(image_size: int | tuple[int, int] | None = None, **kwargs: Unpack[ViTArguments]) -> keras.Model:
    """ViT-R26+S/32: a ResNet of (2, 2, 2, 2) units (stride 32), then S (384 wide, 12 blocks) on its map."""
    return _named("R26+S/32", image_size, kwargs)


def ViT_R26_B32(image_size: int | tuple[int, int] | None = None, **kwargs: Unpack[ViTArguments]) -> keras.Model:
    """ViT-R26+B/32: a ResNet of (2, 2, 2, 2) units (stride 32), then B (768 wide, 12 blocks) on its map."""
    return _named("R26+B/32", image_size, kwargs)


def CLIP_B32(image_size: int | tuple[int, int] | None = None, **kwargs: Unpack[ViTArguments]) -> keras.Model:
    """CLIP's ViT-B/32 image tower (OpenAI): QuickGELU, ``norm_pre``, a 512-wide projection head."""
    return _named("CLIP-B/32", image_size, kwargs)


def CLIP_B16(image_size: int | tuple[int, int] | None = None, **kwargs: Unpack[ViTArguments]) -> keras.Model:
    """CLIP's ViT-B/16 image tower (OpenAI): QuickGELU, ``norm_pre``, a 512-wide projection head."""
    return _named("CLIP-B/16", image_size, kwargs)


def CLIP_L14(image_size: int | tuple[int, int] | None = None, **kwargs: Unpack[ViTArguments]) -> keras.Model:
    """CLIP's ViT-L/14 image tower (OpenAI): QuickGELU, ``norm_pre``, a 768-wide projection head."""
    return _named("CLIP-L/14", image_size, kwargs)


def SigLIP_B16(image_size: int | tuple[int, int] | None = None, **kwargs: Unpack[ViTArguments]) -> keras.Model:
    """SigLIP's ViT-B/16 image tower at 224 px: no class token, the MAP head (``pooling="map"``: the embedding)."""
    return _named("SigLIP-B/16", image_size, kwargs)


def SigLIP_B16_384(image_size: int | tuple[int, int] | None = None, **kwargs: Unpack[ViTArguments]) -> keras.Model:
    """SigLIP's ViT-B/16 image tower at 384 px: no class token, the MAP head (``pooling="map"``: the embedding)."""
    return _named("SigLIP-B/16-384", image_size, kwargs)


def DeiT_Ti16(image_size: int | tuple[int, int] | None = None, **kwargs: Unpack[ViTArguments]) -> keras.Model:
    """DeiT-Ti/16 (Touvron et al. 2021): ViT-Ti/16 trained on ImageNet-1k alone, exact GELU."""
    return _named("DeiT-Ti/16", image_size, kwargs)


def DeiT_S16(image_size: int | tuple[int, int] | None = None, **kwargs: Unpack[ViTArguments]) -> keras.Model:
    """DeiT-S/16 (Touvron et al. 2021): ViT-S/16 trained on ImageNet-1k alone, exact GELU."""
    return _named("DeiT-S/16", image_size, kwargs)


def DeiT_B16(image_size: int | tuple[int, int] | None = None, **kwargs: Unpack[ViTArguments]) -> keras.Model:
    """DeiT-B/16 (Touvron et al. 2021): ViT-B/16 trained on ImageNet-1k alone, exact GELU."""
    return _named("DeiT-B/16", image_size, kwargs)


def DeiT_Ti16_Distilled(image_size: int | tuple[int, int] | None = None, **kwargs: Unpack[ViTArguments]) -> keras.Model:
    """DeiT-Ti/16 distilled: Ti/16 with a distillation token and its head (logits: the mean of both)."""
    return _named("DeiT-Ti/16-Distilled", image_size, kwargs)


def DeiT_S16_Distilled(image_size: int | tuple[int, int] | None = None, **kwargs: Unpack[ViTArguments]) -> keras.Model:
    """DeiT-S/16 distilled: S/16 with a distillation token and its head (logits: the mean of both)."""
    return _named("DeiT-S/16-Distilled", image_size, kwargs)


def DeiT_B16_Distilled(image_size: int | tuple[int, int] | None = None, **kwargs: Unpack[ViTArguments]) -> keras.Model:
    """DeiT-B/16 distilled: B/16 with a distillation token and its head (logits: the mean of both)."""
    return _named("DeiT-B/16-Distilled", image_size, kwargs)


def DeiT3_S16(image_size: int | tuple[int, int] | None = None, **kwargs: Unpack[ViTArguments]) -> keras.Model:
    """DeiT III S/16 (Touvron et al. 2022): S/16, layer scale 1e-6, no position embedding on the class token."""
    return _named("DeiT3-S/16", image_size, kwargs)


def DeiT3_B16(image_size: int | tuple[int, int] | None = None, **kwargs: Unpack[ViTArguments]) -> keras.Model:
    """DeiT III B/16 (Touvron et al. 2022): B/16, layer scale 1e-6, no position embedding on the class token."""
    return _named("DeiT3-B/16", image_size, kwargs)


def DeiT3_L16(image_size: int | tuple[int, int] | None = None, **kwargs: Unpack[ViTArguments]) -> keras.Model:
    """DeiT III L/16 (Touvron et al. 2022): L/16, layer scale 1e-6, no position embedding on the class token."""
    return _named("DeiT3-L/16", image_size, kwargs)


def DINOv2_S14(image_size: int | tuple[int, int] | None = None, **kwargs: Unpack[ViTArguments]) -> keras.Model:
    """DINOv2 S/14 (Oquab et al. 2024): S/14, layer scale, 518 px, bicubic position interpolation."""
    return _named("DINOv2-S/14", image_size, kwargs)


def DINOv2_B14(image_size: int | tuple[int, int] | None = None, **kwargs: Unpack[ViTArguments]) -> keras.Model:
    """DINOv2 B/14 (Oquab et al. 2024): B/14, layer scale, 518 px, bicubic position interpolation."""
    return _named("DINOv2-B/14", image_size, kwargs)


def DINOv2_L14(image_size: int | tuple[int, int] | None = None, **kwargs: Unpack[ViTArguments]) -> keras.Model:
    """DINOv2 L/14 (Oquab et al. 2024): L/14, layer scale, 518 px, bicubic position interpolation."""
    return _named("DINOv2-L/14", image_size, kwargs)


def DINOv2_G14(image_size: int | tuple[int, int] | None = None, **kwargs: Unpack[ViTArguments]) -> keras.Model:
    """DINOv2 g/14 (Oquab et al. 2024): 1536 wide, 40 blocks of 24 heads, SwiGLU MLP, layer scale, 518 px."""
    return _named("DINOv2-G/14", image_size, kwargs)


def DINOv2_S14_Reg4(image_size: int | tuple[int, int] | None = None, **kwargs: Unpack[ViTArguments]) -> keras.Model:
    """DINOv2 S/14 with 4 register tokens (Darcet et al. 2024)."""
    return _named("DINOv2-S/14-Reg4", image_size, kwargs)


def DINOv2_B14_Reg4(image_size: int | tuple[int, int] | None = None, **kwargs: Unpack[ViTArguments]) -> keras.Model:
    """DINOv2 B/14 with 4 register tokens (Darcet et al. 2024)."""
    return _named("DINOv2-B/14-Reg4", image_size, kwargs)


def DINOv2_L14_Reg4(image_size: int | tuple[int, int] | None = None, **kwargs: Unpack[ViTArguments]) -> keras.Model:
    """DINOv2 L/14 with 4 register tokens (Darcet et al. 2024)."""
    return _named("DINOv2-L/14-Reg4", image_size, kwargs)


def DINOv2_G14_Reg4(image_size: int | tuple[int, int] | None = None, **kwargs: Unpack[ViTArguments]) -> keras.Model:
    """DINOv2 g/14 (SwiGLU MLP) with 4 register tokens (Darcet et al. 2024)."""
    return _named("DINOv2-G/14-Reg4", image_size, kwargs)


NAMED_CONSTRUCTORS = {name: globals()[name] for name in map(constructor_name, (*NAMED_VARIANTS, *FAMILY_VARIANTS))}
for _constructor in NAMED_CONSTRUCTORS.values():
    _constructor.__signature__ = _named_signature()  # type: ignore[attr-defined]
    _constructor.__doc__ += "\n\n    The arguments are :func:`ViT`'s."
del _constructor

__all__ = ["NAMED_CONSTRUCTORS", "ViT", "ViTArguments", *NAMED_CONSTRUCTORS]
