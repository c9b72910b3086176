"""Masked patch prediction, the paper's self-supervised pre-training (Section 4.6, App. B.1.2; docs/training.md):
corrupted patch embeddings (:func:`sample_corruption`) predict their mean colour (:func:`colour_targets`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import keras
import tensorflow as tf
from keras import layers, ops

from keras_vit.training.config import TrainConfig
from keras_vit.training.data import Source, Split
from keras_vit.training.distributed.sharding import WHOLE, Shard
from keras_vit.training.model import build_model, compile_model
from keras_vit.training.pipeline import Augment, eval_dataset, train_dataset
from keras_vit.training.pretrain_options import check_bits, check_fractions
from keras_vit.training.setup import Setup

__all__ = [
    "KEEP",
    "MASK",
    "RANDOM",
    "UNCHANGED",
    "MaskedPatches",
    "PatchCorruption",
    "PatchTokens",
    "colour_targets",
    "masked_patch_dataset",
    "masked_patch_model",
    "patch_grid",
    "sample_corruption",
]

KEEP, MASK, RANDOM, UNCHANGED = 0, 1, 2, 3  # UNCHANGED: corrupted (predicted) but left as it is
EDGE_TOLERANCE = 1e-3  # grey levels; see colour_targets


def sample_corruption(
    batch_size, num_patches: int, seed, *, rate: float = 0.5, mask_fraction: float = 0.8, random_fraction: float = 0.1
) -> tuple[tf.Tensor, tf.Tensor]:
    """A stateless corruption plan ``(kinds, sources)``, int32 ``(batch_size, num_patches)``: ``round(rate * N)``
    patches of each image corrupted (``mask_fraction`` :data:`MASK`, ``random_fraction`` :data:`RANDOM`, from
    another patch of the image; else :data:`UNCHANGED`); ``seed``: a pair of ints."""
    check_fractions(rate, mask_fraction, random_fraction)
    count = round(rate * num_patches)
    if count < 1:
        raise ValueError(f"rate={rate} corrupts no patch of {num_patches}.")
    if random_fraction and num_patches < 2:
        raise ValueError("random replacement needs at least two patches per image.")
    choose_seed, kind_seed, source_seed = tf.unstack(tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), 3))
    shape = tf.stack([batch_size, num_patches])
    ranks = tf.argsort(tf.argsort(tf.random.stateless_uniform(shape, choose_seed), axis=1), axis=1)
    draw = tf.random.stateless_uniform(shape, kind_seed)
    kind = tf.where(draw < mask_fraction, MASK, tf.where(draw < mask_fraction + random_fraction, RANDOM, UNCHANGED))
    kinds = tf.where(ranks < count, kind, KEEP)
    positions = tf.range(num_patches)[None, :]
    shift = tf.random.stateless_uniform(shape, source_seed, minval=1, maxval=max(2, num_patches), dtype=tf.int32)
    sources = tf.where(kinds == RANDOM, (positions + shift) % num_patches, tf.broadcast_to(positions, shape))
    return tf.cast(kinds, tf.int32), tf.cast(sources, tf.int32)


def colour_targets(images, patch_size: int, bits: int = 3, value_range: tuple[float, float] = (0.0, 255.0)):
    """The class of every patch's mean colour, ``bits`` per channel: int32 ``(B, N)``, row-major; ``L = 2**bits``,
    ``class = (bin_r * L + bin_g) * L + bin_b`` (512 for 3 bits), means within :data:`EDGE_TOLERANCE` below a bin edge
    counting as on it. TensorFlow ops (tf.data on every backend)."""
    height, width, channels = images.shape[1:]
    if channels != 3:
        raise ValueError(f"Colour targets need RGB images, got {channels} channels.")
    if height % patch_size or width % patch_size:
        raise ValueError(f"Image size {height}x{width} is not divisible by the patch size {patch_size}.")
    low, high = value_range
    pixels = (tf.cast(images, tf.float32) - low) * (255.0 / (high - low))
    gh, gw = height // patch_size, width // patch_size
    patches = tf.reshape(pixels, (-1, gh, patch_size, gw, patch_size, 3))
    means = tf.reduce_mean(patches, axis=(2, 4)) + EDGE_TOLERANCE
    levels = 2**bits
    bins = tf.cast(tf.clip_by_value(tf.floor(means * (levels / 256.0)), 0, levels - 1), tf.int32)
    classes = (bins[..., 0] * levels + bins[..., 1]) * levels + bins[..., 2]
    return tf.reshape(classes, (-1, gh * gw))


@keras.saving.register_keras_serializable(package="keras_vit_training")
class PatchCorruption(layers.Layer):
    """Applies a corruption plan to patch embeddings, ``call(tokens, kinds, sources)``: :data:`MASK` positions get
    the learnable ``mask_token``, the others their ``sources`` patch's embedding."""

    def build(self, tokens_shape, kinds_shape=None, sources_shape=None):
        self.mask_token = self.add_weight(
            name="mask_token", shape=(1, 1, tokens_shape[-1]), initializer=keras.initializers.RandomNormal(stddev=0.02)
        )

    def call(self, tokens, kinds, sources):
        index = ops.broadcast_to(ops.expand_dims(ops.cast(sources, "int32"), -1), ops.shape(tokens))
        moved = ops.take_along_axis(tokens, index, axis=1)
        masked = ops.expand_dims(ops.equal(kinds, MASK), -1)
        return ops.where(masked, ops.cast(self.mask_token, tokens.dtype), moved)

    def compute_output_shape(self, tokens_shape, kinds_shape=None, sources_shape=None):
        return tokens_shape


@keras.saving.register_keras_serializable(package="keras_vit_training")
class PatchTokens(layers.Layer):
    """Drops the ``num_prefix_tokens`` leading tokens (the class token): ``(B, p + N, D) -> (B, N, D)``."""

    def __init__(self, num_prefix_tokens: int = 1, **kwargs):
        super().__init__(**kwargs)
        self.num_prefix_tokens = int(num_prefix_tokens)

    def call(self, tokens):
        return tokens[:, self.num_prefix_tokens :]

    def compute_output_shape(self, input_shape):
        b, n, d = input_shape
        return (b, None if n is None else n - self.num_prefix_tokens, d)

    def get_config(self):
        return {**super().get_config(), "num_prefix_tokens": self.num_prefix_tokens}


def patch_grid(model: keras.Model) -> tuple[int, int]:
    """``(number of patch tokens, pixels per patch side)`` of a keras-vit model (plain or hybrid)."""
    try:
        tokens = model.get_layer("embedding").output
    except ValueError as error:
        raise ValueError(f"Model {model.name!r} has no 'embedding' layer; is it a keras-vit ViT?") from error
    height, width = model.inputs[0].shape[1:3]
    num_patches = tokens.shape[1]
    for size in range(1, height + 1):
        if height % size == 0 and width % size == 0 and (height // size) * (width // size) == num_patches:
            return num_patches, size
    raise ValueError(f"Cannot find a square patch size that cuts {height}x{width} images into {num_patches} patches.")


def masked_patch_model(encoder: keras.Model, *, bits: int = 3, name: str | None = None) -> keras.Model:
    """The masked-patch model around ``encoder``: ``{images, corruption, sources}`` -> float32 ``(B, N, 512)``
    logits, the corruption between the patch embedding and the rest of ``encoder``'s own layers (so it trains them)."""
    check_bits(bits)
    num_patches, _ = patch_grid(encoder)
    tokens = encoder.get_layer("embedding").output
    body = keras.Model(tokens, encoder.get_layer("encoder_norm").output, name=f"{encoder.name}_encoder")
    kinds = keras.Input((num_patches,), dtype="int32", name="corruption")
    sources = keras.Input((num_patches,), dtype="int32", name="sources")
    encoded = body(PatchCorruption(name="mpp_corruption")(tokens, kinds, sources))
    prefix = int(any(layer.name == "class_token" for layer in encoder.layers))
    head = layers.Dense(2 ** (3 * bits), name="mpp_head", dtype=keras.mixed_precision.dtype_policy().variable_dtype)
    logits = head(PatchTokens(prefix, name="patch_tokens")(encoded))  # float32 logits under mixed precision too
    inputs = {"images": encoder.inputs[0], "corruption": kinds, "sources": sources}
    return keras.Model(inputs, logits, name=name or f"{encoder.name}_mpp")


@tf.autograph.experimental.do_not_convert  # as pipeline.train_dataset
def masked_patch_dataset(
    split: Split,
    batch_size: int,
    augment: Augment,
    patch_size: int,
    *,
    start_step: int = 0,
    seed: int = 0,
    bits: int = 3,
    training: bool = True,
    shuffle_buffer: int = 10_000,
    whole_batches: bool = False,
    shard: Shard = WHOLE,
    input_shards: int | None = None,
    **corruption,
) -> tf.data.Dataset:
    """Batches ``({images, corruption, sources}, targets (B, N), sample_weight (B, N))`` of ``split``'s images:
    ``training``, the endless stream from ``start_step``, each batch corrupted with seed ``(seed, step)``; else the
    split once (in whole batches when ``whole_batches``, blanks weighing 0). ``corruption``: keywords of
    :func:`sample_corruption`."""
    size = augment.image_size
    if size % patch_size:
        raise ValueError(f"image_size {size} is not divisible by the patch size {patch_size}.")
    num_patches = (size // patch_size) ** 2
    whole_batches = whole_batches or shard.count > 1  # as eval_dataset's parts are
    if training:
        images = train_dataset(
            split,
            1,
            batch_size,
            augment,
            start_step=start_step,
            seed=seed,
            shuffle_buffer=shuffle_buffer,
            shard=shard,
            input_shards=input_shards,
        )
    else:
        images = eval_dataset(split, 1, batch_size, augment, whole_batches=whole_batches, shard=shard)
    if training or not whole_batches:
        images = images.map(lambda x, _: (x, tf.ones(tf.shape(x)[:1])))
    else:
        images = images.map(lambda x, _, weights: (x, weights))
    first, batch_seed = (start_step, seed) if training else (0, seed + 1)

    def to_batch(images_weights, step):
        """``images`` in [-1, 1] and their weights (0: a blank filling the last batch) -> ``(inputs, colour targets,
        corrupted-patch weights)``."""
        images, image_weights = images_weights
        images = tf.ensure_shape(images, (None, size, size, 3))
        key = tf.stack([tf.cast(batch_seed, tf.int64), step])
        kinds, sources = sample_corruption(tf.shape(images)[0], num_patches, key, **corruption)
        targets = colour_targets(images, patch_size, bits, value_range=(-1.0, 1.0))
        weights = tf.cast(kinds != KEEP, tf.float32) * image_weights[:, None]
        return {"images": images, "corruption": kinds, "sources": sources}, targets, weights

    keys = tf.data.Dataset.range(first, tf.int64.max).map(lambda step: step * shard.count + shard.index)
    batches = tf.data.Dataset.zip(images, keys).map(to_batch, num_parallel_calls=tf.data.AUTOTUNE)
    return batches.prefetch(tf.data.AUTOTUNE)


@dataclasses.dataclass(frozen=True)
class MaskedPatches:
    """Pre-train the config's ViT by masked patch prediction: corrupt ``rate`` of every image's patches (of those,
    ``mask_fraction`` by ``[mask]``, ``random_fraction`` by another patch) and predict their ``bits``-bit colours.
    The run keeps (saves and returns) the ViT itself, the encoder."""

    rate: float = 0.5
    mask_fraction: float = 0.8
    random_fraction: float = 0.1
    bits: int = 3

    accuracy_name = "held-out masked-patch accuracy"
    blanks_in_loss = False  # the loss averages over the corrupted patches of the images, the blanks' weigh 0

    def describe(self) -> str:
        return (
            f"masked patch prediction: {self.rate:.0%} of the patches corrupted ({self.mask_fraction:.0%} [mask], "
            f"{self.random_fraction:.0%} another patch), {self.bits}-bit colour targets"
        )

    def build(self, config: TrainConfig, source: Source) -> tuple[keras.Model, keras.Model]:
        encoder = build_model(config, source.num_classes)  # its head does not learn the classes here
        return masked_patch_model(encoder, bits=self.bits), encoder

    def compile(self, model: keras.Model, config: TrainConfig) -> None:
        compile_model(
            model,
            config,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="mean_with_sample_weight"),
            metric=keras.metrics.SparseCategoricalAccuracy(name="accuracy"),
        )

    def datasets(
        self, setup: Setup, model: keras.Model, batch: int
    ) -> tuple[Callable[[int], tf.data.Dataset], tf.data.Dataset]:
        source, augment, patch = setup.source, Augment.of(setup.config), patch_grid(model)[1]
        settings = dataclasses.asdict(self)  # bits and the keywords of sample_corruption
        options = setup.stream_options()
        return setup.inputs(
            lambda step, shard: masked_patch_dataset(
                source.train, batch, augment, patch, start_step=step, shard=shard, **options, **settings
            ),
            lambda shard: masked_patch_dataset(
                source.eval,
                batch,
                augment,
                patch,
                seed=options["seed"],
                training=False,
                whole_batches=setup.whole_batches,
                shard=shard,
                **settings,
            ),
        )
