"""TensorFlow's CPU kernels: oneDNN on by default for keras_vit users (faster ViTs; docs/performance.md).

``import keras_vit`` calls :func:`prefer_onednn`: on x86-64, before TensorFlow loads, it sets an unset
``TF_ENABLE_ONEDNN_OPTS`` to ``1`` (a value the user set is kept). :func:`onednn_enabled` says which kernels run.
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
