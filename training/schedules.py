"""Learning-rate schedules: linear warmup, then cosine or linear decay (the ViT paper's schedules).

For optimizer update ``t = 1, 2, ..., T`` (``t = iterations + 1``) with ``W`` warmup steps::

    progress = clip((t - W) / (T - W), 0, 1)
    cosine:   lr = end + (base - end) * 0.5 * (1 + cos(pi * progress))
    linear:   lr = end + (base - end) * (1 - progress)
    constant: lr = base
    lr = lr * min(1, t / W)            (when W > 0)
"""

from __future__ import annotations

import math

import keras
from keras import ops

DECAYS = ("cosine", "linear", "constant")


@keras.saving.register_keras_serializable(package="keras_vit_training")
class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup over ``warmup_steps`` updates, then ``decay`` to ``end_lr`` at ``total_steps``.

    With ``accumulation_steps = A`` the optimizer calls the schedule once per micro-batch; the
    schedule then advances once per ``A`` calls, i.e. once per update.
    """

    def __init__(self, base_lr: float, total_steps: int, warmup_steps: int = 0, decay: str = "cosine",
                 end_lr: float = 0.0, accumulation_steps: int = 1):
        if decay not in DECAYS:
            raise ValueError(f"Unknown decay {decay!r}; expected one of {DECAYS}.")
        if total_steps < 1 or not 0 <= warmup_steps <= total_steps:
            raise ValueError(f"Need total_steps >= 1 and 0 <= warmup_steps <= total_steps, got "
                             f"total_steps={total_steps}, warmup_steps={warmup_steps}.")
        if accumulation_steps < 1:
            raise ValueError(f"accumulation_steps must be >= 1, got {accumulation_steps}.")
        self.base_lr = float(base_lr)
        self.total_steps = int(total_steps)
        self.warmup_steps = int(warmup_steps)
        self.decay = decay
        self.end_lr = float(end_lr)
        self.accumulation_steps = int(accumulation_steps)

    def __call__(self, step):
        t = ops.cast(ops.floor_divide(ops.cast(step, "int64"), self.accumulation_steps) + 1, "float32")
        lr = ops.convert_to_tensor(self.base_lr, "float32")
        if self.decay != "constant":
            span = max(1, self.total_steps - self.warmup_steps)
            progress = ops.clip((t - self.warmup_steps) / span, 0.0, 1.0)
            shape = 0.5 * (1.0 + ops.cos(math.pi * progress)) if self.decay == "cosine" else 1.0 - progress
            lr = self.end_lr + (self.base_lr - self.end_lr) * shape
        if self.warmup_steps:
            lr = lr * ops.minimum(1.0, t / self.warmup_steps)
        return lr

    def get_config(self):
        return {"base_lr": self.base_lr, "total_steps": self.total_steps, "warmup_steps": self.warmup_steps,
                "decay": self.decay, "end_lr": self.end_lr, "accumulation_steps": self.accumulation_steps}
