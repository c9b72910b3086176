"""Position embeddings of every kind (:data:`POSITION_EMBEDDINGS`) and their resizing for another image size
(:func:`resize_position_embeddings`, :data:`METHODS`); described in docs/models.md and docs/weights.md."""

from __future__ import annotations

import math

import keras
import numpy as np
import scipy.ndimage
from keras import layers, ops

from keras_vit.checks import check_choice
from keras_vit.config import POSITION_EMBEDDINGS, RESIZE_METHODS, grid_length
from keras_vit.features import model_stride
from keras_vit.inputs import model_data_format, model_image_shape
from keras_vit.layers import KeyMap, PatchEmbed, TransformerBlock, _pair, format_shape

__all__ = [
    "METHODS",
    "POSITION_EMBEDDINGS",
    "POSITION_VARIABLES",
    "AddPositionEmbs",
    "AddPositionEmbs2D",
    "DynamicPositionEmbs",
    "RelativePositionBias",
    "RelativeTransformerBlock",
    "SinCosPositionEmbs",
    "check_method",
    "dynamic_position_embedding_layer",
    "position_embedding_layer",
    "relative_position_index",
    "resample_position_embeddings",
    "resize_grid",
    "resize_grid_in_graph",
    "resize_position_embeddings",
    "sincos_2d_embedding",
    "square_grid",
    "transformer_block",
]

# Names of the position parameters of every kind (conventionally spared weight decay).
POSITION_VARIABLES = (
    "pos_embedding",
    "row_embedding",
    "col_embedding",
    "prefix_embedding",
    "relative_table",
    "prefix_bias",
)
METHODS = RESIZE_METHODS


# --- resizing grids of embeddings ------------------------------------------------------------------


def check_method(method: str) -> str:
    """``method`` if it is one of :data:`METHODS`; a ``ValueError`` naming the choices otherwise."""
    return check_choice(method, METHODS, "position-embedding resize method")


def resize_grid(grid: np.ndarray, new_size: tuple[int, int], method: str = "zoom_linear") -> np.ndarray:
    """Resize a ``(h, w, D)`` grid of embeddings to ``(*new_size, D)`` with one of :data:`METHODS`."""
    check_method(method)
    grid = np.asarray(grid, dtype="float32")
    (h, w), (nh, nw) = grid.shape[:2], new_size
    if (h, w) == (nh, nw):
        return grid
    if method == "zoom_linear":
        out = scipy.ndimage.zoom(grid, (nh / h, nw / w, 1), order=1)
        if out.shape[:2] != (nh, nw):  # scipy rounds the output size; guard against float round-off
            raise ValueError(f"scipy.ndimage.zoom returned a {out.shape[:2]} grid, expected {(nh, nw)}.")
        return out
    return np.asarray(ops.convert_to_numpy(resize_grid_in_graph(grid, (nh, nw), method)), dtype="float32")


def _linear_corners(x, length, axis: int):
    """``x`` linearly interpolated along ``axis`` to ``length`` (a tensor) samples, corners aligned, as
    ``scipy.ndimage.zoom(order=1)``: output ``i`` reads input ``i * (n - 1) / (length - 1)``."""
    n = x.shape[axis]
    scale = ops.cast(n - 1, "float32") / ops.cast(ops.maximum(length - 1, 1), "float32")
    position = ops.cast(ops.arange(length), "float32") * scale
    low = ops.floor(position)
    weight = ops.reshape(position - low, [-1 if i == axis else 1 for i in range(len(x.shape))])
    low = ops.cast(low, "int32")
    high = ops.minimum(low + 1, n - 1)
    return ops.take(x, low, axis=axis) * (1.0 - weight) + ops.take(x, high, axis=axis) * weight


def resize_grid_in_graph(grid, new_size, method: str = "zoom_linear"):
    """:func:`resize_grid` with ``keras.ops``, for a ``new_size`` known only when the graph runs."""
    check_method(method)
    if method == "zoom_linear":
        return _linear_corners(_linear_corners(grid, new_size[0], 0), new_size[1], 1)
    resized = ops.image.resize(
        grid[None], new_size, interpolation=method, antialias=method == "bicubic", data_format="channels_last"
    )
    return resized[0]


def square_grid(num_grid_tokens: int) -> tuple[int, int]:
    """The ``(g, g)`` grid of ``num_grid_tokens`` patches; a named error if it is not a square."""
    side = math.isqrt(num_grid_tokens)
    if side * side != num_grid_tokens:
        raise ValueError(
            f"Cannot infer the patch grid of {num_grid_tokens} position embeddings: not a square number. "
            "Pass old_grid=(h, w)."
        )
    return (side, side)


def resample_position_embeddings(
    posemb: np.ndarray,
    new_grid: int | tuple[int, int],
    *,
    num_prefix_tokens: int = 1,
    old_grid: int | tuple[int, int] | None = None,
    method: str = "zoom_linear",
) -> np.ndarray:
    """Resize ``(1, prefix + gh * gw, D)`` position embeddings to a ``new_grid`` patch grid; the first
    ``num_prefix_tokens`` are kept, and ``old_grid`` defaults to the square the others form."""
    posemb = np.asarray(posemb)
    if posemb.ndim != 3 or posemb.shape[0] != 1:
        raise ValueError(f"Position embeddings must have shape (1, tokens, width), got {posemb.shape}.")
    prefix, grid = posemb[:, :num_prefix_tokens], posemb[0, num_prefix_tokens:]
    old = square_grid(len(grid)) if old_grid is None else _pair(old_grid, "old_grid")
    if old[0] * old[1] != len(grid):
        raise ValueError(f"old_grid {old} does not hold the {len(grid)} grid embeddings of shape {posemb.shape}.")
    new = _pair(new_grid, "new_grid")
    resized = resize_grid(grid.reshape(*old, -1), new, method).reshape(1, new[0] * new[1], -1)
    return np.concatenate([prefix.astype(resized.dtype), resized], axis=1).astype(posemb.dtype)


# --- the kinds ------------------------------------------------------------------------------------


def _check_tokens(layer, n: int | None, expected: int, built: str) -> None:
    """A ``ValueError`` when ``n`` tokens (``None``: not known yet) are not the ``expected`` ones ``layer`` was built
    for; ``built`` says what was built (``"the position embeddings were"``)."""
    if n is not None and n != expected:
        gh, gw = layer.grid_size
        raise ValueError(
            f"Got {n} tokens but {built} built for {expected} "
            f"({layer.num_prefix_tokens} prefix + a {gh}x{gw} patch grid). Build the model with the "
            "image_size you feed it, or resize it with keras_vit.resize_position_embeddings."
        )


def _resize_axis(table: np.ndarray, length: int, method: str) -> np.ndarray:
    """Resize ``(n, D)`` along its first axis to ``(length, D)`` (a ``(n, 1)`` grid for :func:`resize_grid`)."""
    return resize_grid(table[:, None, :], (length, 1), method)[:, 0, :]


@keras.saving.register_keras_serializable(package="keras_vit")
class AddPositionEmbs(layers.Layer):
    """Adds learnable 1-D position embeddings ``E_pos`` (Eq. 1) for ``num_prefix_tokens`` and a ``grid_size`` grid."""

    def __init__(self, grid_size: int | tuple[int, int], num_prefix_tokens: int = 1, **kwargs):
        super().__init__(**kwargs)
        self.grid_size = _pair(grid_size, "grid_size")
        self.num_prefix_tokens = int(num_prefix_tokens)

    @property
    def num_tokens(self) -> int:
        return self.num_prefix_tokens + self.grid_size[0] * self.grid_size[1]

    def build(self, input_shape):
        self.pos_embedding = self.add_weight(
            name="pos_embedding",
            shape=(1, self.num_tokens, input_shape[-1]),
            initializer=keras.initializers.RandomNormal(stddev=0.02),
        )

    def call(self, tokens):
        _check_tokens(self, tokens.shape[1], self.num_tokens, "the position embeddings were")
        return tokens + ops.cast(self.pos_embedding, tokens.dtype)

    def resized_weights(self, grid_size, method: str = "zoom_linear") -> list[np.ndarray]:
        """The weights for a ``grid_size`` patch grid: the grid part interpolated, the prefix kept."""
        posemb = ops.convert_to_numpy(self.pos_embedding)
        return [
            resample_position_embeddings(
                posemb, grid_size, num_prefix_tokens=self.num_prefix_tokens, old_grid=self.grid_size, method=method
            )
        ]

    def npz_key_map(self, prefix: str = "Transformer/posembed_input", resize_method: str = "zoom_linear") -> KeyMap:
        """``{prefix}/pos_embedding``, a table of another square grid resized with ``resize_method``; ``{}`` for the
        kinds whose ``pos_embedding`` is no variable (2-D, sin-cos: not in the published layout)."""
        if not isinstance(self.pos_embedding, keras.Variable):
            return {}
        target = tuple(self.pos_embedding.shape)

        def transform(array: np.ndarray) -> np.ndarray:
            if array.shape == target or array.ndim != 3 or array.shape[-1] != target[-1]:
                return array  # equal, or a width mismatch the shape check reports
            grid = square_grid(array.shape[1] - self.num_prefix_tokens)
            return resample_position_embeddings(
                array, self.grid_size, num_prefix_tokens=self.num_prefix_tokens, old_grid=grid, method=resize_method
            )

        return {f"{prefix}/pos_embedding": (self.pos_embedding, transform)}

    def get_config(self):
        return {**super().get_config(), "grid_size": list(self.grid_size), "num_prefix_tokens": self.num_prefix_tokens}


@keras.saving.register_keras_serializable(package="keras_vit")
class DynamicPositionEmbs(AddPositionEmbs):
    """:class:`AddPositionEmbs` for images of any size: ``call(tokens, images)`` interpolates the grid part in the graph
    to ``images``' patch grid (NHWC sizes divided by ``stride``, rounded up with ``dynamic_img_pad``) with ``method``.
    """

    def __init__(
        self,
        grid_size,
        num_prefix_tokens: int = 1,
        stride: int = 16,
        method: str = "zoom_linear",
        dynamic_img_pad: bool = False,
        **kwargs,
    ):
        super().__init__(grid_size, num_prefix_tokens, **kwargs)
        self.stride = int(stride)
        self.method = check_method(method)
        self.dynamic_img_pad = bool(dynamic_img_pad)

    def build(self, tokens_shape, images_shape=None):
        super().build(tokens_shape)

    def call(self, tokens, images):
        height, width = (grid_length(ops.shape(images)[axis], self.stride, self.dynamic_img_pad) for axis in (1, 2))
        posemb = ops.convert_to_tensor(self.pos_embedding)
        if all(isinstance(n, int) for n in (height, width)) and (height, width) == self.grid_size:  # static, same
            return tokens + ops.cast(posemb, tokens.dtype)
        prefix, (gh, gw) = self.num_prefix_tokens, self.grid_size
        grid = ops.reshape(posemb[0, prefix:], (gh, gw, posemb.shape[-1]))
        resized = ops.reshape(resize_grid_in_graph(grid, (height, width), self.method), (1, -1, posemb.shape[-1]))
        return tokens + ops.cast(ops.concatenate([posemb[:, :prefix], resized], axis=1), tokens.dtype)

    def compute_output_shape(self, tokens_shape, images_shape=None):
        return tokens_shape

    def get_config(self):
        return {
            **super().get_config(),
            "stride": self.stride,
            "method": self.method,
            "dynamic_img_pad": self.dynamic_img_pad,
        }


@keras.saving.register_keras_serializable(package="keras_vit")
class AddPositionEmbs2D(AddPositionEmbs):
    """Learned 2-D position embeddings (Appendix D.4): ``E_pos[i, j] = concat(row_i, col_j)``, plus a learned
    ``prefix_embedding`` for the prefix tokens."""

    def build(self, input_shape):
        width = input_shape[-1]
        if width % 2:
            raise ValueError(f"learned_2d position embeddings need an even hidden size, got {width}.")
        init = keras.initializers.RandomNormal(stddev=0.02)
        gh, gw = self.grid_size
        self.row_embedding = self.add_weight(name="row_embedding", shape=(gh, width // 2), initializer=init)
        self.col_embedding = self.add_weight(name="col_embedding", shape=(gw, width // 2), initializer=init)
        self.prefix_embedding = None
        if self.num_prefix_tokens:
            self.prefix_embedding = self.add_weight(
                name="prefix_embedding", shape=(1, self.num_prefix_tokens, width), initializer=init
            )

    @property
    def pos_embedding(self):
        """The full ``(1, prefix + gh * gw, D)`` embedding the layer adds."""
        gh, gw = self.grid_size
        half = self.row_embedding.shape[-1]
        rows = ops.broadcast_to(self.row_embedding[:, None, :], (gh, gw, half))
        cols = ops.broadcast_to(self.col_embedding[None, :, :], (gh, gw, half))
        grid = ops.reshape(ops.concatenate([rows, cols], axis=-1), (1, gh * gw, 2 * half))
        if self.prefix_embedding is None:
            return grid
        return ops.concatenate([ops.convert_to_tensor(self.prefix_embedding), grid], axis=1)

    def resized_weights(self, grid_size, method: str = "zoom_linear") -> list[np.ndarray]:
        """The weights for a ``grid_size`` patch grid: rows and columns interpolated along their axis."""
        gh, gw = _pair(grid_size, "grid_size")
        rows = _resize_axis(ops.convert_to_numpy(self.row_embedding), gh, method)
        cols = _resize_axis(ops.convert_to_numpy(self.col_embedding), gw, method)
        prefix = [] if self.prefix_embedding is None else [ops.convert_to_numpy(self.prefix_embedding)]
        return [rows, cols, *prefix]


def sincos_2d_embedding(grid_size: int | tuple[int, int], width: int, temperature: float = 10000.0) -> np.ndarray:
    """Fixed 2-D sin-cos embeddings ``(gh * gw, width)``, ``[sin(y w), cos(y w), sin(x w), cos(x w)]`` with
    ``w_k = temperature ** (-k / (width / 4))``, ``y``/``x`` the patch's row/column, row-major."""
    gh, gw = _pair(grid_size, "grid_size")
    if width % 4:
        raise ValueError(f"sincos_2d position embeddings need a hidden size divisible by 4, got {width}.")
    quarter = width // 4
    omega = 1.0 / temperature ** (np.arange(quarter, dtype=np.float64) / quarter)
    y, x = np.meshgrid(np.arange(gh, dtype=np.float64), np.arange(gw, dtype=np.float64), indexing="ij")
    ang_y, ang_x = y.reshape(-1, 1) * omega, x.reshape(-1, 1) * omega
    return np.concatenate([np.sin(ang_y), np.cos(ang_y), np.sin(ang_x), np.cos(ang_x)], axis=1).astype("float32")


@keras.saving.register_keras_serializable(package="keras_vit")
class SinCosPositionEmbs(AddPositionEmbs):
    """Adds fixed (non-trainable, weightless) 2-D sin-cos position embeddings; prefix tokens get zeros."""

    def __init__(self, grid_size, num_prefix_tokens: int = 1, temperature: float = 10000.0, **kwargs):
        super().__init__(grid_size, num_prefix_tokens, **kwargs)
        self.temperature = float(temperature)

    def build(self, input_shape):
        grid = sincos_2d_embedding(self.grid_size, input_shape[-1], self.temperature)
        prefix = np.zeros((self.num_prefix_tokens, grid.shape[1]), dtype="float32")
        self._embedding = np.concatenate([prefix, grid])[None]

    @property
    def pos_embedding(self):
        """The full ``(1, prefix + gh * gw, D)`` embedding the layer adds."""
        return ops.convert_to_tensor(self._embedding)

    def resized_weights(self, grid_size, method: str = "zoom_linear") -> list[np.ndarray]:
        """No weights: the embeddings of another grid are recomputed."""
        return []

    def get_config(self):
        return {**super().get_config(), "temperature": self.temperature}


def relative_position_index(grid_size: int | tuple[int, int], num_prefix_tokens: int = 1) -> np.ndarray:
    """``(N, N)`` int32 indices into the flattened ``(2gh-1) x (2gw-1)`` relative table (``T`` entries), then the
    prefix biases: prefix query to patch ``T``, patch to prefix key ``T + 1``, prefix to prefix ``T + 2``."""
    gh, gw = _pair(grid_size, "grid_size")
    grid_y, grid_x = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
    y, x = grid_y.reshape(-1), grid_x.reshape(-1)
    patches = (y[:, None] - y[None, :] + gh - 1) * (2 * gw - 1) + (x[:, None] - x[None, :] + gw - 1)
    table = (2 * gh - 1) * (2 * gw - 1)
    p = int(num_prefix_tokens)
    index = np.full((p + gh * gw, p + gh * gw), table + 2, dtype=np.int32)
    index[:p, p:] = table
    index[p:, :p] = table + 1
    index[p:, p:] = patches
    return index


@keras.saving.register_keras_serializable(package="keras_vit")
class RelativePositionBias(layers.Layer):
    """A learned attention-logit bias per head for every relative offset between patches (``relative_table``), plus
    ``prefix_bias``; ``call(tokens)`` returns the ``(1, heads, N, N)`` bias."""

    def __init__(self, num_heads: int, grid_size: int | tuple[int, int], num_prefix_tokens: int = 1, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.grid_size = _pair(grid_size, "grid_size")
        self.num_prefix_tokens = int(num_prefix_tokens)
        self._index = relative_position_index(self.grid_size, self.num_prefix_tokens)

    def build(self, input_shape=None):
        gh, gw = self.grid_size
        init = keras.initializers.RandomNormal(stddev=0.02)
        self.relative_table = self.add_weight(
            name="relative_table", shape=(2 * gh - 1, 2 * gw - 1, self.num_heads), initializer=init
        )
        self.prefix_bias = None
        if self.num_prefix_tokens:
            self.prefix_bias = self.add_weight(name="prefix_bias", shape=(3, self.num_heads), initializer=init)

    def call(self, tokens):
        _check_tokens(self, tokens.shape[1], len(self._index), "the relative position bias was")
        entries = ops.reshape(self.relative_table, (-1, self.num_heads))
        if self.prefix_bias is not None:
            entries = ops.concatenate([entries, self.prefix_bias], axis=0)
        bias = ops.take(entries, ops.convert_to_tensor(self._index), axis=0)  # (N, N, heads)
        return ops.cast(ops.transpose(bias, (2, 0, 1))[None], self.compute_dtype)

    def compute_output_shape(self, input_shape):
        n = len(self._index)
        return (1, self.num_heads, n, n)

    def resized_weights(self, grid_size, method: str = "zoom_linear") -> list[np.ndarray]:
        """The weights for a ``grid_size`` patch grid: the offset table interpolated to ``(2gh'-1, 2gw'-1)``."""
        gh, gw = _pair(grid_size, "grid_size")
        table = resize_grid(ops.convert_to_numpy(self.relative_table), (2 * gh - 1, 2 * gw - 1), method)
        prefix = [] if self.prefix_bias is None else [ops.convert_to_numpy(self.prefix_bias)]
        return [table, *prefix]

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "grid_size": list(self.grid_size),
            "num_prefix_tokens": self.num_prefix_tokens,
        }


@keras.saving.register_keras_serializable(package="keras_vit")
class RelativeTransformerBlock(TransformerBlock):
    """A :class:`~keras_vit.layers.TransformerBlock` whose attention logits get its own
    :class:`RelativePositionBias` (sub-layer ``relative_position_bias``)."""

    def __init__(self, num_heads: int, mlp_dim: int, *, grid_size, num_prefix_tokens: int = 1, **kwargs):
        super().__init__(num_heads, mlp_dim, **kwargs)
        self.relative_bias = RelativePositionBias(
            num_heads, grid_size, num_prefix_tokens, name="relative_position_bias", dtype=self.dtype_policy
        )

    @property
    def grid_size(self) -> tuple[int, int]:
        return self.relative_bias.grid_size

    @property
    def num_prefix_tokens(self) -> int:
        return self.relative_bias.num_prefix_tokens

    def build(self, input_shape):
        super().build(input_shape)
        self.relative_bias.build(input_shape)

    # No attention_bias argument, unlike the parent's: the block brings its own.
    def call(self, x, training=None, return_attention_scores: bool = False):  # type: ignore[override]
        return super().call(
            x, training=training, return_attention_scores=return_attention_scores, attention_bias=self.relative_bias(x)
        )

    def resized_weights(self, grid_size, method: str = "zoom_linear") -> list[np.ndarray]:
        """The block's weights (in ``self.weights`` order) with the relative table resized to ``grid_size``."""
        resized = dict(
            zip((id(v) for v in self.relative_bias.weights), self.relative_bias.resized_weights(grid_size, method))
        )
        return [resized[id(v)] if id(v) in resized else ops.convert_to_numpy(v) for v in self.weights]

    def get_config(self):
        return {**super().get_config(), "grid_size": list(self.grid_size), "num_prefix_tokens": self.num_prefix_tokens}


def position_embedding_layer(
    position_embedding: str, grid_size, num_prefix_tokens: int, name: str = "posembed_input"
) -> AddPositionEmbs | None:
    """The layer adding absolute position embeddings of that kind (checked by ``ViTConfig``), or ``None``
    (``"relative"``, ``"none"``)."""
    cls = {"learned_1d": AddPositionEmbs, "learned_2d": AddPositionEmbs2D, "sincos_2d": SinCosPositionEmbs}.get(
        position_embedding
    )
    return None if cls is None else cls(grid_size, num_prefix_tokens=num_prefix_tokens, name=name)


def dynamic_position_embedding_layer(
    position_embedding: str,
    grid_size,
    num_prefix_tokens: int,
    stride: int,
    name: str = "posembed_input",
    method: str = "zoom_linear",
    dynamic_img_pad: bool = False,
) -> DynamicPositionEmbs | None:
    """The layer of :func:`position_embedding_layer` for inputs of any size, interpolating with ``method`` to the
    grid of the images (padded with ``dynamic_img_pad``); ``None`` for ``"none"``; ``NotImplementedError`` for the
    kinds that do not interpolate in the graph yet."""
    if position_embedding == "none":
        return None
    if position_embedding != "learned_1d":
        raise NotImplementedError(
            f"dynamic_image_size supports position_embedding 'learned_1d' and 'none', not {position_embedding!r}; "
            "build one model per size with keras_vit.resize_position_embeddings instead."
        )
    return DynamicPositionEmbs(grid_size, num_prefix_tokens, stride, method, dynamic_img_pad, name=name)


def transformer_block(
    position_embedding: str, grid_size, num_prefix_tokens: int, num_heads: int, mlp_dim: int, **kwargs
) -> TransformerBlock:
    """An encoder block: a :class:`RelativeTransformerBlock` for ``"relative"``, else a plain one."""
    if position_embedding == "relative":
        return RelativeTransformerBlock(
            num_heads, mlp_dim, grid_size=grid_size, num_prefix_tokens=num_prefix_tokens, **kwargs
        )
    return TransformerBlock(num_heads, mlp_dim, **kwargs)


# --- a whole model at another image size ----------------------------------------------------------


def resize_position_embeddings(
    model: keras.Model, image_size: int | tuple[int, int], method: str = "zoom_linear"
) -> keras.Model:
    """A copy of ``model`` (functional, plain or hybrid, either data format) for ``image_size`` inputs, each layer with
    a ``grid_size`` resizing its own weights; ``image_size`` must be a multiple of the model's stride unless the model
    pads its images (``dynamic_img_pad``)."""
    check_method(method)
    inputs = getattr(model, "inputs", None) or []
    if not isinstance(model, keras.Model) or len(inputs) != 1 or len(inputs[0].shape) != 4:
        raise ValueError("resize_position_embeddings needs a functional keras.Model with one (batch, h, w, c) input.")
    height, width, channels = model_image_shape(model)
    new_h, new_w = _pair(image_size, "image_size")
    pad = any(isinstance(layer, PatchEmbed) and layer.dynamic_img_pad for layer in model.layers)
    grids = {}
    grid_layers = [layer for layer in model.layers if "grid_size" in layer.get_config()]  # each resizes its own
    for layer in grid_layers:
        if not callable(getattr(layer, "resized_weights", None)):
            raise ValueError(f"Layer {layer.name!r} has a grid_size but no resized_weights(grid_size, method) method.")
    for layer in grid_layers:
        gh, gw = layer.grid_size
        sh, sw = (model_stride(model),) * 2 if pad else (height // gh, width // gw)
        if not pad and (new_h % sh or new_w % sw):
            raise ValueError(
                f"image_size {new_h}x{new_w} is not a multiple of the model's stride {sh}x{sw} "
                f"({height}x{width} images give a {gh}x{gw} grid)."
            )
        grids[layer.name] = (grid_length(new_h, sh, pad), grid_length(new_w, sw, pad))
    if not grids and not any(isinstance(layer, PatchEmbed) for layer in model.layers):  # "none" has no grid layer
        raise ValueError(f"Model {model.name!r} has no layer with a patch grid (no position embeddings) to resize.")

    def clone(layer):
        config = layer.get_config()
        if layer.name in grids:
            config["grid_size"] = list(grids[layer.name])
        return layer.__class__.from_config(config)

    shape = format_shape((None, new_h, new_w, channels), model_data_format(model))[1:]
    new_input = keras.Input(shape, name=inputs[0].name, dtype=inputs[0].dtype)
    resized = keras.models.clone_model(model, input_tensors=new_input, clone_function=clone)
    for old, new in zip(model.layers, resized.layers, strict=True):
        weights = old.resized_weights(grids[old.name], method) if old.name in grids else old.get_weights()
        new.set_weights(weights)
    return resized
