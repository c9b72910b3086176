"""tf.data pipelines (on every Keras backend): training augmentation and evaluation preprocessing, ending in
[-1, 1] images. The training stream is a function of ``(seed, start_step, input_shards)`` (docs/training.md)."""

from __future__ import annotations

import dataclasses
import math

import keras
import numpy as np
import tensorflow as tf

from keras_vit import preprocess_input
from keras_vit.training.config import DataConfig, TrainConfig
from keras_vit.training.data import Split
from keras_vit.training.distributed.sharding import WHOLE, Shard, part_range

__all__ = [
    "Augment",
    "check_input_shards",
    "distribute_options",
    "eval_dataset",
    "eval_part_length",
    "eval_transform",
    "inception_crop",
    "resize",
    "train_dataset",
    "train_transform",
]

AUTOTUNE = tf.data.AUTOTUNE
FINETUNE_AUGMENT = DataConfig(crop_area=(0.05, 1.0), flip=True)  # the fine-tuning recipe's: crop and flip


@dataclasses.dataclass(frozen=True)
class Augment:
    """What the pipelines do to images of ``image_size``: the augmentation fields of ``data`` (checked there); unset,
    a crop area of ``(1, 1)`` or 0 RandAugment operations is off. Default: the fine-tuning recipe's crop and flips."""

    image_size: int
    data: DataConfig = FINETUNE_AUGMENT

    @classmethod
    def of(cls, config: TrainConfig) -> Augment:
        """The pipelines' settings of a resolved config."""
        return cls(config.model.image_size, config.data)

    @property
    def crop_area(self) -> tuple[float, float] | None:
        area = self.data.crop_area
        return None if area is None or tuple(area) == (1.0, 1.0) else tuple(area)

    @property
    def flip(self) -> bool:
        return bool(self.data.flip)

    @property
    def randaugment(self) -> tuple[int, float] | None:
        """``(num_ops, factor)`` of ``keras.layers.RandAugment``, or ``None``."""
        value = self.data.randaugment
        return tuple(value) if value and value[0] > 0 else None

    @property
    def mixup(self) -> float:
        return self.data.mixup or 0.0

    @property
    def cutmix(self) -> float:
        return self.data.cutmix or 0.0

    @property
    def eval_crop(self) -> float:
        return self.data.eval_crop or 1.0


def distribute_options() -> tf.data.Options:
    """The options of every pipeline: no auto-sharding by tf.distribute (a pipeline is already its worker's part)."""
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return options


def check_input_shards(batch_size: int, input_shards: int, shard: Shard, num_examples: int | None = None) -> int:
    """A ``ValueError`` unless ``input_shards`` parts divide the batch, divide over the ``shard.count`` workers and
    each hold an example; the worker's part of the batch."""
    local = shard.local_batch(batch_size)
    if input_shards < 1 or batch_size % input_shards or input_shards % shard.count:
        raise ValueError(
            f"--input-shards {input_shards} must divide the batch of {batch_size} and be a multiple of the "
            f"{shard.count} input workers."
        )
    if num_examples is not None and input_shards > num_examples:
        raise ValueError(f"--input-shards {input_shards} is more than the {num_examples} training examples.")
    return local


def eval_part_length(num_examples: int, batch_size: int, workers: int) -> int:
    """Examples and blanks each of ``workers`` evaluates: its part of the held-out split, the largest of which is
    ``ceil(num_examples / workers)``, filled up to whole batches of ``batch_size / workers``."""
    local = batch_size // workers
    largest = -(-num_examples // workers)  # ceiling divisions
    return -(-largest // local) * local


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


def _unit_stream(
    split: Split, unit: int, units: int, batch_size: int, start_step: int, seed: int, shuffle_buffer: int
) -> tf.data.Dataset:
    """Part ``unit`` of ``units``'s examples of every batch from ``start_step`` on, forever: ``(position in the
    stream, index)`` of a split with random access, else ``(position, image, label)`` as the stream stores them."""
    per_batch = batch_size // units
    first = start_step * per_batch  # this part's examples before start_step
    positions = tf.data.Dataset.range(first, tf.int64.max).map(
        lambda q: q // per_batch * batch_size + unit * per_batch + q % per_batch
    )
    if split.indexable:
        low, high = part_range(split.num_examples, unit, units)
        size = high - low

        def epoch_order(epoch):
            key = tf.stack([tf.constant(seed, tf.int64), epoch * units + unit])
            return tf.data.Dataset.from_tensor_slices(
                tf.random.experimental.stateless_shuffle(tf.range(low, high, dtype=tf.int64), seed=key)
            )

        order = tf.data.Dataset.range(first // size, tf.int64.max).flat_map(epoch_order).skip(first % size)
        return tf.data.Dataset.zip(positions, order)
    shuffle_seed = (seed * 1_000_003 + start_step * units + unit) % 2**31
    examples = split.part(unit, units).shuffle(max(1, shuffle_buffer // units), seed=shuffle_seed).repeat()
    return tf.data.Dataset.zip(positions, examples).map(lambda p, example: (p, *example))


def _stream_positions(
    split: Split, shard: Shard, units: int, batch_size: int, start_step: int, seed: int, shuffle_buffer: int
) -> tf.data.Dataset:
    """``(position in the stream, image, label)`` of the worker's slice of every batch from ``start_step`` on,
    forever: ``batch_size / units`` examples of each of its parts in turn (see the module docstring)."""
    streams = [_unit_stream(split, u, units, batch_size, start_step, seed, shuffle_buffer) for u in shard.parts(units)]
    stream = streams[0]
    if len(streams) > 1:
        turns = np.repeat(np.arange(len(streams), dtype=np.int64), batch_size // units)
        stream = tf.data.Dataset.choose_from_datasets(streams, tf.data.Dataset.from_tensor_slices(turns).repeat())
    if split.indexable:
        load = split.loader()
        return stream.map(lambda p, i: (p, *load(i)), num_parallel_calls=AUTOTUNE)
    decode = split.decode if split.encoded else lambda image, label: (image, label)
    return stream.map(lambda p, image, label: (p, *decode(image, label)), num_parallel_calls=AUTOTUNE)


def _randaugment(augment: Augment, seed: int) -> keras.layers.RandAugment | None:
    """Keras' RandAugment of ``augment`` on one channels-last image in [0, 255], or ``None`` when it is off."""
    if augment.randaugment is None:
        return None
    num_ops, factor = augment.randaugment
    return keras.layers.RandAugment(
        value_range=(0, 255), num_ops=num_ops, factor=factor, seed=seed, data_format="channels_last"
    )


def _mixer(augment: Augment, seed: int):
    """Batch-level MixUp / CutMix on ``(images, one-hot labels)``, or ``None`` when both are off."""
    mixers = []
    if augment.mixup:
        mixers.append(keras.layers.MixUp(alpha=augment.mixup, seed=seed, data_format="channels_last"))
    if augment.cutmix:
        mixers.append(keras.layers.CutMix(factor=augment.cutmix, seed=seed + 1, data_format="channels_last"))
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


# The pipelines' functions are TensorFlow ops without Python control flow on tensors: built inside do_not_convert,
# tf.data traces them as written instead of through AutoGraph (a fine-tuning run's two pipelines: 0.47 -> 0.10 s).
@tf.autograph.experimental.do_not_convert
def train_dataset(
    split: Split,
    num_classes: int,
    batch_size: int,
    augment: Augment,
    *,
    start_step: int = 0,
    seed: int = 0,
    shuffle_buffer: int = 10_000,
    shard: Shard = WHOLE,
    input_shards: int | None = None,
) -> tf.data.Dataset:
    """Endless batches ``(images (B, S, S, 3) in [-1, 1], one-hot labels)`` from ``start_step``; ``batch_size`` is
    global, ``shard`` this worker's part of it, the split read in ``input_shards`` parts (default: one per worker)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
    units = input_shards or shard.count
    local = check_input_shards(batch_size, units, shard, split.num_examples)
    randaugment = _randaugment(augment, seed)

    def per_example(position, image, label):
        image = train_transform(image, tf.stack([tf.constant(seed, tf.int64), position]), augment)
        if randaugment is not None:
            image = randaugment(image)
        return image, tf.one_hot(label, num_classes)

    ds = _stream_positions(split, shard, units, batch_size, start_step, seed, shuffle_buffer)
    ds = ds.map(per_example, num_parallel_calls=AUTOTUNE).batch(local, drop_remainder=True)
    mix = _mixer(augment, seed)
    if mix is not None:
        ds = ds.map(mix, num_parallel_calls=AUTOTUNE)
    ds = ds.map(lambda x, y: (preprocess_input(x), y), num_parallel_calls=AUTOTUNE)
    return ds.prefetch(AUTOTUNE).with_options(distribute_options())


@tf.autograph.experimental.do_not_convert
def eval_dataset(
    split: Split,
    num_classes: int,
    batch_size: int,
    augment: Augment,
    whole_batches: bool = False,
    shard: Shard = WHOLE,
) -> tf.data.Dataset:
    """The held-out split once, ``(images in [-1, 1], one-hot labels)`` batches; ``whole_batches`` (or a ``shard`` of
    several): ``(images, labels, weights)`` in whole batches, the last filled with blanks of weight 0."""
    local = shard.local_batch(batch_size)
    ds = split.examples(shard.index, shard.count).map(
        lambda image, label: (preprocess_input(eval_transform(image, augment)), tf.one_hot(label, num_classes)),
        num_parallel_calls=AUTOTUNE,
    )
    whole_batches = whole_batches or shard.count > 1
    if whole_batches:
        ds = ds.map(lambda x, y: (x, y, tf.constant(1.0)))
        blank = tf.data.Dataset.from_tensors(tuple(tf.zeros(s.shape, s.dtype) for s in ds.element_spec))
        if split.num_examples:
            ds = ds.concatenate(blank.repeat()).take(eval_part_length(split.num_examples, batch_size, shard.count))
        elif shard.count == 1:  # local - 1 blanks fill any last partial batch; a partial batch left over is dropped
            ds = ds.concatenate(blank.repeat(local - 1))
        else:
            raise ValueError("The held-out split does not report its size, which evaluating on several workers needs.")
    return ds.batch(local, drop_remainder=whole_batches).prefetch(AUTOTUNE).with_options(distribute_options())
