"""Int8 ViT inference on CPU: Keras' ``model.quantize("int8")`` next to LiteRT dynamic-range int8.

    python benchmarks/int8.py [--variant B/16] [--batches 1 8] [--rounds 5]

1. One Dense of a B/16 MLP (``(32, 197, 768) @ (768, 3072)``), as ``tf.function``: float32, Keras'
   int8 Dense (``Dense.quantize("int8")``), and its two parts alone: the input quantiser (abs-max per
   token, round, cast) and the ``int8 x int8 -> int32`` matmul Keras hands TensorFlow.
2. The whole model at each batch, interleaved ``--rounds`` times (median images/s, ratio to
   float32): Keras float32, ``mixed_bfloat16`` and ``quantize("int8")`` through ``predict_on_batch``,
   and LiteRT (``model.export(format="litert")``) float32 and dynamic-range int8
   (``optimizations=[tf.lite.Optimize.DEFAULT]``: int8 weights, activations quantised per call),
   with the interpreter's default XNNPACK delegate on all cores. Beside each: the largest absolute
   logit difference from float32 and the lowest cosine similarity (random weights, head included).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings

__all__ = ["dense_probe", "main", "model_paths"]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _best_seconds(call, repeats: int = 3) -> float:
    call()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def dense_probe(tokens: tuple[int, int] = (32, 197), width: int = 768, mlp: int = 3072) -> list[str]:
    """Markdown rows: one Dense in float32, as Keras int8, and the int8 Dense's quantiser and matmul alone."""
    import keras
    import numpy as np
    import tensorflow as tf

    x = tf.constant(np.random.default_rng(0).standard_normal((*tokens, width)).astype("float32"))
    dense, int8 = keras.layers.Dense(mlp), keras.layers.Dense(mlp)
    dense.build((None, tokens[1], width))
    int8.build((None, tokens[1], width))
    int8.set_weights(dense.get_weights())
    int8.quantize("int8")
    x8, _ = int8.inputs_quantizer(x, axis=-1)
    kernel8 = tf.convert_to_tensor(int8._kernel)
    paths = {
        "float32 Dense (oneDNN sgemm)": tf.function(lambda: dense(x)),
        "Keras int8 Dense": tf.function(lambda: int8(x)),
        "its input quantiser alone": tf.function(lambda: int8.inputs_quantizer(x, axis=-1)[0]),
        "its int8 x int8 -> int32 matmul alone": tf.function(lambda: keras.ops.matmul(x8, kernel8)),
    }
    flops = 2 * np.prod(tokens) * width * mlp
    base = None
    rows = [
        f"Dense {tokens[0]}x{tokens[1]}x{width} @ {width}x{mlp}, best of 3:",
        "",
        "| path | ms | GFLOP/s (or GOP/s) | time vs float32 |",
        "|---|---|---|---|",
    ]
    for name, fn in paths.items():
        seconds = _best_seconds(lambda fn=fn: np.asarray(fn()))
        base = base or seconds
        rows.append(f"| {name} | {seconds * 1e3:.0f} | {flops / seconds / 1e9:.0f} | {seconds / base:.2f}x |")
    return rows


def _litert(model, path: str, quantize: bool):
    """Export ``model`` to LiteRT at ``path``; an interpreter call ``images -> logits`` on all cores."""
    import numpy as np
    import tensorflow as tf

    kwargs = {"optimizations": [tf.lite.Optimize.DEFAULT]} if quantize else {}
    model.export(path, format="litert", verbose=False, **kwargs)
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        Interpreter = tf.lite.Interpreter
    interpreter = Interpreter(model_path=path, num_threads=os.cpu_count())
    (inp,), (out,) = interpreter.get_input_details(), interpreter.get_output_details()
    state = {"shape": None}

    def run(images):
        if state["shape"] != images.shape:
            interpreter.resize_tensor_input(inp["index"], images.shape)
            interpreter.allocate_tensors()
            state["shape"] = images.shape
        interpreter.set_tensor(inp["index"], images)
        interpreter.invoke()
        return np.array(interpreter.get_tensor(out["index"]))

    return run, os.path.getsize(path) / 1e6


def model_paths(variant: str, image_size: int, workdir: str) -> dict:
    """``{name: (call, size_mb)}``: Keras float32, bfloat16 and int8, LiteRT float32 and dynamic int8."""
    import keras
    import numpy as np

    import keras_vit

    reference = keras_vit.ViT(variant, image_size=image_size)
    head = reference.get_layer("head")  # zero-initialised, as published: random logits to compare
    head.kernel.assign(np.random.default_rng(1).normal(0, 0.1, head.kernel.shape))
    weights = reference.get_weights()

    def rebuilt(policy: str):
        keras.mixed_precision.set_global_policy(policy)
        try:
            model = keras_vit.ViT(variant, image_size=image_size)
        finally:
            keras.mixed_precision.set_global_policy("float32")
        model.set_weights(weights)
        return model

    bf16, int8 = rebuilt("mixed_bfloat16"), rebuilt("float32")
    with warnings.catch_warnings():  # one "does not have a `quantize` method" per non-Dense layer
        warnings.simplefilter("ignore", UserWarning)
        int8.quantize("int8")
    f32_mb = sum(w.nbytes for w in weights) / 1e6
    return {
        "Keras float32": (reference.predict_on_batch, f32_mb),
        "Keras mixed_bfloat16": (bf16.predict_on_batch, f32_mb),
        'Keras quantize("int8")': (int8.predict_on_batch, None),
        "LiteRT float32": _litert(reference, os.path.join(workdir, "f32.tflite"), quantize=False),
        "LiteRT dynamic-range int8": _litert(reference, os.path.join(workdir, "int8.tflite"), quantize=True),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", default="B/16")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, REPO)
    import keras_vit  # noqa: F401  (first: TensorFlow's oneDNN kernels, as keras_vit users get)

    # isort: split
    import numpy as np

    print(f"load average {', '.join(f'{v:.1f}' for v in os.getloadavg())}, {os.cpu_count()} cores\n")
    print("\n".join(dense_probe()) + "\n", flush=True)
    with tempfile.TemporaryDirectory() as workdir:
        paths = model_paths(args.variant, args.image_size, workdir)
        for batch in args.batches:
            x = np.random.default_rng(batch).uniform(-1, 1, (batch, args.image_size, args.image_size, 3))
            x = x.astype("float32")
            outputs = {name: np.asarray(call(x), dtype="float32") for name, (call, _) in paths.items()}  # warm up
            rates = {name: [] for name in paths}
            for _ in range(args.rounds):
                for name, (call, _) in paths.items():
                    start = time.perf_counter()
                    call(x)
                    rates[name].append(batch / (time.perf_counter() - start))
            ref, base = outputs["Keras float32"], rates["Keras float32"]
            print(
                f"{args.variant} at {args.image_size}px, batch {batch}, {args.rounds} rounds (median):\n\n"
                "| path | img/s | vs Keras float32 | max abs logit diff | min cosine | weights / file MB |\n"
                "|---|---|---|---|---|---|"
            )
            for name, values in rates.items():
                got = outputs[name]
                cosine = np.min(np.sum(got * ref, -1) / (np.linalg.norm(got, axis=-1) * np.linalg.norm(ref, axis=-1)))
                ratio = statistics.median(a / b for a, b in zip(values, base))
                size = paths[name][1]
                print(
                    f"| {name} | {statistics.median(values):.2f} | {ratio:.2f}x | {np.abs(got - ref).max():.3f} | "
                    f"{cosine:.4f} | {f'{size:.0f}' if size else '-'} |"
                )
            print(f"\nload average {', '.join(f'{v:.1f}' for v in os.getloadavg())}\n", flush=True)


if __name__ == "__main__":
    main()
