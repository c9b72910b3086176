"""Input preprocessing of the published checkpoints (resize, scale to [-1, 1]) on every backend's tensors, numpy,
and ``tf.Tensor`` inside ``tf.data``. See docs/weights.md."""

from __future__ import annotations

import os
import sys
import types

import keras
import numpy as np
from keras import ops

from keras_vit.inputs import image_data_format
from keras_vit.layers import TO_CHANNELS_FIRST, TO_CHANNELS_LAST

__all__ = ["ImagePreprocessor", "checkpoint_preprocessor", "preprocess_input"]

# The operations the steps below need: keras.ops and TensorFlow spell them alike, except resize.
_OP_NAMES = ("cast", "shape", "minimum", "maximum", "slice", "expand_dims", "squeeze", "transpose")


def _op_table(module, resize) -> types.SimpleNamespace:
    """The operations of :data:`_OP_NAMES` from ``module`` (``keras.ops`` or ``tensorflow``), and ``resize``."""
    return types.SimpleNamespace(**{name: getattr(module, name) for name in _OP_NAMES}, resize=resize)


def _keras_resize(images, size, method):
    """``keras.ops.image.resize`` of channels-last ``images`` (not the global layout, the op's default)."""
    return ops.image.resize(images, size, interpolation=method, antialias=False, data_format="channels_last")


KERAS_OPS = _op_table(ops, _keras_resize)


def ops_for(images) -> types.SimpleNamespace:
    """The ops for ``x``: :data:`KERAS_OPS`, or TensorFlow's for a ``tf.Tensor`` under another backend (``tf.data``);
    never imports TensorFlow."""
    tf = sys.modules.get("tensorflow")
    if tf is not None and keras.backend.backend() != "tensorflow" and tf.is_tensor(images):
        return _op_table(tf, lambda x, size, method: tf.image.resize(x, size, method=method, antialias=False))
    return KERAS_OPS


MEAN = STD = (0.5, 0.5, 0.5)  # every published checkpoint's, pixels in [0, 1]: (x - 127.5) / 127.5 in [0, 255]


def _pixel_scale(values) -> np.ndarray:
    """Per-channel ``mean`` / ``std`` (pixels in [0, 1]) in [0, 255] units, float32; one number when all agree."""
    values = np.float32(255) * np.asarray(values, "float32")
    return values[:1].reshape(()) if np.all(values == values.flat[0]) else values


def _to_model_range(images, xp, mean=MEAN, std=STD):
    """``(x - 255 mean) / (255 std)`` in float32 with the operations ``xp`` (numpy, Keras' or TensorFlow's):
    ``(x - 127.5) / 127.5`` for the published checkpoints. 16-bit values (uint16) are first scaled to 8 bits,
    ``x / 257`` (65535 -> 255), as :func:`keras_vit.images.read_image` does."""
    sixteen_bit = str(getattr(images.dtype, "name", images.dtype)).endswith("uint16")
    images = images.astype("float32") if xp is np else xp.cast(images, "float32")
    if sixteen_bit:
        images = images / 257.0
    return (images - _pixel_scale(mean)) / _pixel_scale(std)


def preprocess_input(images, data_format: str | None = None):
    """Scale pixels in [0, 255] (uint16: [0, 65535]) to [-1, 1] float32, returned as the kind given (numpy, backend
    tensor, ``tf.Tensor``), in either layout: ``data_format`` (``keras.applications``' argument; ``None``:
    ``keras.config.image_data_format()``) is checked, and every channel is scaled alike."""
    image_data_format(data_format)
    if isinstance(images, np.ndarray | list | tuple):
        return _to_model_range(np.asarray(images), np)
    return _to_model_range(images, ops_for(images))


def _central_square(images, fraction: float, xp):
    """The central square of side ``max(1, floor(min(H, W) * fraction))`` (in float32) of ``(B, H, W, C)`` images:
    Python ints when the sizes are known (JAX needs static slice sizes), tensors otherwise."""
    shape = xp.shape(images)
    height, width = shape[1], shape[2]
    if isinstance(height, int) and isinstance(width, int):
        side = max(int(np.float32(min(height, width)) * np.float32(fraction)), 1)
    else:
        side = xp.maximum(xp.cast(xp.cast(xp.minimum(height, width), "float32") * fraction, "int32"), 1)
    top, left = (height - side) // 2, (width - side) // 2
    return xp.slice(images, [0, top, left, 0], [shape[0], side, side, shape[3]])


@keras.saving.register_keras_serializable(package="keras_vit")
class ImagePreprocessor(keras.layers.Layer):
    """Resize images to a checkpoint's resolution and scale them from [0, 255] to [-1, 1].

    Args: ``image_size`` (int or ``(h, w)``); ``crop_fraction`` (``None``: resize the whole image; a float in (0, 1]:
    first the central square of side ``fraction * min(H, W)``); ``interpolation``; ``mean``, ``std`` (per channel,
    pixels in [0, 1]); ``data_format``: the images' layout, in and out (``None``: ``keras.config.image_data_format()``).
    :meth:`from_weights` takes them from a catalogue checkpoint. Inputs: docs/weights.md."""

    def __init__(
        self,
        image_size: int | tuple[int, int] = 224,
        crop_fraction: float | None = None,
        interpolation: str = "bilinear",
        mean: float | tuple[float, ...] = MEAN,
        std: float | tuple[float, ...] = STD,
        data_format: str | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        size = (image_size, image_size) if isinstance(image_size, int) else tuple(int(s) for s in image_size)
        if len(size) != 2 or min(size) < 1:
            raise ValueError(f"image_size must be a positive int or (height, width), got {size!r}.")
        self.image_size = size
        self.data_format = image_data_format(data_format)
        if crop_fraction is not None and not 0.0 < crop_fraction <= 1.0:
            raise ValueError(f"crop_fraction must be None or in (0, 1], got {crop_fraction!r}.")
        self.crop_fraction = crop_fraction
        self.interpolation = interpolation
        self.mean, self.std = (tuple(float(v) for v in np.atleast_1d(values)) for values in (mean, std))
        if min(self.std) <= 0:
            raise ValueError(f"std must be positive, got {std!r}.")
        self.supports_masking = False

    @classmethod
    def from_weights(cls, weights: str, **kwargs) -> ImagePreprocessor:
        """The preprocessor of a zoo catalogue checkpoint: its ``image_size`` and its ``preprocessing`` record (the
        crop, interpolation, mean and std its top-1 was measured with); ``kwargs`` go to the constructor."""
        from keras_vit import zoo

        try:
            entry = zoo.get(weights)
        except ValueError as exc:
            hint = "For another checkpoint pass its resolution: ImagePreprocessor(image_size=...)."
            raise ValueError(f"{exc} {hint}") from None
        kwargs.setdefault("image_size", entry.image_size)
        for key in ("crop_fraction", "interpolation", "mean", "std"):
            kwargs.setdefault(key, entry.preprocessing[key])
        return cls(**kwargs)

    def __call__(self, images, *args, **kwargs):
        xp = ops_for(images)
        if xp is not KERAS_OPS:  # a tf.Tensor under JAX or torch: Layer.__call__ would convert it to their arrays
            return self._preprocess(images, xp)
        return super().__call__(images, *args, **kwargs)

    def call(self, images):
        return self._preprocess(images, KERAS_OPS)

    def _preprocess(self, images, xp):
        """Crop (optionally), resize and scale ``images`` (one image or a batch) with the operations ``xp``,
        channels-last in between."""
        single, channels_first = len(images.shape) == 3, self.data_format == "channels_first"
        if single:
            images = xp.expand_dims(images, 0)
        images = xp.cast(images, "float32")
        if channels_first:
            images = xp.transpose(images, TO_CHANNELS_LAST)
        if self.crop_fraction is not None:
            images = _central_square(images, self.crop_fraction, xp)
        images = _to_model_range(xp.resize(images, self.image_size, self.interpolation), xp, self.mean, self.std)
        if channels_first:
            images = xp.transpose(images, TO_CHANNELS_FIRST)
        if single:
            images = xp.squeeze(images, 0)
        return xp.cast(images, self.compute_dtype)

    def compute_output_shape(self, input_shape):
        *batch, first, _, last = input_shape
        if self.data_format == "channels_first":
            return (*batch, first, *self.image_size)
        return (*batch, *self.image_size, last)

    def get_config(self):
        return {
            **super().get_config(),
            "image_size": list(self.image_size),
            "crop_fraction": self.crop_fraction,
            "interpolation": self.interpolation,
            "mean": list(self.mean),
            "std": list(self.std),
            "data_format": self.data_format,
        }

    @classmethod
    def from_config(cls, config):
        """The layer of ``config``; a config saved before ``data_format`` existed is channels-last (not the global
        setting of the process loading it)."""
        return super().from_config({"data_format": "channels_last", **config})


def checkpoint_preprocessor(
    weights: str | os.PathLike | None, image_size, data_format: str | None = None
) -> ImagePreprocessor | None:
    """The preprocessing the catalogue checkpoint ``weights`` was evaluated with (its crop, interpolation, mean and
    std), at ``image_size``, for images in ``data_format``; None for weights that are not a catalogue name (a file,
    None)."""
    from keras_vit import zoo

    if weights is None or zoo.find(str(weights)) is None:
        return None
    return ImagePreprocessor.from_weights(str(weights), image_size=image_size, data_format=data_format)
