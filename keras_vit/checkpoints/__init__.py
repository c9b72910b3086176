"""The published Google ``.npz`` checkpoints, in four steps, one module each:

- :mod:`~keras_vit.checkpoints.read`: a file or a zoo catalogue name -> its arrays (:class:`CheckpointArrays`).
- :mod:`~keras_vit.checkpoints.inspect`: arrays -> the architecture and classifier they imply (:class:`CheckpointInfo`).
- :mod:`~keras_vit.checkpoints.keymap`: a model -> where each checkpoint key goes (:func:`npz_key_map`).
- :mod:`~keras_vit.checkpoints.load`: arrays into a model (:func:`load_weights`), or the model they
  describe (:func:`model_from_checkpoint`).

The model graph (:mod:`keras_vit.models`) knows nothing of checkpoints; this package sits on top of it.
"""

from keras_vit.checkpoints.inspect import CheckpointInfo, checkpoint_info
from keras_vit.checkpoints.keymap import npz_key_map
from keras_vit.checkpoints.load import LoadResult, checkpoint_defaults, load_weights, model_from_checkpoint
from keras_vit.checkpoints.read import CheckpointArrays, read_checkpoint, read_npz, resolve_weights

__all__ = [
    "CheckpointArrays",
    "CheckpointInfo",
    "LoadResult",
    "checkpoint_defaults",
    "checkpoint_info",
    "load_weights",
    "model_from_checkpoint",
    "npz_key_map",
    "read_checkpoint",
    "read_npz",
    "resolve_weights",
]
