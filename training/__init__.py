"""Training ViTs with ``model.fit`` under any ``tf.distribute`` strategy, resumable from checkpoints.

Modules: ``strategy`` (choose a tf.distribute strategy), ``data`` (digits / image folder / TFDS
sources), ``pipeline`` (tf.data augmentation and preprocessing), ``schedules`` (warmup + decay),
``optimizers`` (clipping that is correct across replicas), ``loop`` (resumable ``fit``), ``config``
(settings and presets) and ``finetune`` (the command and :func:`finetune`).

The entry point is ``from training.finetune import finetune`` (``training.finetune`` is the module).
The names below are loaded on first use, so ``python -m training.finetune`` does not import its
own module twice.
"""

import importlib

import keras_vit  # noqa: F401  (first: it picks TensorFlow's CPU kernels before TensorFlow loads)

_EXPORTS = {
    "FinetuneResult": "training.finetune",
    "build_model": "training.finetune",
    "TrainConfig": "training.config",
    "PRESETS": "training.config",
    "get_strategy": "training.strategy",
    "WarmupDecay": "training.schedules",
    "build_optimizer": "training.optimizers",
    "load_source": "training.data",
    "Augment": "training.pipeline",
    "train_dataset": "training.pipeline",
    "eval_dataset": "training.pipeline",
    "fit": "training.loop",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'training' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
