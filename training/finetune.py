"""Fine-tune a (pre-trained) ViT on a dataset, or train one from scratch: ``python -m keras_vit.training.finetune``.

The command and :func:`finetune` run the same code: load the data, build the strategy, the model,
the optimizer and the schedule, ``model.fit`` with checkpoints (resuming from ``output_dir`` when it
holds one), evaluate on held-out data, save ``model.keras`` and ``metrics.json``. With no arguments
it trains a small ViT on scikit-learn's digits offline and prints the held-out accuracy. See
``keras_vit.training.config`` for the presets and how the defaults are chosen.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import time
from collections.abc import Sequence

import keras
import tensorflow as tf

import keras_vit
from keras_vit.training import config as config_lib
from keras_vit.training.config import TrainConfig
from keras_vit.training.data import Source, load_source
from keras_vit.training.loop import fit, save_outputs
from keras_vit.training.optimizers import OPTIMIZERS, build_optimizer
from keras_vit.training.pipeline import Augment, eval_dataset, train_dataset
from keras_vit.training.schedules import DECAYS, WarmupDecay
from keras_vit.training.strategy import STRATEGIES, accelerator, get_strategy, is_chief, split_cpu


@dataclasses.dataclass
class FinetuneResult:
    """What a run produced: the trained model, the final held-out metrics, the history, the settings."""

    model: keras.Model
    metrics: dict[str, float]
    history: dict[str, list[float]]
    config: TrainConfig
    output_dir: str


def build_model(config: TrainConfig, num_classes: int) -> keras.Model:
    """The ViT of a resolved config; ``weights`` go straight to :func:`keras_vit.ViT`."""
    return keras_vit.ViT(config_lib.parse_model_name(config.model), image_size=config.image_size,
                         num_classes=num_classes, weights=config.weights, dropout=config.dropout,
                         drop_path=config.drop_path, **config.architecture())


def augment_of(config: TrainConfig) -> Augment:
    """The pipelines' settings of a resolved config."""
    crop = None if tuple(config.crop_area) == (1.0, 1.0) else tuple(config.crop_area)
    randaugment = tuple(config.randaugment) if config.randaugment[0] > 0 else None
    return Augment(config.image_size, crop, config.flip, randaugment, config.mixup, config.cutmix, config.eval_crop)


def compile_model(model: keras.Model, config: TrainConfig) -> None:
    """Compile with the schedule, optimizer, label-smoothed cross-entropy and accuracy of ``config``."""
    schedule = WarmupDecay(config.lr, config.steps, config.warmup, config.schedule, config.end_lr,
                           config.accumulation_steps)
    optimizer = build_optimizer(config.optimizer, schedule, momentum=config.momentum,
                                weight_decay=config.weight_decay, clip_norm=config.clip_norm,
                                accumulation_steps=config.accumulation_steps, variables=model.trainable_variables)
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=config.label_smoothing),
        metrics=[keras.metrics.CategoricalAccuracy(name="accuracy")],
        steps_per_execution=config.steps_per_execution,
    )


def _policy(mixed_precision: str, device: str) -> str:
    if mixed_precision == "auto":
        mixed_precision = {"tpu": "bfloat16", "gpu": "float16"}.get(device, "none")
    return "float32" if mixed_precision == "none" else f"mixed_{mixed_precision}"


def _prepare_output(config: TrainConfig, chief: bool) -> None:
    """Start afresh (``overwrite``) or check that a run already there is the same run."""
    path = os.path.join(config.output_dir, "run.json")
    if config.overwrite and chief and os.path.isdir(config.output_dir):
        shutil.rmtree(config.output_dir)
    if os.path.exists(path):
        with open(path) as file:
            differences = config_lib.run_differences(json.load(file), config)
        if differences:
            raise ValueError(
                f"{config.output_dir} holds a run with different settings ({', '.join(differences)}); "
                "use another output_dir, or overwrite=True (--overwrite) to start over.")
    elif chief:
        os.makedirs(config.output_dir, exist_ok=True)
        with open(path, "w") as file:
            json.dump(config_lib.json_ready(config), file, indent=2)


def _name(strategy: tf.distribute.Strategy) -> str:
    return type(strategy).__name__.lstrip("_")


def describe(config: TrainConfig, source: Source, strategy: tf.distribute.Strategy, device: str) -> str:
    """One paragraph saying what will run."""
    arch = ", ".join(f"{k} {v}" for k, v in config.architecture().items())
    return (
        f"preset {config.preset}: ViT {config.model}{f' ({arch})' if arch else ''} at {config.image_size}px, "
        f"weights {config.weights or 'random'}\n"
        f"data {source.name}: {source.train.num_examples or '?'} training / {source.eval.num_examples or '?'} "
        f"held-out ({source.eval_split}) images, {source.num_classes} classes\n"
        f"{_name(strategy)} x{strategy.num_replicas_in_sync} ({device}), batch {config.batch_size}"
        f"{f' in {config.accumulation_steps} accumulated micro-batches' if config.accumulation_steps > 1 else ''}, "
        f"{config.steps} steps, {config.optimizer} lr {config.lr:g} ({config.warmup} warmup, {config.schedule}), "
        f"output {config.output_dir}"
    )


def finetune(config: TrainConfig | None = None, *, callbacks: Sequence[keras.callbacks.Callback] = (),
             strategy: str | tf.distribute.Strategy | None = None, **fields) -> FinetuneResult:
    """Train as ``config`` (or the :class:`TrainConfig` fields given as keywords) says; see the module docstring.

    ``callbacks`` are added to ``model.fit``; ``strategy`` is a name (see ``keras_vit.training.strategy``) or a
    ready ``tf.distribute.Strategy``.
    """
    if isinstance(strategy, str):
        fields["strategy"], strategy = strategy, None
    config = dataclasses.replace(config or TrainConfig(), **fields)
    strategy = strategy or get_strategy(config.strategy, config.tpu)
    device = accelerator(strategy)
    source = load_source(config.dataset, data_dir=config.data_dir, manual_dir=config.manual_dir,
                         train_split=config.train_split, eval_split=config.eval_split,
                         eval_fraction=config.eval_fraction, seed=config.seed)
    config = config_lib.resolve(config, train_examples=source.train.num_examples, accelerator=device,
                                replicas=strategy.num_replicas_in_sync)
    chief = is_chief(strategy)
    _prepare_output(config, chief)
    if chief and config.verbose:
        print(describe(config, source, strategy, device), flush=True)

    keras.utils.set_random_seed(config.seed)
    previous_policy = keras.mixed_precision.dtype_policy()
    keras.mixed_precision.set_global_policy(_policy(config.mixed_precision, device))
    try:
        with strategy.scope():
            model = build_model(config, source.num_classes)
            compile_model(model, config)
    finally:
        keras.mixed_precision.set_global_policy(previous_policy)

    augment = augment_of(config)
    micro_batch = config.batch_size // config.accumulation_steps
    eval_data = eval_dataset(source.eval, source.num_classes, micro_batch, augment, drop_remainder=device == "tpu")
    accumulate = config.accumulation_steps

    def data_fn(step: int) -> tf.data.Dataset:
        return train_dataset(source.train, source.num_classes, micro_batch, augment, start_step=step,
                             seed=config.seed, shuffle_buffer=config.shuffle_buffer)

    started = time.time()
    result = fit(model, data_fn, total_steps=config.steps * accumulate, steps_per_epoch=config.eval_every * accumulate,
                 output_dir=config.output_dir, strategy=strategy, eval_data=eval_data,
                 checkpoint_every=config.checkpoint_every * accumulate, keep_checkpoints=config.keep_checkpoints,
                 log_every=config.log_every * accumulate, accumulation_steps=accumulate, callbacks=callbacks,
                 verbose=config.verbose)
    train_seconds = time.time() - started
    scores = model.evaluate(eval_data, return_dict=True, verbose=0)
    metrics = {
        "eval": {k: float(v) for k, v in scores.items()},
        "eval_examples": source.eval.num_examples,
        "eval_split": source.eval_split,
        "dataset": source.name,
        "steps": config.steps,
        "resumed_from_step": result.start_step // accumulate,
        "train_seconds_this_run": round(train_seconds, 1),
        "strategy": _name(strategy),
        "replicas": strategy.num_replicas_in_sync,
        "history": result.history,
        "config": config_lib.json_ready(config),
    }
    save_outputs(model, metrics, config.output_dir, strategy)
    if chief and config.verbose:
        print(f"held-out accuracy: {scores['accuracy']:.4f} on {source.eval.num_examples or '?'} images "
              f"({source.name}, {source.eval_split}); model and metrics in {config.output_dir}", flush=True)
    return FinetuneResult(model, metrics["eval"], result.history, config, config.output_dir)


def _pair(cast):
    def parse(text: str):
        parts = text.split(",")
        if len(parts) != 2:
            raise argparse.ArgumentTypeError(f"expected two comma-separated values, got {text!r}")
        return cast[0](parts[0]), cast[1](parts[1])

    return parse


def parser() -> argparse.ArgumentParser:
    """The command line; every option maps to a :class:`TrainConfig` field."""
    p = argparse.ArgumentParser(
        prog="python -m keras_vit.training.finetune",
        description="Fine-tune a (pre-trained) ViT, or train one from scratch, with model.fit. Without a "
                    "dataset: a small ViT on scikit-learn's digits, offline. Unset options come from the preset.")
    a = p.add_argument
    a("--preset", default="auto", choices=["auto", *config_lib.PRESETS])
    a("--model", help="variant: B/16, ViT_B16, Ti/16, ... (default: the preset's)")
    for name in config_lib.ARCHITECTURE_FIELDS:
        a(f"--{name.replace('_', '-')}", type=int, help=f"override the variant's {name}")
    a("--weights", help="a zoo catalogue name or a checkpoint path (default: random init)")
    a("--dataset", help="a TFDS name (cifar10, oxford_iiit_pet, imagenet2012, ...) or an image folder "
                        "(one sub-folder per class); default: scikit-learn's digits")
    a("--data-dir", help="TFDS data directory")
    a("--manual-dir", help="TFDS manual download directory (imagenet2012)")
    a("--train-split", default="train")
    a("--eval-split", help="held-out split (default: validation for ImageNet, else test)")
    a("--eval-fraction", type=float, help="fraction held out when the data has no held-out split")
    a("--image-size", type=int)
    a("--crop-area", type=_pair((float, float)), help="inception crop area range, e.g. 0.05,1 (1,1: no crop)")
    a("--flip", action=argparse.BooleanOptionalAction, default=None)
    a("--randaugment", type=_pair((int, float)), help="RandAugment num_ops,factor (0,0: off)")
    a("--mixup", type=float, help="MixUp alpha (0: off)")
    a("--cutmix", type=float, help="CutMix factor (0: off)")
    a("--eval-crop", type=float, help="central crop fraction for evaluation (1: plain resize)")
    a("--batch-size", type=int, help="global batch (per optimizer update)")
    a("--accumulation-steps", type=int, default=1, help="micro-batches accumulated per update")
    a("--steps", type=int, help="optimizer updates")
    a("--epochs", type=int, help="passes over the training data (instead of --steps)")
    a("--eval-every", type=int, help="steps between evaluations (an 'epoch' in the logs)")
    a("--lr", type=float, help="base learning rate")
    a("--warmup", type=float, help="warmup steps (or a fraction of the steps when < 1)")
    a("--schedule", choices=DECAYS)
    a("--end-lr", type=float)
    a("--optimizer", choices=OPTIMIZERS)
    a("--momentum", type=float, default=0.9)
    a("--weight-decay", type=float)
    a("--clip-norm", type=float, help="global gradient-norm clip (0: off)")
    a("--label-smoothing", type=float)
    a("--dropout", type=float)
    a("--drop-path", type=float)
    a("--mixed-precision", default="auto", choices=["auto", "none", "float16", "bfloat16"])
    a("--seed", type=int, default=0)
    a("--strategy", default="auto", choices=STRATEGIES)
    a("--tpu", help="TPU name or address (default: TPU_NAME or the local TPU VM)")
    a("--cpu-devices", type=int, help="split the CPU into N logical devices (to try --strategy mirrored without GPUs)")
    a("--output-dir", default="runs/finetune")
    a("--checkpoint-every", type=int, default=500, help="steps between checkpoints")
    a("--keep-checkpoints", type=int, default=3)
    a("--log-every", type=int, default=10, help="steps between train_log.jsonl / TensorBoard entries")
    a("--steps-per-execution", type=int, default=1)
    a("--overwrite", action="store_true", help="delete output-dir first instead of resuming from it")
    a("--verbose", type=int, choices=[0, 1, 2], default=None, help="0 silent, 1 progress bars, 2 one line per epoch")
    return p


def main(argv: Sequence[str] | None = None) -> FinetuneResult:
    """Parse the command line and run :func:`finetune`."""
    args = vars(parser().parse_args(argv))
    cpu_devices = args.pop("cpu_devices")
    if cpu_devices:
        split_cpu(cpu_devices)
    args["verbose"] = "auto" if args["verbose"] is None else args["verbose"]
    return finetune(TrainConfig(**args))


if __name__ == "__main__":
    main()
