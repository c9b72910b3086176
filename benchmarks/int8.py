"""Int8 ViT inference on CPU through every route that can reach the int8 units, beside float32 and bfloat16.

    python benchmarks/int8.py [--variant B/16] [--batches 1 8] [--rounds 5] [--routes keras-f32 ort-dynamic ...]

1. One Dense of a B/16 MLP (``(32, 197, 768) @ (768, 3072)``), as ``tf.function``: float32, Keras'
   int8 Dense (``Dense.quantize("int8")``), and its two parts alone: the input quantiser (abs-max per
   token, round, cast) and the ``int8 x int8 -> int32`` matmul Keras hands TensorFlow.
2. Whether ONNX Runtime's and LiteRT's int8 GEMMs run on AMX here, each in a process of its own (no
   TensorFlow, whose oneDNN asks for AMX too): the AMX tile permission Linux gives the process before and after
   ONNX Runtime is imported / LiteRT's XNNPACK delegate is created (MLAS asks for it only to select its AMX
   uint8 x int8 kernels; XNNPACK when it enables its AMX kernels), and one ``(1576, 768) @ (768, 3072)``
   matmul: ONNX Runtime's float32 ``MatMul`` and ``MatMulInteger`` with uint8 and int8 activations, LiteRT's
   float32 and dynamic-range int8 ``FULLY_CONNECTED``. Above AVX512-VNNI's peak (at most two 512-bit
   ``VPDPBUSD``, 2 x 128 int8 ops, per cycle and core), an int8 rate can only be AMX's.
3. The whole model at each batch, every route (``ROUTES``) timed in turn ``--rounds`` times on crops of real
   photos (median images/s, median per-round ratio to Keras float32). Beside each route: on ``--images``
   evaluation crops, the largest absolute logit difference from Keras float32, the lowest cosine similarity
   and the top-1 agreement. Int8 routes that calibrate use ``--calibration`` other crops (another seed).
   The weights are random, the head N(0, 0.1) so that logits are not all zero: logit margins are small, so
   top-1 agreement is a pessimistic proxy for a trained model's.

Optional runtimes (onnxruntime, openvino, nncf, ai_edge_litert) that are not installed are skipped, saying so.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass

__all__ = [
    "ROUTES",
    "Bench",
    "dense_probe",
    "litert_amx_probe",
    "litert_dense_files",
    "main",
    "ort_amx_probe",
    "quality",
]

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
    return _timing_table(f"Dense {tokens[0]}x{tokens[1]}x{width} @ {width}x{mlp}", paths, flops)


def _timing_table(title: str, paths: dict, flops: float) -> list[str]:
    """Markdown rows: each call's best of 3 in ms, GFLOP/s (GOP/s for integers) and time against the first."""
    import numpy as np

    rows = [f"{title}, best of 3:", "", "| path | ms | GFLOP/s (or GOP/s) | time vs first |", "|---|---|---|---|"]
    base = None
    for name, fn in paths.items():
        seconds = _best_seconds(lambda fn=fn: np.asarray(fn()))
        base = base or seconds
        rows.append(f"| {name} | {seconds * 1e3:.1f} | {flops / seconds / 1e9:.0f} | {seconds / base:.2f}x |")
    return rows


# --- do ONNX Runtime's and LiteRT's int8 GEMMs run on AMX? -------------------------------------------------

_PROBE_SHAPE = (8 * 197, 768, 3072)  # one B/16 MLP Dense at batch 8: (m, k) @ (k, n)
_ARCH_GET_XCOMP_PERM, _XFEATURE_XTILEDATA = 0x1022, 18  # linux/arch/x86/include/uapi/asm/prctl.h, fpu/types.h


def _amx_permitted() -> bool | None:
    """Whether Linux has given this process the AMX tile state (``arch_prctl(ARCH_GET_XCOMP_PERM)``); None off
    Linux x86. A library asks for it (``ARCH_REQ_XCOMP_PERM``) before it runs AMX instructions."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    mask = ctypes.c_ulong(0)
    if libc.syscall(158, _ARCH_GET_XCOMP_PERM, ctypes.byref(mask)) != 0:  # 158: SYS_arch_prctl on x86-64
        return None
    return bool(mask.value & (1 << _XFEATURE_XTILEDATA))


def ort_amx_probe() -> list[str]:
    """Markdown rows (run in a process without TensorFlow): the AMX permission before and after ONNX Runtime's
    import, and one matmul in float32, uint8 x int8 and int8 x int8 (``MatMulInteger``)."""
    before = _amx_permitted()
    import numpy as np
    import onnx
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper

    m, k, n = _PROBE_SHAPE
    rng = np.random.default_rng(0)

    def session(a_type, b):
        a_proto = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(a_type))
        op = "MatMul" if a_type == "float32" else "MatMulInteger"
        graph = helper.make_graph(
            [helper.make_node(op, ["a", "b"], ["c"])],
            "probe",
            [helper.make_tensor_value_info("a", a_proto, [m, k])],
            [helper.make_tensor_value_info("c", TensorProto.FLOAT if op == "MatMul" else TensorProto.INT32, [m, n])],
            [numpy_helper.from_array(b, "b")],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = os.cpu_count()
        return onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])

    inputs = {
        "float32 MatMul": ("float32", rng.standard_normal((m, k)), rng.standard_normal((k, n))),
        "uint8 x int8 MatMulInteger (U8S8: dynamic quantisation)": (
            "uint8",
            rng.integers(0, 256, (m, k)),
            rng.integers(-128, 128, (k, n)).astype("int8"),
        ),
        "int8 x int8 MatMulInteger (S8S8: QDQ default)": (
            "int8",
            rng.integers(-128, 128, (m, k)),
            rng.integers(-128, 128, (k, n)).astype("int8"),
        ),
    }
    paths = {}
    for name, (a_type, a, b) in inputs.items():
        run, a = session(a_type, b.astype(a_type) if a_type == "float32" else b), a.astype(a_type)
        paths[name] = lambda run=run, a=a: run.run(None, {"a": a})[0]
    rows = _timing_table(f"ONNX Runtime {onnxruntime.__version__}, ({m}, {k}) @ ({k}, {n})", paths, 2 * m * k * n)
    rows.insert(
        0, f"AMX tile permission of the process: before importing ONNX Runtime {before}, after {_amx_permitted()}"
    )
    return rows


def litert_dense_files(folder: str) -> None:
    """``dense-float32.tflite`` and ``dense-dynamic.tflite`` in ``folder``: one Dense of :data:`_PROBE_SHAPE`,
    exported from Keras in float32 and with dynamic-range int8 weights (run by :func:`litert_amx_probe`)."""
    import keras
    import tensorflow as tf

    _, k, n = _PROBE_SHAPE
    dense = keras.Sequential([keras.Input((k,)), keras.layers.Dense(n)])
    for name, kwargs in (("float32", {}), ("dynamic", {"optimizations": [tf.lite.Optimize.DEFAULT]})):
        dense.export(os.path.join(folder, f"dense-{name}.tflite"), format="litert", verbose=False, **kwargs)


def litert_amx_probe(folder: str) -> list[str]:
    """Markdown rows (run in a process without TensorFlow): the AMX permission before LiteRT is imported and
    after its XNNPACK delegate ran, and the float32 and dynamic-range int8 Dense of :func:`litert_dense_files`."""
    import numpy as np

    before = _amx_permitted()
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        return ["LiteRT probe skipped: ai_edge_litert is not installed (tf.lite would bring TensorFlow's oneDNN)"]
    m, k, n = _PROBE_SHAPE
    paths = {}
    for name in ("float32", "dynamic"):
        interpreter = Interpreter(model_path=os.path.join(folder, f"dense-{name}.tflite"), num_threads=os.cpu_count())
        (inp,) = interpreter.get_input_details()
        interpreter.resize_tensor_input(inp["index"], (m, k))  # the export's batch is free
        interpreter.allocate_tensors()
        interpreter.set_tensor(inp["index"], np.random.default_rng(0).standard_normal((m, k)).astype("float32"))
        paths[f"{name} FULLY_CONNECTED (XNNPACK)"] = interpreter.invoke
    rows = _timing_table(f"LiteRT (ai_edge_litert), ({m}, {k}) @ ({k}, {n})", paths, 2 * m * k * n)
    after = _amx_permitted()
    rows.insert(0, f"AMX tile permission of the process: before importing LiteRT {before}, after its runs {after}")
    return rows


def _probe_report(*argv: str) -> list[str]:
    """``python benchmarks/int8.py --amx-probe *argv`` in a fresh process: its rows, or its error."""
    done = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--amx-probe", *argv], capture_output=True, text=True, check=False
    )
    return (done.stdout if done.returncode == 0 else done.stderr).strip().splitlines()


# --- the routes: each returns (call images -> logits, size in MB or None, a note or a function giving one) ------


@dataclass
class Bench:
    """What every route starts from: the float32 model (random weights, head N(0, 0.1)) of ``variant`` at
    ``image_size``, a folder for its exports and the calibration images (preprocessed crops, float32 in [-1, 1])."""

    model: object
    variant: str
    image_size: int
    workdir: str
    calibration: object

    def path(self, name: str) -> str:
        return os.path.join(self.workdir, name)


def _mb(*paths: str) -> float:
    return sum(os.path.getsize(p) for p in paths) / 1e6


def keras_route(bench: Bench, policy: str = "float32", quantize: str | None = None):
    """``predict_on_batch`` of the model rebuilt under ``policy`` with the same weights, then
    ``model.quantize(quantize)`` when given, saved as ``.keras`` and loaded back as a user gets it (size: the file's;
    the float32 model itself when neither)."""
    import keras

    import keras_vit

    model = bench.model
    if policy != "float32" or quantize:
        keras.mixed_precision.set_global_policy(policy)
        try:
            model = keras_vit.ViT(bench.variant, image_size=bench.image_size)
        finally:
            keras.mixed_precision.set_global_policy("float32")
        model.set_weights(bench.model.get_weights())
    if quantize:
        with warnings.catch_warnings():  # one "does not have a `quantize` method" per non-Dense layer
            warnings.simplefilter("ignore", UserWarning)
            model.quantize(quantize)
        path = bench.path(f"keras-{quantize}.keras")
        model.save(path)
        model = keras.saving.load_model(path)
    size = _mb(path) if quantize else sum(w.nbytes for w in bench.model.get_weights()) / 1e6
    note = f"policy {policy}" + (f", {quantize} Dense layers, through a .keras file" if quantize else "")
    return model.predict_on_batch, size, note


def litert_route(bench: Bench, mode: str = "float32"):
    """``model.export(format="litert")``: ``float32``, ``dynamic`` (int8 weights, activations quantised per call)
    or ``integer`` (int8 weights and activations, scales from the calibration crops, int8 kernels only); the
    interpreter (ai_edge_litert's, else tf.lite's) with its default XNNPACK delegate on all cores."""
    import numpy as np
    import tensorflow as tf

    kwargs = {}
    if mode != "float32":
        kwargs["optimizations"] = [tf.lite.Optimize.DEFAULT]
    if mode == "integer":
        kwargs["representative_dataset"] = lambda: ([image[None]] for image in bench.calibration)
        kwargs["target_spec"] = {"supported_ops": [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]}
    path = bench.path(f"litert-{mode}.tflite")
    bench.model.export(path, format="litert", verbose=False, **kwargs)
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

    tensor_types = {np.dtype(t["dtype"]).name for t in interpreter.get_tensor_details()}
    note = f"input {np.dtype(inp['dtype']).name}, output {np.dtype(out['dtype']).name}; tensors {sorted(tensor_types)}"
    return run, _mb(path), note


class _Crops:
    """ONNX Runtime's ``CalibrationDataReader``: the calibration images, a few at a time."""

    def __init__(self, name: str, images, batch: int = 4):
        self.feeds = iter([{name: images[i : i + batch]} for i in range(0, len(images), batch)])

    def get_next(self):
        return next(self.feeds, None)


def onnxruntime_route(bench: Bench, mode: str = "float32", activations: str = "uint8"):
    """``keras_vit.export.export_onnx`` (tf2onnx), then ``float32``, ``dynamic`` (``quantize_dynamic``: int8
    weights per channel, activations uint8 per call) or ``static`` (``quantize_static``, QDQ: int8 weights per
    channel, ``activations`` uint8 or int8 with scales from the calibration crops); run on
    ``CPUExecutionProvider`` with all cores. uint8 activations make MLAS's U8S8 GEMM, the one with AMX kernels."""
    import onnxruntime
    from onnxruntime import quantization as q

    from keras_vit.export import export_onnx

    base = bench.path("model.onnx")
    if not os.path.exists(base):
        export_onnx(bench.model, base)
    path = bench.path(f"model-{mode}-{activations}.onnx")
    if mode == "dynamic":
        q.quantize_dynamic(base, path, per_channel=True, weight_type=q.QuantType.QInt8)
        note = "weights QInt8 per channel, activations QUInt8 (DynamicQuantizeLinear): U8S8"
    elif mode == "static":
        activation_type = {"uint8": q.QuantType.QUInt8, "int8": q.QuantType.QInt8}[activations]
        name = onnxruntime.InferenceSession(base, providers=["CPUExecutionProvider"]).get_inputs()[0].name
        q.quantize_static(
            base,
            path,
            _Crops(name, bench.calibration),
            quant_format=q.QuantFormat.QDQ,
            per_channel=True,
            activation_type=activation_type,
            weight_type=q.QuantType.QInt8,
        )
        note = f"QDQ, weights QInt8 per channel, activations {activation_type.name} (MinMax calibration)"
    else:
        path, note = base, "tf2onnx graph"
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = os.cpu_count()
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return (lambda images: session.run(None, {name: images})[0]), _mb(path), note


def openvino_route(bench: Bench, mode: str = "f32"):
    """``keras_vit.export.export_openvino`` (an IR folder) compiled for ``CPU``: ``f32`` or ``bf16``
    (``INFERENCE_PRECISION_HINT``), or ``int8``: ``export_openvino(quantize="int8")`` (NNCF post-training
    quantisation for transformers on all calibration crops) compiled with the plugin's default precision. The note
    (a function, called after the timing) counts the kernels of the compiled graph's matmuls and convolution
    (``..._amx_...``: AMX tiles)."""
    import openvino

    from keras_vit.export import OPENVINO_FILE, export_openvino

    core = openvino.Core()
    folder = bench.path(f"openvino-{mode}" if mode == "int8" else "openvino")
    if not os.path.exists(folder):
        int8 = dict(quantize="int8", calibration=bench.calibration) if mode == "int8" else {}
        export_openvino(bench.model, folder, **int8)
    xml = os.path.join(folder, OPENVINO_FILE)
    model = core.read_model(xml)
    config = {"INFERENCE_PRECISION_HINT": mode} if mode != "int8" else {}
    compiled = core.compile_model(model, "CPU", config)
    request = compiled.create_infer_request()

    def kernels() -> str:  # the compiled graph's kernels, chosen at the first call (the input shape is dynamic)
        counts = {}
        for op in compiled.get_runtime_model().get_ordered_ops():
            info = op.get_rt_info()
            if info["layerType"].astype(str) in ("FullyConnected", "MatMul", "Convolution"):
                kind = f"{info['layerType'].astype(str)} {info['primitiveType'].astype(str)}"
                counts[kind] = counts.get(kind, 0) + 1
        precision = compiled.get_property("INFERENCE_PRECISION_HINT")
        return f"precision hint {precision}; last call's kernels: " + ", ".join(f"{n} x {k}" for k, n in counts.items())

    return (lambda images: request.infer([images])[0].copy()), _mb(xml, xml[:-4] + ".bin"), kernels


ROUTES = {  # name -> (row label, optional modules it needs, helper, keyword arguments)
    "keras-f32": ("Keras float32", (), keras_route, {}),
    "keras-bf16": ("Keras mixed_bfloat16", (), keras_route, {"policy": "mixed_bfloat16"}),
    "keras-int8": ('Keras quantize("int8")', (), keras_route, {"quantize": "int8"}),
    "keras-float8": ('Keras quantize("float8")', (), keras_route, {"quantize": "float8"}),
    "keras-int4": ('Keras quantize("int4")', (), keras_route, {"quantize": "int4"}),
    "litert-f32": ("LiteRT float32", (), litert_route, {}),
    "litert-dynamic": ("LiteRT dynamic-range int8", (), litert_route, {"mode": "dynamic"}),
    "litert-int8": ("LiteRT full-integer int8", (), litert_route, {"mode": "integer"}),
    "ort-f32": ("ONNX Runtime float32", ("tf2onnx", "onnxruntime"), onnxruntime_route, {}),
    "ort-dynamic": ("ONNX Runtime dynamic int8", ("tf2onnx", "onnxruntime"), onnxruntime_route, {"mode": "dynamic"}),
    "ort-static": ("ONNX Runtime static QDQ U8S8", ("tf2onnx", "onnxruntime"), onnxruntime_route, {"mode": "static"}),
    "ort-static-s8": (
        "ONNX Runtime static QDQ S8S8",
        ("tf2onnx", "onnxruntime"),
        onnxruntime_route,
        {"mode": "static", "activations": "int8"},
    ),
    "openvino-f32": ("OpenVINO float32", ("openvino",), openvino_route, {}),
    "openvino-bf16": ("OpenVINO bf16", ("openvino",), openvino_route, {"mode": "bf16"}),
    "openvino-int8": ("OpenVINO NNCF int8", ("openvino", "nncf"), openvino_route, {"mode": "int8"}),
}


def quality(got, reference) -> tuple[float, float, float]:
    """Largest absolute difference, lowest cosine similarity (per image) and top-1 agreement of two logit sets."""
    import numpy as np

    got, reference = np.asarray(got, "float64"), np.asarray(reference, "float64")
    cosine = np.sum(got * reference, -1) / (np.linalg.norm(got, axis=-1) * np.linalg.norm(reference, axis=-1))
    agree = np.mean(got.argmax(-1) == reference.argmax(-1))
    return float(np.abs(got - reference).max()), float(cosine.min()), float(agree)


def _build(bench: Bench, names: list[str]) -> dict:
    """``{name: (label, call, size, note)}`` for the routes of ``names`` whose packages are installed; a printed
    line for each one skipped or failing."""
    import importlib.util

    routes = {}
    for name in names:
        label, modules, helper, kwargs = ROUTES[name]
        missing = [module for module in modules if importlib.util.find_spec(module) is None]
        if missing:
            print(f"{name}: skipped, {', '.join(missing)} not installed", flush=True)
            continue
        start = time.perf_counter()
        try:
            call, size, note = helper(bench, **kwargs)
        except Exception as exc:  # a converter that cannot build this route: say so, measure the others
            print(f"{name}: failed to build: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}", flush=True)
            continue
        print(f"{name}: built in {time.perf_counter() - start:.0f} s", flush=True)
        routes[name] = (label, call, size, note)
    return routes


def _outputs(call, images, batch: int):
    """``call`` over ``images`` in batches of ``batch``, float32 logits."""
    import numpy as np

    return np.concatenate([np.asarray(call(images[i : i + batch]), "float32") for i in range(0, len(images), batch)])


def _rates(routes: dict, images, rounds: int) -> dict:
    """``{name: [images/s per round]}``, every route called once per round in turn (after one warm-up call)."""
    rates = {name: [] for name in routes}
    for _, call, _, _ in routes.values():
        call(images)
    for _ in range(rounds):
        for name, (_, call, _, _) in routes.items():
            start = time.perf_counter()
            call(images)
            rates[name].append(len(images) / (time.perf_counter() - start))
    return rates


def _load() -> str:
    return f"load average {', '.join(f'{v:.1f}' for v in os.getloadavg())}"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", default="B/16")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--routes", nargs="+", choices=list(ROUTES), default=list(ROUTES))
    parser.add_argument("--images", type=int, default=64, help="evaluation crops (seed 2; default 64)")
    parser.add_argument("--calibration", type=int, default=32, help="calibration crops (seed 1; default 32)")
    parser.add_argument("--no-probes", action="store_true", help="skip the Dense and int8 GEMM (AMX) probes")
    parser.add_argument("--amx-probe", nargs="+", help=argparse.SUPPRESS)  # a probe's own process: ort | litert DIR
    args = parser.parse_args(argv)
    if args.amx_probe:
        print("\n".join(ort_amx_probe() if args.amx_probe[0] == "ort" else litert_amx_probe(args.amx_probe[1])))
        return
    if "keras-f32" not in args.routes:
        args.routes.insert(0, "keras-f32")  # the reference
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, REPO)
    import keras_vit  # first: TensorFlow's oneDNN kernels, as keras_vit users get)

    # isort: split
    import importlib.util

    import numpy as np

    from keras_vit.export import photo_images

    print(f"{_load()}, {os.cpu_count()} cores\n", flush=True)
    if not args.no_probes:
        print("\n".join(dense_probe()) + "\n", flush=True)
        if importlib.util.find_spec("onnxruntime") and importlib.util.find_spec("onnx"):
            print("\n".join(_probe_report("ort")) + "\n", flush=True)
        with tempfile.TemporaryDirectory() as folder:
            litert_dense_files(folder)
            print("\n".join(_probe_report("litert", folder)) + "\n", flush=True)
    model = keras_vit.ViT(args.variant, image_size=args.image_size)
    head = model.get_layer("head")  # zero-initialised, as published: random logits to compare
    head.kernel.assign(np.random.default_rng(1).normal(0, 0.1, head.kernel.shape))
    calibration = photo_images(args.image_size, args.calibration, seed=1)
    evaluation = photo_images(args.image_size, max(args.images, *args.batches), seed=2)
    with tempfile.TemporaryDirectory() as workdir:
        routes = _build(Bench(model, args.variant, args.image_size, workdir, calibration), args.routes)
        widest = max(args.batches)
        outputs = {name: _outputs(call, evaluation, widest) for name, (_, call, _, _) in routes.items()}
        scores = {name: quality(got, outputs["keras-f32"]) for name, got in outputs.items()}
        print(f"\n{_load()}\n", flush=True)
        for batch in args.batches:
            rates = _rates(routes, evaluation[:batch], args.rounds)
            base = rates["keras-f32"]
            print(
                f"{args.variant} at {args.image_size}px, batch {batch}, {args.rounds} rounds (median); quality on "
                f"{len(evaluation)} photo crops against Keras float32:\n\n"
                "| route | img/s | vs Keras float32 | max abs logit diff | min cosine | top-1 agreement | MB |\n"
                "|---|---|---|---|---|---|---|"
            )
            for name, values in rates.items():
                label, _, size, _ = routes[name]
                diff, cosine, agree = scores[name]
                ratio = statistics.median(a / b for a, b in zip(values, base))
                print(
                    f"| {label} | {statistics.median(values):.2f} | {ratio:.2f}x | {diff:.3f} | {cosine:.4f} | "
                    f"{agree:.3f} | {f'{size:.0f}' if size else '-'} |"
                )
            print(f"\n{_load()}\n", flush=True)
        print("Routes:\n")
        for name, (label, _, _, note) in routes.items():
            print(f"- {label} (`{name}`): {note() if callable(note) else note}")


if __name__ == "__main__":
    main()
