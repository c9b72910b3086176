"""Labelled image sources: scikit-learn's digits (offline), an image folder, or any TFDS dataset.

A source has a training and a held-out :class:`Split`. Splits of in-memory images and of image files
have random access, so the training stream can restart at any step exactly (see ``pipeline``); TFDS
splits are streams.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import urllib.parse
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tensorflow as tf

from keras_vit import datasets
from keras_vit.training.errors import CorruptDataError, warn
from keras_vit.training.sharding import WHOLE, Shard, part_range

__all__ = [
    "FOLDER_EVAL_NAMES",
    "IMAGE_EXTENSIONS",
    "IMAGE_FORMATS",
    "TFDS_EVAL_SPLITS",
    "Source",
    "Split",
    "check_images",
    "decode_image",
    "image_problem",
    "load_digits",
    "load_folder",
    "load_source",
    "load_tfds",
]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp")
IMAGE_FORMATS = ("JPEG", "PNG", "BMP", "GIF", "WEBP")  # what tf.io.decode_image reads (PIL's names)
NAMED = 10  # bad files named in a message
FOLDER_EVAL_NAMES = ("val", "validation", "test")
# Held-out split per TFDS dataset where it is not "test" (ImageNet's test labels are not public).
TFDS_EVAL_SPLITS = {"imagenet2012": "validation", "imagenet_v2": "test", "imagenet2012_real": "validation"}


@dataclasses.dataclass(frozen=True)
class Split:
    """One split of ``(image uint8 (H, W, 3), label int)`` examples.

    ``items`` holds the images themselves (``(N, H, W, 3)`` uint8) or their file paths (``(N,)`` str)
    and gives random access; otherwise ``stream`` is a finite ``tf.data.Dataset`` in a fixed order,
    of encoded images (JPEG/PNG bytes, decoded after shuffling, to keep shuffle buffers small) when
    ``encoded``, and ``parts(index, count)`` reads part ``index`` of ``count`` of it alone (TFDS' even splits).
    """

    num_examples: int | None
    items: np.ndarray | None = None
    labels: np.ndarray | None = None
    stream: tf.data.Dataset | None = None
    encoded: bool = False
    parts: Callable[[int, int], tf.data.Dataset] | None = None

    @property
    def indexable(self) -> bool:
        return self.items is not None

    def loader(self) -> Callable:
        """``index -> (image, label)`` as TensorFlow ops (indexable splits only)."""
        if not self.indexable:
            raise ValueError("This split is a stream; it has no random access.")
        items, labels = tf.constant(self.items), tf.constant(self.labels, tf.int64)
        if items.dtype == tf.string:
            return lambda i: (decode_image(tf.io.read_file(items[i])), labels[i])
        return lambda i: (items[i], labels[i])

    def part(self, index: int, count: int) -> tf.data.Dataset:
        """The stream's part ``index`` of ``count`` (:func:`~keras_vit.training.sharding.part_range`), once, in a
        fixed order, as stored (streams only)."""
        if count == 1:
            return self.stream
        if self.parts is None:
            raise ValueError("This stream cannot be read in parts; train on one worker with --input-shards 1.")
        return self.parts(index, count)

    def examples(self, index: int = 0, count: int = 1) -> tf.data.Dataset:
        """All examples (of part ``index`` of ``count``) once, in a fixed order, decoded."""
        if self.indexable:
            start, stop = part_range(self.num_examples, index, count)
            return tf.data.Dataset.range(start, stop).map(self.loader(), num_parallel_calls=tf.data.AUTOTUNE)
        stream = self.part(index, count)
        return stream.map(self.decode, num_parallel_calls=tf.data.AUTOTUNE) if self.encoded else stream

    @staticmethod
    def decode(image: tf.Tensor, label: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """An encoded stream example -> ``(image uint8 (H, W, 3), label)``."""
        return decode_image(image), label


@dataclasses.dataclass(frozen=True)
class Source:
    """A dataset: its name, classes, a training split and a held-out split."""

    name: str
    num_classes: int
    train: Split
    eval: Split
    eval_split: str
    class_names: tuple[str, ...] = ()


def decode_image(data: tf.Tensor) -> tf.Tensor:
    """Encoded bytes (JPEG, PNG, BMP, GIF's first frame, WebP) -> ``(H, W, 3)`` uint8."""
    image = tf.io.decode_image(data, channels=3, expand_animations=False)
    image.set_shape([None, None, 3])
    return image


def load_digits(eval_fraction: float = 0.2, seed: int = 0) -> Source:
    """scikit-learn's 1797 handwritten digits (8x8, 17 grey levels; shipped inside scikit-learn).

    The images of :func:`keras_vit.datasets.load_digits` as uint8 RGB; ``eval_fraction`` of each class held
    out by :func:`keras_vit.datasets.stratified_split` (359 of 1797 images by default).
    """
    grey, labels = datasets.load_digits()
    images = np.repeat(grey[..., None], 3, axis=-1)
    train, held = datasets.stratified_split(labels, eval_fraction, seed)
    return Source(
        name="digits",
        num_classes=10,
        train=Split(len(train), images[train], labels[train]),
        eval=Split(len(held), images[held], labels[held]),
        eval_split=f"held-out {eval_fraction:.0%}",
        class_names=tuple(str(d) for d in range(10)),
    )


def image_problem(path: str) -> str | None:
    """Why the image file ``path`` would not decode (``None`` if it does): read in full, JPEGs at 1/8 scale."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            if image.format not in IMAGE_FORMATS:
                return f"a {image.format} image, not one of {', '.join(IMAGE_FORMATS)}"
            image.draft("RGB", (1, 1))  # JPEG: decode at the smallest scale, still reading every byte
            image.load()
    except UnidentifiedImageError:
        return "not an image"
    except (OSError, ValueError, SyntaxError) as error:  # PIL: truncated or malformed data
        return str(error) or type(error).__name__
    return None


def check_images(
    paths: Sequence[str],
    skip: bool = False,
    shard: Shard = WHOLE,
    gather: Callable[[np.ndarray], np.ndarray] | None = None,
) -> np.ndarray:
    """Decode every file (in threads); the mask of those that decode. Bad files raise :class:`CorruptDataError`
    naming them, or with ``skip`` are left out with a warning naming them.

    Several workers: this one decodes only its part ``shard`` of the files (:func:`~keras_vit.training.sharding.
    part_range`), and ``gather`` (``gather_over_workers``) collects what every worker found, so that all agree.
    """
    start, stop = part_range(len(paths), shard.index, shard.count)
    with ThreadPoolExecutor(min(16, os.cpu_count() or 1)) as pool:
        problems = dict(zip(range(start, stop), pool.map(image_problem, paths[start:stop])))
    found = [i for i, problem in problems.items() if problem]
    everywhere = found if gather is None else _gather_indices(found, gather)
    good = np.ones(len(paths), bool)
    good[everywhere] = False
    if everywhere:
        bad = [f"{paths[i]} ({problems[i]})" for i in found]
        named = "; ".join(bad[:NAMED]) + (f"; and {len(bad) - NAMED} more" if len(bad) > NAMED else "")
        if len(everywhere) > len(found):
            named += f"{'; ' if found else ''}{len(everywhere) - len(found)} found by the other workers"
        if not skip:
            raise CorruptDataError(
                f"{len(everywhere)} of {len(paths)} image files do not decode: {named}. Fix or remove "
                "them, or leave them out with --skip-corrupt."
            )
        warn(f"skipping {len(everywhere)} of {len(paths)} image files that do not decode (--skip-corrupt): {named}")
    return good


def _gather_indices(indices: list[int], gather: Callable[[np.ndarray], np.ndarray]) -> list[int]:
    """Every worker's ``indices``, sorted: their counts first, then the lists padded to the longest."""
    width = int(gather(np.array([len(indices)])).max())
    if not width:
        return []
    padded = np.full(width, -1, np.int64)
    padded[: len(indices)] = indices
    return sorted({int(i) for i in gather(padded).ravel() if i >= 0})


def _list_classes(root: str, skip_corrupt: bool = False, **checking) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The class folders of ``root`` (hidden ones are not classes), their image files and labels; ``checking``:
    :func:`check_images`' ``shard`` and ``gather``."""
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)) and not d.startswith("."))
    paths, labels = [], []
    for label, name in enumerate(classes):
        folder = os.path.join(root, name)
        files = [f for f in sorted(os.listdir(folder)) if f.lower().endswith(IMAGE_EXTENSIONS)]
        paths += [os.path.join(folder, f) for f in files]
        labels += [label] * len(files)
    paths, labels = np.array(paths, dtype=str), np.array(labels, np.int64)
    good = check_images(paths.tolist(), skip_corrupt, **checking)
    paths, labels = paths[good], labels[good]
    empty = [os.path.join(root, c) for c, n in zip(classes, np.bincount(labels, minlength=len(classes))) if not n]
    if empty:
        raise ValueError(
            f"Class folders without images ({', '.join(IMAGE_EXTENSIONS)} that decode): "
            f"{', '.join(empty)}; add images or remove the folders."
        )
    return classes, paths, labels


def load_folder(root: str, eval_fraction: float = 0.1, seed: int = 0, skip_corrupt: bool = False, **checking) -> Source:
    """Images in ``root/<class>/*.jpg|png|...``, one sub-folder per class (sorted names -> labels).

    If ``root`` has ``train/`` and one of ``val/``, ``validation/``, ``test/``, those are the splits;
    otherwise ``eval_fraction`` of each class is held out (seeded). Every file is decoded first
    (:func:`check_images`; ``checking``: its ``shard`` and ``gather``, for a worker of several): one that does
    not decode is an error naming it, or with ``skip_corrupt`` left out. A class folder without images is an
    error naming it.
    """
    if not os.path.isdir(root):
        raise ValueError(f"Image folder {root!r} does not exist.")
    eval_dir = next((os.path.join(root, n) for n in FOLDER_EVAL_NAMES if os.path.isdir(os.path.join(root, n))), None)
    if os.path.isdir(os.path.join(root, "train")) and eval_dir is not None:
        classes, paths, labels = _list_classes(os.path.join(root, "train"), skip_corrupt, **checking)
        eval_classes, eval_paths, eval_labels = _list_classes(eval_dir, skip_corrupt, **checking)
        if eval_classes != classes:
            raise ValueError(f"{eval_dir} has classes {eval_classes}, but {root}/train has {classes}.")
        train_split = Split(len(paths), paths, labels)
        eval_split, eval_name = Split(len(eval_paths), eval_paths, eval_labels), os.path.basename(eval_dir)
    else:
        classes, paths, labels = _list_classes(root, skip_corrupt, **checking)
        train, held = datasets.stratified_split(labels, eval_fraction, seed)
        train_split = Split(len(train), paths[train], labels[train])
        eval_split, eval_name = Split(len(held), paths[held], labels[held]), f"held-out {eval_fraction:.0%}"
    if len(classes) < 2 or train_split.num_examples == 0 or eval_split.num_examples == 0:
        raise ValueError(
            f"Image folder {root!r} needs at least two class sub-folders with images ({IMAGE_EXTENSIONS}) "
            f"and images to hold out; found classes {classes} with {len(paths)} images."
        )
    return Source(
        os.path.basename(os.path.normpath(root)), len(classes), train_split, eval_split, eval_name, tuple(classes)
    )


def unresolvable_host(urls) -> str | None:
    """The first host of ``urls`` whose name does not resolve, or None when all do."""
    for host in sorted({urllib.parse.urlsplit(url).hostname for url in urls} - {None}):
        try:
            socket.getaddrinfo(host, None)
        except socket.gaierror:
            return host
    return None


def load_tfds(
    name: str,
    *,
    data_dir: str | None = None,
    manual_dir: str | None = None,
    train_split: str = "train",
    eval_split: str | None = None,
    download: bool = True,
    seed: int = 0,
) -> Source:
    """A ``tensorflow_datasets`` dataset with ``image`` and ``label`` features.

    ``manual_dir`` is where manually downloaded archives are (ImageNet); ``eval_split`` defaults to
    ``validation`` for ImageNet and ``test`` otherwise.
    """
    import tensorflow_datasets as tfds

    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError as error:
        raise ValueError(f"Unknown dataset {name!r}: not a TFDS dataset nor an existing folder.") from error
    features = builder.info.features
    if "image" not in features or "label" not in features:
        raise ValueError(f"TFDS dataset {name!r} has no 'image' and 'label' features.")
    if download and not builder.is_prepared():
        host = unresolvable_host(builder.url_infos or {})
        if host is not None:  # offline: say so at once, not after TFDS' minutes of retries
            raise ConnectionError(
                f"cannot download TFDS dataset {name!r}: {host} does not resolve (no network?). Prepare it where "
                f"there is one (tfds build {name.split(':')[0]}) and pass --data-dir, or train on an image folder."
            )
        config = tfds.download.DownloadConfig(manual_dir=manual_dir) if manual_dir else None
        builder.download_and_prepare(download_config=config)
    eval_split = eval_split or TFDS_EVAL_SPLITS.get(name.split(":")[0].split("/")[0], "test")

    def read(split_name, shuffle: bool) -> tf.data.Dataset:  # a split's name, or one of its even splits
        stream = builder.as_dataset(
            split=split_name,
            as_supervised=True,
            shuffle_files=shuffle,
            read_config=tfds.ReadConfig(shuffle_seed=seed),
            decoders={"image": tfds.decode.SkipDecoding()},
        )
        return stream.map(lambda image, label: (image, tf.cast(label, tf.int64)))

    def split(split_name: str, shuffle: bool) -> Split:
        try:
            count = builder.info.splits[split_name].num_examples
        except (KeyError, ValueError):
            count = None

        def parts(index: int, total: int) -> tf.data.Dataset:  # opens only the files of its part
            return read(tfds.even_splits(split_name, total)[index], shuffle)

        return Split(count or None, stream=read(split_name, shuffle), encoded=True, parts=parts)

    return Source(
        name,
        features["label"].num_classes,
        split(train_split, True),
        split(eval_split, False),
        eval_split,
        tuple(features["label"].names),
    )


def load_source(
    dataset: str | None,
    *,
    data_dir: str | None = None,
    manual_dir: str | None = None,
    train_split: str = "train",
    eval_split: str | None = None,
    eval_fraction: float | None = None,
    download: bool = True,
    seed: int = 0,
    skip_corrupt: bool = False,
    shard: Shard = WHOLE,
    gather: Callable[[np.ndarray], np.ndarray] | None = None,
) -> Source:
    """``None`` or ``"digits"``: the offline digits; an existing folder: an image folder (``skip_corrupt``,
    ``shard``, ``gather``: see :func:`load_folder`); else a TFDS name."""
    if dataset in (None, "digits"):
        return load_digits(eval_fraction or 0.2, seed)
    if os.path.isdir(dataset):
        return load_folder(dataset, eval_fraction or 0.1, seed, skip_corrupt, shard=shard, gather=gather)
    if dataset.startswith((".", "~", os.sep)):
        raise ValueError(f"Image folder {dataset!r} does not exist.")
    return load_tfds(
        dataset,
        data_dir=data_dir,
        manual_dir=manual_dir,
        train_split=train_split,
        eval_split=eval_split,
        download=download,
        seed=seed,
    )
