"""The one table of ViT variants and the architecture record that every part of keras-vit reads.

A variant is a short name: ``"B/16"`` (the size from Table 1 of the paper, then the patch size) or,
for the paper's hybrids, ``"R50+B/16"`` (a BiT ResNet of 50 layers, then the size and the total
stride of ResNet and embedding together). :func:`parse_variant` also takes the spellings users type:
``"ViT-B/16"``, ``"ViT_B16"``, ``"vit-b16"``, ``"R50+ViT-B/16"``, ``"ViT_R50_B16"``.

This module is plain Python (no Keras): the zoo, the checkpoint readers, the model builder and the
commands all decode names here, so a name means the same everywhere. Each :class:`Architecture` field
carries its help text, for the commands' flags (:mod:`keras_vit.config`).
"""

from __future__ import annotations

import dataclasses
import numbers
import re
from collections.abc import Sequence

from keras_vit.fields import option

__all__ = [
    "FAMILY_VARIANTS",
    "HYBRID_RESNETS",
    "NAMED_VARIANTS",
    "SIZES",
    "Architecture",
    "canonical_variant",
    "constructor_name",
    "family_options",
    "parse_timm_name",
    "parse_variant",
    "resnet_depth",
    "resnet_stride",
]

# Table 1 of the paper (and "How to train your ViT?" for Ti and S).
SIZES: dict[str, dict[str, int]] = {
    "Ti": dict(hidden_size=192, depth=12, num_heads=3, mlp_dim=768),
    "S": dict(hidden_size=384, depth=12, num_heads=6, mlp_dim=1536),
    "B": dict(hidden_size=768, depth=12, num_heads=12, mlp_dim=3072),
    "L": dict(hidden_size=1024, depth=24, num_heads=16, mlp_dim=4096),
    "H": dict(hidden_size=1280, depth=32, num_heads=16, mlp_dim=5120),
}
# The hybrids' ResNets, by (layers, stages): units per stage (vit_jax/configs/models.py). R50 with
# three stages (stride 16) is R50+B/16's; with four (stride 32) R50+L/32's; R26 is R26+S/32's and R26+B/32's.
HYBRID_RESNETS: dict[tuple[int, int], tuple[int, ...]] = {
    (50, 3): (3, 4, 9),
    (50, 4): (3, 4, 6, 3),
    (26, 4): (2, 2, 2, 2),
}
# The variants with a named constructor (keras_vit.ViT_B16, keras_vit.ViT_R50_B16, ...).
NAMED_VARIANTS = (
    "Ti/16", "S/16", "S/32", "B/8", "B/16", "B/32", "L/16", "L/32", "H/14",
    "R50+B/16", "R50+L/32", "R26+S/32", "R26+B/32",
)  # fmt: skip

# The ViT family (docs/family.md): name -> (variant, or the architecture's fields, and the config fields that make
# the model). Sources: timm's deit.py and vision_transformer.py (which agree with facebookresearch/deit and
# facebookresearch/dinov2); every one uses the exact GELU.
_DEIT = dict(gelu="exact")
_DEIT3 = dict(gelu="exact", class_position_embedding=False, layer_scale_init=1e-6)  # timm's deit3_*: no_embed_class
_DINOV2 = dict(gelu="exact", layer_scale_init=1e-5, image_size=518, position_interpolation="bicubic")
_REG4 = dict(num_register_tokens=4, class_position_embedding=False)  # timm's reg4 layout (no_embed_class)
# DINOv2's ViT-g/14: 1536 wide, 40 blocks of 24 heads, a SwiGLU MLP of 2 x 4096 (timm: mlp_ratio 2.66667 * 2).
_DINOV2_G = dict(patch_size=14, hidden_size=1536, depth=40, num_heads=24, mlp_dim=8192)
FAMILY_VARIANTS: dict[str, tuple[str | dict, dict]] = {
    "deit_ti16": ("Ti/16", _DEIT),
    "deit_s16": ("S/16", _DEIT),
    "deit_b16": ("B/16", _DEIT),
    "deit_ti16_distilled": ("Ti/16", dict(_DEIT, distillation_token=True)),
    "deit_s16_distilled": ("S/16", dict(_DEIT, distillation_token=True)),
    "deit_b16_distilled": ("B/16", dict(_DEIT, distillation_token=True)),
    "deit3_s16": ("S/16", _DEIT3),
    "deit3_b16": ("B/16", _DEIT3),
    "deit3_l16": ("L/16", _DEIT3),
    "dinov2_s14": ("S/14", _DINOV2),
    "dinov2_b14": ("B/14", _DINOV2),
    "dinov2_l14": ("L/14", _DINOV2),
    "dinov2_g14": (_DINOV2_G, dict(_DINOV2, mlp_type="swiglu")),
    "dinov2_s14_reg4": ("S/14", dict(_DINOV2, **_REG4)),
    "dinov2_b14_reg4": ("B/14", dict(_DINOV2, **_REG4)),
    "dinov2_l14_reg4": ("L/14", dict(_DINOV2, **_REG4)),
    "dinov2_g14_reg4": (_DINOV2_G, dict(_DINOV2, mlp_type="swiglu", **_REG4)),
}
# Other spellings: facebookresearch/dinov2's torch.hub names (dinov2_vits14, dinov2_vits14_reg), "ViT" in a name.
_FAMILY_SPELLINGS = {
    **{f"dinov2_vit{size}14{reg}": f"dinov2_{size}14{reg and '_reg4'}" for size in "sblg" for reg in ("", "_reg")},
    **{f"dinov2_vit{size}14_reg4": f"dinov2_{size}14_reg4" for size in "sblg"},
}

_NAME = re.compile(
    r"(?:vit[-_ ]?)?"  # optional "ViT-" prefix
    r"(?:r(?P<resnet>\d+)[-_+ ]?(?:vit[-_ ]?)?)?"  # optional hybrid ResNet "R50+"
    r"(?P<size>ti|s|b|l|h)[-_/ ]?(?P<stride>\d+)",
    flags=re.IGNORECASE,
)


def _field(help: str, default=dataclasses.MISSING, **settings):
    """An :class:`Architecture` field with its command-line help; ``None`` (unset) means the variant's."""
    return option(help, default, unset="the variant's", group="architecture", **settings)


def _ints(text: str) -> tuple[int, ...]:
    """``"3,4,9"`` -> ``(3, 4, 9)``."""
    return tuple(int(part) for part in text.split(","))


def resnet_depth(stages: tuple[int, ...]) -> int:
    """Layers of a BiT ResNet with ``stages`` bottleneck units per stage: 3 convolutions per unit, plus
    the root convolution and the (absent) classifier, as ResNet names count them (R50: (3, 4, 6, 3))."""
    return 2 + 3 * sum(stages)


def resnet_stride(stages: tuple[int, ...]) -> int:
    """How many times smaller than the image a BiT ResNet's feature map is: 4 after the root (conv /2,
    max-pool /2), times 2 for every stage after the first."""
    return 4 * 2 ** max(0, len(stages) - 1)


@dataclasses.dataclass(frozen=True)
class Architecture:
    """What a ViT is made of: the patch embedding, the encoder's shape and, for a hybrid, its ResNet.

    ``patch_size`` is in the units the embedding sees: pixels for a plain ViT, ResNet feature-map
    cells for a hybrid (1 for the published ones). ``resnet_stages`` is ``None`` for a plain ViT.
    """

    patch_size: int = _field("patch size in pixels (feature-map cells for a hybrid)")
    hidden_size: int = _field("width of the tokens")
    depth: int = _field("encoder blocks")
    num_heads: int = _field("attention heads")
    mlp_dim: int = _field("MLP width")
    resnet_stages: tuple[int, ...] | None = _field(
        "a hybrid's ResNet: units per stage, comma-separated", None, parse=_ints, metavar="UNITS"
    )

    def __post_init__(self):
        for field in ("patch_size", "hidden_size", "depth", "num_heads", "mlp_dim"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{field} must be a positive int, got {value!r}.")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}.")
        if self.resnet_stages is not None:
            stages = self.resnet_stages
            if (
                isinstance(stages, (str, bytes))
                or not isinstance(stages, Sequence)
                or not all(isinstance(n, numbers.Integral) and not isinstance(n, bool) and n >= 1 for n in stages)
            ):
                raise ValueError(f"resnet_stages must be positive ints (units per stage), got {stages!r}.")
            object.__setattr__(self, "resnet_stages", tuple(int(n) for n in stages))

    @property
    def stride(self) -> int:
        """Pixels per token side: the patch size, times the ResNet's stride for a hybrid."""
        return self.patch_size * (1 if self.resnet_stages is None else resnet_stride(self.resnet_stages))

    @property
    def size(self) -> str | None:
        """The named size (``"B"``) whose width, depth, heads and MLP this encoder has, else ``None``."""
        shape = dict(hidden_size=self.hidden_size, depth=self.depth, num_heads=self.num_heads, mlp_dim=self.mlp_dim)
        return next((name for name, fields in SIZES.items() if fields == shape), None)

    @property
    def variant(self) -> str | None:
        """``"B/16"``, or ``"R50+B/16"`` for a hybrid (``/16`` its total stride); ``None`` for other shapes."""
        if self.size is None:
            return None
        if self.resnet_stages is None:
            return f"{self.size}/{self.patch_size}"
        return f"R{resnet_depth(self.resnet_stages)}+{self.size}/{self.stride}"

    @property
    def model_name(self) -> str:
        """The Keras model name: ``vit_b16``, ``vit_r50_b16``; ``vit_d<width>...`` for unnamed shapes."""
        size = (self.size or f"d{self.hidden_size}").lower()
        if self.resnet_stages is None:
            return f"vit_{size}{self.patch_size}"
        return f"vit_r{resnet_depth(self.resnet_stages)}_{size}{self.stride}"

    def replace(self, **fields) -> Architecture:
        """A copy with ``fields`` changed (e.g. ``depth=2``); unknown names are a ``TypeError``."""
        unknown = set(fields) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise TypeError(f"Unknown architecture fields {sorted(unknown)}; expected {_field_names()}.")
        return dataclasses.replace(self, **fields)


def _field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(Architecture)]


def _family_name(name: str) -> str | None:
    """The :data:`FAMILY_VARIANTS` key ``name`` spells (``"DINOv2_S14_Reg4"``, ``"dinov2_vits14_reg"``), else None."""
    key = str(name).strip().lower().replace("-", "_")
    key = _FAMILY_SPELLINGS.get(key, key)
    return key if key in FAMILY_VARIANTS else None


def family_options(name: str | None) -> dict:
    """The config fields a family variant's name stands for besides its architecture (``{}`` for the paper's)."""
    family = None if name is None else _family_name(name)
    return {} if family is None else dict(FAMILY_VARIANTS[family][1])


def canonical_variant(name: str) -> str | None:
    """The one spelling of a variant: ``"ViT_R50_B16"`` -> ``"R50+B/16"``, ``"DINOv2_S14"`` -> ``"dinov2_s14"``."""
    return _family_name(name) or parse_variant(name).variant


def parse_variant(name: str) -> Architecture:
    """Decode a variant name (``"B/16"``, ``"ViT_B16"``, ``"R50+B/16"``, ``"ViT_R26_S32"``, a family name of
    :data:`FAMILY_VARIANTS` such as ``"deit_s16_distilled"`` or ``"dinov2_s14_reg4"``, ...).

    A ``ValueError`` names the accepted forms for anything else.
    """
    family = _family_name(name)
    if family is not None:
        variant = FAMILY_VARIANTS[family][0]
        return parse_variant(variant) if isinstance(variant, str) else Architecture(**variant)
    match = _NAME.fullmatch(str(name).strip())
    if match is None or int(match["stride"]) < 1:
        raise ValueError(
            f"Unknown ViT variant {name!r}: expected '<size>/<patch>' (size one of {list(SIZES)}), e.g. 'B/16' "
            f"or 'ViT_B16', or a hybrid '<ResNet>+<size>/<stride>' such as 'R50+B/16' or 'ViT_R50_B16'. "
            f"Named variants: {', '.join(NAMED_VARIANTS)}; the family (docs/family.md): {', '.join(FAMILY_VARIANTS)}."
        )
    size = next(s for s in SIZES if s.lower() == match["size"].lower())
    stride = int(match["stride"])
    if match["resnet"] is None:
        return Architecture(patch_size=stride, **SIZES[size])
    layers = int(match["resnet"])
    for (depth, _), stages in HYBRID_RESNETS.items():
        if depth == layers and resnet_stride(stages) == stride:
            return Architecture(patch_size=1, resnet_stages=stages, **SIZES[size])
    known = sorted({f"R{d} (stride {resnet_stride(s)})" for (d, _), s in HYBRID_RESNETS.items()})
    raise ValueError(
        f"Unknown hybrid {name!r}: no R{layers} ResNet with total stride {stride} in the table ({', '.join(known)}). "
        "Build other hybrids with keras_vit.ViT(..., resnet=(units per stage)) and patch_size."
    )


# timm's model names (timm/models/vision_transformer.py and vision_transformer_hybrid.py): vit_base_patch16_224,
# vit_base_r50_s16_384, optionally with a pretrained tag after a dot (".augreg_in21k_ft_in1k").
_TIMM_NAME = re.compile(
    r"vit_(?P<size>tiny|small|base|large|huge)_(?:patch(?P<patch>\d+)|r(?P<resnet>\d+)_s(?P<stride>\d+))"
    r"_(?P<image_size>\d+)(?:\.(?P<tag>\w+))?"
)
_TIMM_SIZES = {"tiny": "Ti", "small": "S", "base": "B", "large": "L", "huge": "H"}


def parse_timm_name(name: str) -> tuple[str, int, str | None] | None:
    """A timm model name as ``(variant, image size, tag or None)``: ``"vit_base_patch16_224.augreg2_in21k_ft_in1k"``
    -> ``("B/16", 224, "augreg2_in21k_ft_in1k")``, ``"vit_base_r50_s16_384"`` -> ``("R50+B/16", 384, None)``; None
    for any other name (timm's other ViTs, ``vit_base_patch16_clip_224``, are not these models)."""
    match = _TIMM_NAME.fullmatch(str(name).strip())
    if match is None:
        return None
    size = _TIMM_SIZES[match["size"]]
    if match["patch"] is not None:
        variant = f"{size}/{match['patch']}"
    else:
        variant = f"R{match['resnet']}+{size}/{match['stride']}"
    return variant, int(match["image_size"]), match["tag"]


def constructor_name(variant: str) -> str:
    """The named constructor of a variant: ``"B/16"`` -> ``"ViT_B16"``, ``"R50+B/16"`` -> ``"ViT_R50_B16"``,
    ``"dinov2_s14_reg4"`` -> ``"DINOv2_S14_Reg4"``, ``"deit3_b16"`` -> ``"DeiT3_B16"``."""
    family = _family_name(variant)
    if family is not None:
        words = family.split("_")
        first = {"deit": "DeiT", "deit3": "DeiT3", "dinov2": "DINOv2"}[words[0]]
        return "_".join([first, words[1].capitalize(), *(word.capitalize() for word in words[2:])])
    arch = parse_variant(variant)
    size = arch.size or "custom"
    if arch.resnet_stages is None:
        return f"ViT_{size}{arch.patch_size}"
    return f"ViT_R{resnet_depth(arch.resnet_stages)}_{size}{arch.stride}"
