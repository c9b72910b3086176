"""The paper's figures from the analyses' arrays, drawn with matplotlib's Agg backend: each function writes a
``figsize`` inches x ``dpi`` PNG (``figsize * dpi`` pixels) and returns its path."""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np

from keras_vit.files import atomic_open

__all__ = [
    "mosaic",
    "plot_attention_distance",
    "plot_attention_maps",
    "plot_few_shot",
    "plot_filter_components",
    "plot_position_similarity",
]


def _save(fig, path: str, dpi: int) -> str:
    """Write ``fig`` to ``path`` atomically (:func:`~keras_vit.files.atomic_open`): a failure leaves no
    file behind, and ``path``, if it existed, as it was."""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with atomic_open(path) as file:
            fig.savefig(file, dpi=dpi, format="png")
    finally:
        plt.close(fig)
    return path


def mosaic(tiles: np.ndarray, columns: int, pad: int = 1, fill: float = np.nan) -> np.ndarray:
    """Lay out ``tiles`` ``(k, h, w[, c])`` in rows of ``columns``, separated by ``pad`` cells of ``fill``."""
    tiles = np.asarray(tiles, dtype=np.float64)
    k, h, w = tiles.shape[:3]
    rows = -(-k // columns)
    out = np.full((rows * (h + pad) - pad, columns * (w + pad) - pad, *tiles.shape[3:]), fill)
    for i, tile in enumerate(tiles):
        top, left = (i // columns) * (h + pad), (i % columns) * (w + pad)
        out[top : top + h, left : left + w] = tile
    return out


def plot_attention_maps(
    images: np.ndarray, overlays: np.ndarray, path: str, *, figsize: tuple[float, float] | None = None, dpi: int = 100
) -> str:
    """Figure 6: each input image above its attention-weighted version (images in [0, 1])."""
    if len(images) != len(overlays) or len(images) == 0:
        raise ValueError(f"Need as many overlays as images (at least one), got {len(images)} and {len(overlays)}.")
    n = len(images)
    fig, axes = plt.subplots(2, n, figsize=figsize or (2.5 * n, 5), squeeze=False)
    for i in range(n):
        for row, (picture, title) in enumerate(((images[i], "Input"), (overlays[i], "Attention"))):
            axes[row, i].imshow(np.clip(picture, 0, 1))
            axes[row, i].set_title(title, fontsize=9)
            axes[row, i].axis("off")
    return _save(fig, path, dpi)


def plot_attention_distance(
    distances: np.ndarray,
    path: str,
    *,
    image_size: float | None = None,
    figsize: tuple[float, float] = (5, 4),
    dpi: int = 100,
) -> str:
    """Figure 7 (right): mean attention distance (pixels), a dot per head, against the block index."""
    distances = np.asarray(distances)
    if distances.ndim != 2:
        raise ValueError(f"distances must be (blocks, heads), got {distances.shape}.")
    blocks, heads = distances.shape
    fig, ax = plt.subplots(figsize=figsize)
    for head in range(heads):
        ax.scatter(np.arange(1, blocks + 1), distances[:, head], s=12, alpha=0.8, label=f"head {head + 1}")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("Network depth (layer)")
    ax.set_ylabel("Mean attention distance (pixels)")
    ax.set_ylim(0, image_size if image_size else max(1.0, float(np.nanmax(distances)) * 1.1))
    if heads <= 16:
        ax.legend(fontsize=6, ncol=2, loc="lower right")
    fig.tight_layout()
    return _save(fig, path, dpi)


def plot_position_similarity(
    similarity: np.ndarray, path: str, *, figsize: tuple[float, float] = (6, 5), dpi: int = 100
) -> str:
    """Figure 7 (centre): a grid of grids, tile (i, j) the cosine similarity of patch (i, j)'s
    position embedding with every patch's."""
    similarity = np.asarray(similarity)
    if similarity.ndim != 4:
        raise ValueError(f"similarity must be (gh, gw, gh, gw), got {similarity.shape}.")
    gh, gw = similarity.shape[:2]
    canvas = mosaic(similarity.reshape(gh * gw, *similarity.shape[2:]), columns=gw)
    fig, ax = plt.subplots(figsize=figsize)
    shown = ax.imshow(canvas, cmap="viridis", vmin=-1, vmax=1, interpolation="nearest")
    ax.set_xticks((np.arange(gw) * (similarity.shape[3] + 1)) + similarity.shape[3] / 2 - 0.5, np.arange(1, gw + 1))
    ax.set_yticks((np.arange(gh) * (similarity.shape[2] + 1)) + similarity.shape[2] / 2 - 0.5, np.arange(1, gh + 1))
    ax.set_xlabel("Input patch column")
    ax.set_ylabel("Input patch row")
    ax.tick_params(labelsize=6, length=0)
    fig.colorbar(shown, ax=ax, label="Cosine similarity")
    fig.tight_layout()
    return _save(fig, path, dpi)


def plot_filter_components(
    tiles: np.ndarray,
    path: str,
    *,
    columns: int = 7,
    explained: np.ndarray | None = None,
    figsize: tuple[float, float] = (6, 4),
    dpi: int = 100,
) -> str:
    """Figure 7 (left): the principal components of the embedding filters as RGB tiles in [0, 1]."""
    tiles = np.asarray(tiles)
    if tiles.ndim != 4 or tiles.shape[-1] != 3:
        raise ValueError(f"tiles must be RGB (k, P, P, 3), got {tiles.shape}.")
    fig, ax = plt.subplots(figsize=figsize)
    ax.imshow(np.nan_to_num(mosaic(tiles, columns=min(columns, len(tiles))), nan=1.0), interpolation="nearest")
    ax.axis("off")
    title = f"RGB embedding filters (first {len(tiles)} principal components)"
    if explained is not None:
        title += f"\n{100 * float(np.sum(explained)):.1f}% of the variance"
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return _save(fig, path, dpi)


def plot_few_shot(
    results: dict[int, np.ndarray],
    path: str,
    *,
    figsize: tuple[float, float] = (5, 4),
    dpi: int = 100,
    chance: float | None = None,
) -> str:
    """n-shot linear-probe accuracy (mean and standard deviation over seeds) against n."""
    if not results:
        raise ValueError("No few-shot results to plot.")
    shots = sorted(results)
    means = [100 * np.mean(results[n]) for n in shots]
    spread = [100 * np.std(results[n]) for n in shots]
    fig, ax = plt.subplots(figsize=figsize)
    ax.errorbar(shots, means, yerr=spread, marker="o", capsize=3, label="linear probe")
    if chance is not None:
        ax.axhline(100 * chance, color="grey", linestyle="--", label="chance")
    ax.set_xscale("log")
    ax.set_xticks(shots, [str(n) for n in shots])
    ax.set_xlabel("Examples per class")
    ax.set_ylabel("Accuracy (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, path, dpi)
