"""What a layer's config records: its arguments (:func:`arguments_config`), and Keras quantization
(``model.quantize(mode)``) as a ``DTypePolicyMap`` of the quantized layers' policies by path, so that a quantized
``.keras`` file loads: docs/models.md ("Quantization")."""

from __future__ import annotations

import inspect
from typing import Any

import keras
from keras.dtype_policies import DTypePolicyMap

__all__ = [
    "QUANTIZATION_MODES",
    "arguments_config",
    "check_head_dtype",
    "dtype_config",
    "is_quantized",
    "layer_policy",
    "own_policy",
    "recorded_policy",
    "sublayer_policy",
]

# keras.Model.quantize's modes that need no calibration data ("gptq" and "awq" calibrate on text).
QUANTIZATION_MODES = ("int8", "float8", "int4")


def arguments_config(layer: keras.Layer, cls: type[keras.Layer], **attributes: str) -> dict:
    """The arguments of ``cls.__init__`` but ``**kwargs`` as ``layer`` holds them (for ``get_config``): each from the
    attribute of its name, or of the name ``attributes`` gives; tuples as lists."""
    names = [name for name in inspect.signature(cls.__init__).parameters if name not in ("self", "kwargs")]
    values = {name: getattr(layer, attributes.get(name, name)) for name in names}
    return {name: list(value) if isinstance(value, tuple) else value for name, value in values.items()}


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
    where ``policy`` is a ``DTypePolicyMap`` recording one, else ``default``, else ``policy`` (a map's default). Each
    ``Dense`` gets its entry: under a whole map Keras 3.15 would save its quantized variables wrongly."""
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
