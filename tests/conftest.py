"""Shared test set-up: the backend (TensorFlow unless ``KERAS_BACKEND`` says otherwise), quiet logs, seeds.

A test marked ``@pytest.mark.backends("tensorflow")`` runs only on the backends it names and is skipped,
saying why, on the others (CI runs a second pass under ``KERAS_BACKEND=jax`` and a smaller one under torch).
"""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import pytest

import keras_vit  # noqa: F401  (first, as a user's program would: it picks TF's CPU kernels)


def pytest_runtest_setup(item):
    marker = item.get_closest_marker("backends")
    if marker is not None and keras.backend.backend() not in marker.args:
        pytest.skip(f"needs the {' or '.join(marker.args)} backend, this run is {keras.backend.backend()}")


@pytest.fixture(autouse=True)
def _seed_and_policy():
    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy("float32")
    yield
    keras.mixed_precision.set_global_policy("float32")
