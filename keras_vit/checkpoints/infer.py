"""Step 3 of the checkpoint pipeline, infer: every rule "these keys, shapes or metadata mean this config field",
from :func:`checkpoint_info` (shapes alone) to :func:`checkpoint_config` (the whole config). See docs/design.md."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping

import numpy as np

from keras_vit.config import ViTConfig
from keras_vit.position import square_grid
from keras_vit.variants import Architecture

__all__ = [
    "ARCHITECTURE",
    "CheckpointInfo",
    "check_recorded",
    "checkpoint_config",
    "checkpoint_info",
    "differences",
    "format_fields",
    "prefix_token_fields",
    "shapes_only",
]

_BLOCK_QUERY = re.compile(r"Transformer/encoderblock_\d+/MultiHeadDotProductAttention_1/query/kernel")

DISTILLATION_TOKEN, REGISTER_TOKENS = "distillation_token", "register_tokens"  # keras_vit.tokens' npz keys
# The config fields that a checkpoint's keys and shapes show (:func:`prefix_token_fields`), the options a file's
# format records aside; a file with layer scale reads as this starting value (the file's gammas replace it).
TOKEN_FIELDS = ("distillation_token", "num_register_tokens", "class_position_embedding", "mlp_type")
LAYER_SCALE_INIT = 1e-5


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """The model a checkpoint's shapes imply: its architecture and its classifier."""

    architecture: Architecture
    classifier: str  # "token", "gap" or "map"
    grid_size: tuple[int, int] | None  # None when the grid is not square
    num_classes: int | None  # None without a head
    representation_size: int | None  # width of pre_logits, None without

    @property
    def variant(self) -> str | None:
        """``"B/16"``, ``"R50+B/16"``: the name in :mod:`keras_vit.variants`; ``None`` for other shapes."""
        return self.architecture.variant

    @property
    def image_size(self) -> int | None:
        """The resolution the checkpoint was trained at (None when its grid is not square)."""
        return None if self.grid_size is None else self.grid_size[0] * self.architecture.stride

    def describe(self) -> str:
        arch = self.architecture
        return (
            f"{self.variant or 'custom'}: patch {arch.patch_size}, width {arch.hidden_size}, depth {arch.depth}, "
            f"heads {arch.num_heads}, mlp {arch.mlp_dim}, classifier {self.classifier!r}, grid {self.grid_size}, "
            f"image size {self.image_size}, classes {self.num_classes}, pre_logits {self.representation_size}"
            + (f", ResNet stages {arch.resnet_stages}" if arch.resnet_stages is not None else "")
        )


def _resnet_stages(arrays: Mapping[str, np.ndarray]) -> tuple[int, ...] | None:
    """Units per stage of a hybrid's ResNet (keys ``block{s}/unit{u}/...``); ``None`` without one."""
    if "conv_root/kernel" not in arrays:
        return None
    units: dict[int, set[str]] = {}
    for key in arrays:
        block, _, rest = key.partition("/")
        if block.startswith("block") and rest.startswith("unit"):
            units.setdefault(int(block[len("block") :]), set()).add(rest.split("/")[0])
    return tuple(len(units[stage]) for stage in sorted(units))


def _square(tokens: int) -> bool:
    return tokens >= 1 and math.isqrt(tokens) ** 2 == tokens


def _class_tokens(arrays: Mapping[str, np.ndarray]) -> int:
    """The class and distillation tokens a checkpoint has."""
    return int("cls" in arrays) + int(DISTILLATION_TOKEN in arrays)


def prefix_token_fields(arrays: Mapping[str, np.ndarray]) -> dict:
    """The :data:`TOKEN_FIELDS` a checkpoint's arrays show: a distillation token, registers, no class position
    embedding (a square grid of them beside a class token), a SwiGLU MLP (``Dense_1`` half ``Dense_0``'s width)."""
    fields: dict = {}
    if DISTILLATION_TOKEN in arrays:
        fields["distillation_token"] = True
    if REGISTER_TOKENS in arrays:
        fields["num_register_tokens"] = int(arrays[REGISTER_TOKENS].shape[1])
    posemb, prefix = arrays.get("Transformer/posembed_input/pos_embedding"), _class_tokens(arrays)
    if prefix and posemb is not None and _square(posemb.shape[1]) and not _square(posemb.shape[1] - prefix):
        fields["class_position_embedding"] = False
    fc1, fc2 = (arrays.get(f"Transformer/encoderblock_0/MlpBlock_3/Dense_{i}/kernel") for i in (0, 1))
    if fc1 is not None and fc2 is not None and fc2.shape[0] * 2 == fc1.shape[1]:
        fields["mlp_type"] = "swiglu"
    return fields


def format_fields(arrays: Mapping[str, np.ndarray]) -> dict:
    """:func:`prefix_token_fields` and layer scale (``encoderblock_{i}/ls1/gamma`` keys): what a converted foreign
    file's keys show beside the options its format spells."""
    fields = prefix_token_fields(arrays)
    if any(key.endswith("/ls1/gamma") for key in arrays):
        fields["layer_scale_init"] = LAYER_SCALE_INIT
    return fields


def check_recorded(recorded: Mapping, arrays: Mapping[str, np.ndarray], source: str) -> None:
    """A ``ValueError`` naming each of :data:`TOKEN_FIELDS` that ``recorded`` (a ``config.json``'s fields) sets
    otherwise than the arrays show."""
    shown = format_fields(arrays)
    differ = [
        f"{name}={recorded[name]!r} (the weights: {shown.get(name, getattr(ViTConfig, name))!r})"
        for name in TOKEN_FIELDS
        if name in recorded and recorded[name] != shown.get(name, getattr(ViTConfig, name))
    ]
    if differ:
        raise ValueError(f"{source}: config.json disagrees with the weights: {'; '.join(differ)}.")


def checkpoint_info(arrays: Mapping[str, np.ndarray]) -> CheckpointInfo:
    """Infer the architecture from a checkpoint's array shapes (a ``ValueError`` when a key is missing)."""
    source = getattr(arrays, "source", "the checkpoint")
    try:
        patch, _, _, hidden = arrays["embedding/kernel"].shape
        block = "Transformer/encoderblock_0"
        num_heads = arrays[f"{block}/MultiHeadDotProductAttention_1/query/kernel"].shape[1]
        mlp_dim = arrays[f"{block}/MlpBlock_3/Dense_0/kernel"].shape[1]
        tokens = arrays["Transformer/posembed_input/pos_embedding"].shape[1]
    except (KeyError, ValueError, IndexError) as exc:
        raise ValueError(f"{source} is not a ViT checkpoint in the published layout: cannot read {exc}.") from exc
    depth = len([key for key in arrays if _BLOCK_QUERY.fullmatch(key)])  # a stray key is no block
    prefix = _class_tokens(arrays) if prefix_token_fields(arrays).get("class_position_embedding", True) else 0
    grid = square_grid(tokens - prefix) if _square(tokens - prefix) else None
    if grid is None and "cls" not in arrays and _square(tokens - 1):
        raise ValueError(
            f"{source} has {tokens} position embeddings, a {math.isqrt(tokens - 1)}x{math.isqrt(tokens - 1)} "
            "grid and a class token's, but no class token: the array 'cls' is missing."
        )
    head, pre_logits = arrays.get("head/bias"), arrays.get("pre_logits/bias")
    architecture = Architecture(
        patch_size=int(patch),
        hidden_size=int(hidden),
        depth=depth,
        num_heads=int(num_heads),
        mlp_dim=int(mlp_dim),
        resnet_stages=_resnet_stages(arrays),
    )
    return CheckpointInfo(
        architecture=architecture,
        classifier="token" if "cls" in arrays else "map" if "MAPHead_0/probe" in arrays else "gap",
        grid_size=grid,
        num_classes=None if head is None else int(head.shape[0]),
        representation_size=None if pre_logits is None else int(pre_logits.shape[0]),
    )


def checkpoint_config(arrays: Mapping[str, np.ndarray]) -> ViTConfig:
    """The :class:`~keras_vit.config.ViTConfig` of the model a checkpoint holds: what its shapes and keys show
    (:func:`checkpoint_info`, a hybrid's ResNet width, ``norm_pre``, qk-norm) and the options its format records;
    a saved keras-vit model's own config."""
    if (config := getattr(arrays, "config", None)) is not None:
        return config
    info = checkpoint_info(arrays)
    fields = dict(getattr(arrays, "model_options", {}), classifier=info.classifier, **prefix_token_fields(arrays))
    fields["norm_pre"] = "Transformer/norm_pre/scale" in arrays
    fields["qk_norm"] = any(key.endswith("MultiHeadDotProductAttention_1/q_norm/scale") for key in arrays)
    if info.image_size is not None:
        fields["image_size"] = info.image_size
    if info.num_classes is not None:
        fields.update(num_classes=info.num_classes, representation_size=info.representation_size)
    if "conv_root/kernel" in arrays:
        fields["resnet_width"] = int(arrays["conv_root/kernel"].shape[-1])
    return ViTConfig(info.architecture, **fields)


# What :func:`differences` compares, by the name a message gives it.
_COMPARED = {
    "patch": lambda info: info.architecture.patch_size,
    "width": lambda info: info.architecture.hidden_size,
    "depth": lambda info: info.architecture.depth,
    "heads": lambda info: info.architecture.num_heads,
    "mlp": lambda info: info.architecture.mlp_dim,
    "ResNet stages": lambda info: info.architecture.resnet_stages,
    "classifier": lambda info: info.classifier,
    "grid": lambda info: info.grid_size,
    "classes": lambda info: info.num_classes,
    "pre_logits": lambda info: info.representation_size,
}
ARCHITECTURE = ("patch", "width", "depth", "heads", "mlp", "ResNet stages", "classifier")


def differences(found: CheckpointInfo, expected: CheckpointInfo, other: str, compared=tuple(_COMPARED)) -> str:
    """``"depth 2 (the model: 1), width 64 (the model: 32)"``: each of ``compared`` (names of :data:`_COMPARED`)
    where ``found`` differs from ``expected`` (``other``'s); ``""`` where none does."""
    values = {name: (_COMPARED[name](found), _COMPARED[name](expected)) for name in compared}
    return ", ".join(f"{name} {ours} ({other}: {theirs})" for name, (ours, theirs) in values.items() if ours != theirs)


def shapes_only(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """Arrays of these shapes that take no memory (one broadcast zero each), for :func:`checkpoint_info` on what an
    archive's headers declare."""
    return {key: np.broadcast_to(np.float32(0), shape) for key, shape in shapes.items()}
