"""Masked patch pre-training, then fine-tuning: ``python -m keras_vit.training.pretrain`` (docs/training.md).

Pre-trains into ``OUT/pretrain`` and saves ``OUT/encoder.keras``, then fine-tunes it into ``OUT/finetune`` (and
from scratch into ``OUT/scratch`` with ``--compare-scratch``). ``--lora-rank`` is refused.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Sequence

import keras

from keras_vit import fields
from keras_vit.cli import add_debug_flag, command_errors
from keras_vit.fields import option
from keras_vit.training import config as config_lib
from keras_vit.training import outputs
from keras_vit.training.config import TrainConfig
from keras_vit.training.masked_patch import MaskedPatches
from keras_vit.training.runner import train
from keras_vit.training.setup import Setup, prepare
from keras_vit.training.supervised import Classification, FinetuneResult

__all__ = [
    "LoadEncoder",
    "PretrainConfig",
    "PretrainResult",
    "copy_encoder_weights",
    "main",
    "masked_setup",
    "parser",
    "pretrain",
    "summary_table",
]

HEAD_LAYERS = ("head", "pre_logits")
BASE = TrainConfig().replace(output_dir="runs/pretrain")  # the command's defaults


@dataclasses.dataclass(frozen=True)
class PretrainConfig:
    """The masked-patch pre-training (Adam, warmup then cosine decay); ``None`` fields follow the fine-tuning."""

    steps: int = option("pre-training steps", 1000, flag="pretrain_steps")
    lr: float = option("Adam base learning rate (paper: 2e-4)", 1e-3, flag="pretrain_lr")
    warmup: int = option("warmup steps, then cosine decay", 100, flag="pretrain_warmup")
    batch_size: int | None = option("pre-training batch", unset="the fine-tuning batch", flag="pretrain_batch_size")
    clip_norm: float = option("global gradient-norm clip (0: off)", 1.0, flag="pretrain_clip_norm")
    rate: float = option("fraction of patches corrupted", 0.5, flag="corruption_rate")
    mask_fraction: float = option("fraction of corrupted patches replaced by [mask]", 0.8)
    random_fraction: float = option("fraction of corrupted patches replaced by another patch", 0.1)
    bits: int = option("bits per channel of the colour target", 3, flag="colour_bits")
    eval_every: int | None = option(
        "steps between masked-patch evaluations", unset="a fifth of the steps", flag="pretrain_eval_every"
    )
    compare_scratch: bool = option("also fine-tune from random initialisation", False)


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


def summary_table(summary: dict) -> str:
    """Held-out accuracy after masked-patch pre-training (and from scratch, when run) as a Markdown table."""
    rows = ["| initialisation | held-out accuracy |", "|---|---:|"]
    names = {"finetune": "masked patch prediction", "scratch": "random (from scratch)"}
    rows += [f"| {label} | {summary[key]['accuracy']:.4f} |" for key, label in names.items() if key in summary]
    return "\n".join(rows)


def parser() -> argparse.ArgumentParser:
    """``python -m keras_vit.training.finetune``'s options plus the masked-patch ones (:class:`PretrainConfig`)."""
    p = argparse.ArgumentParser(
        prog="python -m keras_vit.training.pretrain",
        description="Pre-train a ViT by masked patch prediction (the paper's Section 4.6), then fine-tune it "
        "as keras_vit.training.finetune does. Without a dataset: a small ViT on scikit-learn's digits, "
        "offline.",
    )
    config_lib.add_arguments(p, BASE)
    fields.add_arguments(p.add_argument_group("masked patch prediction"), PretrainConfig())
    add_debug_flag(p)
    return p


def main(argv: Sequence[str] | None = None) -> PretrainResult:
    """Parse the command line and run :func:`pretrain`; an error is one line on stderr and exit status 1."""
    args = parser().parse_args(argv)
    with command_errors(args):
        return pretrain(config_lib.from_args(args, BASE), PretrainConfig(**fields.given(args, PretrainConfig)))


if __name__ == "__main__":
    main()
