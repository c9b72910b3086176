"""A catalogue name's checkpoint, downloaded and checked against its catalogue entry before use
(:func:`resolve_weights`, :func:`catalogue_check`, which reads only the array headers)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

from keras_vit import zoo
from keras_vit.checkpoints.from_timm import timm_to_npz
from keras_vit.checkpoints.infer import (
    TOKEN_FIELDS,
    CheckpointInfo,
    checkpoint_info,
    differences,
    prefix_token_fields,
    shapes_only,
)
from keras_vit.checkpoints.source import TRAINING_PREFIX, find_checkpoint
from keras_vit.config import ViTConfig
from keras_vit.variants import parse_variant
from keras_vit.zoo.errors import CorruptCheckpointError
from keras_vit.zoo.validate import npz_shapes, safetensors_shapes

__all__ = ["catalogue_check", "check_catalogue_shapes", "resolve_weights"]


def resolve_weights(weights: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """A local checkpoint path for ``weights``: an existing file or folder, or a zoo catalogue name (downloaded,
    checked with :func:`catalogue_check`)."""
    return find_checkpoint(weights, cache_dir, check=catalogue_check)


def catalogue_check(entry: zoo.Checkpoint) -> Callable[[Path], None]:
    """A check that a file is ``entry``'s model (architecture, ResNet, classifier, grid, classes, ``pre_logits``), read
    from its array headers; a ``CorruptCheckpointError`` naming the file, the entry and what differs."""

    def check(path: Path) -> None:
        shapes = (
            {key.removeprefix(TRAINING_PREFIX): shape for key, shape in npz_shapes(path).items()}
            if entry.path.endswith(".npz")
            else safetensors_shapes(path)
        )
        check_catalogue_shapes(entry, shapes, str(path))

    return check


def check_catalogue_shapes(entry: zoo.Checkpoint, shapes: Mapping[str, tuple[int, ...]], source: str) -> None:
    """``CorruptCheckpointError`` unless arrays of these ``shapes`` are ``entry``'s model (broadcast zeros, nothing
    allocated). A variant the table does not build (AugReg's ``R+Ti/16``) is held to its head only."""
    try:
        architecture = parse_variant(entry.variant)
    except ValueError:
        architecture = None
    config = None if architecture is None else ViTConfig.from_variant(entry.variant)
    arrays = shapes_only(shapes)
    try:
        if not entry.path.endswith(".npz"):
            arrays = timm_to_npz(arrays, source=source)[0]  # heads: 64 wide, as every named variant's
        found = checkpoint_info(arrays)
    except (ValueError, KeyError) as exc:
        raise CorruptCheckpointError(f"{source} is not the checkpoint {entry.name}: {exc}") from None
    model = architecture or found.architecture
    side = entry.image_size // model.stride
    grid = (side, side) if architecture else found.grid_size
    pre_logits = model.hidden_size if entry.pre_logits else None
    classes = entry.num_classes or None  # 0: no head (SigLIP, DINOv2)
    expected = CheckpointInfo(model, config.classifier if config else "token", grid, classes, pre_logits)
    differ = differences(found, expected, entry.name)
    if config is not None:
        tokens = prefix_token_fields(arrays)
        for field in TOKEN_FIELDS:
            ours = tokens.get(field, getattr(ViTConfig, field))  # the file's, else the field's default
            if ours != getattr(config, field):
                differ = ", ".join(filter(None, (differ, f"{field} {ours} ({entry.name}: {getattr(config, field)})")))
    if differ:
        raise CorruptCheckpointError(
            f"{source} is not the checkpoint {entry.name} ({entry.variant} at {entry.image_size} px): another "
            f"architecture: {differ}"
        )
