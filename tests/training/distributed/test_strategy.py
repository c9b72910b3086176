"""MirroredStrategy over two logical CPUs trains exactly like the default strategy, clipping included."""

import json

import pytest
from training_support import TINY, python_json

pytestmark = pytest.mark.backends("tensorflow")  # tf.distribute; JAX's keras.distribution: training/test_backends.py

# Runs in a fresh process: the CPU must be split into two logical devices before TensorFlow starts.
MIRRORED_VS_DEFAULT = """
import json, tempfile
from keras_vit.training.distributed.strategy import split_cpu
split_cpu(2)
import keras, numpy as np
from keras_vit.training.finetune import finetune
from keras_vit.training.model import build_model

config = json.loads({config!r})
weights, replicas, accuracy = {{}}, {{}}, {{}}
for strategy in ("default", "mirrored"):
    result = finetune(strategy=strategy, output_dir=tempfile.mkdtemp(), **config)
    weights[strategy], accuracy[strategy] = result.model.get_weights(), result.metrics["accuracy"]
    replicas[strategy] = json.load(open(result.output_dir + "/metrics.json"))["replicas"]
keras.utils.set_random_seed(result.config.optim.seed)
initial = build_model(result.config, 10).get_weights()
print(json.dumps({{
    "replicas": replicas,
    "max_difference": max(float(np.abs(a - b).max()) for a, b in zip(weights["default"], weights["mirrored"])),
    "max_change": max(float(np.abs(a - b).max()) for a, b in zip(weights["default"], initial)),
    "accuracy": accuracy,
}}))
"""


CASES = {
    # SGD with a global-norm clip that is active on every step: Keras alone clips each replica's share
    # and fails this (benchmarks/training_replica_clipping.py); keras_vit.training.optimizers clips the sum.
    "sgd_clipped": dict(optimizer="sgd", lr=0.1, clip_norm=0.05, weight_decay=0.0),
    "adamw": dict(optimizer="adamw", lr=0.01, clip_norm=0.0, weight_decay=0.1),
}


@pytest.mark.parametrize(
    "case",
    [
        "sgd_clipped",
        pytest.param("adamw", marks=pytest.mark.slow),
    ],
)
def test_mirrored_over_two_cpus_matches_default_strategy(case):
    """Same global batch of 16, same data: the same weights after 4 steps under both strategies."""
    config = {**TINY, "steps": 4, "eval_every": 2, **CASES[case]}
    out = python_json(MIRRORED_VS_DEFAULT.format(config=json.dumps(config)))
    assert out["replicas"] == {"default": 1, "mirrored": 2}
    assert out["max_change"] > 1e-3  # training moved the weights...
    assert out["max_difference"] < 1e-5  # ...identically under both strategies (float tolerance)
    assert out["accuracy"]["mirrored"] == pytest.approx(out["accuracy"]["default"], abs=1e-6)


@pytest.mark.backend_independent
def test_the_connect_timeout_is_the_argument_else_the_environment_else_ten_minutes(monkeypatch):
    from keras_vit.training.distributed.strategy import DEFAULT_CONNECT_TIMEOUT, _connect_timeout

    monkeypatch.delenv("KERAS_VIT_CONNECT_TIMEOUT", raising=False)
    assert _connect_timeout(None) == DEFAULT_CONNECT_TIMEOUT == 600.0
    monkeypatch.setenv("KERAS_VIT_CONNECT_TIMEOUT", "7.5")
    assert _connect_timeout(None) == 7.5
    assert _connect_timeout(3.0) == 3.0
