"""The one table of ViT variants and the :class:`Architecture` record every part of keras-vit reads (plain Python);
:func:`parse_variant` takes ``"B/16"``, ``"R50+B/16"`` and the spellings users type (``"ViT_B16"``)."""

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
    "family_variant",
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

# The ViT family (docs/family.md, with the sources): the variant each builds on and the ViTConfig fields it sets
# (architecture fields among them replace the variant's).
_CLIP = dict(norm_pre=True, gelu="quick", layer_norm_epsilon=1e-5)
_DEIT = dict(gelu="exact")
_DEIT3 = dict(gelu="exact", class_position_embedding=False, layer_scale_init=1e-6)  # timm's deit3_*: no_embed_class
_DINOV2 = dict(gelu="exact", layer_scale_init=1e-5, image_size=518, position_interpolation="bicubic")
_REG4 = dict(num_register_tokens=4, class_position_embedding=False)  # timm's reg4 layout (no_embed_class)
# DINOv2's ViT-g/14, listed under L/14: a SwiGLU MLP of 2 x 4096 (timm: mlp_ratio 2.66667 * 2).
_DINOV2_G = dict(hidden_size=1536, depth=40, num_heads=24, mlp_dim=8192, mlp_type="swiglu")
FAMILY_VARIANTS: dict[str, tuple[str, dict]] = {
    "CLIP-B/32": ("B/32", dict(_CLIP, num_classes=512)),
    "CLIP-B/16": ("B/16", dict(_CLIP, num_classes=512)),
    "CLIP-L/14": ("L/14", dict(_CLIP, num_classes=768)),
    "SigLIP-B/16": ("B/16", dict(classifier="map")),
    "SigLIP-B/16-384": ("B/16", dict(classifier="map", image_size=384)),
    "DeiT-Ti/16": ("Ti/16", _DEIT),
    "DeiT-S/16": ("S/16", _DEIT),
    "DeiT-B/16": ("B/16", _DEIT),
    "DeiT-Ti/16-Distilled": ("Ti/16", dict(_DEIT, distillation_token=True)),
    "DeiT-S/16-Distilled": ("S/16", dict(_DEIT, distillation_token=True)),
    "DeiT-B/16-Distilled": ("B/16", dict(_DEIT, distillation_token=True)),
    "DeiT3-S/16": ("S/16", _DEIT3),
    "DeiT3-B/16": ("B/16", _DEIT3),
    "DeiT3-L/16": ("L/16", _DEIT3),
    "DINOv2-S/14": ("S/14", _DINOV2),
    "DINOv2-B/14": ("B/14", _DINOV2),
    "DINOv2-L/14": ("L/14", _DINOV2),
    "DINOv2-G/14": ("L/14", dict(_DINOV2, **_DINOV2_G)),
    "DINOv2-S/14-Reg4": ("S/14", dict(_DINOV2, **_REG4)),
    "DINOv2-B/14-Reg4": ("B/14", dict(_DINOV2, **_REG4)),
    "DINOv2-L/14-Reg4": ("L/14", dict(_DINOV2, **_REG4)),
    "DINOv2-G/14-Reg4": ("L/14", dict(_DINOV2, **_DINOV2_G, **_REG4)),
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
    """What a ViT is made of: the patch embedding, the encoder's shape and a hybrid's ResNet (``resnet_stages``,
    ``None`` for a plain ViT); ``patch_size`` is in pixels, or in feature-map cells for a hybrid."""

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


def _squeezed(name: str) -> str:
    return re.sub(r"[-_/+ ]|vit", "", str(name).strip().lower())


def family_variant(name: str) -> tuple[str, str, dict] | None:
    """``(name, variant, fields)`` of a :data:`FAMILY_VARIANTS` model (``"CLIP-B/16"``, ``"CLIP_B16"``,
    ``"siglip-b16-384"``, ``"dinov2_s14_reg4"``, ``"dinov2_vits14_reg"``), else ``None``."""
    squeezed = _squeezed(name)
    squeezed += "4" if squeezed.endswith("reg") else ""  # facebookresearch/dinov2's hub names: dinov2_vits14_reg
    for known, (variant, fields) in FAMILY_VARIANTS.items():
        if squeezed == _squeezed(known):
            return known, variant, dict(fields)
    return None


def canonical_variant(name: str) -> str | None:
    """The one spelling of a variant: ``"ViT_R50_B16"`` -> ``"R50+B/16"``, ``"dinov2_s14"`` -> ``"DINOv2-S/14"``."""
    family = family_variant(name)
    return family[0] if family is not None else parse_variant(name).variant


def parse_variant(name: str) -> Architecture:
    """Decode a variant name (``"B/16"``, ``"ViT_B16"``, ``"R50+B/16"``, a tower of :data:`FAMILY_VARIANTS` such as
    ``"CLIP-B/16"``); a ``ValueError`` names the accepted forms for anything else."""
    family = family_variant(name)
    if family is not None:
        _, variant, fields = family
        return parse_variant(variant).replace(**{k: v for k, v in fields.items() if k in _field_names()})
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
        return Architecture(patch_size=stride, resnet_stages=None, **SIZES[size])
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
    ``"CLIP-B/16"`` -> ``"CLIP_B16"``, ``"SigLIP-B/16-384"`` -> ``"SigLIP_B16_384"``, ``"DINOv2-S/14-Reg4"`` ->
    ``"DINOv2_S14_Reg4"``."""
    family = family_variant(variant)
    name = family[0] if family is not None else f"ViT_{parse_variant(variant).variant}"
    return name.replace("/", "").replace("-", "_").replace("+", "_")
