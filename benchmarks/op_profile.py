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

``--onednn`` also runs each worker with ``ONEDNN_VERBOSE=1`` and reads the lines oneDNN prints for the
profiled calls: every oneDNN primitive that ran, its implementation (``brg_matmul:avx10_1_512_amx`` is
a matmul on the AMX tiles, ``x64:gemm:jit`` oneDNN's generic gemm), source data type, calls, time and,
for matmuls and inner products, GFLOP/s. With ``--onednn`` a ``timm`` worker (torch's oneDNN, autocast
with ``+bf16``) may run beside the TensorFlow ones: it has oneDNN's report and no TensorFlow trace.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time

from throughput import KerasRunner, TimmRunner, _split_spec, worker_env  # benchmarks/throughput.py, beside this script

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


ONEDNN_MARK = "=== profiled calls ==="  # the worker's stdout: oneDNN's lines after it are the profiled calls'


def onednn_flops(primitive: str, problem: str) -> int:
    """FLOPs (``2*m*n*k``) of a oneDNN ``matmul`` (``"8x12x197x64:8x12x64x197"``, source:weights) or
    ``inner_product`` (``"mb1576ic768oc3072"``) from its verbose problem description; 0 for other primitives."""
    if primitive == "inner_product":
        sizes = {key: int(value) for key, value in re.findall(r"([a-z]+)(\d+)", problem)}
        reduced = math.prod(sizes.get(key, 1) for key in ("ic", "id", "ih", "iw"))
        return 2 * sizes["mb"] * reduced * sizes["oc"]
    if primitive == "matmul":
        source, weights = ([int(v) for v in part.split("x")] for part in problem.split(":")[:2])
        batch = math.prod(max(a, b) for a, b in zip(source[:-2], weights[:-2]))
        return 2 * batch * source[-2] * source[-1] * weights[-1]
    return 0


def onednn_kernels(lines) -> dict[str, dict]:
    """oneDNN's ``ONEDNN_VERBOSE=1`` execution lines summed by ``"primitive implementation dtype"``:
    ``{"calls", "ms", "flops"}`` each (dtype: the source's, blank when the line has none)."""
    kernels: dict[str, dict] = {}
    for line in lines:
        fields = line.strip().split(",")
        if not fields[0].endswith("_verbose") or "exec" not in fields[:5]:
            continue
        at = fields.index("exec")
        primitive, implementation = fields[at + 2], fields[at + 3]
        dtype = re.search(r"src:(\w+)", line)
        key = f"{primitive} {implementation} {dtype[1] if dtype else ''}".strip()
        entry = kernels.setdefault(key, {"calls": 0, "ms": 0.0, "flops": 0})
        entry["calls"] += 1
        entry["ms"] += float(fields[-1])
        entry["flops"] += onednn_flops(primitive, fields[-2])
    return kernels


def worker(spec: str, variant: str, image_size: int, phase: str, batch: int, steps: int) -> dict:
    """Profile ``steps`` calls of one phase in this process: ``{"wall_us", "ops"}`` per step."""
    name, options = _split_spec(spec)
    if name == "timm":
        import torch  # noqa: F401  (before anything that might pull TensorFlow in)
    elif name == "keras_vit":
        import keras_vit  # noqa: F401  (first: it picks TensorFlow's CPU kernels)
    runner = (TimmRunner if name == "timm" else KerasRunner)(name, options, variant, image_size)
    x, y = runner.inputs(batch)
    step = runner.train if phase == "train" else runner.infer
    for _ in range(2):
        step(x, y)
    print(ONEDNN_MARK, flush=True)
    if name == "timm":
        start = time.perf_counter()
        for _ in range(steps):
            step(x, y)
        return {"wall_us": (time.perf_counter() - start) / steps * 1e6, "ops": {}}
    import tensorflow as tf

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
        env = worker_env(spec, args.threads)
        if args.onednn:
            env["ONEDNN_VERBOSE"] = "1"
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        if done.returncode:
            raise RuntimeError(f"worker {spec} failed:\n{done.stderr[-3000:]}")
        *printed, last = done.stdout.strip().splitlines()
        results[spec] = json.loads(last)
        if args.onednn:
            profiled = printed[printed.index(ONEDNN_MARK) + 1 :]
            kernels = onednn_kernels(profiled)
            for entry in kernels.values():
                entry.update(calls=entry["calls"] / args.steps, ms=entry["ms"] / args.steps)
            results[spec]["onednn"] = kernels
        print(f"  {spec}: {results[spec]['wall_us'] / 1e6:.2f} s per step", file=sys.stderr)
    return results


def report(results: dict[str, dict], top: int) -> str:
    """TensorFlow's op time by category and the top op types (the TensorFlow workers), then oneDNN's kernels."""
    specs = [s for s, r in results.items() if r["ops"]]
    totals = {s: sum(results[s]["ops"].values()) for s in specs}
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
    walls = ", ".join(f"{s} {r['wall_us'] / 1e3:.0f} ms" for s, r in results.items() if not r["ops"])
    if walls:
        lines += ["", f"Wall time per step, no TensorFlow trace: {walls}"]
    if any("onednn" in r for r in results.values()):
        lines += ["", onednn_report(results)]
    return "\n".join(lines)


def onednn_report(results: dict[str, dict]) -> str:
    """oneDNN's primitives per step, side by side: calls, time, GFLOP/s; and the AMX kernels' share of the time."""
    specs = [s for s in results if "onednn" in results[s]]
    totals = {s: sum(e["ms"] for e in results[s]["onednn"].values()) for s in specs}
    lines = [
        "oneDNN primitives per step (ONEDNN_VERBOSE=1): calls, ms and share of oneDNN's time, GFLOP/s:",
        "",
        "| primitive implementation dtype | " + " | ".join(specs) + " |",
        "|---" * (1 + len(specs)) + "|",
    ]
    keys = collections.Counter()
    for s in specs:
        keys.update({k: e["ms"] / totals[s] for k, e in results[s]["onednn"].items()})
    for key, _ in keys.most_common():
        cells = []
        for s in specs:
            e = results[s]["onednn"].get(key)
            rate = f", {e['flops'] / e['ms'] / 1e6:.0f} GFLOP/s" if e and e["flops"] and e["ms"] else ""
            cells.append(f"{e['calls']:g} x, {e['ms']:.0f} ms ({e['ms'] / totals[s]:.0%}){rate}" if e else "-")
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    amx = {s: sum(e["ms"] for k, e in results[s]["onednn"].items() if "amx" in k) for s in specs}
    lines.append(
        "| on AMX kernels (`amx` in the name) | "
        + " | ".join(_cell(amx[s] * 1e3, totals[s] * 1e3) for s in specs)
        + " |"
    )
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
    parser.add_argument("--onednn", action="store_true", help="also oneDNN's kernels, from ONEDNN_VERBOSE=1")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for spec in args.frameworks:
        if _split_spec(spec)[0] == "timm" and not args.onednn:
            parser.error("timm is torch: it has oneDNN's report only (--onednn), no TensorFlow trace")
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
