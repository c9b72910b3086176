"""Few-shot linear evaluation: the scikit-learn probe against the closed form, its l2 choice, sampling,
and frozen features."""

import numpy as np
import pytest
from sklearn.linear_model import Ridge

import keras_vit
from keras_vit import datasets
from keras_vit.analysis import fewshot

# the probe is scikit-learn on numpy arrays; extract_features (below) runs the model
pytestmark = pytest.mark.backend_independent

TINY = dict(image_size=32, patch_size=8, hidden_size=32, depth=1, num_heads=2, mlp_dim=64, include_top=False)


def clusters(rng, classes=10, per_class=60, dim=16, spread=0.1):
    """Linearly separable features: well-separated class means plus small noise."""
    means = rng.normal(0, 3, (classes, dim))
    labels = np.repeat(np.arange(classes), per_class)
    return means[labels] + rng.normal(0, spread, (len(labels), dim)), labels


def closed_form_probe(x, y, alphas=fewshot.L2_GRID):
    """The probe in numpy: ridge on standardised features onto {-1, 1} one-vs-rest targets, unregularised
    bias, l2 the first of ``alphas`` with the least exact leave-one-out squared error. Returns
    ``(predict, {l2: leave-one-out error})``."""
    mean, std = x.mean(0), x.std(0)
    scale = np.where(std > 1e-8, std, 1.0)
    targets = 2.0 * np.eye(y.max() + 1)[y] - 1.0
    bias = targets.mean(0)
    u, s, vt = np.linalg.svd((x - mean) / scale, full_matrices=False)
    projected = u.T @ (targets - bias)

    def loo_error(alpha):
        shrink = s**2 / (s**2 + alpha)
        residual = targets - bias - u @ (shrink[:, None] * projected)
        return np.mean((residual / (1.0 - 1.0 / len(x) - (u**2) @ shrink)[:, None]) ** 2)

    errors = {alpha: loo_error(alpha) for alpha in alphas}
    best = min(alphas, key=errors.get)
    weights = vt.T @ ((s / (s**2 + best))[:, None] * projected)
    return lambda q: (((q - mean) / scale) @ weights + bias).argmax(1), errors


@pytest.fixture(scope="module")
def digits_split():
    images, labels = datasets.load_digits()
    train, test = datasets.stratified_split(labels, 0.5, seed=0)
    pixels = images.reshape(len(images), -1).astype(np.float64)
    return pixels[train], labels[train], pixels[test], labels[test]


@pytest.mark.parametrize("classes", [10, 2])
def test_probe_chooses_l2_and_predicts_like_the_closed_form_on_digit_pixels(digits_split, classes):
    train_x, train_y, test_x, test_y = digits_split
    train_x, train_y = train_x[train_y < classes], train_y[train_y < classes]
    test_x = test_x[test_y < classes]
    chosen = set()
    for shots in (1, 5, 25):
        for seed in range(3):
            picked = fewshot.sample_per_class(train_y, shots, np.random.default_rng(seed))
            probe = fewshot.fit_linear_probe(train_x[picked], train_y[picked])
            predict, errors = closed_form_probe(train_x[picked], train_y[picked])
            # the least leave-one-out error; two 1-shot examples tie for every l2 (each predicts the other's target)
            np.testing.assert_allclose(errors[probe[-1].alpha_], min(errors.values()), rtol=1e-9)
            np.testing.assert_array_equal(probe.predict(test_x), predict(test_x))
            chosen.add(probe[-1].alpha_)
    assert len(chosen) > 1  # the l2 choice is really exercised


def test_few_shot_accuracies_equal_the_closed_form_on_digit_pixels(digits_split):
    train_x, train_y, test_x, test_y = digits_split
    results = fewshot.few_shot_evaluation(train_x, train_y, test_x, test_y, shots=(1, 5, 10), seeds=2)
    for shots, accuracies in results.items():
        expected = []
        for seed in range(2):
            picked = fewshot.sample_per_class(train_y, shots, np.random.default_rng(seed))
            predict, _ = closed_form_probe(train_x[picked], train_y[picked])
            expected.append(np.mean(predict(test_x) == test_y))
        np.testing.assert_array_equal(accuracies, expected)
    assert results[10].mean() > 0.85  # digit pixels are nearly linearly separable


def test_probe_separates_linearly_separable_features_perfectly():
    rng = np.random.default_rng(0)
    x, y = clusters(rng)
    test_x, test_y = clusters(np.random.default_rng(0), per_class=30)  # same means (same seed), fresh noise
    results = fewshot.few_shot_evaluation(x, y, test_x, test_y, shots=(1, 5, 10, 25), seeds=3)
    assert sorted(results) == [1, 5, 10, 25]
    for accuracies in results.values():
        np.testing.assert_array_equal(accuracies, 1.0)


def test_probe_is_at_chance_on_shuffled_labels():
    rng = np.random.default_rng(1)
    x, y = clusters(rng, per_class=300, spread=1.0)
    y = rng.permutation(y)  # labels no longer depend on the features
    train, test = datasets.stratified_split(y, 0.5, seed=0)
    results = fewshot.few_shot_evaluation(x[train], y[train], x[test], y[test], shots=(5, 25), seeds=3)
    mean = np.mean([a.mean() for a in results.values()])
    assert abs(mean - 0.1) < 0.03, results  # 10 classes; 1500 test examples per draw


def test_fixed_l2_probe_is_ridge_regression_on_standardised_features_onto_plus_minus_one():
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(40, 8)) * rng.uniform(0.5, 5, 8) + 3, rng.integers(0, 4, 40)
    probe = fewshot.fit_linear_probe(x, y, l2_reg=3.0)
    z = (x - x.mean(0)) / x.std(0)
    ridge = Ridge(alpha=3.0).fit(z, 2.0 * np.eye(4)[y] - 1.0)
    new = rng.normal(size=(5, 8)) + 3
    np.testing.assert_allclose(probe.decision_function(new), ridge.predict((new - x.mean(0)) / x.std(0)), atol=1e-10)
    assert probe[-1].alpha_ == 3.0


def test_l2_choice_minimises_brute_force_leave_one_out_error():
    rng = np.random.default_rng(3)
    x, y = clusters(rng, classes=3, per_class=10, dim=20, spread=2.0)
    candidates = (1e-3, 1.0, 30.0, 1e4)
    z = (x - x.mean(0)) / x.std(0)
    targets = 2.0 * np.eye(3)[y] - 1.0

    def brute_force(alpha):
        errors = []
        for i in range(len(z)):
            keep = np.arange(len(z)) != i
            ridge = Ridge(alpha=alpha).fit(z[keep], targets[keep])
            errors.append(np.mean((ridge.predict(z[i : i + 1]) - targets[i]) ** 2))
        return np.mean(errors)

    errors = [brute_force(a) for a in candidates]
    assert len(set(np.round(errors, 6))) == len(candidates)
    assert fewshot.fit_linear_probe(x, y, l2_reg=candidates)[-1].alpha_ == candidates[int(np.argmin(errors))]


def test_sample_per_class_and_the_stratified_split():
    labels = np.repeat([0, 1, 2], [5, 7, 9])
    picked = fewshot.sample_per_class(labels, 4, np.random.default_rng(0))
    assert len(set(picked)) == 12 and np.array_equal(np.bincount(labels[picked]), [4, 4, 4])
    with pytest.raises(ValueError, match="Class 0 has 5 examples, fewer than shots=6"):
        fewshot.sample_per_class(labels, 6, np.random.default_rng(0))
    train, test = datasets.stratified_split(labels, 0.4, seed=1)
    assert not set(train) & set(test) and np.array_equal(np.sort(np.concatenate([train, test])), np.arange(21))
    assert np.array_equal(np.bincount(labels[test]), [2, 3, 4])  # 40% of each class, rounded


def test_probe_rejects_bad_input():
    with pytest.raises(ValueError, match="features \\(n, dim\\) and labels"):
        fewshot.fit_linear_probe(np.ones((4, 2)), np.zeros(3, int))
    with pytest.raises(ValueError, match="non-negative integers"):
        fewshot.fit_linear_probe(np.ones((4, 2)), np.array([0.0, 1.0, 0.0, 1.0]))
    for bad in (-1.0, 0.0, ()):
        with pytest.raises(ValueError, match="l2_reg must be positive"):
            fewshot.fit_linear_probe(np.ones((4, 2)), np.array([0, 1, 0, 1]), l2_reg=bad)
    with pytest.raises(ValueError, match="at least 2 classes"):
        fewshot.fit_linear_probe(np.ones((4, 2)), np.zeros(4, int))
    with pytest.raises(ValueError, match="positive shots"):
        fewshot.few_shot_evaluation(np.ones((4, 2)), [0, 1, 0, 1], np.ones((2, 2)), [0, 1], shots=(0,))


@pytest.mark.backends("tensorflow", "jax")
def test_extract_features_pools_the_encoder_output_like_a_pooling_model():
    tokens_model = keras_vit.ViT("Ti/16", **TINY)
    images = np.random.default_rng(0).uniform(-1, 1, (5, 32, 32, 3)).astype("float32")
    for pooling in ("token", "avg"):
        pooled_model = keras_vit.ViT("Ti/16", pooling=pooling, **TINY)
        pooled_model.set_weights(tokens_model.get_weights())
        direct = fewshot.extract_features(pooled_model, images, batch_size=2)
        assert direct.shape == (5, 32)
        np.testing.assert_allclose(
            fewshot.extract_features(tokens_model, images, pooling=pooling, batch_size=3), direct, rtol=1e-5, atol=1e-5
        )
    with pytest.raises(ValueError, match="not \\(batch, D\\) features"):
        fewshot.extract_features(tokens_model, images)
    gap = keras_vit.ViT("Ti/16", classifier="gap", **TINY)
    with pytest.raises(ValueError, match="needs a class token"):
        fewshot.extract_features(gap, images, pooling="token")
    with pytest.raises(ValueError, match="Unknown pooling 'median'"):
        fewshot.extract_features(tokens_model, images, pooling="median")
