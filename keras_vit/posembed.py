"""Position-embedding resizing: fine-tune or run a model at another image size.

A ViT's position embeddings are ``(1, prefix + gh * gw, D)``: ``prefix`` tokens (the class token's)
followed by one embedding per patch of a ``gh x gw`` grid. For another image size the grid part is
resized by 2-D interpolation and the prefix part kept as it is. Methods, by name:

- ``"zoom_linear"`` (default): ``scipy.ndimage.zoom(order=1)`` on the grid, corner aligned: what the
  original code (``vit_jax/checkpoint.py``) does when it fine-tunes at a higher resolution.
- ``"bilinear"``: bilinear with half-pixel centres and no antialiasing: what timm's ``.npz`` loader does.
- ``"bicubic"``: bicubic with antialiasing: timm's default elsewhere (``resample_abs_pos_embed``).
"""

from __future__ import annotations

import math

import keras
import numpy as np
import scipy.ndimage
from keras import ops

from keras_vit.layers import AddPositionEmbs, PatchEmbed, _pair

METHODS = ("zoom_linear", "bilinear", "bicubic")


def check_method(method: str) -> str:
    """``method`` if it is one of :data:`METHODS`; a ``ValueError`` naming the choices otherwise."""
    if method not in METHODS:
        raise ValueError(f"Unknown position-embedding resize method {method!r}; expected one of {METHODS}.")
    return method


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
    resized = ops.image.resize(
        grid[None], (nh, nw), interpolation=method, antialias=method == "bicubic", data_format="channels_last"
    )
    return np.asarray(ops.convert_to_numpy(resized)[0], dtype="float32")


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
    """Resize ``(1, prefix + gh * gw, D)`` position embeddings to a ``new_grid`` patch grid.

    The first ``num_prefix_tokens`` embeddings (the class token's) are kept unchanged; ``old_grid``
    defaults to the square grid the remaining embeddings form.
    """
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


def _grid_layers(model: keras.Model) -> list:
    """The layers that know the patch grid (``grid_size`` in their config): position embeddings of
    every kind, relative-position blocks."""
    return [layer for layer in model.layers if "grid_size" in layer.get_config()]


def _resized_weights(layer, grid: tuple[int, int], method: str) -> list[np.ndarray]:
    """``layer``'s weights for a ``grid`` patch grid: its own ``resized_weights`` where it has one."""
    if hasattr(layer, "resized_weights"):
        return layer.resized_weights(grid, method)
    if isinstance(layer, AddPositionEmbs):
        posemb = ops.convert_to_numpy(layer.pos_embedding)
        return [resample_position_embeddings(posemb, grid, num_prefix_tokens=layer.num_prefix_tokens,
                                             old_grid=layer.grid_size, method=method)]
    raise ValueError(f"Layer {layer.name!r} has a grid_size but no resized_weights(grid_size, method) method.")


def resize_position_embeddings(
    model: keras.Model, image_size: int | tuple[int, int], method: str = "zoom_linear"
) -> keras.Model:
    """A copy of ``model`` for ``image_size`` inputs: same layers and weights, resized position embeddings.

    ``model`` is a functional keras-vit model (plain or hybrid). Every layer with a ``grid_size`` in its
    config gets the new patch grid and its weights resized: 1-D position embeddings here, other layers
    through their own ``resized_weights(grid_size, method)``. ``image_size`` must be a multiple of the
    model's stride (the patch size of a plain ViT).
    """
    check_method(method)
    inputs = getattr(model, "inputs", None) or []
    if not isinstance(model, keras.Model) or len(inputs) != 1 or len(inputs[0].shape) != 4:
        raise ValueError("resize_position_embeddings needs a functional keras.Model with one (batch, h, w, c) input.")
    height, width, channels = inputs[0].shape[1:]
    new_h, new_w = _pair(image_size, "image_size")
    grids = {}
    for layer in _grid_layers(model):
        (gh, gw), (sh, sw) = layer.grid_size, (height // layer.grid_size[0], width // layer.grid_size[1])
        if new_h % sh or new_w % sw:
            raise ValueError(
                f"image_size {new_h}x{new_w} is not a multiple of the model's stride {sh}x{sw} "
                f"({height}x{width} images give a {gh}x{gw} grid)."
            )
        grids[layer.name] = (new_h // sh, new_w // sw)
    if not grids and not any(isinstance(layer, PatchEmbed) for layer in model.layers):  # "none" has no grid layer
        raise ValueError(f"Model {model.name!r} has no layer with a patch grid (no position embeddings) to resize.")

    def clone(layer):
        config = layer.get_config()
        if layer.name in grids:
            config["grid_size"] = list(grids[layer.name])
        return layer.__class__.from_config(config)

    new_input = keras.Input((new_h, new_w, channels), name=inputs[0].name, dtype=inputs[0].dtype)
    resized = keras.models.clone_model(model, input_tensors=new_input, clone_function=clone)
    for old, new in zip(model.layers, resized.layers, strict=True):
        weights = _resized_weights(old, grids[old.name], method) if old.name in grids else old.get_weights()
        new.set_weights(weights)
    return resized
