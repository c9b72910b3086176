"""Reading checkpoints into the ``.npz`` key layout: catalogue names (downloaded, checked against their entry),
``.npz`` files (keys under ``opt/target/`` read the same), foreign formats through their converters, and saved
keras-vit models (``.keras``)."""

from __future__ import annotations

import dataclasses
import os
import re
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import keras
import numpy as np

from keras_vit import zoo
from keras_vit.checkpoints.formats import (
    EXPECTED,
    HUGGINGFACE_WEIGHT_FILES,
    check_archive,
    detect_format,
    from_bfloat16,
    read_json,
    read_state_dict,
    recorded_num_heads,
)
from keras_vit.checkpoints.huggingface import huggingface_to_npz, looks_like_huggingface
from keras_vit.checkpoints.huggingface_towers import looks_like_tower, tower_to_npz
from keras_vit.checkpoints.inspect import (
    TOKEN_FIELDS,
    CheckpointInfo,
    checkpoint_info,
    differences,
    prefix_token_fields,
    shapes_only,
)
from keras_vit.checkpoints.keras_hub import read_keras_hub_preset
from keras_vit.checkpoints.keymap import npz_key_map
from keras_vit.checkpoints.timm import looks_like_timm, model_arrays, timm_to_npz
from keras_vit.config import ViTConfig, field_names
from keras_vit.layers import TransformerBlock
from keras_vit.models import VisionTransformer, model_options
from keras_vit.variants import parse_variant
from keras_vit.zoo.errors import CorruptCheckpointError
from keras_vit.zoo.validate import npz_shapes, safetensors_shapes

__all__ = [
    "CheckpointArrays",
    "catalogue_check",
    "check_catalogue_shapes",
    "from_state_dict",
    "read_checkpoint",
    "read_npz",
    "read_path",
    "read_saved_model",
    "resolve_weights",
    "with_num_heads",
]

_TRAINING_PREFIX = "opt/target/"  # checkpoints saved with their optimizer state nest the parameters here


@dataclasses.dataclass(frozen=True, eq=False)
class CheckpointArrays(Mapping[str, np.ndarray]):
    """A checkpoint read into the ``.npz`` layout: a read-only mapping of its arrays, and what the file says beside.

    Fields: ``arrays`` by ``.npz`` key; ``source`` (for messages); ``format`` (one of
    :data:`~keras_vit.checkpoints.formats.FORMATS`); ``model_options``, the config fields its shapes do not show
    (``gelu``, a norm after pooling, ...); ``heads_known, False where the file does not record the head count (timm);
    ``config``, a saved keras-vit model's own; ``extra``, its variables outside the ``.npz`` layout, by path.
    """

    arrays: Mapping[str, np.ndarray]
    source: str
    format: str = "npz"
    model_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    heads_known: bool = True
    config: ViTConfig | None = None
    extra: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)

    def __getitem__(self, key: str) -> np.ndarray:
        return self.arrays[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.arrays)

    def __len__(self) -> int:
        return len(self.arrays)


def read_npz(path: str | os.PathLike) -> CheckpointArrays:
    """All arrays of an ``.npz`` checkpoint; a ``ValueError`` naming the file when it is unreadable."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No checkpoint file at {path}.")
    check_archive(path)  # what a member declares, before numpy unpacks it
    try:
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise ValueError("it holds one array, not named arrays")
        with data:
            arrays = {key: from_bfloat16(data[key]) for key in data.files}
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError) as exc:
        raise ValueError(
            f"{path} is not a readable .npz checkpoint ({type(exc).__name__}: {exc}). The file is truncated "
            "or corrupt: delete it and download it again."
        ) from exc
    if any(key.startswith(_TRAINING_PREFIX) for key in arrays):
        arrays = {key[len(_TRAINING_PREFIX) :]: a for key, a in arrays.items() if key.startswith(_TRAINING_PREFIX)}
    if "embedding/kernel" not in arrays:
        listed = ", ".join(sorted(arrays)[:5]) or "none"
        raise ValueError(f"{path} is not a ViT checkpoint: it has no 'embedding/kernel' key (keys: {listed}).")
    return CheckpointArrays(arrays, str(path))


_PATH_LIKE = re.compile(r"[/\\~]|\.(npz|safetensors|pth|pt|bin|h5|keras|json)$")


def resolve_weights(weights: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """A local checkpoint path for ``weights``: an existing file or folder, or a zoo catalogue name (downloaded)."""
    path = Path(weights).expanduser()
    if path.exists():
        return path
    if zoo.find(str(weights)) is None:
        if isinstance(weights, os.PathLike) or _PATH_LIKE.search(str(weights)):
            raise FileNotFoundError(f"No checkpoint file at {path} (nor a folder); expected {EXPECTED}.")
        zoo.get(str(weights))  # raises, suggesting close names
    entry = zoo.get(str(weights))
    # keras.applications shows its download too: the command's progress bar
    return zoo.fetch(entry, cache_dir=cache_dir, check=catalogue_check(entry), progress=True)


def catalogue_check(entry: zoo.Checkpoint) -> Callable[[Path], None]:
    """A check that a file is ``entry``'s model: its variant's patch, width, depth, heads and MLP, its ResNet,
    classifier, grid (image size), classes and ``pre_logits``, read from the array headers (an ``.npz``'s, or a
    family checkpoint's timm ``.safetensors``); a ``CorruptCheckpointError`` naming the file, the entry and what
    differs (a mirror's toy file is not ``B_16.orig_in21k``)."""

    def check(path: Path) -> None:
        shapes = (
            {key.removeprefix(_TRAINING_PREFIX): shape for key, shape in npz_shapes(path).items()}
            if entry.path.endswith(".npz")
            else safetensors_shapes(path)
        )
        check_catalogue_shapes(entry, shapes, str(path))

    return check


def check_catalogue_shapes(entry: zoo.Checkpoint, shapes: Mapping[str, tuple[int, ...]], source: str) -> None:
    """``CorruptCheckpointError`` unless arrays of these ``shapes`` (``.npz`` keys, or timm's for a family entry)
    are ``entry``'s architecture, classifier, grid, classes, ``pre_logits`` and (the family's) tokens and MLP;
    nothing is allocated: the arrays are broadcast zeros. A variant the table does not build (AugReg's ``R+Ti/16``)
    is held to its head only."""
    try:
        architecture = parse_variant(entry.variant)
    except ValueError:
        architecture = None
    config = None if architecture is None else ViTConfig.from_variant(entry.variant)
    arrays = shapes_only(shapes)
    try:
        if not entry.path.endswith(".npz"):
            arrays = timm_to_npz(arrays, source=source)[0]  # heads: 64 wide, as every named variant's
        found = checkpoint_info(arrays)
    except (ValueError, KeyError) as exc:
        raise CorruptCheckpointError(f"{source} is not the checkpoint {entry.name}: {exc}") from None
    model = architecture or found.architecture
    side = entry.image_size // model.stride
    grid = (side, side) if architecture else found.grid_size
    pre_logits = model.hidden_size if entry.pre_logits else None
    classes = entry.num_classes or None  # 0: no head (SigLIP, DINOv2)
    expected = CheckpointInfo(model, config.classifier if config else "token", grid, classes, pre_logits)
    differ = differences(found, expected, entry.name)
    if config is not None:
        tokens = prefix_token_fields(arrays)
        for field in TOKEN_FIELDS:
            ours = tokens.get(field, getattr(ViTConfig, field))  # the file's, else the field's default
            if ours != getattr(config, field):
                differ = ", ".join(filter(None, (differ, f"{field} {ours} ({entry.name}: {getattr(config, field)})")))
    if differ:
        raise CorruptCheckpointError(
            f"{source} is not the checkpoint {entry.name} ({entry.variant} at {entry.image_size} px): another "
            f"architecture: {differ}"
        )


def from_state_dict(
    state: Mapping[str, np.ndarray],
    source: str,
    config: Mapping | None = None,
    fmt: str = "npz",
    num_heads: int | None = None,
) -> CheckpointArrays:
    """Arrays in any key layout -> :class:`CheckpointArrays` in the ``.npz`` layout (timm and Hugging Face
    state dicts are converted; ``config`` is a Hugging Face ``config.json``; ``num_heads`` a timm file's, where
    its metadata records them)."""
    try:
        if looks_like_timm(state):
            arrays, options = timm_to_npz(state, num_heads=num_heads, source=source)
            fields = dict(format="timm", model_options=options, heads_known=num_heads is not None)
            return CheckpointArrays(arrays, source, **fields)
        if looks_like_huggingface(state) or looks_like_tower(state):
            convert = tower_to_npz if looks_like_tower(state) else huggingface_to_npz
            arrays, options, known = convert(state, config, source=source)
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
    """The arrays of an existing checkpoint file or folder of any format :func:`detect_format` knows."""
    path = Path(path)
    fmt = detect_format(path)
    if fmt == "npz":
        return read_npz(path)
    if fmt == "keras":
        return read_saved_model(path)
    if fmt == "keras_weights":
        raise ValueError(
            f"{path} is a Keras .weights.h5: it holds no architecture. Build the model it was saved from "
            "and load it there (keras_vit.ViT(..., weights=path) or model.load_weights(path))."
        )
    if fmt == "keras_hub":
        arrays, options = read_keras_hub_preset(path)
        return CheckpointArrays(arrays, str(path), format=fmt, model_options=options)
    config = None
    if fmt == "huggingface":
        config = read_json(path / "config.json")
        path = next(path / name for name in HUGGINGFACE_WEIGHT_FILES if (path / name).is_file())
        fmt = detect_format(path)
    elif path.with_name("config.json").is_file():  # a Hugging Face weights file in its folder
        config = read_json(path.with_name("config.json"))
    heads = recorded_num_heads(path) if fmt == "safetensors" else None
    return from_state_dict(read_state_dict(path, fmt), str(path), config, fmt, heads)


def read_saved_model(path: str | os.PathLike) -> CheckpointArrays:
    """A saved keras-vit model (``.keras``: the training commands' ``model.keras`` and ``encoder.keras``, a user's
    ``model.save``): its weights in the ``.npz`` layout and its :class:`~keras_vit.config.ViTConfig` (of the
    :class:`~keras_vit.models.VisionTransformer` it is or holds); a plain model made of keras-vit layers brings the
    options its layers show, and its architecture is read from the shapes as a checkpoint's."""
    check_archive(path)
    try:
        model = keras.saving.load_model(path, compile=False)
    except Exception as exc:  # Keras raises many kinds for a damaged or foreign file (ValueError, TypeError, ...)
        raise ValueError(f"{path} is not a readable saved Keras model ({type(exc).__name__}: {exc}).") from exc
    layers = list(model._flatten_layers(include_self=True))
    vits = [layer for layer in layers if isinstance(layer, VisionTransformer)]
    vit = vits[0] if len(vits) == 1 else model
    if not any(isinstance(layer, TransformerBlock) for layer in layers):
        raise ValueError(
            f"{path} is a saved Keras model ({type(model).__name__} {model.name!r}) without keras-vit layers (as "
            "keras_vit.ViT builds): open it with keras.saving.load_model."
        )
    config = getattr(vit, "config", None)
    options = {k: v for k, v in model_options(vit).items() if k in field_names("structure", "numerics")}
    mapped = {id(variable) for variable, _ in npz_key_map(vit).values()}
    extra = {v.path: keras.ops.convert_to_numpy(v) for v in vit.weights if id(v) not in mapped}
    fields = dict(format="keras", model_options=options, config=config, extra=extra)
    return CheckpointArrays(model_arrays(vit), str(path), **fields)


_ATTENTION_KEY = re.compile(
    r"(?:Transformer/encoderblock_\d+/MultiHeadDotProductAttention_1|MAPHead_0/MultiHeadDotProductAttention_0)"
    r"/(query|key|value|out)/kernel"
)


def with_num_heads(arrays: CheckpointArrays, num_heads: int) -> CheckpointArrays:
    """``arrays`` with its attention arrays regrouped into ``num_heads`` heads where the file did not
    record the head count (``heads_known=False``); unchanged otherwise."""
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


def read_checkpoint(weights: str | os.PathLike | Mapping[str, np.ndarray]) -> CheckpointArrays:
    """The arrays of ``weights``: a catalogue name (downloaded), a path of any format :func:`read_path`
    reads, or arrays already read (a state dict in the ``.npz``, timm or Hugging Face layout)."""
    if isinstance(weights, CheckpointArrays):
        return weights
    if isinstance(weights, Mapping):
        return from_state_dict(weights, "the given arrays")
    return read_path(resolve_weights(weights))
