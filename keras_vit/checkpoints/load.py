"""Loading a published ``.npz`` checkpoint into a model, and building the model a checkpoint describes.

:func:`load_weights` checks everything before it assigns anything: missing keys, unexpected keys and
shape mismatches are listed, each by name, in one ``ValueError``, and the model is left untouched. A
model without the checkpoint's classifier (``include_top=False``, another ``num_classes``, no
``pre_logits`` layer) skips the head on purpose, with a warning that says what was skipped and why.
Every format :mod:`~keras_vit.checkpoints.read` reads arrives here in the ``.npz`` layout, so all of this
holds for timm, Hugging Face and keras-hub checkpoints too; a Keras ``.weights.h5`` goes to
``keras.Model.load_weights``.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Mapping

import keras
import numpy as np

from keras_vit.checkpoints.inspect import checkpoint_info
from keras_vit.checkpoints.keymap import KeyMap, npz_key_map
from keras_vit.checkpoints.read import CheckpointArrays, read_checkpoint, with_num_heads
from keras_vit.layers import TransformerBlock
from keras_vit.models import DEFAULT_IMAGE_SIZE, DEFAULT_NUM_CLASSES, build_vit, uses_fc_norm
from keras_vit.resnet import ResNetStem

__all__ = ["LoadResult", "checkpoint_defaults", "load_weights", "model_from_checkpoint"]

_MAX_LISTED = 20


@dataclasses.dataclass(frozen=True)
class LoadResult:
    """What :func:`load_weights` did: the checkpoint keys it loaded and those it skipped on purpose."""

    loaded: tuple[str, ...]
    skipped: tuple[str, ...]


def _head_keys(arrays: Mapping, layer: str) -> list[str]:
    return [key for key in arrays if key.startswith(f"{layer}/")]


def _skipped_head(key_map: KeyMap, arrays: Mapping) -> tuple[set[str], str | None]:
    """The checkpoint's classifier keys the model does not take on purpose, and why (drop-head fine-tuning)."""
    head, pre_logits = _head_keys(arrays, "head"), _head_keys(arrays, "pre_logits")
    if "head/kernel" not in key_map:
        return set(head + pre_logits), "the model has no classification head (include_top=False)" if head else None
    if pre_logits and "pre_logits/kernel" not in key_map:
        width = arrays["pre_logits/bias"].shape[0]
        return set(head + pre_logits), (
            f"the model has no pre_logits layer (the checkpoint's is {width} wide; representation_size={width} "
            "keeps it), so the head trained on it is not loaded either"
        )
    if head and arrays["head/bias"].shape[-1] != key_map["head/bias"][0].shape[-1]:
        classes, model_classes = arrays["head/bias"].shape[-1], key_map["head/bias"][0].shape[-1]
        return set(head), f"the checkpoint's head has {classes} classes, the model's {model_classes}"
    return set(), None


def _listing(title: str, items: list[str]) -> str:
    shown = items[:_MAX_LISTED]
    more = f"\n    ... and {len(items) - len(shown)} more" if len(items) > len(shown) else ""
    return f"  {title} ({len(items)}):\n" + "\n".join(f"    {item}" for item in shown) + more


def _layers_of(model: keras.Model, cls) -> list:
    return [layer for layer in model._flatten_layers(include_self=False) if isinstance(layer, cls)]


def _check_model_options(model: keras.Model, arrays: CheckpointArrays) -> None:
    """A ``ValueError`` where the model's structure differs from the source's (``fc_norm``); a warning where
    only its numerics do (GELU, a hybrid's ResNet epsilons)."""
    options = arrays.model_options
    fix = "build the model with {} (keras_vit.model_from_checkpoint does)"
    if "fc_norm" in options and options["fc_norm"] != uses_fc_norm(model):
        raise ValueError(
            f"Cannot load {arrays.source} into model {model.name!r}: the checkpoint's final LayerNorm is "
            f"{'after' if options['fc_norm'] else 'before'} the pooling; "
            + fix.format(f"fc_norm={options['fc_norm']}.")
        )
    blocks = _layers_of(model, TransformerBlock)
    if "gelu" in options and blocks and blocks[0].gelu != options["gelu"]:
        warnings.warn(
            f"{arrays.source} ({arrays.format}) was trained with gelu={options['gelu']!r}, model {model.name!r} uses "
            f"{blocks[0].gelu!r}: outputs differ slightly; " + fix.format(f"gelu={options['gelu']!r}") + ".",
            stacklevel=3,
        )
    stems = _layers_of(model, ResNetStem)
    resnet = options.get("resnet_options", {})
    if stems and any(getattr(stems[0], name) != value for name, value in resnet.items()):
        warnings.warn(
            f"{arrays.source} ({arrays.format}) uses the ResNet numerics {resnet}; model {model.name!r}'s differ: "
            + fix.format("resnet=dict(num_layers=..., **keras_vit.resnet.TIMM_RESNET)")
            + ".",
            stacklevel=3,
        )


def _load_keras_weights(model: keras.Model, arrays: CheckpointArrays) -> LoadResult:
    try:
        model.load_weights(arrays.keras_weights)
    except ValueError as exc:
        raise ValueError(
            f"Cannot load the Keras weights file {arrays.source} into model {model.name!r} (a .weights.h5 holds "
            f"no architecture: build the same model it was saved from): {exc}"
        ) from exc
    return LoadResult(loaded=tuple(variable.path for variable in model.weights), skipped=())


def load_weights(
    model: keras.Model,
    weights: str | os.PathLike | Mapping[str, np.ndarray],
    *,
    resize_method: str = "zoom_linear",
) -> LoadResult:
    """Load a checkpoint into ``model``: a Google ``.npz``, a timm or Hugging Face state dict or folder, a
    keras-hub preset, or a Keras ``.weights.h5`` (see :mod:`keras_vit.checkpoints.formats`).

    Args:
        model: a keras-vit model (plain or hybrid).
        weights: a zoo catalogue name (downloaded into the Keras cache), a path to a file or folder, or
            arrays as a mapping (``.npz``, timm or Hugging Face keys).
        resize_method: how position embeddings of another grid size are resized (see
            :mod:`keras_vit.position`).

    Raises ``ValueError`` listing every missing key, unexpected key and shape mismatch; nothing is
    assigned then.
    """
    arrays = read_checkpoint(weights)
    if arrays.format == "keras_weights":
        return _load_keras_weights(model, arrays)
    blocks = _layers_of(model, TransformerBlock)
    if blocks:
        arrays = with_num_heads(arrays, blocks[0].num_heads)
    _check_model_options(model, arrays)
    key_map = npz_key_map(model, resize_method=resize_method)
    skipped, reason = _skipped_head(key_map, arrays)
    for key in skipped:
        key_map.pop(key, None)
    missing = [key for key in key_map if key not in arrays]
    unexpected = [key for key in arrays if key not in key_map and key not in skipped]
    values, mismatched = _transformed(key_map, arrays)
    if missing or unexpected or mismatched:
        sections = [
            _listing(title, items)
            for title, items in (
                ("missing from the checkpoint", missing),
                ("unexpected in the checkpoint (no such variable in the model)", unexpected),
                ("shape mismatches", mismatched),
            )
            if items
        ]
        try:
            looks = f"\nThe checkpoint looks like {checkpoint_info(arrays).describe()}."
        except ValueError:
            looks = ""
        raise ValueError(f"Cannot load {arrays.source} into model {model.name!r}:\n" + "\n".join(sections) + looks)
    for variable, value in values:
        variable.assign(value.astype(variable.dtype))
    if reason:
        warnings.warn(
            f"Loaded {arrays.source} into {model.name!r} without {', '.join(sorted(skipped))}: {reason}. "
            "The model's head stays at its initialisation.",
            stacklevel=2,
        )
    return LoadResult(loaded=tuple(key_map), skipped=tuple(sorted(skipped)))


def _transformed(key_map: KeyMap, arrays: Mapping) -> tuple[list, list[str]]:
    """Group keys by variable, transform and concatenate; return ``[(variable, value)]`` and mismatches."""
    groups: dict[int, tuple[keras.Variable, list[str]]] = {}
    for key, (variable, _) in key_map.items():
        groups.setdefault(id(variable), (variable, []))[1].append(key)
    values, mismatched = [], []
    for variable, keys in groups.values():
        present = [key for key in keys if key in arrays]
        if len(present) < len(keys):
            continue  # reported as missing
        parts = []
        for key in keys:
            try:
                parts.append(np.asarray(key_map[key][1](arrays[key])))
            except ValueError as exc:
                mismatched.append(f"{key}: {exc}")
        if len(parts) < len(keys):
            continue
        value = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=-1)
        if value.shape != tuple(variable.shape):
            stored = ", ".join(f"{key} {arrays[key].shape}" for key in keys)
            arrow = "" if len(keys) == 1 and arrays[keys[0]].shape == value.shape else f" -> {value.shape}"
            mismatched.append(f"{stored}{arrow}: the model's {variable.path} is {tuple(variable.shape)}")
        else:
            values.append((variable, value))
    return values, mismatched


def checkpoint_defaults(
    arrays: Mapping[str, np.ndarray], image_size, num_classes: int | None, representation_size: int | None
) -> tuple:
    """``(image_size, num_classes, representation_size)`` with the checkpoint's values where unset (None).

    ``num_classes=None`` keeps the checkpoint's whole classifier: its classes and its ``pre_logits``
    layer (unless ``representation_size`` is given).
    """
    if getattr(arrays, "format", "npz") == "keras_weights":
        return image_size, num_classes, representation_size  # no shapes to read before the model exists
    info = checkpoint_info(arrays)
    if image_size is None:
        image_size = info.image_size
    if num_classes is None and info.num_classes is not None:
        num_classes = info.num_classes
        representation_size = representation_size or info.representation_size
    return image_size, num_classes, representation_size


def model_from_checkpoint(
    weights: str | os.PathLike | Mapping[str, np.ndarray], *, resize_method: str = "zoom_linear", **kwargs
) -> keras.Model:
    """Build the model a checkpoint's shapes describe and load it; ``kwargs`` go to
    :func:`keras_vit.models.build_vit` (``gelu``, ``include_top``, ``resnet_options``, ...), except
    ``num_heads``, for a timm state dict (which does not record it; default: guessed from the width).

    The architecture (patch size, widths, depth, a hybrid's ResNet stages and width) and the classifier come from
    the checkpoint; image size, classes and ``pre_logits`` too unless given (see :func:`checkpoint_defaults`);
    a foreign checkpoint's numerics (``gelu="exact"``, ``fc_norm``, timm's ResNet epsilons) too unless given.
    The model is named from :mod:`keras_vit.variants` (``vit_b16``, ``vit_r50_b16``).
    """
    arrays = read_checkpoint(weights)
    if arrays.format == "keras_weights":
        raise ValueError(
            f"{arrays.source} is a Keras .weights.h5: it holds no architecture. Build the model it was saved from "
            "and load it there (keras_vit.ViT(..., weights=path) or model.load_weights(path))."
        )
    num_heads = kwargs.pop("num_heads", None)
    if num_heads is not None:
        arrays = with_num_heads(arrays, num_heads)
    info = checkpoint_info(arrays)
    for option, value in arrays.model_options.items():
        kwargs.setdefault(option, value)
    root = arrays.get("conv_root/kernel")
    if root is not None:  # a hybrid: its ResNet's width is the root convolution's output channels
        kwargs["resnet_options"] = {"width": int(root.shape[-1]), **(kwargs.get("resnet_options") or {})}
    kwargs.setdefault("classifier", info.classifier)
    image_size, num_classes, representation_size = checkpoint_defaults(
        arrays, kwargs.pop("image_size", None), kwargs.pop("num_classes", None), kwargs.pop("representation_size", None)
    )
    model = build_vit(
        info.architecture,
        image_size=DEFAULT_IMAGE_SIZE if image_size is None else image_size,
        num_classes=DEFAULT_NUM_CLASSES if num_classes is None else num_classes,
        representation_size=representation_size,
        **kwargs,
    )
    load_weights(model, arrays, resize_method=resize_method)
    return model
