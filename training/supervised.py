"""The supervised run that fine-tuning (and the fine-tuning half of pre-training) does.

:func:`train_classifier`: load the data and the strategy, resolve the config, build and compile the
model under the precision policy, ``model.fit`` with checkpoints (resuming from ``output_dir`` when it
holds one), evaluate on held-out data, save ``model.keras`` and ``metrics.json``. The run's settings
(``run.json``) are written once the model is built: a run that fails before does not bind the next one.
A loss that turns NaN or infinite stops the run with a ``DivergedError`` (no model is saved).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import keras
import tensorflow as tf

from keras_vit.training import config as config_lib
from keras_vit.training import steps
from keras_vit.training.config import TrainConfig
from keras_vit.training.loop import fit, save_outputs
from keras_vit.training.pipeline import eval_dataset, train_dataset
from keras_vit.training.strategy import Strategy, strategy_name, training_scope

__all__ = ["FinetuneResult", "OverImages", "train_classifier"]


class OverImages(keras.callbacks.Callback):
    """The held-out loss over the images alone when the evaluation is in whole batches (TPU, JAX DataParallel).

    Keras' loss tracker averages over every example of a batch, so the blanks that fill the last one (weight 0,
    loss 0) pull ``val_loss`` down by images / (images + blanks); this puts ``val_loss`` back, times ``scale``,
    for the callbacks after it (TensorBoard, and History and the progress bar, which Keras calls last).
    """

    def __init__(self, images: int, blanks: int):
        super().__init__()
        self.scale = (images + blanks) / images if blanks else 1.0

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None and "val_loss" in logs:
            logs["val_loss"] = float(logs["val_loss"]) * self.scale


@dataclasses.dataclass
class FinetuneResult:
    """What a run produced: the trained model, the final held-out metrics, the history, the settings."""

    model: keras.Model
    metrics: dict[str, float]
    history: dict[str, list[float]]
    config: TrainConfig
    output_dir: str


def train_classifier(
    config: TrainConfig,
    *,
    callbacks: Sequence[keras.callbacks.Callback] = (),
    strategy: Strategy | None = None,
) -> FinetuneResult:
    """Train the classifier ``config`` describes, evaluate it and save it (see the module docstring).

    ``callbacks`` are added to ``model.fit``; ``strategy`` replaces the config's.
    """
    setup = steps.prepare(config, strategy)
    config, source, strategy = setup.config, setup.source, setup.strategy
    optim, run = config.optim, config.run
    steps.prepare_output(config, setup.chief)
    if setup.chief and run.verbose:
        print(steps.describe(setup), flush=True)

    keras.utils.set_random_seed(optim.seed)
    with steps.precision(config, setup.device), strategy.scope():
        model = steps.build_model(config, source.num_classes)
        steps.compile_model(model, config)
    steps.start_output(config, setup.chief)  # the run has started: its folder is marked, its settings written

    augment = steps.augment_of(config)
    accumulate = optim.accumulation_steps
    micro_batch = optim.batch_size // accumulate
    eval_data = eval_dataset(source.eval, source.num_classes, micro_batch, augment, whole_batches=setup.whole_batches)

    def data_fn(step: int) -> tf.data.Dataset:
        return train_dataset(
            source.train,
            source.num_classes,
            micro_batch,
            augment,
            start_step=step,
            seed=optim.seed,
            shuffle_buffer=config.data.shuffle_buffer,
        )

    count, blanks = source.eval.num_examples, setup.blanks(micro_batch)
    over_images = OverImages(count, blanks)
    started = time.time()
    result = fit(
        model,
        data_fn,
        total_steps=optim.steps * accumulate,
        steps_per_epoch=optim.eval_every * accumulate,
        output_dir=run.output_dir,
        strategy=strategy,
        eval_data=eval_data,
        checkpoint_every=run.checkpoint_every * accumulate,
        keep_checkpoints=run.keep_checkpoints,
        log_every=run.log_every * accumulate,
        accumulation_steps=accumulate,
        seed=optim.seed,
        callbacks=[over_images, *callbacks],
        verbose=run.verbose,
    )
    train_seconds = time.time() - started
    with training_scope(strategy):
        scores = model.evaluate(eval_data, return_dict=True, verbose=0)
    scores["loss"] *= over_images.scale
    metrics = {
        "eval": {k: float(v) for k, v in scores.items()},
        "eval_examples": count,
        "eval_split": source.eval_split,
        "dataset": source.name,
        "steps": optim.steps,
        "resumed_from_step": result.start_step // accumulate,
        "train_seconds_this_run": round(train_seconds, 1),
        "backend": keras.backend.backend(),
        "strategy": strategy_name(strategy),
        "replicas": strategy.num_replicas_in_sync,
        "precision": steps.policy_name(config, setup.device),
        "history": result.history,
        "config": config_lib.json_ready(config),
    }
    save_outputs(model, metrics, run.output_dir, strategy)
    if setup.chief and run.verbose:
        print(
            f"held-out accuracy: {scores['accuracy']:.4f} on {count or '?'} images "
            f"({source.name}, {source.eval_split}); model and metrics in {run.output_dir}",
            flush=True,
        )
    return FinetuneResult(model, metrics["eval"], result.history, config, run.output_dir)
