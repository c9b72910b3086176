"""Whether a training step's batch fits in the memory this process may use, checked before the first step: a lower
bound of what a step keeps per image (docs/performance.md), so a refused batch would not have fitted."""

from __future__ import annotations

import math

from keras_vit.config import ViTConfig
from keras_vit.memory import available_memory
from keras_vit.training.errors import TrainingError

__all__ = ["activation_bytes", "check_batch_fits"]


def activation_bytes(config: ViTConfig, bytes_per_value: int = 4) -> int:
    """The activations one training step keeps for one image of the model of ``config`` (a lower bound)."""
    arch = config.architecture
    height, width = config.image_size
    tokens = (height // arch.patch_size) * (width // arch.patch_size) + (config.classifier == "token")
    d, m, h = arch.hidden_size, arch.mlp_dim, arch.num_heads
    per_block = tokens * (11 * d + 2 * m) + 2 * h * tokens**2
    return bytes_per_value * (arch.depth * per_block + 2 * tokens * d + height * width * config.channels)


def check_batch_fits(config: ViTConfig, batch: int, bytes_per_value: int, accumulation_steps: int = 1) -> None:
    """A :class:`TrainingError` saying what batch fits when ``batch`` images (of one step) need more memory than
    :func:`available_memory` leaves; nothing where the memory cannot be read."""
    room = available_memory()
    per_image = activation_bytes(config, bytes_per_value)
    if room is None or batch * per_image <= room[0]:
        return
    fits = max(0, room[0] // per_image)
    gib = 1 << 30
    raise TrainingError(
        f"A step of {batch} images needs at least {batch * per_image / gib:.1f} GiB for its activations "
        f"({per_image / (1 << 20):.2f} MiB per image), but {max(room[0], 0) / gib:.1f} GiB is left under {room[1]}: "
        f"at most {fits} images fit in a step. Lower --batch-size, or keep it and split each update into more "
        f"micro-batches (--accumulation-steps {accumulation_steps * math.ceil(batch / max(fits, 1))} or more, "
        "dividing --batch-size)."
    )
