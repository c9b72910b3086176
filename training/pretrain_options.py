"""The options of masked patch pre-training (``python -m keras_vit.training.pretrain``), their checks and its summary
table: plain Python, for the command to parse and check its arguments before Keras loads."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from keras_vit.fields import option
from keras_vit.training.config import TrainConfig

__all__ = ["PretrainConfig", "check_bits", "check_fractions", "check_pretrain", "masked_fields", "summary_table"]


def check_fractions(rate: float, mask_fraction: float, random_fraction: float) -> None:
    """A ``ValueError`` unless ``rate`` is in (0, 1] and the two fractions are non-negative and sum to at most 1."""
    if not 0 < rate <= 1:
        raise ValueError(f"corruption rate must be in (0, 1], got {rate}.")
    if mask_fraction < 0 or random_fraction < 0 or mask_fraction + random_fraction > 1:
        raise ValueError(
            f"mask_fraction ({mask_fraction}) and random_fraction ({random_fraction}) must be "
            "non-negative and sum to at most 1 (the rest stay unchanged)."
        )


def check_bits(bits: int) -> None:
    """A ``ValueError`` unless the colour target has 1 to 8 ``bits`` per channel."""
    if not 1 <= bits <= 8:
        raise ValueError(f"bits must be between 1 and 8 per channel, got {bits}.")


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

    def __post_init__(self) -> None:
        check_fractions(self.rate, self.mask_fraction, self.random_fraction)
        check_bits(self.bits)
        for flag, value in (("--pretrain-batch-size", self.batch_size), ("--pretrain-eval-every", self.eval_every)):
            if value is not None and value < 1:  # unset (None) follows the fine-tuning; 0 is not "unset"
                raise ValueError(f"{flag} must be >= 1, got {value}.")


def masked_fields(finetune: TrainConfig, config: PretrainConfig) -> dict[str, Any]:
    """The flat fields that make the masked-patch phase of the fine-tuning ``finetune``: the pre-training's
    optimisation (Adam, warmup then cosine decay to 0, no weight decay or accumulation), no RandAugment, MixUp or
    CutMix, into ``OUT/pretrain``."""
    return dict(
        steps=config.steps,
        epochs=None,
        eval_every=max(1, config.steps // 5) if config.eval_every is None else config.eval_every,
        batch_size=finetune.optim.batch_size if config.batch_size is None else config.batch_size,
        accumulation_steps=1,
        lr=config.lr,
        warmup=min(config.warmup, config.steps),
        schedule="cosine",
        end_lr=0.0,
        optimizer="adam",
        weight_decay=0.0,
        clip_norm=config.clip_norm,
        randaugment=(0, 0.0),
        mixup=0.0,
        cutmix=0.0,
        output_dir=os.path.join(finetune.run.output_dir, "pretrain"),
        overwrite=False,
    )


def check_pretrain(finetune: TrainConfig, config: PretrainConfig) -> None:
    """A ``ValueError`` for ``--lora-rank``, or for a masked-patch phase out of range (``--pretrain-steps 0``: its
    config's own message), before TensorFlow loads."""
    if finetune.model.lora_rank:
        raise ValueError(
            "--lora-rank does not apply to pretrain, which fine-tunes the whole encoder it pre-trained; fine-tune "
            "its encoder.keras with LoRA through keras_vit.training.finetune --weights OUT/encoder.keras --lora-rank N."
        )
    finetune.replace(**masked_fields(finetune, config))


def summary_table(summary: dict) -> str:
    """Held-out accuracy after masked-patch pre-training (and from scratch, when run) as a Markdown table."""
    rows = ["| initialisation | held-out accuracy |", "|---|---:|"]
    names = {"finetune": "masked patch prediction", "scratch": "random (from scratch)"}
    rows += [f"| {label} | {summary[key]['accuracy']:.4f} |" for key, label in names.items() if key in summary]
    return "\n".join(rows)
