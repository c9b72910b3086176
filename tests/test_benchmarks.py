"""benchmarks/gpu.py: the analytic FLOPs, and a CPU smoke test of the whole script with TensorFlow blocked."""

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.backends("tensorflow")  # the default backend only: backend-independent or slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "benchmarks", "gpu.py")


def _run_ok(command: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    """``command`` run from the checkout with ``env``; asserts it exited 0 (showing the end of its stderr)."""
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _load_gpu():
    spec = importlib.util.spec_from_file_location("benchmarks_gpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_forward_flops_is_the_standard_formula():
    gpu = _load_gpu()
    n, d = 197, 768
    per_block = 24 * n * d * d + 4 * n * n * d
    expected = 12 * per_block + 2 * 196 * 16 * 16 * 3 * d + 2 * d * 1000
    assert gpu.forward_flops(12, d, 4 * d, 16, 224, 1000) == expected
    assert round(expected / 1e9, 1) == 35.1  # B/16 at 224 px, as docs/performance.md counts it


def test_input_io_counts_the_parameters_of_b16():
    path = os.path.join(REPO, "benchmarks", "input_io.py")
    spec = importlib.util.spec_from_file_location("benchmarks_input_io", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.b16_parameters(224) == 86_567_656  # timm's vit_base_patch16_224
    assert module.b16_parameters(384) == 86_859_496  # and vit_base_patch16_384


@pytest.mark.slow  # about 3 minutes on 2 cores: torch.compile on CPU dominates
@pytest.mark.requires("jax", "torch", "timm")
def test_the_device_script_runs_on_cpu_without_tensorflow(tmp_path):
    """``benchmarks/gpu_device.sh`` as on the GPU machine: keras-vit installed by the script (its ``zoo/`` and
    ``training/`` folders are not importable from the source tree), no TensorFlow, no ``KERAS_BACKEND`` set."""
    blocker = tmp_path / "site"
    blocker.mkdir()
    # Every process of the run (driver and workers) sees TensorFlow as not installed.
    (blocker / "sitecustomize.py").write_text("import sys\nsys.modules['tensorflow'] = None\n")
    env = {key: value for key, value in os.environ.items() if key != "KERAS_BACKEND"}
    env.update(PYTHONPATH=str(blocker), OUT=str(tmp_path / "out"), KERAS_VIT_SITE=str(tmp_path / "install"))
    env["KERAS_VIT_WHEELS"] = str(tmp_path)  # none: this machine has Keras (the device's .whl/ is for Python 3.12)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env["PATH"]])  # python3 is this interpreter
    out = tmp_path / "out" / "gpu.json"
    done = _run_ok(
        ["bash", os.path.join(REPO, "benchmarks", "gpu_device.sh"), "--tiny", "--profile", "Ti/16"], env, 900
    )
    results = json.loads(out.read_text())
    assert results["peak"]["peak_tflops"] > 0
    for framework in ("keras_vit", "timm"):
        run = results["models"]["Ti/16"][framework]
        assert "error" not in run, run.get("error")
        assert run["train"]["step_s"] > 0 and run["infer"]["step_s"] > 0
    assert results["models"]["Ti/16"]["keras_vit"]["backend"] == "jax"
    assert "| Ti/16 | keras_vit | train | 4 |" in done.stdout
    profile = results["profile"]
    assert "error" not in profile, profile.get("error")
    assert profile["total_ms"] > 0 and profile["top"] and "| op | ms per step | share |" in done.stdout


# --- benchmarks/memory.py and benchmarks/op_profile.py: the pure parts, and reading a real trace ---------------


@pytest.fixture
def bench_scripts(monkeypatch):
    """The benchmarks folder on ``sys.path``, as when a script runs (they import ``throughput`` beside them)."""
    monkeypatch.syspath_prepend(os.path.join(REPO, "benchmarks"))
    import memory
    import op_profile

    return memory, op_profile


def test_memory_fit_recovers_a_line_and_the_largest_batch(bench_scripts):
    memory, _ = bench_scripts
    fixed, per_image = memory.fit_line([(8, 1400 + 8 * 220), (16, 1400 + 16 * 220), (32, 1400 + 32 * 220)])
    assert fixed == pytest.approx(1400) and per_image == pytest.approx(220)
    assert memory.largest_batch(1400, 220, 24 * 1024) == 105  # (24576 - 1400) // 220
    assert memory.largest_batch(30_000, 220, 24 * 1024) == 0  # the fixed part alone is over budget
    with pytest.raises(ValueError, match="two different batch sizes"):
        memory.fit_line([(8, 3000), (8, 3100)])
    with pytest.raises(ValueError, match="per image must be positive"):
        memory.largest_batch(1400, 0, 24 * 1024)


def test_profile_categories_of_op_types(bench_scripts):
    _, op_profile = bench_scripts
    expected = {
        "_MklBatchMatMulV2": "attention matmul",
        "_MklEinsum": "attention matmul",
        "_MklNativeFusedMatMul": "dense matmul",
        "_MklMatMul": "dense matmul",
        "Erfc": "GELU",
        "_MklTranspose": "layout copy",
        "AssignAddVariableOp": "variables, optimizer",
        "SquaredDifference": "reductions",
        "BiasAdd": "elementwise",
        "SomethingNew": "other",
    }
    assert {op: op_profile.category(op) for op in expected} == expected


@pytest.mark.backends("tensorflow")
def test_profile_reads_op_times_from_a_real_trace(bench_scripts, tmp_path):
    import glob

    import tensorflow as tf

    _, op_profile = bench_scripts
    step = tf.function(lambda a: tf.nn.softmax(tf.matmul(a, a)))
    a = tf.random.normal((256, 256))
    step(a)
    tf.profiler.experimental.start(str(tmp_path))
    for _ in range(3):
        step(a)
    tf.profiler.experimental.stop()
    (trace,) = glob.glob(str(tmp_path / "**" / "*.xplane.pb"), recursive=True)
    times = op_profile.op_times(trace)
    matmuls = [op for op in times if "MatMul" in op]
    assert matmuls and all(times[op] > 0 for op in matmuls)
    assert any("Softmax" in op for op in times)


# Lines oneDNN printed on the AMX Xeon (2026-12-04) for a keras_vit layer (TensorFlow's oneDNN 3.7.3) and an
# attention product (torch's oneDNN 3.12), cut after their shape and time.
ONEDNN_LINES = [
    "onednn_verbose,v1,primitive,exec,cpu,inner_product,x64:gemm:jit,forward_training,src:bf16::blocked:ab::f0 "
    "wei:bf16::blocked:ba::f0 bia:bf16:a:blocked:a::f0 dst:bf16::blocked:ab::f0,attr-scratchpad:user,,"
    "mb1576ic768oc3072,12.5",
    "onednn_verbose,v1,primitive,exec,cpu,matmul,brg_matmul:avx10_1_512_amx,undef,src:bf16::blocked:abcd::f0 "
    "wei:bf16::blocked:abdc::f0 dst:bf16::blocked:abcd::f0,attr-scratchpad:user,,8x12x197x64:8x12x64x197,1.5",
    "onednn_verbose,v1,primitive,exec,cpu,matmul,brg_matmul:avx10_1_512_amx,undef,src:bf16::blocked:abcd::f0 "
    "wei:bf16::blocked:abdc::f0 dst:bf16::blocked:abcd::f0,attr-scratchpad:user,,8x12x197x64:8x12x64x197,0.5",
    "onednn_verbose,v1,primitive,exec,cpu,softmax,jit:avx10_1_512,forward_inference,src:f32::blocked:abcd::f0 "
    "dst:f32::blocked:abcd::f0,,alg:softmax_accurate axis:3,8x12x197x197,3",
    "onednn_verbose,v1,info,oneDNN v3.7.3 (commit N/A)",  # not an execution: skipped
    "some other output",
]


def test_onednn_kernels_sums_time_and_flops_per_implementation(bench_scripts):
    _, op_profile = bench_scripts
    kernels = op_profile.onednn_kernels(ONEDNN_LINES)
    assert kernels == {
        "inner_product x64:gemm:jit bf16": {"calls": 1, "ms": 12.5, "flops": 2 * 1576 * 768 * 3072},
        "matmul brg_matmul:avx10_1_512_amx bf16": {"calls": 2, "ms": 2.0, "flops": 2 * (2 * 96 * 197 * 64 * 197)},
        "softmax jit:avx10_1_512 f32": {"calls": 1, "ms": 3.0, "flops": 0},
    }
    results = {"keras_vit": {"wall_us": 20e3, "ops": {"_MklBatchMatMulV2": 2e3}, "onednn": kernels}}
    table = op_profile.onednn_report(results)
    assert "| matmul brg_matmul:avx10_1_512_amx bf16 | 2 x, 2 ms (11%), 477 GFLOP/s |" in table
    assert "| on AMX kernels (`amx` in the name) | 2 ms (11%) |" in table  # 2.0 of 17.5 ms


@pytest.mark.backends("tensorflow")
def test_onednn_kernels_reads_what_tensorflows_onednn_prints(bench_scripts):
    """A real process with ``ONEDNN_VERBOSE=1``: a 2-D matmul with a bias (oneDNN's inner product) is found
    with its FLOPs, whichever implementation this CPU gets."""
    _, op_profile = bench_scripts
    probe = (
        "import keras_vit, tensorflow as tf\n"
        "f = tf.function(lambda a, w, b: tf.nn.bias_add(tf.matmul(a, w), b))\n"
        "f(tf.ones((64, 128)), tf.ones((128, 32)), tf.ones((32,)))\n"
    )
    env = dict(os.environ, ONEDNN_VERBOSE="1", TF_CPP_MIN_LOG_LEVEL="3", TF_ENABLE_ONEDNN_OPTS="1")
    done = _run_ok([sys.executable, "-c", probe], env, 300)
    kernels = op_profile.onednn_kernels(done.stdout.splitlines())
    products = {k: v for k, v in kernels.items() if k.split()[0] in ("inner_product", "matmul")}
    assert products, done.stdout[-2000:]
    assert sum(v["flops"] for v in products.values()) == 2 * 64 * 128 * 32
    assert all(v["ms"] > 0 for v in products.values())


def test_throughput_quick_is_a_small_smoke_run(bench_scripts):
    import throughput

    args = throughput.parse_args(["--quick", "--frameworks", "keras_vit", "timm+bf16+compile"])
    assert (args.variants, args.image_size, args.batch, args.train_batch, args.rounds) == (["Ti/16"], 64, 2, 2, 1)
    assert args.peak_size == 512
    assert throughput._split_spec("timm+bf16+compile") == ("timm", {"bf16", "compile"})
    with pytest.raises(ValueError, match="Bad options"):
        throughput._split_spec("keras_vit+compile")


def test_roofline_names_the_frameworks_it_knows(bench_scripts):
    import roofline

    with pytest.raises(ValueError, match="Unknown framework 'mxnet'"):
        roofline.matmul_gflops("mxnet")


@pytest.mark.slow  # a few minutes on 2 shared cores: every worker and peak process imports its framework
@pytest.mark.requires("torch", "timm")
def test_throughput_quick_prints_the_machine_peaks_and_ratios():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow")
    script = os.path.join(REPO, "benchmarks", "throughput.py")
    command = [sys.executable, script, "--quick", "--threads", "2", "--frameworks", "keras_vit+bf16", "timm+bf16"]
    done = _run_ok(command, env, 1200)
    assert "oneDNN: tensorflow 3." in done.stdout and "torch 3." in done.stdout
    for row in ("| tensorflow |", "| torch |", "| jax |", "| numpy |", "| timm+bf16 |"):
        assert row in done.stdout
    assert "Ratio keras_vit+bf16 / peer" in done.stdout


def test_throughput_remat_option_is_keras_vit_only(bench_scripts):
    import throughput

    assert throughput._split_spec("keras_vit+remat+bf16") == ("keras_vit", {"remat", "bf16"})
    with pytest.raises(ValueError, match="keras_vit option"):
        throughput._split_spec("keras_hub+remat")


def test_throughput_backend_option_sets_the_workers_keras_backend(bench_scripts):
    import throughput

    assert [throughput.backend_of(s) for s in ("keras_vit", "keras_vit+jax+bf16", "keras_hub+torch", "timm")] == [
        "tensorflow",
        "jax",
        "torch",
        "torch",
    ]
    assert throughput.worker_env("keras_vit+jax", None)["KERAS_BACKEND"] == "jax"
    assert throughput.worker_env("peak", None)["KERAS_BACKEND"] == "tensorflow"
    assert throughput._split_spec("keras_vit+torch+bf16+xla") == ("keras_vit", {"torch", "bf16", "xla"})
    for bad in ("keras_vit+jax+torch", "keras_vit+torch+onednn", "keras_vit+jax+xla", "keras_vit+openvino+xla"):
        with pytest.raises(ValueError, match="one Keras backend at most"):
            throughput._split_spec(bad)


@pytest.mark.requires("openvino")
def test_an_openvino_worker_predicts_and_reports_no_training_step(bench_scripts):
    """Keras' OpenVINO backend runs inference only: its worker times predict and answers NaN for a training step,
    which the tables print as ``-``; its precision is the one OpenVINO's runtime picks here."""
    import throughput

    from keras_vit.precision import openvino_precision

    assert throughput.backend_of("keras_vit+openvino") == "openvino"
    expected = "bfloat16" if openvino_precision() == "bf16" else "float32"
    assert throughput.precision_of("keras_vit+openvino") == expected
    worker = throughput.Worker("keras_vit+openvino", "Ti/16", 32, 1)
    try:
        assert "on openvino" in worker.hello["info"] and worker.hello["params"] > 5e6
        inference = worker.measure("infer", 2, 0.0)
        assert inference["seconds"] > 0 and inference["peak_mb"] > 0
        assert math.isnan(worker.measure("train", 2, 0.0)["seconds"])
    finally:
        worker.close()
    assert (throughput._number(math.nan, "{:.2f}"), throughput._number(1.5, "{:.2f}x")) == ("-", "1.50x")


def _write_trace(path, events):
    import gzip

    with gzip.open(path, "wt") as handle:
        json.dump({"traceEvents": events}, handle)


def test_summarize_trace_counts_device_kernels_only(tmp_path):
    gpu = _load_gpu()
    meta = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}},
        {"ph": "M", "pid": 7, "name": "process_name", "args": {"name": "/device:GPU:0"}},
    ]
    kernels = [
        {"ph": "X", "pid": 7, "tid": 1, "name": "fusion.12", "dur": 3000},
        {"ph": "X", "pid": 7, "tid": 1, "name": "fusion.40", "dur": 1000},
        {"ph": "X", "pid": 7, "tid": 2, "name": "nvjet_sm90_gemm", "dur": 6000},
        {"ph": "X", "pid": 1, "tid": 3, "name": "host_work", "dur": 90000},  # the host: not counted
    ]
    path = tmp_path / "perfetto_trace.json.gz"
    _write_trace(path, meta + kernels)
    summary = gpu.summarize_trace(str(path))
    assert summary["where"] == "device"
    assert summary["total_ms"] == pytest.approx(10.0)
    assert [(op["name"], op["ms"]) for op in summary["top"]] == [("nvjet_sm90_gemm", 6.0), ("fusion", 4.0)]
    assert summary["top"][1]["share"] == pytest.approx(0.4)


def test_summarize_trace_on_a_cpu_reads_xla_threads_without_runtime_frames(tmp_path):
    gpu = _load_gpu()
    meta = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}},
        {"ph": "M", "pid": 1, "tid": 5, "name": "thread_name", "args": {"name": "tf_XLAEigen/123"}},
        {"ph": "M", "pid": 1, "tid": 6, "name": "thread_name", "args": {"name": "python"}},
    ]
    events = [
        {"ph": "X", "pid": 1, "tid": 5, "name": "dot_general", "dur": 2000},
        {"ph": "X", "pid": 1, "tid": 5, "name": "ThunkExecutor::Execute", "dur": 5000},
        {"ph": "X", "pid": 1, "tid": 5, "name": "end: dot_general", "dur": 1},
        {"ph": "X", "pid": 1, "tid": 6, "name": "train_step", "dur": 9000},
    ]
    path = tmp_path / "perfetto_trace.json.gz"
    _write_trace(path, meta + events)
    summary = gpu.summarize_trace(str(path))
    assert summary["where"] == "cpu threads"
    assert [op["name"] for op in summary["top"]] == ["dot_general"]
    assert summary["total_ms"] == pytest.approx(2.0)
