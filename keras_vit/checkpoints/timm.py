"""Writing timm files, the inverse of :mod:`~keras_vit.checkpoints.from_timm`: a state dict, the
``timm.create_model`` arguments, and both in one ``.safetensors`` file. See docs/foreign-weights.md."""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Mapping

import keras
import numpy as np

from keras_vit.checkpoints.from_timm import (
    _ATTENTION,
    _BACKBONE,
    _BLOCK,
    _CLIP_EPSILON,
    _HEADS,
    _LAYER_SCALES,
    _MAP,
    _MAP_ATTENTION,
    _QK_NORMS,
    _RESNET_LAYERS,
    _TOKENS,
    linear_kernel,
)
from keras_vit.checkpoints.infer import REGISTER_TOKENS, prefix_token_fields
from keras_vit.checkpoints.keymap import layers_of, model_arrays
from keras_vit.config import grid_length
from keras_vit.features import model_stride
from keras_vit.files import atomic_path
from keras_vit.inputs import model_image_shape
from keras_vit.layers import PatchEmbed, TransformerBlock
from keras_vit.models import uses_fc_norm
from keras_vit.resnet import ResNetStem

__all__ = ["npz_to_timm", "save_timm_safetensors", "timm_model_kwargs", "to_timm_state_dict"]

_TIMM_EPSILONS = {1e-6: "vit_base_patch16_224", _CLIP_EPSILON: "vit_base_patch16_clip_224"}  # a constructor of each
# timm's hybrid constructors by (ResNet units per stage, total stride); their widths are overridable.
_TIMM_HYBRIDS = {
    ((2, 2, 2, 2), 32): "vit_small_r26_s32_224",
    ((3, 4, 9), 16): "vit_base_r50_s16_224",
    ((3, 4, 6, 3), 32): "vit_large_r50_s32_224",
}


def torch_conv_weight(kernel: np.ndarray) -> np.ndarray:
    """A Keras kernel ``(kh, kw, I, O)`` as a torch ``Conv2d`` weight ``(O, I, kh, kw)``."""
    return np.ascontiguousarray(np.transpose(kernel, (3, 2, 0, 1)))


def _resnet_key_to_timm(key: str) -> str | None:
    """The inverse of :func:`_resnet_key_to_npz`."""
    if key == "conv_root/kernel":
        return "stem.conv.weight"
    if match := re.fullmatch(r"gn_root/(scale|bias)", key):
        return f"stem.norm.{'weight' if match[1] == 'scale' else 'bias'}"
    if match := re.fullmatch(r"block(\d+)/unit(\d+)/(\w+)/(kernel|scale|bias)", key):
        layer = {v: k for k, v in _RESNET_LAYERS.items()}[match[3]]
        param = "bias" if match[4] == "bias" else "weight"
        return f"stages.{int(match[1]) - 1}.blocks.{int(match[2]) - 1}.{layer}.{param}"
    return None


def _fused(arrays: Mapping[str, np.ndarray], attention: str, names: tuple[str, ...]) -> tuple[np.ndarray, ...]:
    """The ``names`` projections of ``attention`` (kernels ``(in, heads, dim)``) as one torch ``Linear``'s weight
    and bias, side by side (timm's fused ``qkv``)."""
    kernels = [arrays[f"{attention}/{name}/kernel"] for name in names]
    weight = linear_kernel(np.concatenate([k.reshape(k.shape[0], -1) for k in kernels], axis=1))
    return weight, np.concatenate([arrays[f"{attention}/{name}/bias"].reshape(-1) for name in names])


def _out_proj(arrays: Mapping[str, np.ndarray], attention: str) -> tuple[np.ndarray, ...]:
    """The ``out`` projection of ``attention`` (kernel ``(heads, dim, out)``) as a torch ``Linear``'s weight, bias."""
    kernel = arrays[f"{attention}/out/kernel"]
    return linear_kernel(kernel.reshape(-1, kernel.shape[-1])), arrays[f"{attention}/out/bias"]


def _map_head_to_timm(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The inverse of :func:`_map_head_from_timm`."""
    width = arrays[f"{_MAP_ATTENTION}/query/kernel"].shape[0]
    state: dict[str, np.ndarray] = {"attn_pool.latent": arrays[f"{_MAP}/probe"].reshape(1, 1, width)}
    state["attn_pool.q.weight"], state["attn_pool.q.bias"] = _fused(arrays, _MAP_ATTENTION, ("query",))
    state["attn_pool.kv.weight"], state["attn_pool.kv.bias"] = _fused(arrays, _MAP_ATTENTION, ("key", "value"))
    state["attn_pool.proj.weight"], state["attn_pool.proj.bias"] = _out_proj(arrays, _MAP_ATTENTION)
    state["attn_pool.norm.weight"] = arrays[f"{_MAP}/LayerNorm_0/scale"]
    state["attn_pool.norm.bias"] = arrays[f"{_MAP}/LayerNorm_0/bias"]
    for timm_name, name in (("fc1", "Dense_0"), ("fc2", "Dense_1")):
        state[f"attn_pool.mlp.{timm_name}.weight"] = linear_kernel(arrays[f"{_MAP}/MlpBlock_0/{name}/kernel"])
        state[f"attn_pool.mlp.{timm_name}.bias"] = arrays[f"{_MAP}/MlpBlock_0/{name}/bias"]
    return state


def npz_to_timm(arrays: Mapping[str, np.ndarray], *, fc_norm: bool = False) -> dict[str, np.ndarray]:
    """``.npz``-layout arrays as a timm state dict (the inverse of :func:`timm_to_npz`)."""
    state = {"patch_embed.proj.weight": torch_conv_weight(arrays["embedding/kernel"])}
    state["patch_embed.proj.bias"] = arrays["embedding/bias"]
    for timm_name, name in _TOKENS:
        if name in arrays:
            state[timm_name] = arrays[name]
    if "Transformer/posembed_input/pos_embedding" in arrays:
        state["pos_embed"] = arrays["Transformer/posembed_input/pos_embedding"]
    depth = len({key.split("/")[1] for key in arrays if key.startswith("Transformer/encoderblock_")})
    for i in range(depth):
        block, attention, prefix = _BLOCK.format(i), _ATTENTION.format(i), f"blocks.{i}."
        for timm_name, name in (("norm1", "LayerNorm_0"), ("norm2", "LayerNorm_2")):
            state[f"{prefix}{timm_name}.weight"] = arrays[f"{block}/{name}/scale"]
            state[f"{prefix}{timm_name}.bias"] = arrays[f"{block}/{name}/bias"]
        qkv = _fused(arrays, attention, ("query", "key", "value"))
        state[f"{prefix}attn.qkv.weight"], state[f"{prefix}attn.qkv.bias"] = qkv
        state[f"{prefix}attn.proj.weight"], state[f"{prefix}attn.proj.bias"] = _out_proj(arrays, attention)
        for timm_name, name in (("fc1", "Dense_0"), ("fc2", "Dense_1")):
            state[f"{prefix}mlp.{timm_name}.weight"] = linear_kernel(arrays[f"{block}/MlpBlock_3/{name}/kernel"])
            state[f"{prefix}mlp.{timm_name}.bias"] = arrays[f"{block}/MlpBlock_3/{name}/bias"]
        for name in _LAYER_SCALES:
            if f"{block}/{name}/gamma" in arrays:
                state[f"{prefix}{name}.gamma"] = arrays[f"{block}/{name}/gamma"]
        for name in _QK_NORMS:
            if f"{attention}/{name}/scale" in arrays:
                state[f"{prefix}attn.{name}.weight"] = arrays[f"{attention}/{name}/scale"]
                state[f"{prefix}attn.{name}.bias"] = arrays[f"{attention}/{name}/bias"]
    if "Transformer/norm_pre/scale" in arrays:
        state["norm_pre.weight"] = arrays["Transformer/norm_pre/scale"]
        state["norm_pre.bias"] = arrays["Transformer/norm_pre/bias"]
        _fold_patch_bias(state, prefix_tokens=int("cls" in arrays))
    if f"{_MAP}/probe" in arrays:
        state.update(_map_head_to_timm(arrays))
    norm = "fc_norm" if fc_norm else "norm"
    state[f"{norm}.weight"] = arrays["Transformer/encoder_norm/scale"]
    state[f"{norm}.bias"] = arrays["Transformer/encoder_norm/bias"]
    for timm_name, name in _HEADS:
        if f"{name}/kernel" in arrays:
            state[f"{timm_name}.weight"] = linear_kernel(arrays[f"{name}/kernel"])
            state[f"{timm_name}.bias"] = arrays[f"{name}/bias"]
    for key, value in arrays.items():
        timm_key = _resnet_key_to_timm(key)
        if timm_key is not None:
            state[_BACKBONE + timm_key] = torch_conv_weight(value) if key.endswith("/kernel") else value.reshape(-1)
    return {key: np.ascontiguousarray(value, dtype="float32") for key, value in state.items()}


def _fold_patch_bias(state: dict[str, np.ndarray], prefix_tokens: int) -> None:
    """timm's ``pre_norm`` models have no patch-embedding bias: add it to the patch tokens' position embeddings
    (``x E + b + E_pos`` = ``x E + (E_pos + b)``), exactly the same sum."""
    bias = state.pop("patch_embed.proj.bias")
    if "pos_embed" in state:
        pos = np.array(state["pos_embed"], dtype="float32")
        pos[:, prefix_tokens:] += bias
        state["pos_embed"] = pos
    elif np.any(bias):
        raise ValueError("timm's norm_pre models have no patch-embedding bias, and this model no position embedding.")


def to_timm_state_dict(model: keras.Model) -> dict[str, np.ndarray]:
    """A keras-vit model's weights as a timm ``VisionTransformer`` state dict (numpy, float32); a ``pre_logits``
    layer is kept as ``pre_logits.fc`` (docs/foreign-weights.md)."""
    return npz_to_timm(model_arrays(model), fc_norm=uses_fc_norm(model))


def timm_model_kwargs(model: keras.Model) -> dict:
    """``timm.create_model`` arguments that build ``model``'s architecture in timm (``pretrained=False``)."""
    arrays = model_arrays(model)
    blocks = layers_of(model, TransformerBlock)
    height, width, _ = model_image_shape(model)
    patch, _, _, hidden = arrays["embedding/kernel"].shape
    stems = layers_of(model, ResNetStem)
    epsilon = blocks[0].layer_norm_epsilon
    if epsilon not in _TIMM_EPSILONS:
        raise ValueError(f"timm's ViTs have LayerNorm epsilon 1e-6 or (CLIP) 1e-5, this model {epsilon:g}.")
    kwargs = dict(
        model_name=_TIMM_EPSILONS[epsilon],
        img_size=None if height is None else (int(height), int(width)),
        patch_size=int(patch),
        embed_dim=int(hidden),
        depth=len(blocks),
        num_heads=blocks[0].num_heads,
        mlp_ratio=blocks[0].mlp_dim / hidden,
        num_classes=int(arrays["head/bias"].shape[0]) if "head/bias" in arrays else 0,
        class_token="cls" in arrays,
        global_pool="token" if "cls" in arrays else "map" if f"{_MAP}/probe" in arrays else "avg",
        fc_norm=uses_fc_norm(model),
    )
    if blocks[0].ls1 is not None:
        kwargs["init_values"] = blocks[0].ls1.init_value
    kwargs["pre_norm"] = "Transformer/norm_pre/scale" in arrays
    if blocks[0].qk_norm:
        kwargs["qk_norm"] = True
    if blocks[0].gelu == "quick":
        kwargs["act_layer"] = "quick_gelu"
    tokens = prefix_token_fields(arrays)
    if REGISTER_TOKENS in arrays:
        kwargs["reg_tokens"] = int(arrays[REGISTER_TOKENS].shape[1])
    if not tokens.get("class_position_embedding", True):
        kwargs["no_embed_class"] = True
    if tokens.get("distillation_token"):
        kwargs["model_name"] = "deit_base_distilled_patch16_224"  # timm's VisionTransformerDistilled
    if tokens.get("mlp_type") == "swiglu":
        kwargs["model_name"] = "vit_giant_patch14_dinov2"  # mlp_layer=SwiGLUPacked, act_layer=SiLU
        kwargs.setdefault("init_values", 0.0)  # off (that name's default is 1e-5; timm drops a None)
    if stems:
        name = _TIMM_HYBRIDS.get((stems[0].num_layers, stems[0].stride * int(patch)))
        if name is None:
            raise ValueError(f"timm has no hybrid with ResNet stages {stems[0].num_layers} and this stride.")
        kwargs["model_name"] = name
    if any(isinstance(layer, PatchEmbed) and layer.dynamic_img_pad for layer in model._flatten_layers()) and height:
        # timm sizes its position embeddings by the grid rounded down: give it the padded size, and let it pad
        # whatever it gets (dynamic_img_size: no size check)
        stride = model_stride(model)
        kwargs["img_size"] = tuple(grid_length(int(size), stride) * stride for size in (height, width))
        kwargs.update(dynamic_img_pad=True, dynamic_img_size=True)
    return kwargs


def save_timm_safetensors(model: keras.Model, path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Write :func:`to_timm_state_dict` to a ``.safetensors`` file (with :func:`timm_model_kwargs` as JSON
    metadata under ``"timm_model_kwargs"`` where timm has the architecture), atomically (:mod:`keras_vit.files`);
    returns the state dict."""
    from safetensors.numpy import save_file

    state = to_timm_state_dict(model)
    metadata = {"format": "pt"}
    with contextlib.suppress(ValueError):  # a hybrid timm has no constructor for: the weights still convert
        metadata["timm_model_kwargs"] = json.dumps(timm_model_kwargs(model))
    with atomic_path(path, owned=True) as temporary:
        save_file(state, temporary, metadata=metadata)
    return state
