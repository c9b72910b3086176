"""keras-hub ``ViTBackbone`` presets, both ways: :func:`read_keras_hub_preset` reads a preset folder's
``model.weights.h5`` with h5py into the ``.npz`` key layout; :func:`save_preset` writes one, with keras-vit's
config (``keras-vit.json``) and head (``head.npz``) beside it. Layouts: docs/foreign-weights.md."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from keras_vit.checkpoints.formats import check_archive, read_json

__all__ = ["read_keras_hub_preset", "save_preset"]

WEIGHTS_FILE = "model.weights.h5"
CONFIG_FILE = "keras-vit.json"  # the keras-vit config of a preset save_preset wrote
HEAD_FILE = "head.npz"  # its classifier
_POSEMBED = "Transformer/posembed_input/pos_embedding"


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


def _slots(f, settings: dict, weights: Path) -> dict:
    """Every dataset of a keras-hub ViT weights file by its ``.npz`` key (the arrays have the ``.npz`` shapes, but
    the position embedding's, ``(N, D)`` here, ``(1, N, D)`` there)."""
    layers = f["layers"]
    embedding = _group(layers, "patching_and_embedding", weights)
    slots = {"cls": embedding["vars"]["0"]} if settings.get("use_class_token", True) else {}
    slots.update(_dense("embedding", embedding["patch_embedding"]))
    slots[_POSEMBED] = embedding["position_embedding"]["vars"]["0"]
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
            arrays = {key: np.asarray(dataset) for key, dataset in _slots(f, settings, weights).items()}
    except (OSError, KeyError) as exc:
        problem = f"{type(exc).__name__}: {exc}"
        raise ValueError(f"{weights} is not a readable keras-hub ViT weights file ({problem}).") from exc
    arrays[_POSEMBED] = arrays[_POSEMBED][None]
    for key in [key for key in arrays if key.endswith("/kernel")]:  # a bias-free layer (use_mha_bias=False): zeros
        per_head = re.search(r"/(query|key|value)/kernel$", key) is not None
        bias = key.removesuffix("kernel") + "bias"
        arrays.setdefault(bias, np.zeros(arrays[key].shape[1:] if per_head else arrays[key].shape[-1:], "float32"))
    options = {"gelu": "exact"}
    if (path / CONFIG_FILE).is_file():  # written by save_preset: the model's own numerics and its head
        options["gelu"] = read_json(path / CONFIG_FILE)["config"]["gelu"]
        check_archive(path / HEAD_FILE)
        with np.load(path / HEAD_FILE, allow_pickle=False) as head:
            arrays.update({key: head[key] for key in head.files})
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


def save_preset(model, folder: str | Path) -> Path:
    """Write ``model`` (a :class:`~keras_vit.models.VisionTransformer`) as a keras-hub ``ViTBackbone`` preset
    folder plus its keras-vit config and head (module docstring). Needs keras-hub. keras-hub's backbone holds
    a plain ViT only: a hybrid or any other structure option is a ``ValueError``; its
    MLP computes exact GELU (the published checkpoints' tanh approximation differs by ~1e-3 in keras-hub; keras-vit
    reads the preset back with the model's own). ``folder`` must not exist; it appears whole or not at all."""
    import json

    import h5py

    from keras_vit.checkpoints.timm import model_arrays
    from keras_vit.config import ViTConfig, field_names
    from keras_vit.files import atomic_path
    from keras_vit.models import VisionTransformer
    from keras_vit.optional import require

    if not isinstance(model, VisionTransformer):
        raise ValueError(f"save_preset needs a keras_vit model (VisionTransformer); {model.name!r} is not one.")
    config, architecture = model.config, model.config.architecture
    structure = [name for name in field_names("structure") if name not in ("classifier", "representation_size")]
    limits = {
        "resnet_stages": (architecture.resnet_stages, None),
        **{name: (getattr(config, name), getattr(ViTConfig, name)) for name in structure},
        "dynamic_image_size": (config.dynamic_image_size, False),
        "include_preprocessing": (config.include_preprocessing, False),
    }
    beyond = [f"{name}={value!r}" for name, (value, allowed) in limits.items() if value != allowed]
    if beyond:
        raise ValueError(f"keras-hub's ViTBackbone has no place for {model.name!r}'s {', '.join(beyond)}.")
    if Path(folder).exists():
        raise ValueError(f"{folder} exists; remove it or choose another folder for the preset.")
    keras_hub = require("keras_hub", "Saving a keras-hub preset")
    backbone = keras_hub.models.ViTBackbone(
        image_shape=(*config.image_size, config.channels),
        patch_size=architecture.patch_size,
        num_layers=architecture.depth,
        num_heads=architecture.num_heads,
        hidden_dim=architecture.hidden_size,
        mlp_dim=architecture.mlp_dim,
        use_class_token=config.classifier == "token",
    )
    arrays = model_arrays(model)
    head = {key: value for key, value in arrays.items() if key.startswith(("head/", "pre_logits/"))}
    with atomic_path(folder) as temporary:
        backbone.save_to_preset(temporary)
        with h5py.File(Path(temporary) / WEIGHTS_FILE, "r+") as f:
            for key, dataset in _slots(f, {"use_class_token": config.classifier == "token"}, Path(folder)).items():
                dataset[...] = arrays[key][0] if key == _POSEMBED else arrays[key]
        (Path(temporary) / CONFIG_FILE).write_text(json.dumps({"config": config.to_dict()}, indent=2) + "\n")
        np.savez(Path(temporary) / HEAD_FILE, **head)
    return Path(folder)
