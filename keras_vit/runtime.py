"""TensorFlow's CPU kernels: :func:`prefer_onednn` (called by ``import keras_vit``) sets ``TF_ENABLE_ONEDNN_OPTS=1``
on x86-64 where it is unset; :func:`onednn_enabled` says which kernels run. See docs/performance.md."""

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
