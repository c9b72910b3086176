"""The learning-rate schedule: linear warmup, then cosine, linear or constant decay (the ViT paper's)."""

from __future__ import annotations

import math

import keras
from keras import ops

from keras_vit.checks import check_choice
from keras_vit.training.config import DECAYS

__all__ = ["DECAYS", "WarmupDecay"]


@keras.saving.register_keras_serializable(package="keras_vit_training")
class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup over ``warmup_steps`` updates, then ``decay`` to ``end_lr`` at ``total_steps``; advances once per
    update (every ``accumulation_steps`` calls)."""

    def __init__(
        self,
        base_lr: float,
        total_steps: int,
        warmup_steps: int = 0,
        decay: str = "cosine",
        end_lr: float = 0.0,
        accumulation_steps: int = 1,
    ):
        check_choice(decay, DECAYS, "decay")
        if total_steps < 1 or not 0 <= warmup_steps <= total_steps:
            raise ValueError(
                f"Need total_steps >= 1 and 0 <= warmup_steps <= total_steps, got "
                f"total_steps={total_steps}, warmup_steps={warmup_steps}."
            )
        if accumulation_steps < 1:
            raise ValueError(f"accumulation_steps must be >= 1, got {accumulation_steps}.")
        self.base_lr = float(base_lr)
        self.total_steps = int(total_steps)
        self.warmup_steps = int(warmup_steps)
        self.decay = decay
        self.end_lr = float(end_lr)
        self.accumulation_steps = int(accumulation_steps)

    def __call__(self, step):
        """The learning rate of optimizer call ``step`` (0-based), at update ``t = step // accumulation_steps + 1``."""
        # Keras' CosineDecay / PolynomialDecay arithmetic, to the bit, in elementwise ops: JAX compiles their ops.cond
        # anew at each eager call, such as a logged step's read of the rate (50 ms and 1.7 MB of memory kept each).
        t = ops.cast(ops.floor_divide(ops.cast(step, "int32"), self.accumulation_steps) + 1, "float32")
        span = max(1, self.total_steps - self.warmup_steps)
        progress = ops.minimum(t - self.warmup_steps, span) / span
        if self.decay == "linear":
            decayed = (self.base_lr - self.end_lr) * (1.0 - progress) + self.end_lr
        else:  # cosine to end_lr = alpha * base_lr; constant: alpha = 1
            alpha = 1.0 if self.decay == "constant" else (self.end_lr / self.base_lr if self.base_lr else 0.0)
            decayed = self.base_lr * ((1 - alpha) * (0.5 * (1.0 + ops.cos(math.pi * progress))) + alpha)
        return ops.where(t < self.warmup_steps, self.base_lr * (t / max(1, self.warmup_steps)), decayed)

    def get_config(self):
        names = ("base_lr", "total_steps", "warmup_steps", "decay", "end_lr", "accumulation_steps")
        return {name: getattr(self, name) for name in names}
