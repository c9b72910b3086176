"""Step 4 of the checkpoint pipeline, the key map (:func:`npz_key_map`) and its inverse (:func:`model_arrays`):
``.npz`` keys to model variables. Rules (fused ``qkv``, layers with their own map): docs/design.md."""

from __future__ import annotations

import re
from collections.abc import Callable

import keras
import numpy as np

from keras_vit.heads import MAP_PREFIX, MAPHead
from keras_vit.layers import ClassToken, PatchEmbed, TransformerBlock
from keras_vit.position import AddPositionEmbs, check_method, resample_position_embeddings, square_grid
from keras_vit.tokens import PrefixTokens

__all__ = ["HEAD_LAYERS", "KeyMap", "Transform", "model_arrays", "npz_key_map"]

Transform = Callable[[np.ndarray], np.ndarray]
KeyMap = dict[str, tuple[keras.Variable, Transform]]

HEAD_LAYERS = ("pre_logits", "head", "head_dist")
_ATTENTION_ARRAY = re.compile(r"Transformer/encoderblock_(\d+)/MultiHeadDotProductAttention_1/(\w+)/(kernel|bias)")


def identity(array: np.ndarray) -> np.ndarray:
    return array


def _merge_heads(num_heads: int, axis: int) -> Transform:
    """``(..., heads, head_dim, ...)`` at ``axis`` -> one ``heads * head_dim`` axis; checks the head count."""

    def transform(array: np.ndarray) -> np.ndarray:
        if array.ndim <= axis + 1 or array.shape[axis] != num_heads:
            raise ValueError(f"shape {array.shape} does not split into the model's {num_heads} heads")
        shape = (*array.shape[:axis], -1, *array.shape[axis + 2 :])
        return array.reshape(shape)

    return transform


def _dense(prefix: str, layer, kernel: Transform = identity, bias: Transform = identity) -> KeyMap:
    return {f"{prefix}/kernel": (layer.kernel, kernel), f"{prefix}/bias": (layer.bias, bias)}


def _norm(prefix: str, layer) -> KeyMap:
    return {f"{prefix}/scale": (layer.gamma, identity), f"{prefix}/bias": (layer.beta, identity)}


def _block_map(prefix: str, block: TransformerBlock) -> KeyMap:
    attn = f"{prefix}/MultiHeadDotProductAttention_1"
    heads = block.num_heads
    entries = _norm(f"{prefix}/LayerNorm_0", block.norm1)
    entries.update(_attention_map(attn, heads, ((block.attn.qkv, ("query", "key", "value")),), block.attn.out))
    if block.attn.q_norm is not None:  # qk-norm
        entries.update(_norm(f"{attn}/q_norm", block.attn.q_norm) | _norm(f"{attn}/k_norm", block.attn.k_norm))
    entries.update(_norm(f"{prefix}/LayerNorm_2", block.norm2))
    entries.update(_dense(f"{prefix}/MlpBlock_3/Dense_0", block.mlp.fc1))
    entries.update(_dense(f"{prefix}/MlpBlock_3/Dense_1", block.mlp.fc2))
    for name, scale in (("ls1", block.ls1), ("ls2", block.ls2)):  # layer scale, where the block has it
        if scale is not None:
            entries[f"{prefix}/{name}/gamma"] = (scale.gamma, identity)
    return entries


def _attention_map(prefix: str, heads: int, projections, out) -> KeyMap:
    """q/k/v as ``(D, heads, d_h)`` arrays into their (fused) projections, each ``(layer, names)`` concatenated in
    this order, and ``out`` from ``(heads, d_h, D)``."""
    entries: KeyMap = {}
    for layer, names in projections:
        for name in names:
            entries.update(_dense(f"{prefix}/{name}", layer, _merge_heads(heads, 1), _merge_heads(heads, 0)))
    return entries | _dense(f"{prefix}/out", out, kernel=_merge_heads(heads, 0))


def _map_head_map(head: MAPHead) -> KeyMap:
    """big_vision's ``MAPHead_0`` keys: the probe, its attention (k and v into the fused ``key_value``), norm, MLP."""
    projections = ((head.query, ("query",)), (head.key_value, ("key", "value")))
    entries = {f"{MAP_PREFIX}/probe": (head.probe, identity)}
    entries.update(
        _attention_map(f"{MAP_PREFIX}/MultiHeadDotProductAttention_0", head.num_heads, projections, head.out)
    )
    entries.update(_norm(f"{MAP_PREFIX}/LayerNorm_0", head.norm))
    entries.update(_dense(f"{MAP_PREFIX}/MlpBlock_0/Dense_0", head.mlp.fc1))
    return entries | _dense(f"{MAP_PREFIX}/MlpBlock_0/Dense_1", head.mlp.fc2)


def _posemb_map(layer: AddPositionEmbs, method: str) -> KeyMap:
    target = tuple(layer.pos_embedding.shape)

    def transform(array: np.ndarray) -> np.ndarray:
        if array.shape == target or array.ndim != 3 or array.shape[-1] != target[-1]:
            return array  # equal, or a width mismatch the shape check reports
        grid = square_grid(array.shape[1] - layer.num_prefix_tokens)
        return resample_position_embeddings(
            array, layer.grid_size, num_prefix_tokens=layer.num_prefix_tokens, old_grid=grid, method=method
        )

    return {"Transformer/posembed_input/pos_embedding": (layer.pos_embedding, transform)}


def _walk(model: keras.Model):
    """Top-level layers in order, descending into nested models."""
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            yield from _walk(layer)
        else:
            yield layer


def npz_key_map(model: keras.Model, *, resize_method: str = "zoom_linear") -> KeyMap:
    """``{npz_key: (variable, transform)}`` for every variable of ``model`` that a checkpoint holds; position
    embeddings of another grid are resized with ``resize_method`` (:mod:`keras_vit.position`)."""
    check_method(resize_method)
    entries: KeyMap = {}
    num_blocks = 0
    for layer in _walk(model):
        if callable(getattr(layer, "npz_key_map", None)):
            part = layer.npz_key_map()
        elif isinstance(layer, TransformerBlock):
            part = _block_map(f"Transformer/encoderblock_{num_blocks}", layer)
            num_blocks += 1
        elif isinstance(layer, PatchEmbed):
            part = _dense("embedding", layer)
        elif isinstance(layer, ClassToken):
            part = {"cls": (layer.cls, identity)}
        elif isinstance(layer, PrefixTokens):
            part = {layer.name: (layer.tokens, identity)}  # "distillation_token", "register_tokens"
        elif isinstance(layer, AddPositionEmbs) and isinstance(layer.pos_embedding, keras.Variable):
            part = _posemb_map(layer, resize_method)  # learned 1-D, as published (not the 2-D/sin-cos variants)
        elif isinstance(layer, MAPHead):
            part = _map_head_map(layer)
        elif isinstance(layer, keras.layers.LayerNormalization) and layer.name in ("encoder_norm", "norm_pre"):
            part = _norm(f"Transformer/{layer.name}", layer)
        elif isinstance(layer, keras.layers.Dense) and layer.name in HEAD_LAYERS:
            part = _dense(layer.name, layer)
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
