"""Training memory of keras_vit with and without ``remat=True``, and the largest batch that fits a budget.

    python benchmarks/memory.py --variants B/16 --batches 8 16 32
    python benchmarks/memory.py --variants L/16 --batches 2 4 8 --budget-gb 24

For every variant, ``remat`` setting (``--remat both``, ``on`` or ``off``) and batch, a fresh worker process
builds ``keras_vit.ViT(variant, gelu="exact", remat=...)``, compiles it as ``benchmarks/throughput.py`` does
(SGD with momentum, sparse cross-entropy on logits; TensorFlow, keras_vit's oneDNN kernels) and runs
``--steps`` training steps. It reports the peak resident set size of the process (``VmHWM``) minus its RSS
after the imports (weights, gradients, optimizer state, activations, compiled code) and the median time of
the steps after the first. Workers run one at a time: one at a large batch needs gigabytes.

A straight line through each setting's (batch, peak) points, least squares, gives the memory per image and
the fixed part; the largest batch within ``--budget-gb`` (GiB) is read off that line: an **extrapolation**,
as exact as the line is straight. A batch whose peak the line predicts above ``--max-gb`` (default: 80% of
the available memory of the machine it runs on) is skipped, not run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# benchmarks/throughput.py, beside this script
from throughput import NUM_CLASSES, measure_and_report, peak_rss_mb, rss_mb, worker_env

GIB = 1024.0  # MB per GiB


def worker(variant: str, batch: int, remat: bool, steps: int, image_size: int) -> dict:
    """One setting in this process: ``{"peak_mb", "step_s"}``."""
    import keras_vit  # first: it picks TensorFlow's CPU kernels

    # isort: split
    import keras
    import numpy as np

    baseline = rss_mb()
    model = keras_vit.ViT(variant, image_size=image_size, num_classes=NUM_CLASSES, gelu="exact", remat=remat)
    model.compile(
        optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (batch, image_size, image_size, 3)).astype("float32")
    y = rng.integers(0, NUM_CLASSES, batch)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        model.train_on_batch(x, y)
        times.append(time.perf_counter() - start)
    return {"peak_mb": peak_rss_mb() - baseline, "step_s": statistics.median(times[1:] or times)}


def measure(variant: str, batch: int, remat: bool, args) -> dict:
    """Run :func:`worker` in a fresh process (so its peak is its own)."""
    env = worker_env("keras_vit", args.threads)  # TensorFlow, keras_vit's kernels, passive waits, threads
    command = [sys.executable, os.path.abspath(__file__), "--worker", variant, str(batch), str(int(remat))]
    command += ["--steps", str(args.steps), "--image-size", str(args.image_size)]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"worker {variant} batch {batch} remat={remat} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def fit_line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares ``(fixed, per_image)`` of ``peak = fixed + per_image * batch``; needs two batch sizes."""
    if len({b for b, _ in points}) < 2:
        raise ValueError(f"A line needs two different batch sizes, got {[b for b, _ in points]}.")
    mean_b = statistics.fmean(b for b, _ in points)
    mean_m = statistics.fmean(m for _, m in points)
    slope = sum((b - mean_b) * (m - mean_m) for b, m in points) / sum((b - mean_b) ** 2 for b, _ in points)
    return mean_m - slope * mean_b, slope


def largest_batch(fixed_mb: float, per_image_mb: float, budget_mb: float) -> int:
    """The largest batch whose predicted peak ``fixed + per_image * batch`` stays within ``budget_mb``."""
    if per_image_mb <= 0:
        raise ValueError(f"Memory per image must be positive, got {per_image_mb:.1f} MB.")
    return max(0, int((budget_mb - fixed_mb) // per_image_mb))


def available_mb() -> float:
    with open("/proc/meminfo") as info:
        for line in info:
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) / 1024
    raise RuntimeError("MemAvailable not in /proc/meminfo")


def run(args) -> list[dict]:
    """Every (variant, remat, batch) in turn, smallest batch first, skipping predicted overflows."""
    settings = {"both": (False, True), "off": (False,), "on": (True,)}[args.remat]
    max_mb = args.max_gb * GIB if args.max_gb else 0.8 * available_mb()
    rows = []
    for variant in args.variants:
        for remat in settings:
            points = []
            for batch in sorted(args.batches):
                if len(points) >= 2:
                    fixed, slope = fit_line(points)
                    if fixed + slope * batch > max_mb:
                        print(f"  {variant} remat={remat} b{batch}: skipped, predicted above {max_mb:.0f} MB")
                        continue
                out = measure(variant, batch, remat, args)
                points.append((batch, out["peak_mb"]))
                print(f"  {variant} remat={remat} b{batch}: {out['peak_mb']:.0f} MB, {out['step_s']:.2f} s/step")
                rows.append(dict(variant=variant, remat=remat, batch=batch, **out))
    return rows


def report(rows: list[dict], budget_gb: float) -> str:
    lines = [
        "| variant | remat | batch | peak RSS | s/step | img/s |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['remat']} | {r['batch']} | {r['peak_mb'] / GIB:.2f} GB | {r['step_s']:.2f} "
            f"| {r['batch'] / r['step_s']:.2f} |"
        )
    lines += [
        "",
        f"Linear fit per setting, largest batch within {budget_gb:g} GiB (extrapolated):",
        "",
        "| variant | remat | fixed | per image | largest batch |",
        "|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, bool], list[tuple[int, float]]] = {}
    for r in rows:
        groups.setdefault((r["variant"], r["remat"]), []).append((r["batch"], r["peak_mb"]))
    for (variant, remat), points in groups.items():
        if len({b for b, _ in points}) < 2:
            lines.append(f"| {variant} | {remat} | - | - | needs two batch sizes |")
            continue
        fixed, slope = fit_line(points)
        batch = largest_batch(fixed, slope, budget_gb * GIB)
        lines.append(f"| {variant} | {remat} | {fixed / GIB:.2f} GB | {slope:.0f} MB | {batch} |")
    return "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", default=["B/16"])
    parser.add_argument("--batches", nargs="+", type=int, default=[8, 16, 32])
    parser.add_argument("--remat", choices=("both", "on", "off"), default="both")
    parser.add_argument("--steps", type=int, default=3, help="training steps per setting (the first is not timed)")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--budget-gb", type=float, default=24.0, help="GiB the largest batch must fit in")
    parser.add_argument("--max-gb", type=float, help="skip a batch predicted above this (default: 80%% available)")
    parser.add_argument("--threads", type=int, help="threads per worker (default: all cores)")
    parser.add_argument("--json", help="also write the raw rows here")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.worker and (min(args.batches) < 1 or args.steps < 1):
        parser.error("--batches and --steps must be positive")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        variant, batch, remat = args.worker
        print(json.dumps(worker(variant, int(batch), bool(int(remat)), args.steps, args.image_size)))
        return
    measure_and_report(lambda: run(args), lambda rows: report(rows, args.budget_gb), args.json)


if __name__ == "__main__":
    main()
