"""Step 5 of the checkpoint pipeline, load, and the driver of the steps: :func:`read_checkpoint`,
:func:`load_weights`, :func:`checkpoint_model_config` and :func:`model_from_checkpoint`. See docs/design.md."""

from __future__ import annotations

import dataclasses
import os
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import keras
import numpy as np

from keras_vit.checkpoints.from_huggingface import (
    huggingface_to_npz,
    looks_like_huggingface,
    looks_like_tower,
    tower_to_npz,
)
from keras_vit.checkpoints.from_keras_hub import read_keras_hub_preset
from keras_vit.checkpoints.from_timm import looks_like_timm, timm_to_npz
from keras_vit.checkpoints.infer import (
    ARCHITECTURE,
    TOKEN_FIELDS,
    CheckpointInfo,
    check_recorded,
    checkpoint_config,
    checkpoint_info,
    differences,
    format_fields,
)
from keras_vit.checkpoints.keras_files import (
    keras_weights_file,
    load_keras_weights,
    load_saved_model,
    quantized_saved_model,
    read_saved_model,
)
from keras_vit.checkpoints.keymap import KeyMap, layers_of, model_arrays, npz_key_map
from keras_vit.checkpoints.read import resolve_weights
from keras_vit.checkpoints.source import CheckpointArrays, detect_format, read_npz, read_state_file
from keras_vit.config import ViTConfig, field_names, resnet_fields
from keras_vit.heads import MAP_PREFIX
from keras_vit.layers import TransformerBlock
from keras_vit.models import build_vit, model_options
from keras_vit.variants import parse_variant

__all__ = [
    "LoadResult",
    "checkpoint_defaults",
    "checkpoint_model_config",
    "from_state_dict",
    "load_weights",
    "model_from_checkpoint",
    "read_checkpoint",
    "read_path",
    "with_num_heads",
]

_MAX_LISTED = 20


# --- reading: the source and convert steps, in order -----------------------------------------------


def from_state_dict(
    state: Mapping[str, np.ndarray],
    source: str,
    config: Mapping | None = None,
    fmt: str = "npz",
    num_heads: int | None = None,
) -> CheckpointArrays:
    """Arrays in any key layout as :class:`CheckpointArrays` in the ``.npz`` layout: timm and Hugging Face state
    dicts converted (``config``: a Hugging Face ``config.json``; ``num_heads``: what a timm file's metadata records).
    Raises ``ValueError`` for an incomplete or unknown state dict."""
    try:
        if looks_like_timm(state):
            arrays, options = timm_to_npz(state, num_heads=num_heads, source=source)
            options |= format_fields(arrays)
            return CheckpointArrays(arrays, source, format="timm", model_options=options, heads_known=bool(num_heads))
        if looks_like_tower(state):
            arrays, options, known = tower_to_npz(state, config, source=source)
            return CheckpointArrays(arrays, source, format="huggingface", model_options=options, heads_known=known)
        if looks_like_huggingface(state):
            arrays, options, known = huggingface_to_npz(state, config, source=source, recorded=TOKEN_FIELDS)
            check_recorded(config or {}, arrays, source)
            options |= format_fields(arrays)
            return CheckpointArrays(arrays, source, format="huggingface", model_options=options, heads_known=known)
    except (KeyError, TypeError, AttributeError) as exc:  # a tensor a whole layer needs is absent
        raise ValueError(f"{source} is an incomplete ViT state dict: a layer lacks {exc}.") from exc
    if fmt != "npz" and "embedding/kernel" not in state:
        listed = ", ".join(sorted(state)[:5]) or "none"
        raise ValueError(
            f"{source} is {fmt} but not a ViT state dict keras-vit knows (timm: patch_embed.proj.weight, "
            f"blocks.*; Hugging Face: [vit.]embeddings.patch_embeddings.*); its keys start {listed}."
        )
    return CheckpointArrays(state, source)


def read_path(path: str | os.PathLike) -> CheckpointArrays:
    """The arrays of an existing checkpoint file or folder of any format
    :func:`~keras_vit.checkpoints.source.detect_format` knows; a ``ValueError`` naming what is wrong with it."""
    path = Path(path)
    fmt = detect_format(path)
    if fmt == "npz":
        return read_npz(path)
    if fmt == "keras":
        return read_saved_model(path)
    if fmt == "keras_hub":
        arrays, options = read_keras_hub_preset(path)
        return CheckpointArrays(arrays, str(path), format=fmt, model_options=options)
    state, path, fmt, config, heads = read_state_file(path, fmt)
    return from_state_dict(state, str(path), config, fmt, heads)


def read_checkpoint(weights: str | os.PathLike | Mapping[str, np.ndarray]) -> CheckpointArrays:
    """The arrays of ``weights``: a catalogue name (downloaded and checked), a path of any format :func:`read_path`
    reads, or arrays already read (a state dict in the ``.npz``, timm or Hugging Face layout)."""
    if isinstance(weights, CheckpointArrays):
        return weights
    if isinstance(weights, Mapping):
        return from_state_dict(weights, "the given arrays")
    return read_path(resolve_weights(weights))


_ATTENTION_KEY = re.compile(
    r"(?:Transformer/encoderblock_\d+/MultiHeadDotProductAttention_1|MAPHead_0/MultiHeadDotProductAttention_0)"
    r"/(query|key|value|out)/kernel"
)


def with_num_heads(arrays: CheckpointArrays, num_heads: int) -> CheckpointArrays:
    """``arrays`` with its attention arrays regrouped into ``num_heads`` heads where the file did not record the
    head count (``heads_known=False``); unchanged otherwise."""
    if arrays.heads_known:
        return arrays
    regrouped = dict(arrays)
    for key, kernel in arrays.items():
        match = _ATTENTION_KEY.fullmatch(key)
        if not match or kernel.size % num_heads:
            continue
        bias = key[: -len("kernel")] + "bias"
        if match[1] == "out":
            regrouped[key] = kernel.reshape(num_heads, -1, kernel.shape[-1])
        else:
            regrouped[key] = kernel.reshape(kernel.shape[0], num_heads, -1)
            if bias in arrays:
                regrouped[bias] = arrays[bias].reshape(num_heads, -1)
    return dataclasses.replace(arrays, arrays=regrouped, heads_known=True)


# --- loading: every key checked, then assigned ------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LoadResult:
    """What :func:`load_weights` did: the checkpoint keys it loaded and those it skipped on purpose."""

    loaded: tuple[str, ...]
    skipped: tuple[str, ...]


def _head_keys(arrays: Mapping, layer: str) -> list[str]:
    return [key for key in arrays if key.startswith(f"{layer}/")]


def _skipped_head(key_map: KeyMap, arrays: Mapping, new_head: bool) -> tuple[set[str], str | None]:
    """The checkpoint's classifier keys the model does not take on purpose (drop-head fine-tuning), and why: the
    warning's text, or None when nothing is skipped or ``new_head`` says the head was dropped or replaced on request
    (a missing ``pre_logits`` layer is still said)."""
    head = _head_keys(arrays, "head") + _head_keys(arrays, "head_dist")
    pre_logits = _head_keys(arrays, "pre_logits")
    model_head = [key for key in key_map if key.split("/")[0] in ("head", "head_dist")]
    if model_head and not head:  # a backbone's file (DINOv2, SigLIP, include_top=False): the head stays as built
        return set(model_head), None if new_head else "the checkpoint has no classification head"
    if "head/kernel" not in key_map:
        reason = "the model has no classification head (include_top=False)"
        return set(head + pre_logits), reason if head and not new_head else None
    if pre_logits and "pre_logits/kernel" not in key_map:
        width = arrays["pre_logits/bias"].shape[0]
        return set(head + pre_logits), (
            f"the model has no pre_logits layer (the checkpoint's is {width} wide; representation_size={width} "
            "keeps it), so the head trained on it is not loaded either"
        )
    if head and arrays["head/bias"].shape[-1] != key_map["head/bias"][0].shape[-1]:
        classes, model_classes = arrays["head/bias"].shape[-1], key_map["head/bias"][0].shape[-1]
        reason = f"the checkpoint's head has {classes} classes, the model's {model_classes}"
        return set(head), None if new_head else reason
    return set(), None


def _shown(keys: list[str]) -> str:
    return ", ".join(keys[:_MAX_LISTED]) + (" and more" if len(keys) > _MAX_LISTED else "")


def _check_values(arrays: CheckpointArrays, keys: list[str]) -> None:
    """A ``ValueError`` naming the file and the arrays that are not weights: of another dtype than floating point
    (integers, booleans, strings, raw records), or holding NaN or infinite values (every output would be NaN)."""
    foreign = [f"{key} ({dtype})" for key in keys if (dtype := np.asarray(arrays[key]).dtype).kind != "f"]
    if foreign:
        raise ValueError(
            f"{arrays.source} holds arrays that are not floating-point weights ({len(foreign)}): {_shown(foreign)}."
        )
    non_finite = [key for key in keys if not np.isfinite(arrays[key]).all()]
    if non_finite:
        raise ValueError(
            f"{arrays.source} holds NaN or infinite values in {len(non_finite)} arrays: {_shown(non_finite)}."
        )


def _listing(title: str, items: list[str]) -> str:
    shown = items[:_MAX_LISTED]
    more = f"\n    ... and {len(items) - len(shown)} more" if len(items) > len(shown) else ""
    return f"  {title} ({len(items)}):\n" + "\n".join(f"    {item}" for item in shown) + more


def _check_model_options(model: keras.Model, arrays: CheckpointArrays) -> None:
    """A ``ValueError`` where a ``"structure"`` option of the config is on in the model and off in the source (or
    the reverse); one warning naming the numerics that differ (GELU, a hybrid's ResNet epsilons)."""
    built = model_options(model)
    differ = {name: value for name, value in arrays.model_options.items() if name in built and built[name] != value}
    if not differ:
        return
    fix = "build the model with {} (keras_vit.model_from_checkpoint does)"
    for name in set(differ) & set(field_names("structure")):
        if (differ[name] in (None, False)) != (built[name] in (None, False)):  # on or off, not a starting value
            raise ValueError(
                f"Cannot load {arrays.source} into model {model.name!r}: the checkpoint has {name}={differ[name]!r}, "
                f"the model {name}={built[name]!r}; " + fix.format(f"{name}={differ[name]!r}.")
            )
    numerics = {name: value for name, value in differ.items() if name in field_names("numerics")}
    if numerics:
        theirs = ", ".join(f"{name}={value!r}" for name, value in numerics.items())
        ours = ", ".join(f"{name}={built[name]!r}" for name in numerics)
        warnings.warn(
            f"{arrays.source} ({arrays.format}) was trained with {theirs}; model {model.name!r} uses {ours}: outputs "
            f"differ slightly; " + fix.format(theirs) + ".",
            stacklevel=3,
        )


def load_weights(
    model: keras.Model,
    weights: str | os.PathLike | Mapping[str, np.ndarray],
    *,
    resize_method: str = "zoom_linear",
    new_head: bool = False,
) -> LoadResult:
    """Load a checkpoint into ``model``: a Google ``.npz``, a timm or Hugging Face state dict or folder, a keras-hub
    preset or a Keras ``.weights.h5`` (:mod:`keras_vit.checkpoints.source`).

    Args: ``model``: a keras-vit model (plain or hybrid). ``weights``: a catalogue name (downloaded into the Keras
    cache), a file or folder, or a mapping of arrays (``.npz``, timm or Hugging Face keys). ``resize_method``: how
    position embeddings of another grid are resized. ``new_head``: the caller asked for a model without the
    checkpoint's head, so a head that does not fit is skipped without the warning (a dropped ``pre_logits`` is still
    said). Raises ``ValueError`` listing every missing key, unexpected key and shape mismatch, before assigning any."""
    if (keras_file := keras_weights_file(weights)) is not None:
        load_keras_weights(model, keras_file)
        return LoadResult(loaded=tuple(variable.path for variable in model.weights), skipped=())
    arrays = read_checkpoint(weights)
    if blocks := layers_of(model, TransformerBlock):
        arrays = with_num_heads(arrays, blocks[0].num_heads)
    _check_model_options(model, arrays)
    key_map = npz_key_map(model, resize_method=resize_method)
    skipped, reason = _skipped_head(key_map, arrays, new_head)
    # the checkpoint's MAP head where the model has none (pooling=None or "avg" on SigLIP)
    unused_pool = set() if f"{MAP_PREFIX}/probe" in key_map else set(_head_keys(arrays, MAP_PREFIX))
    if unused_pool:
        skipped |= unused_pool
        why = "the model pools otherwise (the MAP head is classifier='map' with pooling='map' or a head)"
        if not new_head:  # a head dropped or replaced on request takes its pooling with it, unsaid
            reason = f"{reason}; {why}" if reason else why
    for key in skipped:
        key_map.pop(key, None)
    missing = [key for key in key_map if key not in arrays]
    unexpected = [key for key in arrays if key not in key_map and key not in skipped]
    _check_values(arrays, [key for key in key_map if key in arrays])
    values, mismatched = _transformed(key_map, arrays)
    extra, extra_mismatched = _extra_values(model, key_map, arrays)
    values, mismatched = values + extra, mismatched + extra_mismatched
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
            info = checkpoint_info(arrays)
            why, looks = _differs(info, model), f"\nThe checkpoint looks like {info.describe()}."
        except ValueError as exc:  # what keeps the shapes from telling an architecture (a class token missing)
            why, looks = "", f"\n{exc}"
        raise ValueError(f"Cannot load {arrays.source} into model {model.name!r}{why}:\n" + "\n".join(sections) + looks)
    for variable, value in values:
        variable.assign(np.ascontiguousarray(value.astype(variable.dtype)))
    if reason:
        warnings.warn(
            f"Loaded {arrays.source} into {model.name!r} without {', '.join(sorted(skipped))}: {reason}. "
            "The model's head stays at its initialisation.",
            stacklevel=2,
        )
    return LoadResult(loaded=tuple(key_map), skipped=tuple(sorted(skipped)))


def _differs(info: CheckpointInfo, model: keras.Model) -> str:
    """A sentence naming what of the architecture differs between a checkpoint and ``model`` (``""``: nothing)."""
    try:
        built = checkpoint_info(model_arrays(model))
    except ValueError:  # a model the .npz layout cannot describe
        return ""
    differ = differences(info, built, "the model", ARCHITECTURE)
    return f", another architecture: {differ}" if differ else ""


def _extra_values(model: keras.Model, key_map: KeyMap, arrays: Mapping) -> tuple[list, list[str]]:
    """``[(variable, value)]`` and mismatches for the model's variables outside the ``.npz`` layout that a saved
    keras-vit model holds (``arrays.extra``, by variable path; a 2-D position embedding's rows and columns)."""
    extra = getattr(arrays, "extra", {})
    mapped = {id(variable) for variable, _ in key_map.values()}
    values, mismatched = [], []
    for variable in model.weights:
        if id(variable) in mapped or variable.path not in extra:
            continue
        value = np.asarray(extra[variable.path])
        if value.shape == tuple(variable.shape):
            values.append((variable, value))
        else:
            mismatched.append(
                f"{variable.path} {value.shape}: the model's is {tuple(variable.shape)} (of the position embeddings, "
                "only the published learned_1d ones are resized)"
            )
    return values, mismatched


def _transformed(key_map: KeyMap, arrays: Mapping) -> tuple[list, list[str]]:
    """Group keys by variable, transform and concatenate; return ``[(variable, value)]`` and mismatches."""
    groups: dict[int, tuple[keras.Variable, list[str]]] = {}
    for key, (variable, _) in key_map.items():
        groups.setdefault(id(variable), (variable, []))[1].append(key)
    values, mismatched = [], []
    for variable, keys in groups.values():
        if any(key not in arrays for key in keys):
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


# --- the model a file describes ---------------------------------------------------------------------


def checkpoint_defaults(
    arrays: Mapping[str, np.ndarray], image_size, num_classes: int | None, representation_size: int | None
) -> tuple:
    """``(image_size, num_classes, representation_size)``, the checkpoint's values where unset (None);
    ``num_classes=None`` keeps the whole classifier, ``pre_logits`` included unless ``representation_size`` is given."""
    info = checkpoint_info(arrays) if (config := getattr(arrays, "config", None)) is None else config
    if image_size is None:
        image_size = info.image_size
    if num_classes is None and info.num_classes is not None and getattr(info, "include_top", True):
        num_classes = info.num_classes
        representation_size = representation_size or info.representation_size
    return image_size, num_classes, representation_size


def _check_saved_model(arrays: CheckpointArrays, variant: str | None, fields: Mapping[str, Any]) -> None:
    """A ``ValueError`` naming what differs where ``variant`` or the architecture and structure ``fields`` ask for
    another model than the saved keras-vit model ``arrays`` holds."""
    saved = arrays.config
    assert saved is not None  # a saved keras-vit model's arrays carry its config
    asked = {name: fields[name] for name in field_names("architecture") if name in fields}
    wanted = (saved.architecture if variant is None else parse_variant(variant)).replace(**asked)
    structure = [name for name in field_names("structure") if name in fields and name != "representation_size"]
    asked_model = {**dataclasses.asdict(wanted), **{name: fields[name] for name in structure}}
    file_model = {**dataclasses.asdict(saved.architecture), **{name: getattr(saved, name) for name in structure}}
    differ = [f"{k} {v!r} (the file's: {file_model[k]!r})" for k, v in asked_model.items() if v != file_model[k]]
    if differ:
        raise ValueError(
            f"{arrays.source} holds a {saved.architecture.variant or saved.architecture.model_name} model; the model "
            f"asked for differs: {', '.join(differ)}. Leave the variant and those options out (keras_vit.ViT(None, "
            "weights=...); a command's --model) to take the file's."
        )


def checkpoint_model_config(arrays: CheckpointArrays, variant: str | None = None, **fields: Any) -> ViTConfig:
    """The one rule for a model's defaults from a file: ``fields`` (unset ones: :func:`checkpoint_defaults`) over
    ``variant``, or over the file's own model (:func:`~keras_vit.checkpoints.infer.checkpoint_config`). A saved
    keras-vit model asked to be another is a ``ValueError``; warns where the file does not record the head count."""
    if arrays.config is not None:
        _check_saved_model(arrays, variant, fields)
        variant = None
    elif variant is None and not arrays.heads_known and "num_heads" not in fields:
        guessed = checkpoint_info(arrays).architecture
        warnings.warn(
            f"{arrays.source} does not record its number of attention heads ({arrays.format} state dict): read as "
            f"{guessed.num_heads} heads, the usual for width {guessed.hidden_size}. If the model had another "
            "number, say it: num_heads=N (the commands' --num-heads N).",
            stacklevel=3,
        )
    image_size, num_classes, representation_size = checkpoint_defaults(
        arrays, fields.pop("image_size", None), fields.pop("num_classes", None), fields.pop("representation_size", None)
    )
    given = dict(image_size=image_size, num_classes=num_classes)
    fields.update({name: value for name, value in given.items() if value is not None})
    if variant is not None:
        return ViTConfig.from_variant(variant, representation_size=representation_size, **fields)
    return checkpoint_config(arrays).replace(representation_size=representation_size, **fields)


def model_from_checkpoint(
    weights: str | os.PathLike | Mapping[str, np.ndarray], *, resize_method: str = "zoom_linear", **overrides
) -> keras.Model:
    """The model a checkpoint describes, loaded: ``keras_vit.ViT(None, weights=weights, **overrides)``, but keeping a
    saved model's own ``include_top``, ``pooling``, ... where ``ViT`` would set a default.

    Args: ``weights`` as :func:`read_checkpoint`; ``resize_method`` for position embeddings; ``**overrides``:
    :class:`~keras_vit.config.ViTConfig` fields, ``resnet_options``, or ``num_heads`` for a timm file (default: from
    the width). Returns the model, named from :mod:`keras_vit.variants` (``vit_b16``); a quantized ``.keras`` file's
    model as saved (``keras.saving.load_model``). Raises ``ValueError`` as :func:`checkpoint_model_config` and
    :func:`load_weights` do, and for ``overrides`` of a quantized file."""
    if overrides.get("num_heads") is None:  # the commands pass --num-heads unset as None
        overrides.pop("num_heads", None)
    if (quantized := quantized_saved_model(weights)) is not None:
        if overrides:
            raise ValueError(
                f"{quantized} holds a quantized model, which loads as saved: leave out {sorted(overrides)} (or change "
                "the float model, then quantize it)."
            )
        return load_saved_model(quantized)
    arrays = read_checkpoint(weights)
    overrides.update(resnet_fields(overrides.pop("resnet_options", None) or {}))
    new_head = overrides.get("include_top") is False or overrides.get("num_classes") is not None  # asked for
    model = build_vit(checkpoint_model_config(arrays, **overrides))
    load_weights(model, arrays, resize_method=resize_method, new_head=new_head)
    return model
