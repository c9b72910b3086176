"""keras-vit: the Vision Transformers of Dosovitskiy et al. (ICLR 2021) as Keras 3 models.
Names and submodules load on first use (PEP 562); see docs/design.md."""

from keras_vit import lazy, registration, runtime

runtime.prefer_onednn()  # before Keras loads TensorFlow: see keras_vit/runtime.py
registration.register_when_keras_loads()

__version__ = "0.1.0"

# The public names, by the module that defines them.
_EXPORTS = {
    "keras_vit.applications": (
        "CLIP_B16",
        "CLIP_B32",
        "CLIP_L14",
        "SigLIP_B16",
        "SigLIP_B16_384",
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
        "from_preset",
        "DINOv2_B14",
        "DINOv2_B14_Reg4",
        "DINOv2_G14",
        "DINOv2_G14_Reg4",
        "DINOv2_L14",
        "DINOv2_L14_Reg4",
        "DINOv2_S14",
        "DINOv2_S14_Reg4",
        "DeiT3_B16",
        "DeiT3_L16",
        "DeiT3_S16",
        "DeiT_B16",
        "DeiT_B16_Distilled",
        "DeiT_S16",
        "DeiT_S16_Distilled",
        "DeiT_Ti16",
        "DeiT_Ti16_Distilled",
    ),
    "keras_vit.checkpoints.keras_hub": ("save_preset",),
    "keras_vit.checkpoints.keymap": ("npz_key_map",),
    "keras_vit.checkpoints.load": ("load_weights", "model_from_checkpoint"),
    "keras_vit.checkpoints.timm": ("save_timm_safetensors", "to_timm_state_dict"),
    "keras_vit.config": ("ViTConfig",),
    "keras_vit.features": ("feature_model",),
    "keras_vit.labels": ("decode_predictions",),
    "keras_vit.heads": ("MAPHead",),
    "keras_vit.layers": (
        "ClassToken",
        "DropPath",
        "LayerScale",
        "MlpBlock",
        "MultiHeadSelfAttention",
        "PatchEmbed",
        "TokenPooling",
        "TransformerBlock",
    ),
    "keras_vit.lora": ("enable_lora", "lora_parameter_count", "merge_lora"),
    "keras_vit.models": ("VisionTransformer", "attention_model", "for_inference", "with_new_head"),
    "keras_vit.position": (
        "POSITION_EMBEDDINGS",
        "AddPositionEmbs",
        "AddPositionEmbs2D",
        "DynamicPositionEmbs",
        "RelativePositionBias",
        "RelativeTransformerBlock",
        "SinCosPositionEmbs",
        "resample_position_embeddings",
        "resize_position_embeddings",
    ),
    "keras_vit.preprocessing": ("ImagePreprocessor", "preprocess_input"),
    "keras_vit.resnet": ("BottleneckUnit", "ResNetStem", "StdConv2D"),
    "keras_vit.tokens": ("PrefixTokens", "TokenAt", "distillation_model"),
    "keras_vit.variants": ("NAMED_VARIANTS", "SIZES", "Architecture", "parse_variant"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

# Every submodule, an attribute without an import of its own (keras_vit.precision.with_policy).
_SUBMODULES = (
    "analysis",
    "applications",
    "checkpoints",
    "checks",
    "cli",
    "cloning",
    "config",
    "datasets",
    "export",
    "features",
    "fields",
    "files",
    "heads",
    "images",
    "labels",
    "layers",
    "lazy",
    "lora",
    "memory",
    "models",
    "optional",
    "position",
    "precision",
    "predict",
    "preprocessing",
    "quantization",
    "registration",
    "resnet",
    "runtime",
    "tokens",
    "training",
    "variants",
    "zoo",
)

__all__ = sorted([*_MODULE_OF, "labels"])

__getattr__, __dir__ = lazy.lazy_attributes(__name__, _MODULE_OF, _SUBMODULES)
