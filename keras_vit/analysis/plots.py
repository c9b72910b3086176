"""The paper's figures from the analyses' arrays, drawn with matplotlib's Agg backend: each function writes a
``figsize`` inches x ``dpi`` PNG and returns the Figure. Titles, colour bars and the shared style: docs/analyses.md."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from typing import Any, ParamSpec

import matplotlib

matplotlib.use("Agg")
import matplotlib.colors
import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np
from matplotlib.cm import ScalarMappable
from matplotlib.figure import Figure

from keras_vit.files import atomic_open

__all__ = [
    "FONT_SIZE",
    "mosaic",
    "plot_attention_distance",
    "plot_attention_maps",
    "plot_few_shot",
    "plot_filter_components",
    "plot_position_similarity",
]

FONT_SIZE = 9  # points: ticks, legends and axis labels; titles are larger (_STYLE)
# The rcParams every figure is drawn under: legible at the default 100 dpi, nothing clipped.
_STYLE: dict[Any, Any] = {
    "font.size": FONT_SIZE,
    "axes.titlesize": "large",
    "figure.titlesize": "x-large",
    "figure.constrained_layout.use": True,
}

_P = ParamSpec("_P")


def _styled(draw: Callable[_P, Figure]) -> Callable[_P, Figure]:
    """``draw`` under ``_STYLE``, saving included (tick labels are made when the figure is drawn)."""

    @functools.wraps(draw)
    def styled(*args: _P.args, **kwargs: _P.kwargs) -> Figure:
        with plt.rc_context(_STYLE):
            return draw(*args, **kwargs)

    return styled


def _title(fig: Figure, shows: str, model: str | None, inputs: str | None = None) -> None:
    """The figure's title: what it shows, then (a second line) of which model and inputs."""
    about = " on ".join(part for part in (model, inputs) if part)
    fig.suptitle(f"{shows}\n{about}" if about else shows, wrap=True)  # wrapped to the figure's width


def _save(fig: Figure, path: str, dpi: int) -> Figure:
    """Write ``fig`` to ``path`` atomically (:func:`~keras_vit.files.atomic_open`), close it and return it."""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with atomic_open(path, owned=True) as file:
            fig.savefig(file, dpi=dpi, format="png")
    finally:
        plt.close(fig)
    return fig


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


@_styled
def plot_attention_maps(
    images: np.ndarray,
    overlays: np.ndarray,
    path: str,
    *,
    names: Sequence[str] | None = None,
    model: str | None = None,
    figsize: tuple[float, float] | None = None,
    dpi: int = 100,
) -> Figure:
    """Figure 6: each input image (in [0, 1]) above its attention-weighted version (:func:`overlay`), titled
    ``names[i]`` (default ``image i``); a ``ValueError`` when the counts of images, overlays and names differ."""
    n = len(images)
    names = list(names) if names is not None else [f"image {i + 1}" for i in range(n)]
    if len(overlays) != n or len(names) != n or n == 0:
        raise ValueError(
            f"Need as many overlays as images (at least one) and a name for each, got {n} images, {len(overlays)} "
            f"overlays and {len(names)} names."
        )
    fig, axes = plt.subplots(2, n, figsize=figsize or (max(2.5 * n, 4), 5), squeeze=False)
    for i in range(n):
        for row, picture in enumerate((images[i], overlays[i])):
            axes[row, i].imshow(np.clip(picture, 0, 1))
            axes[row, i].set(xticks=[], yticks=[])
            axes[row, i].spines[:].set_visible(False)
        axes[0, i].set_title(names[i])
    axes[0, 0].set_ylabel("Input")
    axes[1, 0].set_ylabel("Attention-weighted")
    rollout = ScalarMappable(matplotlib.colors.Normalize(0, 1), cmap="gray")
    fig.colorbar(
        rollout, ax=axes[1, :], orientation="horizontal", shrink=0.8, label="Attention rollout (peak 1) x image"
    )
    _title(fig, "Attention rollout", model)
    return _save(fig, path, dpi)


@_styled
def plot_attention_distance(
    distances: np.ndarray,
    path: str,
    *,
    image_size: float | None = None,
    names: Sequence[str] | None = None,
    model: str | None = None,
    figsize: tuple[float, float] = (5, 4),
    dpi: int = 100,
) -> Figure:
    """Figure 7 (right): mean attention distance (pixels) of each head against the block index, the heads coloured
    by index, averaged over the images ``names``; a ``ValueError`` when ``distances`` is not ``(blocks, heads)``."""
    distances = np.asarray(distances)
    if distances.ndim != 2:
        raise ValueError(f"distances must be (blocks, heads), got {distances.shape}.")
    blocks, heads = distances.shape
    fig, ax = plt.subplots(figsize=figsize)
    colours = matplotlib.colors.BoundaryNorm(np.arange(0.5, heads + 1), plt.get_cmap("viridis").N)
    depth, head = np.meshgrid(np.arange(1, blocks + 1), np.arange(1, heads + 1), indexing="ij")
    dots = ax.scatter(depth.ravel(), distances.ravel(), c=head.ravel(), cmap="viridis", norm=colours, s=14, alpha=0.8)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("Network depth (layer)")
    ax.set_ylabel("Mean attention distance (pixels)")
    ax.set_ylim(0, image_size if image_size else max(1.0, float(np.nanmax(distances)) * 1.1))
    fig.colorbar(dots, ax=ax, label="Head", ticks=matplotlib.ticker.MaxNLocator(integer=True))
    inputs = (", ".join(names) if len(names) <= 3 else f"{len(names)} images") if names else None  # up to 3 names
    _title(fig, "Mean attention distance", model, inputs)
    return _save(fig, path, dpi)


@_styled
def plot_position_similarity(
    similarity: np.ndarray,
    path: str,
    *,
    model: str | None = None,
    figsize: tuple[float, float] = (6, 5),
    dpi: int = 100,
) -> Figure:
    """Figure 7 (centre): a grid of grids, tile (i, j) the cosine similarity of patch (i, j)'s position embedding
    with every patch's; a ``ValueError`` when ``similarity`` is not ``(gh, gw, gh, gw)``."""
    similarity = np.asarray(similarity)
    if similarity.ndim != 4:
        raise ValueError(f"similarity must be (gh, gw, gh, gw), got {similarity.shape}.")
    gh, gw = similarity.shape[:2]
    canvas = mosaic(similarity.reshape(gh * gw, *similarity.shape[2:]), columns=gw)
    fig, ax = plt.subplots(figsize=figsize)
    shown = ax.imshow(canvas, cmap="viridis", vmin=-1, vmax=1, interpolation="nearest")
    for axis, count, tile in ((ax.xaxis, gw, similarity.shape[3]), (ax.yaxis, gh, similarity.shape[2])):
        every = -(-count // 16)  # at most 16 labels a side
        axis.set_ticks(np.arange(0, count, every) * (tile + 1) + tile / 2 - 0.5, np.arange(1, count + 1, every))
    ax.set_xlabel("Input patch column")
    ax.set_ylabel("Input patch row")
    ax.tick_params(length=0)
    fig.colorbar(shown, ax=ax, label="Cosine similarity")
    _title(fig, "Position-embedding similarity", model)
    return _save(fig, path, dpi)


@_styled
def plot_filter_components(
    tiles: np.ndarray,
    path: str,
    *,
    columns: int = 7,
    explained: np.ndarray | None = None,
    model: str | None = None,
    figsize: tuple[float, float] = (6, 4),
    dpi: int = 100,
) -> Figure:
    """Figure 7 (left): the principal components of the embedding filters as RGB tiles in [0, 1], the share of the
    variance they explain (``explained``) in the title; a ``ValueError`` when ``tiles`` is not ``(k, P, P, 3)``."""
    tiles = np.asarray(tiles)
    if tiles.ndim != 4 or tiles.shape[-1] != 3:
        raise ValueError(f"tiles must be RGB (k, P, P, 3), got {tiles.shape}.")
    fig, ax = plt.subplots(figsize=figsize)
    ax.imshow(np.nan_to_num(mosaic(tiles, columns=min(columns, len(tiles))), nan=1.0), interpolation="nearest")
    ax.axis("off")
    if explained is not None:
        ax.set_title(f"{100 * float(np.sum(explained)):.1f}% of the variance")
    _title(fig, f"RGB embedding filters: the first {len(tiles)} principal components", model)
    return _save(fig, path, dpi)


@_styled
def plot_few_shot(
    results: dict[int, np.ndarray],
    path: str,
    *,
    chance: float | None = None,
    dataset: str | None = None,
    model: str | None = None,
    figsize: tuple[float, float] = (5, 4),
    dpi: int = 100,
) -> Figure:
    """n-shot linear-probe accuracy on ``dataset`` (mean and standard deviation over the seeds of ``results``)
    against n, and the ``chance`` level; a ``ValueError`` when ``results`` is empty."""
    if not results:
        raise ValueError("No few-shot results to plot.")
    shots = sorted(results)
    means = [100 * np.mean(results[n]) for n in shots]
    spread = [100 * np.std(results[n]) for n in shots]
    fig, ax = plt.subplots(figsize=figsize)
    ax.errorbar(shots, means, yerr=spread, marker="o", capsize=3, label="linear probe (mean, std)")
    if chance is not None:
        ax.axhline(100 * chance, color="grey", linestyle="--", label="chance")
    ax.set_xscale("log")
    ax.set_xticks(shots, [str(n) for n in shots])
    ax.set_xlabel("Examples per class")
    ax.set_ylabel("Accuracy (%)")
    ax.set_ylim(0, 100)
    ax.legend()
    seeds = f"{max(len(np.atleast_1d(results[n])) for n in shots)} seeds"
    _title(fig, "Few-shot linear-probe accuracy", model, f"{dataset}, {seeds}" if dataset else seeds)
    return _save(fig, path, dpi)
