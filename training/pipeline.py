"""tf.data pipelines: training augmentation and evaluation preprocessing, ending in [-1, 1] images.

The pipelines are tf.data on every Keras backend (as Keras recommends for JAX and torch too): their maps use
TensorFlow ops, Keras' preprocessing layers (``RandAugment``, ``MixUp``, ``CutMix``) and
``keras_vit.preprocess_input``, which all switch to TensorFlow ops inside tf.data, never the backend's
``keras.ops``; ``model.fit`` turns the batches into the backend's arrays.

Training (per example): inception crop (a random box covering ``crop_area`` of the image, aspect
3/4..4/3, resized to the output size) or a plain resize, a random horizontal flip, optionally Keras'
``RandAugment``; then per batch optionally Keras' ``MixUp`` / ``CutMix`` (one of the two per batch
when both are on). Evaluation: resize, or resize to ``size / eval_crop`` and crop the centre.

The training stream is a function of ``(seed, start_step)``: each example's crop and flip use
stateless random ops keyed by its position in the stream, and splits with random access are
shuffled per epoch by a stateless permutation, so a run restarted at step ``s`` sees exactly the
batches an uninterrupted run sees from step ``s`` on. TFDS streams restart with a fresh shuffle.

Sharding across the workers of a multi-worker run (:func:`distribute_options`): the auto-shard policy is
``DATA`` for every source. Every worker builds the same stream of global batches and keeps its share of
each (TensorFlow rebatches a global batch into per-replica parts and each worker takes its own): no
example is seen twice in a step or an epoch, and the batches are those of a single process, so a
multi-worker run equals a one-process run and restarts exactly. ``FILE`` (each worker reads its own
files) cannot shard these streams: the stream position is zipped from a ``range`` source, which file
sharding cannot split, and small TFDS datasets have fewer files than workers (cifar10: one per split);
the price of ``DATA`` is that every worker reads and augments the whole stream.
"""

from __future__ import annotations

import dataclasses
import math

import keras
import tensorflow as tf

from keras_vit import preprocess_input
from keras_vit.training.data import Split

__all__ = [
    "Augment",
    "distribute_options",
    "eval_dataset",
    "eval_transform",
    "inception_crop",
    "resize",
    "train_dataset",
    "train_transform",
]

AUTOTUNE = tf.data.AUTOTUNE


@dataclasses.dataclass(frozen=True)
class Augment:
    """What the pipelines do to images; see the module docstring."""

    image_size: int
    crop_area: tuple[float, float] | None = (0.05, 1.0)
    flip: bool = True
    randaugment: tuple[int, float] | None = None  # (num_ops, factor) of keras.layers.RandAugment
    mixup: float = 0.0  # alpha of keras.layers.MixUp; 0 = off
    cutmix: float = 0.0  # factor of keras.layers.CutMix; 0 = off
    eval_crop: float = 1.0

    def __post_init__(self):
        if self.crop_area is not None and not 0 < self.crop_area[0] <= self.crop_area[1] <= 1:
            raise ValueError(f"crop_area must satisfy 0 < low <= high <= 1, got {self.crop_area}.")
        if not 0 < self.eval_crop <= 1:
            raise ValueError(f"eval_crop must be in (0, 1], got {self.eval_crop}.")
        if self.mixup < 0 or self.cutmix < 0:
            raise ValueError(f"mixup and cutmix must be >= 0, got {self.mixup} and {self.cutmix}.")


def distribute_options() -> tf.data.Options:
    """The options of every pipeline: ``DATA`` auto-sharding across workers (see the module docstring)."""
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return options


def inception_crop(image: tf.Tensor, seed: tf.Tensor, area: tuple[float, float]) -> tf.Tensor:
    """A random crop covering ``area`` (fraction range) of the image with aspect ratio 3/4..4/3."""
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.shape(image),
        bounding_boxes=tf.zeros([0, 0, 4]),
        seed=seed,
        min_object_covered=0.0,
        aspect_ratio_range=(3 / 4, 4 / 3),
        area_range=area,
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    crop = tf.slice(image, begin, size)
    crop.set_shape([None, None, image.shape[-1]])
    return crop


def resize(image: tf.Tensor, size: int) -> tf.Tensor:
    """Bilinear resize to ``size x size``, float32 in [0, 255]."""
    return tf.image.resize(tf.cast(image, tf.float32), (size, size), method="bilinear")


def eval_transform(image: tf.Tensor, augment: Augment) -> tf.Tensor:
    """Resize (and centre-crop when ``eval_crop < 1``) to the model's size, float32 in [0, 255]."""
    size = augment.image_size
    if augment.eval_crop == 1.0:
        return resize(image, size)
    larger = math.ceil(size / augment.eval_crop)
    offset = (larger - size) // 2
    return resize(image, larger)[offset : offset + size, offset : offset + size]


def train_transform(image: tf.Tensor, seed: tf.Tensor, augment: Augment) -> tf.Tensor:
    """Crop (or resize) and flip one image with stateless randomness from ``seed`` (shape (2,))."""
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    if augment.crop_area is not None:
        image = inception_crop(image, crop_seed, augment.crop_area)
    image = resize(image, augment.image_size)
    if augment.flip:
        image = tf.image.stateless_random_flip_left_right(image, flip_seed)
    return image


def _stream_positions(split: Split, start: int, seed: int, shuffle_buffer: int) -> tf.data.Dataset:
    """``(position in the stream, image, label)`` from example number ``start`` on, forever."""
    positions = tf.data.Dataset.range(start, tf.int64.max)
    if split.indexable:
        n = split.num_examples

        def epoch_order(epoch):
            order = tf.random.experimental.stateless_shuffle(tf.range(n, dtype=tf.int64), seed=tf.stack([seed, epoch]))
            return tf.data.Dataset.from_tensor_slices(order)

        order = tf.data.Dataset.range(start // n, tf.int64.max).flat_map(epoch_order).skip(start % n)
        load = split.loader()
        return tf.data.Dataset.zip(positions, order).map(lambda p, i: (p, *load(i)), num_parallel_calls=AUTOTUNE)
    examples = split.stream.shuffle(shuffle_buffer, seed=(seed * 1_000_003 + start) % 2**31).repeat()
    decode = split.decode if split.encoded else lambda image, label: (image, label)
    return tf.data.Dataset.zip(positions, examples).map(lambda p, ex: (p, *decode(*ex)), num_parallel_calls=AUTOTUNE)


def _mixer(augment: Augment, seed: int):
    """Batch-level MixUp / CutMix on ``(images, one-hot labels)``, or ``None`` when both are off."""
    mixers = []
    if augment.mixup:
        mixers.append(keras.layers.MixUp(alpha=augment.mixup, seed=seed))
    if augment.cutmix:
        mixers.append(keras.layers.CutMix(factor=augment.cutmix, seed=seed + 1))
    if not mixers:
        return None

    def mix(images, labels):
        data = {"images": images, "labels": labels}
        if len(mixers) == 1:
            out = mixers[0](data)
        else:
            pick = tf.random.uniform([], seed=seed + 2) < 0.5
            out = tf.cond(pick, lambda: mixers[0](data), lambda: mixers[1](data))
        return out["images"], out["labels"]

    return mix


def train_dataset(
    split: Split,
    num_classes: int,
    batch_size: int,
    augment: Augment,
    *,
    start_step: int = 0,
    seed: int = 0,
    shuffle_buffer: int = 10_000,
) -> tf.data.Dataset:
    """Endless batches ``(images (B, S, S, 3) in [-1, 1], one-hot labels (B, classes))`` from ``start_step``."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
    randaugment = None
    if augment.randaugment is not None:
        num_ops, factor = augment.randaugment
        randaugment = keras.layers.RandAugment(value_range=(0, 255), num_ops=num_ops, factor=factor, seed=seed)

    def per_example(position, image, label):
        image = train_transform(image, tf.stack([tf.constant(seed, tf.int64), position]), augment)
        if randaugment is not None:
            image = randaugment(image)
        return image, tf.one_hot(label, num_classes)

    ds = _stream_positions(split, start_step * batch_size, seed, shuffle_buffer)
    ds = ds.map(per_example, num_parallel_calls=AUTOTUNE).batch(batch_size, drop_remainder=True)
    mix = _mixer(augment, seed)
    if mix is not None:
        ds = ds.map(mix, num_parallel_calls=AUTOTUNE)
    ds = ds.map(lambda x, y: (preprocess_input(x), y), num_parallel_calls=AUTOTUNE)
    return ds.prefetch(AUTOTUNE).with_options(distribute_options())


def eval_dataset(
    split: Split, num_classes: int, batch_size: int, augment: Augment, whole_batches: bool = False
) -> tf.data.Dataset:
    """The held-out split once: ``(images in [-1, 1], one-hot labels)`` batches.

    ``whole_batches`` (a TPU's static shapes, a keras.distribution that splits each batch into equal parts):
    every batch has ``batch_size`` examples and a weight per example, ``(images, labels, weights)``; the last
    batch is filled up with blank examples of weight 0, so every held-out image is scored once and no blank is.
    """
    ds = split.examples().map(
        lambda image, label: (preprocess_input(eval_transform(image, augment)), tf.one_hot(label, num_classes)),
        num_parallel_calls=AUTOTUNE,
    )
    if whole_batches:
        ds = ds.map(lambda x, y: (x, y, tf.constant(1.0)))
        blanks = ds.take(1).map(lambda x, y, w: (tf.zeros_like(x), tf.zeros_like(y), tf.constant(0.0)))
        # batch_size - 1 blanks fill any last partial batch; the blanks left over form a partial batch, dropped.
        ds = ds.concatenate(blanks.repeat(batch_size - 1))
    return ds.batch(batch_size, drop_remainder=whole_batches).prefetch(AUTOTUNE).with_options(distribute_options())
