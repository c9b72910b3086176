"""What a training command does before TensorFlow loads: check its output folder, then load TensorFlow quietly."""

from __future__ import annotations

import os

from keras_vit.cli import load_tensorflow
from keras_vit.training import outputs
from keras_vit.training.config import TrainConfig
from keras_vit.training.distributed.launch import JOB_ADDRESSES

__all__ = ["start"]


def start(config: TrainConfig) -> None:
    """Refuse an output folder no run may use (a file, a folder of other files: :func:`outputs.check_usable`) in a
    run of one process (a worker of several leaves it to the chief), then :func:`keras_vit.cli.load_tensorflow`."""
    if not any(name in os.environ for name in ("TF_CONFIG", JOB_ADDRESSES)):
        outputs.check_usable(config.run.output_dir, config.run.overwrite)
    load_tensorflow()
