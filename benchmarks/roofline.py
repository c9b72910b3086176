"""The machine's matmul peak per precision, measured with the framework's own matmul: the roofline's ceiling.

    python benchmarks/roofline.py [--size 4096] [--repeats 5]

* TensorFlow: ``tf.linalg.matmul`` of two ``size x size`` matrices under ``tf.function``, float32
  and bfloat16, best of ``repeats`` calls (keras_vit imported first, so oneDNN kernels as its users get).
* numpy, float32, in a subprocess: once with ``OPENBLAS_CORETYPE`` and ``OPENBLAS_L2_SIZE`` removed
  from the environment (a machine that sets ``OPENBLAS_CORETYPE=Haswell`` makes OpenBLAS run its
  AVX2 kernels on an AVX-512 CPU), once with the environment as it is; each with the kernel OpenBLAS
  picked (threadpoolctl's ``architecture``, when installed).

* torch (``torch.matmul``), JAX (jitted ``jnp.dot``) and OpenVINO (a one-``MatMul`` model of an input and a
  constant, as a layer's weights are, compiled for the CPU with ``INFERENCE_PRECISION_HINT`` f32 or bf16: the
  precision its runtime computes in, float32 in and out), float32 and bfloat16, each in its own process
  (``--framework``; :func:`framework_peaks` runs them all): every framework's own peak.

``benchmarks/throughput.py`` divides each path's FLOP/s by the TensorFlow peak of its precision and prints
every framework's peak beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

__all__ = ["FRAMEWORKS", "THROTTLE_VARIABLES", "framework_peaks", "matmul_gflops", "numpy_matmul", "tf_matmul_gflops"]

FRAMEWORKS = ("tensorflow", "torch", "jax", "openvino")

THROTTLE_VARIABLES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
_NUMPY_PROBE = """
import json, sys, time
import numpy as np
size, repeats = int(sys.argv[1]), int(sys.argv[2])
a = np.random.default_rng(0).standard_normal((size, size), dtype=np.float32)
a @ a
times = []
for _ in range(repeats):
    start = time.perf_counter(); a @ a; times.append(time.perf_counter() - start)
try:
    from threadpoolctl import threadpool_info
    kernel = ", ".join(f"{i['internal_api']} {i.get('architecture', '?')}" for i in threadpool_info()
                       if i["user_api"] == "blas")
except ImportError:
    kernel = "unknown (no threadpoolctl)"
print(json.dumps({"gflops": 2 * size**3 / min(times) / 1e9, "kernel": kernel}))
"""


def tf_matmul_gflops(dtype: str = "float32", size: int = 4096, repeats: int = 5) -> float:
    """Best-of-``repeats`` GFLOP/s of a ``size x size`` ``tf.linalg.matmul`` in ``dtype`` under ``tf.function``."""
    import tensorflow as tf

    a = tf.cast(tf.random.stateless_normal((size, size), seed=(0, 0)), dtype)
    product = tf.function(lambda x: tf.linalg.matmul(x, x)[:1, :1])  # the slice: no 64 MB copy to host
    return _best_gflops(lambda: product(a).numpy(), size, repeats)


def _best_gflops(product, size: int, repeats: int) -> float:
    """GFLOP/s of the best of ``repeats`` calls of ``product()`` (a ``size``-square matmul, one untimed call first)."""
    product()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        product()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def matmul_gflops(framework: str, dtype: str = "float32", size: int = 4096, repeats: int = 5) -> float:
    """Best-of-``repeats`` GFLOP/s of ``framework``'s own ``size``-square matmul in ``dtype`` (:data:`FRAMEWORKS`)."""
    if framework == "tensorflow":
        return tf_matmul_gflops(dtype, size, repeats)
    if framework == "torch":
        import torch

        a = torch.randn(size, size, generator=torch.Generator().manual_seed(0)).to(getattr(torch, dtype))
        with torch.inference_mode():
            return _best_gflops(lambda: torch.matmul(a, a), size, repeats)
    if framework == "jax":
        import jax
        import jax.numpy as jnp

        a = jax.random.normal(jax.random.key(0), (size, size)).astype(dtype)
        product = jax.jit(lambda x: jnp.dot(x, x))
        return _best_gflops(lambda: product(a).block_until_ready(), size, repeats)
    if framework == "openvino":
        import numpy as np
        import openvino
        import openvino.opset13 as ops

        a = np.random.default_rng(0).standard_normal((size, size), dtype=np.float32)
        x = ops.parameter([size, size], openvino.Type.f32)  # activations times a constant: a layer's weights
        model = openvino.Model([ops.matmul(x, ops.constant(a), False, False)], [x])
        hint = {"float32": "f32", "bfloat16": "bf16"}[dtype]
        compiled = openvino.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": hint})
        request = compiled.create_infer_request()
        return _best_gflops(lambda: request.infer([a]), size, repeats)
    raise ValueError(f"Unknown framework {framework!r}; expected one of {FRAMEWORKS}.")


def framework_peaks(size: int = 4096, repeats: int = 3, env: dict | None = None) -> dict[str, dict]:
    """``{framework: {"float32": GFLOP/s, "bfloat16": GFLOP/s}}`` for each of :data:`FRAMEWORKS` that is
    installed, each measured in a fresh process (``env``: its environment, e.g. the thread count), and numpy's
    float32 (OPENBLAS_CORETYPE/L2_SIZE unset) as ``{"numpy": {"float32": ...}}``; a framework that fails to run
    gets ``{"error": its last line}``."""
    peaks = {}
    for framework in FRAMEWORKS:
        command = [sys.executable, os.path.abspath(__file__), "--framework", framework, "--size", str(size)]
        command += ["--repeats", str(repeats), "--json"]
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, check=False)
        lines = done.stdout.strip().splitlines()
        if done.returncode or not lines:
            peaks[framework] = {"error": (done.stderr.strip().splitlines() or ["failed"])[-1][:200]}
        else:
            peaks[framework] = json.loads(lines[-1])
    peaks["numpy"] = {"float32": numpy_matmul(size, repeats, unthrottled=True)["gflops"]}
    return peaks


def numpy_matmul(size: int = 4096, repeats: int = 3, unthrottled: bool = True) -> dict:
    """``{"gflops", "kernel", "env"}`` of a float32 numpy matmul in a fresh process (best of ``repeats``).

    ``unthrottled`` removes :data:`THROTTLE_VARIABLES` from that process's environment; ``env`` is what it kept.
    """
    env = dict(os.environ)
    if unthrottled:
        for name in THROTTLE_VARIABLES:
            env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-c", _NUMPY_PROBE, str(size), str(repeats)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["env"] = {name: env[name] for name in THROTTLE_VARIABLES if name in env}
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--framework", choices=FRAMEWORKS, help="only this framework's float32 and bfloat16 peaks")
    parser.add_argument("--json", action="store_true", help="with --framework: one JSON line")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if args.framework in (None, "tensorflow"):
        import keras_vit  # noqa: F401  (first: its TensorFlow CPU kernels, oneDNN)
    if args.framework:
        peaks = {
            dtype: matmul_gflops(args.framework, dtype, args.size, args.repeats) for dtype in ("float32", "bfloat16")
        }
        print(
            json.dumps(peaks)
            if args.json
            else f"{args.framework}: " + ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in peaks.items())
        )
        return

    print(f"| matmul {args.size}x{args.size} | GFLOP/s (best of {args.repeats}) |\n|---|---|")
    for dtype in ("float32", "bfloat16"):
        print(f"| TensorFlow tf.linalg.matmul, {dtype} | {tf_matmul_gflops(dtype, args.size, args.repeats):.0f} |")
    for unthrottled in (True, False):
        r = numpy_matmul(args.size, args.repeats, unthrottled)
        env = ", ".join(f"{k}={v}" for k, v in r["env"].items()) or "none set"
        label = "OPENBLAS_CORETYPE/L2_SIZE unset" if unthrottled else f"environment as is ({env})"
        print(f"| numpy float32, {label}; kernel {r['kernel']} | {r['gflops']:.0f} |")


if __name__ == "__main__":
    main()
