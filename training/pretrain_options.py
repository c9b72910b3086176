"""The options of masked patch pre-training (``python -m keras_vit.training.pretrain``) and its summary table: plain
Python, for the command to parse and check its arguments before Keras loads."""

from __future__ import annotations

import dataclasses

from keras_vit.fields import option

__all__ = ["PretrainConfig", "summary_table"]


@dataclasses.dataclass(frozen=True)
class PretrainConfig:
    """The masked-patch pre-training (Adam, warmup then cosine decay); ``None`` fields follow the fine-tuning."""

    steps: int = option("pre-training steps", 1000, flag="pretrain_steps")
    lr: float = option("Adam base learning rate (paper: 2e-4)", 1e-3, flag="pretrain_lr")
    warmup: int = option("warmup steps, then cosine decay", 100, flag="pretrain_warmup")
    batch_size: int | None = option("pre-training batch", unset="the fine-tuning batch", flag="pretrain_batch_size")
    clip_norm: float = option("global gradient-norm clip (0: off)", 1.0, flag="pretrain_clip_norm")
    rate: float = option("fraction of patches corrupted", 0.5, flag="corruption_rate")
    mask_fraction: float = option("fraction of corrupted patches replaced by [mask]", 0.8)
    random_fraction: float = option("fraction of corrupted patches replaced by another patch", 0.1)
    bits: int = option("bits per channel of the colour target", 3, flag="colour_bits")
    eval_every: int | None = option(
        "steps between masked-patch evaluations", unset="a fifth of the steps", flag="pretrain_eval_every"
    )
    compare_scratch: bool = option("also fine-tune from random initialisation", False)


def summary_table(summary: dict) -> str:
    """Held-out accuracy after masked-patch pre-training (and from scratch, when run) as a Markdown table."""
    rows = ["| initialisation | held-out accuracy |", "|---|---:|"]
    names = {"finetune": "masked patch prediction", "scratch": "random (from scratch)"}
    rows += [f"| {label} | {summary[key]['accuracy']:.4f} |" for key, label in names.items() if key in summary]
    return "\n".join(rows)
