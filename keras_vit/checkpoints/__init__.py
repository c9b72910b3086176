"""Checkpoints: a file, folder or catalogue name read into the Google ``.npz`` key layout (every foreign format
converted into it), the config its shapes imply, and the strict load into a model. Map: docs/design.md; formats:
docs/foreign-weights.md."""

from keras_vit.checkpoints.formats import FORMATS, detect_format
from keras_vit.checkpoints.inspect import CheckpointInfo, checkpoint_config, checkpoint_info
from keras_vit.checkpoints.keymap import npz_key_map
from keras_vit.checkpoints.load import LoadResult, checkpoint_defaults, load_weights, model_from_checkpoint
from keras_vit.checkpoints.read import CheckpointArrays, read_checkpoint, read_npz, resolve_weights
from keras_vit.checkpoints.timm import save_timm_safetensors, timm_model_kwargs, to_timm_state_dict

__all__ = [
    "FORMATS",
    "CheckpointArrays",
    "CheckpointInfo",
    "LoadResult",
    "checkpoint_config",
    "checkpoint_defaults",
    "checkpoint_info",
    "detect_format",
    "load_weights",
    "model_from_checkpoint",
    "npz_key_map",
    "read_checkpoint",
    "read_npz",
    "resolve_weights",
    "save_timm_safetensors",
    "timm_model_kwargs",
    "to_timm_state_dict",
]
