"""``model.fit`` that resumes: checkpoints every N steps, step-level logs, TensorBoard, final outputs.

A run writes to ``output_dir``::

    checkpoints/        tf.train.Checkpoint of every model variable (weights and random-seed states),
                        every optimizer variable (step counter, momenta, accumulators) and the step
    tensorboard/        Keras' per-epoch train/validation curves; steps/ has loss and lr per log step
    train_log.jsonl     one line per log step: step, epoch, loss (mean since the last line), lr
    model.keras         the final model (for inference; the optimizer state lives in checkpoints/)
    metrics.json        the final held-out metrics, the history and the run's settings

Started again with a checkpoint present, :func:`fit` restores it and continues from its step: the
data stream restarts at that step (``data_fn(step)``), the optimizer's iteration count and hence the
learning-rate schedule carry on, and ``train_log.jsonl`` is cut back to that step. An "epoch" is an
evaluation interval of ``steps_per_epoch`` steps; a resumed run keeps the same epoch boundaries.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence

import keras
import tensorflow as tf

from keras_vit.training.strategy import is_chief

__all__ = ["CheckpointEvery", "Checkpointer", "FitResult", "Segment", "StepCallback", "StepLog", "fit", "plan_segments",
           "save_outputs", "truncate_log"]


@dataclasses.dataclass(frozen=True)
class Segment:
    """Consecutive epochs of equal length: one ``model.fit`` call."""

    first_epoch: int
    epochs: int
    steps_per_epoch: int
    start_step: int


def plan_segments(start: int, total: int, steps_per_epoch: int) -> list[Segment]:
    """Split steps ``[start, total)`` into fit calls whose epochs end on multiples of ``steps_per_epoch``."""
    if steps_per_epoch < 1:
        raise ValueError(f"steps_per_epoch must be >= 1, got {steps_per_epoch}.")
    segments: list[Segment] = []
    step = start
    while step < total:
        epoch = step // steps_per_epoch
        length = min((epoch + 1) * steps_per_epoch, total) - step
        last = segments[-1] if segments else None
        if last is not None and last.steps_per_epoch == length:
            segments[-1] = dataclasses.replace(last, epochs=last.epochs + 1)
        else:
            segments.append(Segment(epoch, 1, length, step))
        step += length
    return segments


class Checkpointer:
    """``tf.train.Checkpoint`` of a compiled model, its optimizer and the step, kept by a CheckpointManager.

    ``restore_directory`` (default ``directory``) is where :meth:`restore` looks: a multi-worker task
    that is not the chief restores the chief's checkpoints and saves its own to a scratch directory.
    """

    def __init__(self, model: keras.Model, directory: str, max_to_keep: int = 3, restore_directory: str | None = None):
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self.checkpoint = tf.train.Checkpoint(step=self.step, model=list(model.variables),
                                              optimizer=list(model.optimizer.variables))
        self.manager = tf.train.CheckpointManager(self.checkpoint, directory, max_to_keep=max_to_keep)
        self.saved: int | None = None
        self.restore_directory = restore_directory or directory

    def restore(self) -> int:
        """Restore the latest checkpoint if any; return its step (0 without one)."""
        path = tf.train.latest_checkpoint(self.restore_directory)
        if path is None:
            return 0
        try:
            self.checkpoint.restore(path).assert_consumed()
        except AssertionError as error:
            raise ValueError(
                f"Checkpoint {path} does not match this model and optimizer ({error}). Start a new "
                "run in another output directory, or remove the old one (--overwrite)."
            ) from error
        self.saved = int(self.step.numpy())
        return self.saved

    def save(self, step: int) -> None:
        """Save at ``step`` (once: saving the step just saved or restored again is a no-op)."""
        if step != self.saved:
            self.step.assign(step)
            self.manager.save(checkpoint_number=step)
            self.saved = step


class StepCallback(keras.callbacks.Callback):
    """Knows the global step of every batch across resumed, segmented fit calls."""

    def __init__(self):
        super().__init__()
        self.segment: Segment | None = None
        self.epoch = self.epoch_start = 0

    def on_epoch_begin(self, epoch, logs=None):
        seg = self.segment
        self.epoch = epoch
        self.epoch_start = seg.start_step + (epoch - seg.first_epoch) * seg.steps_per_epoch

    def on_train_batch_end(self, batch, logs=None):
        self.on_step_end(self.epoch_start + batch + 1, batch + 1, logs or {})

    def on_step_end(self, step: int, batches_in_epoch: int, logs: dict):
        """``step``: batches done in the whole run; ``batches_in_epoch``: in this epoch."""


class CheckpointEvery(StepCallback):
    """Saves a checkpoint whenever the step passes a multiple of ``every``."""

    def __init__(self, checkpointer: Checkpointer, every: int):
        super().__init__()
        self.checkpointer, self.every, self.last = checkpointer, every, 0

    def on_step_end(self, step, batches_in_epoch, logs):
        if step // self.every > self.last // self.every:
            self.checkpointer.save(step)
        self.last = step


class StepLog(StepCallback):
    """Every ``every`` steps: the mean loss since the last entry and the learning rate, to a JSONL file
    and TensorBoard. Keras reports the running mean of the epoch; differencing recovers the interval's."""

    def __init__(self, path: str, tensorboard_dir: str, every: int, accumulation_steps: int = 1):
        super().__init__()
        self.path, self.every, self.accumulation_steps = path, every, accumulation_steps
        self.writer = tf.summary.create_file_writer(tensorboard_dir)
        self.prev_sum, self.prev_count, self.lr = 0.0, 0, None

    def on_epoch_begin(self, epoch, logs=None):
        super().on_epoch_begin(epoch, logs)
        self.prev_sum, self.prev_count = 0.0, 0

    def on_train_batch_begin(self, batch, logs=None):
        if (self.epoch_start + batch + 1) % self.every == 0:
            self.lr = self._current_lr()

    def _current_lr(self) -> float:
        return float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))

    def on_step_end(self, step, batches_in_epoch, logs):
        if step % self.every or "loss" not in logs:
            return
        total = float(logs["loss"]) * batches_in_epoch
        loss = (total - self.prev_sum) / (batches_in_epoch - self.prev_count)
        self.prev_sum, self.prev_count = total, batches_in_epoch
        update = step // self.accumulation_steps
        lr = self._current_lr() if self.lr is None else self.lr
        entry = {"step": update, "batch": step, "epoch": self.epoch, "loss": loss, "lr": lr}
        with open(self.path, "a") as file:
            file.write(json.dumps(entry) + "\n")
        with self.writer.as_default(step=update):
            tf.summary.scalar("train/loss", loss)
            tf.summary.scalar("train/learning_rate", lr)
        self.lr = None

    def on_train_end(self, logs=None):
        self.writer.flush()


def truncate_log(path: str, step: int) -> None:
    """Drop entries of ``path`` (JSONL) after batch ``step`` -- those a killed run logged past its
    checkpoint -- and a last line cut short by the kill."""
    if not os.path.exists(path):
        return
    kept = []
    with open(path) as file:
        for line in file:
            try:
                if json.loads(line)["batch"] <= step:
                    kept.append(line if line.endswith("\n") else line + "\n")
            except (json.JSONDecodeError, KeyError):
                continue
    with open(path, "w") as file:
        file.writelines(kept)


@dataclasses.dataclass
class FitResult:
    history: dict[str, list[float]]
    start_step: int
    end_step: int


def fit(model: keras.Model, data_fn: Callable[[int], tf.data.Dataset], *, total_steps: int, steps_per_epoch: int,
        output_dir: str, strategy: tf.distribute.Strategy, eval_data: tf.data.Dataset | None = None,
        checkpoint_every: int = 500, keep_checkpoints: int = 3, log_every: int = 10, accumulation_steps: int = 1,
        callbacks: Sequence[keras.callbacks.Callback] = (), verbose: int | str = "auto") -> FitResult:
    """Train the compiled ``model`` to ``total_steps`` batches, resuming from ``output_dir`` if possible.

    ``data_fn(step)`` must return the endless training batches from batch ``step`` on. Steps here are
    ``model.fit`` batches (with gradient accumulation, ``accumulation_steps`` of them per update).
    """
    chief = is_chief(strategy)
    work_dir = output_dir if chief else tempfile.mkdtemp(prefix="keras_vit_worker_")
    os.makedirs(work_dir, exist_ok=True)
    with strategy.scope():
        model.optimizer.build(model.trainable_variables)
    checkpointer = Checkpointer(model, os.path.join(work_dir, "checkpoints"), keep_checkpoints,
                                restore_directory=os.path.join(output_dir, "checkpoints"))
    start = checkpointer.restore()
    log_path = os.path.join(work_dir, "train_log.jsonl")
    truncate_log(log_path, start)
    saver = CheckpointEvery(checkpointer, checkpoint_every)
    steppers = [saver, StepLog(log_path, os.path.join(work_dir, "tensorboard", "steps"), log_every, accumulation_steps)]
    tensorboard = keras.callbacks.TensorBoard(os.path.join(work_dir, "tensorboard"), update_freq="epoch")
    history: dict[str, list[float]] = {"epoch": []}
    for segment in plan_segments(start, total_steps, steps_per_epoch):
        for stepper in steppers:
            stepper.segment = segment
        saver.last = segment.start_step
        run = model.fit(data_fn(segment.start_step), epochs=segment.first_epoch + segment.epochs, shuffle=False,
                        initial_epoch=segment.first_epoch, steps_per_epoch=segment.steps_per_epoch,
                        validation_data=eval_data, callbacks=[*steppers, tensorboard, *callbacks], verbose=verbose)
        history["epoch"].extend(run.epoch)
        for key, values in run.history.items():
            history.setdefault(key, []).extend(float(v) for v in values)
    checkpointer.save(total_steps)
    if not chief:
        shutil.rmtree(work_dir, ignore_errors=True)
    return FitResult(history, start, total_steps)


def save_outputs(model: keras.Model, metrics: dict, output_dir: str, strategy: tf.distribute.Strategy) -> str | None:
    """Write ``model.keras`` (an uncompiled copy sharing the weights) and ``metrics.json``; chief only."""
    if not is_chief(strategy):
        return None
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, "model.keras")
    keras.Model(model.inputs, model.outputs, name=model.name).save(path)
    with open(os.path.join(output_dir, "metrics.json"), "w") as file:
        json.dump(metrics, file, indent=2)
    return path
