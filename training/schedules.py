"""Learning-rate schedules: linear warmup, then cosine, linear or constant decay (the ViT paper's), from Keras'."""

from __future__ import annotations

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
        span = max(1, self.total_steps - self.warmup_steps)
        if decay == "linear":
            self.schedule = keras.optimizers.schedules.PolynomialDecay(self.base_lr, span, self.end_lr, power=1.0)
        else:
            alpha = 1.0 if decay == "constant" else (self.end_lr / self.base_lr if self.base_lr else 0.0)
            self.schedule = keras.optimizers.schedules.CosineDecay(
                0.0, span, alpha=alpha, warmup_target=self.base_lr, warmup_steps=self.warmup_steps
            )

    def __call__(self, step):
        """The learning rate of optimizer call ``step`` (0-based): Keras' schedule at update ``t`` (1-based)."""
        t = ops.cast(ops.floor_divide(ops.cast(step, "int32"), self.accumulation_steps) + 1, "float32")
        if self.decay != "linear":
            return self.schedule(t)
        decayed = self.schedule(t - self.warmup_steps)  # PolynomialDecay has no warmup: CosineDecay's linear ramp
        return ops.where(t < self.warmup_steps, self.base_lr * t / max(1, self.warmup_steps), decayed)

    def get_config(self):
        names = ("base_lr", "total_steps", "warmup_steps", "decay", "end_lr", "accumulation_steps")
        return {name: getattr(self, name) for name in names}
