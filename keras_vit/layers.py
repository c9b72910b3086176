"""The Vision Transformer's layers, one per line of the paper's equations (Eq. 1-4; the map: docs/design.md)."""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator

import keras
import numpy as np
from keras import layers, ops

from keras_vit.checks import (
    check_bool,
    check_choice,
    check_fraction,
    check_positive_int,
    check_positive_number,
    optional,
)
from keras_vit.checks import check_pair as _pair
from keras_vit.config import DATA_FORMATS, LAYER_NORM_EPSILON, MLP_TYPES, grid_length
from keras_vit.config import GELUS as GELU_VARIANTS
from keras_vit.quantization import arguments_config, dtype_config, sublayer_policy

__all__ = [
    "GELU_VARIANTS",
    "LAYER_NORM_EPSILON",
    "PAD_ODD_ATTENTION",
    "ChannelsLast",
    "ClassToken",
    "DropPath",
    "LayerScale",
    "MlpBlock",
    "MultiHeadSelfAttention",
    "PatchEmbed",
    "TokenPooling",
    "TransformerBlock",
    "activation",
    "channels_last_shape",
    "check_data_format",
    "format_shape",
    "fused_attention",
    "fused_attention_available",
    "layer_norm",
    "mixed_norms",
    "norm_policy",
    "pads_odd_attention",
    "to_channels_last",
]


def layer_norm(name: str, dtype=None, epsilon: float = LAYER_NORM_EPSILON) -> layers.LayerNormalization:
    """LayerNorm with the published models' epsilon (CLIP's: 1e-5), under :func:`norm_policy`."""
    return layers.LayerNormalization(epsilon=epsilon, name=name, dtype=norm_policy(dtype))


# Set while keras_vit.models.for_inference builds its copy (mixed_norms).
_MIXED_NORMS = contextvars.ContextVar("keras_vit_mixed_norms", default=False)


@contextlib.contextmanager
def mixed_norms() -> Iterator[None]:
    """Norms built inside keep float32 parameters in a bfloat16 or float16 layer (:func:`norm_policy`)."""
    token = _MIXED_NORMS.set(True)
    try:
        yield
    finally:
        _MIXED_NORMS.reset(token)


def norm_policy(dtype: str | keras.DTypePolicy | None = None) -> str | keras.DTypePolicy | None:
    """A normalisation layer's policy inside a layer under ``dtype``: ``dtype``, but inside :func:`mixed_norms` the
    mixed policy of a bfloat16 or float16 one (parameters in float32, as Keras' norms keep them under mixed
    precision), so that :func:`keras_vit.models.for_inference` computes what the mixed model does."""
    if not _MIXED_NORMS.get():
        return dtype
    policy = keras.dtype_policies.get(keras.config.dtype_policy() if dtype is None else dtype)
    if type(policy) is keras.DTypePolicy and policy.variable_dtype == policy.compute_dtype in ("bfloat16", "float16"):
        return keras.dtype_policies.get(f"mixed_{policy.compute_dtype}")
    return dtype


Transform = Callable[[np.ndarray], np.ndarray]  # a checkpoint array -> the value of its variable
KeyMap = dict[str, tuple[keras.Variable, Transform]]  # ``.npz`` key -> (variable, transform): docs/design.md


def identity(array: np.ndarray) -> np.ndarray:
    return array


class MergeHeads:
    """A transform: ``(..., heads, head_dim, ...)`` at ``axis`` -> one ``heads * head_dim`` axis, checking the head
    count (``ValueError``); :meth:`inverse` splits the heads out again (the writers' ``model_arrays``)."""

    def __init__(self, num_heads: int, axis: int):
        self.num_heads, self.axis = num_heads, axis

    def __call__(self, array: np.ndarray) -> np.ndarray:
        if array.ndim <= self.axis + 1 or array.shape[self.axis] != self.num_heads:
            raise ValueError(f"shape {array.shape} does not split into the model's {self.num_heads} heads")
        return array.reshape((*array.shape[: self.axis], -1, *array.shape[self.axis + 2 :]))

    def inverse(self, array: np.ndarray) -> np.ndarray:
        return array.reshape((*array.shape[: self.axis], self.num_heads, -1, *array.shape[self.axis + 1 :]))


def dense_entries(prefix: str, layer: layers.Layer, kernel: Transform = identity, bias: Transform = identity) -> KeyMap:
    """``{prefix}/kernel`` and ``{prefix}/bias`` of ``layer`` (a ``Dense`` or :class:`PatchEmbed`)."""
    return {f"{prefix}/kernel": (layer.kernel, kernel), f"{prefix}/bias": (layer.bias, bias)}


def entries_of(prefix: str, *sublayers: layers.Layer | None) -> KeyMap:
    """The checkpoint entries of ``sublayers`` (``None`` skipped), each under ``{prefix}/{its name}``: a
    ``LayerNormalization``'s ``scale`` and ``bias``, a ``Dense``'s ``kernel`` and ``bias``, else its ``npz_key_map``."""
    entries: KeyMap = {}
    for layer in (layer for layer in sublayers if layer is not None):
        key = f"{prefix}/{layer.name}"
        if isinstance(layer, layers.LayerNormalization):
            entries |= {f"{key}/scale": (layer.gamma, identity), f"{key}/bias": (layer.beta, identity)}
        else:
            entries |= dense_entries(key, layer) if isinstance(layer, layers.Dense) else layer.npz_key_map(key)
    return entries


def attention_entries(prefix: str, heads: int, projections, out: layers.Dense) -> KeyMap:
    """``{prefix}/{name}``'s q/k/v ``(D, heads, d_h)`` arrays into their projections, ``(name, Dense)`` in order (a
    fused ``Dense`` takes its names' arrays concatenated), and ``{prefix}/out`` from ``(heads, d_h, D)``."""
    entries: KeyMap = {}
    for name, layer in projections:
        entries |= dense_entries(f"{prefix}/{name}", layer, MergeHeads(heads, 1), MergeHeads(heads, 0))
    return entries | dense_entries(f"{prefix}/out", out, kernel=MergeHeads(heads, 0))


TO_CHANNELS_LAST, TO_CHANNELS_FIRST = (0, 2, 3, 1), (0, 3, 1, 2)  # ops.transpose's axes of an image batch


def check_data_format(value, name: str = "data_format") -> str:
    """``value`` if it is one of :data:`~keras_vit.config.DATA_FORMATS`; a ``ValueError`` naming them otherwise."""
    return check_choice(value, DATA_FORMATS, name)


def channels_last_shape(shape, data_format: str) -> tuple:
    """The shape ``(B, H, W, C)`` of an image batch of ``shape`` in ``data_format`` once channels-last."""
    return tuple(shape) if data_format == "channels_last" else (shape[0], *shape[2:], shape[1])


def format_shape(shape, data_format: str) -> tuple:
    """The channels-last shape ``(B, H, W, C)`` in ``data_format``: :func:`channels_last_shape` undone."""
    return tuple(shape) if data_format == "channels_last" else (shape[0], shape[-1], *shape[1:-1])


def to_channels_last(images, data_format: str):
    """A batch of images in ``data_format`` as ``(B, H, W, C)``: transposed when channels-first."""
    return images if data_format == "channels_last" else ops.transpose(images, TO_CHANNELS_LAST)


def add_conv_kernel(
    layer: layers.Layer, input_shape, kernel_size: tuple[int, int], filters: int, data_format: str = "channels_last"
):
    """Give ``layer`` a LeCun-normal ``kernel`` (kh, kw, C, filters) for inputs of known C in ``data_format``."""
    channels = channels_last_shape(input_shape, data_format)[-1]
    if channels is None:
        raise ValueError(f"{type(layer).__name__} needs a known number of input channels.")
    layer.input_spec = layers.InputSpec(ndim=4, axes={-1 if data_format == "channels_last" else 1: channels})
    return layer.add_weight(
        name="kernel", shape=(*kernel_size, channels, filters), initializer=keras.initializers.LecunNormal()
    )


def conv_nhwc(x, kernel, strides: tuple[int, int], padding: str):
    """``ops.conv`` of NHWC ``x`` with an HWIO ``kernel``, reshaped to its shape (NHWC whatever
    ``keras.config.image_data_format()`` says: the op's default layout is the global one)."""
    y = ops.conv(x, kernel, strides=strides, padding=padding, data_format="channels_last")
    sizes = [
        (n + s - 1) // s if padding == "same" else (n - k) // s + 1
        for n, k, s in zip(_sizes(x), kernel.shape[:2], strides)
    ]
    return ops.reshape(y, (ops.shape(x)[0], *sizes, kernel.shape[-1]))


def _sizes(images) -> list:
    """The height and width of NHWC ``images``: ints where static, else tensors."""
    return [images.shape[axis] if images.shape[axis] is not None else ops.shape(images)[axis] for axis in (1, 2)]


def activation(x, gelu: str):
    """The MLP's GELU of kind ``gelu`` (:data:`GELU_VARIANTS`): ``"tanh"`` or ``"exact"``, or OpenAI CLIP's
    QuickGELU ``x * sigmoid(1.702 x)`` (``"quick"``)."""
    if gelu == "quick":
        return x * ops.sigmoid(ops.cast(1.702, x.dtype) * x)
    return keras.activations.gelu(x, approximate=gelu == "tanh")


def rows(x):
    """``x`` ``(..., D)`` as rows ``(-1, D)``: a ``Dense`` on rows is one fused oneDNN matmul on TensorFlow."""
    return ops.reshape(x, (-1, x.shape[-1]))


def unrows(y, like):
    """Rows ``y`` ``(-1, E)`` back to ``like``'s leading dimensions: ``(..., E)``."""
    return ops.reshape(y, (*ops.shape(like)[:-1], y.shape[-1]))


def _plain(dense: layers.Layer) -> bool:
    """A float ``Dense`` with a bias: not quantised, no LoRA adapter."""
    return dense.quantization_mode is None and not dense.lora_enabled and dense.use_bias


def dense_rows(dense: layers.Layer, x):
    """``dense`` (activation-free) on rows ``x`` ``(R, D)``: one ``addmm`` on torch (as timm), else the ``Dense``."""
    if keras.backend.backend() != "torch" or not _plain(dense):
        return dense(x)
    import torch.nn.functional as F

    kernel, bias = (ops.cast(weight, x.dtype) for weight in (dense.kernel, dense.bias))
    return F.linear(x, kernel.T, bias)


def project(dense: layers.Layer, x, training=None):
    """``dense`` (bias, no activation) on the last axis of ``x`` ``(B, N, D)``: a batched matmul in bfloat16
    inference on TensorFlow (oneDNN's AMX kernel; docs/performance.md), else :func:`dense_rows` on rows."""
    bfloat16 = keras.backend.standardize_dtype(x.dtype) == "bfloat16"
    if training or not (_plain(dense) and bfloat16) or keras.backend.backend() != "tensorflow":
        return unrows(dense_rows(dense, rows(x)), x)
    kernel = ops.expand_dims(ops.cast(dense.kernel, x.dtype), 0)  # (1, D, E): a batched matmul, not tensordot
    return ops.matmul(x, kernel) + ops.cast(dense.bias, x.dtype)


def draw_keep_mask(layer: layers.Layer, shape, dtype):
    """The keep mask (bool) that ``layer`` (a ``Dropout`` or :class:`DropPath`) draws for an input of ``shape``
    while training, or ``None`` when it drops nothing. Draws from the layer's own seed generator, as its call does."""
    if not layer.rate:
        return None
    return ops.not_equal(layer(ops.ones(shape, dtype), training=True), 0)


def drop(x, keep, rate: float):
    """``x`` with the entries where ``keep`` is false zeroed and the others scaled by ``1 / (1 - rate)``: dropout
    with a mask drawn beforehand (TensorFlow's dropout computes exactly this)."""
    return ops.where(keep, x * ops.cast(1.0 / (1.0 - rate), x.dtype), ops.zeros_like(x))


def _dropped(layer: layers.Layer, x, training, keep):
    """``layer(x)`` (a ``Dropout`` or :class:`DropPath`), or :func:`drop` with the pre-drawn ``keep`` mask."""
    return layer(x, training=training) if keep is None else drop(x, keep, layer.rate)


@keras.saving.register_keras_serializable(package="keras_vit")
class ChannelsLast(layers.Layer):
    """Images ``(B, C, H, W)`` -> ``(B, H, W, C)``: a channels-first model's first step, so that every layer and weight
    after it is the channels-last model's."""

    def __init__(self, **kwargs):
        kwargs.setdefault("autocast", False)  # a transpose: the images keep their dtype
        super().__init__(**kwargs)

    def call(self, images):
        return to_channels_last(images, "channels_first")

    def compute_output_shape(self, input_shape):
        return channels_last_shape(input_shape, "channels_first")


@keras.saving.register_keras_serializable(package="keras_vit")
class PatchEmbed(layers.Layer):
    """Cuts images (or feature maps) into PxP patches, each projected linearly (``x_p E``): ``(B, H/P * W/P, D)``.
    ``data_format``: the input's layout (the kernel is ``(P, P, C, D)`` either way); ``dynamic_img_pad``: pad the
    bottom and right with zeros to a multiple of P first (timm's), else such a size is an error."""

    def __init__(
        self,
        patch_size: int | tuple[int, int],
        hidden_size: int,
        data_format: str = "channels_last",
        dynamic_img_pad: bool = False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.patch_size = _pair(patch_size, "patch_size")
        self.hidden_size = check_positive_int(hidden_size, "hidden_size")
        self.data_format = check_data_format(data_format)
        self.dynamic_img_pad = check_bool(dynamic_img_pad, "dynamic_img_pad")

    def build(self, input_shape):
        self.kernel = add_conv_kernel(self, input_shape, self.patch_size, self.hidden_size, self.data_format)
        self.bias = self.add_weight(name="bias", shape=(self.hidden_size,), initializer="zeros")

    def call(self, images):
        images = to_channels_last(images, self.data_format)
        height, width = images.shape[1], images.shape[2]
        ph, pw = self.patch_size
        if self.dynamic_img_pad:  # zeros below and to the right, up to the next multiple of the patch size
            pads = [-size % patch for size, patch in zip(_sizes(images), self.patch_size)]
            if not all(isinstance(pad, int) and pad == 0 for pad in pads):
                images = ops.pad(images, [[0, 0], [0, pads[0]], [0, pads[1]], [0, 0]])
        elif height is not None and width is not None and (height % ph or width % pw):
            raise ValueError(
                f"Image size {height}x{width} is not divisible by the patch size {ph}x{pw}; resize the images or "
                "pad them (dynamic_img_pad=True)."
            )
        x = conv_nhwc(images, self.kernel, self.patch_size, "valid") + self.bias  # (B, H/P, W/P, D), also for B = 0
        return ops.reshape(x, (ops.shape(x)[0], ops.shape(x)[1] * ops.shape(x)[2], self.hidden_size))

    def compute_output_shape(self, input_shape):
        b, h, w, _ = channels_last_shape(input_shape, self.data_format)
        (ph, pw), pad = self.patch_size, self.dynamic_img_pad
        n = None if h is None or w is None else grid_length(h, ph, pad) * grid_length(w, pw, pad)
        return (b, n, self.hidden_size)

    def npz_key_map(self, prefix: str = "embedding") -> KeyMap:
        """The projection ``E`` as ``{prefix}/kernel`` and ``{prefix}/bias``: ``{key: (variable, transform)}``."""
        return dense_entries(prefix, self)

    def get_config(self):
        return {**super().get_config(), **arguments_config(self, PatchEmbed)}


@keras.saving.register_keras_serializable(package="keras_vit")
class ClassToken(layers.Layer):
    """Prepends the learnable class token ``x_class`` (zero-initialised, as published)."""

    def build(self, input_shape):
        self.cls = self.add_weight(name="cls", shape=(1, 1, input_shape[-1]), initializer="zeros")

    def call(self, tokens):
        cls = ops.broadcast_to(ops.cast(self.cls, tokens.dtype), (ops.shape(tokens)[0], 1, tokens.shape[-1]))
        return ops.concatenate([cls, tokens], axis=1)

    def compute_output_shape(self, input_shape):
        b, n, d = input_shape
        return (b, None if n is None else n + 1, d)

    def npz_key_map(self, prefix: str = "cls") -> KeyMap:
        """The class token as ``prefix``: ``{key: (variable, transform)}``."""
        return {prefix: (self.cls, identity)}


@keras.saving.register_keras_serializable(package="keras_vit")
class TokenPooling(layers.Layer):
    """Pools encoded tokens ``(B, N, D) -> (B, D)``: the class token (``"token"``), or the mean (``"avg"``) or
    maximum (``"max"``, per channel) of the patch tokens after ``num_prefix_tokens``."""

    MODES = ("token", "avg", "max")

    def __init__(self, mode: str = "token", num_prefix_tokens: int = 1, **kwargs):
        super().__init__(**kwargs)
        self.mode = check_choice(mode, self.MODES, "pooling")
        if mode == "token" and num_prefix_tokens < 1:
            raise ValueError("Token pooling needs a class token (num_prefix_tokens >= 1).")
        self.num_prefix_tokens = int(num_prefix_tokens)

    def call(self, tokens):
        if self.mode == "token":
            return tokens[:, 0]
        reduce = ops.mean if self.mode == "avg" else ops.max
        return reduce(tokens[:, self.num_prefix_tokens :], axis=1)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])

    def get_config(self):
        return {**super().get_config(), "mode": self.mode, "num_prefix_tokens": self.num_prefix_tokens}


def fused_attention_available() -> bool:
    """Whether ``keras.ops.dot_product_attention`` is a fused kernel here (cuDNN/flash on JAX and
    torch). On TensorFlow it is the same einsum-softmax-einsum as the explicit path, only in a
    token-major layout that costs extra transposes, so the head-major path below runs instead."""
    return keras.backend.backend() != "tensorflow"


# Off until a GPU run shows that it wins (benchmarks/gpu_device.sh times both); None: on where JAX runs on a GPU.
PAD_ODD_ATTENTION: bool | None = False


def pads_odd_attention() -> bool:
    """Whether a training step's fused attention pads an odd token count to an even one (one masked key), which JAX's
    cuDNN attention needs in training: :data:`PAD_ODD_ATTENTION`; ``None``: JAX on a GPU (docs/performance.md)."""
    if PAD_ODD_ATTENTION is not None:
        return PAD_ODD_ATTENTION
    if keras.backend.backend() != "jax":
        return False
    import jax

    return jax.default_backend() == "gpu"


def fused_attention(q, k, v, bias, scale: float, training=None):
    """``ops.dot_product_attention`` of ``(B, N, heads, d_h)`` q, k, v; in training with an odd static N and no bias,
    where :func:`pads_odd_attention`, on N + 1 tokens whose last key is masked, the extra query's row dropped."""
    length = q.shape[1]
    if not (training and bias is None and length is not None and length % 2 and pads_odd_attention()):
        return ops.dot_product_attention(q, k, v, bias=bias, scale=scale)
    padding = [[0, 0], [0, 1], [0, 0], [0, 0]]
    q, k, v = (ops.pad(tensor, padding) for tensor in (q, k, v))
    mask = ops.broadcast_to(ops.arange(length + 1) < length, (1, 1, length + 1, length + 1))
    return ops.dot_product_attention(q, k, v, mask=mask, scale=scale)[:, :length]


@keras.saving.register_keras_serializable(package="keras_vit")
class MultiHeadSelfAttention(layers.Layer):
    """MSA: ``softmax(q k^T / sqrt(d_h)) v`` over ``num_heads`` heads from one fused ``qkv`` projection, then ``out``.
    ``call``: ``return_attention_scores`` also returns ``(B, heads, N, N)``; ``attention_bias`` is added to the logits;
    ``dropout_keep`` (:func:`draw_keep_mask`) replaces the dropout's draw. ``qk_norm``: timm's per-head q/k norm."""

    def __init__(
        self,
        num_heads: int,
        attention_dropout: float = 0.0,
        qk_norm: bool = False,
        layer_norm_epsilon: float = LAYER_NORM_EPSILON,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = check_positive_int(num_heads, "num_heads")
        self.attention_dropout = check_fraction(attention_dropout, "attention_dropout")
        self.qk_norm = check_bool(qk_norm, "qk_norm")
        self.layer_norm_epsilon = epsilon = check_positive_number(layer_norm_epsilon, "layer_norm_epsilon")
        self.dropout = layers.Dropout(self.attention_dropout, name="dropout", dtype=self.dtype_policy)
        self.q_norm: layers.LayerNormalization | None = None
        self.k_norm: layers.LayerNormalization | None = None
        if self.qk_norm:
            self.q_norm, self.k_norm = (layer_norm(n, self.dtype_policy, epsilon) for n in ("q_norm", "k_norm"))

    def build(self, input_shape):
        width = input_shape[-1]
        if width % self.num_heads:
            raise ValueError(f"Hidden size {width} is not divisible by num_heads={self.num_heads}.")
        self.head_dim = width // self.num_heads
        init = "glorot_uniform"
        self.qkv = layers.Dense(3 * width, kernel_initializer=init, name="qkv", dtype=sublayer_policy(self, "qkv"))
        self.out = layers.Dense(width, kernel_initializer=init, name="out", dtype=sublayer_policy(self, "out"))
        self.qkv.build(input_shape)
        self.out.build(input_shape)
        for norm in (self.q_norm, self.k_norm):
            if norm is not None:
                norm.build((None, None, self.head_dim))

    def _normed(self, q, k):
        """``q`` and ``k`` (heads on any axis, ``d_h`` last) through ``q_norm`` / ``k_norm`` where qk-norm is on."""
        return (q, k) if self.q_norm is None else (self.q_norm(q), self.k_norm(k))

    def call(self, x, training=None, return_attention_scores: bool = False, attention_bias=None, dropout_keep=None):
        batch, length, width = ops.shape(x)[0], ops.shape(x)[1], x.shape[-1]
        qkv = ops.reshape(project(self.qkv, x, training), (batch, length, 3, self.num_heads, self.head_dim))
        scale = 1.0 / math.sqrt(self.head_dim)
        bias = None if attention_bias is None else ops.cast(attention_bias, x.dtype)
        needs_probs = return_attention_scores or dropout_keep is not None or (training and self.attention_dropout > 0)
        if fused_attention_available() and not needs_probs:
            q, k, v = ops.unstack(qkv, 3, axis=2)  # each (B, N, heads, d_h), the layout it expects
            q, k = self._normed(q, k)
            context = fused_attention(q, k, v, bias, scale, training)
        else:
            q, k, v = ops.unstack(ops.transpose(qkv, (2, 0, 3, 1, 4)), 3, axis=0)  # each (B, heads, N, d_h)
            q, k = self._normed(q, k)
            logits = ops.matmul(q * ops.cast(scale, q.dtype), ops.swapaxes(k, -1, -2))
            if bias is not None:
                logits = logits + bias
            probs = ops.cast(ops.softmax(ops.cast(logits, "float32"), axis=-1), x.dtype)
            dropped = _dropped(self.dropout, probs, training, dropout_keep)
            context = ops.transpose(ops.matmul(dropped, v), (0, 2, 1, 3))
        y = project(self.out, ops.reshape(context, (batch, length, width)), training)
        return (y, probs) if return_attention_scores else y

    def npz_key_map(self, prefix: str) -> KeyMap:
        """``{prefix}/query``, ``key``, ``value`` (into ``qkv``), ``out``, then the qk-norm's ``q_norm``, ``k_norm``."""
        qkv = [(name, self.qkv) for name in ("query", "key", "value")]
        return attention_entries(prefix, self.num_heads, qkv, self.out) | entries_of(prefix, self.q_norm, self.k_norm)

    def get_config(self):  # dtype_config: with its quantized layers' policies
        return {**super().get_config(), **dtype_config(self), **arguments_config(self, MultiHeadSelfAttention)}


@keras.saving.register_keras_serializable(package="keras_vit")
class MlpBlock(layers.Layer):
    """MLP: ``Dense(mlp_dim) -> GELU -> dropout -> Dense(width) -> dropout``; the Dense layers run on
    :func:`rows` of the input. ``mlp_type="swiglu"``: ``Dense(mlp_dim)`` split into halves ``a, b``, then
    ``SiLU(a) * b`` (``mlp_dim / 2`` wide) before the second Dense (Shazeer 2020; DINOv2 g/14, timm's SwiGLUPacked)."""

    def __init__(self, mlp_dim: int, dropout: float = 0.0, gelu: str = "tanh", mlp_type: str = "gelu", **kwargs):
        super().__init__(**kwargs)
        self.gelu = check_choice(gelu, GELU_VARIANTS, "gelu")
        self.mlp_type = check_choice(mlp_type, MLP_TYPES, "mlp_type")
        self.mlp_dim = check_positive_int(mlp_dim, "mlp_dim")
        if self.mlp_type == "swiglu" and self.mlp_dim % 2:
            raise ValueError(f"A SwiGLU MLP splits mlp_dim in two halves: it must be even, got {mlp_dim}.")
        self.dropout_rate = check_fraction(dropout, "dropout")
        self.dropout = layers.Dropout(self.dropout_rate, name="dropout", dtype=self.dtype_policy)

    def build(self, input_shape):
        init = dict(kernel_initializer="glorot_uniform", bias_initializer=keras.initializers.RandomNormal(stddev=1e-6))
        self.fc1 = layers.Dense(self.mlp_dim, name="Dense_0", dtype=sublayer_policy(self, "Dense_0"), **init)
        self.fc2 = layers.Dense(input_shape[-1], name="Dense_1", dtype=sublayer_policy(self, "Dense_1"), **init)
        self.fc1.build(input_shape)
        self.fc2.build((*input_shape[:-1], self.hidden_width))

    @property
    def hidden_width(self) -> int:
        return self.mlp_dim // 2 if self.mlp_type == "swiglu" else self.mlp_dim

    def call(self, x, training=None, dropout_keep=None):
        """``dropout_keep``: ``(hidden, output)`` bool masks drawn beforehand, used instead of the dropout's draws."""
        hidden_keep, out_keep = (None, None) if dropout_keep is None else dropout_keep
        h = dense_rows(self.fc1, rows(x))
        if self.mlp_type == "swiglu":
            a, b = ops.split(h, 2, axis=-1)
            h = ops.silu(a) * b
        else:
            h = activation(h, self.gelu)  # on rows: one fused kernel on TensorFlow
        h = _dropped(self.dropout, unrows(h, x), training, hidden_keep)
        return _dropped(self.dropout, project(self.fc2, h, training), training, out_keep)

    def npz_key_map(self, prefix: str) -> KeyMap:
        """``{prefix}/Dense_0/kernel``, ``bias``, then ``Dense_1``'s: ``{key: (variable, transform)}``."""
        return entries_of(prefix, self.fc1, self.fc2)

    def get_config(self):
        arguments = arguments_config(self, MlpBlock, dropout="dropout_rate")
        return {**super().get_config(), **dtype_config(self), **arguments}


@keras.saving.register_keras_serializable(package="keras_vit")
class DropPath(layers.Layer):
    """Stochastic depth: drops a whole residual branch per sample with probability ``rate`` while training."""

    def __init__(self, rate: float = 0.0, seed: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self.rate = check_fraction(rate, "rate")
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    def call(self, x, training=None):
        if not training or self.rate == 0.0:
            return x
        shape = (ops.shape(x)[0],) + (1,) * (len(x.shape) - 1)
        keep = keras.random.uniform(shape, seed=self.seed_generator, dtype=x.dtype) < 1.0 - self.rate
        return drop(x, keep, self.rate)

    def get_config(self):
        return {**super().get_config(), "rate": self.rate, "seed": self.seed}


@keras.saving.register_keras_serializable(package="keras_vit")
class LayerScale(layers.Layer):
    """Multiplies its input by learned per-channel factors ``gamma`` ``(D,)``, each ``init_value`` at first: timm's
    ``LayerScale`` (CaiT, DeiT III), on an encoder block's attention and MLP outputs."""

    def __init__(self, init_value: float = 1e-5, **kwargs):
        super().__init__(**kwargs)
        self.init_value = check_positive_number(init_value, "init_value")

    def build(self, input_shape):
        init = keras.initializers.Constant(self.init_value)
        self.gamma = self.add_weight(name="gamma", shape=(input_shape[-1],), initializer=init)

    def call(self, x):
        return x * ops.cast(self.gamma, x.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def npz_key_map(self, prefix: str) -> KeyMap:
        """``{prefix}/gamma``: ``{key: (variable, transform)}``."""
        return {f"{prefix}/gamma": (self.gamma, identity)}

    def get_config(self):
        return {**super().get_config(), "init_value": self.init_value}


@keras.saving.register_keras_serializable(package="keras_vit")
class TransformerBlock(layers.Layer):
    """One pre-LN encoder block (Eq. 2-3): ``z' = z + MSA(LN(z))``, ``z'' = z' + MLP(LN(z'))``; ``remat`` recomputes
    it in the backward pass with the same dropout masks; ``layer_scale_init`` adds ``LayerScale`` (``ls1``, ``ls2``).
    Sub-layers are named as in the Flax checkpoints. Raises ``ValueError`` naming a bad argument."""

    def __init__(
        self,
        num_heads: int,
        mlp_dim: int,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        drop_path: float = 0.0,
        gelu: str = "tanh",
        remat: bool = False,
        layer_scale_init: float | None = None,
        qk_norm: bool = False,
        layer_norm_epsilon: float = LAYER_NORM_EPSILON,
        mlp_type: str = "gelu",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.layer_norm_epsilon = check_positive_number(layer_norm_epsilon, "layer_norm_epsilon")
        self.remat = check_bool(remat, "remat")
        self.layer_scale_init = optional(check_positive_number)(layer_scale_init, "layer_scale_init")
        self.drop_path_rate = check_fraction(drop_path, "drop_path")
        policy, epsilon = self.dtype_policy, self.layer_norm_epsilon
        self.norm1 = layer_norm("LayerNorm_0", policy, epsilon)
        self.attn = MultiHeadSelfAttention(  # checks num_heads, attention_dropout and qk_norm
            num_heads,
            attention_dropout,
            qk_norm=qk_norm,
            layer_norm_epsilon=epsilon,
            name="MultiHeadDotProductAttention_1",
            dtype=policy,
        )
        self.norm2 = layer_norm("LayerNorm_2", policy, epsilon)
        self.mlp = MlpBlock(mlp_dim, dropout, gelu, mlp_type, name="MlpBlock_3", dtype=policy)  # checks those
        attn, mlp = self.attn, self.mlp
        self.num_heads, self.attention_dropout, self.qk_norm = attn.num_heads, attn.attention_dropout, attn.qk_norm
        self.mlp_dim, self.dropout_rate = mlp.mlp_dim, mlp.dropout_rate
        self.gelu, self.mlp_type = mlp.gelu, mlp.mlp_type
        self.dropout = layers.Dropout(self.dropout_rate, name="dropout", dtype=policy)
        self.drop_path = DropPath(self.drop_path_rate, name="drop_path", dtype=policy)
        self.ls1: LayerScale | None = None
        self.ls2: LayerScale | None = None
        if self.layer_scale_init is not None:
            self.ls1, self.ls2 = (LayerScale(self.layer_scale_init, name=n, dtype=policy) for n in ("ls1", "ls2"))

    def build(self, input_shape):
        for sublayer in (self.norm1, self.attn, self.norm2, self.mlp, self.ls1, self.ls2):
            if sublayer is not None:
                sublayer.build(input_shape)

    def call(self, x, training=None, return_attention_scores: bool = False, attention_bias=None):
        if not (self.remat and training) or return_attention_scores:
            return self._forward(x, training, attention_bias, return_attention_scores=return_attention_scores)
        keep = self._draw_keep_masks(x)

        def block(x, *bias):
            return self._forward(x, training, bias[0] if bias else None, keep=keep)

        return keras.remat(block)(x, *(() if attention_bias is None else (attention_bias,)))

    def _forward(self, x, training, attention_bias, keep=None, return_attention_scores: bool = False):
        """The block; ``keep``: the masks of :meth:`_draw_keep_masks`, else each dropout draws its own."""
        keep = keep or {}
        y = self.attn(
            self.norm1(x),
            training=training,
            return_attention_scores=return_attention_scores,
            attention_bias=attention_bias,
            dropout_keep=keep.get("attention"),
        )
        if return_attention_scores:
            y, probs = y
        y = _dropped(self.dropout, y, training, keep.get("attention_out"))
        x = x + _dropped(self.drop_path, y if self.ls1 is None else self.ls1(y), training, keep.get("attention_path"))
        y = self.mlp(self.norm2(x), training=training, dropout_keep=keep.get("mlp"))
        x = x + _dropped(self.drop_path, y if self.ls2 is None else self.ls2(y), training, keep.get("mlp_path"))
        return (x, probs) if return_attention_scores else x

    def _draw_keep_masks(self, x) -> dict:
        """Every keep mask one training step of the block draws, each from its layer's seed generator in the
        order :meth:`_forward` draws them (so a rematerialised step drops what a plain one does)."""
        batch, length, width = ops.shape(x)[0], ops.shape(x)[1], x.shape[-1]
        tokens, samples = (batch, length, width), (batch, 1, 1)
        keep = {
            "attention": draw_keep_mask(self.attn.dropout, (batch, self.num_heads, length, length), x.dtype),
            "attention_out": draw_keep_mask(self.dropout, tokens, x.dtype),
            "attention_path": draw_keep_mask(self.drop_path, samples, x.dtype),
        }
        hidden = draw_keep_mask(self.mlp.dropout, (batch, length, self.mlp.hidden_width), x.dtype)
        keep["mlp"] = (hidden, draw_keep_mask(self.mlp.dropout, tokens, x.dtype)) if hidden is not None else None
        keep["mlp_path"] = draw_keep_mask(self.drop_path, samples, x.dtype)
        return keep

    def npz_key_map(self, prefix: str) -> KeyMap:
        """The block's entries under ``prefix`` (``Transformer/encoderblock_{i}``), each sub-layer's under its name."""
        return entries_of(prefix, self.norm1, self.attn, self.norm2, self.mlp, self.ls1, self.ls2)

    def get_config(self):
        arguments = arguments_config(self, TransformerBlock, dropout="dropout_rate", drop_path="drop_path_rate")
        return {**super().get_config(), **dtype_config(self), **arguments}
