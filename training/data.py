"""Labelled image sources: scikit-learn's digits (offline), an image folder, or any TFDS dataset (a stream)."""

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
from keras_vit.images import IMAGE_EXTENSIONS, image_problem, read_image
from keras_vit.training.config import check_dataset
from keras_vit.training.distributed.sharding import WHOLE, Shard, part_range
from keras_vit.training.errors import CorruptDataError, warn
from keras_vit.training.markers import MARKER, is_run_folder

__all__ = [
    "FOLDER_EVAL_NAMES",
    "IMAGE_EXTENSIONS",
    "TFDS_EVAL_SPLITS",
    "Source",
    "Split",
    "check_images",
    "decode_image",
    "image_file",
    "image_problem",
    "load_digits",
    "load_folder",
    "load_source",
    "load_tfds",
]

NAMED = 10  # bad files named in a message
FOLDER_EVAL_NAMES = ("val", "validation", "test")
# Held-out split per TFDS dataset where it is not "test" (ImageNet's test labels are not public).
TFDS_EVAL_SPLITS = {"imagenet2012": "validation", "imagenet_v2": "test", "imagenet2012_real": "validation"}


@dataclasses.dataclass(frozen=True)
class Split:
    """One split of ``(image uint8 (H, W, 3), label int)`` examples: ``items`` (images or file paths, random
    access), else ``stream`` (a finite ``tf.data.Dataset``, of encoded images when ``encoded``)."""

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
            return lambda i: (image_file(items[i]), labels[i])
        return lambda i: (items[i], labels[i])

    def part(self, index: int, count: int) -> tf.data.Dataset:
        """The stream's part ``index`` of ``count`` (``sharding.part_range``), once, in a fixed order, as stored
        (streams only)."""
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
    class_names: tuple[str, ...] | None = None  # in label order


def decode_image(data: tf.Tensor) -> tf.Tensor:
    """Encoded bytes (JPEG, PNG, BMP, GIF's first frame, WebP) -> ``(H, W, 3)`` uint8."""
    image = tf.io.decode_image(data, channels=3, expand_animations=False)
    image.set_shape([None, None, 3])
    return image


def image_file(path: tf.Tensor) -> tf.Tensor:
    """An image file's path -> ``(H, W, 3)`` uint8, read by :func:`keras_vit.images.read_image` as ``predict`` and the
    analyses read it (EXIF orientation applied, 16 bits scaled)."""
    image = tf.numpy_function(lambda name: read_image(name.decode()), [path], tf.uint8, stateful=False)
    image.set_shape([None, None, 3])
    return image


def load_digits(eval_fraction: float = 0.2, seed: int = 0) -> Source:
    """scikit-learn's 1797 digits as uint8 RGB, ``eval_fraction`` of each class held out (359 by default)."""
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


def check_images(
    splits: Sequence[tuple[Sequence[str] | np.ndarray, int]],
    skip: bool = False,
    shard: Shard = WHOLE,
    gather: Callable[[np.ndarray], np.ndarray] | None = None,
) -> list[np.ndarray]:
    """Per split ``(paths, parts)``, the mask of the files that decode (decoded in threads); bad files raise
    :class:`CorruptDataError` naming them, or with ``skip`` are left out with a warning. Several workers: each
    checks its own span, and ``gather`` makes them agree."""
    listing = [path for paths, _ in splits for path in paths]
    problems: dict[int, str | None] = {}  # listing index -> why it does not decode (None: it does)
    bad: set[int] = set()
    with ThreadPoolExecutor(min(16, os.cpu_count() or 1)) as pool:
        while True:
            todo = [i for i in _spans(splits, bad, shard) if i not in problems]
            problems.update(zip(todo, pool.map(image_problem, [listing[i] for i in todo])))
            found = [i for i in todo if problems[i]]
            new = set(found if gather is None else _gather_indices(found, gather))
            bad |= new
            if not new or not skip:
                break
    if bad:
        named = [f"{listing[i]} ({problems[i]})" for i in sorted(bad) if problems.get(i)]
        text = "; ".join(named[:NAMED]) + (f"; and {len(named) - NAMED} more" if len(named) > NAMED else "")
        if len(bad) > len(named):
            text += f"{'; ' if named else ''}{len(bad) - len(named)} found by the other workers"
        if not skip:
            raise CorruptDataError(
                f"{len(bad)} of {len(listing)} image files do not decode: {text}. Fix or remove "
                "them, or leave them out with --skip-corrupt."
            )
        warn(f"skipping {len(bad)} of {len(listing)} image files that do not decode (--skip-corrupt): {text}")
    good = np.array([i not in bad for i in range(len(listing))], bool)
    ends = np.cumsum([len(paths) for paths, _ in splits])
    return np.split(good, ends[:-1])


def _spans(splits: Sequence[tuple[Sequence[str] | np.ndarray, int]], bad: set[int], shard: Shard) -> list[int]:
    """The listing indices (splits one after the other) of the files this worker reads once ``bad`` are left out."""
    mine, offset = [], 0
    for paths, parts in splits:
        kept = [offset + i for i in range(len(paths)) if offset + i not in bad]
        start, stop = shard.span(len(kept), parts)
        mine += kept[start:stop]
        offset += len(paths)
    return mine


def _gather_indices(indices: list[int], gather: Callable[[np.ndarray], np.ndarray]) -> list[int]:
    """Every worker's ``indices``, sorted: their counts first, then the lists padded to the longest."""
    width = int(gather(np.array([len(indices)])).max())
    if not width:
        return []
    padded = np.full(width, -1, np.int64)
    padded[: len(indices)] = indices
    return sorted({int(i) for i in gather(padded).ravel() if i >= 0})


def _refuse_one_as_two(first: str, second: str, real: str, kind: str) -> None:
    """A ``ValueError`` when ``first`` and ``second``, listed in two classes, are the one ``kind`` ``real``."""
    if first != second:
        raise ValueError(
            f"{first} and {second} are one {kind} ({real}, reached through a symbolic link) listed in two classes: "
            f"{'its images' if kind == 'folder' else 'it'} would train under two labels. Remove the link, or give "
            "each class its own images."
        )


def _require_images(root: str, classes: Sequence[str], labels: np.ndarray) -> None:
    """A ``ValueError`` naming the class folders of ``root`` that ``labels`` has no image of."""
    empty = [os.path.join(root, c) for c, n in zip(classes, np.bincount(labels, minlength=len(classes))) if not n]
    if empty:
        raise ValueError(
            f"Class folders without images ({', '.join(IMAGE_EXTENSIONS)} that decode): "
            f"{', '.join(empty)}; add images or remove the folders."
        )


def _class_images(folder: str, real: str, seen: dict[str, str]) -> list[str]:
    """The image files of the class folder ``folder`` (real path ``real``), sorted; ``seen`` maps the real path of
    every class's file listed so far to it, and gains these. A ``ValueError`` for a file another class listed."""
    with os.scandir(folder) as listing:
        entries = sorted((e for e in listing if e.name.lower().endswith(IMAGE_EXTENSIONS)), key=lambda e: e.name)
    for entry in entries:  # only a link needs resolving: another file's real path is its folder's and its name
        target = os.path.realpath(entry.path) if entry.is_symlink() else os.path.join(real, entry.name)
        first = seen.setdefault(target, entry.path)
        if os.path.dirname(first) != folder:
            _refuse_one_as_two(first, entry.path, target, "file")
    return [entry.path for entry in entries]


def _list_classes(root: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The class folders of ``root`` (not hidden ones nor keras-vit run folders, named in a warning), their image
    files and labels. A ``ValueError`` when two class folders, or two files of two classes, are one (linked)."""
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)) and not d.startswith("."))
    runs = [name for name in classes if is_run_folder(os.path.join(root, name))]
    if runs:  # an --output-dir once put inside the dataset (an older keras-vit allowed it)
        named = ", ".join(os.path.join(root, name) for name in runs)
        warn(f"leaving out {named}: a keras-vit run folder ({MARKER}), not a class of images")
        classes = [name for name in classes if name not in runs]
    paths, found_labels = [], []
    folders: dict[str, str] = {}  # real path -> the class folder listed
    files: dict[str, str] = {}  # the same for the image files
    for label, name in enumerate(classes):
        folder = os.path.join(root, name)
        real = os.path.realpath(folder)
        _refuse_one_as_two(folders.setdefault(real, folder), folder, real, "folder")
        found = _class_images(folder, real, files)
        paths += found
        found_labels += [label] * len(found)
    labels = np.array(found_labels, np.int64)
    _require_images(root, classes, labels)
    return classes, np.array(paths, dtype=str), labels


def load_folder(
    root: str,
    eval_fraction: float = 0.1,
    seed: int = 0,
    skip_corrupt: bool = False,
    shard: Shard = WHOLE,
    input_shards: int | None = None,
    gather: Callable[[np.ndarray], np.ndarray] | None = None,
) -> Source:
    """Images in ``root/<class>/*``, one sub-folder per class (sorted names -> labels); ``train/`` and ``val/``
    (``validation/``, ``test/``) are the splits, else ``eval_fraction`` of each class is held out. Every file is
    decoded first (:func:`check_images`); a class folder without images is a ``ValueError`` naming it."""
    if not os.path.isdir(root):
        raise ValueError(f"Image folder {root!r} does not exist.")
    eval_dir = next((os.path.join(root, n) for n in FOLDER_EVAL_NAMES if os.path.isdir(os.path.join(root, n))), None)
    folders: tuple[str, ...]
    if os.path.isdir(os.path.join(root, "train")) and eval_dir is not None:
        train_dir = os.path.join(root, "train")
        (classes, paths, labels), (eval_classes, eval_paths, eval_labels) = map(_list_classes, (train_dir, eval_dir))
        if eval_classes != classes:
            raise ValueError(f"{eval_dir} has classes {eval_classes}, but {root}/train has {classes}.")
        folders, eval_name = (train_dir, eval_dir), os.path.basename(eval_dir)
    else:
        classes, listed, listed_labels = _list_classes(root)
        train, held = datasets.stratified_split(listed_labels, eval_fraction, seed)
        paths, labels, eval_paths, eval_labels = listed[train], listed_labels[train], listed[held], listed_labels[held]
        folders, eval_name = (root,), f"held-out {eval_fraction:.0%}"
    parts = (input_shards or shard.count, shard.count)
    good, eval_good = check_images(list(zip((paths, eval_paths), parts)), skip_corrupt, shard, gather)
    paths, labels, eval_paths, eval_labels = paths[good], labels[good], eval_paths[eval_good], eval_labels[eval_good]
    kept = (labels, eval_labels) if len(folders) == 2 else (np.concatenate([labels, eval_labels]),)
    for folder, folder_labels in zip(folders, kept):  # a class left without images that decode
        _require_images(folder, classes, folder_labels)
    if len(classes) < 2 or len(paths) == 0 or len(eval_paths) == 0:
        raise ValueError(
            f"Image folder {root!r} needs at least two class sub-folders with images ({IMAGE_EXTENSIONS}) "
            f"and images to hold out; found classes {classes} with {len(paths) + len(eval_paths)} images."
        )
    training, held_out = Split(len(paths), paths, labels), Split(len(eval_paths), eval_paths, eval_labels)
    return Source(os.path.basename(os.path.normpath(root)), len(classes), training, held_out, eval_name, tuple(classes))


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
    """A TFDS dataset with ``image`` and ``label`` features (``eval_split``: ``validation`` for ImageNet, else
    ``test``)."""
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
        tuple(features["label"].names) or None,
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
    input_shards: int | None = None,
    gather: Callable[[np.ndarray], np.ndarray] | None = None,
) -> Source:
    """``None`` or ``"digits"``: the offline digits; an existing folder: an image folder (``skip_corrupt``,
    ``shard``, ``input_shards``, ``gather``: see :func:`load_folder`); else a TFDS name. A file is refused."""
    if dataset in (None, "digits"):
        return load_digits(eval_fraction or 0.2, seed)
    check_dataset(dataset)
    if os.path.isdir(dataset):
        return load_folder(dataset, eval_fraction or 0.1, seed, skip_corrupt, shard, input_shards, gather)
    return load_tfds(
        dataset,
        data_dir=data_dir,
        manual_dir=manual_dir,
        train_split=train_split,
        eval_split=eval_split,
        download=download,
        seed=seed,
    )
