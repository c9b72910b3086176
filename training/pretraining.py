"""Masked patch pre-training, then fine-tuning (:func:`pretrain`): what ``python -m keras_vit.training.pretrain``
runs (docs/training.md)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import keras

from keras_vit.training import outputs
from keras_vit.training.config import TrainConfig
from keras_vit.training.masked_patch import MaskedPatches
from keras_vit.training.pretrain_options import PretrainConfig, check_pretrain, masked_fields, summary_table
from keras_vit.training.runner import train
from keras_vit.training.setup import Setup, prepare
from keras_vit.training.supervised import Classification, FinetuneResult

__all__ = ["HEAD_LAYERS", "LoadEncoder", "PretrainResult", "copy_encoder_weights", "masked_setup", "pretrain"]

HEAD_LAYERS = ("head", "pre_logits")


@dataclasses.dataclass
class PretrainResult:
    """The pre-trained encoder's path, the pre-training history and the fine-tuning run(s)."""

    encoder_path: str
    history: dict[str, list[float]]
    finetuned: FinetuneResult
    scratch: FinetuneResult | None


def copy_encoder_weights(source: keras.Model, target: keras.Model, skip: Sequence[str] = HEAD_LAYERS) -> list[str]:
    """Copy every weighted layer of ``source`` but the classifier into the layer of the same name of ``target``; the
    copied names. A ``ValueError`` lists layers ``target`` lacks or whose shapes differ."""
    copied, problems = [], []
    for layer in source.layers:
        if not layer.weights or layer.name in skip:
            continue
        try:
            other = target.get_layer(layer.name)
        except ValueError:
            problems.append(f"{layer.name}: not in {target.name!r}")
            continue
        ours, theirs = [tuple(w.shape) for w in layer.weights], [tuple(w.shape) for w in other.weights]
        if ours != theirs:
            problems.append(f"{layer.name}: shapes {ours} vs {theirs}")
            continue
        copied.append(layer.name)
    if problems:
        raise ValueError(f"Cannot load encoder {source.name!r} into {target.name!r}: " + "; ".join(problems))
    for name in copied:
        target.get_layer(name).set_weights(source.get_layer(name).get_weights())
    return copied


class LoadEncoder(keras.callbacks.Callback):
    """Loads a saved encoder into the model at the start of a fresh run (optimizer still at step 0),
    so a fine-tuning run resumed from its own checkpoint keeps its weights."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path
        self.loaded = False

    def on_train_begin(self, logs=None):
        if self.loaded or int(keras.ops.convert_to_numpy(self.model.optimizer.iterations)) > 0:
            return
        copy_encoder_weights(keras.saving.load_model(self.path, compile=False), self.model)
        self.loaded = True


def masked_setup(setup: Setup, config: PretrainConfig) -> Setup:
    """The masked-patch phase of the fine-tuning ``setup``: its model, data, precision, seed and run settings with
    the pre-training's (:func:`~keras_vit.training.pretrain_options.masked_fields`)."""
    return setup.replace(**masked_fields(setup.config, config))


def pretrain(finetune_config: TrainConfig, config: PretrainConfig | None = None) -> PretrainResult:
    """Pre-train the model ``finetune_config`` describes by masked patch prediction, then fine-tune it."""
    config = config or PretrainConfig()
    check_pretrain(finetune_config, config)
    setup = prepare(finetune_config)
    outputs.start_parent(setup, "pretrain", ["encoder.keras", "summary.json"])
    out, verbose = setup.config.run.output_dir, setup.config.run.verbose
    encoder_path = os.path.join(out, "encoder.keras")
    task = MaskedPatches(config.rate, config.mask_fraction, config.random_fraction, config.bits)
    masked = train(masked_setup(setup, config), task, command="pretrain", model_path=encoder_path)
    runs = {"finetune": [LoadEncoder(encoder_path)], **({"scratch": []} if config.compare_scratch else {})}
    results = {
        name: train(
            setup.replace(overwrite=False, output_dir=os.path.join(out, name)), Classification(), callbacks=callbacks
        )
        for name, callbacks in runs.items()
    }
    summary = {name: r.metrics for name, r in results.items()}
    summary["pretrain_history"] = masked.history
    if setup.chief:
        outputs.write_json(os.path.join(out, "summary.json"), summary)
        if verbose:
            print(summary_table(summary), flush=True)
    return PretrainResult(encoder_path, masked.history, results["finetune"], results.get("scratch"))
