"""Keras finds keras_vit's layers in a saved ``.keras`` model once ``import keras_vit`` has run: the layer modules
are imported as soon as Keras is loaded (:func:`register_when_keras_loads`)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Sequence
from typing import cast

__all__ = ["LAYER_MODULES", "import_layer_modules", "register_when_keras_loads"]

# The modules that register layers with Keras (keras.saving.register_keras_serializable).
LAYER_MODULES = (
    "keras_vit.layers",
    "keras_vit.heads",
    "keras_vit.position",
    "keras_vit.resnet",
    "keras_vit.tokens",
    "keras_vit.models",
    "keras_vit.features",
    "keras_vit.preprocessing",
)


def import_layer_modules() -> None:
    """Register every keras_vit layer with Keras (imports Keras)."""
    for name in LAYER_MODULES:
        importlib.import_module(name)


def register_when_keras_loads() -> None:
    """Register keras_vit's layers now if Keras is loaded, else once it is."""
    if "keras" in sys.modules:
        import_layer_modules()
    elif not any(isinstance(finder, _KerasWatch) for finder in sys.meta_path):
        sys.meta_path.insert(0, _KerasWatch())


class _KerasWatch(importlib.abc.MetaPathFinder):
    """Watches the imports of Keras and of :data:`LAYER_MODULES` (found by the other finders); when one ends,
    Keras is loaded and none is still running, it leaves ``sys.meta_path`` and imports the layer modules."""

    def __init__(self) -> None:
        self.running: set[str] = set()

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name != "keras" and name not in LAYER_MODULES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Watched(spec.loader, self)
                return spec
        return None

    def ended(self) -> None:
        """A watched module has run: import the layer modules if it is time."""
        if not self.running and "keras" in sys.modules and self in sys.meta_path:
            sys.meta_path.remove(self)
            import_layer_modules()


class _Watched(importlib.abc.Loader):
    """A module's own loader, telling the watch when the module has run; the module keeps the own loader."""

    def __init__(self, loader: importlib.abc.Loader, watch: _KerasWatch) -> None:
        self.loader = loader
        self.watch = watch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        spec = cast(importlib.machinery.ModuleSpec, module.__spec__)  # a module being imported has its spec
        module.__loader__ = spec.loader = self.loader
        self.watch.running.add(module.__name__)
        try:
            self.loader.exec_module(module)
        finally:
            self.watch.running.discard(module.__name__)
        self.watch.ended()
