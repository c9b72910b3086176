"""LoRA fine-tuning (Hu et al., 2021) through Keras' ``Dense.enable_lora``: :func:`enable_lora`, :func:`merge_lora`.
Saving and reloading: docs/foreign-weights.md."""

from __future__ import annotations

from collections.abc import Sequence

import keras
import numpy as np

from keras_vit.cloning import clone_with_weights
from keras_vit.layers import TransformerBlock

__all__ = ["LORA_TARGETS", "enable_lora", "lora_layers", "lora_parameter_count", "merge_lora"]

LORA_TARGETS = ("qkv", "out", "fc1", "fc2")


def _targets(block: TransformerBlock) -> dict[str, keras.layers.Dense]:
    return {"qkv": block.attn.qkv, "out": block.attn.out, "fc1": block.mlp.fc1, "fc2": block.mlp.fc2}


def lora_layers(model: keras.Model, targets: Sequence[str] = LORA_TARGETS) -> list[keras.layers.Dense]:
    """The ``Dense`` layers of every encoder block that :func:`enable_lora` adapts, in depth order."""
    unknown = set(targets) - set(LORA_TARGETS)
    if unknown:
        raise ValueError(f"Unknown LoRA targets {sorted(unknown)}; expected a subset of {LORA_TARGETS}.")
    blocks = [layer for layer in model._flatten_layers(include_self=False) if isinstance(layer, TransformerBlock)]
    if not blocks:
        raise ValueError(f"Model {model.name!r} has no TransformerBlock layers to adapt.")
    return [_targets(block)[target] for block in blocks for target in targets]


def enable_lora(
    model: keras.Model,
    rank: int,
    *,
    alpha: float | None = None,
    targets: Sequence[str] = LORA_TARGETS,
    trainable_layers: Sequence[str] = ("head",),
) -> keras.Model:
    """Add rank-``rank`` LoRA adapters (scale ``alpha / rank``) to ``targets`` of every block, freeze all but
    ``trainable_layers``; returns ``model``, changed in place (compile it after). Calling it again only re-freezes.
    """
    if int(rank) < 1:
        raise ValueError(f"LoRA rank must be a positive int, got {rank!r}.")
    adapted = lora_layers(model, targets)
    missing = set(trainable_layers) - {layer.name for layer in model.layers}
    if missing:  # checked before any change: a refused call leaves the model as it was
        raise ValueError(f"Model {model.name!r} has no layers named {sorted(missing)} to keep trainable.")
    for dense in adapted:
        if not dense.lora_enabled:
            dense.enable_lora(int(rank), lora_alpha=alpha)
    # Functions traced before (predict_on_batch, evaluate, fit) would run the graph without the adapters.
    model.train_function = model.test_function = model.predict_function = None
    keep = {id(v) for dense in adapted for v in (dense.lora_kernel_a, dense.lora_kernel_b)}
    keep |= {id(v) for layer in model.layers if layer.name in trainable_layers for v in layer.weights}
    for variable in model.weights:
        variable.trainable = id(variable) in keep
    return model


def lora_parameter_count(model: keras.Model) -> int:
    """The number of LoRA adapter parameters in ``model`` (0 without adapters)."""
    return sum(
        int(np.prod(v.shape))
        for layer in model._flatten_layers(include_self=False)
        if getattr(layer, "lora_enabled", False)
        for v in (layer.lora_kernel_a, layer.lora_kernel_b)
    )


def merge_lora(model: keras.Model) -> keras.Model:
    """A copy of ``model`` without LoRA, every adapted kernel replaced by ``W + (alpha / rank) A B``: the adapted
    model's outputs (to float round-off), all weights trainable."""
    return clone_with_weights(model)  # blocks rebuild their Dense layers from config (no LoRA), merged kernels
