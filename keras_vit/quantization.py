"""Keras quantization (``model.quantize(mode)``) kept in a model's config, so that a quantized ``.keras`` file loads.

``quantize`` gives each quantized ``Dense`` a policy of its own (``"int8_from_float32"``). A layer's config records
them, as keras-hub's backbones do, in a ``keras.dtype_policies.DTypePolicyMap`` over its own policy, keyed by each
quantized layer's path (``encoderblock_0/MlpBlock_3/Dense_0``); a model built from that config hands the map down,
and each ``Dense`` looks its path up when it is built, so it builds its quantized variables. Modes and the head:
docs/models.md ("Quantization")."""

from __future__ import annotations

from typing import Any

import keras
from keras.dtype_policies import DTypePolicyMap

__all__ = [
    "QUANTIZATION_MODES",
    "check_head_dtype",
    "dtype_config",
    "is_quantized",
    "layer_policy",
    "own_policy",
    "recorded_policy",
    "sublayer_policy",
]

# The modes of keras.Model.quantize a keras-vit model takes without calibration data (Keras 3.15: Dense and
# EinsumDense). "gptq" and "awq" calibrate on text through a tokenizer, for language models.
QUANTIZATION_MODES = ("int8", "float8", "int4")


def own_policy(layer: keras.Layer) -> keras.DTypePolicy:
    """``layer``'s own dtype policy: its entry (by path) in a ``DTypePolicyMap`` it shares with its model, else its
    policy."""
    policy = layer.dtype_policy
    if isinstance(policy, DTypePolicyMap):
        return policy[layer.path] if layer.path else policy.default_policy
    return policy


def recorded_policy(layer: keras.Layer) -> keras.DTypePolicy:
    """The dtype policy ``layer``'s config records: its own, or, where layers inside it are quantized, a
    ``DTypePolicyMap`` of their policies by path over its own."""
    quantized = {
        sublayer.path: own_policy(sublayer)
        for sublayer in layer._flatten_layers(include_self=False)
        if sublayer.quantization_mode is not None
    }
    own = own_policy(layer)
    return DTypePolicyMap(own.name, quantized) if quantized else own


def dtype_config(layer: keras.Layer) -> dict[str, Any]:
    """``{"dtype": ...}`` for ``layer.get_config()``: :func:`recorded_policy`, serialised."""
    return {"dtype": keras.dtype_policies.serialize(recorded_policy(layer))}


def is_quantized(model: keras.Layer) -> bool:
    """Whether any layer of ``model`` (or ``model`` itself) is quantized."""
    return any(layer.quantization_mode is not None for layer in model._flatten_layers(include_self=True))


def layer_policy(
    policy: keras.DTypePolicy, path: str, default: str | keras.DTypePolicy | None = None
) -> keras.DTypePolicy:
    """The policy the layer at ``path`` is built under, given its parent's (or the model's) ``policy``: its entry
    where ``policy`` is a ``DTypePolicyMap`` recording one (a quantized model's config), else ``default``, else
    ``policy`` (a map's default). A ``Dense`` built under a map of its own would save its quantized variables
    wrongly (Keras 3.15 reads its mode from the map's default there), so each gets its entry."""
    if isinstance(policy, DTypePolicyMap):
        if path in policy:
            return policy[path]
        policy = policy.default_policy
    return keras.dtype_policies.get(policy if default is None else default)


def sublayer_policy(layer: keras.Layer, name: str) -> keras.DTypePolicy:
    """:func:`layer_policy` of ``layer``'s sublayer ``name``, created in ``layer.build`` (its path known then)."""
    return layer_policy(layer.dtype_policy, f"{layer.path}/{name}")


def check_head_dtype(head_dtype: str | keras.DTypePolicy | None) -> str | None:
    """``head_dtype`` as a policy name (``None`` kept): a ``ValueError`` for what is not a float dtype policy."""
    if head_dtype is None:
        return None
    try:
        policy = keras.dtype_policies.get(head_dtype)
    except (ValueError, TypeError) as exc:
        raise ValueError(
            f"head_dtype must be a Keras dtype policy or its name (float32, mixed_bfloat16, bfloat16, ...), got "
            f"{head_dtype!r}."
        ) from exc
    if policy.quantization_mode is not None or isinstance(policy, DTypePolicyMap):
        raise ValueError(
            f"head_dtype is the float head's precision, got {policy.name!r}; quantize a built model with "
            "model.quantize(mode), head included."
        )
    return policy.name
