"""Checkpoints as one pipeline, a module per step: ``source`` -> convert (``from_timm``, ``from_huggingface``,
``from_keras_hub``) -> ``infer`` -> ``keymap`` -> ``load``. Map: docs/design.md; formats: docs/foreign-weights.md."""

from keras_vit.checkpoints.infer import CheckpointInfo, checkpoint_config, checkpoint_info
from keras_vit.checkpoints.keras_hub import save_preset
from keras_vit.checkpoints.keymap import npz_key_map
from keras_vit.checkpoints.load import (
    LoadResult,
    checkpoint_defaults,
    checkpoint_model_config,
    load_weights,
    model_from_checkpoint,
    read_checkpoint,
)
from keras_vit.checkpoints.read import resolve_weights
from keras_vit.checkpoints.source import FORMATS, CheckpointArrays, detect_format, read_npz
from keras_vit.checkpoints.timm import save_timm_safetensors, timm_model_kwargs, to_timm_state_dict

__all__ = [
    "FORMATS",
    "CheckpointArrays",
    "CheckpointInfo",
    "LoadResult",
    "checkpoint_config",
    "checkpoint_defaults",
    "checkpoint_info",
    "checkpoint_model_config",
    "detect_format",
    "load_weights",
    "model_from_checkpoint",
    "npz_key_map",
    "read_checkpoint",
    "read_npz",
    "resolve_weights",
    "save_preset",
    "save_timm_safetensors",
    "timm_model_kwargs",
    "to_timm_state_dict",
]
