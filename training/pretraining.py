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
from keras_vit.training.pretrain_options import PretrainConfig, summary_table
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
    """Copy every weighted layer of ``source`` but the classifier into the layer of the same name of ``target``.

    Returns the copied layer names; a ``ValueError`` lists layers ``target`` lacks or whose shapes differ.
    """
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
    the pre-training's optimisation (Adam, warmup then cosine decay to 0, no weight decay or accumulation) and no
    RandAugment, MixUp or CutMix, into ``OUT/pretrain``."""
    return setup.replace(
        steps=config.steps,
        epochs=None,
        eval_every=config.eval_every or max(1, config.steps // 5),
        batch_size=config.batch_size or setup.config.optim.batch_size,
        accumulation_steps=1,
        lr=config.lr,
        warmup=min(config.warmup, config.steps),
        schedule="cosine",
        end_lr=0.0,
        optimizer="adam",
        weight_decay=0.0,
        clip_norm=config.clip_norm,
        randaugment=(0, 0.0),
        mixup=0.0,
        cutmix=0.0,
        output_dir=os.path.join(setup.config.run.output_dir, "pretrain"),
        overwrite=False,
    )


def pretrain(finetune_config: TrainConfig, config: PretrainConfig | None = None) -> PretrainResult:
    """Pre-train the model ``finetune_config`` describes by masked patch prediction, then fine-tune it."""
    config = config or PretrainConfig()
    if finetune_config.model.lora_rank:
        raise ValueError(
            "--lora-rank does not apply to pretrain, which fine-tunes the whole encoder it pre-trained; fine-tune "
            "its encoder.keras with LoRA through keras_vit.training.finetune --weights OUT/encoder.keras --lora-rank N."
        )
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
