"""Where a step's time goes: TensorFlow's profiler trace of keras_vit and keras-hub, summarised by op.

    python benchmarks/op_profile.py --phase infer --batch 32           # B/16 inference
    python benchmarks/op_profile.py --phase train --batch 8            # one training step
    python benchmarks/op_profile.py --frameworks keras_vit keras_vit+bf16 keras_hub+bf16 --steps 2

Each framework (a worker name of ``benchmarks/throughput.py``, options after ``+`` included) runs in
its own process, built and compiled as there: ``predict_on_batch`` or ``train_on_batch``, two untimed
calls, then ``--steps`` calls under ``tf.profiler.experimental`` (a host trace). The trace's
``.xplane.pb`` is read here: every TensorFlow op the executors ran, its type (``_MklFusedMatMul``,
``Erf``, ...) and its duration. Printed: the wall time of a step, the op time by category and the
top op types, each as a share of the summed op time (ops can overlap on two threads, so the sum can
exceed the wall time), per framework side by side.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

from throughput import KerasRunner, _split_spec, worker_env  # benchmarks/throughput.py, beside this script

# Op types to categories, by substring of the type, first match wins (oneDNN's ops carry an _Mkl prefix).
CATEGORIES = (
    ("attention matmul", ("BatchMatMul", "Einsum")),
    ("dense matmul", ("MatMul", "Conv2D")),
    ("softmax", ("Softmax",)),
    ("GELU", ("Erf", "Gelu", "Tanh", "Pow")),
    ("layout copy", ("Transpose", "ConcatV2", "Pack", "Unpack", "StridedSlice", "Split", "Slice", "BroadcastTo")),
    ("variables, optimizer", ("Variable", "ResourceApply")),
    ("reductions", ("Mean", "Sum", "Max", "SquaredDifference", "Rsqrt", "Sqrt")),
    ("elementwise", ("Add", "Mul", "Sub", "RealDiv", "Neg", "Square", "Select", "Cast", "Relu", "Exp", "UnaryOps")),
    ("bookkeeping", ("Reshape", "Identity", "Shape", "Const", "NoOp")),
)


def category(op_type: str) -> str:
    """The category of an op type (:data:`CATEGORIES`), ``"other"`` when none matches."""
    for name, patterns in CATEGORIES:
        if any(p in op_type for p in patterns):
            return name
    return "other"


def op_times(xplane_path: str) -> dict[str, float]:
    """Microseconds per op type in a host trace: events named ``scope/op_name:OpType`` on executor lines."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(xplane_path, "rb") as trace:
        space.ParseFromString(trace.read())
    times: dict[str, float] = collections.Counter()
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            if line.name == "python":
                continue
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if ":" in name and "::" not in name:
                    times[name.rsplit(":", 1)[1]] += event.duration_ps / 1e6
    return dict(times)


def worker(spec: str, variant: str, image_size: int, phase: str, batch: int, steps: int) -> dict:
    """Profile ``steps`` calls of one phase in this process: ``{"wall_us", "ops"}`` per step."""
    name, options = _split_spec(spec)
    if name == "keras_vit":
        import keras_vit  # noqa: F401  (first: it picks TensorFlow's CPU kernels)
    import tensorflow as tf

    runner = KerasRunner(name, options, variant, image_size)
    x, y = runner.inputs(batch)
    step = runner.train if phase == "train" else runner.infer
    for _ in range(2):
        step(x, y)
    logdir = tempfile.mkdtemp(prefix="vit-profile-")
    tf.profiler.experimental.start(logdir)
    start = time.perf_counter()
    for _ in range(steps):
        step(x, y)
    wall = time.perf_counter() - start
    tf.profiler.experimental.stop()
    (path,) = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
    ops = {op: us / steps for op, us in op_times(path).items()}
    return {"wall_us": wall / steps * 1e6, "ops": ops}


def run(args) -> dict[str, dict]:
    results = {}
    for spec in args.frameworks:
        command = [sys.executable, os.path.abspath(__file__), "--worker", spec, "--phase", args.phase]
        command += ["--batch", str(args.batch), "--steps", str(args.steps), "--variant", args.variant]
        command += ["--image-size", str(args.image_size)]
        done = subprocess.run(command, capture_output=True, text=True, env=worker_env(spec, args.threads))
        if done.returncode:
            raise RuntimeError(f"worker {spec} failed:\n{done.stderr[-3000:]}")
        results[spec] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"  {spec}: {results[spec]['wall_us'] / 1e6:.2f} s per step", file=sys.stderr)
    return results


def report(results: dict[str, dict], top: int) -> str:
    specs = list(results)
    totals = {s: sum(r["ops"].values()) for s, r in results.items()}
    lines = [
        "| | " + " | ".join(specs) + " |",
        "|---" * (1 + len(specs)) + "|",
        "| wall time per step | " + " | ".join(f"{results[s]['wall_us'] / 1e3:.0f} ms" for s in specs) + " |",
        "| summed op time | " + " | ".join(f"{totals[s] / 1e3:.0f} ms" for s in specs) + " |",
    ]
    by_category = {s: collections.Counter() for s in specs}
    for s in specs:
        for op, us in results[s]["ops"].items():
            by_category[s][category(op)] += us
    names = [name for name, _ in CATEGORIES] + ["other"]
    for name in sorted(names, key=lambda n: -by_category[specs[0]][n]):
        lines.append(f"| {name} | " + " | ".join(_cell(by_category[s][name], totals[s]) for s in specs) + " |")
    lines += ["", "Top op types:", "", "| op type | " + " | ".join(specs) + " |", "|---" * (1 + len(specs)) + "|"]
    ranked = collections.Counter()
    for s in specs:
        ranked.update({op: us / totals[s] for op, us in results[s]["ops"].items()})
    for op, _ in ranked.most_common(top):
        lines.append(f"| {op} | " + " | ".join(_cell(results[s]["ops"].get(op, 0.0), totals[s]) for s in specs) + " |")
    return "\n".join(lines)


def _cell(us: float, total: float) -> str:
    return f"{us / 1e3:.0f} ms ({us / total:.0%})" if us else "-"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frameworks", nargs="+", default=["keras_vit", "keras_hub"])
    parser.add_argument("--variant", default="B/16")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--phase", choices=("infer", "train"), default="infer")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=1, help="profiled calls (after two untimed ones)")
    parser.add_argument("--threads", type=int, default=2, help="threads per framework")
    parser.add_argument("--top", type=int, default=15, help="op types listed")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for spec in args.frameworks:
        if _split_spec(spec)[0] == "timm":
            parser.error("timm is torch: this script profiles TensorFlow workers only")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        out = worker(args.worker, args.variant, args.image_size, args.phase, args.batch, args.steps)
        print(json.dumps(out))
        return
    from throughput import measure_and_report

    title = f"ViT {args.variant} at {args.image_size}px, {args.phase} batch {args.batch}, {args.steps} profiled step(s)"
    measure_and_report(lambda: run(args), lambda results: f"{title}\n{report(results, args.top)}")


if __name__ == "__main__":
    main()
