"""Inputs for the analyses: image files or scikit-learn's samples, and few-shot datasets (``"digits"``,
``"PATH.npz"`` with ``images``/``labels`` and optional ``test_*``, ``"tfds:NAME"`` already on disk)."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
from PIL import Image

from keras_vit import datasets
from keras_vit.checks import check_choice
from keras_vit.files import npz_arrays, open_zip
from keras_vit.optional import require

__all__ = [
    "SAMPLE_IMAGES",
    "LabelledImages",
    "as_rgb",
    "check_fewshot_dataset",
    "load_fewshot_dataset",
    "resize_images",
    "sample_image",
]

SAMPLE_IMAGES = ("china.jpg", "flower.jpg")


def sample_image(name: str = "china.jpg") -> np.ndarray:
    """One of scikit-learn's bundled sample photographs, uint8 ``(H, W, 3)``."""
    from sklearn.datasets import load_sample_image

    return load_sample_image(check_choice(name, SAMPLE_IMAGES, "sample image"))


def as_rgb(image) -> np.ndarray:
    """An ``(h, w, 3)`` image from an RGB or grey one (``(h, w)`` or ``(h, w, 1)``)."""
    image = np.asarray(image)
    image = image[..., None] if image.ndim == 2 else image
    if image.ndim != 3 or image.shape[-1] not in (1, 3):
        raise ValueError(f"Expected (h, w, 3) or grey images, got shape {image.shape}.")
    return np.repeat(image, 3 // image.shape[-1], axis=-1)


def resize_images(images, image_size: int | tuple[int, int]) -> np.ndarray:
    """Centre-crop each image to the target aspect ratio and resize it (bilinear): uint8 ``(n, h, w, 3)``; grey
    images (``(h, w)`` or ``(h, w, 1)``) become RGB."""
    height, width = (image_size, image_size) if isinstance(image_size, int) else image_size
    out = []
    for image in map(as_rgb, images):
        h, w = image.shape[:2]
        crop_h, crop_w = min(h, round(w * height / width)), min(w, round(h * width / height))
        top, left = (h - crop_h) // 2, (w - crop_w) // 2
        crop = Image.fromarray(np.ascontiguousarray(image[top : top + crop_h, left : left + crop_w], dtype=np.uint8))
        out.append(np.asarray(crop.resize((width, height), Image.Resampling.BILINEAR)))
    return np.stack(out)


@dataclasses.dataclass
class LabelledImages:
    """A few-shot dataset: a training pool and held-out test examples (uint8 images, int labels);
    ``test_images`` is ``None`` when the source has one split only (then split it)."""

    images: np.ndarray
    labels: np.ndarray
    test_images: np.ndarray | None = None
    test_labels: np.ndarray | None = None


def check_fewshot_dataset(spec: str) -> None:
    """What :func:`load_fewshot_dataset` refuses from the spec alone, before anything is read: an unknown kind
    (``ValueError``), a ``.npz`` file that is not there (``FileNotFoundError``)."""
    if spec == "digits" or spec.startswith("tfds:"):
        return
    if not spec.endswith(".npz"):
        raise ValueError(f"Unknown few-shot dataset {spec!r}: expected 'digits', a .npz file or 'tfds:NAME'.")
    if not os.path.isfile(spec):
        raise FileNotFoundError(f"No dataset file {spec!r}.")


def load_fewshot_dataset(spec: str = "digits") -> LabelledImages:
    """Load a few-shot dataset from its spec (see the module docstring)."""
    check_fewshot_dataset(spec)
    if spec == "digits":
        return LabelledImages(*datasets.load_digits())
    if spec.startswith("tfds:"):
        return _load_tfds(spec[len("tfds:") :])
    return _load_npz(spec)


def _load_npz(path: str) -> LabelledImages:
    with open_zip(path, what="a readable .npz dataset") as archive:
        data = npz_arrays(archive)
    missing = {"images", "labels"} - set(data)
    if missing:
        raise ValueError(f"{path} lacks the arrays {sorted(missing)} (it has {sorted(data)}).")
    return LabelledImages(
        **{key: data[key] for key in ("images", "labels", "test_images", "test_labels") if key in data}
    )


def _load_tfds(name: str) -> LabelledImages:
    purpose = f"The few-shot set 'tfds:{name}'"
    require("tensorflow", purpose)  # TensorFlow Datasets reads through TensorFlow, whatever the Keras backend
    tfds = require("tensorflow_datasets", purpose)

    def split(which: str) -> tuple[np.ndarray, np.ndarray]:
        try:
            ds = tfds.load(name, split=which, as_supervised=True, download=False)
        except AssertionError as error:  # tfds's way of saying the data is not prepared
            raise FileNotFoundError(
                f"TensorFlow Datasets set {name!r} ({which}) is not prepared on disk: {error}"
            ) from None
        pairs = list(tfds.as_numpy(ds))
        if not pairs:
            raise ValueError(f"TensorFlow Datasets set {name!r} has an empty {which!r} split.")
        return np.stack([image for image, _ in pairs]), np.asarray([label for _, label in pairs], dtype=np.int64)

    return LabelledImages(*split("train"), *split("test"))
