"""Fixtures of the library's tests (the suite's own set-up: tests/conftest.py)."""

import keras
import pytest


@pytest.fixture
def channels_first():
    """``keras.config.image_data_format()`` is ``"channels_first"`` during the test, and what it was after."""
    before = keras.config.image_data_format()
    keras.config.set_image_data_format("channels_first")
    yield
    keras.config.set_image_data_format(before)
