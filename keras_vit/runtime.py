"""TensorFlow's CPU kernels: oneDNN on by default for keras_vit users.

TensorFlow ships two sets of CPU kernels, Eigen's and oneDNN's, and turns oneDNN on by itself only
on CPUs with AVX-512-class features. Elsewhere (AMD Zen, older Intel) it runs Eigen's, and ViT
runs slower with those: on a 2-core Zen 3, B/16 inference at batch 32 is 1.36x faster with oneDNN
and a training step 1.16x faster, mostly because Eigen's batched matmuls (the two attention
products) reach a third to a half of oneDNN's speed (README, Performance).
The switch is the environment variable ``TF_ENABLE_ONEDNN_OPTS``, read once when TensorFlow loads.

``import keras_vit`` calls :func:`prefer_onednn` (and imports no Keras itself): on x86-64, if TensorFlow
is not loaded yet and the variable is unset, it sets it to ``1``. A value the user set, ``0``
included, is kept; if TensorFlow was imported first, nothing changes (import keras_vit first, or
set the variable). :func:`onednn_enabled` says which kernels this process runs.
"""

from __future__ import annotations

import os
import platform
import sys

ONEDNN_VARIABLE = "TF_ENABLE_ONEDNN_OPTS"
X86_64 = ("x86_64", "amd64")  # platform.machine() names where oneDNN is offered


def prefer_onednn() -> None:
    """Ask TensorFlow for its oneDNN CPU kernels unless the user chose, or it is too late."""
    if "tensorflow" not in sys.modules and ONEDNN_VARIABLE not in os.environ and platform.machine().lower() in X86_64:
        os.environ[ONEDNN_VARIABLE] = "1"


def onednn_enabled() -> bool:
    """Whether this process's TensorFlow runs its oneDNN CPU kernels (loads TensorFlow)."""
    from tensorflow.python.util import _pywrap_util_port

    return bool(_pywrap_util_port.IsMklEnabled())
