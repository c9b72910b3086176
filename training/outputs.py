"""A run's output folder: its marker, its lock, what ``--overwrite`` may delete (:data:`RUN_FILES`, only in a run's
folder), strict JSON (docs/faults.md)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from keras_vit.config import CLASSIFIERS, POSITION_EMBEDDINGS
from keras_vit.files import finite_json, still_linked, temporary_target, write_json
from keras_vit.training.errors import OutputDirError
from keras_vit.training.markers import MARKER, is_run_folder

if TYPE_CHECKING:
    from keras_vit.training.setup import Setup

try:
    import fcntl
except ImportError:  # Windows: no advisory locks
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "ABLATION_FOLDERS",
    "MARKER",
    "RUN_FILES",
    "check_paths",
    "check_usable",
    "clear_output",
    "finite_json",
    "has_checkpoint",
    "is_run_folder",
    "mark_output",
    "read_json",
    "run_lock",
    "start_parent",
    "write_json",
]

LOCK = ".keras_vit_run.lock"  # held (flock) by the run writing the folder; not a run file: --overwrite keeps it
# The ablation's folder per setting, <position embedding>-<classifier>, each holding a run per seed.
ABLATION_FOLDERS = tuple(f"{p}-{c}" for p in POSITION_EMBEDDINGS for c in CLASSIFIERS)
RUN_FILES = (
    MARKER,
    "run.json",
    "classes.txt",
    "checkpoints",
    "tensorboard",
    "train_log.jsonl",
    "model.keras",
    "metrics.json",
    "encoder.keras",
    "pretrain",
    "finetune",
    "scratch",
    "summary.json",
    "ablation.md",
    "ablation.json",
    *ABLATION_FOLDERS,
)
# What a run writes in its folder, by kind: checked before its first step (check_paths).
RUN_FOLDERS = ("checkpoints", "tensorboard", "tensorboard/steps", "tensorboard/train", "tensorboard/validation")
RUN_WRITES = (MARKER, "run.json", "classes.txt", "train_log.jsonl", "metrics.json")  # and the model, wherever it goes


def has_checkpoint(path: str) -> bool:
    """Whether ``path/checkpoints`` holds a checkpoint (``ckpt-<step>.npz``, or an older keras-vit's tf.train
    ``ckpt-<step>.index``)."""
    folder = os.path.join(path, "checkpoints")
    names = os.listdir(folder) if os.path.isdir(folder) else []
    return any(n.startswith("ckpt-") and n.endswith((".npz", ".index")) for n in names)


def _entries(path: str) -> list[str]:
    """What ``path`` holds besides a run's lock file (nothing when it is not a folder)."""
    return [name for name in os.listdir(path) if name != LOCK] if os.path.isdir(path) else []


def check_usable(path: str, overwrite: bool = False) -> None:
    """Refuse ``path`` as a run's output folder unless it is missing, empty or a run's own (the user's files in it
    would be overwritten, and a later ``--overwrite`` would take the folder for a run's)."""
    if os.path.lexists(path) and not os.path.isdir(path):
        raise OutputDirError(f"--output-dir {path} is a file, not a folder. Choose another --output-dir.")
    if not _entries(path) or is_run_folder(path):
        return
    if overwrite:
        raise OutputDirError(
            f"--overwrite refuses to clear {path}: it is not empty and holds no run (no {MARKER} or run.json). "
            "Choose another --output-dir."
        )
    raise OutputDirError(
        f"{path} is not empty and holds no run (no {MARKER} or run.json): a run starts only in a missing or "
        "empty folder or in its own run folder. Choose another --output-dir."
    )


@contextlib.contextmanager
def run_lock(path: str, chief: bool = True, overwrite: bool = False) -> Iterator[None]:
    """Hold ``path``'s run lock (:data:`LOCK`, ``fcntl.flock``, freed when the process ends) while the block runs: a
    second run into the folder is refused. The folder is checked first (:func:`check_usable`)."""
    if not chief or fcntl is None:  # workers write nothing; no advisory locks on this system
        yield
        return
    check_usable(path, overwrite)
    created, folder = [], os.path.abspath(path)  # the folders made here, deepest first
    while not os.path.lexists(folder):
        created.append(folder)
        folder = os.path.dirname(folder)
    os.makedirs(path, exist_ok=True)
    lock = os.path.join(path, LOCK)
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise OutputDirError(
                f"{path} is in use by another run (process {holder}): wait for it to end, or choose another "
                "--output-dir."
            ) from None
        if still_linked(fd, lock):
            break
        os.close(fd)  # the run before removed this file as it ended: take the new one
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    except Exception as error:
        if not still_linked(fd, lock):  # the folder (or its lock) was removed under the run
            raise OutputDirError(
                f"--output-dir {path} was deleted while the run was writing it; the run stopped. Start it again "
                "to train from the beginning."
            ) from error
        raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)
        os.close(fd)
        for folder in created:  # a run refused before it wrote anything leaves no folder it made
            with contextlib.suppress(OSError):
                os.rmdir(folder)


def check_paths(path: str, files: Sequence[str], folders: Sequence[str] = RUN_FOLDERS) -> None:
    """Refuse, before a run's first step, a folder it could not write into: an entry where the run writes a folder
    (``folders``: ``checkpoints``) that is a file, or one where it writes a file (``files``) that is a folder; a
    folder it cannot write. The names are relative to ``path`` (or absolute: a model saved elsewhere)."""
    files = [os.path.join(path, name) for name in files]
    for entry in [os.path.join(path, name) for name in folders] + files:
        is_folder = entry not in files
        if os.path.lexists(entry) and os.path.isdir(entry) != is_folder:
            kind, other = ("a file", "its folder") if is_folder else ("a folder", "its file")
            raise OutputDirError(
                f"{entry} is {kind}, where the run writes {other} {os.path.basename(entry)}: move it away, or choose "
                "another --output-dir."
            )
    for folder in {path, *map(os.path.dirname, files)}:
        if os.path.isdir(folder) and not os.access(folder, os.W_OK | os.X_OK):
            raise OutputDirError(f"Cannot write into {folder} (permission denied). Choose another --output-dir.")


def read_json(path: str, fields: dict[str, type] | None = None) -> dict[str, Any]:
    """The JSON object a run wrote at ``path`` (``run.json``, ``metrics.json``), with ``fields`` of those types; one
    that does not read is an :class:`OutputDirError` naming it (a missing one an ``OSError``)."""
    with open(path, "rb") as file:
        data = file.read()
    try:
        value = json.loads(data)
        problem = None if isinstance(value, dict) else f"holds a {type(value).__name__}, not an object"
    except (ValueError, RecursionError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        problem = f"not JSON: {str(error).splitlines()[0] if str(error) else type(error).__name__}"
    for name, kind in (fields or {}).items():
        if problem is None and not isinstance(value.get(name), kind):
            problem = f"no {kind.__name__} {name!r}"
    if problem:
        raise OutputDirError(
            f"{path} is damaged ({problem}): restore it, remove it to have the run write it again, or start over "
            "with --overwrite."
        )
    return value


def mark_output(path: str, command: str) -> None:
    """Create ``path`` if needed and write the marker (which ``command`` wrote it); remove the temporary files
    of run outputs that a killed run left (``.model.<random>.tmp.keras``, :mod:`keras_vit.files`)."""
    os.makedirs(path, exist_ok=True)
    _remove_temporaries(path)
    write_json(os.path.join(path, MARKER), {"command": command})


def clear_output(path: str) -> None:
    """Delete what runs write in ``path`` (:data:`RUN_FILES`); refuse a non-empty folder that is not a run's."""
    if not _entries(path):
        return
    check_usable(path, overwrite=True)
    _remove_temporaries(path)
    for name in RUN_FILES:
        entry = os.path.join(path, name)
        if os.path.isdir(entry) and not os.path.islink(entry):
            shutil.rmtree(entry)
        elif os.path.lexists(entry):
            os.remove(entry)


def _remove_temporaries(path: str) -> None:
    for name in os.listdir(path):
        if temporary_target(name) in RUN_FILES and os.path.isfile(os.path.join(path, name)):
            os.remove(os.path.join(path, name))


def start_parent(setup: Setup, command: str, files: Sequence[str] = ()) -> None:
    """Clear (``overwrite``) and mark the output folder of a command whose runs go to its sub-folders (``pretrain``,
    ``ablation``), checking that it can write its own ``files`` there."""
    if setup.chief:
        out = setup.config.run.output_dir
        if setup.config.run.overwrite:
            clear_output(out)
        else:
            check_usable(out)
        check_paths(out, [MARKER, *files], folders=())
        mark_output(out, command)
