"""The README's main job on the machine it runs on: held-out accuracy and time in each precision (and backend).

Runs ``python -m keras_vit.training.finetune`` (the offline default: a small ViT trained from scratch on
scikit-learn's digits) once per setting, each in a fresh output folder, and prints a Markdown table with the CPU
(model and the flags that choose the kernels), so the README's figures name the machine they came from::

    python benchmarks/main_job.py                       # --mixed-precision auto and none, TensorFlow
    python benchmarks/main_job.py --backends tensorflow jax
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

from throughput import conditions

ACCURACY = re.compile(r"held-out accuracy: ([0-9.]+) on (\d+) images")


def run_main_job(backend: str, precision: str) -> dict:
    """One run of the main job: accuracy, images scored, wall seconds, and the policy it printed."""
    with tempfile.TemporaryDirectory() as output:
        command = [sys.executable, "-m", "keras_vit.training.finetune", "--output-dir", output]
        env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2")
        start = time.perf_counter()
        done = subprocess.run([*command, "--mixed-precision", precision], capture_output=True, text=True, env=env)
        seconds = time.perf_counter() - start
    found = ACCURACY.search(done.stdout)
    if done.returncode or not found:
        return dict(error=(done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit {done.returncode}"])
    return dict(accuracy=float(found.group(1)), images=int(found.group(2)), seconds=seconds)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", nargs="+", default=["tensorflow"], choices=["tensorflow", "jax", "torch"])
    parser.add_argument("--precisions", nargs="+", default=["auto", "none"])
    args = parser.parse_args(argv)
    print(conditions(), flush=True)
    print("\n| backend | --mixed-precision | held-out accuracy | images | wall s |\n|---|---|---|---|---|")
    for backend in args.backends:
        for precision in args.precisions:
            result = run_main_job(backend, precision)
            if "error" in result:
                print(f"| {backend} | {precision} | error: {result['error'][0]} | | |", flush=True)
            else:
                print(
                    f"| {backend} | {precision} | {result['accuracy']:.4f} | {result['images']} | "
                    f"{result['seconds']:.0f} |",
                    flush=True,
                )
    print(f"\n{conditions()}")


if __name__ == "__main__":
    main()
