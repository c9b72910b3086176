"""Multihead attention pooling (MAP), SigLIP's and big_vision's ``MAPHead``: ``a = MHA(probe, z_L)``,
``y = a + MLP(LN(a))``."""

from __future__ import annotations

import math

import keras
from keras import layers, ops

from keras_vit.checks import check_positive_int, check_positive_number
from keras_vit.config import LAYER_NORM_EPSILON
from keras_vit.layers import KeyMap, MlpBlock, attention_entries, entries_of, identity, layer_norm, rows, unrows
from keras_vit.quantization import arguments_config, dtype_config, sublayer_policy

__all__ = ["MAP_PREFIX", "MAPHead"]

MAP_PREFIX = "MAPHead_0"  # big_vision's module name, the head's key prefix in the .npz layout


@keras.saving.register_keras_serializable(package="keras_vit")
class MAPHead(layers.Layer):
    """Multihead attention pooling: tokens ``(B, N, D)`` -> ``(B, D)``; sub-layers ``query``, ``key_value``, ``out``,
    ``LayerNorm_0``, ``MlpBlock_0``. ``return_attention_scores=True`` also returns the probe's ``(B, heads, 1, N)``.
    """

    def __init__(
        self,
        num_heads: int,
        mlp_dim: int,
        gelu: str = "tanh",
        layer_norm_epsilon: float = LAYER_NORM_EPSILON,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = check_positive_int(num_heads, "num_heads")
        self.layer_norm_epsilon = check_positive_number(layer_norm_epsilon, "layer_norm_epsilon")
        policy = self.dtype_policy
        self.norm = layer_norm("LayerNorm_0", policy, self.layer_norm_epsilon)
        self.mlp = MlpBlock(mlp_dim, gelu=gelu, name="MlpBlock_0", dtype=policy)  # checks mlp_dim and gelu
        self.mlp_dim, self.gelu = self.mlp.mlp_dim, self.mlp.gelu

    def build(self, input_shape):
        width = input_shape[-1]
        if width % self.num_heads:
            raise ValueError(f"Hidden size {width} is not divisible by num_heads={self.num_heads}.")
        self.head_dim = width // self.num_heads
        self.probe = self.add_weight(name="probe", shape=(1, 1, width), initializer="glorot_uniform")
        self.query, self.key_value, self.out = (
            layers.Dense(units, kernel_initializer="glorot_uniform", name=name, dtype=sublayer_policy(self, name))
            for units, name in ((width, "query"), (2 * width, "key_value"), (width, "out"))
        )
        for layer in (self.query, self.key_value, self.out, self.norm, self.mlp):
            layer.build((None, width))

    def call(self, tokens, return_attention_scores: bool = False):
        batch, length, width = ops.shape(tokens)[0], ops.shape(tokens)[1], tokens.shape[-1]
        heads, head_dim = self.num_heads, self.head_dim
        q = ops.reshape(
            self.query(ops.reshape(ops.cast(self.probe, tokens.dtype), (1, width))), (1, heads, 1, head_dim)
        )
        kv = ops.reshape(self.key_value(rows(tokens)), (batch, length, 2, heads, head_dim))
        k, v = ops.unstack(ops.transpose(kv, (2, 0, 3, 1, 4)), 2, axis=0)  # each (B, heads, N, d_h)
        logits = ops.matmul(q * ops.cast(1.0 / math.sqrt(head_dim), q.dtype), ops.swapaxes(k, -1, -2))
        probs = ops.cast(ops.softmax(ops.cast(logits, "float32"), axis=-1), tokens.dtype)  # (B, heads, 1, N)
        a = self.out(ops.reshape(ops.matmul(probs, v), (batch, width)))  # heads side by side: (B, D)
        y = a + unrows(self.mlp(self.norm(a)), a)
        return (y, probs) if return_attention_scores else y

    def npz_key_map(self, prefix: str = MAP_PREFIX) -> KeyMap:
        """big_vision's entries under ``prefix``: the probe, attention (k and v into ``key_value``), norm, MLP."""
        projections = (("query", self.query), ("key", self.key_value), ("value", self.key_value))
        attention = attention_entries(f"{prefix}/MultiHeadDotProductAttention_0", self.num_heads, projections, self.out)
        return {f"{prefix}/probe": (self.probe, identity)} | attention | entries_of(prefix, self.norm, self.mlp)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])

    def get_config(self):  # dtype_config: with its quantized layers' policies
        return {**super().get_config(), **dtype_config(self), **arguments_config(self, MAPHead)}
