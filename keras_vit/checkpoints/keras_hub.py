"""Writing keras-hub presets (:func:`save_preset`), the inverse of :mod:`~keras_vit.checkpoints.from_keras_hub`.
Layouts: docs/foreign-weights.md."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from keras_vit.checkpoints.from_keras_hub import CONFIG_FILE, HEAD_FILE, POSEMBED, WEIGHTS_FILE, weight_slots
from keras_vit.checkpoints.keymap import model_arrays
from keras_vit.config import ViTConfig, field_names
from keras_vit.files import atomic_path
from keras_vit.layers import format_shape
from keras_vit.models import VisionTransformer
from keras_vit.optional import require

__all__ = ["save_preset"]


def save_preset(model, folder: str | Path) -> Path:
    """Write ``model`` (a plain :class:`~keras_vit.models.VisionTransformer`) as a keras-hub ``ViTBackbone`` preset
    folder with its keras-vit config and head; needs keras-hub. A hybrid or other structure option is a ``ValueError``;
    ``folder`` must not exist and appears whole or not at all. Caveats (GELU): docs/foreign-weights.md."""
    import h5py

    if not isinstance(model, VisionTransformer):
        raise ValueError(f"save_preset needs a keras_vit model (VisionTransformer); {model.name!r} is not one.")
    config, architecture = model.config, model.config.architecture
    structure = [name for name in field_names("structure") if name not in ("classifier", "representation_size")]
    limits = {
        "resnet_stages": (architecture.resnet_stages, None),
        **{name: (getattr(config, name), getattr(ViTConfig, name)) for name in structure},
        "dynamic_image_size": (config.dynamic_image_size, False),
        "dynamic_img_pad": (config.dynamic_img_pad, False),
        "include_preprocessing": (config.include_preprocessing, False),
    }
    beyond = [f"{name}={value!r}" for name, (value, allowed) in limits.items() if value != allowed]
    if beyond:
        raise ValueError(f"keras-hub's ViTBackbone has no place for {model.name!r}'s {', '.join(beyond)}.")
    if Path(folder).exists():
        raise ValueError(f"{folder} exists; remove it or choose another folder for the preset.")
    keras_hub = require("keras_hub", "Saving a keras-hub preset")
    backbone = keras_hub.models.ViTBackbone(
        image_shape=format_shape((None, *config.image_size, config.channels), config.data_format)[1:],
        patch_size=architecture.patch_size,
        num_layers=architecture.depth,
        num_heads=architecture.num_heads,
        hidden_dim=architecture.hidden_size,
        mlp_dim=architecture.mlp_dim,
        use_class_token=config.classifier == "token",
        data_format=config.data_format,
    )
    arrays = model_arrays(model)
    head = {key: value for key, value in arrays.items() if key.startswith(("head/", "pre_logits/"))}
    with atomic_path(folder, owned=True) as temporary:
        backbone.save_to_preset(temporary)
        with h5py.File(Path(temporary) / WEIGHTS_FILE, "r+") as f:
            settings = {"use_class_token": config.classifier == "token"}
            for key, dataset in weight_slots(f, settings, Path(folder)).items():
                dataset[...] = arrays[key][0] if key == POSEMBED else arrays[key]
        (Path(temporary) / CONFIG_FILE).write_text(json.dumps({"config": config.to_dict()}, indent=2) + "\n")
        # the ignore: numpy's stub fears a key named allow_pickle among **head; its keys are weight paths
        np.savez(Path(temporary) / HEAD_FILE, **head)  # type: ignore[arg-type]
    return Path(folder)
