"""What a ViT's embeddings learned: position-embedding similarity (Figure 7, centre) and the
principal components of the patch-embedding filters (Figure 7, left)."""

from __future__ import annotations

import keras
import numpy as np
from sklearn.decomposition import PCA

from keras_vit.analysis.geometry import get_layer, positive_pair
from keras_vit.layers import PatchEmbed
from keras_vit.position import AddPositionEmbs

__all__ = [
    "filter_components",
    "model_filter_components",
    "model_position_similarity",
    "position_similarity",
    "to_rgb_tiles",
]


def position_similarity(
    pos_embedding: np.ndarray, grid_size: int | tuple[int, int], num_prefix_tokens: int = 0
) -> np.ndarray:
    """Cosine similarity of every patch's position embedding with every other, ``(gh, gw, gh, gw)``; ``pos_embedding``
    ``(N, D)`` or ``(1, N, D)``, its prefix tokens left out.
    """
    gh, gw = positive_pair(grid_size, "grid_size")
    emb = np.asarray(pos_embedding, dtype=np.float64)
    emb = emb.reshape(emb.shape[-2:]) if emb.ndim == 3 and emb.shape[0] == 1 else emb
    if emb.ndim != 2 or emb.shape[0] != num_prefix_tokens + gh * gw:
        raise ValueError(
            f"pos_embedding of shape {np.shape(pos_embedding)} does not hold {num_prefix_tokens} prefix "
            f"+ {gh}x{gw} patch embeddings."
        )
    patches = emb[num_prefix_tokens:]
    norms = np.linalg.norm(patches, axis=-1, keepdims=True)
    if np.any(norms == 0):
        raise ValueError("A position embedding is all zeros; its cosine similarity is undefined.")
    unit = patches / norms
    return (unit @ unit.T).reshape(gh, gw, gh, gw)


def model_position_similarity(model: keras.Model) -> np.ndarray:
    """:func:`position_similarity` of a keras_vit model's ``"posembed_input"`` layer (any absolute kind:
    learned 1-D or 2-D, sin-cos)."""
    if not any(isinstance(layer, AddPositionEmbs) for layer in model.layers):
        raise ValueError(
            f"Model {model.name!r} has no absolute position embeddings (an AddPositionEmbs layer "
            "'posembed_input'): nothing to compare (position_embedding='relative' or 'none'?)."
        )
    layer = get_layer(model, "posembed_input", AddPositionEmbs)
    embedding = keras.ops.convert_to_numpy(layer.pos_embedding)
    return position_similarity(embedding, layer.grid_size, layer.num_prefix_tokens)


def filter_components(kernel: np.ndarray, num_components: int = 28) -> tuple[np.ndarray, np.ndarray]:
    """Principal components of the patch-embedding filters ``kernel`` ``(P, P, C, D)``: the top ``num_components``
    as ``(k, P, P, C)`` unit-norm filters (largest entry positive) and each one's explained variance fraction ``(k,)``.
    """
    kernel = np.asarray(kernel, dtype=np.float64)
    if kernel.ndim != 4:
        raise ValueError(f"kernel must have shape (P, P, channels, filters), got {kernel.shape}.")
    filters = kernel.reshape(-1, kernel.shape[-1]).T
    rank = min(filters.shape[0] - 1, filters.shape[1])
    if not 1 <= num_components <= rank:
        raise ValueError(
            f"num_components must be in [1, {rank}] for a kernel of shape {kernel.shape}, got {num_components}."
        )
    with np.errstate(divide="ignore", invalid="ignore"):  # no variance at all: 0 / 0
        pca = PCA(n_components=num_components, svd_solver="full").fit(filters)
    return pca.components_.reshape(num_components, *kernel.shape[:3]), np.nan_to_num(pca.explained_variance_ratio_)


def model_filter_components(model: keras.Model, num_components: int = 28) -> tuple[np.ndarray, np.ndarray]:
    """:func:`filter_components` of a keras_vit model's ``"embedding"`` layer."""
    layer = get_layer(model, "embedding", PatchEmbed)
    return filter_components(keras.ops.convert_to_numpy(layer.kernel), num_components)


def to_rgb_tiles(components: np.ndarray) -> np.ndarray:
    """Components ``(k, P, P, C)`` with C = 3 (RGB) or 1 (grey) as images in [0, 1], ``(k, P, P, 3)``:
    each min-max scaled on its own, so that its pattern, not its scale, shows."""
    components = np.asarray(components, dtype=np.float64)
    if components.ndim != 4 or components.shape[-1] not in (1, 3):
        raise ValueError(
            f"Can only draw components of shape (k, P, P, 3 or 1), got {components.shape}; a hybrid's "
            "embedding filters act on ResNet features, not pixels."
        )
    low = components.min(axis=(1, 2, 3), keepdims=True)
    span = components.max(axis=(1, 2, 3), keepdims=True) - low
    tiles = np.divide(components - low, span, out=np.full_like(components, 0.5), where=span > 0)
    return np.broadcast_to(tiles, (*tiles.shape[:3], 3)).copy()
