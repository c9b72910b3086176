"""ViT throughput and MFU on one accelerator: keras-vit on JAX next to timm under ``torch.compile``.

One prepared script for a GPU machine with JAX and PyTorch (CUDA), timm and torchvision, and no
TensorFlow; keras-vit must be installed there (``benchmarks/gpu_device.sh`` installs it and Keras)::

    python benchmarks/gpu.py --models B/16 L/16 --batch 256 --out results.json
    KERAS_BACKEND=jax python benchmarks/gpu.py --tiny     # CPU smoke test: tiny model, batch 4

What runs, each in its own subprocess one after the other (so each has the device to itself and a
failure or a timeout costs one row, not the run):

* ``peak``: the chip's bfloat16 matmul peak, ``jnp.dot`` of two 8192x8192 bfloat16 matrices under
  ``jax.jit``, best of ``--peak-repeats`` (1024 with ``--tiny``).
* ``keras_vit`` per model: ``keras_vit.ViT(model, gelu="exact")`` on the JAX backend under the
  ``mixed_bfloat16`` policy, ``compile(AdamW, jit_compile=True)``: ``train_on_batch`` (one XLA
  program: forward, backward, update) and ``predict_on_batch`` at ``--batch``.
  Memory: L/16 at batch 256 in bfloat16 needs an estimated 90 GB of activations without
  rematerialisation (fits an H200's 141 GB; on an 80 GB chip lower ``--batch``).
* ``timm`` per model: ``vit_{base,large}_patch16_224`` under ``torch.compile``, bfloat16
  autocast, channels_last inputs, fused AdamW: the same two phases.

Each phase runs ``--warmup`` untimed steps (compilation), then ``--steps`` timed ones; a step is
synchronised (``train_on_batch`` returns host floats, torch calls ``cuda.synchronize``). MFU is the
model's analytic FLOP/s over the measured peak: per block ``2*N*(4*D^2 + 2*D*M) + 4*N^2*D``
(``24*N*D^2 + 4*N^2*D`` for the usual ``M = 4*D``), plus the patch embedding and the head; a
training step counts 3x the forward pass. Prints a Markdown table; ``--out`` writes the JSON (after
every worker, so a run cut short keeps what finished).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

__all__ = ["forward_flops", "keras_vit_step", "main", "markdown"]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMM_SIZES = {"Ti": "tiny", "S": "small", "B": "base", "L": "large", "H": "huge"}
# Dense bfloat16 datasheet peaks (TFLOP/s), for comparison only; MFU uses the measured peak.
SPEC_BF16_TFLOPS = {"H100 PCIe": 756.0, "H100": 989.4, "H200": 989.4, "A100": 312.0, "L4": 121.0, "A10": 125.0}
CPU_RUNTIME_FRAMES = ("ThunkExecutor", "Await")  # on CPU threads, frames around the ops, not ops
TINY = dict(models=["Ti/16"], image_size=32, depth=2, num_classes=10, batch=4, steps=2, warmup=1, peak_size=1024)


def forward_flops(depth: int, width: int, mlp_dim: int, patch: int, image_size: int, num_classes: int) -> float:
    """Analytic matmul FLOPs of one image through a class-token ViT (``2*m*n*k`` per matmul)."""
    patches = (image_size // patch) ** 2
    n = patches + 1
    block = 2 * n * (4 * width * width + 2 * width * mlp_dim) + 4 * n * n * width
    return float(2 * patches * patch * patch * 3 * width + depth * block + 2 * width * num_classes)


def _shape(model: str, args) -> dict:
    """Depth, width, MLP size and patch of a variant name, with ``--tiny``'s depth override."""
    from keras_vit.variants import parse_variant

    arch = parse_variant(model)
    depth = args.depth or arch.depth
    return dict(depth=depth, width=arch.hidden_size, mlp_dim=arch.mlp_dim, patch=arch.patch_size, heads=arch.num_heads)


def _timed(step, warmup: int, steps: int) -> dict:
    """Run ``step`` ``warmup`` times untimed (the first one timed as compile), then ``steps`` timed."""
    start = time.perf_counter()
    step()
    compile_s = time.perf_counter() - start
    for _ in range(max(0, warmup - 1)):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return dict(compile_s=compile_s, step_s=statistics.median(times), mean_s=sum(times) / len(times))


# ----------------------------------------------------------------------------------------------
# Workers (each runs in its own process and prints one JSON line)


def worker_peak(args) -> dict:
    """Best-of-N GFLOP/s of a jitted ``size x size`` bfloat16 ``jnp.dot`` on JAX's default device."""
    import jax
    import jax.numpy as jnp

    size = args.peak_size
    key_a, key_b = jax.random.split(jax.random.PRNGKey(0))
    a = jax.random.normal(key_a, (size, size), jnp.bfloat16)
    b = jax.random.normal(key_b, (size, size), jnp.bfloat16)
    dot = jax.jit(jnp.dot)
    dot(a, b).block_until_ready()
    best = float("inf")
    for _ in range(args.peak_repeats):
        start = time.perf_counter()
        dot(a, b).block_until_ready()
        best = min(best, time.perf_counter() - start)
    device = jax.devices()[0]
    return dict(
        peak_tflops=2 * size**3 / best / 1e12,
        size=size,
        device=str(device.device_kind),
        platform=device.platform,
        jax=jax.__version__,
    )


def keras_vit_step(args, **options):
    """keras-vit compiled for one JAX train step under ``args.policy``: (model, x, y, facts); ``options``:
    ``keras_vit.ViT`` options beside (or instead of) the table's."""
    os.environ["KERAS_BACKEND"] = "jax"
    import jax
    import keras
    import numpy as np

    import keras_vit

    keras.mixed_precision.set_global_policy(args.policy)
    for setting in getattr(args, "layer_setting", None) or []:  # e.g. PAD_ODD_ATTENTION=false
        name, _, value = setting.partition("=")
        setattr(keras_vit.layers, name, {"true": True, "false": False}.get(value.lower(), value))
    options = {"image_size": args.image_size, "num_classes": args.num_classes, "gelu": "exact", **options}
    if args.depth:
        options.setdefault("depth", args.depth)
    model = keras_vit.ViT(args.model, **options)
    model.compile(
        optimizer=keras.optimizers.AdamW(1e-4),
        jit_compile=True,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    rng = np.random.default_rng(0)
    x = jax.device_put(rng.uniform(-1, 1, (args.batch, args.image_size, args.image_size, 3)).astype("float32"))
    y = jax.device_put(rng.integers(0, args.num_classes, args.batch).astype("int32"))
    facts = dict(
        params=model.count_params(),
        backend=keras.backend.backend(),
        keras=keras.__version__,
        policy=args.policy,
        device=str(jax.devices()[0].device_kind),
    )
    return model, x, y, facts


def worker_keras_vit(args) -> dict:
    """keras-vit on the JAX backend: ``train_on_batch`` and ``predict_on_batch`` under ``args.policy``."""
    import jax

    model, x, y, result = keras_vit_step(args)
    result["train"] = _timed(lambda: model.train_on_batch(x, y), args.warmup, args.steps)
    result["infer"] = _timed(lambda: model.predict_on_batch(x), args.warmup, args.steps)
    stats = getattr(jax.devices()[0], "memory_stats", lambda: None)() or {}
    if "peak_bytes_in_use" in stats:
        result["peak_gb"] = stats["peak_bytes_in_use"] / 1e9
    return result


def summarize_trace(path: str, top: int = 15) -> dict:
    """Where a JAX profile's time went: total and top op (kernel) names of a Perfetto trace (``.json.gz``).

    Counts complete events on the accelerator's processes (``/device:...``); on a CPU, where there are
    none, on XLA's worker threads (``tf_XLA...``). Names that differ only in a numeric suffix
    (``fusion.12``, ``fusion.40``) are added together.
    """
    import collections
    import gzip
    import re

    with gzip.open(path, "rt") as handle:
        trace = json.load(handle)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    processes = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    threads = {
        (e["pid"], e.get("tid")): e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"
    }
    devices = {pid for pid, name in processes.items() if name.startswith("/device:")}

    def counted(event) -> bool:
        if event.get("ph") != "X" or event["name"].startswith("end:"):
            return False
        if devices:
            return event["pid"] in devices
        thread = threads.get((event["pid"], event.get("tid")), "")
        return thread.startswith("tf_XLA") and not any(word in event["name"] for word in CPU_RUNTIME_FRAMES)

    totals: collections.Counter = collections.Counter()
    for event in filter(counted, events):
        totals[re.sub(r"[._]\d+$", "", event["name"])] += float(event.get("dur", 0)) / 1e3
    total_ms = sum(totals.values())
    return dict(
        where="device" if devices else "cpu threads",
        total_ms=total_ms,
        top=[dict(name=name, ms=ms, share=ms / total_ms) for name, ms in totals.most_common(top)],
    )


def worker_profile(args) -> dict:
    """One ``jax.profiler`` trace of ``--profile-steps`` keras-vit train steps, summarised (top ops by time)."""
    import glob
    import tempfile

    import jax

    model, x, y, result = keras_vit_step(args)
    for _ in range(max(1, args.warmup)):
        model.train_on_batch(x, y)
    log_dir = tempfile.mkdtemp(prefix="keras_vit_trace_")
    with jax.profiler.trace(log_dir, create_perfetto_trace=True):
        for _ in range(args.profile_steps):
            model.train_on_batch(x, y)
    (path,) = glob.glob(os.path.join(log_dir, "**", "perfetto_trace.json.gz"), recursive=True)
    result.update(summarize_trace(path), steps=args.profile_steps, trace=path)
    return result


def worker_timm(args) -> dict:
    """timm under ``torch.compile``, bfloat16 autocast, channels_last: one AdamW step and inference."""
    import timm
    import torch

    device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    size, _, patch = args.model.partition("/")
    options = dict(depth=args.depth) if args.depth else {}
    model = timm.create_model(
        f"vit_{TIMM_SIZES[size]}_patch{patch}_224",
        pretrained=False,
        img_size=args.image_size,
        num_classes=args.num_classes,
        **options,
    )
    model = model.to(device, memory_format=torch.channels_last)
    compiled = torch.compile(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
    generator = torch.Generator().manual_seed(0)
    x = torch.rand((args.batch, 3, args.image_size, args.image_size), generator=generator) * 2 - 1
    x = x.to(device, memory_format=torch.channels_last)
    y = torch.randint(0, args.num_classes, (args.batch,), generator=generator).to(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def train():
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(compiled(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()

    def infer():
        with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16):
            compiled(x)
        sync()

    result = dict(
        params=sum(p.numel() for p in model.parameters()),
        torch=torch.__version__,
        timm=timm.__version__,
        device=torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
    )
    model.train()
    result["train"] = _timed(train, args.warmup, args.steps)
    model.eval()
    result["infer"] = _timed(infer, args.warmup, args.steps)
    if device == "cuda":
        result["peak_gb"] = torch.cuda.max_memory_allocated() / 1e9
    return result


WORKERS = {"peak": worker_peak, "keras_vit": worker_keras_vit, "timm": worker_timm, "profile": worker_profile}


# ----------------------------------------------------------------------------------------------
# The driver


def _run_worker(name: str, model: str | None, args) -> dict:
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        name,
        "--batch",
        str(args.batch),
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--image-size",
        str(args.image_size),
        "--num-classes",
        str(args.num_classes),
        "--policy",
        args.policy,
        "--peak-size",
        str(args.peak_size),
        "--peak-repeats",
        str(args.peak_repeats),
        "--profile-steps",
        str(args.profile_steps),
    ]
    command += ["--model", model] if model else []
    command += [arg for setting in args.layer_setting for arg in ("--layer-setting", setting)]
    command += ["--depth", str(args.depth)] if args.depth else []
    command += ["--tiny"] if args.tiny else []
    env = dict(os.environ, KERAS_BACKEND="jax")
    env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")
    if args.tiny:
        env.update(JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="")
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=args.worker_timeout)
    except subprocess.TimeoutExpired:
        return dict(error=f"timed out after {args.worker_timeout} s")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        return dict(error=f"exit {done.returncode}: {done.stderr.strip()[-1500:]}")
    result = json.loads(lines[-1])
    result["wall_s"] = time.perf_counter() - start
    return result


def markdown(results: dict, args) -> str:
    """The results as a Markdown table: img/s, TFLOP/s and MFU per model, framework and phase."""
    peak = results.get("peak", {})
    peak_tflops = peak.get("peak_tflops")
    lines = [
        f"Device: {peak.get('device', '?')} ({peak.get('platform', '?')}); bf16 matmul peak "
        + (
            f"{peak_tflops:.3g} TFLOP/s ({peak['size']}^2 jnp.dot, best of {args.peak_repeats})"
            if peak_tflops
            else f"not measured: {peak.get('error', '?')}"
        ),
        "",
        "| model | framework | phase | batch | img/s | step ms | TFLOP/s | MFU (measured peak) | compile s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    spec = next((v for k, v in SPEC_BF16_TFLOPS.items() if k in peak.get("device", "")), None)
    for model, per_framework in results.get("models", {}).items():
        for framework, r in per_framework.items():
            if "error" in r:
                lines.append(f"| {model} | {framework} | - | {args.batch} | error | | | | |")
                continue
            for phase in ("train", "infer"):
                seconds = r[phase]["step_s"]
                tflops = r["flops"] * args.batch * (3 if phase == "train" else 1) / seconds / 1e12
                mfu = f"{tflops / peak_tflops:.1%}" if peak_tflops else "-"
                lines.append(
                    f"| {model} | {framework} | {phase} | {args.batch} | {args.batch / seconds:.1f} | "
                    f"{seconds * 1e3:.1f} | {tflops:.3g} | {mfu} | {r[phase]['compile_s']:.1f} |"
                )
        pair = [per_framework.get(f, {}) for f in ("keras_vit", "timm")]
        if all("train" in p for p in pair):
            ratios = [pair[1][p]["step_s"] / pair[0][p]["step_s"] for p in ("train", "infer")]
            lines.append(f"| {model} | keras_vit / timm | train {ratios[0]:.2f}x, infer {ratios[1]:.2f}x | | | | | | |")
    if spec:
        lines += [
            "",
            f"Datasheet dense bf16 peak of this chip: {spec:.0f} TFLOP/s (MFU against it: x "
            f"{peak_tflops / spec:.2f} of the column above)."
            if peak_tflops
            else "",
        ]
    profile = results.get("profile")
    if profile and "top" in profile:
        lines += [
            "",
            f"Profile: keras_vit {profile['model']} train step, {profile['steps']} steps traced, "
            f"{profile['total_ms'] / profile['steps']:.1f} ms of ops per step on the {profile['where']}:",
            "",
            "| op | ms per step | share |",
            "|---|---|---|",
            *(
                f"| `{op['name'][:80]}` | {op['ms'] / profile['steps']:.2f} | {op['share']:.1%} |"
                for op in profile["top"]
            ),
        ]
    errors = [
        f"{m} {f}: {r['error']}" for m, pf in results.get("models", {}).items() for f, r in pf.items() if "error" in r
    ]
    if profile and "error" in profile:
        errors.append(f"profile {profile['model']}: {profile['error']}")
    return "\n".join(lines + (["", "Errors:", *errors] if errors else []))


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["B/16", "L/16"])
    parser.add_argument("--frameworks", nargs="+", default=["keras_vit", "timm"], choices=["keras_vit", "timm"])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per phase")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per phase (the first compiles)")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--num-classes", type=int, default=1000)
    parser.add_argument("--depth", type=int, default=0, help="override the variant's depth (0: the variant's)")
    parser.add_argument("--policy", default="mixed_bfloat16", help="Keras dtype policy of keras_vit")
    parser.add_argument(
        "--layer-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a keras_vit.layers setting for keras_vit's workers (PAD_ODD_ATTENTION=false); repeatable",
    )
    parser.add_argument("--peak-size", type=int, default=8192)
    parser.add_argument("--peak-repeats", type=int, default=10)
    parser.add_argument("--profile", metavar="MODEL", help="also trace keras-vit train steps of MODEL (jax.profiler)")
    parser.add_argument("--profile-steps", type=int, default=3, help="train steps in the --profile trace")
    parser.add_argument("--worker-timeout", type=float, default=900, help="seconds per worker process")
    parser.add_argument("--tiny", action="store_true", help="CPU smoke test: Ti/16 at 32 px, depth 2, batch 4")
    parser.add_argument("--out", help="write the JSON results here")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if args.tiny and not args.worker:  # tiny values, unless given explicitly
        for key, value in TINY.items():
            if f"--{key.replace('_', '-')}" not in argv:
                setattr(args, key, value)
    return args


def main(argv=None) -> dict | None:
    """Run the workers in turn, print the Markdown table, return (and write) the results."""
    args = parse_args(argv)
    os.environ.setdefault("KERAS_BACKEND", "jax")  # keras_vit's variant table loads Keras: never TensorFlow here
    if args.worker:
        print(json.dumps(WORKERS[args.worker](args)), flush=True)
        return None
    results: dict = {"args": vars(args), "models": {}}

    def save():
        if args.out:
            with open(args.out, "w") as out:
                json.dump(results, out, indent=1)

    results["peak"] = _run_worker("peak", None, args)
    save()
    for model in args.models:
        shape = _shape(model, args)
        flops = forward_flops(
            shape["depth"], shape["width"], shape["mlp_dim"], shape["patch"], args.image_size, args.num_classes
        )
        per_framework = results["models"].setdefault(model, {})
        for framework in args.frameworks:
            print(f"running {framework} {model} ...", file=sys.stderr, flush=True)
            per_framework[framework] = dict(_run_worker(framework, model, args), flops=flops)
            save()
    if args.profile:
        print(f"profiling keras_vit {args.profile} ...", file=sys.stderr, flush=True)
        results["profile"] = dict(_run_worker("profile", args.profile, args), model=args.profile)
        save()
    print(markdown(results, args))
    return results


if __name__ == "__main__":
    main()
