"""Where a ViT looks: attention rollout (Figure 6) and mean attention distance (Figure 7); docs/analyses.md."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import cast

import keras
import numpy as np
from PIL import Image

import keras_vit
from keras_vit.analysis.geometry import check_choice, positive_pair, token_geometry

__all__ = [
    "HEAD_FUSIONS",
    "AttentionAnalysis",
    "analyse_attention",
    "attention_rollout",
    "iter_attentions",
    "mean_attention_distance",
    "overlay",
    "patch_distances",
    "rollout_map",
    "upsample",
]

HEAD_FUSIONS = ("mean", "max", "min")


def _as_blocks(attentions) -> list[np.ndarray]:
    """Validate per-block attentions: a non-empty sequence (or stacked array) of ``(B, heads, N, N)``."""
    blocks = [np.asarray(a, dtype=np.float64) for a in attentions]
    if not blocks:
        raise ValueError("Need the attention probabilities of at least one block.")
    for i, a in enumerate(blocks):
        if a.ndim != 4 or a.shape[-1] != a.shape[-2]:
            raise ValueError(f"Block {i}: attention must have shape (batch, heads, N, N), got {a.shape}.")
        if a.shape[0] != blocks[0].shape[0] or a.shape[-1] != blocks[0].shape[-1]:
            raise ValueError(f"Block {i} has shape {a.shape}, block 0 has {blocks[0].shape}.")
    return blocks


def _check_tokens(num_tokens: int, grid: tuple[int, int], num_prefix_tokens: int) -> None:
    expected = num_prefix_tokens + grid[0] * grid[1]
    if num_tokens != expected:
        raise ValueError(
            f"Attention over {num_tokens} tokens does not match {num_prefix_tokens} prefix tokens "
            f"+ a {grid[0]}x{grid[1]} patch grid ({expected})."
        )


def attention_rollout(
    attentions: Sequence[np.ndarray], *, head_fusion: str = "mean", residual: bool = True
) -> np.ndarray:
    """Attention rollout (Abnar & Zuidema, 2020): ``R = A'_L ... A'_1`` ``(B, N, N)``, with each block's heads fused
    (``"mean"``, ``"max"``, ``"min"``) and ``A' = A + I`` renormalised by rows (the residual).
    """
    check_choice(head_fusion, HEAD_FUSIONS, "head_fusion")
    joint = None
    for a in _as_blocks(attentions):
        a = getattr(np, head_fusion)(a, axis=1)
        if residual:
            a = a + np.eye(a.shape[-1])
            a = a / a.sum(axis=-1, keepdims=True)
        joint = a if joint is None else a @ joint
    return cast(np.ndarray, joint)  # _as_blocks gives at least one block


def rollout_map(rollout: np.ndarray, grid_size: int | tuple[int, int], num_prefix_tokens: int = 1) -> np.ndarray:
    """The rolled-out attention of the output that classifies, on the patch grid ``(B, gh, gw)``: the class token's
    row of ``rollout``, or without one (``classifier="gap"``) the mean of all rows."""
    rollout = np.asarray(rollout, dtype=np.float64)
    grid = positive_pair(grid_size, "grid_size")
    if rollout.ndim != 3 or rollout.shape[1] != rollout.shape[2]:
        raise ValueError(f"rollout must have shape (batch, N, N), got {rollout.shape}.")
    _check_tokens(rollout.shape[-1], grid, num_prefix_tokens)
    rows = rollout[:, 0] if num_prefix_tokens else rollout.mean(axis=1)
    return rows[:, num_prefix_tokens:].reshape(-1, *grid)


def upsample(grid_map: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Bilinear resize of a 2-D map to ``size`` = (height, width), float32."""
    image = Image.fromarray(np.asarray(grid_map, dtype=np.float32))
    return np.asarray(image.resize((size[1], size[0]), Image.Resampling.BILINEAR), dtype=np.float32)


def overlay(image: np.ndarray, grid_map: np.ndarray) -> np.ndarray:
    """``image`` (H, W, C) weighted by ``grid_map`` resized to H x W and scaled to a maximum of 1,
    the paper's Figure 6 rendering. Pixel values keep their range (pass images in [0, 1] or [0, 255])."""
    image = np.asarray(image, dtype=np.float32)
    if image.ndim != 3:
        raise ValueError(f"image must have shape (height, width, channels), got {image.shape}.")
    grid_map = np.asarray(grid_map, dtype=np.float32)
    if grid_map.ndim != 2:
        raise ValueError(f"grid_map must be 2-D (grid rows, grid cols), got {grid_map.shape}.")
    mask = np.clip(upsample(grid_map, image.shape[:2]), 0.0, None)
    peak = mask.max()
    return image * (mask / peak if peak > 0 else mask)[..., None]


def patch_distances(grid_size: int | tuple[int, int], patch_size: int | tuple[int, int]) -> np.ndarray:
    """Euclidean distances in pixels between the centres of all patches, row-major: ``(n, n)``."""
    (gh, gw), (ph, pw) = positive_pair(grid_size, "grid_size"), positive_pair(patch_size, "patch_size")
    rows, cols = np.meshgrid(np.arange(gh) * ph, np.arange(gw) * pw, indexing="ij")
    centres = np.stack([rows.ravel(), cols.ravel()], axis=-1).astype(np.float64)
    return np.linalg.norm(centres[:, None] - centres[None], axis=-1)


def mean_attention_distance(
    attentions: Sequence[np.ndarray],
    grid_size: int | tuple[int, int],
    patch_size: int | tuple[int, int],
    num_prefix_tokens: int = 1,
) -> np.ndarray:
    """Mean attention distance in pixels, ``(blocks, heads)`` (Figure 7, right): ``sum_k a_qk d_qk`` over patch keys,
    prefix tokens dropped and the weights renormalised, averaged over queries and images.
    """
    blocks = _as_blocks(attentions)
    grid = positive_pair(grid_size, "grid_size")
    _check_tokens(blocks[0].shape[-1], grid, num_prefix_tokens)
    distances = patch_distances(grid, patch_size)
    result = []
    for a in blocks:
        patches = a[:, :, num_prefix_tokens:, num_prefix_tokens:]
        mass = patches.sum(axis=-1)
        weighted = (patches * distances).sum(axis=-1)
        per_query = np.divide(weighted, mass, out=np.full_like(mass, np.nan), where=mass > 0)
        result.append(np.nanmean(per_query, axis=(0, 2)))
    return np.stack(result)


def iter_attentions(model: keras.Model, images: np.ndarray, batch_size: int = 8) -> Iterator[list[np.ndarray]]:
    """Yield each batch's per-block attention probabilities (numpy float32) for ``model`` on ``images``."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}.")
    probe = keras_vit.attention_model(model)
    for start in range(0, len(images), batch_size):
        outputs = probe.predict_on_batch(np.asarray(images[start : start + batch_size], dtype=np.float32))
        outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
        yield [np.asarray(o, dtype=np.float32) for o in outputs]


@dataclasses.dataclass
class AttentionAnalysis:
    """``maps``: rolled-out attention on the patch grid per image, ``(B, gh, gw)``;
    ``distances``: mean attention distance in pixels, ``(blocks, heads)``, averaged over the images."""

    maps: np.ndarray
    distances: np.ndarray


def analyse_attention(
    model: keras.Model, images: np.ndarray, *, batch_size: int = 8, head_fusion: str = "mean"
) -> AttentionAnalysis:
    """Rollout maps and mean attention distances of a keras_vit model on preprocessed ``images``,
    batch by batch so that only one batch's attention matrices are held at a time."""
    if len(images) == 0:
        raise ValueError("Need at least one image.")
    geometry = token_geometry(model)
    maps, distances = [], []
    for blocks in iter_attentions(model, images, batch_size):
        rollout = attention_rollout(blocks, head_fusion=head_fusion)
        maps.append(rollout_map(rollout, geometry.grid_size, geometry.num_prefix_tokens))
        distance = mean_attention_distance(blocks, geometry.grid_size, geometry.patch_size, geometry.num_prefix_tokens)
        distances.append(distance * len(rollout))
    return AttentionAnalysis(np.concatenate(maps), np.sum(distances, axis=0) / len(images))
