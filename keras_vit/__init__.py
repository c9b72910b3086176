"""keras-vit: the Vision Transformers of Dosovitskiy et al. (ICLR 2021) as Keras 3 models."""

from keras_vit.layers import (
    AddPositionEmbs,
    ClassToken,
    DropPath,
    MlpBlock,
    MultiHeadSelfAttention,
    PatchEmbed,
    TokenPooling,
    TransformerBlock,
)
from keras_vit.models import (
    SIZES,
    ViT,
    ViT_B8,
    ViT_B16,
    ViT_B32,
    ViT_H14,
    ViT_L16,
    ViT_L32,
    ViT_S16,
    ViT_S32,
    ViT_Ti16,
    ViTConfig,
    attention_model,
    parse_variant,
    preprocess_input,
)

__version__ = "0.1.0"
