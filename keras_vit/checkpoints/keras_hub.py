"""keras-hub ``ViTBackbone`` presets (``save_to_preset`` folders) in the Google ``.npz`` key layout, read
with h5py alone (keras-hub need not be installed).

A preset folder holds ``config.json`` (``"registered_name": "keras_hub>ViTBackbone"``, ``num_heads``,
``use_class_token``, ...) and ``model.weights.h5``, whose groups follow the layers:

    layers/vi_t_patching_and_embedding/vars/0                         -> cls (1, 1, D)
    .../patch_embedding/vars/{0,1}, .../position_embedding/vars/0     -> embedding, posembed (N, D) -> (1, N, D)
    layers/vi_t_encoder/encoder_layers/vi_t_encoder_block[_k]/        -> encoderblock_{i} (in the order of k)
        layer_norm_1, mha/{query,key,value}_dense (D, heads, d_h), mha/output_dense (heads, d_h, D),
        layer_norm_2, mlp/dense_1, mlp/dense_2
    layers/vi_t_encoder/layer_norm                                     -> encoder_norm

The backbone has no classifier: load it with ``include_top=False`` or into a new head. Its MLP uses exact
GELU (``gelu="exact"``).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from keras_vit.checkpoints.formats import read_json

__all__ = ["read_keras_hub_preset"]

WEIGHTS_FILE = "model.weights.h5"


def _group(parent, part: str, path: Path):
    """The one child group of ``parent`` whose name contains ``part``."""
    names = [name for name in parent if part in name]
    if len(names) != 1:
        raise ValueError(f"{path} does not hold keras-hub's ViT layout: {parent.name} has no single '{part}' group.")
    return parent[names[0]]


def _vars(group) -> list[np.ndarray]:
    variables = group["vars"]
    return [np.asarray(variables[str(i)]) for i in range(len(variables))]


def _block_order(name: str) -> int:
    match = re.search(r"_(\d+)$", name)
    return int(match[1]) if match else -1


def _dense(group, per_head: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(kernel, bias)`` of a (possibly bias-free) layer; a missing bias is zeros (``(heads, d_h)`` per head)."""
    values = _vars(group)
    kernel = values[0]
    bias = values[1] if len(values) > 1 else np.zeros(kernel.shape[1:] if per_head else kernel.shape[-1:], kernel.dtype)
    return kernel, bias


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
    arrays: dict[str, np.ndarray] = {}
    try:
        with h5py.File(weights, "r") as f:
            layers = f["layers"]
            embedding = _group(layers, "patching_and_embedding", weights)
            if settings.get("use_class_token", True):
                arrays["cls"] = _vars(embedding)[0]
            arrays["embedding/kernel"], arrays["embedding/bias"] = _dense(embedding["patch_embedding"])
            arrays["Transformer/posembed_input/pos_embedding"] = _vars(embedding["position_embedding"])[0][None]
            encoder = _group(layers, "encoder", weights)
            blocks = sorted(encoder["encoder_layers"], key=_block_order)
            for i, name in enumerate(blocks):
                arrays.update(_block(encoder["encoder_layers"][name], i))
            arrays["Transformer/encoder_norm/scale"], arrays["Transformer/encoder_norm/bias"] = _vars(
                encoder["layer_norm"]
            )
    except (OSError, KeyError) as exc:
        problem = f"{type(exc).__name__}: {exc}"
        raise ValueError(f"{weights} is not a readable keras-hub ViT weights file ({problem}).") from exc
    return arrays, {"gelu": "exact"}


def _block(group, index: int) -> dict[str, np.ndarray]:
    prefix = f"Transformer/encoderblock_{index}"
    attention = f"{prefix}/MultiHeadDotProductAttention_1"
    arrays = {}
    for name, norm in (("LayerNorm_0", "layer_norm_1"), ("LayerNorm_2", "layer_norm_2")):
        arrays[f"{prefix}/{name}/scale"], arrays[f"{prefix}/{name}/bias"] = _vars(group[norm])
    for name in ("query", "key", "value", "out"):
        dense = group["mha"][f"{'output' if name == 'out' else name}_dense"]
        arrays[f"{attention}/{name}/kernel"], arrays[f"{attention}/{name}/bias"] = _dense(dense, name != "out")
    for name, dense in (("Dense_0", "dense_1"), ("Dense_1", "dense_2")):
        mlp = f"{prefix}/MlpBlock_3/{name}"
        arrays[f"{mlp}/kernel"], arrays[f"{mlp}/bias"] = _dense(group["mlp"][dense])
    return arrays
