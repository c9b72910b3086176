"""Small labelled data shared by training and the analyses: scikit-learn's digits and a stratified hold-out split."""

from __future__ import annotations

import numpy as np

__all__ = ["load_digits", "stratified_split"]


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 1,797 handwritten digits (shipped, nothing downloaded): uint8 grey images ``(1797, 8, 8)``
    (levels 0..16 scaled to 0..255) and int64 labels ``(1797,)``."""
    from sklearn.datasets import load_digits as sklearn_digits

    digits = sklearn_digits()
    images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)
    return images, digits.target.astype(np.int64)


def stratified_split(labels: np.ndarray, fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Sorted indices ``(kept, held_out)``: ``fraction`` of every class held out at random (seeded), at least one a
    side for a class of two or more, a class of one kept. A ``ValueError`` when ``fraction`` is not in (0, 1)."""
    if not 0 < fraction < 1:
        raise ValueError(f"The held-out fraction must be in (0, 1), got {fraction}.")
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    kept: list[np.intp] = []
    held: list[np.intp] = []
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        count = min(len(members) - 1, max(1, round(fraction * len(members)))) if len(members) > 1 else 0
        held.extend(members[:count])
        kept.extend(members[count:])
    return np.sort(np.array(kept, dtype=np.int64)), np.sort(np.array(held, dtype=np.int64))
