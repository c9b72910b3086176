"""A training run's settings (:class:`TrainConfig`), its presets, and how the defaults are chosen.

Every field left ``None`` comes from a preset:

* ``finetune`` -- the paper's fine-tuning recipe (Dosovitskiy et al. 2021, App. B.1.1): SGD momentum
  0.9, base lr 0.03 (0.01 for B/16 on CIFAR-10), 500 warmup steps then cosine decay, global-norm
  clipping at 1, no weight decay, batch 512, 10k steps (20k on ImageNet), 384 px, inception crop
  (area 0.05-1) + flip, evaluation by plain resize.
* ``scratch`` -- training from scratch with the augmentations of modern ViT training (DeiT /
  "How to train your ViT"): AdamW(0.9, 0.999), weight decay 0.1, lr 1e-3, 5% warmup, cosine,
  300 epochs, label smoothing 0.1, stochastic depth 0.1, RandAugment(2, 0.5), MixUp 0.8, CutMix 1.0.
* ``digits`` -- the offline default: a 4-block ViT on scikit-learn's digits, tuned to finish in a few
  minutes on 2 CPU cores.

``preset="auto"`` picks ``digits`` when no dataset is named, ``finetune`` when weights are given,
and ``scratch`` otherwise. Machine rule: when ``batch_size`` is not given and no accelerator is
present, the finetune and scratch presets' batch of 512 becomes 32 and (unless ``lr`` is given) the
learning rate is scaled by the same factor, 1/16 (linear scaling rule). ``accumulation_steps`` keeps
a large batch with less memory.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    "finetune": dict(
        model="B/16", image_size=384, batch_size=512, steps=10_000, lr=0.03, warmup=500, schedule="cosine",
        end_lr=0.0, optimizer="sgd", weight_decay=0.0, clip_norm=1.0, label_smoothing=0.0, dropout=0.0,
        drop_path=0.0, crop_area=(0.05, 1.0), flip=True, randaugment=(0, 0.0), mixup=0.0, cutmix=0.0,
        eval_crop=1.0),
    "scratch": dict(
        model="B/16", image_size=224, batch_size=512, epochs=300, lr=1e-3, warmup=0.05, schedule="cosine",
        end_lr=0.0, optimizer="adamw", weight_decay=0.1, clip_norm=1.0, label_smoothing=0.1, dropout=0.0,
        drop_path=0.1, crop_area=(0.08, 1.0), flip=True, randaugment=(2, 0.5), mixup=0.8, cutmix=1.0,
        eval_crop=0.875),
    "digits": dict(
        model="Ti/4", hidden_size=64, depth=4, num_heads=4, mlp_dim=128, image_size=16, batch_size=64,
        steps=2000, lr=2e-3, warmup=100, schedule="cosine", end_lr=0.0, optimizer="adamw", weight_decay=0.05,
        clip_norm=1.0, label_smoothing=0.1, dropout=0.0, drop_path=0.0, crop_area=(0.6, 1.0), flip=False,
        randaugment=(0, 0.0), mixup=0.0, cutmix=0.0, eval_crop=1.0),
}
# Per-dataset (and per-model) changes to the fine-tuning recipe, from the paper.
FINETUNE_ADJUSTMENTS: dict[tuple[str, str | None], dict[str, Any]] = {
    ("imagenet2012", None): dict(steps=20_000),
    ("cifar10", "B/16"): dict(lr=0.01),
}
CPU_BATCH = 32
CPU_SCALED_PRESETS = ("finetune", "scratch")  # their batch of 512 becomes CPU_BATCH on a CPU-only machine
ARCHITECTURE_FIELDS = ("patch_size", "hidden_size", "depth", "num_heads", "mlp_dim")
# Fields a resumed run may change (how it runs, not what it trains).
RUN_ONLY_FIELDS = ("strategy", "tpu", "verbose", "output_dir", "log_every", "checkpoint_every", "keep_checkpoints",
                   "steps_per_execution", "overwrite")


@dataclasses.dataclass
class TrainConfig:
    """Everything a run needs; ``None`` means "from the preset" (see the module docstring)."""

    preset: str = "auto"
    # The model: a variant ("B/16", "ViT_B16") with optional architecture overrides, and weights.
    model: str | None = None
    patch_size: int | None = None
    hidden_size: int | None = None
    depth: int | None = None
    num_heads: int | None = None
    mlp_dim: int | None = None
    weights: str | None = None
    dropout: float | None = None
    drop_path: float | None = None
    # The data.
    dataset: str | None = None
    data_dir: str | None = None
    manual_dir: str | None = None
    train_split: str = "train"
    eval_split: str | None = None
    eval_fraction: float | None = None
    image_size: int | None = None
    crop_area: tuple[float, float] | None = None  # (1, 1): no random crop
    flip: bool | None = None
    randaugment: tuple[int, float] | None = None  # (num_ops, factor); num_ops 0: off
    mixup: float | None = None
    cutmix: float | None = None
    eval_crop: float | None = None
    shuffle_buffer: int = 10_000
    # The optimisation.
    batch_size: int | None = None
    accumulation_steps: int = 1
    steps: int | None = None
    epochs: int | None = None
    eval_every: int | None = None
    lr: float | None = None
    warmup: float | None = None  # steps, or a fraction of the steps when < 1
    schedule: str | None = None
    end_lr: float | None = None
    optimizer: str | None = None
    momentum: float = 0.9
    weight_decay: float | None = None
    clip_norm: float | None = None  # 0: no clipping
    label_smoothing: float | None = None
    mixed_precision: str = "auto"  # auto (bfloat16 on TPU, float16 on GPU, none on CPU) | none | float16 | bfloat16
    seed: int = 0
    # Running.
    strategy: str = "auto"
    tpu: str | None = None
    output_dir: str = "runs/finetune"
    checkpoint_every: int = 500
    keep_checkpoints: int = 3
    log_every: int = 10
    steps_per_execution: int = 1
    verbose: int | str = "auto"
    overwrite: bool = False

    def architecture(self) -> dict[str, int]:
        """The architecture overrides that are set."""
        return {k: getattr(self, k) for k in ARCHITECTURE_FIELDS if getattr(self, k) is not None}


def parse_model_name(name: str) -> str:
    """``"B/16"``, ``"ViT_B16"``, ``"vit-b16"``, ``"ViT-Ti/16"`` -> the variant string ``"B/16"``."""
    match = re.fullmatch(r"(?:vit[-_ ]?)?(ti|s|b|l|h)[-_/ ]?(\d+)", str(name).strip(), flags=re.IGNORECASE)
    if match is None:
        raise ValueError(f"Unknown model {name!r}; expected a ViT variant like 'B/16', 'ViT_B16' or 'Ti/16'.")
    size = match.group(1).capitalize()
    return f"{size}/{int(match.group(2))}"


def choose_preset(config: TrainConfig) -> str:
    """The preset ``auto`` resolves to: digits without a dataset, finetune with weights, else scratch."""
    if config.preset != "auto":
        if config.preset not in PRESETS:
            raise ValueError(f"Unknown preset {config.preset!r}; expected 'auto' or one of {sorted(PRESETS)}.")
        return config.preset
    if config.weights is not None:
        return "finetune"
    return "digits" if config.dataset in (None, "digits") else "scratch"


def preset_values(config: TrainConfig, preset: str) -> dict[str, Any]:
    """The preset's values, with the fine-tuning recipe's per-dataset adjustments."""
    values = dict(PRESETS[preset])
    if preset == "finetune":
        dataset = (config.dataset or "").split("/")[0].split(":")[0]
        variant = parse_model_name(config.model or values["model"])
        for (name, model), change in FINETUNE_ADJUSTMENTS.items():
            if name == dataset and model in (None, variant):
                values.update(change)
    return values


def resolve(config: TrainConfig, *, train_examples: int | None, accelerator: str, replicas: int = 1) -> TrainConfig:
    """Fill every ``None`` field from the preset and the machine rule; check the result."""
    preset = choose_preset(config)
    values = preset_values(config, preset)
    given = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if getattr(config, f.name) is not None}
    if config.model is not None:  # a named model brings its own architecture
        values = {k: v for k, v in values.items() if k not in ARCHITECTURE_FIELDS}
    if config.steps is not None or config.epochs is not None:
        values.pop("steps", None), values.pop("epochs", None)
    if config.batch_size is None and accelerator == "cpu" and preset in CPU_SCALED_PRESETS:
        factor = CPU_BATCH / values["batch_size"]
        values["batch_size"] = CPU_BATCH
        values["lr"] = values["lr"] * factor
    unset = {f.name: None for f in dataclasses.fields(config)}
    resolved = TrainConfig(**{**unset, **values, **given, "preset": preset})
    if resolved.epochs is not None and resolved.steps is not None:
        raise ValueError("Give steps or epochs, not both.")
    if resolved.epochs is not None:
        if not train_examples:
            raise ValueError("epochs needs the number of training examples, which this dataset does not report; "
                             "give steps instead.")
        per_pass = math.ceil(train_examples / resolved.batch_size)
        resolved.steps, resolved.eval_every = resolved.epochs * per_pass, resolved.eval_every or per_pass
    resolved.eval_every = resolved.eval_every or max(1, math.ceil(resolved.steps / 10))
    if resolved.warmup < 1:
        resolved.warmup = round(resolved.warmup * resolved.steps)
    resolved.warmup = int(min(resolved.warmup, resolved.steps))
    _check(resolved, replicas)
    return resolved


def _check(config: TrainConfig, replicas: int) -> None:
    positive = dict(steps=config.steps, batch_size=config.batch_size, image_size=config.image_size,
                    accumulation_steps=config.accumulation_steps, eval_every=config.eval_every,
                    checkpoint_every=config.checkpoint_every, log_every=config.log_every)
    for name, value in positive.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}.")
    micro = config.batch_size // config.accumulation_steps
    if config.batch_size % config.accumulation_steps or micro % replicas:
        raise ValueError(
            f"batch_size {config.batch_size} must split into accumulation_steps={config.accumulation_steps} "
            f"micro-batches that divide over {replicas} replicas.")
    if config.mixed_precision not in ("auto", "none", "float16", "bfloat16"):
        raise ValueError(
            f"Unknown mixed_precision {config.mixed_precision!r}; expected auto, none, float16 or bfloat16.")
    if not 0 <= config.label_smoothing < 1:
        raise ValueError(f"label_smoothing must be in [0, 1), got {config.label_smoothing}.")
    parse_model_name(config.model)


def run_differences(saved: dict[str, Any], config: TrainConfig) -> list[str]:
    """Fields (other than :data:`RUN_ONLY_FIELDS`) whose value differs from a saved run's."""
    current = json_ready(config)
    return sorted(k for k in current if k not in RUN_ONLY_FIELDS and saved.get(k) != current[k])


def json_ready(config: TrainConfig) -> dict[str, Any]:
    """The config as JSON values (tuples become lists)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(config).items()}
