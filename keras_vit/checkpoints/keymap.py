"""Step 4 of the checkpoint pipeline, the key map (:func:`npz_key_map`) and its inverse (:func:`model_arrays`):
``.npz`` keys to model variables, each layer giving its own entries (``npz_key_map``). Rules: docs/design.md."""

from __future__ import annotations

import keras
import numpy as np

from keras_vit.layers import KeyMap, Transform, TransformerBlock, dense_entries, entries_of, identity
from keras_vit.position import AddPositionEmbs, check_method

__all__ = ["HEAD_LAYERS", "KeyMap", "Transform", "layers_of", "model_arrays", "npz_key_map"]

HEAD_LAYERS = ("pre_logits", "head", "head_dist")


def layers_of(model: keras.Model, cls) -> list:
    """Every layer of ``model`` (nested ones too) that is a ``cls``."""
    return [layer for layer in model._flatten_layers(include_self=False) if isinstance(layer, cls)]


def _walk(model: keras.Model):
    """Top-level layers in order, descending into nested models."""
    for layer in model.layers:
        yield from _walk(layer) if isinstance(layer, keras.Model) else (layer,)


def npz_key_map(model: keras.Model, *, resize_method: str = "zoom_linear") -> KeyMap:
    """``{npz_key: (variable, transform)}`` for every variable of ``model`` that a checkpoint holds, each layer's own
    (``npz_key_map``) under its canonical prefix; ``resize_method`` resizes position embeddings of another grid."""
    check_method(resize_method)
    entries: KeyMap = {}
    num_blocks = 0
    for layer in _walk(model):
        if isinstance(layer, TransformerBlock):
            part = layer.npz_key_map(f"Transformer/encoderblock_{num_blocks}")
            num_blocks += 1
        elif isinstance(layer, AddPositionEmbs):
            part = layer.npz_key_map(resize_method=resize_method)  # learned 1-D only, as published
        elif callable(getattr(layer, "npz_key_map", None)):
            part = layer.npz_key_map()
        elif isinstance(layer, keras.layers.LayerNormalization) and layer.name in ("encoder_norm", "norm_pre"):
            part = entries_of("Transformer", layer)
        elif isinstance(layer, keras.layers.Dense) and layer.name in HEAD_LAYERS:
            part = dense_entries(layer.name, layer)
        else:
            continue
        if clash := entries.keys() & part.keys():
            raise ValueError(f"Layer {layer.name!r} maps checkpoint keys another layer already maps: {sorted(clash)}.")
        entries.update(part)
    return entries


def model_arrays(model: keras.Model) -> dict[str, np.ndarray]:
    """A keras-vit model's weights in the Google ``.npz`` layout, by the key map read backwards: a variable split on
    its last axis among its keys in order (the fused ``qkv``), each part through its transform's ``inverse``."""
    groups: dict[int, list[tuple[str, keras.Variable, Transform]]] = {}
    for key, (variable, transform) in npz_key_map(model).items():
        groups.setdefault(id(variable), []).append((key, variable, transform))
    arrays = {}
    for entries in groups.values():
        value = keras.ops.convert_to_numpy(entries[0][1])
        for (key, _, transform), part in zip(entries, np.split(value, len(entries), axis=-1)):
            arrays[key] = getattr(transform, "inverse", identity)(part)
    return arrays
