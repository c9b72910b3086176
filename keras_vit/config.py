"""The model config: :class:`ViTConfig`, one frozen record of everything a ViT is built from (plain Python), each
field declared once (default, check, help, choices, group, layer argument). See docs/design.md."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterable, Mapping
from typing import Any

from keras_vit.checks import (
    check_bool,
    check_choice,
    check_count,
    check_fraction,
    check_names,
    check_pair,
    check_positive_int,
    check_positive_number,
    optional,
)
from keras_vit.fields import option, option_fields
from keras_vit.variants import Architecture, family_variant, parse_variant

__all__ = [
    "CLASSIFIERS",
    "DATA_FORMATS",
    "GELUS",
    "GROUPS",
    "INTERPOLATIONS",
    "MLP_TYPES",
    "PARTS",
    "POOLINGS",
    "POSITION_EMBEDDINGS",
    "RESIZE_METHODS",
    "WEIGHT_STANDARDIZATIONS",
    "ViTConfig",
    "field_names",
    "grid_length",
    "layer_field_names",
    "model_flags",
    "options_of_layer",
    "parse_size",
    "resnet_fields",
]

CLASSIFIERS = ("token", "gap", "map")
POOLINGS = (None, "token", "avg", "max", "map")
GELUS = ("tanh", "exact", "quick")
POSITION_EMBEDDINGS = ("learned_1d", "learned_2d", "sincos_2d", "relative", "none")
WEIGHT_STANDARDIZATIONS = ("flax", "timm")
# keras.ops.image.resize's methods that tf.image.resize has too (ImagePreprocessor runs either).
INTERPOLATIONS = ("bilinear", "bicubic", "nearest", "area", "lanczos3", "lanczos5")
RESIZE_METHODS = ("zoom_linear", "bilinear", "bicubic")  # position embeddings to another grid (keras_vit.position)
MLP_TYPES = ("gelu", "swiglu")
GROUPS = ("architecture", "input", "output", "structure", "numerics", "training")
DATA_FORMATS = ("channels_last", "channels_first")  # keras.config.image_data_format()'s values

DEFAULT_IMAGE_SIZE, DEFAULT_NUM_CLASSES = 224, 1000
ROOT_WIDTH = 64  # channels of a hybrid ResNet's root convolution (width factor 1)
LAYER_NORM_EPSILON = 1e-6  # the published models' value, not Keras' 1e-3
STD_CONV_EPSILON = 1e-5  # the Flax code's weight-standardisation epsilon; timm's hybrids use 1e-8
GROUP_NORM_EPSILON = 1e-6  # Flax nn.GroupNorm's; timm's GroupNormAct uses 1e-5


def parse_size(text: str) -> int | tuple[int, ...]:
    """A size as typed: ``"384"`` -> ``384``, ``"384,512"`` -> ``(384, 512)`` (height, width)."""
    parts = [int(part) for part in text.split(",")]
    return parts[0] if len(parts) == 1 else tuple(parts)


def grid_length(size, stride: int, pad: bool = True):
    """Patch tokens along a side of ``size`` pixels (an int or a tensor): rounded up when the images are padded to a
    multiple of ``stride`` (``pad``, timm's ``dynamic_img_pad``), else down (a valid convolution's)."""
    return (size + stride - 1) // stride if pad else size // stride


def _field(
    help: str,
    default: Any,
    group: str,
    *,
    check=None,
    layer: str | None = None,
    argument: str | None = None,
    **settings,
):
    """A :class:`ViTConfig` field: ``check(value, name)`` validates (and normalises) it (a bool default:
    ``check_bool``); ``layer`` names the layer that takes it as ``argument`` (default: the field's name)."""
    check = check_bool if check is None and isinstance(default, bool) else check
    return option(help, default, group=group, check=check, layer=layer, argument=argument, **settings)


@dataclasses.dataclass(frozen=True)
class ViTConfig:
    """Everything a ViT is built from: its :class:`~keras_vit.variants.Architecture` and every option. A bad field is a
    ``ValueError`` naming it and its value. :meth:`to_dict`, :meth:`from_dict`; :meth:`replace` takes them all."""

    architecture: Architecture
    image_size: tuple[int, int] = _field(
        "input height and width: an int or height,width, a multiple of the stride",
        (DEFAULT_IMAGE_SIZE, DEFAULT_IMAGE_SIZE),
        "input",
        check=check_pair,
        parse=parse_size,
        metavar="SIZE",
    )
    channels: int = _field("input channels (pretrained weights need 3)", 3, "input", check=check_positive_int)
    dynamic_image_size: bool = _field(
        "take images of any multiple of the stride: input (None, None, channels), the position embeddings "
        "(learned for image_size) interpolated in the graph",
        False,
        "input",
    )
    data_format: str = _field(
        "the images' layout: channels_last (batch, height, width, channels) or channels_first (batch, channels, "
        "height, width), turned channels-last at the input, so the weights are the same (ViT's default: "
        "keras.config.image_data_format())",
        "channels_last",
        "input",
        choices=DATA_FORMATS,
    )
    dynamic_img_pad: bool = _field(
        "pad the images' bottom and right with zeros to the next multiple of the patch size (timm's "
        "dynamic_img_pad): any image_size, the patch grid rounded up; off: a size that is not a multiple is an error",
        False,
        "input",
    )
    include_preprocessing: bool = _field(
        "an ImagePreprocessor in front (resize to image_size, scale to [-1, 1]): images in [0, 255] of any size in",
        False,
        "input",
    )
    crop_fraction: float | None = _field(
        "with include_preprocessing: first cut the central square of this fraction of the short side (timm's "
        "crop_pct; a catalogue checkpoint's by default)",
        None,
        "input",
        check=optional(check_fraction),
        layer="preprocessing",
        unset="none: resize the whole image",
    )
    interpolation: str = _field(
        "with include_preprocessing: the resize method (a catalogue checkpoint's by default)",
        "bilinear",
        "input",
        choices=INTERPOLATIONS,
        layer="preprocessing",
    )
    include_top: bool = _field("end in the classification head; else the features (see pooling)", True, "output")
    num_classes: int = _field("classes of the head", DEFAULT_NUM_CLASSES, "output", check=check_positive_int)
    pooling: str | None = _field(
        "features without the head: none (all tokens), token (the class token), avg or max (the patch tokens' mean "
        "or maximum, as keras.applications' pooling) or map (the attention-pooling head of classifier map)",
        None,
        "output",
        choices=POOLINGS,
    )
    classifier_activation: str | None = _field("activation of the head", None, "output", unset="none: logits")
    class_names: tuple[str, ...] | None = _field(
        "the head's classes in output order (what predict and decode_predictions print); training records them",
        None,
        "output",
        check=optional(check_names),
        unset="none",
    )
    classifier: str = _field(
        "token: the class token (the paper's); gap: the mean of the patch tokens, no class token; map: a learned "
        "probe attends over the patch tokens, no class token (SigLIP's multihead attention pooling, timm's 'map')",
        "token",
        "structure",
        choices=CLASSIFIERS,
    )
    representation_size: int | None = _field(
        "width of the tanh pre_logits layer before the head (the ImageNet-21k checkpoints')",
        None,
        "structure",
        check=optional(check_positive_int),
        unset="none",
    )
    position_embedding: str = _field(
        "learned_1d (the published models), learned_2d, sincos_2d, relative or none (keras_vit.position)",
        "learned_1d",
        "structure",
        choices=POSITION_EMBEDDINGS,
    )
    fc_norm: bool = _field(
        "the final LayerNorm after the pooling (timm's fc_norm, of its GAP models)",
        False,
        "structure",
    )
    layer_scale_init: float | None = _field(
        "layer scale (timm's ls1/ls2, CaiT, DeiT III): every block scales its attention and MLP outputs by learned "
        "per-channel factors starting at this value",
        None,
        "structure",
        check=optional(check_positive_number),
        layer="block",
        unset="off",
    )
    num_register_tokens: int = _field(
        "register tokens (Darcet et al. 2024, DINOv2 reg4): learned tokens after the class (and distillation) "
        "token, without position embeddings, dropped by every pooling",
        0,
        "structure",
        check=check_count,
    )
    distillation_token: bool = _field(
        "DeiT's distillation token after the class token, with its own head (head_dist); the logits are the mean "
        "of both heads (keras_vit.distillation_model gives both, for distillation training)",
        False,
        "structure",
    )
    norm_pre: bool = _field(
        "a LayerNorm on the embedded tokens before the first block (CLIP's ln_pre, timm's norm_pre)",
        False,
        "structure",
    )
    qk_norm: bool = _field(
        "LayerNorm on every head's queries and keys before their product (timm's qk_norm)",
        False,
        "structure",
        layer="block",
    )
    class_position_embedding: bool = _field(
        "the class (and distillation) token get position embeddings, as the paper's; off: only the patches do "
        "(timm's no_embed_class: DeiT III, DINOv2 with registers)",
        True,
        "structure",
    )
    mlp_type: str = _field(
        "gelu: Dense(mlp_dim), GELU, Dense (the paper's); swiglu: Dense(mlp_dim) split in halves a, b, "
        "SiLU(a) * b, Dense (DINOv2 g/14; timm's SwiGLUPacked layout)",
        "gelu",
        "structure",
        choices=MLP_TYPES,
        layer="block",
    )
    position_interpolation: str = _field(
        "how the position embeddings are interpolated to another grid (dynamic_image_size; ViT(weights=...) at "
        "another image_size): zoom_linear (the original code's), bilinear, or bicubic (timm's resample_abs_pos_embed, "
        "DINOv2's)",
        "zoom_linear",
        "numerics",
        choices=RESIZE_METHODS,
    )
    resnet_width: int = _field(
        "a hybrid's ResNet: channels of its root convolution, a multiple of 32",
        ROOT_WIDTH,
        "structure",
        check=check_positive_int,
        layer="resnet",
        argument="width",
    )
    gelu: str = _field(
        "tanh: the approximation the published Flax models use; exact: timm's, keras-hub's, vit-keras'; quick: "
        "x * sigmoid(1.702 x), OpenAI CLIP's QuickGELU",
        "tanh",
        "numerics",
        choices=GELUS,
        layer="block",
    )
    layer_norm_epsilon: float = _field(
        "epsilon of every LayerNorm of the encoder and head (the published models': 1e-6; CLIP: 1e-5; Hugging Face's "
        "files: their layer_norm_eps)",
        LAYER_NORM_EPSILON,
        "numerics",
        check=check_positive_number,
        layer="block",
    )
    std_conv_epsilon: float = _field(
        "a hybrid's ResNet: epsilon of the weight standardisation (timm: 1e-8)",
        STD_CONV_EPSILON,
        "numerics",
        check=check_positive_number,
        layer="resnet",
    )
    group_norm_epsilon: float = _field(
        "a hybrid's ResNet: epsilon of its GroupNorms (timm: 1e-5)",
        GROUP_NORM_EPSILON,
        "numerics",
        check=check_positive_number,
        layer="resnet",
    )
    weight_standardization: str = _field(
        "a hybrid's ResNet: the standardisation formula, flax (w - mean) / (std + eps) or timm's "
        "(w - mean) / sqrt(var + eps)",
        "flax",
        "numerics",
        choices=WEIGHT_STANDARDIZATIONS,
        layer="resnet",
    )
    dropout: float = _field("dropout rate", 0.0, "training", check=check_fraction, layer="block")
    attention_dropout: float = _field(
        "dropout rate of the attention probabilities", 0.0, "training", check=check_fraction, layer="block"
    )
    drop_path: float = _field(
        "stochastic depth rate of the last block (rising linearly from 0 at the first)",
        0.0,
        "training",
        check=check_fraction,
    )
    remat: bool = _field(
        "recompute each encoder block in the backward pass: about 3x (B/16, batch 32) less training memory for "
        "about 1.3x the step time; the same results",
        False,
        "training",
        layer="block",
    )

    def __post_init__(self):
        if not isinstance(self.architecture, Architecture):
            raise TypeError(f"architecture must be an Architecture, got {self.architecture!r}.")
        for field in option_fields(ViTConfig):
            value, meta = getattr(self, field.name), field.metadata
            if meta["choices"]:
                check_choice(value, meta["choices"], field.name)
            if meta["check"]:
                object.__setattr__(self, field.name, meta["check"](value, field.name))
        if self.pooling == "token" and self.classifier != "token":
            raise ValueError(
                f"pooling='token' needs classifier='token' (a {self.classifier!r} model has no class token)."
            )
        if self.pooling == "map" and self.classifier != "map":
            raise ValueError(f"pooling='map' needs classifier='map' (a {self.classifier!r} model has no MAP head).")
        if (self.distillation_token or not self.class_position_embedding) and self.classifier != "token":
            raise ValueError(
                "distillation_token and class_position_embedding=False need classifier='token' (a class token)."
            )
        if self.distillation_token and (self.representation_size is not None or self.fc_norm):
            raise ValueError(
                "distillation_token has two heads on the normalised tokens: leave representation_size and fc_norm "
                "unset."
            )
        if self.include_top and self.class_names is not None and len(self.class_names) != self.num_classes:
            raise ValueError(f"{len(self.class_names)} class_names for a head of {self.num_classes} classes.")
        if self.include_preprocessing and self.dynamic_image_size:
            raise ValueError("include_preprocessing resizes every image to image_size: leave dynamic_image_size off.")
        arch, (height, width) = self.architecture, self.image_size
        if not self.dynamic_img_pad and (height % arch.stride or width % arch.stride):
            what = (
                "the patch size"
                if arch.resnet_stages is None
                else f"the ResNet stride {arch.stride // arch.patch_size} x patch size {arch.patch_size} ="
            )
            raise ValueError(
                f"image_size {height}x{width} is not divisible by {what} {arch.stride}; "
                f"use a multiple of {arch.stride}, e.g. {max(1, height // arch.stride) * arch.stride}, or "
                "dynamic_img_pad=True to pad the images to one."
            )
        if arch.resnet_stages is None:
            changed = [f.name for f in _layer_fields("resnet") if getattr(self, f.name) != f.default]
            if changed:
                raise ValueError(f"{changed} set a hybrid's ResNet, but this ViT has none (resnet_stages is None).")

    @classmethod
    def from_variant(cls, variant: str | None, **fields: Any) -> ViTConfig:
        """The config of ``variant`` (a name of :mod:`keras_vit.variants`; a tower of ``FAMILY_VARIANTS`` brings its
        fields, ``"CLIP-B/16"`` ``norm_pre=True`` ...) with ``fields`` replaced; ``None`` takes the whole architecture
        from ``fields``. Unknown names are a ``TypeError``."""
        family = None if variant is None else family_variant(variant)
        architecture, own = _split({**(family[2] if family else {}), **fields})
        if variant is not None:
            return cls(parse_variant(variant).replace(**architecture), **own)
        required = [f.name for f in dataclasses.fields(Architecture) if f.default is dataclasses.MISSING]
        missing = [name for name in required if name not in architecture]
        if missing:
            raise ValueError(f"variant=None needs {missing} as keyword arguments.")
        return cls(Architecture(**architecture), **own)

    def replace(self, **fields: Any) -> ViTConfig:
        """A copy with ``fields`` changed, the architecture's (``depth=2``) included; another ``num_classes`` is a new
        head, without the old one's ``class_names`` unless given."""
        architecture, own = _split(fields)
        if own.get("num_classes", self.num_classes) != self.num_classes and "class_names" not in own:
            own["class_names"] = None
        return dataclasses.replace(self, architecture=self.architecture.replace(**architecture), **own)

    def to_dict(self) -> dict[str, Any]:
        """Every field, the architecture's first, as JSON values (tuples become lists)."""
        values = {**dataclasses.asdict(self.architecture), **{f.name: getattr(self, f.name) for f in _own_fields()}}
        return {name: list(value) if isinstance(value, tuple) else value for name, value in values.items()}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ViTConfig:
        """The config :meth:`to_dict` wrote (fields it lacks take their defaults)."""
        architecture, own = _split(values)
        return cls(Architecture(**architecture), **own)

    def layer_options(self, layer: str) -> dict[str, Any]:
        """The arguments of ``layer`` (``"block"``, ``"resnet"``) that come from the config, by argument name."""
        return {_argument(f): getattr(self, f.name) for f in _layer_fields(layer)}

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patches: the class token, the distillation token, the register tokens."""
        return int(self.classifier == "token") + int(self.distillation_token) + self.num_register_tokens

    @property
    def grid_size(self) -> tuple[int, int]:
        """The patch grid of ``image_size``: ``(height, width)`` divided by the stride, rounded up."""
        (height, width), stride = self.image_size, self.architecture.stride
        return (grid_length(height, stride), grid_length(width, stride))

    def parameter_parts(self) -> dict[str, int]:
        """The parameters of the model of this config by part (:data:`PARTS`), counted from the fields without
        building anything: the sum is what ``build_vit(config).count_params()`` gives."""
        arch = self.architecture
        width, (rows, cols), heads = arch.hidden_size, self.grid_size, arch.num_heads
        resnet, channels = (0, self.channels) if arch.resnet_stages is None else _resnet_parameters(self)
        embedded = int(self.classifier == "token") + int(self.distillation_token)  # class and distillation tokens
        prefix = embedded if self.class_position_embedding else 0  # the tokens with position embeddings
        position = {
            "learned_1d": (prefix + rows * cols) * width,
            "learned_2d": (rows + cols) * (width // 2) + prefix * width,
        }.get(self.position_embedding, 0)  # sincos_2d: fixed; relative: in the blocks
        relative = (2 * rows - 1) * (2 * cols - 1) * heads + (3 * heads if self.num_prefix_tokens else 0)
        block = _block_parameters(self) + (relative if self.position_embedding == "relative" else 0)
        return {
            "resnet": resnet,
            "embedding": _dense(arch.patch_size**2 * channels, width),
            "tokens": (embedded + self.num_register_tokens) * width,
            "position": position,
            "blocks": arch.depth * block + (_layer_norm(width) if self.norm_pre else 0),
            "head": _head_parameters(self),
        }

    def parameter_count(self) -> int:
        """The parameters of the model of this config (:meth:`parameter_parts` summed), without building it."""
        return sum(self.parameter_parts().values())


# ViTConfig.parameter_parts' keys, each with the fields that make it large (what keras_vit.memory's refusals name).
PARTS: dict[str, tuple[str, ...]] = {
    "resnet": ("resnet_stages", "resnet_width"),
    "embedding": ("patch_size", "hidden_size"),
    "tokens": ("num_register_tokens", "hidden_size"),
    "position": ("image_size", "patch_size", "hidden_size"),
    "blocks": ("depth", "hidden_size", "mlp_dim"),
    "head": ("num_classes", "representation_size", "hidden_size"),
}


def _dense(inputs: int, units: int) -> int:
    """The parameters of a ``Dense(units)`` (kernel and bias) on ``inputs`` features."""
    return inputs * units + units


def _layer_norm(width: int) -> int:
    """The parameters of a LayerNorm (or GroupNorm) of ``width`` channels: its scale and offset."""
    return 2 * width


def _mlp_parameters(width: int, mlp_dim: int, mlp_type: str = "gelu") -> int:
    """An :class:`~keras_vit.layers.MlpBlock`'s: ``Dense(mlp_dim)``, then ``Dense(width)`` on its (SwiGLU: half)."""
    return _dense(width, mlp_dim) + _dense(mlp_dim // 2 if mlp_type == "swiglu" else mlp_dim, width)


def _block_parameters(config: ViTConfig) -> int:
    """A :class:`~keras_vit.layers.TransformerBlock`'s: two LayerNorms, the attention (and ``qk_norm``), the MLP, and
    layer scale."""
    arch = config.architecture
    width = arch.hidden_size
    attention = _dense(width, 3 * width) + _dense(width, width)
    attention += 2 * _layer_norm(width // arch.num_heads) if config.qk_norm else 0
    scale = 2 * width if config.layer_scale_init is not None else 0
    return 2 * _layer_norm(width) + attention + _mlp_parameters(width, arch.mlp_dim, config.mlp_type) + scale


def _head_parameters(config: ViTConfig) -> int:
    """The final LayerNorm (``encoder_norm``, also as ``fc_norm``) and what :func:`keras_vit.models.head` builds."""
    width = config.architecture.hidden_size
    if not config.include_top and config.pooling is None:  # the tokens: fc_norm, if set, is never applied
        return 0 if config.fc_norm else _layer_norm(width)
    pooling = config.pooling if not config.include_top else {"token": "token", "gap": "avg"}.get(config.classifier)
    total = _layer_norm(width)
    if pooling in (None, "map"):  # the probe, query, key_value, out, its LayerNorm and MLP
        total += (
            width + 4 * _dense(width, width) + _layer_norm(width) + _mlp_parameters(width, config.architecture.mlp_dim)
        )
    if not config.include_top:
        return total
    features = config.representation_size or width
    total += 0 if config.representation_size is None else _dense(width, features)
    return total + (2 if config.distillation_token else 1) * _dense(features, config.num_classes)


def _resnet_parameters(config: ViTConfig) -> tuple[int, int]:
    """A hybrid's :class:`~keras_vit.resnet.ResNetStem`: its parameters and output channels (the root convolution and
    GroupNorm; per unit three convolutions and GroupNorms, and a projection where the channels or stride change)."""
    width, stages = config.resnet_width, config.architecture.resnet_stages or ()
    total, inputs = 7 * 7 * config.channels * width + _layer_norm(width), width
    for stage, units in enumerate(stages):
        features = width * 2**stage
        for unit in range(units):
            total += (inputs + 9 * features + 4 * features) * features + _layer_norm(6 * features)
            if inputs != 4 * features or (stage > 0 and unit == 0):
                total += inputs * 4 * features + _layer_norm(4 * features)
            inputs = 4 * features
    return total, inputs


def _own_fields() -> list[dataclasses.Field]:
    return list(option_fields(ViTConfig))


def _layer_fields(layer: str) -> list[dataclasses.Field]:
    return [f for f in _own_fields() if f.metadata["layer"] == layer]


def _argument(field: dataclasses.Field) -> str:
    """The name of the layer argument a field becomes."""
    return field.metadata["argument"] or field.name


def _fields() -> dict[str, dataclasses.Field]:
    """Every field by name: the architecture's, then the config's own."""
    return {f.name: f for f in (*dataclasses.fields(Architecture), *_own_fields())}


def _split(values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``values`` as (the architecture's fields, the config's own); unknown names are a ``TypeError``."""
    architecture = {f.name for f in dataclasses.fields(Architecture)}
    unknown = sorted(set(values) - set(_fields()))
    if unknown:
        raise TypeError(f"unexpected keyword arguments {unknown}; the config's fields are {list(_fields())}.")
    return (
        {k: v for k, v in values.items() if k in architecture},
        {k: v for k, v in values.items() if k not in architecture},
    )


def field_names(*groups: str) -> tuple[str, ...]:
    """The names of the fields in ``groups`` (:data:`GROUPS`), in declaration order, the architecture's first."""
    unknown = set(groups) - set(GROUPS)
    if unknown:
        raise ValueError(f"Unknown groups {sorted(unknown)}; expected some of {GROUPS}.")
    return tuple(name for name, f in _fields().items() if f.metadata["group"] in groups)


def layer_field_names(layer: str) -> tuple[str, ...]:
    """The names of the fields that become arguments of ``layer`` (``"block"``, ``"resnet"``)."""
    return tuple(f.name for f in _layer_fields(layer))


def resnet_fields(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """:class:`~keras_vit.resnet.ResNetStem` arguments (``num_layers``, ``width``, epsilons) as config fields."""
    names = {"num_layers": "resnet_stages", **{_argument(f): f.name for f in _layer_fields("resnet")}}
    unknown = sorted(set(arguments) - set(names))
    if unknown:
        raise TypeError(f"Unknown ResNet arguments {unknown}; expected some of {list(names)}.")
    return {names[argument]: value for argument, value in arguments.items()}


def options_of_layer(layer: str, layer_config: Mapping[str, Any]) -> dict[str, Any]:
    """The config fields a layer's ``get_config()`` holds (``layer``: ``"block"`` or ``"resnet"``), by field name."""
    return {f.name: layer_config[_argument(f)] for f in _layer_fields(layer) if _argument(f) in layer_config}


def model_flags(name: str, names: Iterable[str], doc: str, unset: Mapping[str, str] | None = None) -> type:
    """A frozen dataclass of a command's model flags: one field per config field of ``names``, ``None`` by default, with
    its help, choices and parser (:func:`keras_vit.fields.add_arguments`); ``unset``: what ``None`` means per field."""
    unset = dict(unset or {})
    hints = {**typing.get_type_hints(Architecture), **typing.get_type_hints(ViTConfig)}
    fields = _fields()
    made = []
    for field_name in names:
        field, meta = fields[field_name], fields[field_name].metadata
        shown = meta["unset"] if field.default in (None, dataclasses.MISSING) else str(field.default)
        settings = {k: meta[k] for k in ("choices", "parse", "metavar") if meta.get(k) is not None}
        flag = option(meta["help"], None, unset=unset.get(field_name, shown), **settings)
        made.append((field_name, hints[field_name] | None, flag))
    return dataclasses.make_dataclass(name, made, frozen=True, namespace={"__doc__": doc})
