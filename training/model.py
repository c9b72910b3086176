"""The model of a resolved config: built (LoRA adapters included), compiled, under its precision policy."""

from __future__ import annotations

import contextlib

import keras

import keras_vit
from keras_vit.precision import global_policy, policy_of_choice
from keras_vit.training.config import TrainConfig
from keras_vit.training.errors import warn
from keras_vit.training.optimizers import build_optimizer
from keras_vit.training.schedules import WarmupDecay
from keras_vit.variants import canonical_variant

__all__ = ["build_model", "compile_model", "policy_name", "precision"]


def build_model(config: TrainConfig, num_classes: int, **options) -> keras.Model:
    """The ViT of a resolved config: its variant with the model options that are set, then ``options``
    (``classifier``, ...), with LoRA adapters when ``lora_rank`` is set (:func:`keras_vit.enable_lora`). Build it in
    the strategy's scope."""
    model = config.model
    variant = canonical_variant(model.name)  # "ViT_R50_B16" -> "R50+B/16"; a family's name keeps its fields
    vit = keras_vit.ViT(
        variant,
        image_size=model.image_size,
        num_classes=num_classes,
        weights=model.weights,
        data_format="channels_last",  # the input pipeline's layout, whatever keras.config.image_data_format() says
        **{**config.model_options(), **options},
    )
    rows, columns = vit.config.grid_size
    if rows < 2 or columns < 2:  # e.g. B/16 on the 16-pixel default digits: one patch per image
        height, width = vit.config.image_size
        warn(
            f"{height}x{width} images give {variant} a {rows}x{columns} patch grid (fewer than 2x2 patches): "
            "choose a smaller patch (--model Ti/4) or a larger --image-size."
        )
    if model.lora_rank:
        keras_vit.enable_lora(vit, model.lora_rank)
    return vit


def compile_model(
    model: keras.Model,
    config: TrainConfig,
    *,
    loss: keras.losses.Loss | None = None,
    metric: keras.metrics.Metric | None = None,
) -> None:
    """Compile with the schedule and optimizer of ``config`` (gradient accumulation included), its label-smoothed
    cross-entropy and accuracy, or ``loss`` and ``metric`` (weighted: examples of weight 0 do not count)."""
    optim = config.optim
    schedule = WarmupDecay(optim.lr, optim.steps, optim.warmup, optim.schedule, optim.end_lr, optim.accumulation_steps)
    optimizer = build_optimizer(
        optim.optimizer,
        schedule,
        momentum=optim.momentum,
        weight_decay=optim.weight_decay,
        clip_norm=optim.clip_norm,
        accumulation_steps=optim.accumulation_steps,
        variables=model.trainable_variables,
    )
    model.compile(
        optimizer=optimizer,
        loss=loss or keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=optim.label_smoothing),
        weighted_metrics=[metric or keras.metrics.CategoricalAccuracy(name="accuracy")],
        steps_per_execution=config.run.steps_per_execution,
    )


def policy_name(config: TrainConfig, device: str) -> str:
    """The Keras dtype policy of the config's ``mixed_precision`` on ``device``
    (:func:`keras_vit.precision.policy_of_choice`: ``auto`` is what the hardware runs fastest)."""
    return policy_of_choice(config.optim.mixed_precision, device)


def precision(config: TrainConfig, device: str) -> contextlib.AbstractContextManager:
    """Build models under the config's mixed-precision policy (:func:`policy_name`)."""
    return global_policy(policy_name(config, device))
