"""Class names: ImageNet-1k and -21k (shipped, from timm 1.0.31), a model's own, or a label file; spelt as
keras.applications does (``"great_white_shark"``) or as WordNet does. See docs/weights.md."""

from __future__ import annotations

import functools
import gzip
import os
from collections.abc import Sequence
from importlib import resources
from typing import cast

import numpy as np

from keras_vit.checks import check_choice, check_names

__all__ = ["LABEL_SETS", "SPELLINGS", "class_names", "decode_predictions", "label_set", "read_label_file", "wnids"]

LABEL_SETS = {"imagenet1k": 1000, "imagenet21k": 21843}  # name -> number of classes
SPELLINGS = ("keras", "wordnet")  # keras.applications' names (great_white_shark), WordNet's (great white shark)


def _check(labels: str) -> str:
    return check_choice(labels, sorted(LABEL_SETS), "labels")


@functools.cache
def _rows(labels: str) -> tuple[tuple[str, str], ...]:
    """``(wnid, synonyms)`` per class, in head order."""
    data = resources.files("keras_vit").joinpath("data", f"{_check(labels)}.tsv.gz").read_bytes()
    lines = gzip.decompress(data).decode("utf-8").splitlines()
    return cast("tuple[tuple[str, str], ...]", tuple(tuple(line.split("\t", 1)) for line in lines))


def wnids(labels: str = "imagenet1k") -> list[str]:
    """The WordNet ids of ``labels`` (``"imagenet1k"`` or ``"imagenet21k"``), in head order."""
    return [wnid for wnid, _ in _rows(labels)]


def class_names(labels: str = "imagenet1k", *, synonyms: bool = False, spelling: str = "wordnet") -> list[str]:
    """Class names in head order: the first WordNet lemma (``"great white shark"``; ``spelling="keras"``:
    ``"great_white_shark"``, as keras.applications writes it), or all lemmas (``synonyms``: ``"tench, Tinca tinca"``,
    WordNet's spelling)."""
    if check_choice(spelling, SPELLINGS, "spelling") == "keras" and not synonyms:
        return [names.split(", ")[0].replace(" ", "_") for _, names in _rows(labels)]
    return [names if synonyms else names.split(", ")[0] for _, names in _rows(labels)]


def label_set(num_classes: int) -> str:
    """The label set of a head with ``num_classes`` outputs; a ``ValueError`` for other sizes."""
    for name, size in LABEL_SETS.items():
        if size == num_classes:
            return name
    known = ", ".join(f"{size} ({name})" for name, size in LABEL_SETS.items())
    raise ValueError(f"No class names for a head of {num_classes} classes; known sizes: {known}.")


def read_label_file(path: str | os.PathLike) -> tuple[str, ...]:
    """The class names of a text file, one a line in head order (blank lines skipped), as a training run writes
    them (``classes.txt``); a ``ValueError`` naming the file when it holds none or repeats one."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"No label file {path} (one class name a line).")
    with open(path, encoding="utf-8") as file:
        names = [line.strip() for line in file if line.strip()]
    try:
        return check_names(names, f"the class names of {path}")
    except ValueError as exc:
        raise ValueError(f"{exc} (a label file holds one class name a line)") from None


def decode_predictions(
    preds, top: int = 5, labels: str | Sequence[str] | None = None, spelling: str = "keras"
) -> list[list[tuple[str, str, float]]]:
    """Per image, the ``top`` classes as ``(id, name, score)``, best first (like ``keras.applications``); ``preds``
    ``(batch, classes)`` or ``(classes,)``; ``labels``: ``"imagenet1k"``, ``"imagenet21k"`` or names in head order
    (``None``: by the head's size); ``spelling="wordnet"``: ``"great white shark"``. See docs/weights.md."""
    import keras

    check_choice(spelling, SPELLINGS, "spelling")
    preds = np.asarray(keras.ops.convert_to_numpy(preds))
    if preds.ndim == 1:
        preds = preds[None]
    if preds.ndim != 2:
        raise ValueError(f"decode_predictions expects scores of shape (batch, classes), got {preds.shape}.")
    names: Sequence[str]  # the label set's list or the names given as a tuple
    if labels is None or isinstance(labels, str):
        labels = label_set(preds.shape[1]) if labels is None else _check(labels)
        ids, names = wnids(labels), class_names(labels, spelling=spelling)
    else:
        names = check_names(labels, "labels")
        ids = [str(index) for index in range(len(names))]
    if preds.shape[1] != len(names):
        what = labels if isinstance(labels, str) else f"the class names ({', '.join(names[:3])}, ...)"
        raise ValueError(f"{what} has {len(names)} classes but the scores have {preds.shape[1]}.")
    results = []
    for scores in preds:
        order = np.argsort(-scores, kind="stable")[:top]
        results.append([(ids[i], names[i], float(scores[i])) for i in order])
    return results
