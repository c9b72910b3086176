"""Shared pieces of the training tests: a tiny model config, running Python in a subprocess on a chosen backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import keras

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A ViT small enough that a few steps take well under a second on a CPU. float32: the tests compare runs to
# float tolerances (what --mixed-precision auto picks is tested on its own).
TINY = dict(
    model="Ti/4",
    image_size=8,
    hidden_size=16,
    depth=1,
    num_heads=2,
    mlp_dim=32,
    batch_size=16,
    eval_every=5,
    warmup=2,
    verbose=0,
    crop_area=(0.6, 1.0),
    mixed_precision="none",
)

# The model part of TINY as command-line flags.
TINY_MODEL_FLAGS = [
    f"--{name.replace('_', '-')}={TINY[name]}"
    for name in ("model", "image_size", "hidden_size", "depth", "num_heads", "mlp_dim")
]


def backend_env(backend: str = "tensorflow", host_devices: int | None = None) -> dict[str, str]:
    """The environment of a subprocess on ``backend`` (``host_devices``: XLA's CPU split into that many devices)."""
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": REPO}
    if host_devices:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={host_devices}"
    return env


def python_json(code: str, timeout: int = 300, backend: str = "tensorflow", host_devices: int | None = None):
    """Run ``code`` in a fresh Python on ``backend`` (the backend, and device set-up, are fixed at start); return
    the JSON value it prints on its last line."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=backend_env(backend, host_devices),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def read_log(output_dir: str) -> list[dict]:
    with open(os.path.join(output_dir, "train_log.jsonl")) as file:
        return [json.loads(line) for line in file if line.strip()]


def iterations(model: keras.Model) -> int:
    """The optimizer's update counter, on any backend."""
    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))


def checkpoint_steps(output_dir: str) -> list[int]:
    """The steps of the run's checkpoints (``checkpoints/ckpt-<step>.npz``), ascending."""
    from keras_vit.training.checkpoint import checkpoint_steps as steps

    return steps(os.path.join(output_dir, "checkpoints"))
