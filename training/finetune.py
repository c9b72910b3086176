"""Fine-tune a (pre-trained) ViT on a dataset, or train one from scratch: ``python -m keras_vit.training.finetune``.

The command and :func:`finetune` run :func:`keras_vit.training.supervised.train_classifier` (docs/training.md);
with no arguments it trains a small ViT on scikit-learn's digits offline.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING

from keras_vit.cli import HelpFormatter, add_debug_flag, command_errors
from keras_vit.lazy import lazy_attributes
from keras_vit.training import command
from keras_vit.training import config as config_lib
from keras_vit.training.config import TrainConfig

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

    from keras_vit.training.supervised import FinetuneResult

__all__ = ["FinetuneResult", "finetune", "main", "parser"]


def finetune(
    config: TrainConfig | None = None,
    *,
    callbacks: Sequence[keras.callbacks.Callback] = (),
    strategy: str | tf.distribute.Strategy | None = None,
    **fields,
) -> FinetuneResult:
    """Train as ``config`` says, changed by ``fields`` (flat :class:`TrainConfig` names: ``lr=0.1``, ``model="S/16"``).
    ``callbacks`` go to ``model.fit``; ``strategy`` is a name or a ready ``tf.distribute.Strategy``."""
    from keras_vit.training.supervised import train_classifier

    if isinstance(strategy, str):
        fields["strategy"], strategy = strategy, None
    return train_classifier((config or TrainConfig()).replace(**fields), callbacks=callbacks, strategy=strategy)


def parser() -> argparse.ArgumentParser:
    """The command line: one option per :class:`TrainConfig` field."""
    p = argparse.ArgumentParser(
        prog="python -m keras_vit.training.finetune",
        description="Fine-tune a (pre-trained) ViT, or train one from scratch, with model.fit. Without a "
        "dataset: a small ViT on scikit-learn's digits, offline. Unset options come from the preset.",
        formatter_class=HelpFormatter,
    )
    config_lib.add_arguments(p)
    add_debug_flag(p)
    return p


def main(argv: Sequence[str] | None = None) -> FinetuneResult:
    """Parse the command line and run :func:`finetune`; an error is one line on stderr and exit status 1."""
    args = parser().parse_args(argv)
    with command_errors(args):
        config = config_lib.from_args(args)
        command.start(config)
        return finetune(config)


__getattr__, __dir__ = lazy_attributes(__name__, {"FinetuneResult": "keras_vit.training.supervised"}, ())

if __name__ == "__main__":
    main()
