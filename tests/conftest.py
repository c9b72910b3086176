"""Shared test set-up: the TensorFlow backend, quiet logs, deterministic seeds."""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras_vit  # noqa: E402, F401  (first, as a user's program would: it picks TF's CPU kernels)

import keras  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _seed_and_policy():
    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy("float32")
    yield
    keras.mixed_precision.set_global_policy("float32")
