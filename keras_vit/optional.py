"""Dependencies imported only by the functions that need them (:func:`require`), naming the install command."""

from __future__ import annotations

import importlib
import types

__all__ = ["INSTALL", "require"]

# module -> the command that installs it
INSTALL = {
    "tensorflow": "pip install tensorflow",
    "tensorflow_datasets": "pip install tensorflow-datasets",
    "ai_edge_litert": "pip install ai-edge-litert",
    "onnxruntime": "pip install onnxruntime",
    "onnx": "pip install 'keras-vit[export]'",
    "tf2onnx": "pip install 'keras-vit[export]'",
    "openvino": "pip install 'keras-vit[openvino]'",
    "nncf": "pip install 'keras-vit[openvino]'",
}


def require(module: str, purpose: str) -> types.ModuleType:
    """``module``, imported now; if it is not installed, an ``ImportError`` saying what needs it and how to install."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != module.split(".")[0]:
            raise  # installed, but something it imports is missing: that error says more
        install = INSTALL.get(module.split(".")[0], f"pip install {module.split('.')[0]}")
        raise ImportError(f"{purpose} needs {module}, which is not installed: {install}", name=module) from exc
