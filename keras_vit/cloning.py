"""A model's clone with its weights: under another layer config or dtype policy (:mod:`keras_vit.precision`), or
with LoRA adapters merged (:mod:`keras_vit.lora`)."""

from __future__ import annotations

import keras

__all__ = ["clone_with_weights", "copy_layer_weights", "copy_weights"]


def clone_with_weights(model: keras.Model, clone_function=None) -> keras.Model:
    """``keras.models.clone_model(model, clone_function=...)`` with every layer's weights copied from ``model``
    (``save_own_variables`` / ``load_own_variables``, layer by layer): a LoRA-adapted ``Dense`` passes on its merged
    kernel, as ``model.save`` writes it, so the clone computes what ``model`` does without adapters."""
    return copy_weights(model, keras.models.clone_model(model, clone_function=clone_function))


def copy_weights(model: keras.Model, clone: keras.Model) -> keras.Model:
    """``clone`` (a model of ``model``'s layer structure) with every layer's weights copied from ``model``, layer by
    layer (a LoRA-adapted ``Dense`` passes on its merged kernel); returns ``clone``."""
    old_layers = list(model._flatten_layers(include_self=False))
    new_layers = list(clone._flatten_layers(include_self=False))
    if len(old_layers) != len(new_layers):
        raise ValueError(f"Cannot copy {model.name!r}: its clone has another layer structure.")
    for old, new in zip(old_layers, new_layers):
        copy_layer_weights(old, new)
    return clone


def copy_layer_weights(old: keras.Layer, new: keras.Layer) -> None:
    """``new``'s own variables set to copies of ``old``'s (``save_own_variables`` / ``load_own_variables``)."""
    store: dict = {}
    old.save_own_variables(store)
    # numpy copies: on JAX the clone must not share arrays that Keras may free when it syncs the other model
    new.load_own_variables({key: keras.ops.convert_to_numpy(value) for key, value in store.items()})
