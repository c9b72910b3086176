"""keras-vit: the Vision Transformers of Dosovitskiy et al. (ICLR 2021) as Keras 3 models."""

from keras_vit import runtime

runtime.prefer_onednn()  # before Keras loads TensorFlow: see keras_vit/runtime.py

# isort: split

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
from keras_vit.hybrid import ViT_R26_S32, ViT_R50_B16, ViT_R50_L32
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
from keras_vit.posembed import resample_position_embeddings, resize_position_embeddings
from keras_vit.position import (
    POSITION_EMBEDDINGS,
    AddPositionEmbs2D,
    RelativePositionBias,
    RelativeTransformerBlock,
    SinCosPositionEmbs,
)
from keras_vit.resnet import BottleneckUnit, ResNetStem, StdConv2D
from keras_vit.weights import load_weights, model_from_checkpoint, npz_key_map

__version__ = "0.1.0"
