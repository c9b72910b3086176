"""Shared pieces of the training tests: a tiny model config and running Python in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A ViT small enough that a few steps take well under a second on a CPU.
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
)

# The model part of TINY as command-line flags.
TINY_MODEL_FLAGS = [
    f"--{name.replace('_', '-')}={TINY[name]}"
    for name in ("model", "image_size", "hidden_size", "depth", "num_heads", "mlp_dim")
]


def python_json(code: str, timeout: int = 300):
    """Run ``code`` in a fresh Python (TensorFlow device set-up must precede TF's start); return the
    JSON value it prints on its last line."""
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def read_log(output_dir: str) -> list[dict]:
    with open(os.path.join(output_dir, "train_log.jsonl")) as file:
        return [json.loads(line) for line in file if line.strip()]
