"""``model.fit`` that resumes: checkpoints every N steps, step logs, TensorBoard, final outputs (docs/training.md).
An "epoch" is an evaluation interval."""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from keras_vit.cloning import copy_weights
from keras_vit.files import atomic_open, atomic_path, naming
from keras_vit.models import VisionTransformer
from keras_vit.staging import new_staging
from keras_vit.training.checkpoint import DIVERGED_HINT, Checkpointer
from keras_vit.training.distributed.sharding import gather_over_workers, input_shard
from keras_vit.training.distributed.strategy import Strategy, is_chief, training_scope
from keras_vit.training.errors import DivergedError, PreemptedError, TrainingError
from keras_vit.training.outputs import LOCK, write_json

__all__ = [
    "CheckpointEvery",
    "FitResult",
    "Progress",
    "Segment",
    "StepCallback",
    "StepLog",
    "StopOnNonFinite",
    "TorchStepSeed",
    "fit",
    "plan_segments",
    "save_outputs",
    "truncate_log",
]

WORKER_SCRATCH = "keras_vit_worker_"  # a worker's scratch folders in the system's temporary folder (keras_vit.staging)


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


class StepCallback(keras.callbacks.Callback):
    """Knows the global step of every batch across resumed, segmented fit calls."""

    def __init__(self) -> None:
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


class Progress(keras.callbacks.ProgbarLogger):
    """The run's progress in optimizer steps, never "Epoch": Keras' progress bar under ``steps 1-40 of 400`` (``bar``),
    else one line an interval, ``step 40/400: loss 2.104 - accuracy 0.31 - ... (12 s)``."""

    def __init__(self, bar: bool, total_steps: int, accumulation_steps: int = 1):
        super().__init__()
        self.bar, self.total, self.accumulation = bar, total_steps, accumulation_steps
        self.segment: Segment | None = None
        self.started = 0.0

    def set_params(self, params):
        super().set_params({**params, "verbose": 1 if self.bar else 2})
        self.epochs = 1  # Keras' "Epoch i/n" line is printed for several epochs only

    def _steps(self, epoch: int) -> tuple[int, int]:
        """The optimizer steps before the epoch and at its end."""
        seg = self.segment
        assert seg is not None  # fit sets it before each model.fit
        first = seg.start_step + (epoch - seg.first_epoch) * seg.steps_per_epoch
        return first // self.accumulation, (first + seg.steps_per_epoch) // self.accumulation

    def on_epoch_begin(self, epoch, logs=None):
        self.started = time.monotonic()
        if self.bar:
            super().on_epoch_begin(epoch, logs)
            first, last = self._steps(epoch)
            print(f"steps {first + 1}-{last} of {self.total // self.accumulation}", flush=True)

    def on_train_batch_end(self, batch, logs=None):
        if self.bar:
            super().on_train_batch_end(batch, logs)

    def on_epoch_end(self, epoch, logs=None):
        if self.bar:
            super().on_epoch_end(epoch, logs)
            return
        scores = " - ".join(f"{name} {float(value):.4g}" for name, value in (logs or {}).items())
        _, last = self._steps(epoch)
        seconds = time.monotonic() - self.started
        print(f"step {last}/{self.total // self.accumulation}: {scores} ({seconds:.0f} s)", flush=True)


class CheckpointEvery(StepCallback):
    """Saves a checkpoint whenever the step passes a multiple of ``every``."""

    def __init__(self, checkpointer: Checkpointer, every: int):
        super().__init__()
        self.checkpointer, self.every, self.last = checkpointer, every, 0

    def on_step_end(self, step, batches_in_epoch, logs):
        if step // self.every > self.last // self.every:
            self.checkpointer.save(self.model, step)  # self.model: on JAX, the state attached to the variables
        self.last = step


class FolderWatch(keras.callbacks.Callback):
    """Stops the run once its folder's lock file is gone (the folder deleted under it): a ``FileNotFoundError`` naming
    the lock at the next batch, before a checkpoint could make the folder again."""

    def __init__(self, lock: str):
        super().__init__()
        self.lock = lock

    def on_train_batch_end(self, batch, logs=None):
        if not os.path.exists(self.lock):
            raise FileNotFoundError(errno.ENOENT, "the run's folder lock is gone", self.lock)


class EpochHistory(StepCallback):
    """Adds each epoch's metrics to the checkpointer's history, which every checkpoint carries to a resumed run; a
    checkpoint saved at the epoch's last step is saved again with it."""

    def __init__(self, checkpointer: Checkpointer):
        super().__init__()
        self.checkpointer, self.saved_last, self.batches = checkpointer, False, 0

    def on_step_end(self, step, batches_in_epoch, logs):
        self.saved_last, self.batches = self.checkpointer.saved == step, batches_in_epoch

    def on_epoch_end(self, epoch, logs=None):
        if self.batches < self.segment.steps_per_epoch:  # stopped mid-epoch: the resumed run ends it
            return
        history = self.checkpointer.history
        history["epoch"].append(epoch)
        for key, value in (logs or {}).items():
            history.setdefault(key, []).append(float(value))
        if self.saved_last:
            self.checkpointer.save(self.model, self.checkpointer.saved, again=True)


class TorchStepSeed(StepCallback):
    """torch only: seeds torch's global generators from ``(seed, step)`` before every batch, so that a resumed run
    draws the dropout masks of an uninterrupted one."""

    def __init__(self, seed: int):
        super().__init__()
        self.seed = seed

    def on_train_batch_begin(self, batch, logs=None):
        import torch

        torch.manual_seed((self.seed * 1_000_003 + self.epoch_start + batch + 1) % 2**63)


class StopOnNonFinite(StepCallback):
    """Stops the run at the first batch whose loss (Keras' mean of the epoch so far) is NaN or infinite with a
    :class:`DivergedError`; before :class:`CheckpointEvery`, so no checkpoint is saved at or after that batch."""

    def __init__(self, checkpointer: Checkpointer, accumulation_steps: int = 1):
        super().__init__()
        self.checkpointer, self.accumulation_steps = checkpointer, accumulation_steps

    def on_step_end(self, step, batches_in_epoch, logs):
        loss = float(logs.get("loss", 0.0))
        if math.isfinite(loss):
            return
        saved = self.checkpointer.saved
        kept = (
            f"the last checkpoint, step {saved // self.accumulation_steps}, is kept in {self.checkpointer.directory}"
            if saved
            else "no checkpoint was saved"
        )
        raise DivergedError(
            f"Training diverged: the loss is {loss} at step {math.ceil(step / self.accumulation_steps)}"
            f" (batch {step}); {kept}. To fix: {DIVERGED_HINT}."
        )


class StopOnSignal(StepCallback):
    """On SIGTERM or SIGINT the run ends its update, checkpoints that step and stops (:class:`PreemptedError`);
    several workers (``agree``) all stop at the same update."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(
        self, checkpointer: Checkpointer, accumulation_steps: int = 1, agree: Callable[[bool], bool] | None = None
    ):
        super().__init__()
        self.checkpointer, self.accumulation_steps, self.agree = checkpointer, accumulation_steps, agree
        self.received: int | None = None
        self.stopped_at: int | None = None
        self.previous: dict[int, Callable[[int, FrameType | None], Any] | int | None] = {}

    def on_train_begin(self, logs=None):
        if threading.current_thread() is threading.main_thread() and not self.previous:
            self.previous = {number: signal.signal(number, self._receive) for number in self.SIGNALS}

    def _receive(self, number, frame):
        self.received = number

    def on_step_end(self, step, batches_in_epoch, logs):
        if self.stopped_at is not None or step % self.accumulation_steps:
            return
        stop = self.received is not None
        if self.agree is not None:
            stop = self.agree(stop)
        if stop:
            self.checkpointer.save(self.model, step)
            self.stopped_at = step
            self.model.stop_training = True

    def restore(self) -> None:
        """Give the signals back to the handlers they had."""
        for number, handler in self.previous.items():
            signal.signal(number, handler)
        self.previous = {}

    def error(self) -> PreemptedError:
        assert self.stopped_at is not None  # fit asks for it once the run stopped
        name = signal.Signals(self.received).name if self.received else "a signal to another worker"
        return PreemptedError(
            f"stopped by {name} at step {self.stopped_at // self.accumulation_steps}: the checkpoint of that step is "
            f"in {self.checkpointer.directory}; run the same command again to resume."
        )


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
        with naming(self.path), open(self.path, "a") as file:
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
    with open(path, encoding="utf-8", errors="replace") as file:
        for line in file:
            try:
                if json.loads(line)["batch"] <= step:
                    kept.append(line if line.endswith("\n") else line + "\n")
            except (ValueError, LookupError, TypeError, RecursionError):  # a damaged line: dropped
                continue
    with atomic_open(path, "w") as file:
        file.writelines(kept)


@dataclasses.dataclass
class FitResult:
    history: dict[str, list[float]]  # every epoch's, those before a resume included when its checkpoint has them
    start_step: int
    end_step: int
    history_restored: bool = False  # whether ``history`` begins with the restored checkpoint's


def fit(
    model: keras.Model,
    data_fn: Callable[[int], tf.data.Dataset],
    *,
    total_steps: int,
    steps_per_epoch: int,
    output_dir: str,
    strategy: Strategy,
    eval_data: tf.data.Dataset | None = None,
    checkpoint_every: int = 500,
    keep_checkpoints: int = 3,
    log_every: int = 10,
    accumulation_steps: int = 1,
    seed: int = 0,
    callbacks: Sequence[keras.callbacks.Callback] = (),
    verbose: int | str = "auto",
) -> FitResult:
    """Train the compiled ``model`` to ``total_steps`` batches, resuming from ``output_dir``'s checkpoints;
    ``data_fn(step)`` gives the endless batches from ``step`` on (steps are ``model.fit`` batches)."""
    chief = is_chief(strategy)
    checkpointer = Checkpointer(os.path.join(output_dir, "checkpoints"), keep_checkpoints, write=chief)
    stopper = StopOnSignal(checkpointer, accumulation_steps, _agreement(strategy))
    work_dir = output_dir if chief else str(new_staging(tempfile.gettempdir(), WORKER_SCRATCH))  # a killed one's goes
    previous = None
    if not chief and threading.current_thread() is threading.main_thread():  # a launcher stops workers by SIGTERM
        previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        os.makedirs(work_dir, exist_ok=True)
        with strategy.scope():
            model.optimizer.build(model.trainable_variables)
        start = checkpointer.restore(model)
        agree_on_start(strategy, start, output_dir)
        if start and chief and verbose != 0:
            steps = f"{start // accumulation_steps} of {total_steps // accumulation_steps}"
            print(f"resuming at step {steps} from {checkpointer.directory}", flush=True)
        log_path = os.path.join(work_dir, "train_log.jsonl")
        truncate_log(log_path, start)
        saver = CheckpointEvery(checkpointer, checkpoint_every)
        lock = os.path.join(output_dir, LOCK)  # held by the runner (outputs.run_lock) where the run writes a folder
        watch = [FolderWatch(lock)] if chief and os.path.exists(lock) else []  # first: before any write of the step
        steppers = [
            StopOnNonFinite(checkpointer, accumulation_steps),  # first: no checkpoint at a non-finite step
            saver,
            stopper,
            StepLog(log_path, os.path.join(work_dir, "tensorboard", "steps"), log_every, accumulation_steps),
            *([TorchStepSeed(seed)] if keras.backend.backend() == "torch" else []),
        ]
        tensorboard = keras.callbacks.TensorBoard(os.path.join(work_dir, "tensorboard"), update_freq="epoch")
        # Keras' own progress says "Epoch" and writes a progress bar's bytes where stdout is not a terminal
        bar = verbose == 1 or (verbose == "auto" and sys.stdout.isatty())
        progress = [Progress(bar, total_steps, accumulation_steps)] if verbose != 0 else []
        history = EpochHistory(checkpointer)  # after the caller's callbacks: it keeps what they leave
        for segment in plan_segments(start, total_steps, steps_per_epoch):
            segmented: list[StepCallback | Progress] = [*steppers, history, *progress]
            for stepper in segmented:
                stepper.segment = segment
            saver.last = segment.start_step
            with training_scope(strategy):
                model.fit(
                    data_fn(segment.start_step),
                    epochs=segment.first_epoch + segment.epochs,
                    shuffle=False,
                    initial_epoch=segment.first_epoch,
                    steps_per_epoch=segment.steps_per_epoch,
                    validation_data=eval_data,
                    callbacks=[*watch, *steppers, *callbacks, history, tensorboard, *progress],
                    verbose=0,
                )
            if stopper.stopped_at is not None:
                raise stopper.error()
        stopper.restore()
        checkpointer.save(model, total_steps)
        return FitResult(checkpointer.history, start, total_steps, checkpointer.history_restored)
    finally:
        stopper.restore()
        if not chief:  # a worker's scratch goes, also when it fails or is stopped
            shutil.rmtree(work_dir, ignore_errors=True)
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)


def _agreement(strategy: Strategy) -> Callable[[bool], bool] | None:
    """For a run of several processes (TensorFlow workers, JAX processes): whether any of them has a flag up, a
    collective every process calls. None for one process."""
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        several = input_shard(strategy).count > 1
    elif keras.backend.backend() == "jax":
        import jax

        several = jax.process_count() > 1
    else:
        several = False
    return (lambda flag: bool(gather_over_workers(strategy, np.array([int(flag)])).any())) if several else None


def agree_on_start(strategy: Strategy, start: int, output_dir: str) -> None:
    """Check that every worker of a multi-worker run (TensorFlow tasks, JAX processes) restored the same step (they
    all read the chief's checkpoints, so ``output_dir`` must be on a file system every worker sees)."""
    starts = gather_over_workers(strategy, np.array([start]))[:, 0].tolist()
    if len(set(starts)) > 1:
        raise TrainingError(
            f"The workers restored different steps ({', '.join(map(str, starts))}; this one: {start}). Every worker "
            f"resumes from the chief's checkpoints in {os.path.join(output_dir, 'checkpoints')}: put --output-dir "
            "on a file system all workers share."
        )


def _uncompiled(model: keras.Model) -> keras.Model:
    """A copy of ``model`` without its optimizer and compile settings: the same class and config for a
    :class:`~keras_vit.models.VisionTransformer` (weights copied), else a plain model sharing the weights."""
    if isinstance(model, VisionTransformer):
        return copy_weights(model, VisionTransformer.from_config(model.get_config()))
    return keras.Model(model.inputs, model.outputs, name=model.name)


def save_outputs(
    model: keras.Model, metrics: dict, output_dir: str, strategy: Strategy, model_path: str | None = None
) -> str | None:
    """Write ``model.keras`` (an uncompiled copy: a :class:`~keras_vit.models.VisionTransformer` keeps its class and
    config, class names included, LoRA adapters merged; at ``model_path`` when given) and
    ``metrics.json`` (strict JSON: NaN and infinite values as ``null``) to ``output_dir``; chief only."""
    if not is_chief(strategy):
        return None
    os.makedirs(output_dir, exist_ok=True)
    path = model_path or os.path.join(output_dir, "model.keras")
    with atomic_path(path) as temporary:
        _uncompiled(model).save(temporary)
    write_json(os.path.join(output_dir, "metrics.json"), metrics)
    return path
