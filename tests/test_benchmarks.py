"""benchmarks/gpu.py: the analytic FLOPs, and a CPU smoke test of the whole script with TensorFlow blocked."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "benchmarks", "gpu.py")


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


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


@pytest.mark.slow  # about 3 minutes on 2 cores: torch.compile on CPU dominates
@pytest.mark.skipif(not (_has("jax") and _has("torch") and _has("timm")), reason="needs jax, torch and timm")
def test_gpu_script_tiny_runs_on_cpu_without_tensorflow(tmp_path):
    blocker = tmp_path / "site"
    blocker.mkdir()
    # Every process of the run (driver and workers) sees TensorFlow as not installed.
    (blocker / "sitecustomize.py").write_text("import sys\nsys.modules['tensorflow'] = None\n")
    env = dict(os.environ, KERAS_BACKEND="jax", PYTHONPATH=os.pathsep.join([str(blocker), REPO]))
    out = tmp_path / "results.json"
    done = subprocess.run(
        [sys.executable, SCRIPT, "--tiny", "--out", str(out)], capture_output=True, text=True, env=env, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["peak"]["peak_tflops"] > 0
    for framework in ("keras_vit", "timm"):
        run = results["models"]["Ti/16"][framework]
        assert "error" not in run, run.get("error")
        assert run["train"]["step_s"] > 0 and run["infer"]["step_s"] > 0
    assert results["models"]["Ti/16"]["keras_vit"]["backend"] == "jax"
    assert "| Ti/16 | keras_vit | train | 4 |" in done.stdout
