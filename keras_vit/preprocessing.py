"""Input preprocessing of the published checkpoints: resize to the resolution, scale to [-1, 1].

    from keras_vit.preprocessing import ImagePreprocessor
    preprocess = ImagePreprocessor.from_weights("B_16.augreg_in21k_ft_in1k_224")   # 224 x 224
    x = preprocess(images)            # uint8 or float images in [0, 255], any size, (B, H, W, 3) or (H, W, 3)

This is what the evaluation of google-research/vision_transformer does: ``tf.image.resize`` (bilinear,
no antialiasing) of the whole image to ``image_size``, then ``(x - 127.5) / 127.5``.
"""

from __future__ import annotations

import keras
from keras import ops

__all__ = ["ImagePreprocessor", "preprocess_input"]


def preprocess_input(images):
    """Scale pixel values in [0, 255] to [-1, 1] as float32, the range the published checkpoints expect."""
    return (ops.cast(images, "float32") - 127.5) / 127.5


def _pair(size) -> tuple[int, int]:
    size = (size, size) if isinstance(size, int) else tuple(int(s) for s in size)
    if len(size) != 2 or min(size) < 1:
        raise ValueError(f"image_size must be a positive int or (height, width), got {size!r}.")
    return size


@keras.saving.register_keras_serializable(package="keras_vit")
class ImagePreprocessor(keras.layers.Layer):
    """Resize images to a checkpoint's resolution and scale them from [0, 255] to [-1, 1].

    Args:
        image_size: output height and width (int or ``(h, w)``).
        crop_fraction: ``None`` (default): resize the whole image, squashing its aspect ratio, as the
            checkpoints' evaluation did. A float in (0, 1]: first cut the central square of side
            ``crop_fraction * min(H, W)`` (like "resize the short side to ``size / crop_fraction``, then
            centre crop ``size``"), then resize it.
        interpolation: resize method of ``keras.ops.image.resize`` (``"bilinear"``, as in training).

    Inputs: uint8 or float images with values in [0, 255], ``(B, H, W, 3)`` or one ``(H, W, 3)`` image, of
    any size (also unknown, e.g. in ``tf.data`` or behind ``keras.Input((None, None, 3))``).
    Output: float images of ``image_size`` in [-1, 1] (the layer's compute dtype, float32 by default).
    """

    def __init__(
        self,
        image_size: int | tuple[int, int] = 224,
        crop_fraction: float | None = None,
        interpolation: str = "bilinear",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.image_size = _pair(image_size)
        if crop_fraction is not None and not 0.0 < crop_fraction <= 1.0:
            raise ValueError(f"crop_fraction must be None or in (0, 1], got {crop_fraction!r}.")
        self.crop_fraction = crop_fraction
        self.interpolation = interpolation
        self.supports_masking = False

    @classmethod
    def from_weights(cls, weights: str, **kwargs) -> ImagePreprocessor:
        """The preprocessor of a zoo catalogue checkpoint (its ``image_size``); ``kwargs`` go to the constructor."""
        from keras_vit import zoo

        try:
            entry = zoo.get(weights)
        except ValueError as exc:
            hint = "For another checkpoint pass its resolution: ImagePreprocessor(image_size=...)."
            raise ValueError(f"{exc} {hint}") from None
        kwargs.setdefault("image_size", entry.image_size)
        return cls(**kwargs)

    def _crop(self, images):
        shape = ops.shape(images)
        height, width = shape[1], shape[2]
        side = ops.cast(ops.cast(ops.minimum(height, width), "float32") * self.crop_fraction, "int32")
        side = ops.maximum(side, 1)
        top, left = (height - side) // 2, (width - side) // 2
        return ops.slice(images, [0, top, left, 0], [shape[0], side, side, shape[3]])

    def call(self, images):
        single = len(images.shape) == 3
        if single:
            images = ops.expand_dims(images, 0)
        images = ops.cast(images, "float32")
        if self.crop_fraction is not None:
            images = self._crop(images)
        images = ops.image.resize(images, self.image_size, interpolation=self.interpolation, antialias=False)
        images = preprocess_input(images)
        if single:
            images = ops.squeeze(images, 0)
        return ops.cast(images, self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-3], *self.image_size, input_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.update(
            image_size=list(self.image_size), crop_fraction=self.crop_fraction, interpolation=self.interpolation
        )
        return config
