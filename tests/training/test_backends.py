"""Training on JAX and torch, from a TensorFlow test run: each case is a subprocess with ``KERAS_BACKEND`` set.

JAX: the commands (fine-tuning, pre-training) end to end, ``keras.distribution.DataParallel`` and ``ModelParallel``
over two XLA host devices against one device, the tf.distribute-only strategies refused; a killed run resumes
exactly and the offline default reaches its accuracy (slow). torch: one device, checkpoints and an exact resume
(slow; CI's torch pass runs the in-process training tests).
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from training_support import REPO, TINY, TINY_MODEL_FLAGS, backend_env, checkpoint_steps, python_json, read_log

from keras_vit.training.checkpoint import read_checkpoint

# The parent is the TensorFlow test run; the JAX and torch passes run the in-process training tests instead.
pytestmark = [pytest.mark.backends("tensorflow"), pytest.mark.requires("jax")]

# SGD with a global-norm clip that is active on every step, as in test_training_distributed.py.
CLIPPED = {**TINY, "steps": 4, "eval_every": 2, "optimizer": "sgd", "lr": 0.1, "clip_norm": 0.05, "weight_decay": 0.0}
FLAGS = [*TINY_MODEL_FLAGS, "--batch-size", "16", "--mixed-precision", "none", "--crop-area", "0.6,1"]

# Runs with two XLA host devices: the same training under one device, DataParallel and ModelParallel.
DISTRIBUTED = """
import json, tempfile
import keras, numpy as np
from keras_vit.training.finetune import finetune
from keras_vit.training.model import build_model
from keras_vit.training.distributed.strategy import get_strategy

config, out, weights = json.loads({config!r}), {{}}, {{}}
for name in ("default", "data_parallel", "model_parallel"):
    result = finetune(strategy=name, output_dir=tempfile.mkdtemp(), **config)
    weights[name] = [keras.ops.convert_to_numpy(v) for v in result.model.variables]
    metrics = json.load(open(result.output_dir + "/metrics.json"))
    layouts = {{v.path.removeprefix("encoderblock_0/"): str(getattr(v.value.sharding, "spec", "one device"))
                for v in result.model.variables if v.path.endswith("kernel")}}
    out[name] = {{k: metrics[k] for k in ("strategy", "replicas", "eval_examples")}}
    out[name].update(layouts=layouts, accuracy=result.metrics["accuracy"], loss=result.metrics["loss"])
    out[name]["val_loss"] = metrics["history"]["val_loss"]
    if name != "default":
        out[name]["max_difference"] = max(float(np.abs(a - b).max()) for a, b in zip(weights["default"], weights[name]))
keras.utils.set_random_seed(result.config.optim.seed)
initial = [keras.ops.convert_to_numpy(v) for v in build_model(result.config, 10).variables]
out["max_change"] = max(float(np.abs(a - b).max()) for a, b in zip(weights["default"], initial))
out["auto"] = get_strategy("auto").name
out["refused"] = {{}}
for name in ("mirrored", "tpu"):
    try:
        get_strategy(name)
    except ValueError as error:
        out["refused"][name] = str(error)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def two_devices():
    return python_json(DISTRIBUTED.format(config=json.dumps(CLIPPED)), backend="jax", host_devices=2)


def test_data_parallel_over_two_host_devices_equals_one_device(two_devices):
    """Global batch 16 split over 2 devices: the same weights after 4 clipped SGD steps as on one device."""
    out = two_devices
    assert out["auto"] == "DataParallel"  # --strategy auto with two devices
    assert (out["default"]["strategy"], out["default"]["replicas"]) == ("OneDevice", 1)
    assert (out["data_parallel"]["strategy"], out["data_parallel"]["replicas"]) == ("DataParallel", 2)
    assert out["max_change"] > 1e-3  # training moved the weights...
    assert out["data_parallel"]["max_difference"] < 1e-5  # ...identically (float tolerance; measured 1.4e-9)
    # JAX splits a batch only into equal parts: the held-out set's last batch (7 of 16) is filled with 9 blanks of
    # weight 0, so all 359 images are scored, with the accuracy and loss of one device.
    assert (out["default"]["eval_examples"], out["data_parallel"]["eval_examples"]) == (359, 359)
    assert out["data_parallel"]["accuracy"] == pytest.approx(out["default"]["accuracy"], abs=1e-7)
    assert out["data_parallel"]["loss"] == pytest.approx(out["default"]["loss"], rel=1e-5)
    assert len(out["default"]["val_loss"]) == 2  # and so is the held-out loss of each evaluation in the history
    assert out["data_parallel"]["val_loss"] == pytest.approx(out["default"]["val_loss"], rel=1e-5)


def test_model_parallel_shards_the_block_kernels_and_equals_one_device(two_devices):
    out = two_devices["model_parallel"]
    assert (out["strategy"], out["replicas"]) == ("ModelParallel", 1)  # a (batch 1, model 2) mesh
    assert out["layouts"] == {
        "embedding/kernel": "P(None, None, None, None)",
        "MultiHeadDotProductAttention_1/qkv/kernel": "P(None, 'model')",
        "MultiHeadDotProductAttention_1/out/kernel": "P('model', None)",
        "MlpBlock_3/Dense_0/kernel": "P(None, 'model')",
        "MlpBlock_3/Dense_1/kernel": "P('model', None)",
        "head/kernel": "P(None, None)",
    }
    assert out["max_difference"] < 1e-5  # measured 9.3e-10


def test_tf_distribute_strategies_are_refused_on_jax(two_devices):
    for name, message in two_devices["refused"].items():
        assert message.startswith(f"--strategy {name} is a tf.distribute strategy and needs KERAS_BACKEND=tensorflow")
        assert "use auto, default, data_parallel or model_parallel" in message


def run_command(module: str, args: list[str], backend: str = "jax", timeout: int = 600) -> str:
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        env=backend_env(backend),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow  # the fast tier trains on JAX in two_devices; CI's JAX pass runs the command's tests in-process
def test_the_finetune_command_trains_checkpoints_and_logs_on_jax(tmp_path):
    out = tmp_path / "run"
    args = [*FLAGS, "--steps", "4", "--eval-every", "2", "--checkpoint-every", "2", "--log-every", "1"]
    printed = run_command("keras_vit.training.finetune", [*args, "--verbose", "2", "--output-dir", str(out)])
    metrics = json.loads((out / "metrics.json").read_text())
    assert f"held-out accuracy: {metrics['eval']['accuracy']:.4f} on 359 images" in printed
    assert (metrics["backend"], metrics["strategy"], metrics["precision"]) == ("jax", "OneDevice", "float32")
    assert checkpoint_steps(str(out)) == [2, 4] and [e["step"] for e in read_log(str(out))] == [1, 2, 3, 4]
    for events in ("train", "validation", "steps"):
        assert glob.glob(str(out / "tensorboard" / events / "events.out.tfevents.*")), events
    step, manifest, _ = read_checkpoint(str(out / "checkpoints" / "ckpt-4.npz"))
    assert step == 4 and manifest["backend"] == "jax"


def test_the_pretrain_command_runs_on_jax(tmp_path):
    out = tmp_path / "run"
    args = [*FLAGS, "--steps", "2", "--eval-every", "2", "--pretrain-steps", "2", "--pretrain-eval-every", "2"]
    printed = run_command("keras_vit.training.pretrain", [*args, "--verbose", "2", "--output-dir", str(out)])
    summary = json.loads((out / "summary.json").read_text())
    assert "| masked patch prediction |" in printed and 0 <= summary["finetune"]["accuracy"] <= 1
    assert len(summary["pretrain_history"]["loss"]) == 1 and np.isfinite(summary["pretrain_history"]["loss"][0])
    assert (out / "encoder.keras").exists() and checkpoint_steps(str(out / "pretrain")) == [2]
    assert json.loads((out / "finetune" / "metrics.json").read_text())["backend"] == "jax"


TORCH_RESUME = """
import json, tempfile
import keras, numpy as np
from keras_vit.training.finetune import finetune
from keras_vit.training.distributed.strategy import get_strategy

config = json.loads({config!r})
whole = finetune(output_dir=tempfile.mkdtemp(), **config)
crashed = tempfile.mkdtemp()
try:
    finetune(output_dir=crashed, callbacks=[Crash(3)], **config)
except RuntimeError:
    pass
resumed = finetune(output_dir=crashed, **config)
metrics = json.load(open(crashed + "/metrics.json"))
try:
    get_strategy("data_parallel")
except ValueError as error:
    refused = str(error)
print(json.dumps(dict(
    strategy=metrics["strategy"], resumed_from=metrics["resumed_from_step"], refused=refused,
    max_difference=max(float(np.abs(keras.ops.convert_to_numpy(a) - keras.ops.convert_to_numpy(b)).max())
                       for a, b in zip(whole.model.variables, resumed.model.variables)),
)))
"""


@pytest.mark.slow  # CI's torch pass runs the in-process training tests; this checks torch from a TensorFlow run
@pytest.mark.requires("torch")
def test_torch_trains_on_one_device_and_resumes_exactly():
    config = {**CLIPPED, "checkpoint_every": 2, "dropout": 0.1}
    code = f"import sys; sys.path.insert(0, {os.path.join(REPO, 'tests')!r})\n" + TORCH_RESUME.format(
        config=json.dumps(config)
    )
    out = python_json(code, backend="torch")
    assert (out["strategy"], out["resumed_from"]) == ("OneDevice", 2)
    assert out["max_difference"] < 1e-6  # dropout on: the seed generators' states are in the checkpoint too
    assert out["refused"].startswith("--strategy data_parallel is a keras.distribution of the JAX backend")


@pytest.mark.slow
def test_a_killed_jax_run_resumes_exactly(tmp_path):
    """SIGKILL ``python -m keras_vit.training.finetune`` on JAX mid-run, start it again: it resumes from its last
    checkpoint, and its per-step losses, learning rates and final weights are those of an uninterrupted run."""
    # evaluations on the checkpoints' steps: the logged loss is differenced from Keras' running mean of the epoch,
    # so a resumed epoch that began elsewhere would round differently (2.5e-5 relative over 150-step epochs)
    args = [*FLAGS, "--steps", "150", "--checkpoint-every", "20", "--log-every", "1", "--eval-every", "20"]
    args += ["--dropout", "0.1", "--verbose", "0"]
    whole, killed = str(tmp_path / "whole"), str(tmp_path / "killed")
    run_command("keras_vit.training.finetune", [*args, "--output-dir", whole])
    command = [sys.executable, "-m", "keras_vit.training.finetune", *args, "--output-dir", killed]
    process = subprocess.Popen(command, cwd=REPO, env=backend_env("jax"), stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while time.time() < deadline and process.poll() is None:
        if os.path.exists(os.path.join(killed, "train_log.jsonl")) and len(read_log(killed)) >= 50:
            break
        time.sleep(0.05)
    assert process.poll() is None, "the run ended before it could be killed"
    process.send_signal(signal.SIGKILL)
    process.wait()
    saved = checkpoint_steps(killed)[-1]
    assert saved == read_log(killed)[-1]["step"] // 20 * 20 >= 40

    run_command("keras_vit.training.finetune", [*args, "--output-dir", killed])
    assert json.loads((tmp_path / "killed" / "metrics.json").read_text())["resumed_from_step"] == saved
    log, reference = read_log(killed), read_log(whole)
    assert [e["step"] for e in log] == list(range(1, 151))
    np.testing.assert_allclose([e["loss"] for e in log], [e["loss"] for e in reference], rtol=1e-5)
    np.testing.assert_allclose([e["lr"] for e in log], [e["lr"] for e in reference], rtol=1e-6)
    ours, theirs = (read_checkpoint(os.path.join(run, "checkpoints", "ckpt-150.npz"))[2] for run in (killed, whole))
    for a, b in zip(ours["model"] + ours["optimizer"], theirs["model"] + theirs["optimizer"]):
        np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.slow
def test_the_offline_default_reaches_its_stated_accuracy_on_jax(tmp_path):
    """``python -m keras_vit.training.finetune`` with no arguments on JAX: the digits preset (TensorFlow: 0.9721)."""
    printed = run_command(
        "keras_vit.training.finetune", ["--output-dir", str(tmp_path), "--verbose", "2"], timeout=1800
    )
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["backend"] == "jax" and metrics["eval_examples"] == 359
    assert metrics["eval"]["accuracy"] >= 0.93, metrics["eval"]
    assert f"held-out accuracy: {metrics['eval']['accuracy']:.4f} on 359 images" in printed
