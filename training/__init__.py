"""Training ViTs with ``model.fit`` on every Keras backend, resumable from checkpoints.

TensorFlow: any ``tf.distribute`` strategy; JAX: ``keras.distribution`` (data or model parallel on one host);
torch: one device. The input pipeline is tf.data on every backend.

Modules: ``config`` (the settings, their sections and presets), ``fields`` (settings declared once, with
the command-line options generated from them), ``strategy`` (choose a tf.distribute strategy or a
keras.distribution), ``data`` (digits / image folder / TFDS sources), ``pipeline`` (tf.data augmentation
and preprocessing), ``schedules`` (warmup + decay from Keras' schedules), ``optimizers`` (clipping that is
correct across replicas), ``checkpoint`` (one checkpoint format for every backend), ``loop`` (resumable
``fit``), ``steps`` (what every run does: data, strategy, resolve, build, compile), ``runner`` (the one
training run every command goes through), ``supervised`` (its classification task), ``masked_patch`` (masked
patch prediction and its task); and the commands ``finetune``, ``pretrain`` and ``ablation``.

The entry point is ``from keras_vit.training.finetune import finetune`` (``keras_vit.training.finetune`` is the module).
The names below and the modules are loaded on first use, so ``python -m keras_vit.training.finetune`` does not
import its own module twice.
"""

import keras_vit  # noqa: F401  (first: it picks TensorFlow's CPU kernels before TensorFlow loads)
from keras_vit.lazy import lazy_attributes

_EXPORTS = {
    "FinetuneResult": "keras_vit.training.supervised",
    "train_classifier": "keras_vit.training.supervised",
    "build_model": "keras_vit.training.steps",
    "compile_model": "keras_vit.training.steps",
    "prepare": "keras_vit.training.steps",
    "TrainConfig": "keras_vit.training.config",
    "PRESETS": "keras_vit.training.config",
    "get_strategy": "keras_vit.training.strategy",
    "WarmupDecay": "keras_vit.training.schedules",
    "build_optimizer": "keras_vit.training.optimizers",
    "load_source": "keras_vit.training.data",
    "Augment": "keras_vit.training.pipeline",
    "train_dataset": "keras_vit.training.pipeline",
    "eval_dataset": "keras_vit.training.pipeline",
    "fit": "keras_vit.training.loop",
    "Checkpointer": "keras_vit.training.checkpoint",
}
_SUBMODULES = (
    "ablation",
    "checkpoint",
    "config",
    "data",
    "errors",
    "finetune",
    "launch",
    "loop",
    "masked_patch",
    "optimizers",
    "outputs",
    "pipeline",
    "pretrain",
    "runner",
    "schedules",
    "steps",
    "strategy",
    "supervised",
)
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS, _SUBMODULES)
