"""Few-shot linear evaluation (Section 4 of the paper): a closed-form regularised least-squares
probe from frozen features onto {-1, 1} targets, trained on n examples per class.

Features are standardised with the training statistics; the probe ``f(x) = z W + b`` (``z`` the
standardised features) minimises ``|Y - Z W - b|^2 + l2 |W|^2`` with one column of ``Y`` per class,
+1 for the example's class and -1 elsewhere; the bias is not regularised. A sequence of ``l2``
values is chosen from by the exact leave-one-out squared error of the training examples.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import keras
import numpy as np

from keras_vit.analysis.geometry import get_layer, token_geometry

SHOTS = (1, 5, 10, 25)
L2_GRID = tuple(2.0**k for k in range(-10, 11))
POOLINGS = (None, "token", "avg")


@dataclasses.dataclass
class LinearProbe:
    """A fitted probe: ``scores = ((x - mean) / scale) @ weights + bias``, class = argmax."""

    mean: np.ndarray
    scale: np.ndarray
    weights: np.ndarray
    bias: np.ndarray
    l2_reg: float

    def scores(self, features: np.ndarray) -> np.ndarray:
        return ((np.asarray(features, dtype=np.float64) - self.mean) / self.scale) @ self.weights + self.bias

    def predict(self, features: np.ndarray) -> np.ndarray:
        return self.scores(features).argmax(axis=1)


def _check_xy(features, labels) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(features, dtype=np.float64), np.asarray(labels)
    if x.ndim != 2 or y.shape != (len(x),):
        raise ValueError(f"Need features (n, dim) and labels (n,), got {x.shape} and {y.shape}.")
    if not np.issubdtype(y.dtype, np.integer) or (y.size and y.min() < 0):
        raise ValueError("labels must be non-negative integers.")
    return x, y.astype(np.int64)


def fit_linear_probe(features: np.ndarray, labels: np.ndarray, num_classes: int | None = None,
                     l2_reg: float | Sequence[float] = L2_GRID) -> LinearProbe:
    """Fit the closed-form least-squares probe; ``l2_reg`` a value or candidates chosen by leave-one-out."""
    x, y = _check_xy(features, labels)
    num_classes = int(y.max()) + 1 if num_classes is None else num_classes
    if len(x) < 2 or y.max() >= num_classes:
        raise ValueError(f"Need at least 2 examples with labels below num_classes={num_classes}.")
    candidates = np.atleast_1d(np.asarray(l2_reg, dtype=np.float64))
    if candidates.size == 0 or np.any(candidates < 0):
        raise ValueError(f"l2_reg must be non-negative, got {l2_reg!r}.")
    mean, std = x.mean(axis=0), x.std(axis=0)
    scale = np.where(std > 1e-8, std, 1.0)
    targets = 2.0 * np.eye(num_classes)[y] - 1.0
    bias = targets.mean(axis=0)
    u, s, vt = np.linalg.svd((x - mean) / scale, full_matrices=False)
    s = np.where(s > s.max(initial=0.0) * max(x.shape) * np.finfo(np.float64).eps, s, 0.0)
    projected = u.T @ (targets - bias)

    def ratio(numerator: np.ndarray, l2: float) -> np.ndarray:
        return np.divide(numerator, s**2 + l2, out=np.zeros_like(s), where=s**2 + l2 > 0)

    def loo_error(l2: float) -> float:
        shrink = ratio(s**2, l2)
        held_out = 1.0 - (1.0 / len(x) + (u**2) @ shrink)
        if held_out.min() < 1e-10:  # an example fitted only by itself: leave-one-out is undefined
            return np.inf
        fitted = u @ (shrink[:, None] * projected) + bias
        return float(np.mean(((targets - fitted) / held_out[:, None]) ** 2))

    best = float(min(candidates, key=loo_error)) if candidates.size > 1 else float(candidates[0])
    weights = vt.T @ (ratio(s, best)[:, None] * projected)
    return LinearProbe(mean, scale, weights, bias, float(best))


def sample_per_class(labels: np.ndarray, shots: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of ``shots`` examples drawn without replacement from each class in ``labels``."""
    labels = np.asarray(labels)
    picks = []
    for cls in np.unique(labels):
        members = np.flatnonzero(labels == cls)
        if len(members) < shots:
            raise ValueError(f"Class {cls} has {len(members)} examples, fewer than shots={shots}.")
        picks.append(rng.choice(members, shots, replace=False))
    return np.sort(np.concatenate(picks))


def few_shot_evaluation(train_features: np.ndarray, train_labels: np.ndarray, test_features: np.ndarray,
                        test_labels: np.ndarray, shots: Sequence[int] = SHOTS, seeds: int = 3,
                        l2_reg: float | Sequence[float] = L2_GRID) -> dict[int, np.ndarray]:
    """n-shot accuracy on held-out examples: ``{n: accuracies (seeds,)}``.

    For each seed and n, draw n examples per class from the training pool, fit the probe and score
    it on all test examples.
    """
    train_x, train_y = _check_xy(train_features, train_labels)
    test_x, test_y = _check_xy(test_features, test_labels)
    if seeds < 1 or not shots or min(shots) < 1:
        raise ValueError(f"Need seeds >= 1 and positive shots, got seeds={seeds}, shots={shots}.")
    num_classes = int(max(train_y.max(), test_y.max())) + 1
    results = {}
    for n in shots:
        accuracies = []
        for seed in range(seeds):
            picked = sample_per_class(train_y, n, np.random.default_rng(seed))
            probe = fit_linear_probe(train_x[picked], train_y[picked], num_classes, l2_reg)
            accuracies.append(np.mean(probe.predict(test_x) == test_y))
        results[int(n)] = np.asarray(accuracies)
    return results


def held_out_split(labels: np.ndarray, test_fraction: float = 0.5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Stratified ``(train_indices, test_indices)`` of one labelled set: ``test_fraction`` of each class held out."""
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}.")
    labels, rng = np.asarray(labels), np.random.default_rng(seed)
    train, test = [], []
    for cls in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == cls))
        cut = int(round(len(members) * test_fraction))
        test.append(members[:cut])
        train.append(members[cut:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def extract_features(model: keras.Model, images: np.ndarray, *, pooling: str | None = None,
                     batch_size: int = 32) -> np.ndarray:
    """Frozen features ``(n, D)`` of preprocessed ``images``.

    ``pooling=None``: the model's own output, which must be ``(batch, D)`` (a ViT built with
    ``include_top=False, pooling="token"`` or ``"avg"``). ``"token"``/``"avg"``: the class token or the
    mean patch token of the model's ``"encoder_norm"`` output, for any keras_vit ViT (with or without head).
    """
    if pooling not in POOLINGS:
        raise ValueError(f"Unknown pooling {pooling!r}; expected one of {POOLINGS}.")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}.")
    if pooling is not None:
        prefix = token_geometry(model).num_prefix_tokens
        if pooling == "token" and prefix == 0:
            raise ValueError("pooling='token' needs a class token; this model has none (use 'avg').")
        model = keras.Model(model.input, get_layer(model, "encoder_norm").output)
    if len(model.outputs) != 1 or len(model.outputs[0].shape) != (2 if pooling is None else 3):
        raise ValueError(
            f"Model {model.name!r} outputs {[tuple(o.shape) for o in model.outputs]}, not (batch, D) "
            "features; build it with include_top=False and pooling='token' or 'avg', or pass pooling=."
        )
    batches = []
    for start in range(0, len(images), batch_size):
        out = keras.ops.convert_to_numpy(model(np.asarray(images[start:start + batch_size], np.float32), training=False))
        if pooling == "token":
            out = out[:, 0]
        elif pooling == "avg":
            out = out[:, prefix:].mean(axis=1)
        batches.append(out)
    return np.concatenate(batches)
