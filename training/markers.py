"""The marker a run writes in its folder (:data:`MARKER`: a run folder is not a class of images) and the refusal of a
run folder inside the image folder (:func:`check_outside_dataset`)."""

from __future__ import annotations

import os

from keras_vit.training.errors import OutputDirError

__all__ = ["MARKER", "check_outside_dataset", "is_run_folder"]

MARKER = ".keras_vit_run"


def is_run_folder(path: str) -> bool:
    """Whether ``path`` holds a run's marker (or the ``run.json`` of a run older than the marker)."""
    return any(os.path.isfile(os.path.join(path, name)) for name in (MARKER, "run.json"))


def check_outside_dataset(path: str, dataset: str | None) -> None:
    """Refuse an output folder ``path`` inside (or equal to) the image folder ``dataset``: its next listing would
    take the run folder for a class (``OutputDirError`` naming both). A TFDS name or no dataset passes."""
    if not dataset or not os.path.isdir(dataset):
        return
    root, out = os.path.realpath(dataset), os.path.realpath(path)
    if os.path.commonpath([root, out]) == root:
        raise OutputDirError(
            f"--output-dir {path} is inside --dataset {dataset}: the run's folder would be listed as a class of "
            "images. Choose an --output-dir outside the dataset."
        )
