"""Step 2 of the checkpoint pipeline, convert, for keras-hub: a ``ViTBackbone`` preset folder into the ``.npz`` key
layout (the inverse of :func:`~keras_vit.checkpoints.keras_hub.save_preset`). Layouts: docs/foreign-weights.md."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from keras_vit.checkpoints.source import check_archive, read_json
from keras_vit.files import npz_arrays, open_zip
from keras_vit.zoo.errors import CorruptCheckpointError

__all__ = ["CONFIG_FILE", "HEAD_FILE", "POSEMBED", "WEIGHTS_FILE", "read_keras_hub_preset", "weight_slots"]

WEIGHTS_FILE = "model.weights.h5"
CONFIG_FILE = "keras-vit.json"  # the keras-vit config of a preset save_preset wrote
HEAD_FILE = "head.npz"  # its classifier
POSEMBED = "Transformer/posembed_input/pos_embedding"


def _group(parent, part: str, path: Path):
    """The one child group of ``parent`` whose name contains ``part``."""
    names = [name for name in parent if part in name]
    if len(names) != 1:
        raise ValueError(f"{path} does not hold keras-hub's ViT layout: {parent.name} has no single '{part}' group.")
    return parent[names[0]]


def _block_order(name: str) -> int:
    match = re.search(r"_(\d+)$", name)
    return int(match[1]) if match else -1


def _dense(prefix: str, group) -> dict:
    """The ``kernel`` and (where the layer has one) ``bias`` datasets of a layer, by ``.npz`` key."""
    variables = group["vars"]
    return {f"{prefix}/{name}": variables[str(i)] for i, name in enumerate(("kernel", "bias")[: len(variables)])}


def weight_slots(f, settings: dict, weights: Path) -> dict:
    """Every dataset of a keras-hub ViT weights file by its ``.npz`` key (the arrays have the ``.npz`` shapes, but
    the position embedding's, ``(N, D)`` here, ``(1, N, D)`` there)."""
    layers = f["layers"]
    embedding = _group(layers, "patching_and_embedding", weights)
    slots = {"cls": embedding["vars"]["0"]} if settings.get("use_class_token", True) else {}
    slots.update(_dense("embedding", embedding["patch_embedding"]))
    slots[POSEMBED] = embedding["position_embedding"]["vars"]["0"]
    encoder = _group(layers, "encoder", weights)
    for i, name in enumerate(sorted(encoder["encoder_layers"], key=_block_order)):
        slots.update(_block(encoder["encoder_layers"][name], i))
    slots.update(_norm("Transformer/encoder_norm", encoder["layer_norm"]))
    return slots


def _norm(prefix: str, group) -> dict:
    return {f"{prefix}/scale": group["vars"]["0"], f"{prefix}/bias": group["vars"]["1"]}


def read_keras_hub_preset(path: str | Path) -> tuple[dict[str, np.ndarray], dict]:
    """A keras-hub ViT preset folder's weights in the ``.npz`` layout, and the build options (``gelu``)."""
    import h5py

    path = Path(path)
    config = read_json(path / "config.json")
    class_name = config.get("class_name") or str(config.get("registered_name", "")).split(">")[-1]
    if class_name != "ViTBackbone":
        raise ValueError(f"{path} is a keras-hub {class_name!r} preset; keras-vit reads ViTBackbone presets only.")
    weights = path / WEIGHTS_FILE
    if not weights.is_file():
        raise FileNotFoundError(f"{path} is a keras-hub preset without its weights ({WEIGHTS_FILE}).")
    settings = config.get("config", {})
    try:
        with h5py.File(weights, "r") as f:
            arrays = {key: np.asarray(dataset) for key, dataset in weight_slots(f, settings, weights).items()}
    except (OSError, KeyError) as exc:
        problem = f"{type(exc).__name__}: {exc}"
        raise ValueError(f"{weights} is not a readable keras-hub ViT weights file ({problem}).") from exc
    arrays[POSEMBED] = arrays[POSEMBED][None]
    for key in [key for key in arrays if key.endswith("/kernel")]:  # a bias-free layer (use_mha_bias=False): zeros
        per_head = re.search(r"/(query|key|value)/kernel$", key) is not None
        bias = key.removesuffix("kernel") + "bias"
        arrays.setdefault(bias, np.zeros(arrays[key].shape[1:] if per_head else arrays[key].shape[-1:], "float32"))
    options = {"gelu": "exact"}
    if (path / CONFIG_FILE).is_file():  # written by save_preset: the model's own numerics and its head
        options["gelu"] = read_json(path / CONFIG_FILE)["config"]["gelu"]
        check_archive(path / HEAD_FILE)
        with open_zip(path / HEAD_FILE, CorruptCheckpointError) as head:
            arrays.update(npz_arrays(head))
    return arrays, options


def _block(group, index: int) -> dict:
    prefix = f"Transformer/encoderblock_{index}"
    attention = f"{prefix}/MultiHeadDotProductAttention_1"
    slots = {}
    for name, norm in (("LayerNorm_0", "layer_norm_1"), ("LayerNorm_2", "layer_norm_2")):
        slots.update(_norm(f"{prefix}/{name}", group[norm]))
    for name in ("query", "key", "value", "out"):
        slots.update(_dense(f"{attention}/{name}", group["mha"][f"{'output' if name == 'out' else name}_dense"]))
    for name, dense in (("Dense_0", "dense_1"), ("Dense_1", "dense_2")):
        slots.update(_dense(f"{prefix}/MlpBlock_3/{name}", group["mlp"][dense]))
    return slots
