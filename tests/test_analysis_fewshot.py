"""Few-shot linear evaluation: the closed-form probe, its l2 choice, sampling, and frozen features."""

import numpy as np
import pytest
from sklearn.linear_model import Ridge

import keras_vit
from keras_vit.analysis import fewshot

TINY = dict(image_size=32, patch_size=8, hidden_size=32, depth=1, num_heads=2, mlp_dim=64, include_top=False)


def clusters(rng, classes=10, per_class=60, dim=16, spread=0.1):
    """Linearly separable features: well-separated class means plus small noise."""
    means = rng.normal(0, 3, (classes, dim))
    labels = np.repeat(np.arange(classes), per_class)
    return means[labels] + rng.normal(0, spread, (len(labels), dim)), labels


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
    train, test = fewshot.held_out_split(y, 0.5, seed=0)
    results = fewshot.few_shot_evaluation(x[train], y[train], x[test], y[test], shots=(5, 25), seeds=3)
    mean = np.mean([a.mean() for a in results.values()])
    assert abs(mean - 0.1) < 0.03, results  # 10 classes; 1500 test examples per draw


def test_fixed_l2_probe_is_ridge_regression_on_standardised_features_onto_plus_minus_one():
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(40, 8)) * rng.uniform(0.5, 5, 8) + 3, rng.integers(0, 4, 40)
    probe = fewshot.fit_linear_probe(x, y, num_classes=4, l2_reg=3.0)
    z = (x - x.mean(0)) / x.std(0)
    ridge = Ridge(alpha=3.0).fit(z, 2.0 * np.eye(4)[y] - 1.0)
    new = rng.normal(size=(5, 8)) + 3
    np.testing.assert_allclose(probe.scores(new), ridge.predict((new - x.mean(0)) / x.std(0)), atol=1e-10)
    assert probe.l2_reg == 3.0


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
            errors.append(np.mean((ridge.predict(z[i:i + 1]) - targets[i]) ** 2))
        return np.mean(errors)

    errors = [brute_force(a) for a in candidates]
    assert len(set(np.round(errors, 6))) == len(candidates)
    assert fewshot.fit_linear_probe(x, y, 3, l2_reg=candidates).l2_reg == candidates[int(np.argmin(errors))]


def test_sample_per_class_and_held_out_split():
    labels = np.repeat([0, 1, 2], [5, 7, 9])
    picked = fewshot.sample_per_class(labels, 4, np.random.default_rng(0))
    assert len(set(picked)) == 12 and np.array_equal(np.bincount(labels[picked]), [4, 4, 4])
    with pytest.raises(ValueError, match="Class 0 has 5 examples, fewer than shots=6"):
        fewshot.sample_per_class(labels, 6, np.random.default_rng(0))
    train, test = fewshot.held_out_split(labels, 0.4, seed=1)
    assert np.array_equal(np.sort(np.concatenate([train, test])), np.arange(21))
    assert np.array_equal(np.bincount(labels[test]), [2, 3, 4])


def test_probe_rejects_bad_input():
    with pytest.raises(ValueError, match="features \\(n, dim\\) and labels"):
        fewshot.fit_linear_probe(np.ones((4, 2)), np.zeros(3, int))
    with pytest.raises(ValueError, match="non-negative integers"):
        fewshot.fit_linear_probe(np.ones((4, 2)), np.array([0.0, 1.0, 0.0, 1.0]))
    with pytest.raises(ValueError, match="l2_reg must be non-negative"):
        fewshot.fit_linear_probe(np.ones((4, 2)), np.array([0, 1, 0, 1]), l2_reg=-1.0)
    with pytest.raises(ValueError, match="positive shots"):
        fewshot.few_shot_evaluation(np.ones((4, 2)), [0, 1, 0, 1], np.ones((2, 2)), [0, 1], shots=(0,))


def test_extract_features_pools_the_encoder_output_like_a_pooling_model():
    tokens_model = keras_vit.ViT("Ti/16", **TINY)
    images = np.random.default_rng(0).uniform(-1, 1, (5, 32, 32, 3)).astype("float32")
    for pooling in ("token", "avg"):
        pooled_model = keras_vit.ViT("Ti/16", pooling=pooling, **TINY)
        pooled_model.set_weights(tokens_model.get_weights())
        direct = fewshot.extract_features(pooled_model, images, batch_size=2)
        assert direct.shape == (5, 32)
        np.testing.assert_allclose(fewshot.extract_features(tokens_model, images, pooling=pooling, batch_size=3),
                                   direct, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="not \\(batch, D\\) features"):
        fewshot.extract_features(tokens_model, images)
    gap = keras_vit.ViT("Ti/16", classifier="gap", **TINY)
    with pytest.raises(ValueError, match="needs a class token"):
        fewshot.extract_features(gap, images, pooling="token")
