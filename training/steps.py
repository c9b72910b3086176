"""The steps every training run shares: from a :class:`TrainConfig` to a strategy, data, a model, compiled.

:func:`prepare` loads the source and the strategy and resolves the config (:class:`Setup`);
:func:`build_model`, :func:`compile_model`, :func:`augment_of` and :func:`precision` turn a resolved
config into a compiled model (LoRA adapters when the config asks) and the pipelines' settings;
:func:`prepare_output`, :func:`start_output` and :func:`describe` check and start a run's output directory and
say what will run; :func:`start_parent` clears and marks the folder of a command whose runs go to its
sub-folders. :func:`keras_vit.training.runner.train` puts them together.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from collections.abc import Sequence

import keras

import keras_vit
from keras_vit.applications import DEFAULT_VARIANT
from keras_vit.checkpoints import checkpoint_config, detect_format, read_checkpoint
from keras_vit.config import ViTConfig, field_names
from keras_vit.files import atomic_open
from keras_vit.precision import global_policy, policy_of_choice
from keras_vit.training import config as config_lib
from keras_vit.training import outputs
from keras_vit.training.config import TrainConfig
from keras_vit.training.data import Source, load_source
from keras_vit.training.errors import OutputDirError
from keras_vit.training.optimizers import build_optimizer
from keras_vit.training.pipeline import Augment, check_input_shards, eval_part_length
from keras_vit.training.schedules import WarmupDecay
from keras_vit.training.sharding import Shard, gather_over_workers, input_shard
from keras_vit.training.strategy import (
    KerasDistribution,
    Strategy,
    accelerator,
    get_strategy,
    is_chief,
    split_cpu,
    strategy_name,
)
from keras_vit.variants import canonical_variant

CLASSES = "classes.txt"  # a run's class names, one a line, in label order

__all__ = [
    "CLASSES",
    "Previous",
    "Setup",
    "augment_of",
    "build_model",
    "check_classes",
    "compile_model",
    "describe",
    "load_data",
    "make_strategy",
    "policy_name",
    "precision",
    "prepare",
    "prepare_output",
    "record_classes",
    "start_output",
    "start_parent",
    "strategy_name",
]


@dataclasses.dataclass(frozen=True)
class Setup:
    """A resolved config with its data and strategy."""

    config: TrainConfig
    source: Source
    strategy: Strategy  # a tf.distribute strategy, or a KerasDistribution on JAX / torch
    device: str  # "tpu", "gpu" or "cpu"

    @property
    def chief(self) -> bool:
        return is_chief(self.strategy)

    @property
    def shard(self) -> Shard:
        """This worker's part of the input (:mod:`keras_vit.training.sharding`)."""
        return input_shard(self.strategy)

    @property
    def whole_batches(self) -> bool:
        """Whether every batch, held-out ones too, must be whole: on a TPU (static shapes), under a
        keras.distribution that splits the batch (JAX shards a batch only into equal parts), and on several workers
        (each evaluates its part). The held-out set is then filled up with blank examples of weight 0
        (pipeline.eval_dataset)."""
        split = isinstance(self.strategy, KerasDistribution) and self.strategy.num_replicas_in_sync > 1
        return self.device == "tpu" or split or self.shard.count > 1

    def replace(self, **fields) -> Setup:
        """This setup with fields of its config changed by flat name (:meth:`TrainConfig.replace`). The config
        stays as resolved: change only what resolving does not derive from (run settings, the seed), or give
        every field that it does."""
        return dataclasses.replace(self, config=self.config.replace(**fields))

    def blanks(self, batch_size: int) -> int:
        """How many blank examples fill the held-out set up to whole batches of ``batch_size``, over all workers
        (0 unless whole batches)."""
        count, workers = self.source.eval.num_examples, self.shard.count
        return workers * eval_part_length(count, batch_size, workers) - count if count and self.whole_batches else 0


def make_strategy(config: TrainConfig) -> Strategy:
    """The config's strategy for the Keras backend (splitting the CPU first when ``cpu_devices`` asks)."""
    if config.run.cpu_devices:
        split_cpu(config.run.cpu_devices)
    return get_strategy(config.run.strategy, config.run.tpu, config.run.model_devices)


def load_data(config: TrainConfig, strategy: Strategy | None = None) -> Source:
    """The config's dataset (an image folder's files checked by each worker of ``strategy`` in part)."""
    data = config.data
    sharded = {}
    if strategy is not None:
        shard = input_shard(strategy)
        sharded = dict(
            shard=shard,
            input_shards=data.input_shards or shard.count,
            gather=functools.partial(gather_over_workers, strategy),
        )
    return load_source(
        data.dataset,
        data_dir=data.data_dir,
        manual_dir=data.manual_dir,
        train_split=data.train_split,
        eval_split=data.eval_split,
        eval_fraction=data.eval_fraction,
        seed=config.optim.seed,
        skip_corrupt=bool(data.skip_corrupt),
        **sharded,
    )


def with_saved_model(config: TrainConfig) -> TrainConfig:
    """``config`` with the variant, architecture, image size, structure and numerics of the saved keras-vit model
    that ``weights`` names (a run's ``model.keras``, pretrain's ``encoder.keras``) where unset: the run goes on from
    that model as it is. An architecture asked for (``--model``, ``--depth``) that differs from the file's is
    refused when the model is built (:func:`keras_vit.ViT`), naming what differs."""
    weights = config.model.weights
    if weights is None or not os.path.isfile(weights) or detect_format(weights) != "keras":
        return config
    saved = checkpoint_config(read_checkpoint(weights))
    groups = ("structure", "numerics") if config.model.name else ("architecture", "structure", "numerics")
    fields = field_names(*groups)
    defaults = {field.name: field.default for field in dataclasses.fields(ViTConfig)}
    values = {k: v for k, v in saved.to_dict().items() if k in fields and v != defaults.get(k)}
    height, width = saved.image_size
    if height == width:
        values["image_size"] = height
    if config.model.name is None:
        values["model"] = saved.architecture.variant or DEFAULT_VARIANT  # the architecture's fields make it the file's
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    return config.replace(**{k: v for k, v in values.items() if config.flat().get(k) is None})


def prepare(config: TrainConfig, strategy: Strategy | None = None) -> Setup:
    """Load the data and the strategy (unless given), and resolve ``config`` for them (a saved model's architecture
    where ``weights`` is one: :func:`with_saved_model`)."""
    config = with_saved_model(config)
    strategy = strategy or make_strategy(config)
    device = accelerator(strategy)
    source = load_data(config, strategy)
    resolved = config_lib.resolve(
        config, train_examples=source.train.num_examples, accelerator=device, replicas=strategy.num_replicas_in_sync
    )
    shard = input_shard(strategy)
    resolved = resolved.replace(input_shards=resolved.data.input_shards or shard.count)
    optim = resolved.optim
    micro_batch = optim.batch_size // optim.accumulation_steps
    check_input_shards(micro_batch, resolved.data.input_shards, shard, source.train.num_examples)
    return Setup(resolved, source, strategy, device)


def build_model(config: TrainConfig, num_classes: int, **options) -> keras.Model:
    """The ViT of a resolved config (any variant of the table, hybrids included): its variant with the model
    options that are set (:meth:`TrainConfig.model_options`, then ``options``: ``classifier``,
    ``position_embedding``, ...), with LoRA adapters when ``lora_rank`` is set (:func:`keras_vit.enable_lora`: only
    the adapters and the head train). Build it in the strategy's scope: a resumed run builds the same model,
    adapters included, so that its checkpoint fits."""
    model = config.model
    variant = canonical_variant(model.name)  # "ViT_R50_B16" -> "R50+B/16"; a family's name keeps its fields
    vit = keras_vit.ViT(
        variant,
        image_size=model.image_size,
        num_classes=num_classes,
        weights=model.weights,
        **{**config.model_options(), **options},
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


def augment_of(config: TrainConfig) -> Augment:
    """The pipelines' settings of a resolved config."""
    data = config.data
    crop = None if tuple(data.crop_area) == (1.0, 1.0) else tuple(data.crop_area)
    randaugment = tuple(data.randaugment) if data.randaugment[0] > 0 else None
    return Augment(config.model.image_size, crop, data.flip, randaugment, data.mixup, data.cutmix, data.eval_crop)


def policy_name(config: TrainConfig, device: str) -> str:
    """The Keras dtype policy of the config's ``mixed_precision`` on ``device``
    (:func:`keras_vit.precision.policy_of_choice`: ``auto`` is what the hardware runs fastest)."""
    return policy_of_choice(config.optim.mixed_precision, device)


def precision(config: TrainConfig, device: str) -> contextlib.AbstractContextManager:
    """Build models under the config's mixed-precision policy (:func:`policy_name`)."""
    return global_policy(policy_name(config, device))


@dataclasses.dataclass(frozen=True)
class Previous:
    """What a run's output folder holds of it: ``finished``, the ``metrics.json`` of the run done to these steps
    (nothing left to do); ``extends``, the steps of the finished run that more ``steps`` extend; ``history``, the
    history of a shorter run done before (which the extension's follows in ``metrics.json``)."""

    finished: dict | None = None
    extends: int | None = None
    history: dict | None = None


# The fields that differ when a finished run is extended: its length and what follows from it when not given.
LENGTH_FIELDS = frozenset({"steps", "epochs", "eval_every", "warmup"})


def prepare_output(config: TrainConfig, chief: bool, model_path: str | None = None) -> Previous:
    """Clear ``output_dir`` of a previous run's files (``overwrite``; see :mod:`keras_vit.training.outputs`), or
    check that the run it holds is this run, finished, or this run to be extended (more ``steps``), and that the
    run can write every path it will (:func:`~keras_vit.training.outputs.check_paths`). A folder without a
    checkpoint or a finished run's metrics holds no run to compare with: a run that failed before its first
    checkpoint does not bind the next one. Writes nothing (see :func:`start_output`). The run's lock
    (:func:`~keras_vit.training.outputs.run_lock`) has checked the folder is missing, empty or a run's.
    """
    out = config.run.output_dir
    if chief and config.run.overwrite:
        outputs.clear_output(out)  # refuses a folder that is not a run's
    outputs.check_paths(out, [*outputs.RUN_WRITES, model_path or "model.keras"])
    run_file, metrics_file = os.path.join(out, "run.json"), os.path.join(out, "metrics.json")
    model_file = model_path or os.path.join(out, "model.keras")
    done = None
    if os.path.isfile(metrics_file) and os.path.isfile(model_file):
        done = outputs.read_json(metrics_file, {"steps": int, "history": dict, "eval": dict})
    if not os.path.isfile(run_file) or not (done or outputs.has_checkpoint(out)):
        return Previous()
    saved = outputs.read_json(run_file, {"steps": int})
    differences = config_lib.run_differences(saved, config)
    steps, before = config.optim.steps, saved["steps"]
    if differences and (steps == before or not set(differences) <= LENGTH_FIELDS):
        raise OutputDirError(
            f"{out} holds a run with different settings ({', '.join(differences)}); "
            "use another output_dir, or overwrite=True (--overwrite) to start over."
        )
    if steps < before:
        raise OutputDirError(
            f"{out} holds a run of {before} steps; --steps {steps} cannot shorten it. Give --steps {before} or more "
            "(more extends it), use another --output-dir, or --overwrite to start over."
        )
    if steps > before and not outputs.has_checkpoint(out):
        raise OutputDirError(
            f"{out} holds a run of {before} steps but no checkpoint in {os.path.join(out, 'checkpoints')} to extend "
            "it from. Use another --output-dir, or --overwrite to start over."
        )
    finished = done if done and done["steps"] == steps else None
    history = done["history"] if done and done["steps"] < steps else None
    return Previous(finished, before if steps > before else None, history)


def start_output(config: TrainConfig, chief: bool, command: str = "finetune", previous: Previous | None = None) -> None:
    """Mark ``output_dir`` as a run's and write its settings (``run.json``): once the run really starts (the
    model is built), unless a run with a checkpoint is resumed (an extended run writes its new length)."""
    if not chief:
        return
    out = config.run.output_dir
    outputs.mark_output(out, command)
    run_file = os.path.join(out, "run.json")
    extends = previous is not None and previous.extends
    if extends or not outputs.has_checkpoint(out) or not os.path.isfile(run_file):
        outputs.write_json(run_file, config_lib.json_ready(config))


def _read_classes(path: str) -> list[str]:
    with open(path, encoding="utf-8") as file:
        return [line.rstrip("\n") for line in file if line.strip()]


def check_classes(out: str, source: Source) -> None:
    """An ``OutputDirError`` when the run in ``out`` (one with a checkpoint, or finished) was trained on other classes
    than ``source``'s (its ``classes.txt``): a renamed, reordered, added or removed class would remap the labels under
    the resumed head. A run that failed before its first checkpoint does not bind the next one."""
    path = os.path.join(out, CLASSES)
    started = outputs.has_checkpoint(out) or os.path.isfile(os.path.join(out, "metrics.json"))
    if not started or not os.path.isfile(path) or source.class_names is None:
        return  # no run to resume, or one older than classes.txt
    before, now = _read_classes(path), list(source.class_names)
    if before == now:
        return
    added, gone = [c for c in now if c not in before], [c for c in before if c not in now]
    if not added and not gone:
        change = (
            f"the same classes in another order (was {', '.join(before)}; now {', '.join(now)}): labels would remap"
        )
    else:
        changes = [f"{what} {', '.join(names)}" for what, names in (("added", added), ("gone", gone)) if names]
        change = f"the dataset changed, classes {'; '.join(changes)}"
    raise OutputDirError(
        f"{out} holds a run trained on other classes than {source.name}'s ({path}): {change}. Restore the class "
        f"folders as they were to resume, or start a new run (another --output-dir, or --overwrite); to go on from "
        f"the trained model with the new classes, fine-tune it: --weights {os.path.join(out, 'model.keras')}."
    )


def record_classes(setup: Setup) -> None:
    """Write the run's classes to ``classes.txt`` (one name a line, in label order: the file ``predict --labels``
    takes) once it has started; :func:`check_classes` compares a resume's with them."""
    names = setup.source.class_names
    if setup.chief and names is not None:
        with atomic_open(os.path.join(setup.config.run.output_dir, CLASSES), "w") as file:
            file.write("".join(f"{name}\n" for name in names))


def start_parent(setup: Setup, command: str, files: Sequence[str] = ()) -> None:
    """Clear (``overwrite``) and mark the output folder of a command whose runs go to its sub-folders (``pretrain``,
    ``ablation``), checking that it can write its own ``files`` there; each run there checks and starts its own
    folder."""
    if setup.chief:
        out = setup.config.run.output_dir
        if setup.config.run.overwrite:
            outputs.clear_output(out)
        else:
            outputs.check_usable(out)
        outputs.check_paths(out, [outputs.MARKER, *files], folders=())
        outputs.mark_output(out, command)


def describe(setup: Setup) -> str:
    """One paragraph saying what will run."""
    config, source, strategy = setup.config, setup.source, setup.strategy
    model, optim = config.model, config.optim
    arch = ", ".join(f"{k} {v}" for k, v in config.architecture().items())
    accumulated = f" in {optim.accumulation_steps} accumulated micro-batches" if optim.accumulation_steps > 1 else ""
    return (
        f"preset {config.preset}: ViT {model.name}{f' ({arch})' if arch else ''} at {model.image_size}px, "
        f"weights {model.weights or 'random'}\n"
        f"data {source.name}: {source.train.num_examples or '?'} training / {source.eval.num_examples or '?'} "
        f"held-out ({source.eval_split}) images, {source.num_classes} classes\n"
        f"{strategy_name(strategy)} x{strategy.num_replicas_in_sync} ({keras.backend.backend()}, {setup.device}, "
        f"{policy_name(config, setup.device)}), batch {optim.batch_size}"
        f"{accumulated}, {optim.steps} steps, {optim.optimizer} lr {optim.lr:g} ({optim.warmup} warmup, "
        f"{optim.schedule}), output {config.run.output_dir}"
    )
