"""Masked patch pre-training into ``OUT/pretrain`` (saving ``OUT/encoder.keras``), then fine-tuning into
``OUT/finetune`` (and ``OUT/scratch``): ``python -m keras_vit.training.pretrain`` (docs/training.md)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING

from keras_vit import fields
from keras_vit.cli import HelpFormatter, add_debug_flag, command_errors
from keras_vit.lazy import lazy_attributes
from keras_vit.training import command
from keras_vit.training import config as config_lib
from keras_vit.training.config import TrainConfig
from keras_vit.training.pretrain_options import PretrainConfig, check_pretrain
from keras_vit.training.pretrain_options import summary_table as summary_table  # a name of this module

if TYPE_CHECKING:
    from keras_vit.training.pretraining import PretrainResult

# What runs the pre-training, imported on first use: the command's module imports no Keras (its --help is quick).
_PRETRAINING = ("HEAD_LAYERS", "LoadEncoder", "PretrainResult", "copy_encoder_weights", "masked_setup", "pretrain")
__all__ = sorted(["PretrainConfig", "main", "parser", "summary_table", *_PRETRAINING])

BASE = TrainConfig().replace(output_dir="runs/pretrain")  # the command's defaults


def parser() -> argparse.ArgumentParser:
    """``python -m keras_vit.training.finetune``'s options plus the masked-patch ones (:class:`PretrainConfig`)."""
    p = argparse.ArgumentParser(
        prog="python -m keras_vit.training.pretrain",
        description="Pre-train a ViT by masked patch prediction (the paper's Section 4.6), then fine-tune it "
        "as keras_vit.training.finetune does. Without a dataset: a small ViT on scikit-learn's digits, "
        "offline.",
        formatter_class=HelpFormatter,
    )
    config_lib.add_arguments(p, BASE)
    fields.add_arguments(p.add_argument_group("masked patch prediction"), PretrainConfig())
    add_debug_flag(p)
    return p


def main(argv: Sequence[str] | None = None) -> PretrainResult:
    """Parse the command line and run :func:`pretrain`; an error is one line on stderr and exit status 1."""
    args = parser().parse_args(argv)
    with command_errors(args):
        config = config_lib.from_args(args, BASE)
        options = PretrainConfig(**fields.given(args, PretrainConfig))
        check_pretrain(config, options)
        command.start(config)
        from keras_vit.training.pretraining import pretrain

        return pretrain(config, options)


__getattr__, __dir__ = lazy_attributes(__name__, dict.fromkeys(_PRETRAINING, "keras_vit.training.pretraining"), ())

if __name__ == "__main__":
    main()
