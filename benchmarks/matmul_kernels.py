"""GFLOP/s of a ViT-B/16 block's matmuls under this process's TensorFlow CPU kernels, next to numpy.

Run it twice to compare TensorFlow's two kernel sets (the variable is read when TensorFlow loads)::

    TF_ENABLE_ONEDNN_OPTS=0 python benchmarks/matmul_kernels.py   # Eigen
    TF_ENABLE_ONEDNN_OPTS=1 python benchmarks/matmul_kernels.py   # oneDNN (keras_vit's default)

Rows: the qkv, output-projection and two MLP matmuls at batch 1 (197 tokens) and batch 32 (6304
rows), the two attention products at batch 32 (384 batched 197x64 matmuls), the three matmuls of the
first MLP layer in a training step at batch 8 (1576 rows: forward ``x W``, backward ``dy W^T`` and
``x^T dy``, the transposed products TensorFlow's ``MatMul`` gradient runs) and a 4096x4096 square
(the roofline's peak); each the median of ``--repeats`` calls of a ``tf.function``, against numpy's
BLAS on the same shapes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

WIDTH, MLP, HEADS, TOKENS = 768, 3072, 12, 197
DENSE = {"qkv": (WIDTH, 3 * WIDTH), "out": (WIDTH, WIDTH), "mlp fc1": (WIDTH, MLP), "mlp fc2": (MLP, WIDTH)}


def _median_seconds(call, repeats: int) -> float:
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    from keras_vit.runtime import onednn_enabled

    rng = np.random.default_rng(0)
    # name: (a's shape, b's shape, transpose a, transpose b) as TensorFlow receives them
    cases = {
        f"{name}, batch {batch}": ((batch * TOKENS, k), (k, n), False, False)
        for batch in (1, 32)
        for name, (k, n) in DENSE.items()
    }
    head, rows = WIDTH // HEADS, 8 * TOKENS
    cases["attention q k^T, batch 32"] = ((32, HEADS, TOKENS, head), (32, HEADS, TOKENS, head), False, True)
    cases["attention probs v, batch 32"] = ((32, HEADS, TOKENS, TOKENS), (32, HEADS, TOKENS, head), False, False)
    cases["train b8: mlp fc1 x W"] = ((rows, WIDTH), (WIDTH, MLP), False, False)
    cases["train b8: mlp fc1 dy W^T"] = ((rows, MLP), (WIDTH, MLP), False, True)
    cases["train b8: mlp fc1 x^T dy"] = ((rows, WIDTH), (rows, MLP), True, False)
    cases["square 4096 (the peak)"] = ((4096, 4096), (4096, 4096), False, False)
    print(f"TensorFlow {tf.__version__}, {'oneDNN' if onednn_enabled() else 'Eigen'} kernels\n")
    print("| matmul | shape | TensorFlow GFLOP/s | numpy GFLOP/s |\n|---|---|---|---|")
    for name, (a_shape, b_shape, transpose_a, transpose_b) in cases.items():
        a = rng.standard_normal(a_shape, dtype=np.float32)
        b = rng.standard_normal(b_shape, dtype=np.float32)
        a_np = np.swapaxes(a, -1, -2) if transpose_a else a
        b_np = np.swapaxes(b, -1, -2) if transpose_b else b
        flops = 2 * np.prod(a_np.shape) * b_np.shape[-1]
        ta, tb = tf.constant(a), tf.constant(b)
        product = tf.function(
            lambda ta=ta, tb=tb, t=(transpose_a, transpose_b): tf.matmul(ta, tb, transpose_a=t[0], transpose_b=t[1])
        )
        tf_s = _median_seconds(lambda f=product: f().numpy(), args.repeats)
        np_s = _median_seconds(lambda a=a_np, b=b_np: a @ b, args.repeats)
        marks = ("^T" if transpose_a else "", "^T" if transpose_b else "")
        shape = f"{'x'.join(map(str, a_shape))}{marks[0]} @ {'x'.join(map(str, b_shape))}{marks[1]}"
        print(f"| {name} | {shape} | {flops / tf_s / 1e9:.0f} | {flops / np_s / 1e9:.0f} |")


if __name__ == "__main__":
    main()
