"""timm's ``VisionTransformer`` state dicts, both ways, through the ``.npz`` key layout: :func:`timm_to_npz` reads
(key map in docs/foreign-weights.md), :func:`to_timm_state_dict` / :func:`save_timm_safetensors` write. A timm
state dict does not record its head count: the model's, ``num_heads``, or a guess from the width."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
from collections.abc import Mapping

import keras
import numpy as np

from keras_vit.checkpoints.formats import reject_unsupported
from keras_vit.checkpoints.inspect import DISTILLATION_TOKEN, REGISTER_TOKENS, format_fields, prefix_token_fields
from keras_vit.checkpoints.keymap import npz_key_map
from keras_vit.files import atomic_path
from keras_vit.layers import TransformerBlock
from keras_vit.models import uses_fc_norm
from keras_vit.resnet import TIMM_RESNET, ResNetStem
from keras_vit.variants import SIZES

__all__ = [
    "TIMM_UNSUPPORTED",
    "block_arrays",
    "block_indices",
    "conv_kernel",
    "guess_num_heads",
    "linear_kernel",
    "looks_like_timm",
    "model_arrays",
    "npz_to_timm",
    "save_timm_safetensors",
    "timm_model_kwargs",
    "timm_to_npz",
    "to_timm_state_dict",
]

# Key patterns of timm ViT variants keras-vit does not build, with the feature's name for the error.
TIMM_UNSUPPORTED = {
    r"\.attn\.norm\.|\.mlp\.norm\.": "extra norms inside attention or MLP (scale_attn_norm / scale_mlp_norm)",
    r"^attn_pool\.(?!latent$|q\.|kv\.|proj\.|norm\.|mlp\.fc[12]\.)": "an attention pool other than a MAP head "
    "(attn_pool with qk-norm or position embeddings)",
    r"\.attn\.[qkv]_bias$|\.attn\.(q|k|v)_proj\.": "split q/k/v projections (BEiT / EVA style)",
    r"\.mlp\.fc1_[gx]\.|\.mlp\.w12\.": "a gated MLP in two projections (timm's SwiGLU; SwiGLUPacked loads)",
    r"^patch_embed\.norm\.": "a norm after the patch embedding",
    r"^patch_embed\.backbone\.(?!stem\.|stages\.)": "a hybrid backbone other than timm's ResNetV2 hybrids",
}
_NORM_PARAMS = {"weight": "scale", "bias": "bias"}
_BLOCK = "Transformer/encoderblock_{}"
_ATTENTION = _BLOCK + "/MultiHeadDotProductAttention_1"
_ATTENTION_ARRAY = re.compile(r"Transformer/encoderblock_(\d+)/MultiHeadDotProductAttention_1/(\w+)/(kernel|bias)")
_BACKBONE = "patch_embed.backbone."
_LAYER_SCALES = ("ls1", "ls2")
_QK_NORMS = ("q_norm", "k_norm")
_MAP = "MAPHead_0"
_MAP_ATTENTION = _MAP + "/MultiHeadDotProductAttention_0"
_CLIP_EPSILON = 1e-5  # the LayerNorm epsilon of timm's CLIP towers (pre_norm=True), 1e-6 elsewhere
_TIMM_EPSILONS = {1e-6: "vit_base_patch16_224", _CLIP_EPSILON: "vit_base_patch16_clip_224"}  # a constructor of each
_TOKENS = (("cls_token", "cls"), ("dist_token", DISTILLATION_TOKEN), ("reg_token", REGISTER_TOKENS))
_HEADS = (("pre_logits.fc", "pre_logits"), ("head", "head"), ("head_dist", "head_dist"))
# timm's hybrid constructors by (ResNet units per stage, total stride); their widths are overridable.
_TIMM_HYBRIDS = {
    ((2, 2, 2, 2), 32): "vit_small_r26_s32_224",
    ((3, 4, 9), 16): "vit_base_r50_s16_224",
    ((3, 4, 6, 3), 32): "vit_large_r50_s32_224",
}
_RESNET_LAYERS = {
    "conv1": "conv1",
    "conv2": "conv2",
    "conv3": "conv3",
    "norm1": "gn1",
    "norm2": "gn2",
    "norm3": "gn3",
    "downsample.conv": "conv_proj",
    "downsample.norm": "gn_proj",
}


# --- torch layouts <-> the .npz layout (shared with the Hugging Face reader) -----------------------


def linear_kernel(weight: np.ndarray) -> np.ndarray:
    """A torch ``Linear`` weight ``(out, in)`` as a Keras kernel ``(in, out)`` (and back: it is its own inverse); a
    view (the loader copies into the variables; the catalogue check converts shapes without allocating)."""
    return np.asarray(weight).T


def conv_kernel(weight: np.ndarray) -> np.ndarray:
    """A torch ``Conv2d`` weight ``(O, I, kh, kw)`` as a Keras kernel ``(kh, kw, I, O)`` (a view)."""
    return np.transpose(weight, (2, 3, 1, 0))


def torch_conv_weight(kernel: np.ndarray) -> np.ndarray:
    """A Keras kernel ``(kh, kw, I, O)`` as a torch ``Conv2d`` weight ``(O, I, kh, kw)``."""
    return np.ascontiguousarray(np.transpose(kernel, (3, 2, 0, 1)))


def block_indices(keys, pattern: str) -> range:
    """``range(depth)``: the blocks of a state dict, counted by the key that only a block has (``pattern``, whose
    group is the index), so that a stray key under ``blocks.`` is not taken for a block."""
    indices = [int(match[1]) for match in map(re.compile(pattern).fullmatch, keys) if match]
    return range(max(indices) + 1 if indices else 0)


def guess_num_heads(width: int) -> int:
    """The heads of the Ti/S/B/L/H size of this width, else as many 64-wide heads as fit (at least 1)."""
    for size in SIZES.values():
        if size["hidden_size"] == width:
            return size["num_heads"]
    return width // 64 if width % 64 == 0 and width >= 64 else 1


def block_arrays(
    index: int,
    *,
    num_heads: int,
    norm1: tuple,
    query: tuple,
    key: tuple,
    value: tuple,
    out: tuple,
    norm2: tuple,
    fc1: tuple,
    fc2: tuple,
) -> dict[str, np.ndarray]:
    """The ``.npz`` arrays of encoder block ``index`` from ``(kernel (in, out), bias)`` pairs and
    ``(scale, bias)`` norms. A ``None`` q/k/v bias (``qkv_bias=False``) becomes zeros; another ``None``
    bias is left out, for the loader to report as missing."""
    block, attention = _BLOCK.format(index), _ATTENTION.format(index)
    width = query[0].shape[0]
    head_dim = width // num_heads
    arrays = {}
    for name, (scale, bias) in (("LayerNorm_0", norm1), ("LayerNorm_2", norm2)):
        arrays[f"{block}/{name}/scale"], arrays[f"{block}/{name}/bias"] = scale, bias
    for name, (kernel, bias) in (("query", query), ("key", key), ("value", value)):
        bias = np.zeros(kernel.shape[1], kernel.dtype) if bias is None else bias
        arrays[f"{attention}/{name}/kernel"] = kernel.reshape(width, num_heads, -1)
        arrays[f"{attention}/{name}/bias"] = bias.reshape(num_heads, -1)
    out_kernel, out_bias = out
    arrays[f"{attention}/out/kernel"] = out_kernel.reshape(num_heads, head_dim, -1)
    arrays[f"{attention}/out/bias"] = out_bias
    for name, (kernel, bias) in (("Dense_0", fc1), ("Dense_1", fc2)):
        arrays[f"{block}/MlpBlock_3/{name}/kernel"] = kernel
        arrays[f"{block}/MlpBlock_3/{name}/bias"] = bias
    return {key: value for key, value in arrays.items() if value is not None}


# --- reading ---------------------------------------------------------------------------------------


def looks_like_timm(keys) -> bool:
    """Whether a state dict's keys are timm's ViT layout."""
    return "patch_embed.proj.weight" in keys and any(key.startswith("blocks.") for key in keys)


def _resnet_key_to_npz(key: str) -> str | None:
    """``stem.conv.weight`` -> ``conv_root/kernel``, ``stages.0.blocks.1.norm2.bias`` -> ``block1/unit2/gn2/bias``."""
    match = re.fullmatch(r"stem\.(conv|norm)\.(weight|bias)", key)
    if match:
        return "conv_root/kernel" if match[1] == "conv" else f"gn_root/{_NORM_PARAMS[match[2]]}"
    match = re.fullmatch(r"stages\.(\d+)\.blocks\.(\d+)\.((?:downsample\.)?(?:conv|norm)\d?)\.(weight|bias)", key)
    if match and match[3] in _RESNET_LAYERS:
        layer = _RESNET_LAYERS[match[3]]
        param = "kernel" if layer.startswith("conv") else _NORM_PARAMS[match[4]]
        return f"block{int(match[1]) + 1}/unit{int(match[2]) + 1}/{layer}/{param}"
    return None


def _resnet_key_to_timm(key: str) -> str | None:
    """The inverse of :func:`_resnet_key_to_npz`."""
    if key == "conv_root/kernel":
        return "stem.conv.weight"
    match = re.fullmatch(r"gn_root/(scale|bias)", key)
    if match:
        return f"stem.norm.{'weight' if match[1] == 'scale' else 'bias'}"
    match = re.fullmatch(r"block(\d+)/unit(\d+)/(\w+)/(kernel|scale|bias)", key)
    if match:
        layer = {v: k for k, v in _RESNET_LAYERS.items()}[match[3]]
        param = "bias" if match[4] == "bias" else "weight"
        return f"stages.{int(match[1]) - 1}.blocks.{int(match[2]) - 1}.{layer}.{param}"
    return None


def _check_position_layout(state: Mapping[str, np.ndarray], source: str) -> None:
    """Register tokens with position embeddings (timm's ``reg_tokens`` without ``no_embed_class``) are refused:
    keras-vit's registers have none, as DINOv2's."""
    if "reg_token" not in state or "pos_embed" not in state:
        return
    tokens = state["pos_embed"].shape[1]
    if math.isqrt(tokens) ** 2 != tokens:
        reject_unsupported(
            ["pos_embed"],
            {"pos_embed": "register tokens with position embeddings (reg_tokens without no_embed_class)"},
            source,
        )


def timm_to_npz(
    state: Mapping[str, np.ndarray], *, num_heads: int | None = None, source: str = "the state dict"
) -> tuple[dict[str, np.ndarray], dict]:
    """A timm ViT state dict in the ``.npz`` layout, and the :class:`~keras_vit.config.ViTConfig` fields that
    reproduce timm's model (``gelu="exact"``, the norm after pooling, layer scale, timm's ResNet numerics).

    Keys this does not recognise pass through unchanged, so the loader lists them as unexpected; known
    unsupported variants (:data:`TIMM_UNSUPPORTED`) raise a ``ValueError`` naming them.
    """
    reject_unsupported(state, TIMM_UNSUPPORTED, source)
    _check_position_layout(state, source)
    rest = {key: np.asarray(value) for key, value in state.items()}
    take = rest.pop
    width = rest["patch_embed.proj.weight"].shape[0]
    heads = num_heads or guess_num_heads(width)
    arrays = {"embedding/kernel": conv_kernel(take("patch_embed.proj.weight"))}
    arrays["embedding/bias"] = take("patch_embed.proj.bias", np.zeros(width, "float32"))
    for timm_name, name in _TOKENS:
        if timm_name in rest:
            arrays[name] = take(timm_name)
    if "pos_embed" in rest:
        arrays["Transformer/posembed_input/pos_embedding"] = take("pos_embed")
    for i in block_indices(rest, r"blocks\.(\d+)\.attn\.qkv\.weight"):
        arrays.update(_block_from_timm(rest, f"blocks.{i}.", i, heads))
    options: dict = {"gelu": "exact"}
    if "norm_pre.weight" in rest:
        arrays["Transformer/norm_pre/scale"] = take("norm_pre.weight")
        arrays["Transformer/norm_pre/bias"] = take("norm_pre.bias")
        options["layer_norm_epsilon"] = _CLIP_EPSILON
    if "attn_pool.latent" in rest:
        arrays.update(_map_head_from_timm(rest, heads))
    for norm, fc_norm in (("norm", False), ("fc_norm", True)):
        if f"{norm}.weight" in rest:
            arrays["Transformer/encoder_norm/scale"] = take(f"{norm}.weight")
            arrays["Transformer/encoder_norm/bias"] = take(f"{norm}.bias")
            options["fc_norm"] = fc_norm
    for timm_name, name in _HEADS:
        if f"{timm_name}.weight" in rest:
            arrays[f"{name}/kernel"] = linear_kernel(take(f"{timm_name}.weight"))
            arrays[f"{name}/bias"] = take(f"{timm_name}.bias")
    for key in [key for key in rest if key.startswith(_BACKBONE)]:
        npz_key = _resnet_key_to_npz(key[len(_BACKBONE) :])
        if npz_key is not None:
            value = take(key)
            arrays[npz_key] = conv_kernel(value) if npz_key.endswith("/kernel") else value
    if "conv_root/kernel" in arrays:
        options.update(TIMM_RESNET)
    options.update(format_fields(arrays))
    arrays.update(rest)  # unrecognised: reported as unexpected by the loader
    return arrays, options


def _map_head_from_timm(rest: dict, heads: int) -> dict[str, np.ndarray]:
    """timm's ``attn_pool`` (``AttentionPoolLatent``) as big_vision's ``MAPHead_0`` arrays."""
    take = rest.pop
    width = rest["attn_pool.latent"].shape[-1]
    query = linear_kernel(take("attn_pool.q.weight")), take("attn_pool.q.bias")
    key, value = np.split(linear_kernel(take("attn_pool.kv.weight")), 2, axis=1)
    key_bias, value_bias = np.split(take("attn_pool.kv.bias"), 2)
    out = linear_kernel(take("attn_pool.proj.weight"))
    arrays = {f"{_MAP}/probe": take("attn_pool.latent").reshape(1, 1, width)}
    for name, (kernel, bias) in (("query", query), ("key", (key, key_bias)), ("value", (value, value_bias))):
        arrays[f"{_MAP_ATTENTION}/{name}/kernel"] = kernel.reshape(width, heads, -1)
        arrays[f"{_MAP_ATTENTION}/{name}/bias"] = bias.reshape(heads, -1)
    arrays[f"{_MAP_ATTENTION}/out/kernel"] = out.reshape(heads, -1, out.shape[-1])
    arrays[f"{_MAP_ATTENTION}/out/bias"] = take("attn_pool.proj.bias")
    arrays[f"{_MAP}/LayerNorm_0/scale"] = take("attn_pool.norm.weight")
    arrays[f"{_MAP}/LayerNorm_0/bias"] = take("attn_pool.norm.bias")
    for timm_name, name in (("fc1", "Dense_0"), ("fc2", "Dense_1")):
        arrays[f"{_MAP}/MlpBlock_0/{name}/kernel"] = linear_kernel(take(f"attn_pool.mlp.{timm_name}.weight"))
        arrays[f"{_MAP}/MlpBlock_0/{name}/bias"] = take(f"attn_pool.mlp.{timm_name}.bias")
    return arrays


def _map_head_to_timm(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The inverse of :func:`_map_head_from_timm`."""
    kernels = {n: arrays[f"{_MAP_ATTENTION}/{n}/kernel"] for n in ("query", "key", "value", "out")}
    width = kernels["query"].shape[0]
    state = {"attn_pool.latent": arrays[f"{_MAP}/probe"].reshape(1, 1, width)}
    state["attn_pool.q.weight"] = linear_kernel(kernels["query"].reshape(width, -1))
    state["attn_pool.q.bias"] = arrays[f"{_MAP_ATTENTION}/query/bias"].reshape(-1)
    state["attn_pool.kv.weight"] = linear_kernel(
        np.concatenate([kernels[n].reshape(width, -1) for n in ("key", "value")], axis=1)
    )
    state["attn_pool.kv.bias"] = np.concatenate(
        [arrays[f"{_MAP_ATTENTION}/{n}/bias"].reshape(-1) for n in ("key", "value")]
    )
    state["attn_pool.proj.weight"] = linear_kernel(kernels["out"].reshape(-1, kernels["out"].shape[-1]))
    state["attn_pool.proj.bias"] = arrays[f"{_MAP_ATTENTION}/out/bias"]
    state["attn_pool.norm.weight"] = arrays[f"{_MAP}/LayerNorm_0/scale"]
    state["attn_pool.norm.bias"] = arrays[f"{_MAP}/LayerNorm_0/bias"]
    for timm_name, name in (("fc1", "Dense_0"), ("fc2", "Dense_1")):
        state[f"attn_pool.mlp.{timm_name}.weight"] = linear_kernel(arrays[f"{_MAP}/MlpBlock_0/{name}/kernel"])
        state[f"attn_pool.mlp.{timm_name}.bias"] = arrays[f"{_MAP}/MlpBlock_0/{name}/bias"]
    return state


def _block_from_timm(rest: dict, prefix: str, index: int, heads: int) -> dict[str, np.ndarray]:
    def dense(name):
        weight = rest.pop(f"{prefix}{name}.weight", None)
        return None if weight is None else (linear_kernel(weight), rest.pop(f"{prefix}{name}.bias", None))

    def norm(name):
        return rest.pop(f"{prefix}{name}.weight", None), rest.pop(f"{prefix}{name}.bias", None)

    qkv_kernel, qkv_bias = dense("attn.qkv") or (None, None)
    if qkv_kernel is None:
        return {}  # the loader reports the block's keys as missing
    kernels = np.split(qkv_kernel, 3, axis=1)
    biases = [None] * 3 if qkv_bias is None else np.split(qkv_bias, 3)
    scales = {
        f"{_BLOCK.format(index)}/{name}/gamma": rest.pop(f"{prefix}{name}.gamma")
        for name in _LAYER_SCALES
        if f"{prefix}{name}.gamma" in rest
    }
    for name in _QK_NORMS:  # qk-norm, where the block has it
        if f"{prefix}attn.{name}.weight" in rest:
            key = f"{_ATTENTION.format(index)}/{name}"
            scales[f"{key}/scale"], scales[f"{key}/bias"] = norm(f"attn.{name}")
    return scales | block_arrays(
        index,
        num_heads=heads,
        norm1=norm("norm1"),
        query=(kernels[0], biases[0]),
        key=(kernels[1], biases[1]),
        value=(kernels[2], biases[2]),
        out=dense("attn.proj"),
        norm2=norm("norm2"),
        fc1=dense("mlp.fc1"),
        fc2=dense("mlp.fc2"),
    )


# --- writing ---------------------------------------------------------------------------------------


def _blocks(model: keras.Model) -> list[TransformerBlock]:
    return [layer for layer in model._flatten_layers(include_self=False) if isinstance(layer, TransformerBlock)]


def model_arrays(model: keras.Model) -> dict[str, np.ndarray]:
    """A keras-vit model's weights in the Google ``.npz`` layout (the inverse of the loader's key map)."""
    heads = [block.num_heads for block in _blocks(model)]
    groups: dict[int, tuple[keras.Variable, list[str]]] = {}
    for key, (variable, _) in npz_key_map(model).items():
        groups.setdefault(id(variable), (variable, []))[1].append(key)
    arrays = {}
    for variable, keys in groups.values():
        value = keras.ops.convert_to_numpy(variable)
        for key, part in zip(keys, np.split(value, len(keys), axis=-1)):
            match = _ATTENTION_ARRAY.fullmatch(key)
            if match:
                h = heads[int(match[1])]
                if match[2] in ("query", "key", "value"):
                    part = part.reshape((part.shape[0], h, -1) if match[3] == "kernel" else (h, -1))
                elif match[3] == "kernel":  # out
                    part = part.reshape(h, -1, part.shape[-1])
            arrays[key] = part
    return arrays


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
        qkv = [arrays[f"{attention}/{name}/kernel"] for name in ("query", "key", "value")]
        state[f"{prefix}attn.qkv.weight"] = linear_kernel(np.concatenate([k.reshape(k.shape[0], -1) for k in qkv], 1))
        state[f"{prefix}attn.qkv.bias"] = np.concatenate(
            [arrays[f"{attention}/{name}/bias"].reshape(-1) for name in ("query", "key", "value")]
        )
        out = arrays[f"{attention}/out/kernel"]
        state[f"{prefix}attn.proj.weight"] = linear_kernel(out.reshape(-1, out.shape[-1]))
        state[f"{prefix}attn.proj.bias"] = arrays[f"{attention}/out/bias"]
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
    """A keras-vit model's weights as a timm ``VisionTransformer`` state dict (numpy, float32).

    Load it with ``timm.create_model(**timm_model_kwargs(model)).load_state_dict(...)``; timm has no
    ``pre_logits`` layer, so a model with one keeps it under ``pre_logits.fc`` (older timm's name).
    """
    return npz_to_timm(model_arrays(model), fc_norm=uses_fc_norm(model))


def timm_model_kwargs(model: keras.Model) -> dict:
    """``timm.create_model`` arguments that build ``model``'s architecture in timm (``pretrained=False``)."""
    arrays = model_arrays(model)
    blocks = _blocks(model)
    _, height, width, _ = model.input_shape
    patch, _, _, hidden = arrays["embedding/kernel"].shape
    stems = [layer for layer in model._flatten_layers(include_self=False) if isinstance(layer, ResNetStem)]
    kwargs = dict(
        model_name="vit_base_patch16_224",
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
    epsilon = blocks[0].layer_norm_epsilon
    if epsilon not in _TIMM_EPSILONS:
        raise ValueError(f"timm's ViTs have LayerNorm epsilon 1e-6 or (CLIP) 1e-5, this model {epsilon:g}.")
    kwargs["model_name"] = _TIMM_EPSILONS[epsilon]
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
    with atomic_path(path) as temporary:
        save_file(state, temporary, metadata=metadata)
    return state
