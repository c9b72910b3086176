"""Load the published Google ``.npz`` checkpoints (google-research/vision_transformer) into keras-vit models.

A checkpoint is a flat ``.npz`` whose keys are the Flax module paths: ``embedding/kernel``, ``cls``,
``Transformer/posembed_input/pos_embedding``, ``Transformer/encoderblock_{i}/...``,
``Transformer/encoder_norm/...``, ``pre_logits/...``, ``head/...`` (and ``conv_root/...``,
``block{s}/unit{u}/...`` for the ResNet of the hybrids).

:func:`npz_key_map` walks a model's layers by class and returns ``{npz_key: (variable, transform)}``:
``transform`` turns the stored array into the variable's layout (e.g. ``(D, heads, head_dim) ->
(D, heads * head_dim)``). Several keys may share one variable: their transformed arrays are
concatenated along its last axis in the map's order (the fused ``qkv`` projection takes ``query``,
``key`` and ``value``). A transform may raise ``ValueError`` to reject an array; the loader reports it
with the key.

Extension point: any layer that defines a method ``npz_key_map(self) -> dict[str, tuple[keras.Variable,
Callable]]`` contributes its own entries, with full checkpoint keys (the hybrids' ResNet layer maps
``conv_root/kernel``, ``gn_root/scale``, ``block1/unit1/conv1/kernel``, ...). Such a method takes
precedence over the built-in mapping of the layer's class.

:func:`load_weights` checks everything before it assigns anything: missing keys, unexpected keys and
shape mismatches are listed, each by name, in one ``ValueError``, and the model is left untouched. A
model without the checkpoint's classifier (``include_top=False``, another ``num_classes``, no
``pre_logits`` layer) skips the head on purpose, with a warning that says what was skipped and why.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
import zipfile
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path

import keras
import numpy as np

from keras_vit.layers import AddPositionEmbs, ClassToken, PatchEmbed, TransformerBlock
from keras_vit.models import SIZES
from keras_vit.posembed import check_method, resample_position_embeddings, square_grid

Transform = Callable[[np.ndarray], np.ndarray]
KeyMap = dict[str, tuple[keras.Variable, Transform]]

HEAD_LAYERS = ("pre_logits", "head")
_TRAINING_PREFIX = "opt/target/"  # checkpoints saved with their optimizer state nest the parameters here
_MAX_LISTED = 20


def identity(array: np.ndarray) -> np.ndarray:
    return array


def _merge_heads(num_heads: int, axis: int) -> Transform:
    """``(..., heads, head_dim, ...)`` at ``axis`` -> one ``heads * head_dim`` axis; checks the head count."""

    def transform(array: np.ndarray) -> np.ndarray:
        if array.ndim <= axis + 1 or array.shape[axis] != num_heads:
            raise ValueError(f"shape {array.shape} does not split into the model's {num_heads} heads")
        shape = array.shape[:axis] + (-1,) + array.shape[axis + 2 :]
        return array.reshape(shape)

    return transform


def _dense(prefix: str, layer, kernel: Transform = identity, bias: Transform = identity) -> KeyMap:
    return {f"{prefix}/kernel": (layer.kernel, kernel), f"{prefix}/bias": (layer.bias, bias)}


def _norm(prefix: str, layer) -> KeyMap:
    return {f"{prefix}/scale": (layer.gamma, identity), f"{prefix}/bias": (layer.beta, identity)}


def _block_map(prefix: str, block: TransformerBlock) -> KeyMap:
    attn = f"{prefix}/MultiHeadDotProductAttention_1"
    heads = block.num_heads
    entries = _norm(f"{prefix}/LayerNorm_0", block.norm1)
    for name in ("query", "key", "value"):  # concatenated, in this order, into the fused qkv projection
        entries.update(_dense(f"{attn}/{name}", block.attn.qkv, _merge_heads(heads, 1), _merge_heads(heads, 0)))
    entries.update(_dense(f"{attn}/out", block.attn.out, kernel=_merge_heads(heads, 0)))
    entries.update(_norm(f"{prefix}/LayerNorm_2", block.norm2))
    entries.update(_dense(f"{prefix}/MlpBlock_3/Dense_0", block.mlp.fc1))
    entries.update(_dense(f"{prefix}/MlpBlock_3/Dense_1", block.mlp.fc2))
    return entries


def _posemb_map(layer: AddPositionEmbs, method: str) -> KeyMap:
    target = tuple(layer.pos_embedding.shape)

    def transform(array: np.ndarray) -> np.ndarray:
        if array.shape == target or array.ndim != 3 or array.shape[-1] != target[-1]:
            return array  # equal, or a width mismatch the shape check reports
        grid = square_grid(array.shape[1] - layer.num_prefix_tokens)
        return resample_position_embeddings(
            array, layer.grid_size, num_prefix_tokens=layer.num_prefix_tokens, old_grid=grid, method=method
        )

    return {"Transformer/posembed_input/pos_embedding": (layer.pos_embedding, transform)}


def _walk(model: keras.Model):
    """Top-level layers in order, descending into nested models."""
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            yield from _walk(layer)
        else:
            yield layer


def npz_key_map(model: keras.Model, *, resize_method: str = "zoom_linear") -> KeyMap:
    """``{npz_key: (variable, transform)}`` for every variable of ``model`` that a checkpoint holds.

    Position embeddings of another grid size are resized with ``resize_method`` (see
    :mod:`keras_vit.posembed`).
    """
    check_method(resize_method)
    entries: KeyMap = {}
    num_blocks = 0
    for layer in _walk(model):
        if callable(getattr(layer, "npz_key_map", None)):
            part = layer.npz_key_map()
        elif isinstance(layer, TransformerBlock):
            part = _block_map(f"Transformer/encoderblock_{num_blocks}", layer)
            num_blocks += 1
        elif isinstance(layer, PatchEmbed):
            part = _dense("embedding", layer)
        elif isinstance(layer, ClassToken):
            part = {"cls": (layer.cls, identity)}
        elif isinstance(layer, AddPositionEmbs) and isinstance(layer.pos_embedding, keras.Variable):
            part = _posemb_map(layer, resize_method)  # learned 1-D, as published (not the 2-D/sin-cos variants)
        elif isinstance(layer, keras.layers.LayerNormalization) and layer.name == "encoder_norm":
            part = _norm("Transformer/encoder_norm", layer)
        elif isinstance(layer, keras.layers.Dense) and layer.name in HEAD_LAYERS:
            part = _dense(layer.name, layer)
        else:
            continue
        clash = entries.keys() & part.keys()
        if clash:
            raise ValueError(f"Layer {layer.name!r} maps checkpoint keys another layer already maps: {sorted(clash)}.")
        entries.update(part)
    return entries


# --- reading checkpoints --------------------------------------------------------------------------


class CheckpointArrays(dict):
    """A checkpoint's arrays by key, remembering where they came from (for messages)."""

    def __init__(self, arrays: Mapping[str, np.ndarray], source: str):
        super().__init__(arrays)
        self.source = source


def read_npz(path: str | os.PathLike) -> CheckpointArrays:
    """All arrays of an ``.npz`` checkpoint; a ``ValueError`` naming the file when it is unreadable."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No checkpoint file at {path}.")
    try:
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise ValueError("it holds one array, not named arrays")
        with data:
            arrays = {key: data[key] for key in data.files}
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


def resolve_weights(weights: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """A local checkpoint path for ``weights``: an existing file, or a zoo catalogue name (downloaded)."""
    path = Path(weights).expanduser()
    if path.is_file():
        return path
    from keras_vit import zoo

    if zoo.find(str(weights)) is None:
        if str(weights).endswith(".npz"):
            raise FileNotFoundError(f"No checkpoint file at {path}.")
        zoo.get(str(weights))  # raises, suggesting close names
    return zoo.fetch(str(weights), cache_dir=cache_dir)


def read_checkpoint(weights: str | os.PathLike | Mapping[str, np.ndarray]) -> CheckpointArrays:
    """The arrays of ``weights``: a catalogue name (downloaded), an ``.npz`` path, or arrays already read."""
    if isinstance(weights, CheckpointArrays):
        return weights
    if isinstance(weights, Mapping):
        return CheckpointArrays(weights, "the given arrays")
    return read_npz(resolve_weights(weights))


# --- what a checkpoint holds ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """The architecture a checkpoint's shapes imply."""

    patch_size: int
    hidden_size: int
    depth: int
    num_heads: int
    mlp_dim: int
    classifier: str  # "token" or "gap"
    grid_size: tuple[int, int] | None  # None when the grid is not square
    num_classes: int | None  # None without a head
    representation_size: int | None
    resnet_stages: tuple[int, ...] | None  # units per ResNet stage of a hybrid, else None

    @property
    def stride(self) -> int:
        """Pixels per token side: the patch size, times the ResNet's 4 * 2^(stages - 1) for a hybrid."""
        if self.resnet_stages is None:
            return self.patch_size
        return self.patch_size * 4 * 2 ** max(0, len(self.resnet_stages) - 1)

    @property
    def image_size(self) -> int | None:
        """The resolution the checkpoint was trained at (None when its grid is not square)."""
        return None if self.grid_size is None else self.grid_size[0] * self.stride

    @property
    def size(self) -> str | None:
        """The named size (``"B"``) whose width, depth, heads and MLP the transformer has, else None."""
        shape = dict(hidden_size=self.hidden_size, depth=self.depth, num_heads=self.num_heads, mlp_dim=self.mlp_dim)
        return next((name for name, fields in SIZES.items() if fields == shape), None)

    @property
    def variant(self) -> str | None:
        """``"B/16"``, or ``"R50+B/16"`` for a hybrid (the ``/16`` its total stride); None for other sizes."""
        if self.size is None:
            return None
        if self.resnet_stages is None:
            return f"{self.size}/{self.patch_size}"
        # ResNet depth: 3 convolutions per bottleneck unit, plus the root convolution and the (absent) head.
        resnet = f"R{2 + 3 * sum(self.resnet_stages)}" if self.resnet_stages else "R"
        return f"{resnet}+{self.size}/{self.stride}"

    def describe(self) -> str:
        kind = self.variant or "custom"
        return (
            f"{kind}: patch {self.patch_size}, width {self.hidden_size}, depth {self.depth}, heads {self.num_heads}, "
            f"mlp {self.mlp_dim}, classifier {self.classifier!r}, grid {self.grid_size}, image size {self.image_size}, "
            f"classes {self.num_classes}, pre_logits {self.representation_size}"
            + (f", ResNet stages {self.resnet_stages}" if self.resnet_stages is not None else "")
        )


def checkpoint_info(arrays: Mapping[str, np.ndarray]) -> CheckpointInfo:
    """Infer the architecture from a checkpoint's array shapes (a ``ValueError`` when a key is missing)."""
    try:
        p, _, _, hidden = arrays["embedding/kernel"].shape
        block = "Transformer/encoderblock_0"
        num_heads = arrays[f"{block}/MultiHeadDotProductAttention_1/query/kernel"].shape[1]
        mlp_dim = arrays[f"{block}/MlpBlock_3/Dense_0/kernel"].shape[1]
        tokens = arrays["Transformer/posembed_input/pos_embedding"].shape[1]
    except (KeyError, ValueError, IndexError) as exc:
        raise ValueError(f"Not a ViT checkpoint in the published layout: cannot read {exc}.") from exc
    depth = len({key.split("/")[1] for key in arrays if key.startswith("Transformer/encoderblock_")})
    prefix = int("cls" in arrays)
    try:
        grid = square_grid(tokens - prefix)
    except ValueError:
        grid = None
    stages = None
    if "conv_root/kernel" in arrays:
        units = {}
        for key in arrays:
            head, _, rest = key.partition("/")
            if head.startswith("block") and rest.startswith("unit"):
                units.setdefault(int(head[5:]), set()).add(rest.split("/")[0])
        stages = tuple(len(units[s]) for s in sorted(units))
    head = arrays.get("head/bias")
    pre_logits = arrays.get("pre_logits/bias")
    return CheckpointInfo(
        patch_size=int(p),
        hidden_size=int(hidden),
        depth=depth,
        num_heads=int(num_heads),
        mlp_dim=int(mlp_dim),
        classifier="token" if prefix else "gap",
        grid_size=grid,
        num_classes=None if head is None else int(head.shape[0]),
        representation_size=None if pre_logits is None else int(pre_logits.shape[0]),
        resnet_stages=stages,
    )


# --- loading --------------------------------------------------------------------------------------


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


def load_weights(
    model: keras.Model,
    weights: str | os.PathLike | Mapping[str, np.ndarray],
    *,
    resize_method: str = "zoom_linear",
) -> LoadResult:
    """Load a Google ``.npz`` checkpoint into ``model``.

    Args:
        model: a keras-vit model (plain or hybrid).
        weights: a zoo catalogue name (downloaded into the Keras cache), a path to an ``.npz`` file, or
            its arrays as a mapping.
        resize_method: how position embeddings of another grid size are resized (see
            :mod:`keras_vit.posembed`).

    Raises ``ValueError`` listing every missing key, unexpected key and shape mismatch; nothing is
    assigned then.
    """
    arrays = read_checkpoint(weights)
    source = arrays.source
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
        raise ValueError(f"Cannot load {source} into model {model.name!r}:\n" + "\n".join(sections) + looks)
    for variable, value in values:
        variable.assign(value.astype(variable.dtype))
    if reason:
        warnings.warn(
            f"Loaded {source} into {model.name!r} without {', '.join(sorted(skipped))}: {reason}. "
            "The model's head stays at its initialisation.",
            stacklevel=2,
        )
    return LoadResult(loaded=tuple(key for key in key_map), skipped=tuple(sorted(skipped)))


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


# --- building models from checkpoints -------------------------------------------------------------


def checkpoint_defaults(
    arrays: Mapping[str, np.ndarray], image_size, num_classes: int | None, representation_size: int | None
) -> tuple:
    """``(image_size, num_classes, representation_size)`` with the checkpoint's values where unset (None).

    ``num_classes=None`` keeps the checkpoint's whole classifier: its classes and its ``pre_logits``
    layer (unless ``representation_size`` is given).
    """
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
    """Build the model a checkpoint's shapes describe and load it; ``kwargs`` go to :func:`keras_vit.ViT`.

    Patch size, widths, depth, classifier and (for a hybrid) the ResNet's stages come from the
    checkpoint; image size, classes and ``pre_logits`` too unless given (see :func:`checkpoint_defaults`).
    """
    from keras_vit.models import ViT

    arrays = read_checkpoint(weights)
    info = checkpoint_info(arrays)
    kwargs.setdefault("classifier", info.classifier)
    if info.resnet_stages is not None:
        kwargs.setdefault("resnet", info.resnet_stages)
    if info.variant is not None:
        kwargs.setdefault("name", "vit_" + info.variant.lower().replace("+", "_").replace("/", ""))
    kwargs["image_size"], kwargs["num_classes"], kwargs["representation_size"] = checkpoint_defaults(
        arrays, kwargs.get("image_size"), kwargs.get("num_classes"), kwargs.get("representation_size")
    )
    model = ViT(None, patch_size=info.patch_size, hidden_size=info.hidden_size, depth=info.depth,
                num_heads=info.num_heads, mlp_dim=info.mlp_dim, **kwargs)
    load_weights(model, arrays, resize_method=resize_method)
    return model
