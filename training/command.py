"""What a training command does before TensorFlow loads: check its output folder, its dataset and its weights, then
load TensorFlow quietly."""

from __future__ import annotations

import os

from keras_vit.cli import load_tensorflow
from keras_vit.names import check_weights
from keras_vit.training import outputs
from keras_vit.training.config import TrainConfig, check_dataset
from keras_vit.training.distributed.launch import JOB_ADDRESSES

__all__ = ["start"]


def start(config: TrainConfig) -> None:
    """Refuse an output folder no run may use (one process only: a worker leaves it to the chief), a ``--dataset``
    that is a file or a missing folder, ``--weights`` found nowhere (unless the folder holds a run to go on with);
    then :func:`keras_vit.cli.load_tensorflow`."""
    run = config.run
    if not any(name in os.environ for name in ("TF_CONFIG", JOB_ADDRESSES)):
        outputs.check_usable(run.output_dir, run.overwrite)
    check_dataset(config.data.dataset)
    if run.overwrite or not outputs.is_run_folder(run.output_dir):
        check_weights(config.model.weights)
    load_tensorflow()
