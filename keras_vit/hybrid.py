"""The paper's hybrids: a BiT ResNet's feature map, embedded by a 1x1 convolution, fed to a ViT.

    constructor   paper name     ResNet units/stage   stride   encoder
    ViT_R50_B16   R50+ViT-B/16   (3, 4, 9)            16       B: 768 wide, 12 blocks
    ViT_R50_L32   R50+ViT-L/32   (3, 4, 6, 3)         32       L: 1024 wide, 24 blocks
    ViT_R26_S32   R26+ViT-S/32   (2, 2, 2, 2)         32       S: 384 wide, 12 blocks

The ``/16`` or ``/32`` is the ResNet's total stride; the embedding's patch size is 1 for all three
(``vit_jax/configs/models.py``; timm's ``vit_base_r50_s16_224``, ``vit_large_r50_s32_224`` and
``vit_small_r26_s32_224`` agree). Each constructor is :func:`keras_vit.ViT` with ``resnet=...``.
"""

from __future__ import annotations

import keras

from keras_vit.models import ViT
from keras_vit.resnet import GROUP_NORM_EPSILON, STD_CONV_EPSILON

# constructor name -> (paper name, ViT variant, ResNet units per stage)
HYBRIDS: dict[str, tuple[str, str, tuple[int, ...]]] = {
    "ViT_R50_B16": ("R50+ViT-B/16", "B/16", (3, 4, 9)),
    "ViT_R50_L32": ("R50+ViT-L/32", "L/32", (3, 4, 6, 3)),
    "ViT_R26_S32": ("R26+ViT-S/32", "S/32", (2, 2, 2, 2)),
}


def _hybrid_constructor(constructor_name: str):
    paper_name, variant, num_layers = HYBRIDS[constructor_name]

    def constructor(
        image_size: int | tuple[int, int] | None = None,
        *,
        include_top: bool = True,
        weights: str | None = None,
        num_classes: int | None = None,
        std_conv_epsilon: float = STD_CONV_EPSILON,
        group_norm_epsilon: float = GROUP_NORM_EPSILON,
        weight_standardization: str = "flax",
        **kwargs,
    ) -> keras.Model:
        if "resnet" in kwargs:
            raise TypeError(f"{constructor_name}() fixes the ResNet to {num_layers}; use keras_vit.ViT(resnet=...) instead.")
        kwargs.setdefault("patch_size", 1)
        resnet = dict(num_layers=num_layers, std_conv_epsilon=std_conv_epsilon, group_norm_epsilon=group_norm_epsilon,
                      weight_standardization=weight_standardization)
        return ViT(variant, image_size=image_size, include_top=include_top, weights=weights,
                   num_classes=num_classes, resnet=resnet, **kwargs)

    constructor.__name__ = constructor.__qualname__ = constructor_name
    constructor.__doc__ = (
        f"{paper_name}: ResNet stages {num_layers} + ViT-{variant.split('/')[0]} on its 1x1-embedded feature map.\n\n"
        "Every keyword argument of :func:`keras_vit.ViT` applies. ``std_conv_epsilon``, ``group_norm_epsilon`` and "
        "``weight_standardization`` set the ResNet's numerics (see :class:`keras_vit.ResNetStem`); the defaults are "
        "the published ones, ``**keras_vit.resnet.TIMM_RESNET`` gives timm's."
    )
    return constructor


ViT_R50_B16 = _hybrid_constructor("ViT_R50_B16")
ViT_R50_L32 = _hybrid_constructor("ViT_R50_L32")
ViT_R26_S32 = _hybrid_constructor("ViT_R26_S32")
