"""Image classification (:class:`Classification`): the task of fine-tuning, of pre-training's second half and of the
ablation; :func:`train_classifier` is one run of it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TypeAlias

import keras
import tensorflow as tf

from keras_vit.training.config import TrainConfig
from keras_vit.training.data import Source
from keras_vit.training.distributed.strategy import Strategy
from keras_vit.training.model import build_model, compile_model
from keras_vit.training.pipeline import Augment, eval_dataset, train_dataset
from keras_vit.training.runner import RunResult, train
from keras_vit.training.setup import Setup, prepare

__all__ = ["Classification", "FinetuneResult", "train_classifier"]

FinetuneResult: TypeAlias = RunResult  # the name the API has always given a classification run's result


@dataclasses.dataclass(frozen=True)
class Classification:
    """Train the config's ViT as a classifier; ``position_embedding`` and ``classifier`` replace the model's own."""

    position_embedding: str | None = None
    classifier: str | None = None

    accuracy_name = "held-out accuracy"
    blanks_in_loss = True  # the cross-entropy averages over every example, blanks included

    def options(self) -> dict[str, str]:
        """The keywords of :func:`keras_vit.ViT` that are set."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    def describe(self) -> str:
        return ", ".join(f"{name.replace('_', ' ')} {value}" for name, value in self.options().items())

    def build(self, config: TrainConfig, source: Source) -> tuple[keras.Model, keras.Model]:
        model = build_model(config, source.num_classes, class_names=source.class_names, **self.options())
        return model, model

    def compile(self, model: keras.Model, config: TrainConfig) -> None:
        compile_model(model, config)

    def datasets(
        self, setup: Setup, model: keras.Model, batch: int
    ) -> tuple[Callable[[int], tf.data.Dataset], tf.data.Dataset]:
        source, augment = setup.source, Augment.of(setup.config)
        return setup.inputs(
            lambda step, shard: train_dataset(
                source.train,
                source.num_classes,
                batch,
                augment,
                start_step=step,
                shard=shard,
                **setup.stream_options(),
            ),
            lambda shard: eval_dataset(
                source.eval, source.num_classes, batch, augment, whole_batches=setup.whole_batches, shard=shard
            ),
        )


def train_classifier(
    config: TrainConfig,
    *,
    callbacks: Sequence[keras.callbacks.Callback] = (),
    strategy: Strategy | None = None,
) -> FinetuneResult:
    """Train the classifier ``config`` describes, evaluate and save it; ``callbacks`` go to ``model.fit``,
    ``strategy`` replaces the config's."""
    return train(prepare(config, strategy), Classification(), callbacks=callbacks)
