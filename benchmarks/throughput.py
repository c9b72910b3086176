"""ViT throughput side by side: keras_vit, keras-hub and timm on the CPU it runs on, in images/s.

Two modes:

* ``python benchmarks/throughput.py`` (the comparison): for each ``--variants`` entry (default
  ``B/16``; ``Ti/16 L/16`` as time allows) and each framework it measures inference at batch 1 and
  ``--batch`` (32) and a training step (forward + backward + SGD-momentum update, ``--train-batch``
  32; lower it to fit in minutes, and in memory: all workers live at once and B/16 training takes
  about 3 GB per framework at batch 8, an estimated 10 GB at 32) and prints images/s, the paired
  ratio keras_vit / peer, the FLOP/s reached as a fraction of the matmul peak of the path's own
  precision (float32, or bfloat16 for ``+bf16`` workers), and the peak memory of each.
* ``python benchmarks/throughput.py --predict`` (the simple one): images/s of ``ViT_B16`` at 224,
  batch 8, through the inference paths of one process: ``predict_on_batch`` (Keras' CPU default),
  ``model.predict`` on a ``tf.data.Dataset`` and on a NumPy array, ``jit_compile=True`` (XLA),
  ``mixed_bfloat16`` and an eager ``model(x)`` call.

Method. Every framework runs in its own long-lived worker process (``--worker``; TensorFlow then
timm in one process segfaults, and separate processes give separate memory figures). The driver
sends the workers one measurement at a time, in turn, rotating the order every round, so all see
the same machine load; each number is the median over ``--rounds`` rounds and each ratio the median
of the per-round ratios. The first call of every phase (tracing, compilation) is not timed.
Memory is the peak resident set size during a phase's first round (``VmHWM`` after a reset through
``/proc/self/clear_refs``; Linux) minus the RSS once the framework was imported: weights, activations,
gradients and optimizer state, compiled code. Phases run in the order batch 1, batch N, training,
so a later phase's peak includes what the earlier ones kept. FLOPs are counted analytically:
``2*m*n*k`` for every matmul of the patch embedding, qkv, attention (q k^T and probs v), output
projection, MLP and head; a training step counts 3x the forward pass.

The machine. The report opens with the CPU model, the flags that decide which kernels run (AMX,
AVX-512, bfloat16), the oneDNN versions TensorFlow and torch carry, and every framework's own matmul peak
(``benchmarks/roofline.py``: TensorFlow, torch, JAX in float32 and bfloat16, numpy float32), measured
once before the rounds, each in a fresh process with ``--threads``. ``--quick`` is a smoke run: Ti/16 at
64 px, batches 2, one short round, 512-square peaks.

The roofline. Every round a ``peak`` worker (TensorFlow with keras_vit's kernels) times a
4096x4096 ``tf.linalg.matmul`` under ``tf.function`` in float32 and in bfloat16 (best of
``--peak-repeats``), and numpy's float32 matmul runs in a subprocess with ``OPENBLAS_CORETYPE`` and
``OPENBLAS_L2_SIZE`` unset (``benchmarks/roofline.py``). Each precision's peak is the best over the
run (contention only ever lowers a measurement); numpy's is printed beside it, not used: OpenBLAS
is not what any of the workers runs, and a machine that sets ``OPENBLAS_CORETYPE`` throttles it.

Workers: ``keras_vit`` (``keras_vit.ViT(variant, gelu="exact")``, what timm and keras-hub compute),
``keras_hub`` (``keras_hub.models.ViTImageClassifier`` on a ``ViTBackbone`` of the same shape: a
Dense head on the class token) and ``timm`` (``vit_{tiny,small,base,large}_patch16_224`` on torch
CPU, eager). Each worker imports its library first, as a user's program does, and so gets that
library's choice of TensorFlow CPU kernels: oneDNN for keras_vit (``keras_vit/runtime.py``),
TensorFlow's own default for keras-hub (Eigen on CPUs without AVX-512); the worker list prints
which ran. A TF worker name takes options after ``+``: ``+xla`` (``compile(jit_compile=True)``),
``+onednn`` / ``+eigen`` (``TF_ENABLE_ONEDNN_OPTS=1`` / ``0``), ``+bf16`` (``mixed_bfloat16``),
``+remat`` (keras_vit only: ``ViT(remat=True)``, blocks recomputed in the backward pass), ``+jax`` /
``+torch`` / ``+openvino`` (the Keras backend, TensorFlow by default: the tables' backend column; ``+xla`` is
JAX's default, and on torch Keras' ``jit_compile=True``, ``torch.compile`` of its steps; OpenVINO runs inference
only, its training cells print ``-``, and computes in the precision its runtime picks, bfloat16 on CPUs with
bfloat16 units, on its own thread pool of every core),
e.g. ``--frameworks keras_vit keras_hub keras_hub+onednn keras_vit+eigen timm`` (the same kernels
side by side); ``timm+bf16`` runs timm under ``torch.autocast("cpu", torch.bfloat16)``, ``timm+compile``
its model through ``torch.compile`` (inductor; the compilation is the untimed first call). Workers get
``OMP_WAIT_POLICY=PASSIVE`` (unless set): on a shared, oversubscribed machine torch's spinning
OpenMP threads otherwise lose 3-5x; ``--threads N`` pins every framework to N threads. Keras models run
``predict_on_batch`` / ``train_on_batch`` after ``compile(SGD(0.01, momentum=0.9),
SparseCategoricalCrossentropy(from_logits=True))``; keras_vit's inference runs what ``python -m keras_vit.predict``
runs, ``keras_vit.for_inference(model)`` (under ``+bf16`` the weights cast to bfloat16 once); timm
runs ``model(x)`` under ``torch.inference_mode()`` and a plain ``loss.backward(); opt.step()``.

Peers are not dependencies of keras-vit. timm and torch come with the ``reference`` extra. Install
keras-hub *without* its dependencies, as its requirements pull the full ``tensorflow`` wheel over
``tensorflow-cpu``::

    pip install --no-deps keras-hub kagglehub kagglesdk regex sentencepiece tokenizers
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

from roofline import framework_peaks, numpy_matmul  # benchmarks/roofline.py, beside this script

ONEDNN_VARIABLE = "TF_ENABLE_ONEDNN_OPTS"  # as keras_vit.runtime; not imported: that loads keras_vit
FRAMEWORKS = ("keras_vit", "keras_hub", "timm")
BACKENDS = ("jax", "torch", "openvino")  # Keras backends a Keras worker may take instead of TensorFlow
TF_OPTIONS = ("xla", "onednn", "eigen", "bf16", "remat", *BACKENDS)
TIMM_OPTIONS = ("bf16", "compile")
PEAK = "peak"  # the worker that measures the matmul peaks
TIMM_SIZES = {"Ti": "tiny", "S": "small", "B": "base", "L": "large", "H": "huge"}
NUM_CLASSES = 1000


# ----------------------------------------------------------------------------------------------
# Analytic FLOPs and the machine's peak


def forward_flops(variant: str, image_size: int, num_classes: int = NUM_CLASSES) -> float:
    """Matmul FLOPs (``2*m*n*k``) of one image through a class-token ViT, attention included."""
    from keras_vit.variants import parse_variant

    c = parse_variant(variant)
    patches = (image_size // c.patch_size) ** 2
    n, d = patches + 1, c.hidden_size
    embed = 2 * patches * (c.patch_size**2 * 3) * d
    block = 2 * n * d * (3 * d + d + 2 * c.mlp_dim) + 2 * 2 * n * n * d
    return float(embed + c.depth * block + 2 * d * num_classes)


def precision_of(spec: str) -> str:
    """The matmul precision a worker runs: ``"bfloat16"`` for ``+bf16`` workers and on OpenVINO where its runtime
    computes in bfloat16 (:func:`keras_vit.precision.openvino_precision`), else ``"float32"``."""
    from keras_vit.precision import openvino_precision

    options = _split_spec(spec)[1]
    on_bf16 = "bf16" in options or ("openvino" in options and openvino_precision() == "bf16")
    return "bfloat16" if on_bf16 else "float32"


# ----------------------------------------------------------------------------------------------
# Memory (Linux /proc)


def _status_kb(field: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return float(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def rss_mb() -> float:
    return _status_kb("VmRSS") / 1024


def reset_peak_rss() -> None:
    """Reset the kernel's peak-RSS counter (``VmHWM``) to the current RSS."""
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")


def peak_rss_mb() -> float:
    return _status_kb("VmHWM") / 1024


# ----------------------------------------------------------------------------------------------
# Workers: build one model, then time what the driver asks for


def _split_spec(spec: str) -> tuple[str, set[str]]:
    name, *options = spec.split("+")
    if name == PEAK and not options:
        return name, set()
    if name not in FRAMEWORKS:
        raise ValueError(f"Unknown framework {name!r}; expected one of {FRAMEWORKS} (TF ones take +option).")
    allowed = TIMM_OPTIONS if name == "timm" else TF_OPTIONS
    if set(options) - set(allowed):
        raise ValueError(
            f"Bad options {sorted(options)} for {name!r}; TF workers take {TF_OPTIONS}, timm {TIMM_OPTIONS}."
        )
    if {"onednn", "eigen"} <= set(options):
        raise ValueError(f"{spec!r}: +onednn and +eigen exclude each other.")
    if "remat" in options and name != "keras_vit":
        raise ValueError(f"{spec!r}: +remat is a keras_vit option (ViT(remat=True)).")
    backends = set(options) & set(BACKENDS)
    compiles = {"xla"} if backends == {"torch"} else set()  # Keras' jit_compile=True on torch is torch.compile
    if len(backends) > 1 or (backends and set(options) & ({"onednn", "eigen", "xla"} - compiles)):
        raise ValueError(
            f"{spec!r}: one Keras backend at most; +onednn/+eigen are TensorFlow's, +xla TensorFlow's or torch's."
        )
    return name, set(options)


def backend_of(spec: str) -> str:
    """The backend a worker computes on: the Keras backend of a Keras worker, torch for timm."""
    name, options = _split_spec(spec)
    if name == "timm":
        return "torch"
    return next((b for b in BACKENDS if b in options), "tensorflow")


def worker_env(spec: str, threads: int | None) -> dict[str, str]:
    """The worker's environment: quiet TF logs, oneDNN on request, passive OpenMP waits, threads."""
    env = dict(os.environ, KERAS_BACKEND="tensorflow" if spec == PEAK else backend_of(spec), TF_CPP_MIN_LOG_LEVEL="2")
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    options = _split_spec(spec)[1]
    env.pop(ONEDNN_VARIABLE, None)  # each worker gets its library's default unless told
    if options & {"onednn", "eigen"}:
        env[ONEDNN_VARIABLE] = "1" if "onednn" in options else "0"
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), TF_NUM_INTRAOP_THREADS=str(threads))
    return env


class KerasRunner:
    """keras_vit or keras-hub: ``predict_on_batch`` and ``train_on_batch`` of a compiled model."""

    def __init__(self, name: str, options: set[str], variant: str, image_size: int):
        import keras

        self.keras, self.name = keras, name
        if "bf16" in options:
            keras.mixed_precision.set_global_policy("mixed_bfloat16")
        self.model = self._build(name, variant, image_size, remat="remat" in options)
        self.model.compile(
            optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=True if "xla" in options else "auto",
        )
        self.params = self.model.count_params()
        self.image_size = image_size

    @staticmethod
    def _build(name: str, variant: str, image_size: int, remat: bool = False):
        if name == "keras_vit":
            import keras_vit

            return keras_vit.ViT(variant, image_size=image_size, num_classes=NUM_CLASSES, gelu="exact", remat=remat)
        import keras_hub

        from keras_vit.variants import parse_variant

        c = parse_variant(variant)
        backbone = keras_hub.models.ViTBackbone(
            image_shape=(image_size, image_size, 3),
            patch_size=c.patch_size,
            num_layers=c.depth,
            num_heads=c.num_heads,
            hidden_dim=c.hidden_size,
            mlp_dim=c.mlp_dim,
        )
        return keras_hub.models.ViTImageClassifier(backbone, num_classes=NUM_CLASSES, preprocessor=None)

    def inputs(self, batch: int):
        import numpy as np

        rng = np.random.default_rng(batch)
        x = rng.uniform(-1, 1, (batch, self.image_size, self.image_size, 3)).astype("float32")
        y = rng.integers(0, NUM_CLASSES, batch)
        if self.keras.backend.backend() == "openvino":  # its predict takes arrays (a tensor is a graph constant)
            return x, y
        return self.keras.ops.convert_to_tensor(x), self.keras.ops.convert_to_tensor(y)

    def infer(self, x, _):
        self.inference_model.predict_on_batch(x)

    @functools.cached_property
    def inference_model(self):
        """keras_vit: what ``python -m keras_vit.predict`` runs (weights cast once under a mixed policy,
        ``keras_vit.for_inference``); keras-hub: the model itself."""
        if self.name != "keras_vit":
            return self.model
        import keras_vit

        model = keras_vit.for_inference(self.model)
        if model is not self.model:
            model.jit_compile = self.model.jit_compile  # +xla
        return model

    def train(self, x, y):
        self.model.train_on_batch(x, y)

    @property
    def trains(self) -> bool:
        """Keras' OpenVINO backend runs inference only."""
        return self.keras.backend.backend() != "openvino"


class TimmRunner:
    """timm on torch CPU: ``model(x)`` for inference, one SGD step for training; ``+bf16``: autocast;
    ``+compile``: the model through ``torch.compile`` (eager otherwise)."""

    def __init__(self, name: str, options: set[str], variant: str, image_size: int):
        import timm
        import torch

        size, _, patch = variant.partition("/")
        self.torch = torch
        self.model = timm.create_model(
            f"vit_{TIMM_SIZES[size]}_patch{patch}_224",
            pretrained=False,
            num_classes=NUM_CLASSES,
            img_size=image_size,
        )
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.forward = torch.compile(self.model) if "compile" in options else self.model
        self.autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16, enabled="bf16" in options)
        self.params = sum(p.numel() for p in self.model.parameters())
        self.image_size = image_size

    def inputs(self, batch: int):
        generator = self.torch.Generator().manual_seed(batch)
        x = self.torch.rand((batch, 3, self.image_size, self.image_size), generator=generator) * 2 - 1
        return x, self.torch.randint(0, NUM_CLASSES, (batch,), generator=generator)

    def infer(self, x, _):
        self.model.eval()
        with self.torch.inference_mode(), self.autocast():
            self.forward(x)

    trains = True

    def train(self, x, y):
        self.model.train()
        with self.autocast():
            loss = self.torch.nn.functional.cross_entropy(self.forward(x), y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        loss.item()


def _thread_info(name: str) -> str:
    if name == "timm":
        import torch

        return (
            f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
            f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}"
        )
    import keras

    if keras.backend.backend() == "openvino":
        import openvino

        from keras_vit.precision import openvino_precision

        return (
            f"keras {keras.__version__} on openvino {openvino.get_version().split('-')[0]} "
            f"(INFERENCE_PRECISION_HINT {openvino_precision()}, its own thread pool: every core)"
        )
    if keras.backend.backend() != "tensorflow":
        return f"keras {keras.__version__} on {keras.backend.backend()}"
    import tensorflow as tf

    from keras_vit.runtime import onednn_enabled

    intra = tf.config.threading.get_intra_op_parallelism_threads() or os.cpu_count()
    kernels = "oneDNN" if onednn_enabled() else "Eigen"
    return f"tensorflow {tf.__version__}, keras {keras.__version__}, {intra} intra-op threads, {kernels} kernels"


def worker_main(spec: str, variant: str, image_size: int) -> None:
    """Serve JSON requests ``{"phase", "batch", "min_time"}`` on stdin, one JSON reply line each."""
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything a library prints goes to the log, not into the protocol
    name, options = _split_spec(spec)
    if name == PEAK:
        return peak_worker_main(reply)
    if name == "timm":
        import torch  # noqa: F401  (before anything that might pull TensorFlow in)
    else:
        if name == "keras_vit":
            import keras_vit  # noqa: F401  (first, as in a user's program: it picks TF's CPU kernels)
        import keras  # noqa: F401  (the backend too: keras_vit's import loads none, and the baseline holds it)
    baseline = rss_mb()
    runner = (TimmRunner if name == "timm" else KerasRunner)(name, options, variant, image_size)
    reply.write(json.dumps({"params": runner.params, "info": _thread_info(name)}) + "\n")
    seen: dict[tuple[str, int], tuple] = {}
    for line in sys.stdin:
        request = json.loads(line)
        key = (request["phase"], request["batch"])
        if key[0] == "train" and not runner.trains:
            reply.write(json.dumps({"seconds": math.nan, "cpu_seconds": math.nan}) + "\n")
            continue
        step = runner.train if key[0] == "train" else runner.infer
        result = {}
        if key not in seen:
            reset_peak_rss()
            seen[key] = runner.inputs(key[1])
            start = time.perf_counter()
            step(*seen[key])
            result["warmup_s"] = time.perf_counter() - start
        times, cpu_times = [], []
        while not times or sum(times) < request["min_time"]:
            start, cpu_start = time.perf_counter(), time.process_time()
            step(*seen[key])
            times.append(time.perf_counter() - start)
            cpu_times.append(time.process_time() - cpu_start)
        if "warmup_s" in result:
            result["peak_mb"] = peak_rss_mb() - baseline
        result["seconds"], result["cpu_seconds"] = statistics.median(times), statistics.median(cpu_times)
        reply.write(json.dumps(result) + "\n")


def peak_worker_main(reply) -> None:
    """Serve peak requests: ``{"float32": GFLOP/s, "bfloat16": GFLOP/s}`` of TensorFlow's 4096 matmul."""
    from roofline import tf_matmul_gflops  # imports TensorFlow only when called

    import keras_vit  # noqa: F401  (before TensorFlow loads: keras_vit's CPU kernels)

    reply.write(json.dumps({"params": 0, "info": _thread_info("keras_vit")}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        peaks = {p: tf_matmul_gflops(p, request["size"], request["batch"]) for p in ("float32", "bfloat16")}
        reply.write(json.dumps(peaks) + "\n")


class Worker:
    """The driver's handle on one worker process."""

    def __init__(self, spec: str, variant: str, image_size: int, threads: int | None):
        self.spec = spec
        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"vit-bench-{spec}-", suffix=".log")  # noqa: SIM115
        command = [
            sys.executable,
            os.path.abspath(__file__),
            "--worker",
            spec,
            "--variants",
            variant,
            "--image-size",
            str(image_size),
        ]
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=worker_env(spec, threads),
        )
        self.hello = self._read()

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            self.log.seek(0)
            tail = self.log.read()[-3000:]
            raise RuntimeError(f"worker {self.spec} died (exit {self.process.wait()}):\n{tail}")
        return json.loads(line)

    def measure(self, phase: str, batch: int, min_time: float, **extra) -> dict:
        request = {"phase": phase, "batch": batch, "min_time": min_time, **extra}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()
        self.log.close()


# ----------------------------------------------------------------------------------------------
# The comparison


def compare(args) -> dict:
    """Run every framework's phases round-robin; return per-variant results for :func:`report`."""
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    phases = [("infer", 1), ("infer", args.batch), ("train", args.train_batch)]
    results = {}
    for variant in args.variants:
        workers = [Worker(spec, variant, args.image_size, args.threads) for spec in args.frameworks]
        peak_worker = Worker(PEAK, variant, args.image_size, args.threads)
        runs = {w.spec: {_phase_name(p): [] for p in phases} for w in workers}
        cpu_runs = {w.spec: {_phase_name(p): [] for p in phases} for w in workers}  # images per CPU-second
        memory, peaks, numpy_peaks = {w.spec: {} for w in workers}, {"float32": [], "bfloat16": []}, []
        try:
            for phase in phases:
                for round_ in range(args.rounds):
                    for precision, gflops in peak_worker.measure(
                        PEAK, args.peak_repeats, 0, size=args.peak_size
                    ).items():
                        peaks[precision].append(gflops)
                    numpy_peaks.append(numpy_matmul(args.peak_size, unthrottled=True))
                    shift = round_ % len(workers)
                    for worker in workers[shift:] + workers[:shift]:
                        out = worker.measure(*phase, args.min_time)
                        runs[worker.spec][_phase_name(phase)].append(phase[1] / out["seconds"])
                        cpu_runs[worker.spec][_phase_name(phase)].append(phase[1] / out["cpu_seconds"])
                        if "peak_mb" in out:
                            memory[worker.spec][_phase_name(phase)] = out["peak_mb"]
                    print(
                        f"  {variant} {_phase_name(phase)} round {round_ + 1}: "
                        + ", ".join(f"{s} {v[_phase_name(phase)][-1]:.2f}" for s, v in runs.items()),
                        file=sys.stderr,
                    )
        finally:
            for worker in [*workers, peak_worker]:
                worker.close()
        results[variant] = dict(
            phases=[_phase_name(p) for p in phases],
            runs=runs,
            cpu_runs=cpu_runs,
            memory=memory,
            peaks=peaks,
            numpy_peaks=numpy_peaks,
            numpy_as_is=numpy_matmul(args.peak_size, unthrottled=False),
            precision={w.spec: precision_of(w.spec) for w in workers},
            info={w.spec: w.hello for w in workers},
            flops=forward_flops(variant, args.image_size),
            peak_size=args.peak_size,
        )
    return results


def _phase_name(phase: tuple[str, int]) -> str:
    return f"{'inference' if phase[0] == 'infer' else 'train step'} b{phase[1]}"


def _ratio_table(runs: dict, phases: list[str], first: str, how: str) -> list[str]:
    """Markdown lines: ``first`` / each other worker, per phase, the median of per-round ratios of ``runs``."""
    lines = [
        "",
        f"Ratio {first} / peer {how}:",
        "",
        "| peer | " + " | ".join(phases) + " |",
        "|---" * (1 + len(phases)) + "|",
    ]
    for spec in list(runs)[1:]:
        ratios = [statistics.median(a / b for a, b in zip(runs[first][p], runs[spec][p])) for p in phases]
        lines.append(f"| {spec} | " + " | ".join(_number(v, "{:.2f}x") for v in ratios) + " |")
    return lines


def _number(value: float, form: str) -> str:
    """``form`` filled with ``value``, or ``-`` where there is none (NaN: a phase the worker's backend cannot run)."""
    return "-" if math.isnan(value) else form.format(value)


def report(results: dict, args, own_peaks: dict | None = None) -> str:
    """Markdown tables: images/s, ratios keras_vit / peer, fraction of peak, memory. ``own_peaks``: every
    framework's own matmul peaks (:func:`machine`), beside the TensorFlow one of each round."""
    own_peaks = own_peaks or {}
    lines = []
    for variant, r in results.items():
        phases, runs, first = r["phases"], r["runs"], args.frameworks[0]
        peak = {p: max(v) for p, v in r["peaks"].items()}  # the best: contention only ever lowers a measurement
        lines += [
            f"### ViT {variant} at {args.image_size}px, {args.rounds} rounds (median)",
            "",
            "| framework | backend | params | "
            + " | ".join(f"{p} img/s" for p in phases)
            + " | "
            + " | ".join(f"peak RSS {p}" for p in phases)
            + " |",
            "|---" * (3 + 2 * len(phases)) + "|",
        ]
        for spec, per_phase in runs.items():
            rates = [_number(statistics.median(per_phase[p]), "{:.2f}") for p in phases]
            mem = [_number(r["memory"][spec].get(p, math.nan) / 1024, "{:.2f} GB") for p in phases]
            params = f"{r['info'][spec]['params'] / 1e6:.2f} M"
            lines.append(f"| {spec} | {backend_of(spec)} | {params} | " + " | ".join(rates + mem) + " |")
        lines += _ratio_table(runs, phases, first, "(median of per-round ratios)")
        lines += _ratio_table(
            r["cpu_runs"],
            phases,
            first,
            "by CPU time (images per CPU-second of the worker process: less sensitive to other jobs' load than wall "
            "time, but it counts threads that spin while they wait)",
        )
        lines += [
            "",
            *roofline_lines(r),
            "",
            f"FLOP/s reached ({r['flops'] / 1e9:.1f} GFLOP per image forward, 3x "
            "for a train step) as a fraction of the TensorFlow matmul peak of the path's precision (TF) and of the "
            "peak of the worker's own framework in that precision (own):",
            "",
            "| framework | precision | " + " | ".join(phases) + " |",
            "|---" * (2 + len(phases)) + "|",
        ]
        for spec, per_phase in runs.items():
            cells, precision = [], r["precision"][spec]
            for p in phases:
                gflops = statistics.median(per_phase[p]) * r["flops"] * (3 if p.startswith("train") else 1) / 1e9
                own = own_peaks.get(backend_of(spec), {}).get(precision, math.nan)  # roofline names its backend
                if math.isnan(gflops):
                    cells.append("-")
                    continue
                own_share = _number(gflops / own, "{:.0%}")
                cells.append(f"{gflops:.0f} GFLOP/s ({gflops / peak[precision]:.0%} TF, {own_share} own)")
            lines.append(f"| {spec} | {precision} | " + " | ".join(cells) + " |")
        lines += ["", "Workers: " + "; ".join(f"{s}: {r['info'][s]['info']}" for s in runs), ""]
    return "\n".join(lines)


def roofline_lines(r: dict) -> list[str]:
    """The peaks of one run: TensorFlow per precision (used), numpy unthrottled and as is (shown)."""
    rounds = len(r["numpy_peaks"])
    best_numpy = max(r["numpy_peaks"], key=lambda n: n["gflops"])
    as_is = r["numpy_as_is"]
    env = ", ".join(f"{k}={v}" for k, v in as_is["env"].items()) or "no OPENBLAS_CORETYPE/L2_SIZE set"
    lines = [
        f"Matmul peaks, {r['peak_size']}-square, best over {rounds} rounds:",
        "",
        "| matmul | GFLOP/s (best) | median |",
        "|---|---|---|",
    ]
    for precision, values in r["peaks"].items():
        lines.append(
            f"| tf.linalg.matmul {precision} (the peak for {precision} paths) | {max(values):.0f} | "
            f"{statistics.median(values):.0f} |"
        )
    lines += [
        f"| numpy float32, OPENBLAS_CORETYPE/L2_SIZE unset ({best_numpy['kernel']}) | {best_numpy['gflops']:.0f} "
        f"| {statistics.median(n['gflops'] for n in r['numpy_peaks']):.0f} |",
        f"| numpy float32, environment as is ({env}; {as_is['kernel']}), once | {as_is['gflops']:.0f} | |",
    ]
    return lines


# ----------------------------------------------------------------------------------------------
# The simple benchmark: model.predict, plain vs XLA vs bfloat16


def predict_benchmark(args) -> str:
    """images/s of ``ViT_B16`` predict at batch ``args.batch`` through every Keras path, interleaved."""
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import keras_vit  # first, as in a user's program: it picks TF's CPU kernels

    # isort: split
    import keras
    import numpy as np
    import tensorflow as tf

    def build(policy: str):
        keras.mixed_precision.set_global_policy(policy)
        model = keras_vit.ViT(args.variants[0], image_size=args.image_size)
        keras.mixed_precision.set_global_policy("float32")
        return model

    plain = build("float32")
    xla, bf16 = build("float32"), build("mixed_bfloat16")
    for model in (xla, bf16):
        model.set_weights(plain.get_weights())
    xla.jit_compile = True
    x = np.random.default_rng(0).uniform(-1, 1, (args.batch, args.image_size, args.image_size, 3)).astype("float32")
    dataset = tf.data.Dataset.from_tensors(x)
    paths = {
        f"predict_on_batch (jit_compile={plain.jit_compile}, Keras' CPU default)": lambda: plain.predict_on_batch(x),
        "model.predict(tf.data.Dataset)": lambda: plain.predict(dataset, verbose=0),
        "model.predict(NumPy array)": lambda: plain.predict(x, verbose=0),
        "predict_on_batch, jit_compile=True (XLA)": lambda: xla.predict_on_batch(x),
        "predict_on_batch, mixed_bfloat16": lambda: bf16.predict_on_batch(x),
        "model(x) eager call": lambda: plain(x),
    }
    for path in paths.values():
        path()  # trace / compile
    rates = {name: [] for name in paths}
    for _ in range(args.rounds):
        for name, path in paths.items():
            start = time.perf_counter()
            path()
            rates[name].append(args.batch / (time.perf_counter() - start))
    first = next(iter(rates))
    lines = [
        f"### keras_vit {args.variants[0]} at {args.image_size}px, batch {args.batch}, {args.rounds} rounds (median)",
        "",
        "| path | images/s | vs predict_on_batch |",
        "|---|---|---|",
    ]
    for name, values in rates.items():
        ratio = statistics.median(a / b for a, b in zip(values, rates[first]))
        lines.append(f"| {name} | {statistics.median(values):.2f} | {ratio:.2f}x |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------


# The CPU flags that decide which kernels run (lscpu's names): vector width, bfloat16 and int8 units.
KERNEL_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)
# How each framework's oneDNN names its version: TensorFlow's in its verbose output, torch's in its build config.
_ONEDNN_PROBES = {
    "tensorflow": "import tensorflow as tf; tf.linalg.matmul(tf.ones((8, 8)), tf.ones((8, 8)))",
    "torch": "import torch; print(torch.__config__.show())",
}


def onednn_versions() -> dict[str, str]:
    """``{"tensorflow": "3.7.3", "torch": "3.12.0"}``: the oneDNN each framework carries (each asked in a fresh
    process; ``"not installed"`` or ``"unknown"`` where it cannot say)."""
    import re

    versions = {}
    for framework, probe in _ONEDNN_PROBES.items():
        env = dict(os.environ, ONEDNN_VERBOSE="1", TF_CPP_MIN_LOG_LEVEL="3")
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=False)
        found = re.search(r"(?:oneDNN|MKL-DNN) v(\d[\w.]*)", done.stdout + done.stderr)
        versions[framework] = found[1] if found else ("unknown" if done.returncode == 0 else "not installed")
    return versions


def machine(args) -> dict:
    """The facts a measurement needs beside it: CPU and flags, oneDNN versions, every framework's matmul peak."""
    env = worker_env(PEAK, args.threads)
    return {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "onednn": onednn_versions(),
        "peaks": framework_peaks(args.peak_size, args.peak_repeats, env),
        "peak_size": args.peak_size,
        "threads": args.threads,
    }


def machine_lines(facts: dict) -> list[str]:
    """Markdown: the machine, and every framework's own matmul peak (float32, bfloat16)."""
    versions = ", ".join(f"{k} {v}" for k, v in facts["onednn"].items())
    size = facts["peak_size"]
    lines = [
        f"Machine: {facts['cpu']}, {facts['cores']} cores; oneDNN: {versions}; "
        f"{facts['threads'] or 'all'} threads per framework",
        "",
        f"| framework's own matmul, {size}x{size} | float32 GFLOP/s | bfloat16 GFLOP/s |",
        "|---|---|---|",
    ]
    for framework, peak in facts["peaks"].items():
        if "error" in peak:
            lines.append(f"| {framework} | not run: {peak['error']} | |")
            continue
        bf16 = f"{peak['bfloat16']:.0f}" if "bfloat16" in peak else "-"
        lines.append(f"| {framework} | {peak['float32']:.0f} | {bf16} |")
    return [*lines, ""]


def cpu_name() -> str:
    """The CPU model and the :data:`KERNEL_FLAGS` it has, e.g. ``Intel(R) Xeon(R) Processor (avx2 ... amx_int8)``."""
    import platform

    with open("/proc/cpuinfo") as info:
        lines = info.read().splitlines()
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), None)
    flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
    return f"{model or platform.processor()} ({' '.join(f for f in KERNEL_FLAGS if f in flags) or 'no AVX2'})"


def conditions() -> str:
    import platform

    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    return f"CPU: {cpu_name()}, {os.cpu_count()} cores; load average {load}; python {platform.python_version()}"


def measure_and_report(measure, report, json_path: str | None = None) -> None:
    """The benchmarks' main: print the machine's conditions, the ``report`` of ``measure()``'s results, the
    conditions again (the load before and after), and write the raw results to ``json_path`` if given."""
    print(conditions(), flush=True)
    results = measure()
    print(report(results))
    print(conditions())
    if json_path:
        with open(json_path, "w") as out:
            json.dump(results, out, indent=1)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", default=["B/16"], help="e.g. B/16 Ti/16 L/16")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument(
        "--frameworks",
        nargs="+",
        default=list(FRAMEWORKS),
        help="first one is compared with the others; Keras ones take +xla, +onednn, +eigen, +bf16, +remat, "
        "+jax, +torch (the backend); timm +bf16",
    )
    parser.add_argument("--batch", type=int, default=None, help="inference batch (default 32; 8 with --predict)")
    parser.add_argument("--train-batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved repetitions; medians are reported")
    parser.add_argument("--min-time", type=float, default=2.0, help="seconds of calls per measurement")
    parser.add_argument("--threads", type=int, help="threads per framework (default: all cores)")
    parser.add_argument("--peak-repeats", type=int, default=3, help="matmuls per precision per round (best kept)")
    parser.add_argument("--peak-size", type=int, default=4096, help="side of the square matmuls of the peaks")
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: Ti/16 at 64 px, batches 2, one short round, small peaks"
    )
    parser.add_argument("--predict", action="store_true", help="the simple predict benchmark instead")
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.variants, args.image_size, args.batch, args.train_batch = ["Ti/16"], 64, 2, 2
        args.rounds, args.min_time, args.peak_size, args.peak_repeats = 1, 0.0, 512, 1
    if args.batch is None:
        args.batch = 8 if args.predict else 32
    for spec in args.frameworks:
        _split_spec(spec)
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        worker_main(args.worker, args.variants[0], args.image_size)
        return
    if args.predict:
        print(conditions())
        print(predict_benchmark(args))
        return
    measure_and_report(
        lambda: {"machine": machine(args), "variants": compare(args)},
        lambda results: (
            "\n".join(machine_lines(results["machine"]))
            + "\n"
            + report(results["variants"], args, results["machine"]["peaks"])
        ),
        args.json,
    )


if __name__ == "__main__":
    main()
