"""The fusions tried on the encoder blocks (TensorFlow backend), side by side in one process.

    python benchmarks/fusions.py --depth 4 --rounds 5          # a B-size encoder of 4 blocks
    python benchmarks/fusions.py --depth 12 --gelu tanh         # the whole B/16, keras_vit's default GELU

Paths, each a ``keras_vit.ViT("B/16", depth=...)`` with the same weights, compiled as in
``benchmarks/throughput.py`` (SGD with momentum):

* ``rows`` (what keras_vit does): the blocks' Dense layers run on ``(B*N, D)`` rows, so Grappler fuses
  ``MatMul + BiasAdd (+ GELU)`` into one oneDNN kernel (``keras_vit.layers.rows``).
* ``tokens``: the Dense layers on ``(B, N, D)`` tokens (``rows``/``unrows`` replaced by the identity while
  this path traces): Keras' TensorFlow backend reshapes between ``MatMul`` and ``BiasAdd``, nothing fuses.
* ``xla blocks``: every ``TransformerBlock`` call inside a ``tf.function(jit_compile=True)`` (XLA on the
  encoder blocks only, the rest of the step as plain TensorFlow).
* ``xla model``: ``compile(jit_compile=True)``, the whole step under XLA.

Every round runs each path's inference (``--batch``) and training step (``--train-batch``) in rotating
order; printed are the medians of images/s by wall time and by the process's CPU time (less sensitive to
other jobs on a shared machine), each path against ``rows``, and the largest output difference from it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras_vit  # first: it picks TensorFlow's CPU kernels

# isort: split
import keras
import numpy as np
import tensorflow as tf

from keras_vit import layers as vit_layers

PATHS = ("rows", "tokens", "xla blocks", "xla model")


@contextlib.contextmanager
def dense_on_tokens():
    """While active, keras_vit's blocks call their Dense layers on 3-D tokens instead of rows."""
    saved = vit_layers.rows, vit_layers.unrows
    vit_layers.rows, vit_layers.unrows = (lambda x: x), (lambda y, like: y)
    try:
        yield
    finally:
        vit_layers.rows, vit_layers.unrows = saved


@contextlib.contextmanager
def xla_blocks():
    """While active, every ``TransformerBlock`` call runs inside a ``tf.function(jit_compile=True)``."""
    block_class, plain_call = vit_layers.TransformerBlock, vit_layers.TransformerBlock.call

    def call(self, x, training=None, **kwargs):
        if kwargs:
            return plain_call(self, x, training=training, **kwargs)
        compiled = self.__dict__.setdefault("_xla_calls", {})
        if bool(training) not in compiled:
            compiled[bool(training)] = tf.function(
                lambda x, training=bool(training): plain_call(self, x, training=training), jit_compile=True
            )
        return compiled[bool(training)](x)

    block_class.call = call
    try:
        yield
    finally:
        block_class.call = plain_call


def scope(path: str):
    return {"tokens": dense_on_tokens, "xla blocks": xla_blocks}.get(path, contextlib.nullcontext)()


def build(path: str, depth: int, gelu: str, weights):
    model = keras_vit.ViT("B/16", depth=depth, gelu=gelu, num_classes=1000)
    if weights is not None:
        model.set_weights(weights)
    model.compile(
        optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=path == "xla model",
    )
    return model


def run(args) -> str:
    rng = np.random.default_rng(0)
    models, weights = {}, None
    for path in args.paths:
        models[path] = build(path, args.depth, args.gelu, weights)
        if weights is None:
            weights = [rng.normal(0, 0.02, w.shape).astype("float32") for w in models[path].get_weights()]
            models[path].set_weights(weights)
    images = rng.uniform(-1, 1, (args.batch, 224, 224, 3)).astype("float32")
    train_images, labels = images[: args.train_batch], rng.integers(0, 1000, args.train_batch)
    outputs = {}
    for path, model in models.items():  # trace (and compile) every path inside its own scope
        with scope(path):
            outputs[path] = model.predict_on_batch(images)
            model.train_on_batch(train_images, labels)
    phases = {"infer": (args.batch, lambda m: m.predict_on_batch(images))}
    phases["train"] = (args.train_batch, lambda m: m.train_on_batch(train_images, labels))
    wall = {(p, ph): [] for p in models for ph in phases}
    cpu = {(p, ph): [] for p in models for ph in phases}
    for round_ in range(args.rounds):
        order = list(models)[round_ % len(models) :] + list(models)[: round_ % len(models)]
        for path in order:
            with scope(path):
                for phase, (batch, step) in phases.items():
                    start, cpu_start = time.perf_counter(), time.process_time()
                    step(models[path])
                    wall[(path, phase)].append(batch / (time.perf_counter() - start))
                    cpu[(path, phase)].append(batch / (time.process_time() - cpu_start))
    first = args.paths[0]
    lines = [
        f"B-size encoder, depth {args.depth}, gelu {args.gelu}, inference b{args.batch}, train step "
        f"b{args.train_batch}, {args.rounds} rounds (medians; ratios: medians of per-round ratios to {first})",
        "",
        "| path | infer img/s | train img/s | infer vs first (wall / CPU) | train vs first (wall / CPU) | max diff |",
        "|---|---|---|---|---|---|",
    ]
    for path in models:
        cells = [f"{statistics.median(wall[(path, ph)]):.2f}" for ph in phases]
        for phase in phases:
            ratios = [
                statistics.median(a / b for a, b in zip(table[(path, phase)], table[(first, phase)]))
                for table in (wall, cpu)
            ]
            cells.append(f"{ratios[0]:.2f}x / {ratios[1]:.2f}x")
        cells.append(f"{float(np.abs(outputs[path] - outputs[first]).max()):.1e}")
        lines.append(f"| {path} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--gelu", choices=("exact", "tanh"), default="exact")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--train-batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    from throughput import measure_and_report  # benchmarks/throughput.py, beside this script

    args = parse_args(argv)
    measure_and_report(lambda: run(args), str)


if __name__ == "__main__":
    main()
