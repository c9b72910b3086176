"""Step 2 of the checkpoint pipeline, convert, for Hugging Face ``transformers``: ViT, DeiT, DINOv2 and the CLIP and
SigLIP image towers into the ``.npz`` key layout, ``config.json`` checked field by field (docs/foreign-weights.md)."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import cast

import numpy as np

from keras_vit.checkpoints.from_timm import (
    block_arrays,
    block_indices,
    conv_kernel,
    guess_num_heads,
    linear_kernel,
    map_head_arrays,
)
from keras_vit.checks import check_fraction, check_positive_number

__all__ = [
    "HIDDEN_ACTS",
    "MODEL_TYPES",
    "TOWER_TYPES",
    "huggingface_to_npz",
    "looks_like_huggingface",
    "looks_like_tower",
    "tower_to_npz",
]

MODEL_TYPES = ("vit", "deit", "dinov2", "dinov2_with_registers")
_PREFIXES = ("vit.", "deit.", "dinov2.")
# A block's parts, as block_arrays takes them: the names of each model type's layers (the first present is taken).
_BLOCK_PARTS = {
    "norm1": ("layernorm_before", "norm1"),
    "query": ("attention.attention.query",),
    "key": ("attention.attention.key",),
    "value": ("attention.attention.value",),
    "out": ("attention.output.dense",),
    "norm2": ("layernorm_after", "norm2"),
    "fc1": ("intermediate.dense", "mlp.fc1", "mlp.weights_in"),
    "fc2": ("output.dense", "mlp.fc2", "mlp.weights_out"),
}
_LAYER_NORM_EPS = 1e-12  # transformers' ViTConfig default, for a state dict without its config.json
_QUERY = r"encoder\.layer\.(\d+)\.attention\.attention\.query\.weight"
# transformers' hidden_act -> keras-vit's gelu
HIDDEN_ACTS = {
    "gelu": "exact",
    "gelu_new": "tanh",
    "gelu_pytorch_tanh": "tanh",
    "gelu_fast": "tanh",
    "quick_gelu": "quick",
}
_TOKENS = (("cls_token", "cls"), ("distillation_token", "distillation_token"), ("register_tokens", "register_tokens"))
_HEADS = (
    ("pooler.dense", "pre_logits"),
    ("classifier", "head"),
    ("cls_classifier", "head"),
    ("distillation_classifier", "head_dist"),
)


def looks_like_huggingface(keys) -> bool:
    """Whether a state dict's keys are the ``transformers`` ViT layout."""
    return any(_unprefixed(key).startswith("embeddings.patch_embeddings.") for key in keys)


def _dense(take, name: str, *default) -> tuple:
    """``name``'s torch ``Linear`` taken out of a state dict as ``(kernel (in, out), bias)``; ``default``: the bias
    where there is none (else a ``KeyError``)."""
    return linear_kernel(take(f"{name}.weight")), take(f"{name}.bias", *default)


def _norm(take, name: str) -> tuple:
    return take(f"{name}.weight"), take(f"{name}.bias")


def _block(take, index: int, num_heads: int, names: Mapping[str, str], prefix: str) -> dict[str, np.ndarray]:
    """:func:`~keras_vit.checkpoints.from_timm.block_arrays` of block ``index``, taken out of a state dict in the order
    of ``names``: each part (``norm1``, ...) from the layer ``prefix + name`` (a Linear's bias may be absent)."""
    parts = {
        part: _norm(take, prefix + name) if part.startswith("norm") else _dense(take, prefix + name, None)
        for part, name in names.items()
    }
    return block_arrays(index, num_heads=num_heads, **parts)


def _unprefixed(key: str) -> str:
    """``key`` without the task model's ``vit.`` / ``deit.`` / ``dinov2.`` prefix."""
    return next((key[len(prefix) :] for prefix in _PREFIXES if key.startswith(prefix)), key)


# The ViTConfig fields of transformers, and what keras-vit does with each: a model option (honoured), a shape of the
# weights (checked against them), or nothing at inference (initialisation, the masked-image-modelling decoder).
_HONOURED = {"hidden_act": "gelu", "layer_norm_eps": "layer_norm_epsilon"}
_DROPOUTS = {
    "hidden_dropout_prob": "dropout",
    "attention_probs_dropout_prob": "attention_dropout",
    "drop_path_rate": "drop_path",  # DINOv2's
}
_SHAPES = ("hidden_size", "num_hidden_layers", "intermediate_size", "patch_size", "num_channels", "image_size")
_INERT: tuple[str, ...] = (
    "initializer_range",
    "encoder_stride",
    "pooler_act",
    "pooler_output_size",
    "qkv_bias",
    "num_attention_heads",
)
# DINOv2's: the MLP's width and kind and the registers are read from the weights (prefix_token_fields), layer scale's
# starting value is the weights', the rest choose the outputs of its backbone API.
_INERT += ("mlp_ratio", "use_swiglu_ffn", "layerscale_value", "use_mask_token")
_INERT += ("out_features", "out_indices", "stage_names", "apply_layernorm", "reshape_hidden_states")
# transformers' PretrainedConfig fields: bookkeeping, not the model's (labels, dtype, outputs, version).
_GENERIC = (
    "_name_or_path",
    "architectures",
    "chunk_size_feed_forward",
    "dtype",
    "torch_dtype",
    "id2label",
    "label2id",
    "num_labels",
    "is_encoder_decoder",
    "model_type",
    "output_attentions",
    "output_hidden_states",
    "problem_type",
    "return_dict",
    "transformers_version",
)


def _shapes(state: Mapping[str, np.ndarray]) -> dict[str, int | None]:
    """The ViTConfig shape fields as the weights show them."""
    kernel = state["embeddings.patch_embeddings.projection.weight"]  # (O, I, kh, kw)
    fc1 = state.get("encoder.layer.0.intermediate.dense.weight")
    tokens = state.get("embeddings.position_embeddings")
    grid = None if tokens is None else tokens.shape[1] - int("embeddings.cls_token" in state)
    side = None if grid is None or math.isqrt(grid) ** 2 != grid else math.isqrt(grid) * kernel.shape[2]
    return {
        "hidden_size": kernel.shape[0],
        "num_hidden_layers": len(block_indices(state, _QUERY)),
        "intermediate_size": None if fc1 is None else fc1.shape[0],
        "patch_size": kernel.shape[2],
        "num_channels": kernel.shape[1],
        "image_size": side,
    }


def _check_config(config: Mapping, state: Mapping[str, np.ndarray], source: str, recorded: Collection[str]) -> dict:
    """The model options ``config.json`` sets (GELU, LayerNorm epsilon, dropouts); a ``ValueError`` naming each
    field keras-vit cannot honour, that disagrees with the weights, or that it does not know."""
    if not isinstance(config, Mapping):
        raise ValueError(f"{source}: config.json holds a JSON {type(config).__name__}, not an object of fields.")
    model_type = config.get("model_type", "vit")
    if model_type not in MODEL_TYPES:
        raise ValueError(
            f"{source} is a Hugging Face {model_type!r} model; keras-vit reads the model types {MODEL_TYPES} "
            "(ViTModel, ViTForImageClassification, DeiT's, Dinov2Model, Dinov2WithRegistersModel) only."
        )
    unknown = sorted(set(config) - {*_HONOURED, *_DROPOUTS, *_SHAPES, *_INERT, *_GENERIC, *recorded})
    if unknown:
        raise ValueError(f"{source}: config.json sets fields keras-vit does not know, so cannot honour: {unknown}.")
    act = config.get("hidden_act", "gelu")
    if not isinstance(act, str) or act not in HIDDEN_ACTS:
        raise ValueError(f"{source} uses hidden_act={act!r}; keras-vit has GELU only ({sorted(HIDDEN_ACTS)}).")
    if config.get("pooler_act", "tanh") != "tanh":
        raise ValueError(f"{source} uses pooler_act={config['pooler_act']!r}; keras-vit's pre_logits is tanh.")
    shapes = _shapes(state)
    differ = [
        f"{name}={config[name]!r} (the weights: {shapes[name]})"
        for name in _SHAPES
        if config.get(name) is not None and shapes[name] is not None and config[name] != shapes[name]
    ]
    heads = config.get("num_attention_heads")
    if heads is not None and (isinstance(heads, bool) or not isinstance(heads, int) or heads < 1):
        raise ValueError(f"{source}: config.json's num_attention_heads must be a positive integer, got {heads!r}.")
    if heads is not None and cast(int, shapes["hidden_size"]) % heads:  # the patch kernel's width, never None
        differ.append(f"num_attention_heads={heads} (does not divide the weights' width {shapes['hidden_size']})")
    pooler = state.get("pooler.dense.weight")
    if pooler is not None and config.get("pooler_output_size") not in (None, pooler.shape[0]):
        differ.append(f"pooler_output_size={config['pooler_output_size']!r} (the weights: {pooler.shape[0]})")
    biases = "encoder.layer.0.attention.attention.query.bias" in state
    if config.get("qkv_bias") is not None and bool(config["qkv_bias"]) != biases:
        differ.append(f"qkv_bias={config['qkv_bias']!r} (the weights {'have' if biases else 'have no'} q/k/v biases)")
    if differ:
        raise ValueError(f"{source}: config.json disagrees with the weights: {'; '.join(differ)}.")
    field = f"{source}: config.json's {{}}".format
    epsilon = check_positive_number(config.get("layer_norm_eps", _LAYER_NORM_EPS), field("layer_norm_eps"))
    options = {"gelu": HIDDEN_ACTS[act], "layer_norm_epsilon": epsilon}
    options.update(
        {option: check_fraction(config[name], field(name)) for name, option in _DROPOUTS.items() if name in config}
    )
    return options


def huggingface_to_npz(
    state: Mapping[str, np.ndarray],
    config: Mapping | None = None,
    *,
    source: str = "the state dict",
    recorded: Collection[str] = (),
) -> tuple[dict[str, np.ndarray], dict, bool]:
    """A ``transformers`` ViT state dict in the ``.npz`` layout, the build options that reproduce it
    (``gelu``) and whether the head count is known (from ``config``; else guessed from the width).
    ``recorded``: the config fields the weights show, accepted here and checked against them by the caller."""
    rest = {_unprefixed(key): np.asarray(v) for key, v in state.items()}
    options = _check_config(config or {}, rest, source, recorded)
    rest.pop("embeddings.mask_token", None)
    take = rest.pop
    embed = "embeddings.patch_embeddings.projection"
    width = rest[f"{embed}.weight"].shape[0]
    heads = (config or {}).get("num_attention_heads") or guess_num_heads(width)
    arrays = {
        "embedding/kernel": conv_kernel(take(f"{embed}.weight")),
        "embedding/bias": take(f"{embed}.bias", np.zeros(width, "float32")),
    }
    for hf_name, name in _TOKENS:
        if f"embeddings.{hf_name}" in rest:
            arrays[name] = take(f"embeddings.{hf_name}")
    if "embeddings.position_embeddings" in rest:
        arrays["Transformer/posembed_input/pos_embedding"] = take("embeddings.position_embeddings")
    for i in block_indices(rest, _QUERY):
        prefix = f"encoder.layer.{i}."
        parts = {
            part: next((n for n in names if f"{prefix}{n}.weight" in rest), names[0])
            for part, names in _BLOCK_PARTS.items()
        }
        for scale, name in (("layer_scale1", "ls1"), ("layer_scale2", "ls2")):
            if f"{prefix}{scale}.lambda1" in rest:
                arrays[f"Transformer/encoderblock_{i}/{name}/gamma"] = take(f"{prefix}{scale}.lambda1")
        arrays.update(_block(take, i, heads, parts, prefix))
    arrays["Transformer/encoder_norm/scale"], arrays["Transformer/encoder_norm/bias"] = _norm(take, "layernorm")
    for hf_name, name in _HEADS:
        if f"{hf_name}.weight" in rest:
            arrays[f"{name}/kernel"] = linear_kernel(take(f"{hf_name}.weight"))
            arrays[f"{name}/bias"] = take(f"{hf_name}.bias")
    arrays.update(rest)  # unrecognised: reported as unexpected by the loader
    return arrays, options, bool(config and config.get("num_attention_heads"))


# --- the CLIP and SigLIP image towers ----------------------------------------------------------------

TOWER_TYPES = ("clip_vision_model", "siglip_vision_model")
_PREFIX = "vision_model."
_PATCH = "embeddings.patch_embedding.weight"
_TOWER_BLOCK = {  # a block's layers, by part, in block_arrays' order
    "norm1": "layer_norm1",
    "query": "self_attn.q_proj",
    "key": "self_attn.k_proj",
    "value": "self_attn.v_proj",
    "out": "self_attn.out_proj",
    "norm2": "layer_norm2",
    "fc1": "mlp.fc1",
    "fc2": "mlp.fc2",
}
_MAP = "MAPHead_0"


def looks_like_tower(keys) -> bool:
    """Whether a state dict's keys are a ``transformers`` CLIP or SigLIP vision model's."""
    return any(key in (_PATCH, _PREFIX + _PATCH) for key in keys)


def _options(config: Mapping, source: str) -> dict:
    model_type = config.get("model_type", TOWER_TYPES[0])
    if not isinstance(model_type, str) or model_type not in TOWER_TYPES:
        raise ValueError(
            f"{source} is a Hugging Face {model_type!r} model; keras-vit reads the image towers {TOWER_TYPES} "
            "(CLIPVisionModel, CLIPVisionModelWithProjection, SiglipVisionModel) of this layout."
        )
    act = config.get("hidden_act", "quick_gelu" if model_type == TOWER_TYPES[0] else "gelu_pytorch_tanh")
    if not isinstance(act, str) or act not in HIDDEN_ACTS:
        raise ValueError(f"{source} uses hidden_act={act!r}; keras-vit has {sorted(HIDDEN_ACTS)}.")
    epsilon = config.get("layer_norm_eps", 1e-5 if model_type == TOWER_TYPES[0] else 1e-6)
    epsilon = check_positive_number(epsilon, f"{source}: config.json's layer_norm_eps")
    return {"gelu": HIDDEN_ACTS[act], "layer_norm_epsilon": epsilon}


def tower_to_npz(
    state: Mapping[str, np.ndarray], config: Mapping | None = None, *, source: str = "the state dict"
) -> tuple[dict[str, np.ndarray], dict, bool]:
    """A CLIP or SigLIP vision model's state dict in the ``.npz`` layout, the build options that reproduce it
    (``gelu``, ``layer_norm_epsilon``) and whether the head count is known (from ``config``)."""
    options = _options(config or {}, source)
    rest = {key.removeprefix(_PREFIX): np.asarray(v) for key, v in state.items()}
    take = rest.pop
    width = rest[_PATCH].shape[0]
    heads = (config or {}).get("num_attention_heads") or guess_num_heads(width)
    arrays = {
        "embedding/kernel": conv_kernel(take(_PATCH)),
        "embedding/bias": take("embeddings.patch_embedding.bias", np.zeros(width, "float32")),
        "Transformer/posembed_input/pos_embedding": take("embeddings.position_embedding.weight")[None],
    }
    if "embeddings.class_embedding" in rest:
        arrays["cls"] = take("embeddings.class_embedding").reshape(1, 1, width)
    if "pre_layrnorm.weight" in rest:
        arrays["Transformer/norm_pre/scale"], arrays["Transformer/norm_pre/bias"] = _norm(take, "pre_layrnorm")
    rest.pop("embeddings.position_ids", None)  # a buffer of older files: 0 ... N-1
    depth = len({key.split(".")[2] for key in rest if key.startswith("encoder.layers.")})
    for i in range(depth):
        arrays.update(_block(take, i, heads, _TOWER_BLOCK, f"encoder.layers.{i}."))
    arrays["Transformer/encoder_norm/scale"], arrays["Transformer/encoder_norm/bias"] = _norm(take, "post_layernorm")
    if "head.probe" in rest:  # nn.MultiheadAttention's fused in_proj
        probe = take("head.probe")
        in_proj = linear_kernel(take("head.attention.in_proj_weight"))
        query, key, value = zip(np.split(in_proj, 3, axis=1), np.split(take("head.attention.in_proj_bias"), 3))
        out, norm = _dense(take, "head.attention.out_proj"), _norm(take, "head.layernorm")
        fc1, fc2 = _dense(take, "head.mlp.fc1", None), _dense(take, "head.mlp.fc2", None)
        arrays.update(map_head_arrays(heads, probe, query, key, value, out, norm, fc1, fc2))
    if "visual_projection.weight" in rest:
        projection = linear_kernel(take("visual_projection.weight"))
        arrays["head/kernel"], arrays["head/bias"] = projection, np.zeros(projection.shape[1], projection.dtype)
    arrays.update(rest)  # unrecognised: reported as unexpected by the loader
    return arrays, options, bool(config and config.get("num_attention_heads"))
