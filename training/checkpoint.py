"""A run's checkpoints: every model and optimizer variable, the step and the epoch history, one ``.npz`` each, the
same on every backend (docs/training.md)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import zipfile
import zlib
from collections.abc import Sequence
from typing import TypeGuard

import keras
import numpy as np

from keras_vit.files import atomic_open, temporary_target
from keras_vit.training.errors import DivergedError, TrainingError, warn

__all__ = ["FORMAT", "Checkpointer", "checkpoint_path", "checkpoint_steps", "read_checkpoint"]

FORMAT = "keras-vit checkpoint 1"
DIVERGED_HINT = "lower --lr, and check that --drop-path and --dropout are in [0, 1)"
_NAME = re.compile(r"ckpt-(\d+)\.npz")
_NUMBER = re.compile(r"_\d+(?=/|$)")
_OLD_TEMPORARY = re.compile(r"\.ckpt-\d+-\w+\.tmp")  # what a killed save of an older keras-vit left
# What a file cut short or damaged raises (zlib, NotImplementedError: a member's compression; MemoryError: a
# member's header declaring more than there is memory for).
_READ_ERRORS = (
    zipfile.BadZipFile,
    zlib.error,
    OSError,
    ValueError,
    KeyError,
    TypeError,
    EOFError,
    NotImplementedError,
    MemoryError,
)


def checkpoint_path(folder: str, step: int) -> str:
    return os.path.join(folder, f"ckpt-{step}.npz")


def checkpoint_steps(folder: str) -> list[int]:
    """The steps of the checkpoints in ``folder``, ascending (empty when it does not exist)."""
    names = os.listdir(folder) if os.path.isdir(folder) else []
    return sorted(int(match[1]) for match in map(_NAME.fullmatch, names) if match)


def _entries(variables: Sequence) -> list[list]:
    return [[v.path, list(v.shape), str(v.dtype)] for v in variables]


def read_checkpoint(path: str) -> tuple[int, dict, dict[str, list[np.ndarray]]]:
    """``(step, manifest, {"model": arrays, "optimizer": arrays})`` of a checkpoint file, every array read."""
    with np.load(path, allow_pickle=False) as data:
        manifest = _manifest(str(data["manifest"]))
        arrays = {part: [data[f"{part}/{i}"] for i in range(len(manifest[part]))] for part in ("model", "optimizer")}
        step = int(data["step"])
    for part, values in arrays.items():
        for (name, shape, dtype), value in zip(manifest[part], values):
            if (list(value.shape), value.dtype.name) != (shape, dtype):
                raise ValueError(
                    f"{part} {name} is {value.dtype.name} {value.shape}, the manifest says {dtype} {tuple(shape)}"
                )
    non_finite = [
        f"{part} {entry[0]}"
        for part, values in arrays.items()
        for entry, value in zip(manifest[part], values)
        if value.dtype.kind == "f" and not np.isfinite(value).all()
    ]
    if non_finite:
        more = " ..." if len(non_finite) > 3 else ""
        raise ValueError(f"NaN or infinite values in {', '.join(non_finite[:3])}{more}")
    return step, manifest, arrays


def _manifest(text: str) -> dict:
    """A checkpoint's manifest, checked: the format's name, and ``[path, shape, dtype]`` per variable."""
    try:
        manifest = json.loads(text)
    except RecursionError:
        raise ValueError("the manifest is not JSON") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"not a {FORMAT!r} file")
    for part in ("model", "optimizer"):
        entries = manifest.get(part)
        if not isinstance(entries, list) or not all(_is_entry(entry) for entry in entries):
            raise ValueError(f"the manifest's {part} entries are damaged")
    return manifest


def _is_history(history) -> TypeGuard[dict[str, list]]:
    """Whether a manifest's ``history`` is ``{"epoch": [...], metric: [...]}`` of equal lengths."""
    if not isinstance(history, dict) or not isinstance(history.get("epoch"), list):
        return False
    length = len(history["epoch"])
    return all(
        isinstance(v, list) and len(v) == length and all(isinstance(x, (int, float)) for x in v)
        for v in history.values()
    )


def _is_entry(entry) -> bool:
    return (
        isinstance(entry, list)
        and len(entry) == 3
        and isinstance(entry[0], str)
        and isinstance(entry[1], list)
        and all(isinstance(n, int) and n >= 0 for n in entry[1])
        and isinstance(entry[2], str)
    )


class Checkpointer:
    """Saves and restores a compiled model's variables, its optimizer's, the step and the epoch history in
    ``directory``; ``write=False`` (a worker that is not the chief) only checks and remembers the step."""

    def __init__(self, directory: str, keep: int = 3, write: bool = True):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}.")
        self.directory, self.keep, self.write = directory, keep, write
        self.saved: int | None = None
        self.history: dict[str, list] = {"epoch": []}  # the epochs done, saved with every checkpoint
        self.history_restored = False

    def restore(self, model: keras.Model) -> int:
        """Load the newest checkpoint that reads whole into ``model``; return its step (0 without one)."""
        folder = self.directory
        names = os.listdir(folder) if os.path.isdir(folder) else []
        if not checkpoint_steps(folder) and any(n.startswith("ckpt-") and n.endswith(".index") for n in names):
            raise TrainingError(
                f"{folder} holds tf.train checkpoints (ckpt-N.index) of an older keras-vit, which this version "
                "does not resume. Finish that run with the version that started it, or start over with --overwrite."
            )
        if self.write:  # a save that was killed mid-way leaves its temporary file
            for name in names:
                if _NAME.fullmatch(temporary_target(name) or "") or _OLD_TEMPORARY.fullmatch(name):
                    os.remove(os.path.join(self.directory, name))
        failures = []
        for step in reversed(checkpoint_steps(self.directory)):
            path = checkpoint_path(self.directory, step)
            try:
                saved_step, manifest, arrays = read_checkpoint(path)
            except _READ_ERRORS as error:
                failures.append(f"{os.path.basename(path)}: {_first_line(error)}")
                continue
            if saved_step != step:
                failures.append(f"{os.path.basename(path)}: holds step {saved_step}, not {step}")
                continue
            parts = _parts(model)
            for part, variables in parts.items():
                _check_fits(path, part, manifest[part], variables)
            for part, variables in parts.items():
                for variable, value in zip(variables, arrays[part]):
                    variable.assign(value)
            if failures:
                warn(
                    f"resuming from {path} (step {saved_step}), the newest checkpoint that reads: {'; '.join(failures)}"
                )
            history = manifest.get("history")
            if _is_history(history):
                self.history, self.history_restored = history, True
            self.saved = saved_step
            return saved_step
        if failures:
            raise TrainingError(
                f"No checkpoint in {self.directory} reads ({'; '.join(failures)}). Start over with --overwrite, or "
                "use another --output-dir."
            )
        return 0

    def save(self, model: keras.Model, step: int, again: bool = False) -> None:
        """Save at ``step`` with the history (once unless ``again``); non-finite weights: a :class:`DivergedError`,
        nothing written."""
        if step == self.saved and not again:
            return
        parts = _parts(model)
        arrays = {part: [np.asarray(keras.ops.convert_to_numpy(v)) for v in values] for part, values in parts.items()}
        if not all(np.isfinite(a).all() for a in arrays["model"] if np.issubdtype(a.dtype, np.floating)):
            raise DivergedError(
                f"Training diverged: the weights are NaN or infinite at batch {step}; no checkpoint saved there (the "
                f"last one is batch {self.saved or 'none'}). To fix: {DIVERGED_HINT}."
            )
        if self.write:
            manifest = {"format": FORMAT, "backend": keras.backend.backend(), "step": step, "history": self.history}
            manifest.update({part: _entries(variables) for part, variables in parts.items()})
            with contextlib.suppress(FileExistsError):  # mkdir: a run folder deleted under the run is not made again
                os.mkdir(self.directory)
            named = {f"{part}/{i}": a for part, values in arrays.items() for i, a in enumerate(values)}
            with atomic_open(checkpoint_path(self.directory, step), durable=True) as file:
                # the ignore: numpy's stub fears a key named allow_pickle among **named; its keys are "part/i"
                np.savez(file, step=np.int64(step), manifest=np.array(json.dumps(manifest)), **named)  # type: ignore[arg-type]
            for old in checkpoint_steps(self.directory)[: -self.keep]:
                os.remove(checkpoint_path(self.directory, old))
        self.saved = step


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _parts(model: keras.Model) -> dict[str, list]:
    return {"model": list(model.variables), "optimizer": list(model.optimizer.variables)}


def _check_fits(path: str, part: str, saved: list[list], variables: Sequence) -> None:
    """A ``ValueError`` naming the first variable of ``part`` whose path (without the numbers Keras appends to make
    names unique in a process: ``seed_generator_3``) or shape differs from the checkpoint's at the same position."""
    ours = _entries(variables)
    problem = None
    if len(saved) != len(ours):
        problem = f"{len(saved)} {part} variables in the checkpoint, {len(ours)} here"
    else:
        for (saved_path, saved_shape, _), (path_here, shape_here, _) in zip(saved, ours):
            if (_NUMBER.sub("", saved_path), saved_shape) != (_NUMBER.sub("", path_here), shape_here):
                problem = f"{part} variable {saved_path} {tuple(saved_shape)} vs {path_here} {tuple(shape_here)} here"
                break
    if problem:
        raise ValueError(
            f"Checkpoint {path} does not match this model and optimizer ({problem}). Start a new run in another "
            "output directory, or remove the old one (--overwrite)."
        )
