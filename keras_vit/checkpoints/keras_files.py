"""Keras' own files, outside the pipeline: a ``.weights.h5`` (shapes checked, then ``keras.Model.load_weights``)
and a saved ``.keras`` model (``keras.saving.load_model``, read out by the key map: :func:`read_saved_model`; a
quantized one loads whole: :func:`quantized_saved_model`)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import keras

from keras_vit.checkpoints.keymap import layers_of, model_arrays, npz_key_map
from keras_vit.checkpoints.source import CheckpointArrays, check_archive, detect_format
from keras_vit.config import field_names
from keras_vit.files import open_zip
from keras_vit.layers import PatchEmbed, TransformerBlock
from keras_vit.models import VisionTransformer, model_options
from keras_vit.position import AddPositionEmbs
from keras_vit.quantization import is_quantized
from keras_vit.zoo.errors import CorruptCheckpointError

__all__ = ["keras_weights_file", "load_keras_weights", "load_saved_model", "quantized_saved_model", "read_saved_model"]


def keras_weights_file(weights) -> Path | None:
    """``weights`` as a path where it names an existing Keras ``.weights.h5``; None for anything else."""
    if isinstance(weights, Mapping):
        return None
    path = Path(weights).expanduser()
    return path if path.is_file() and detect_format(path) == "keras_weights" else None


def _weights_h5_shape(path) -> dict[str, object]:
    """Patch, width, depth, MLP width and position embeddings of the keras-vit model a ``.weights.h5`` was saved
    from, read from the shapes Keras stored (``layers/patch_embed/vars/0``, one ``layers/transformer_block_N`` group
    per block, ``layers/add_position_embs/vars/0``); None for what the file's layout does not show."""
    import h5py

    names: list[str] = []
    with h5py.File(path, "r") as file:
        file.visit(names.append)

        def shape(pattern: str):
            return next((file[n].shape for n in names if re.fullmatch(pattern, n)), None)

        kernel, positions = [shape(rf"layers/{layer}(_\d+)?/vars/0") for layer in ("patch_embed", "add_position_embs")]
        fc1 = shape(r"layers/(\w+_)?transformer_block/mlp/fc1/vars/0")
    blocks = {match[1] for match in map(re.compile(r"layers/((\w+_)?transformer_block(_\d+)?)/").match, names) if match}
    return _shape(kernel, positions, len(blocks) or None, fc1)


def _model_shape(model: keras.Model) -> dict[str, object]:
    """:func:`_weights_h5_shape` of a model."""
    blocks = layers_of(model, TransformerBlock)
    kernels = [tuple(layer.kernel.shape) for layer in layers_of(model, PatchEmbed)]
    learned = [layer for layer in layers_of(model, AddPositionEmbs) if type(layer) is AddPositionEmbs]
    return _shape(
        kernels[0] if kernels else None,
        tuple(learned[0].pos_embedding.shape) if learned else None,
        len(blocks) or None,
        (blocks[0].mlp_dim,) if blocks else None,
    )


def _shape(kernel, positions, depth: int | None, fc1) -> dict[str, object]:
    patch, width = (kernel[0], kernel[-1]) if kernel is not None else (None, None)
    tokens = None if positions is None else positions[1]
    return {"patch": patch, "width": width, "depth": depth, "mlp": None if fc1 is None else fc1[-1], "tokens": tokens}


def load_keras_weights(model: keras.Model, path: Path) -> None:
    """Keras' own loader, after a check of the shapes the file shows against the model's: a file of another
    architecture is refused naming what differs, before Keras assigns any of it."""
    try:
        theirs = _weights_h5_shape(path)
    except (OSError, RuntimeError, KeyError, ValueError, TypeError) as exc:  # h5py's kinds for a damaged file
        raise ValueError(
            f"{path} is not a readable Keras .weights.h5 ({type(exc).__name__}: {exc}). The file is truncated or "
            "corrupt."
        ) from exc
    ours = _model_shape(model)
    differ = ", ".join(
        f"{name} {theirs[name]} (the model: {ours[name]})"
        for name in ours
        if None not in (ours[name], theirs[name]) and ours[name] != theirs[name]
    )
    where = f"Cannot load the Keras weights file {path} into model {model.name!r}"
    if differ:
        raise ValueError(f"{where}: it is another architecture: {differ}. Build the model it was saved from.")
    try:
        model.load_weights(path)
    except (ValueError, OSError, RuntimeError, KeyError, TypeError) as exc:
        raise ValueError(
            f"{where} (a .weights.h5 holds no architecture: build the same model it was saved from): {exc}"
        ) from exc


def quantized_saved_model(weights) -> Path | None:
    """``weights`` as a path where it names a saved ``.keras`` model whose config records quantized layers
    (``model.quantize``, :mod:`keras_vit.quantization`); None for anything else. Reads only the config."""
    path = None if isinstance(weights, Mapping) else Path(weights).expanduser()
    if path is None or not path.is_file() or detect_format(path) != "keras":
        return None
    check_archive(path)  # before any member is unpacked; a damaged zip is named there
    with open_zip(path, CorruptCheckpointError) as archive:
        try:
            config = json.loads(archive.read("config.json"))
        except (KeyError, ValueError):
            return None  # no config, or not JSON: read_saved_model names the damage
    return path if _records_quantization(config) else None


def _records_quantization(config) -> bool:
    """Whether a serialised model's config holds a quantized dtype policy (one naming a ``mode``)."""
    if isinstance(config, dict):
        policy = config.get("module") == "keras.dtype_policies" and "mode" in (config.get("config") or {})
        return policy or any(_records_quantization(value) for value in config.values())
    return isinstance(config, list) and any(_records_quantization(value) for value in config)


def load_saved_model(path: str | os.PathLike) -> keras.Model:
    """``keras.saving.load_model`` of a ``.keras`` file, its members checked first; a ``ValueError`` naming the file
    when it does not load."""
    check_archive(path)
    try:
        return keras.saving.load_model(path, compile=False)
    except Exception as exc:  # Keras raises many kinds for a damaged or foreign file (ValueError, TypeError, ...)
        raise ValueError(f"{path} is not a readable saved Keras model ({type(exc).__name__}: {exc}).") from exc


def read_saved_model(path: str | os.PathLike) -> CheckpointArrays:
    """A saved keras-vit model (``.keras``) as its weights in the ``.npz`` layout and its ``ViTConfig`` (a plain
    model of keras-vit layers: the options its layers show). A quantized model is a ``ValueError``: its integer
    weights are not a checkpoint's (:func:`~keras_vit.checkpoints.load.model_from_checkpoint` loads it whole)."""
    model = load_saved_model(path)
    if is_quantized(model):
        raise ValueError(
            f"{path} holds a quantized model (model.quantize): its weights do not load into another model. Load it "
            "as saved: keras_vit.model_from_checkpoint(path) (the commands' --weights) or keras.saving.load_model."
        )
    layers = list(model._flatten_layers(include_self=True))
    vits = [layer for layer in layers if isinstance(layer, VisionTransformer)]
    vit = vits[0] if len(vits) == 1 else model
    if not any(isinstance(layer, TransformerBlock) for layer in layers):
        raise ValueError(
            f"{path} is a saved Keras model ({type(model).__name__} {model.name!r}) without keras-vit layers (as "
            "keras_vit.ViT builds): open it with keras.saving.load_model."
        )
    config = getattr(vit, "config", None)
    options = {k: v for k, v in model_options(vit).items() if k in field_names("structure", "numerics")}
    mapped = {id(variable) for variable, _ in npz_key_map(vit).values()}
    extra = {v.path: keras.ops.convert_to_numpy(v) for v in vit.weights if id(v) not in mapped}
    fields: dict[str, Any] = dict(format="keras", model_options=options, config=config, extra=extra)
    return CheckpointArrays(model_arrays(vit), str(path), **fields)
