"""Hugging Face CLIP and SigLIP image towers (``CLIPVisionModel[WithProjection]``, ``SiglipVisionModel``) in the
``.npz`` key layout (key map in docs/foreign-weights.md); ``layer_norm_eps`` and ``hidden_act`` become options."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from keras_vit.checkpoints.huggingface import HIDDEN_ACTS
from keras_vit.checkpoints.timm import block_arrays, conv_kernel, guess_num_heads, linear_kernel
from keras_vit.checks import check_positive_number

__all__ = ["TOWER_TYPES", "looks_like_tower", "tower_to_npz"]

TOWER_TYPES = ("clip_vision_model", "siglip_vision_model")
_PREFIX = "vision_model."
_PATCH = "embeddings.patch_embedding.weight"
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


def _attention(take, prefix: str, width: int, heads: int) -> dict[str, np.ndarray]:
    """nn.MultiheadAttention's fused ``in_proj`` and ``out_proj`` as ``MAPHead_0``'s q/k/v/out arrays."""
    kernels = np.split(linear_kernel(take(f"{prefix}.in_proj_weight")), 3, axis=1)
    biases = np.split(take(f"{prefix}.in_proj_bias"), 3)
    arrays = {}
    attention = f"{_MAP}/MultiHeadDotProductAttention_0"
    for name, kernel, bias in zip(("query", "key", "value"), kernels, biases):
        arrays[f"{attention}/{name}/kernel"] = kernel.reshape(width, heads, -1)
        arrays[f"{attention}/{name}/bias"] = bias.reshape(heads, -1)
    out = linear_kernel(take(f"{prefix}.out_proj.weight"))
    arrays[f"{attention}/out/kernel"] = out.reshape(heads, -1, width)
    arrays[f"{attention}/out/bias"] = take(f"{prefix}.out_proj.bias")
    return arrays


def tower_to_npz(
    state: Mapping[str, np.ndarray], config: Mapping | None = None, *, source: str = "the state dict"
) -> tuple[dict[str, np.ndarray], dict, bool]:
    """A CLIP or SigLIP vision model's state dict in the ``.npz`` layout, the build options that reproduce it
    (``gelu``, ``layer_norm_epsilon``) and whether the head count is known (from ``config``)."""
    options = _options(config or {}, source)
    rest = {(key[len(_PREFIX) :] if key.startswith(_PREFIX) else key): np.asarray(v) for key, v in state.items()}
    take = rest.pop
    width = rest[_PATCH].shape[0]
    heads = (config or {}).get("num_attention_heads") or guess_num_heads(width)

    def dense(name):
        return linear_kernel(take(f"{name}.weight")), take(f"{name}.bias", None)

    def norm(name):
        return take(f"{name}.weight"), take(f"{name}.bias")

    arrays = {
        "embedding/kernel": conv_kernel(take(_PATCH)),
        "embedding/bias": take("embeddings.patch_embedding.bias", np.zeros(width, "float32")),
        "Transformer/posembed_input/pos_embedding": take("embeddings.position_embedding.weight")[None],
    }
    if "embeddings.class_embedding" in rest:
        arrays["cls"] = take("embeddings.class_embedding").reshape(1, 1, width)
    if "pre_layrnorm.weight" in rest:
        arrays["Transformer/norm_pre/scale"], arrays["Transformer/norm_pre/bias"] = norm("pre_layrnorm")
    rest.pop("embeddings.position_ids", None)  # a buffer of older files: 0 ... N-1
    depth = len({key.split(".")[2] for key in rest if key.startswith("encoder.layers.")})
    for i in range(depth):
        layer = f"encoder.layers.{i}."
        arrays.update(
            block_arrays(
                i,
                num_heads=heads,
                norm1=norm(f"{layer}layer_norm1"),
                query=dense(f"{layer}self_attn.q_proj"),
                key=dense(f"{layer}self_attn.k_proj"),
                value=dense(f"{layer}self_attn.v_proj"),
                out=dense(f"{layer}self_attn.out_proj"),
                norm2=norm(f"{layer}layer_norm2"),
                fc1=dense(f"{layer}mlp.fc1"),
                fc2=dense(f"{layer}mlp.fc2"),
            )
        )
    arrays["Transformer/encoder_norm/scale"], arrays["Transformer/encoder_norm/bias"] = norm("post_layernorm")
    if "head.probe" in rest:
        arrays[f"{_MAP}/probe"] = take("head.probe")
        arrays.update(_attention(take, "head.attention", width, heads))
        arrays[f"{_MAP}/LayerNorm_0/scale"], arrays[f"{_MAP}/LayerNorm_0/bias"] = norm("head.layernorm")
        for hf_name, name in (("fc1", "Dense_0"), ("fc2", "Dense_1")):
            kernel, bias = dense(f"head.mlp.{hf_name}")
            arrays[f"{_MAP}/MlpBlock_0/{name}/kernel"], arrays[f"{_MAP}/MlpBlock_0/{name}/bias"] = kernel, bias
    if "visual_projection.weight" in rest:
        projection = linear_kernel(take("visual_projection.weight"))
        arrays["head/kernel"], arrays["head/bias"] = projection, np.zeros(projection.shape[1], projection.dtype)
    arrays.update(rest)  # unrecognised: reported as unexpected by the loader
    return arrays, options, bool(config and config.get("num_attention_heads"))
