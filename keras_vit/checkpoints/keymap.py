"""Step 4 of the checkpoint pipeline, the key map (:func:`npz_key_map`) and its inverse (:func:`model_arrays`):
``.npz`` keys to model variables, each layer giving its own entries (``npz_key_map``). Rules: docs/design.md."""

from __future__ import annotations

import re

import keras
import numpy as np

from keras_vit.layers import KeyMap, Transform, TransformerBlock, dense_entries, entries_of
from keras_vit.position import AddPositionEmbs, check_method

__all__ = ["HEAD_LAYERS", "KeyMap", "Transform", "model_arrays", "npz_key_map"]

HEAD_LAYERS = ("pre_logits", "head", "head_dist")
_ATTENTION_ARRAY = re.compile(r"Transformer/encoderblock_(\d+)/MultiHeadDotProductAttention_1/(\w+)/(kernel|bias)")


def _walk(model: keras.Model):
    """Top-level layers in order, descending into nested models."""
    for layer in model.layers:
        yield from _walk(layer) if isinstance(layer, keras.Model) else (layer,)


def npz_key_map(model: keras.Model, *, resize_method: str = "zoom_linear") -> KeyMap:
    """``{npz_key: (variable, transform)}`` for every variable of ``model`` that a checkpoint holds, each layer's
    entries from its ``npz_key_map`` under its canonical prefix; position embeddings of another grid are resized with
    ``resize_method`` (:mod:`keras_vit.position`)."""
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
        clash = entries.keys() & part.keys()
        if clash:
            raise ValueError(f"Layer {layer.name!r} maps checkpoint keys another layer already maps: {sorted(clash)}.")
        entries.update(part)
    return entries


def model_arrays(model: keras.Model) -> dict[str, np.ndarray]:
    """A keras-vit model's weights in the Google ``.npz`` layout (the inverse of the loader's key map)."""
    blocks = model._flatten_layers(include_self=False)
    heads = [block.num_heads for block in blocks if isinstance(block, TransformerBlock)]
    groups: dict[int, tuple[keras.Variable, list[str]]] = {}
    for key, (variable, _) in npz_key_map(model).items():
        groups.setdefault(id(variable), (variable, []))[1].append(key)
    arrays = {}
    for variable, keys in groups.values():
        value = keras.ops.convert_to_numpy(variable)
        for key, part in zip(keys, np.split(value, len(keys), axis=-1)):
            match = _ATTENTION_ARRAY.fullmatch(key)
            if match:
                h = heads[int(match[1])]
                if match[2] in ("query", "key", "value"):
                    part = part.reshape((part.shape[0], h, -1) if match[3] == "kernel" else (h, -1))
                elif match[3] == "kernel":  # out
                    part = part.reshape(h, -1, part.shape[-1])
            arrays[key] = part
    return arrays
