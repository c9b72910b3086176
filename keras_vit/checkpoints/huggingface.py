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
``config.json`` is honoured field by field (:func:`_check_config`): ``hidden_act`` (the GELU), ``layer_norm_eps``
(1e-12 by default, the model's ``layer_norm_epsilon``) and the dropouts become model options; the shapes
(``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``, ``qkv_bias``, ...) must agree with the weights; a
field keras-vit does not know is refused, naming it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from keras_vit.checkpoints.formats import reject_unsupported
from keras_vit.checkpoints.timm import block_arrays, block_indices, conv_kernel, guess_num_heads, linear_kernel
from keras_vit.checks import check_fraction, check_positive_number

__all__ = ["HIDDEN_ACTS", "HUGGINGFACE_UNSUPPORTED", "huggingface_to_npz", "looks_like_huggingface"]

HUGGINGFACE_UNSUPPORTED = {
    r"distillation_token": "DeiT's distillation token (distillation_token)",
    r"register_tokens": "register tokens (register_tokens)",
    r"layer_scale|lambda1": "layer scale",
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


def looks_like_huggingface(keys) -> bool:
    """Whether a state dict's keys are the ``transformers`` ViT layout."""
    return any(key.split("vit.", 1)[-1].startswith("embeddings.patch_embeddings.") for key in keys)


# The ViTConfig fields of transformers, and what keras-vit does with each: a model option (honoured), a shape of the
# weights (checked against them), or nothing at inference (initialisation, the masked-image-modelling decoder).
_HONOURED = {"hidden_act": "gelu", "layer_norm_eps": "layer_norm_epsilon"}
_DROPOUTS = {"hidden_dropout_prob": "dropout", "attention_probs_dropout_prob": "attention_dropout"}
_SHAPES = ("hidden_size", "num_hidden_layers", "intermediate_size", "patch_size", "num_channels", "image_size")
_INERT = ("initializer_range", "encoder_stride", "pooler_act", "pooler_output_size", "qkv_bias", "num_attention_heads")
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


def _positive_int(config: Mapping, name: str, source: str) -> int | None:
    value = config.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{source}: config.json's {name} must be a positive integer, got {value!r}.")
    return value


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


def _check_config(config: Mapping, state: Mapping[str, np.ndarray], source: str) -> dict:
    """The model options ``config.json`` sets (GELU, LayerNorm epsilon, dropouts); a ``ValueError`` naming each
    field keras-vit cannot honour, that disagrees with the weights, or that it does not know."""
    if not isinstance(config, Mapping):
        raise ValueError(f"{source}: config.json holds a JSON {type(config).__name__}, not an object of fields.")
    model_type = config.get("model_type", "vit")
    if model_type != "vit":
        raise ValueError(
            f"{source} is a Hugging Face {model_type!r} model; keras-vit reads model_type 'vit' (ViTModel, "
            "ViTForImageClassification) only."
        )
    unknown = sorted(set(config) - {*_HONOURED, *_DROPOUTS, *_SHAPES, *_INERT, *_GENERIC})
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
    heads = _positive_int(config, "num_attention_heads", source)
    if heads is not None and shapes["hidden_size"] % heads:
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
    state: Mapping[str, np.ndarray], config: Mapping | None = None, *, source: str = "the state dict"
) -> tuple[dict[str, np.ndarray], dict, bool]:
    """A ``transformers`` ViT state dict in the ``.npz`` layout, the build options that reproduce it
    (``gelu``) and whether the head count is known (from ``config``; else guessed from the width)."""
    reject_unsupported(state, HUGGINGFACE_UNSUPPORTED, source)
    rest = {(key[len("vit.") :] if key.startswith("vit.") else key): np.asarray(v) for key, v in state.items()}
    options = _check_config(config or {}, rest, source)
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
    for i in block_indices(rest, _QUERY):
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
