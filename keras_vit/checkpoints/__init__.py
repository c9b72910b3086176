"""Checkpoints: the published Google ``.npz`` files, in four steps, one module each:

- :mod:`~keras_vit.checkpoints.read`: a file, folder or zoo catalogue name -> its arrays (:class:`CheckpointArrays`).
- :mod:`~keras_vit.checkpoints.inspect`: arrays -> the architecture and classifier they imply (:class:`CheckpointInfo`),
  and the whole model config (:func:`checkpoint_config`, a :class:`~keras_vit.config.ViTConfig`).
- :mod:`~keras_vit.checkpoints.keymap`: a model -> where each checkpoint key goes (:func:`npz_key_map`).
- :mod:`~keras_vit.checkpoints.load`: arrays into a model (:func:`load_weights`), or the model they
  describe (:func:`model_from_checkpoint`).

Other formats are converted into the ``.npz`` key layout first, so the same inspection, strict loading,
head skipping and resizing apply: :mod:`~keras_vit.checkpoints.formats` (what a file is, raw tensors),
:mod:`~keras_vit.checkpoints.timm` (both ways: :func:`to_timm_state_dict`, :func:`save_timm_safetensors`),
:mod:`~keras_vit.checkpoints.huggingface`, :mod:`~keras_vit.checkpoints.keras_hub`.

The model graph (:mod:`keras_vit.models`) knows nothing of checkpoints; this package sits on top of it.
"""

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
