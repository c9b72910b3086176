"""Prefix tokens besides the class token: DeiT's distillation token and register tokens; every pooling skips them
all (:func:`num_prefix_tokens`). Equations: docs/family.md."""

from __future__ import annotations

import keras
from keras import layers, ops

from keras_vit.checks import check_count, check_positive_int
from keras_vit.layers import ClassToken, KeyMap, identity

__all__ = ["PrefixTokens", "TokenAt", "distillation_model", "num_prefix_tokens"]


@keras.saving.register_keras_serializable(package="keras_vit")
class PrefixTokens(layers.Layer):
    """Inserts ``count`` learned tokens ``tokens`` ``(1, count, D)`` after the first ``offset`` tokens:
    ``(B, n, D) -> (B, n + count, D)``. Initialised normal(1e-6)."""

    def __init__(self, count: int, offset: int = 1, **kwargs):
        super().__init__(**kwargs)
        self.count = check_positive_int(count, "count")
        self.offset = check_count(offset, "offset")

    def build(self, input_shape):
        init = keras.initializers.RandomNormal(stddev=1e-6)
        self.tokens = self.add_weight(name="tokens", shape=(1, self.count, input_shape[-1]), initializer=init)

    def call(self, x):
        tokens = ops.broadcast_to(ops.cast(self.tokens, x.dtype), (ops.shape(x)[0], self.count, x.shape[-1]))
        return ops.concatenate([x[:, : self.offset], tokens, x[:, self.offset :]], axis=1)

    def compute_output_shape(self, input_shape):
        b, n, d = input_shape
        return (b, None if n is None else n + self.count, d)

    def npz_key_map(self, prefix: str | None = None) -> KeyMap:
        """The tokens as ``prefix``, by default the layer's name (``distillation_token``, ``register_tokens``)."""
        return {prefix or self.name: (self.tokens, identity)}

    def get_config(self):
        return {**super().get_config(), "count": self.count, "offset": self.offset}


@keras.saving.register_keras_serializable(package="keras_vit")
class TokenAt(layers.Layer):
    """The token at ``index``: ``(B, N, D) -> (B, D)`` (the distillation token, for ``head_dist``)."""

    def __init__(self, index: int, **kwargs):
        super().__init__(**kwargs)
        self.index = check_count(index, "index")

    def call(self, tokens):
        return tokens[:, self.index]

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])

    def get_config(self):
        return {**super().get_config(), "index": self.index}


def num_prefix_tokens(model: keras.Model) -> int:
    """The tokens before the patches in ``model``'s encoder: its class, distillation and register tokens."""
    found = list(model._flatten_layers(include_self=False))
    return sum(1 for layer in found if isinstance(layer, ClassToken)) + sum(
        layer.count for layer in found if isinstance(layer, PrefixTokens)
    )


def distillation_model(model: keras.Model) -> keras.Model:
    """A model sharing ``model``'s weights (built with ``distillation_token=True``) that returns both heads'
    logits, ``[head(z_L^0), head_dist(z_L^1)]``: DeiT's training outputs, the class head learning the labels and
    the distillation head the teacher's predictions. ``model`` itself returns their mean, as DeiT at inference."""
    names = {layer.name for layer in model.layers}
    if not {"head", "head_dist"} <= names:
        raise ValueError(f"Model {model.name!r} has no distillation head (build it with distillation_token=True).")
    heads = [model.get_layer(name).output for name in ("head", "head_dist")]
    return keras.Model(model.input, heads, name=f"{model.name}_distillation")
