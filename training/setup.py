"""A run prepared: its strategy, its data and its config resolved for them (:class:`Setup`)."""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable

import keras
import tensorflow as tf

from keras_vit.applications import DEFAULT_VARIANT
from keras_vit.checkpoints import checkpoint_config, detect_format, read_checkpoint
from keras_vit.config import ViTConfig, field_names
from keras_vit.training import config as config_lib
from keras_vit.training.config import TrainConfig
from keras_vit.training.data import Source, load_source
from keras_vit.training.distributed.sharding import Shard, distribute_input, gather_over_workers, input_shard
from keras_vit.training.distributed.strategy import (
    KerasDistribution,
    Strategy,
    accelerator,
    get_strategy,
    is_chief,
    split_cpu,
    strategy_name,
)
from keras_vit.training.markers import check_outside_dataset
from keras_vit.training.model import policy_name
from keras_vit.training.pipeline import check_input_shards, eval_part_length

__all__ = ["Setup", "describe", "load_data", "make_strategy", "prepare", "with_saved_model"]


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
        """This worker's part of the input (:mod:`keras_vit.training.distributed.sharding`)."""
        return input_shard(self.strategy)

    @property
    def whole_batches(self) -> bool:
        """Whether every batch, held-out ones too, must be whole (filled up with blanks of weight 0): on a TPU, under
        a keras.distribution that splits the batch, and on several workers."""
        split = isinstance(self.strategy, KerasDistribution) and self.strategy.num_replicas_in_sync > 1
        return self.device == "tpu" or split or self.shard.count > 1

    def replace(self, **fields) -> Setup:
        """This setup with fields of its config changed by flat name, not resolved again: change only what resolving
        does not derive from (run settings, the seed), or every field that it does."""
        return dataclasses.replace(self, config=self.config.replace(**fields))

    def inputs(
        self, train: Callable[[int, Shard], tf.data.Dataset], held_out: Callable[[Shard], tf.data.Dataset]
    ) -> tuple[Callable[[int], tf.data.Dataset], tf.data.Dataset]:
        """``data_fn(step)`` of ``train(step, shard)`` and the held-out input of ``held_out(shard)``, each made of
        this worker's part (:func:`~keras_vit.training.distributed.sharding.distribute_input`)."""
        return (
            lambda step: distribute_input(self.strategy, functools.partial(train, step)),
            distribute_input(self.strategy, held_out),
        )

    def stream_options(self) -> dict:
        """The keywords of :func:`~keras_vit.training.pipeline.train_dataset` that the config sets."""
        data = self.config.data
        return dict(seed=self.config.optim.seed, shuffle_buffer=data.shuffle_buffer, input_shards=data.input_shards)

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
    that ``weights`` names (a run's ``model.keras``) where unset; one asked for that differs is refused when built."""
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
    check_outside_dataset(config.run.output_dir, config.data.dataset)  # before the classes are listed
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
