"""Training ViTs with ``model.fit`` on every Keras backend, resumable from checkpoints (docs/training.md). The names
below and the modules load on first use (``python -m keras_vit.training.finetune`` imports its module once)."""

import pkgutil

import keras_vit  # noqa: F401  (first: it picks TensorFlow's CPU kernels before TensorFlow loads)
from keras_vit.lazy import lazy_attributes

_EXPORTS = {
    "FinetuneResult": "keras_vit.training.supervised",
    "train_classifier": "keras_vit.training.supervised",
    "build_model": "keras_vit.training.model",
    "compile_model": "keras_vit.training.model",
    "prepare": "keras_vit.training.setup",
    "TrainConfig": "keras_vit.training.config",
    "PRESETS": "keras_vit.training.config",
    "get_strategy": "keras_vit.training.distributed.strategy",
    "WarmupDecay": "keras_vit.training.schedules",
    "build_optimizer": "keras_vit.training.optimizers",
    "load_source": "keras_vit.training.data",
    "Augment": "keras_vit.training.pipeline",
    "train_dataset": "keras_vit.training.pipeline",
    "eval_dataset": "keras_vit.training.pipeline",
    "fit": "keras_vit.training.loop",
    "Checkpointer": "keras_vit.training.checkpoint",
}
_SUBMODULES = tuple(module.name for module in pkgutil.iter_modules(__path__))
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS, _SUBMODULES)
