"""Hugging Face ``transformers`` ViT checkpoints (``ViTModel``, ``ViTForImageClassification``) in the
Google ``.npz`` key layout, for the strict loader of :mod:`keras_vit.checkpoints.load`.

A folder holds ``config.json`` (``model_type: "vit"``, ``num_attention_heads``, ``hidden_act``, ...) and
``model.safetensors`` or ``pytorch_model.bin``. Keys (``vit.`` prefix in ``ViTForImageClassification``,
none in ``ViTModel``):

    embeddings.patch_embeddings.projection     -> embedding          (conv, (O, I, kh, kw) -> (kh, kw, I, O))
    embeddings.cls_token / position_embeddings -> cls / posembed_input/pos_embedding
    encoder.layer.{i}.layernorm_before / _after -> encoderblock_{i}/LayerNorm_0 / LayerNorm_2
    encoder.layer.{i}.attention.attention.{query,key,value}, attention.output.dense -> MultiHeadDotProductAttention_1
    encoder.layer.{i}.intermediate.dense / output.dense -> MlpBlock_3/Dense_0 / Dense_1
    layernorm -> encoder_norm;  pooler.dense (ViTModel, tanh) -> pre_logits;  classifier -> head

``embeddings.mask_token`` (masked-image-modelling input only) is not used at inference and is dropped.
HF's LayerNorm epsilon (``layer_norm_eps``, 1e-12 by default) differs from keras-vit's 1e-6: outputs agree
to ~1e-6 relative.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from keras_vit.checkpoints.formats import reject_unsupported
from keras_vit.checkpoints.timm import block_arrays, block_indices, conv_kernel, guess_num_heads, linear_kernel

__all__ = ["HUGGINGFACE_UNSUPPORTED", "huggingface_to_npz", "looks_like_huggingface"]

HUGGINGFACE_UNSUPPORTED = {
    r"distillation_token": "DeiT's distillation token (distillation_token)",
    r"register_tokens": "register tokens (register_tokens)",
    r"layer_scale|lambda1": "layer scale",
}
_GELUS = {"gelu": "exact", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh"}


def looks_like_huggingface(keys) -> bool:
    """Whether a state dict's keys are the ``transformers`` ViT layout."""
    return any(key.split("vit.", 1)[-1].startswith("embeddings.patch_embeddings.") for key in keys)


def _check_config(config: Mapping, source: str) -> dict:
    model_type = config.get("model_type", "vit")
    if model_type != "vit":
        raise ValueError(
            f"{source} is a Hugging Face {model_type!r} model; keras-vit reads model_type 'vit' (ViTModel, "
            "ViTForImageClassification) only."
        )
    act = config.get("hidden_act", "gelu")
    if act not in _GELUS:
        raise ValueError(f"{source} uses hidden_act={act!r}; keras-vit has GELU only ({sorted(_GELUS)}).")
    if config.get("pooler_act", "tanh") != "tanh":
        raise ValueError(f"{source} uses pooler_act={config['pooler_act']!r}; keras-vit's pre_logits is tanh.")
    return {"gelu": _GELUS[act]}


def huggingface_to_npz(
    state: Mapping[str, np.ndarray], config: Mapping | None = None, *, source: str = "the state dict"
) -> tuple[dict[str, np.ndarray], dict, bool]:
    """A ``transformers`` ViT state dict in the ``.npz`` layout, the build options that reproduce it
    (``gelu``) and whether the head count is known (from ``config``; else guessed from the width)."""
    reject_unsupported(state, HUGGINGFACE_UNSUPPORTED, source)
    options = _check_config(config or {}, source)
    rest = {(key[len("vit.") :] if key.startswith("vit.") else key): np.asarray(v) for key, v in state.items()}
    rest.pop("embeddings.mask_token", None)
    take = rest.pop
    embed = "embeddings.patch_embeddings.projection"
    width = rest[f"{embed}.weight"].shape[0]
    heads = (config or {}).get("num_attention_heads") or guess_num_heads(width)
    arrays = {
        "embedding/kernel": conv_kernel(take(f"{embed}.weight")),
        "embedding/bias": take(f"{embed}.bias", np.zeros(width, "float32")),
    }
    if "embeddings.cls_token" in rest:
        arrays["cls"] = take("embeddings.cls_token")
    if "embeddings.position_embeddings" in rest:
        arrays["Transformer/posembed_input/pos_embedding"] = take("embeddings.position_embeddings")
    for i in block_indices(rest, r"encoder\.layer\.(\d+)\.attention\.attention\.query\.weight"):
        prefix = f"encoder.layer.{i}."

        def dense(name, prefix=prefix):
            return linear_kernel(take(f"{prefix}{name}.weight")), take(f"{prefix}{name}.bias", None)

        def norm(name, prefix=prefix):
            return take(f"{prefix}{name}.weight"), take(f"{prefix}{name}.bias")

        arrays.update(
            block_arrays(
                i,
                num_heads=heads,
                norm1=norm("layernorm_before"),
                query=dense("attention.attention.query"),
                key=dense("attention.attention.key"),
                value=dense("attention.attention.value"),
                out=dense("attention.output.dense"),
                norm2=norm("layernorm_after"),
                fc1=dense("intermediate.dense"),
                fc2=dense("output.dense"),
            )
        )
    for hf_name, name in (("layernorm", "Transformer/encoder_norm"),):
        arrays[f"{name}/scale"], arrays[f"{name}/bias"] = take(f"{hf_name}.weight"), take(f"{hf_name}.bias")
    for hf_name, name in (("pooler.dense", "pre_logits"), ("classifier", "head")):
        if f"{hf_name}.weight" in rest:
            arrays[f"{name}/kernel"] = linear_kernel(take(f"{hf_name}.weight"))
            arrays[f"{name}/bias"] = take(f"{hf_name}.bias")
    arrays.update(rest)  # unrecognised: reported as unexpected by the loader
    return arrays, options, bool(config and config.get("num_attention_heads"))
