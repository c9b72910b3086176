"""Reading the published Google ``.npz`` checkpoints (google-research/vision_transformer): files, catalogue names.

A checkpoint is a flat ``.npz`` whose keys are the Flax module paths: ``embedding/kernel``, ``cls``,
``Transformer/posembed_input/pos_embedding``, ``Transformer/encoderblock_{i}/...``,
``Transformer/encoder_norm/...``, ``pre_logits/...``, ``head/...`` (and ``conv_root/...``,
``block{s}/unit{u}/...`` for the ResNet of the hybrids). Checkpoints saved with their optimizer state
nest these under ``opt/target/``; they read the same.
"""

from __future__ import annotations

import os
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from keras_vit import zoo

__all__ = ["CheckpointArrays", "read_checkpoint", "read_npz", "resolve_weights"]

_TRAINING_PREFIX = "opt/target/"  # checkpoints saved with their optimizer state nest the parameters here


class CheckpointArrays(dict):
    """A checkpoint's arrays by key, remembering where they came from (for messages)."""

    def __init__(self, arrays: Mapping[str, np.ndarray], source: str):
        super().__init__(arrays)
        self.source = source


def read_npz(path: str | os.PathLike) -> CheckpointArrays:
    """All arrays of an ``.npz`` checkpoint; a ``ValueError`` naming the file when it is unreadable."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No checkpoint file at {path}.")
    try:
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise ValueError("it holds one array, not named arrays")
        with data:
            arrays = {key: data[key] for key in data.files}
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError) as exc:
        raise ValueError(
            f"{path} is not a readable .npz checkpoint ({type(exc).__name__}: {exc}). The file is truncated "
            "or corrupt: delete it and download it again."
        ) from exc
    if any(key.startswith(_TRAINING_PREFIX) for key in arrays):
        arrays = {key[len(_TRAINING_PREFIX) :]: a for key, a in arrays.items() if key.startswith(_TRAINING_PREFIX)}
    if "embedding/kernel" not in arrays:
        listed = ", ".join(sorted(arrays)[:5]) or "none"
        raise ValueError(f"{path} is not a ViT checkpoint: it has no 'embedding/kernel' key (keys: {listed}).")
    return CheckpointArrays(arrays, str(path))


def resolve_weights(weights: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """A local checkpoint path for ``weights``: an existing file, or a zoo catalogue name (downloaded)."""
    path = Path(weights).expanduser()
    if path.is_file():
        return path
    if zoo.find(str(weights)) is None:
        if str(weights).endswith(".npz"):
            raise FileNotFoundError(f"No checkpoint file at {path}.")
        zoo.get(str(weights))  # raises, suggesting close names
    return zoo.fetch(str(weights), cache_dir=cache_dir)


def read_checkpoint(weights: str | os.PathLike | Mapping[str, np.ndarray]) -> CheckpointArrays:
    """The arrays of ``weights``: a catalogue name (downloaded), an ``.npz`` path, or arrays already read."""
    if isinstance(weights, CheckpointArrays):
        return weights
    if isinstance(weights, Mapping):
        return CheckpointArrays(weights, "the given arrays")
    return read_npz(resolve_weights(weights))
