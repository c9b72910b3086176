"""A training run's settings (:class:`TrainConfig`), its presets, and how the defaults are chosen (docs/training.md).

Four sections check their own fields when made; ``None`` fields come from the preset (:func:`resolve`). The flat
names (``lr``, ``model``) are the command-line options, the keywords of :meth:`TrainConfig.replace` and ``run.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from collections.abc import Mapping
from typing import Any

from keras_vit import fields
from keras_vit.checks import check_choice
from keras_vit.config import ViTConfig, field_names, model_flags
from keras_vit.fields import flag_name, option, option_fields
from keras_vit.names import variant_name
from keras_vit.precision import MIXED_PRECISION
from keras_vit.variants import parse_variant

__all__ = [
    "ARCHITECTURE_FIELDS",
    "DECAYS",
    "FINETUNE_ADJUSTMENTS",
    "FLAT_NAMES",
    "JAX_STRATEGIES",
    "MODEL_OPTIONS",
    "OPTIMIZERS",
    "PRESET",
    "PRESETS",
    "RANGES",
    "RUN_ONLY_FIELDS",
    "SECTIONS",
    "STRATEGIES",
    "TF_STRATEGIES",
    "DataConfig",
    "ModelConfig",
    "OptimConfig",
    "Range",
    "RunConfig",
    "TrainConfig",
    "add_arguments",
    "check_dataset",
    "choose_preset",
    "from_args",
    "json_ready",
    "parse_model_name",
    "resolve",
    "run_differences",
]

# The choices of the optimiser, schedule and strategy fields (here, so that this module imports no TensorFlow).
OPTIMIZERS = ("sgd", "adamw", "adam")
DECAYS = ("cosine", "linear", "constant")
TF_STRATEGIES = ("one_device", "mirrored", "multi_worker", "tpu")
JAX_STRATEGIES = ("data_parallel", "model_parallel")
STRATEGIES = ("auto", "default", *TF_STRATEGIES, *JAX_STRATEGIES)
PRESET = "the preset's"  # what None means for the fields a preset sets
ARCHITECTURE_FIELDS = field_names("architecture")


def parse_model_name(name: str) -> str:
    """Check a model name against the variant table (``"B/16"``, ``"ViT_B16"``, ``"R50+B/16"``, ...); return it.
    An ``argparse.ArgumentTypeError`` says why another name is refused (:func:`keras_vit.names.variant_name`)."""
    try:
        return variant_name(name)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


class _Checked:
    """A section that checks its fields against :data:`RANGES` when made: a ``ValueError`` naming the first."""

    def __post_init__(self) -> None:
        for field in option_fields(type(self)):
            name, value = flag_name(field), getattr(self, field.name)
            allowed = RANGES.get(name)
            values = tuple(value) if isinstance(value, (tuple, list)) else (value,)
            if allowed is None or value is None:
                continue
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v in allowed for v in values):
                raise ValueError(f"--{name.replace('_', '-')} must be {allowed}, got {_shown(value)}.")


# Every option of keras_vit.config.ViTConfig that makes the model (its architecture included), with the config's
# help and choices; None: the variant's or ViT's default (dropout and drop_path: the preset's).
MODEL_OPTIONS = field_names("architecture", "structure", "numerics", "training")
ModelOptions = model_flags(
    "ModelOptions",
    MODEL_OPTIONS,
    "The options of keras_vit.config.ViTConfig.",
    unset={"dropout": PRESET, "drop_path": PRESET},
)


@dataclasses.dataclass(frozen=True)
class ModelConfig(_Checked, ModelOptions):  # type: ignore[misc, valid-type]  # ModelOptions: a class made at run time
    """The model: a variant with any option of keras_vit.config.ViTConfig replaced, its weights and LoRA."""

    name: str | None = option(
        "variant of keras_vit.variants: B/16 (also spelt B16, ViT-B/16, ViT_B16), Ti/16, R50+B/16, ViT_R26_S32, "
        "CLIP-B/16, ...; B/16 is 86M parameters",
        unset=PRESET,
        flag="model",
        parse=parse_model_name,
    )
    image_size: int | None = option("input resolution (position embeddings are resized to it)", unset=PRESET)
    weights: str | None = option("a zoo catalogue name or a checkpoint path", unset="random initialisation")
    lora_rank: int | None = option(
        "fine-tune LoRA adapters of this rank on every block's qkv, out and MLP kernels, all else frozen but the "
        "head (keras_vit.enable_lora)",
        unset="off: every weight trains",
    )


@dataclasses.dataclass(frozen=True)
class DataConfig(_Checked):
    """The data: where it comes from, how it is split, augmented and evaluated."""

    dataset: str | None = option(
        "a TFDS name (cifar10, oxford_iiit_pet, imagenet2012, ...) or an image folder (one sub-folder per class)",
        unset="scikit-learn's digits",
    )
    data_dir: str | None = option("TFDS data directory", unset="TFDS's")
    manual_dir: str | None = option(
        "TFDS manual download directory (imagenet2012)", unset="TFDS's own, <data-dir>/downloads/manual"
    )
    train_split: str = option("training split", "train")
    eval_split: str | None = option("held-out split", unset="validation for ImageNet, else test")
    eval_fraction: float | None = option(
        "fraction held out when the data has no held-out split", unset="0.2 of digits, 0.1 of a folder"
    )
    crop_area: tuple[float, float] | None = option("inception crop area range (1,1: no random crop)", unset=PRESET)
    flip: bool | None = option("random horizontal flips", unset=PRESET)
    randaugment: tuple[int, float] | None = option("RandAugment num_ops,factor (0,0: off)", unset=PRESET)
    mixup: float | None = option("MixUp alpha (0: off)", unset=PRESET)
    cutmix: float | None = option("CutMix factor (0: off)", unset=PRESET)
    eval_crop: float | None = option("central crop fraction for evaluation (1: plain resize)", unset=PRESET)
    shuffle_buffer: int = option("shuffle buffer of streamed (TFDS) data", 10_000)
    input_shards: int | None = option(
        "parts the training split is read in, each shuffled on its own: every batch takes batch/N examples of each, "
        "and each of several workers reads only its own parts (N: a multiple of the workers that divides the "
        "batch). The same N gives the same batches on any number of workers",
        unset="one per input worker (1 on one process)",
    )
    skip_corrupt: bool | None = option(
        "leave out image-folder files that do not decode, naming them", unset="no: stop before training, naming them"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        low, high = self.crop_area or (0, 1)
        if low > high:
            raise ValueError(f"--crop-area must be low,high with low <= high, got {_shown(self.crop_area)}.")


def check_dataset(dataset: str | None) -> None:
    """A ``ValueError`` for a ``--dataset`` no run reads, told from its name and the file system alone (before
    TensorFlow loads): a file, or a path (``./``, ``~``, ``/``) that is not there. Else the digits, a folder or a
    TFDS name."""
    if dataset is None or dataset == "digits" or os.path.isdir(dataset):
        return
    if os.path.lexists(dataset):
        raise ValueError(
            f"--dataset {dataset} is a file: give an image folder (one sub-folder of images per class; unpack an "
            "archive first) or a TFDS name."
        )
    if dataset.startswith((".", "~", os.sep)):
        raise ValueError(f"Image folder {dataset!r} does not exist.")


@dataclasses.dataclass(frozen=True)
class OptimConfig(_Checked):
    """The optimisation: batch, length, learning-rate schedule, optimizer, loss, precision, seed."""

    batch_size: int | None = option("global batch (per optimizer update)", unset=PRESET)
    accumulation_steps: int = option("micro-batches accumulated per update", 1)
    steps: int | None = option("optimizer updates", unset=PRESET)
    epochs: int | None = option("passes over the training data (instead of --steps)", unset=PRESET)
    eval_every: int | None = option(
        "steps between evaluations (an 'epoch' in the logs)", unset="one pass with --epochs, else a tenth of the steps"
    )
    lr: float | None = option("base learning rate", unset=PRESET)
    warmup: float | None = option("warmup steps (or a fraction of the steps when < 1)", unset=PRESET)
    schedule: str | None = option("decay after the warmup", unset=PRESET, choices=DECAYS)
    end_lr: float | None = option("learning rate at the last step", unset=PRESET)
    optimizer: str | None = option("optimizer", unset=PRESET, choices=OPTIMIZERS)
    momentum: float = option("SGD momentum", 0.9)
    weight_decay: float | None = option("decoupled weight decay", unset=PRESET)
    clip_norm: float | None = option("global gradient-norm clip (0: off)", unset=PRESET)
    label_smoothing: float | None = option("label smoothing", unset=PRESET)
    mixed_precision: str = option(
        "auto: keras_vit.precision.auto_policy's choice for the hardware (bfloat16 on TPUs, on GPUs from Ampere on "
        "and on CPUs with AVX512_BF16 or AMX, but float32 on CPUs under JAX; float16 on Volta/Turing GPUs; else "
        "none)",
        "auto",
        choices=MIXED_PRECISION,
    )
    seed: int = option("random seed (initialisation, data order, augmentation)", 0)


@dataclasses.dataclass(frozen=True)
class RunConfig(_Checked):
    """How a run runs: devices, outputs, checkpoints, logs (a resumed run may change these)."""

    strategy: str = option(
        "TensorFlow: a tf.distribute strategy (default, one_device, mirrored, multi_worker, tpu); JAX: a "
        "keras.distribution (default, data_parallel, model_parallel); torch: one device. auto: see "
        "keras_vit.training.distributed.strategy",
        "auto",
        choices=STRATEGIES,
    )
    model_devices: int | None = option(
        "--strategy model_parallel (JAX): devices on the model axis, which split every block's qkv and MLP kernels; "
        "the batch is split over the rest",
        unset="all devices",
    )
    tpu: str | None = option("TPU name or address", unset="TPU_NAME or the local TPU VM")
    cpu_devices: int | None = option(
        "split the CPU into N devices (to try --strategy mirrored, or data_parallel on JAX, without GPUs)",
        unset="no split",
    )
    output_dir: str = option("where checkpoints, logs, the model and metrics go", "runs/finetune")
    checkpoint_every: int = option("steps between checkpoints", 500)
    keep_checkpoints: int = option("checkpoints kept", 3)
    log_every: int = option("steps between train_log.jsonl / TensorBoard entries", 10)
    steps_per_execution: int = option("batches per compiled call of model.fit", 1)
    verbose: int | str = option(
        "0 silent, 1 progress bars, 2 one line per epoch, auto: Keras' choice",
        "auto",
        choices=(0, 1, 2, "auto"),
        parse=lambda text: int(text) if text.isdigit() else text,
    )
    overwrite: bool = option("delete output-dir first instead of resuming from it", False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.output_dir:
            raise ValueError("--output-dir must name a folder, got an empty string.")


SECTIONS = {"model": ModelConfig, "data": DataConfig, "optim": OptimConfig, "run": RunConfig}
# Flat name (option, keyword, run.json key) -> (section, field).
FLAT_NAMES: dict[str, tuple[str, str]] = {
    flag_name(f): (section, f.name) for section, cls in SECTIONS.items() for f in option_fields(cls)
}
RUN_ONLY_FIELDS = tuple(flag_name(f) for f in option_fields(RunConfig))


# Plain augmentation: no random crop, flip, RandAugment, MixUp or CutMix; evaluation by resizing.
_PLAIN = dict(crop_area=(1.0, 1.0), flip=False, randaugment=(0, 0.0), mixup=0.0, cutmix=0.0, eval_crop=1.0)
# What every preset's schedule shares: a cosine decay to 0 and gradients clipped to global norm 1.
_COSINE = dict(schedule="cosine", end_lr=0.0, clip_norm=1.0)
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "finetune": dict(
        model=dict(name="B/16", image_size=384, dropout=0.0, drop_path=0.0),
        data=dict(_PLAIN, crop_area=(0.05, 1.0), flip=True),
        optim=dict(
            _COSINE,
            batch_size=512,
            steps=10_000,
            lr=0.03,
            warmup=500,
            optimizer="sgd",
            weight_decay=0.0,
            label_smoothing=0.0,
        ),
    ),
    "scratch": dict(
        model=dict(name="B/16", image_size=224, dropout=0.0, drop_path=0.1),
        data=dict(crop_area=(0.08, 1.0), flip=True, randaugment=(2, 0.5), mixup=0.8, cutmix=1.0, eval_crop=0.875),
        optim=dict(
            _COSINE,
            batch_size=512,
            epochs=300,
            lr=1e-3,
            warmup=0.05,
            optimizer="adamw",
            weight_decay=0.1,
            label_smoothing=0.1,
        ),
    ),
    "digits": dict(
        model=dict(
            name="Ti/4", hidden_size=64, depth=4, num_heads=4, mlp_dim=128, image_size=16, dropout=0.0, drop_path=0.0
        ),
        data=dict(_PLAIN, crop_area=(0.6, 1.0)),
        optim=dict(
            _COSINE,
            batch_size=64,
            steps=2000,
            lr=2e-3,
            warmup=100,
            optimizer="adamw",
            weight_decay=0.05,
            label_smoothing=0.1,
        ),
    ),
}
# Per-dataset (and per-model) changes to the fine-tuning recipe, from the paper.
FINETUNE_ADJUSTMENTS: dict[tuple[str, str | None], dict[str, dict[str, Any]]] = {
    ("imagenet2012", None): dict(optim=dict(steps=20_000)),
    ("cifar10", "B/16"): dict(optim=dict(lr=0.01)),
}
CPU_BATCH = 32
CPU_SCALED_PRESETS = ("finetune", "scratch")  # their batch of 512 becomes CPU_BATCH on a CPU-only machine


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything a run needs; ``None`` fields come from the preset (see the module docstring)."""

    preset: str = option(
        "the recipe unset options come from (auto: digits without a dataset, finetune with weights, else scratch)",
        "auto",
        choices=("auto", *PRESETS),
    )
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    run: RunConfig = dataclasses.field(default_factory=RunConfig)

    @classmethod
    def from_flat(cls, values: Mapping[str, Any]) -> TrainConfig:
        """A config from flat names (``{"lr": 0.1, "model": "B/16"}``); the rest default."""
        return cls().replace(**values)

    def replace(self, **values: Any) -> TrainConfig:
        """A copy with fields changed by their flat names (``lr=0.1``, ``model="S/16"``, ``preset="scratch"``)."""
        preset = values.pop("preset", self.preset)
        unknown = sorted(set(values) - set(FLAT_NAMES))
        if unknown:
            raise TypeError(f"Unknown TrainConfig fields {unknown}; expected {sorted(['preset', *FLAT_NAMES])}.")
        changes: dict[str, dict[str, Any]] = {}
        for flat, value in values.items():
            section, name = FLAT_NAMES[flat]
            changes.setdefault(section, {})[name] = value
        return self.update(changes, preset=preset)

    def update(self, changes: Mapping[str, Mapping[str, Any]], preset: str | None = None) -> TrainConfig:
        """A copy with ``{section: {field: value}}`` applied."""
        sections = {s: dataclasses.replace(getattr(self, s), **changes.get(s, {})) for s in SECTIONS}
        return TrainConfig(preset=preset or self.preset, **sections)

    def flat(self) -> dict[str, Any]:
        """``{flat name: value}`` of every field, ``preset`` first."""
        return {
            "preset": self.preset,
            **{flat: getattr(getattr(self, s), name) for flat, (s, name) in FLAT_NAMES.items()},
        }

    def set_fields(self) -> dict[str, dict[str, Any]]:
        """``{section: {field: value}}`` of the fields that are not ``None``."""
        return {s: {k: v for k, v in dataclasses.asdict(getattr(self, s)).items() if v is not None} for s in SECTIONS}

    def architecture(self) -> dict[str, Any]:
        """The architecture overrides that are set."""
        return {k: v for k, v in self.model_options().items() if k in ARCHITECTURE_FIELDS}

    def model_options(self) -> dict[str, Any]:
        """The options of the model (:data:`MODEL_OPTIONS`) that are set: what replaces the variant's config."""
        return {k: getattr(self.model, k) for k in MODEL_OPTIONS if getattr(self.model, k) is not None}


def choose_preset(config: TrainConfig) -> str:
    """The preset ``auto`` resolves to: digits without a dataset, finetune with weights, else scratch."""
    if config.preset != "auto":
        if config.preset not in PRESETS:
            raise ValueError(f"Unknown preset {config.preset!r}; expected 'auto' or one of {sorted(PRESETS)}.")
        return config.preset
    if config.model.weights is not None:
        return "finetune"
    return "digits" if config.data.dataset in (None, "digits") else "scratch"


def preset_values(config: TrainConfig, preset: str) -> dict[str, dict[str, Any]]:
    """``{section: {field: value}}`` of the preset, with the fine-tuning recipe's per-dataset adjustments and the
    rules of the module docstring applied for what ``config`` sets."""
    values = {section: dict(fields) for section, fields in PRESETS[preset].items()}
    model, optim = values["model"], values["optim"]
    if preset == "finetune":
        dataset = (config.data.dataset or "").split("/")[0].split(":")[0]
        variant = parse_variant(config.model.name or model["name"]).variant
        for (name, adjusted), change in FINETUNE_ADJUSTMENTS.items():
            if name == dataset and adjusted in (None, variant):
                for section, fields in change.items():
                    values[section].update(fields)
    if config.model.name is not None:  # a named model brings its own architecture
        for name in ARCHITECTURE_FIELDS:
            model.pop(name, None)
    if config.optim.steps is not None or config.optim.epochs is not None:
        optim.pop("steps", None), optim.pop("epochs", None)
    return values


def resolve(config: TrainConfig, *, train_examples: int | None, accelerator: str, replicas: int = 1) -> TrainConfig:
    """Fill every unset field from the preset and the machine rule; check the result."""
    preset = choose_preset(config)
    values = preset_values(config, preset)
    if config.optim.batch_size is None and accelerator == "cpu" and preset in CPU_SCALED_PRESETS:
        preset_optim = values["optim"]
        preset_optim["lr"] *= CPU_BATCH / preset_optim["batch_size"]
        preset_optim["batch_size"] = CPU_BATCH
    resolved = TrainConfig().update(values).update(config.set_fields(), preset=preset)
    optim = resolved.optim
    assert optim.batch_size is not None and optim.warmup is not None  # every preset sets them
    steps, eval_every = optim.steps, optim.eval_every
    if optim.epochs is not None and steps is not None:
        raise ValueError("Give steps or epochs, not both.")
    if optim.epochs is not None:
        if not train_examples:
            raise ValueError(
                "epochs needs the number of training examples, which this dataset does not report; give steps instead."
            )
        per_pass = math.ceil(train_examples / optim.batch_size)
        steps, eval_every = optim.epochs * per_pass, eval_every or per_pass
    assert steps is not None  # every preset sets steps or epochs, and gives way to either
    eval_every = eval_every or max(1, math.ceil(steps / 10))
    warmup = round(optim.warmup * steps) if optim.warmup < 1 else optim.warmup
    resolved = resolved.replace(steps=steps, eval_every=eval_every, warmup=int(min(warmup, steps)))
    _check(resolved, replicas)
    return resolved


@dataclasses.dataclass(frozen=True)
class Range:
    """The allowed values of a numeric setting: ``low <= value < high`` (ends open or closed as given)."""

    low: float
    high: float = math.inf
    low_open: bool = False
    high_open: bool = True

    def __contains__(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def __str__(self) -> str:
        if self.high == math.inf:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"


_COUNT, _NON_NEGATIVE, _RATE, _FRACTION = Range(1), Range(0), Range(0, 1), Range(0, 1, low_open=True)
# Flat name -> allowed values; a tuple setting's every element must be in its range.
RANGES: dict[str, Range] = {
    **dict.fromkeys(
        (
            "steps",
            "epochs",
            "batch_size",
            "accumulation_steps",
            "eval_every",
            "image_size",
            "patch_size",
            "hidden_size",
            "depth",
            "num_heads",
            "mlp_dim",
            "shuffle_buffer",
            "input_shards",
            "checkpoint_every",
            "keep_checkpoints",
            "log_every",
            "steps_per_execution",
            "lora_rank",
            "model_devices",
        ),
        _COUNT,
    ),
    **dict.fromkeys(
        ("lr", "warmup", "end_lr", "weight_decay", "clip_norm", "mixup", "cutmix", "randaugment", "cpu_devices"),
        _NON_NEGATIVE,
    ),
    **dict.fromkeys(("dropout", "drop_path", "momentum", "label_smoothing"), _RATE),
    "eval_fraction": _FRACTION,
    **dict.fromkeys(("crop_area", "eval_crop"), Range(0, 1, low_open=True, high_open=False)),
}


def _shown(value: Any) -> str:
    """A value as typed on the command line (``-3``, ``0.05,1``)."""
    values = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def _check(config: TrainConfig, replicas: int) -> None:
    optim = config.optim
    assert optim.batch_size is not None and config.model.name is not None  # resolved: the preset sets them
    micro = optim.batch_size // optim.accumulation_steps
    if optim.batch_size % optim.accumulation_steps or micro % replicas:
        raise ValueError(
            f"batch_size {optim.batch_size} must split into accumulation_steps={optim.accumulation_steps} "
            f"micro-batches that divide over {replicas} replicas."
        )
    for section, cls in SECTIONS.items():
        for field in option_fields(cls):
            value, choices = getattr(getattr(config, section), field.name), field.metadata["choices"]
            if choices and value is not None:
                check_choice(value, choices, flag_name(field))
    # the model's options, checked by its config; its image size is checked when the model is built
    stride = parse_variant(config.model.name).replace(**config.architecture()).stride
    ViTConfig.from_variant(config.model.name, image_size=stride, **config.model_options())


def json_ready(config: TrainConfig) -> dict[str, Any]:
    """The config as flat JSON values (tuples become lists): the layout of ``run.json``."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in config.flat().items()}


def run_differences(saved: Mapping[str, Any], config: TrainConfig) -> list[str]:
    """Fields (other than :data:`RUN_ONLY_FIELDS`) whose value differs from a saved run's. A model option that is
    unset (or that an older run.json lacks) is its default (``remat: false`` = unset)."""
    current = json_ready(config)
    defaults = {f.name: f.default for f in dataclasses.fields(ViTConfig) if f.name in MODEL_OPTIONS}

    def value(values: Mapping[str, Any], name: str) -> Any:
        return defaults.get(name) if values.get(name) is None else values[name]

    return sorted(k for k in current if k not in RUN_ONLY_FIELDS and value(saved, k) != value(current, k))


def add_arguments(parser: argparse.ArgumentParser, base: TrainConfig | None = None) -> None:
    """Add an option per field (``--preset``, then a group per section), showing ``base``'s values as defaults."""
    base = base or TrainConfig()
    fields.add_arguments(parser, base)
    for section, cls in SECTIONS.items():
        assert cls.__doc__ is not None  # a dataclass always has one
        fields.add_arguments(parser.add_argument_group(section, cls.__doc__.splitlines()[0]), getattr(base, section))


def from_args(namespace: argparse.Namespace, base: TrainConfig | None = None) -> TrainConfig:
    """``base`` (default: :class:`TrainConfig`) with the options the command line gave."""
    known = {"preset", *FLAT_NAMES}
    return (base or TrainConfig()).replace(**{k: v for k, v in vars(namespace).items() if k in known})
