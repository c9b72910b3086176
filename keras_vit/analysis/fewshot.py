"""Few-shot linear evaluation (Section 4 of the paper): ``StandardScaler`` then ``RidgeClassifierCV`` on frozen
features, n examples per class; see docs/analyses.md."""

from __future__ import annotations

from collections.abc import Sequence

import keras
import numpy as np
from sklearn.linear_model import RidgeClassifierCV
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler

from keras_vit.analysis.geometry import check_choice, get_layer, token_geometry
from keras_vit.layers import TokenPooling

__all__ = [
    "L2_GRID",
    "SHOTS",
    "extract_features",
    "few_shot_evaluation",
    "fit_linear_probe",
    "linear_probe",
    "sample_per_class",
]

SHOTS = (1, 5, 10, 25)
L2_GRID = tuple(2.0 ** np.arange(-10, 11))


def _check_xy(features, labels) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(features, dtype=np.float64), np.asarray(labels)
    if x.ndim != 2 or y.shape != (len(x),):
        raise ValueError(f"Need features (n, dim) and labels (n,), got {x.shape} and {y.shape}.")
    if not np.issubdtype(y.dtype, np.integer) or (y.size and y.min() < 0):
        raise ValueError("labels must be non-negative integers.")
    return x, y.astype(np.int64)


def linear_probe(l2_reg: float | Sequence[float] = L2_GRID) -> Pipeline:
    """The unfitted probe; ``l2_reg`` a value or the candidates chosen from by leave-one-out. Fitted: ``predict(x)``
    gives classes, ``decision_function(x)`` the scores and ``probe[-1].alpha_`` the chosen ``l2``."""
    alphas = np.atleast_1d(np.asarray(l2_reg, dtype=np.float64))
    if alphas.ndim != 1 or alphas.size == 0 or np.any(alphas <= 0):
        raise ValueError(f"l2_reg must be positive, got {l2_reg!r}.")
    return make_pipeline(StandardScaler(), RidgeClassifierCV(alphas=alphas))


def fit_linear_probe(features: np.ndarray, labels: np.ndarray, l2_reg: float | Sequence[float] = L2_GRID) -> Pipeline:
    """:func:`linear_probe` fitted on ``features`` ``(n, dim)`` and integer ``labels`` ``(n,)``."""
    x, y = _check_xy(features, labels)
    if len(np.unique(y)) < 2:
        raise ValueError("Need examples of at least 2 classes.")
    return linear_probe(l2_reg).fit(x, y)


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


def few_shot_evaluation(
    train_features: np.ndarray,
    train_labels: np.ndarray,
    test_features: np.ndarray,
    test_labels: np.ndarray,
    shots: Sequence[int] = SHOTS,
    seeds: int = 3,
    l2_reg: float | Sequence[float] = L2_GRID,
) -> dict[int, np.ndarray]:
    """n-shot accuracy on held-out examples, ``{n: accuracies (seeds,)}``: per seed and n, the probe fitted on n
    examples per class of the training pool and scored on all test examples."""
    train_x, train_y = _check_xy(train_features, train_labels)
    test_x, test_y = _check_xy(test_features, test_labels)
    if seeds < 1 or not shots or min(shots) < 1:
        raise ValueError(f"Need seeds >= 1 and positive shots, got seeds={seeds}, shots={shots}.")

    def accuracy(n: int, seed: int) -> np.floating:
        picked = sample_per_class(train_y, n, np.random.default_rng(seed))
        return np.mean(fit_linear_probe(train_x[picked], train_y[picked], l2_reg).predict(test_x) == test_y)

    return {int(n): np.asarray([accuracy(n, seed) for seed in range(seeds)]) for n in shots}


def extract_features(
    model: keras.Model, images: np.ndarray, *, pooling: str | None = None, batch_size: int = 32
) -> np.ndarray:
    """Frozen features ``(n, D)`` float32 of preprocessed ``images``: the model's own ``(batch, D)`` output
    (``pooling=None``), or its ``"encoder_norm"`` output pooled (``"token"``, ``"avg"``).
    """
    check_choice(pooling, (None, *TokenPooling.MODES), "pooling")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}.")
    if pooling is not None:
        pool = TokenPooling(pooling, token_geometry(model).num_prefix_tokens, name=f"features_{pooling}_pool")
        model = keras.Model(model.input, pool(get_layer(model, "encoder_norm").output))
    if len(model.outputs) != 1 or len(model.outputs[0].shape) != 2:
        raise ValueError(
            f"Model {model.name!r} outputs {[tuple(o.shape) for o in model.outputs]}, not (batch, D) "
            "features; build it with include_top=False and pooling='token' or 'avg', or pass pooling=."
        )
    batches = [
        model.predict_on_batch(np.asarray(images[start : start + batch_size], np.float32))
        for start in range(0, len(images), batch_size)
    ]
    return np.concatenate(batches).astype(np.float32)
