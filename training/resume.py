"""A run's output folder against this run: resume it, extend it, find it finished, or refuse it."""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING

from keras_vit.files import atomic_open
from keras_vit.training import config as config_lib
from keras_vit.training import outputs
from keras_vit.training.config import TrainConfig
from keras_vit.training.data import Source
from keras_vit.training.errors import OutputDirError

if TYPE_CHECKING:
    from keras_vit.training.setup import Setup

__all__ = ["CLASSES", "Previous", "check_classes", "prepare_output", "record_classes", "start_output"]


CLASSES = "classes.txt"  # a run's class names, one a line, in label order


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
    """Clear ``output_dir`` (``overwrite``), or check that the run it holds is this run (finished, or to be extended
    by more ``steps``) and that every path the run writes can be written; what the folder holds of the run. Writes
    nothing; an :class:`OutputDirError` when the folder holds another run."""
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


def check_classes(out: str, source: Source) -> None:
    """An ``OutputDirError`` when the run in ``out`` (one with a checkpoint, or finished) was trained on other classes
    than ``source``'s (its ``classes.txt``): a renamed, reordered, added or removed class would remap the labels under
    the resumed head. A run that failed before its first checkpoint does not bind the next one."""
    path = os.path.join(out, CLASSES)
    started = outputs.has_checkpoint(out) or os.path.isfile(os.path.join(out, "metrics.json"))
    if not started or not os.path.isfile(path) or source.class_names is None:
        return  # no run to resume, or one older than classes.txt
    with open(path, encoding="utf-8") as file:
        before, now = [line.rstrip("\n") for line in file if line.strip()], list(source.class_names)
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
