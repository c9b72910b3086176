"""Step 2 of the checkpoint pipeline, convert, for timm (:func:`timm_to_npz`; key map in docs/foreign-weights.md),
and the torch layout helpers the Hugging Face converters share. The inverse: :mod:`keras_vit.checkpoints.timm`."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping

import numpy as np

from keras_vit.resnet import TIMM_RESNET
from keras_vit.variants import SIZES

__all__ = [
    "TIMM_UNSUPPORTED",
    "block_arrays",
    "block_indices",
    "conv_kernel",
    "guess_num_heads",
    "linear_kernel",
    "looks_like_timm",
    "map_head_arrays",
    "reject_unsupported",
    "timm_to_npz",
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
_BACKBONE = "patch_embed.backbone."
_LAYER_SCALES = ("ls1", "ls2")
_QK_NORMS = ("q_norm", "k_norm")
_MAP = "MAPHead_0"
_MAP_ATTENTION = _MAP + "/MultiHeadDotProductAttention_0"
_CLIP_EPSILON = 1e-5  # the LayerNorm epsilon of timm's CLIP towers (pre_norm=True), 1e-6 elsewhere
_TOKENS = (("cls_token", "cls"), ("dist_token", "distillation_token"), ("reg_token", "register_tokens"))
_HEADS = (("pre_logits.fc", "pre_logits"), ("head", "head"), ("head_dist", "head_dist"))
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


def reject_unsupported(keys: Iterable[str], unsupported: Mapping[str, str], source: str) -> None:
    """A ``ValueError`` naming each unsupported feature whose pattern (a regex searched in a key) matches."""
    keys = list(keys)
    found = {
        feature: hits
        for pattern, feature in unsupported.items()
        if (hits := [key for key in keys if re.search(pattern, key)])
    }
    if found:
        listed = "; ".join(
            f"{feature} ({', '.join(hits[:3])}{', ...' if len(hits) > 3 else ''})" for feature, hits in found.items()
        )
        raise ValueError(
            f"{source} is a ViT variant keras-vit does not implement: {listed}. Nothing was loaded; keras-vit "
            "builds the plain ViT of Dosovitskiy et al. (and its hybrids)."
        )


def looks_like_timm(keys) -> bool:
    """Whether a state dict's keys are timm's ViT layout."""
    return "patch_embed.proj.weight" in keys and any(key.startswith("blocks.") for key in keys)


def _resnet_key_to_npz(key: str) -> str | None:
    """``stem.conv.weight`` -> ``conv_root/kernel``, ``stages.0.blocks.1.norm2.bias`` -> ``block1/unit2/gn2/bias``."""
    if match := re.fullmatch(r"stem\.(conv|norm)\.(weight|bias)", key):
        return "conv_root/kernel" if match[1] == "conv" else f"gn_root/{_NORM_PARAMS[match[2]]}"
    match = re.fullmatch(r"stages\.(\d+)\.blocks\.(\d+)\.((?:downsample\.)?(?:conv|norm)\d?)\.(weight|bias)", key)
    if match and match[3] in _RESNET_LAYERS:
        layer = _RESNET_LAYERS[match[3]]
        param = "kernel" if layer.startswith("conv") else _NORM_PARAMS[match[4]]
        return f"block{int(match[1]) + 1}/unit{int(match[2]) + 1}/{layer}/{param}"
    return None


def timm_to_npz(
    state: Mapping[str, np.ndarray], *, num_heads: int | None = None, source: str = "the state dict"
) -> tuple[dict[str, np.ndarray], dict]:
    """A timm ViT state dict in the ``.npz`` layout, and the :class:`~keras_vit.config.ViTConfig` fields that
    reproduce timm's model (``gelu="exact"``, the norm after pooling, timm's ResNet numerics). Unknown keys pass
    through (the loader lists them); a known unsupported variant (:data:`TIMM_UNSUPPORTED`) is a ``ValueError``."""
    reject_unsupported(state, TIMM_UNSUPPORTED, source)
    tokens = state["pos_embed"].shape[1] if "reg_token" in state and "pos_embed" in state else 0
    if math.isqrt(tokens) ** 2 != tokens:  # registers with position embeddings: keras-vit's have none, as DINOv2's
        feature = "register tokens with position embeddings (reg_tokens without no_embed_class)"
        reject_unsupported(["pos_embed"], {"pos_embed": feature}, source)
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
        if npz_key := _resnet_key_to_npz(key.removeprefix(_BACKBONE)):
            value = take(key)
            arrays[npz_key] = conv_kernel(value) if npz_key.endswith("/kernel") else value
    if "conv_root/kernel" in arrays:
        options.update(TIMM_RESNET)
    arrays.update(rest)  # unrecognised: reported as unexpected by the loader
    return arrays, options


def map_head_arrays(num_heads: int, probe, query, key, value, out, norm, fc1, fc2) -> dict[str, np.ndarray]:
    """big_vision's ``MAPHead_0`` arrays from its ``probe`` ``(1, 1, D)``, ``(kernel (in, out), bias)`` pairs and
    the ``(scale, bias)`` of its norm (shared by the timm and Hugging Face readers)."""
    width = query[0].shape[0]
    arrays = {f"{_MAP}/probe": probe}
    for name, (kernel, bias) in (("query", query), ("key", key), ("value", value)):
        arrays[f"{_MAP_ATTENTION}/{name}/kernel"] = kernel.reshape(width, num_heads, -1)
        arrays[f"{_MAP_ATTENTION}/{name}/bias"] = bias.reshape(num_heads, -1)
    arrays[f"{_MAP_ATTENTION}/out/kernel"] = out[0].reshape(num_heads, -1, out[0].shape[-1])
    arrays[f"{_MAP_ATTENTION}/out/bias"] = out[1]
    arrays[f"{_MAP}/LayerNorm_0/scale"], arrays[f"{_MAP}/LayerNorm_0/bias"] = norm
    for name, (kernel, bias) in (("Dense_0", fc1), ("Dense_1", fc2)):
        arrays[f"{_MAP}/MlpBlock_0/{name}/kernel"], arrays[f"{_MAP}/MlpBlock_0/{name}/bias"] = kernel, bias
    return arrays


def _map_head_from_timm(rest: dict, heads: int) -> dict[str, np.ndarray]:
    """timm's ``attn_pool`` (``AttentionPoolLatent``) as big_vision's ``MAPHead_0`` arrays."""
    take = rest.pop

    def dense(name):
        return linear_kernel(take(f"attn_pool.{name}.weight")), take(f"attn_pool.{name}.bias")

    query, (kv, kv_bias), out = dense("q"), dense("kv"), dense("proj")
    key, value = zip(np.split(kv, 2, axis=1), np.split(kv_bias, 2))
    probe, norm = take("attn_pool.latent"), (take("attn_pool.norm.weight"), take("attn_pool.norm.bias"))
    fc1, fc2 = dense("mlp.fc1"), dense("mlp.fc2")
    return map_head_arrays(heads, probe.reshape(1, 1, probe.shape[-1]), query, key, value, out, norm, fc1, fc2)


def _block_from_timm(rest: dict, prefix: str, index: int, heads: int) -> dict[str, np.ndarray]:
    def dense(name):
        weight = rest.pop(f"{prefix}{name}.weight", None)
        return None if weight is None else (linear_kernel(weight), rest.pop(f"{prefix}{name}.bias", None))

    def norm(name):
        return rest.pop(f"{prefix}{name}.weight", None), rest.pop(f"{prefix}{name}.bias", None)

    qkv_kernel, qkv_bias = dense("attn.qkv") or (None, None)
    if qkv_kernel is None:
        return {}  # the loader reports the block's keys as missing
    query, key, value = zip(np.split(qkv_kernel, 3, axis=1), [None] * 3 if qkv_bias is None else np.split(qkv_bias, 3))
    scales = {
        f"{_BLOCK.format(index)}/{name}/gamma": rest.pop(f"{prefix}{name}.gamma")
        for name in _LAYER_SCALES
        if f"{prefix}{name}.gamma" in rest
    }
    for name in _QK_NORMS:  # qk-norm, where the block has it
        if f"{prefix}attn.{name}.weight" in rest:
            layer = f"{_ATTENTION.format(index)}/{name}"
            scales[f"{layer}/scale"], scales[f"{layer}/bias"] = norm(f"attn.{name}")
    return scales | block_arrays(
        index,
        num_heads=heads,
        norm1=norm("norm1"),
        query=query,
        key=key,
        value=value,
        out=dense("attn.proj"),
        norm2=norm("norm2"),
        fc1=dense("mlp.fc1"),
        fc2=dense("mlp.fc2"),
    )
