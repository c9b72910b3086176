"""Where a step's time goes on torch: keras_vit on ``KERAS_BACKEND=torch`` beside timm, by ``torch.profiler``.

    python benchmarks/torch_profile.py --phase train --batch 8     # B/16, mixed_bfloat16 / autocast
    python benchmarks/torch_profile.py --phase infer --batch 8 --frameworks keras_vit+torch+bf16 timm+bf16

Each framework (a worker name of ``benchmarks/throughput.py`` that runs on torch: ``keras_vit+torch[+bf16]``,
``timm[+bf16]``) runs in its own process, built and compiled as there, two untimed calls, then ``--steps`` calls
under ``torch.profiler`` (CPU activities). Printed per framework: the wall time of a step, and the ``aten`` ops
with the most self CPU time (summed over the threads, so shares of the summed time), side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from throughput import KerasRunner, TimmRunner, _split_spec, backend_of, worker_env  # beside this script


def profile(spec: str, phase: str, batch: int, steps: int, variant: str, image_size: int, top: int) -> dict:
    """``{"step_s", "ops": [(name, self CPU seconds per step, calls per step)], "total_s"}`` of one framework."""
    import torch

    name, options = _split_spec(spec)
    runner = (TimmRunner if name == "timm" else KerasRunner)(name, options, variant, image_size)
    inputs = runner.inputs(batch)
    step = runner.train if phase == "train" else runner.infer
    for _ in range(2):
        step(*inputs)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as trace:
        start = time.perf_counter()
        for _ in range(steps):
            step(*inputs)
        step_s = (time.perf_counter() - start) / steps
    events = [e for e in trace.key_averages() if e.key.startswith("aten::")]
    total = sum(e.self_cpu_time_total for e in events) / 1e6 / steps
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    ops = [(e.key, e.self_cpu_time_total / 1e6 / steps, e.count / steps) for e in events[:top]]
    return {"step_s": step_s, "total_s": total, "ops": ops}


def report(results: dict[str, dict]) -> str:
    lines = []
    for spec, r in results.items():
        lines += [
            f"### {spec}: {r['step_s'] * 1e3:.0f} ms a step, aten self CPU time {r['total_s'] * 1e3:.0f} ms a step",
            "",
            "| op | ms a step | share | calls a step |",
            "|---|---|---|---|",
        ]
        lines += [f"| `{op}` | {s * 1e3:.1f} | {s / r['total_s']:.0%} | {n:.0f} |" for op, s, n in r["ops"]]
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frameworks", nargs="+", default=["keras_vit+torch+bf16", "timm+bf16"])
    parser.add_argument("--phase", choices=("train", "infer"), default="train")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--variant", default="B/16")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--top", type=int, default=15, help="ops listed per framework")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        result = profile(args.worker, args.phase, args.batch, args.steps, args.variant, args.image_size, args.top)
        print(json.dumps(result))
        return
    results = {}
    for spec in args.frameworks:
        if backend_of(spec) != "torch":
            parser.error(f"{spec} does not run on torch (keras_vit+torch..., timm...)")
        command = [sys.executable, os.path.abspath(__file__), "--worker", spec, "--phase", args.phase]
        command += ["--batch", str(args.batch), "--steps", str(args.steps), "--variant", args.variant]
        command += ["--image-size", str(args.image_size), "--top", str(args.top)]
        done = subprocess.run(
            command, capture_output=True, text=True, env=worker_env(spec, args.threads), timeout=1800, check=False
        )
        if done.returncode:
            raise RuntimeError(f"{spec} failed:\n{done.stderr[-3000:]}")
        results[spec] = json.loads(done.stdout.strip().splitlines()[-1])
    print(
        f"load average {', '.join(f'{v:.1f}' for v in os.getloadavg())}; {args.variant} at {args.image_size}px, "
        f"{args.phase} batch {args.batch}, {args.steps} profiled steps\n"
    )
    print(report(results))


if __name__ == "__main__":
    main()
