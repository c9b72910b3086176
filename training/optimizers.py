"""Optimizers whose gradient clipping sees the whole global batch under any ``tf.distribute`` strategy."""

from __future__ import annotations

import keras
import tensorflow as tf

from keras_vit.checks import check_choice
from keras_vit.position import POSITION_VARIABLES
from keras_vit.training.config import OPTIMIZERS

__all__ = ["OPTIMIZERS", "SGD", "Adam", "AdamW", "ReplicaClipping", "build_optimizer", "no_decay_variables"]


class ReplicaClipping:
    """Mixin for a Keras optimizer: clip the cross-replica gradient, not each replica's share."""

    def _clip_gradients(self, grads):
        if keras.backend.backend() != "tensorflow":  # a keras.distribution computes the global gradient already
            return super()._clip_gradients(grads)
        context = tf.distribute.get_replica_context()
        replicas = context.num_replicas_in_sync if context is not None else 1
        clipping = self.clipnorm or self.global_clipnorm or self.clipvalue
        if replicas == 1 or not clipping:
            return super()._clip_gradients(grads)
        total = context.all_reduce(tf.distribute.ReduceOp.SUM, list(grads))
        return [g / replicas for g in super()._clip_gradients(total)]


@keras.saving.register_keras_serializable(package="keras_vit_training")
class SGD(ReplicaClipping, keras.optimizers.SGD):
    """``keras.optimizers.SGD`` with cross-replica clipping (see module docstring)."""


@keras.saving.register_keras_serializable(package="keras_vit_training")
class AdamW(ReplicaClipping, keras.optimizers.AdamW):
    """``keras.optimizers.AdamW`` with cross-replica clipping (see module docstring)."""


@keras.saving.register_keras_serializable(package="keras_vit_training")
class Adam(ReplicaClipping, keras.optimizers.Adam):
    """``keras.optimizers.Adam`` with cross-replica clipping (see module docstring)."""


def no_decay_variables(variables) -> list:
    """Variables conventionally spared weight decay: biases, norms (all 1-D), class token, and the position
    parameters of every kind of position embedding (:data:`keras_vit.position.POSITION_VARIABLES`)."""
    names = ("cls", *POSITION_VARIABLES)
    return [v for v in variables if len(v.shape) <= 1 or v.name in names]


def build_optimizer(
    name: str,
    learning_rate,
    *,
    momentum: float = 0.9,
    beta_1: float = 0.9,
    beta_2: float = 0.999,
    weight_decay: float = 0.0,
    clip_norm: float | None = 1.0,
    accumulation_steps: int = 1,
    variables=None,
) -> keras.optimizers.Optimizer:
    """One of :data:`OPTIMIZERS` with global-norm clipping at ``clip_norm`` (0: off); ``weight_decay`` (decoupled,
    ``adamw`` or ``sgd``) spares biases, norms and embeddings among ``variables``."""
    check_choice(name, OPTIMIZERS, "optimizer")
    if weight_decay and name == "adam":
        raise ValueError("optimizer='adam' has no decoupled weight decay; use 'adamw' (or weight_decay=0).")
    common = dict(
        learning_rate=learning_rate,
        global_clipnorm=clip_norm or None,
        gradient_accumulation_steps=accumulation_steps if accumulation_steps > 1 else None,
    )
    if name == "sgd":
        optimizer = SGD(momentum=momentum, weight_decay=weight_decay or None, **common)
    elif name == "adamw":
        optimizer = AdamW(beta_1=beta_1, beta_2=beta_2, weight_decay=weight_decay, **common)
    else:
        optimizer = Adam(beta_1=beta_1, beta_2=beta_2, **common)
    if weight_decay and variables is not None:
        optimizer.exclude_from_weight_decay(var_list=no_decay_variables(variables))
    return optimizer
