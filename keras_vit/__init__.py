"""keras-vit: the Vision Transformers of Dosovitskiy et al. (ICLR 2021) as Keras 3 models.

Where things are (each module imports only the ones above it, never this package):

    optional        imports on demand (TensorFlow where Keras runs JAX or torch), naming the install command
    variants        the one table of variants ("B/16", "R50+B/16") and the Architecture record
    layers          the encoder's layers: PatchEmbed, ClassToken, TransformerBlock, ...
    position        position embeddings of every kind, and resizing them for another image size
    resnet          the BiT ResNet of the hybrids
    models          the graph builder: Architecture -> keras.Model (no files, no checkpoints)
    checkpoints     the published .npz files: read, inspect, key map, load
    applications    ViT(variant, weights=...) and the named constructors ViT_B16, ViT_R50_B16, ...
    features        feature_model: chosen blocks' tokens or (B, h, w, D) maps, sharing the weights
    lora            enable_lora / merge_lora: LoRA adapters on the blocks' Dense layers
    preprocessing   preprocess_input and ImagePreprocessor: pixels as the checkpoints expect them (any backend, tf.data)
    labels          ImageNet-1k / 21k class names and decode_predictions
    predict, export the predict command; SavedModel, LiteRT and ONNX export
    zoo             the catalogue of published checkpoints and their download cache
"""

# ruff: noqa: E402  (the imports below come after runtime.prefer_onednn() on purpose)

from keras_vit import runtime

runtime.prefer_onednn()  # before Keras loads TensorFlow: see keras_vit/runtime.py

# isort: split

from keras_vit import labels
from keras_vit.applications import (
    ViT,
    ViT_B8,
    ViT_B16,
    ViT_B32,
    ViT_H14,
    ViT_L16,
    ViT_L32,
    ViT_R26_B32,
    ViT_R26_S32,
    ViT_R50_B16,
    ViT_R50_L32,
    ViT_S16,
    ViT_S32,
    ViT_Ti16,
)
from keras_vit.checkpoints.keymap import npz_key_map
from keras_vit.checkpoints.load import load_weights, model_from_checkpoint
from keras_vit.checkpoints.timm import save_timm_safetensors, to_timm_state_dict
from keras_vit.features import feature_model
from keras_vit.labels import decode_predictions
from keras_vit.layers import (
    ClassToken,
    DropPath,
    MlpBlock,
    MultiHeadSelfAttention,
    PatchEmbed,
    TokenPooling,
    TransformerBlock,
)
from keras_vit.lora import enable_lora, lora_parameter_count, merge_lora
from keras_vit.models import attention_model
from keras_vit.position import (
    POSITION_EMBEDDINGS,
    AddPositionEmbs,
    AddPositionEmbs2D,
    DynamicPositionEmbs,
    RelativePositionBias,
    RelativeTransformerBlock,
    SinCosPositionEmbs,
    resample_position_embeddings,
    resize_position_embeddings,
)
from keras_vit.preprocessing import ImagePreprocessor, preprocess_input
from keras_vit.resnet import BottleneckUnit, ResNetStem, StdConv2D
from keras_vit.variants import NAMED_VARIANTS, SIZES, Architecture, parse_variant

__version__ = "0.1.0"

__all__ = [
    "NAMED_VARIANTS",
    "POSITION_EMBEDDINGS",
    "SIZES",
    "AddPositionEmbs",
    "AddPositionEmbs2D",
    "Architecture",
    "BottleneckUnit",
    "ClassToken",
    "DropPath",
    "DynamicPositionEmbs",
    "ImagePreprocessor",
    "MlpBlock",
    "MultiHeadSelfAttention",
    "PatchEmbed",
    "RelativePositionBias",
    "RelativeTransformerBlock",
    "ResNetStem",
    "SinCosPositionEmbs",
    "StdConv2D",
    "TokenPooling",
    "TransformerBlock",
    "ViT",
    "ViT_B8",
    "ViT_B16",
    "ViT_B32",
    "ViT_H14",
    "ViT_L16",
    "ViT_L32",
    "ViT_R26_B32",
    "ViT_R26_S32",
    "ViT_R50_B16",
    "ViT_R50_L32",
    "ViT_S16",
    "ViT_S32",
    "ViT_Ti16",
    "attention_model",
    "decode_predictions",
    "enable_lora",
    "feature_model",
    "labels",
    "load_weights",
    "lora_parameter_count",
    "merge_lora",
    "model_from_checkpoint",
    "npz_key_map",
    "parse_variant",
    "preprocess_input",
    "resample_position_embeddings",
    "resize_position_embeddings",
    "save_timm_safetensors",
    "to_timm_state_dict",
]
