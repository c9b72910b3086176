"""The one training run every command goes through: :func:`train` of a prepared :class:`Setup` and a :class:`Task`
(docs/design.md)."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import keras
import tensorflow as tf

from keras_vit.config import ViTConfig
from keras_vit.training import config as config_lib
from keras_vit.training import outputs, resume
from keras_vit.training.config import TrainConfig
from keras_vit.training.data import Source
from keras_vit.training.distributed.strategy import strategy_name, training_scope
from keras_vit.training.errors import OutputDirError
from keras_vit.training.loop import fit, save_outputs
from keras_vit.training.memory import check_batch_fits
from keras_vit.training.model import policy_name, precision
from keras_vit.training.setup import Setup, describe

__all__ = ["OverImages", "RunResult", "Task", "train"]


class Task(Protocol):
    """What a run trains: its model, how it is compiled, its data."""

    accuracy_name: str  # what the final accuracy is called ("held-out accuracy")
    blanks_in_loss: bool  # whether the loss averages over the blanks that fill whole held-out batches

    def describe(self) -> str:
        """What the task adds to the run's description ("" when nothing)."""

    def build(self, config: TrainConfig, source: Source) -> tuple[keras.Model, keras.Model]:
        """The model that trains and the model the run keeps (saves and returns): the same, or the one inside; the
        kept one's config records the classes of ``source``."""

    def compile(self, model: keras.Model, config: TrainConfig) -> None:
        """Compile the model that trains."""

    def datasets(
        self, setup: Setup, model: keras.Model, batch: int
    ) -> tuple[Callable[[int], tf.data.Dataset], tf.data.Dataset]:
        """``data_fn(step)``, the endless training batches from ``step`` on, and the held-out batches, of ``batch``
        examples; ``model`` is the kept model."""


class OverImages(keras.callbacks.Callback):
    """Puts ``val_loss`` back over the images alone, times ``scale``, when evaluation in whole batches counts the
    blanks (weight 0) that fill the last one; for the callbacks after it."""

    def __init__(self, images: int, blanks: int):
        super().__init__()
        self.scale = (images + blanks) / images if blanks else 1.0

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None and "val_loss" in logs:
            logs["val_loss"] = float(logs["val_loss"]) * self.scale


@dataclasses.dataclass
class RunResult:
    """What a run produced: the kept model, the final held-out metrics, the history, the settings."""

    model: keras.Model
    metrics: dict[str, float]
    history: dict[str, list[float]]
    config: TrainConfig
    output_dir: str


def train(
    setup: Setup,
    task: Task,
    *,
    callbacks: Sequence[keras.callbacks.Callback] = (),
    command: str = "finetune",
    model_path: str | None = None,
) -> RunResult:
    """Run ``task`` as ``setup`` says into its ``output_dir``, holding the folder's lock; ``callbacks`` go to
    ``model.fit``, ``command`` to the folder's marker, the kept model to ``model_path`` (default ``model.keras``).
    Errors: :class:`DivergedError`, :class:`OutputDirError`, :class:`PreemptedError`."""
    with outputs.run_lock(setup.config.run.output_dir, setup.chief, setup.config.run.overwrite):
        return _run(setup, task, callbacks, command, model_path)


def _run(
    setup: Setup, task: Task, callbacks: Sequence[keras.callbacks.Callback], command: str, model_path: str | None
) -> RunResult:
    config, source, strategy = setup.config, setup.source, setup.strategy
    optim, run = config.optim, config.run
    previous = resume.prepare_output(config, setup.chief, model_path)
    resume.check_classes(run.output_dir, source)
    if previous.finished is not None:
        return _finished(setup, task, previous.finished, model_path)
    if setup.chief and previous.extends:
        print(f"extending the run in {run.output_dir} from {previous.extends} to {optim.steps} steps", flush=True)
    if setup.chief and run.verbose:
        print("\n".join(filter(None, (describe(setup), task.describe()))), flush=True)

    keras.utils.set_random_seed(optim.seed)
    with precision(config, setup.device), strategy.scope():
        model, kept = task.build(config, source)
        task.compile(model, config)
    # started: the folder is marked, the settings written
    resume.start_output(config, setup.chief, command, previous)
    resume.record_classes(setup)

    accumulate = optim.accumulation_steps
    micro_batch = optim.batch_size // accumulate
    if setup.device == "cpu" and isinstance(getattr(kept, "config", None), ViTConfig):  # the host's memory
        compute = keras.dtype_policies.get(policy_name(config, setup.device)).compute_dtype
        per_value = 4 if compute == "float32" else 2
        check_batch_fits(kept.config, micro_batch // setup.shard.count, per_value, accumulate)
    data_fn, eval_data = task.datasets(setup, kept, micro_batch)
    count = source.eval.num_examples
    over_images = OverImages(count, setup.blanks(micro_batch) if task.blanks_in_loss else 0)
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
    history, before = result.history, previous.history or {}
    if not result.history_restored:  # a finished run's history, followed by its extension's
        history = {key: [*before.get(key, []), *history.get(key, [])] for key in {**before, **history}}
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
        "precision": policy_name(config, setup.device),
        "history": history,
        "config": config_lib.json_ready(config),
    }
    save_outputs(kept, metrics, run.output_dir, strategy, model_path)
    if setup.chief and run.verbose:
        where = f"model {model_path}, metrics" if model_path else "model and metrics"
        print(
            f"{task.accuracy_name}: {scores['accuracy']:.4f} on {count or '?'} images "
            f"({source.name}, {source.eval_split}); {where} in {run.output_dir}",
            flush=True,
        )
    return RunResult(kept, metrics["eval"], metrics["history"], config, run.output_dir)


def _finished(setup: Setup, task: Task, metrics: dict, model_path: str | None) -> RunResult:
    """The result of the run ``setup`` describes, finished before: its saved model and ``metrics.json``, unchanged."""
    out, steps_done = setup.config.run.output_dir, metrics["steps"]
    accuracy = metrics["eval"].get("accuracy")
    if setup.chief:
        scored = f" ({task.accuracy_name} {accuracy:.4f})" if isinstance(accuracy, float) else ""
        print(
            f"{out} holds this run, finished at {steps_done} steps{scored}: nothing to do. Give more --steps to "
            "extend it, or --overwrite to start over.",
            flush=True,
        )
    path = model_path or os.path.join(out, "model.keras")
    try:
        kept = keras.saving.load_model(path, compile=False)
    except Exception as error:  # a damaged file: Keras raises what its readers raise
        raise OutputDirError(
            f"{path} of the finished run does not load ({str(error).strip().splitlines()[0]}): remove it and "
            "metrics.json to evaluate the run's last checkpoint again, or start over with --overwrite."
        ) from error
    return RunResult(kept, metrics["eval"], metrics["history"], setup.config, out)
