"""Checkpoints and resuming: a run that dies mid-way and is started again continues where its last
checkpoint left off, with the step counter, optimizer state, schedule and data stream intact."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import keras
import numpy as np
import pytest
from training_support import REPO, TINY, TINY_MODEL_FLAGS, Crash, backend_env, checkpoint_steps, iterations, read_log

from keras_vit.training import ablation
from keras_vit.training.checkpoint import checkpoint_path, read_checkpoint
from keras_vit.training.finetune import finetune
from keras_vit.training.loop import plan_segments, truncate_log
from keras_vit.training.schedules import WarmupDecay

# torch runs the library tests, and of these only the tests marked for it below
pytestmark = pytest.mark.backends("tensorflow", "jax")

RUN = {
    **TINY,
    "steps": 12,
    "eval_every": 5,
    "checkpoint_every": 4,
    "log_every": 1,
    "dropout": 0.1,
    "optimizer": "sgd",
    "lr": 0.05,
    "warmup": 3,
}


def test_plan_segments_keeps_epoch_boundaries():
    def plan(*args):  # (first epoch, epochs, steps per epoch, start step) per fit call
        return [dataclasses.astuple(segment) for segment in plan_segments(*args)]

    assert plan(0, 12, 5) == [(0, 2, 5, 0), (2, 1, 2, 10)]
    assert plan(7, 12, 5) == [(1, 1, 3, 7), (2, 1, 2, 10)]
    assert plan(4, 15, 5) == [(0, 1, 1, 4), (1, 2, 5, 5)]
    assert plan(12, 12, 5) == []
    with pytest.raises(ValueError):
        plan_segments(0, 10, 0)


def test_truncate_log_drops_steps_past_the_checkpoint_and_a_cut_line(tmp_path):
    path = tmp_path / "train_log.jsonl"
    lines = [json.dumps({"step": s, "batch": s, "loss": 1.0 / s}) for s in range(1, 6)]
    path.write_text("\n".join(lines) + '\n{"step": 6, "ba')
    truncate_log(str(path), 3)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]


@pytest.mark.backends("tensorflow", "jax", "torch")
def test_crash_and_resume_continues_the_run_exactly(tmp_path, capsys):
    whole = finetune(output_dir=str(tmp_path / "whole"), **RUN)
    crashed_dir = str(tmp_path / "crashed")
    with pytest.raises(RuntimeError, match="simulated crash"):
        finetune(output_dir=crashed_dir, callbacks=[Crash(7)], **RUN)
    assert checkpoint_steps(crashed_dir) == [4]
    assert [e["step"] for e in read_log(crashed_dir)] == list(range(1, 8))  # it logged past its checkpoint

    capsys.readouterr()
    resumed = finetune(output_dir=crashed_dir, **{**RUN, "verbose": 2})  # one line an interval
    checkpoints = os.path.join(crashed_dir, "checkpoints")
    assert f"resuming at step 4 of 12 from {checkpoints}\n" in capsys.readouterr().out
    metrics = json.loads((tmp_path / "crashed" / "metrics.json").read_text())
    assert metrics["resumed_from_step"] == 4
    assert iterations(resumed.model) == 12
    log, reference = read_log(crashed_dir), read_log(str(tmp_path / "whole"))
    assert [e["step"] for e in log] == list(range(1, 13))  # steps 5-7 of the crashed run were dropped
    np.testing.assert_allclose([e["loss"] for e in log], [e["loss"] for e in reference], rtol=1e-5)
    np.testing.assert_allclose([e["lr"] for e in log], [e["lr"] for e in reference], rtol=1e-6)
    schedule = WarmupDecay(0.05, 12, 3, "cosine")
    np.testing.assert_allclose([e["lr"] for e in log], [float(schedule(s - 1)) for s in range(1, 13)], rtol=1e-6)
    for a, b in zip(resumed.model.get_weights(), whole.model.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert resumed.metrics["accuracy"] == pytest.approx(whole.metrics["accuracy"])


@pytest.mark.backends("tensorflow")  # a run folder's decisions: backend-independent
def test_a_finished_run_is_not_retrained_and_a_changed_one_is_refused(tmp_path):
    run = {**RUN, "steps": 3, "dropout": 0.0}
    first = finetune(output_dir=str(tmp_path), **run)
    metrics = (tmp_path / "metrics.json").read_bytes()
    again = finetune(output_dir=str(tmp_path), **run)  # finished: nothing is trained, evaluated or written again
    assert (tmp_path / "metrics.json").read_bytes() == metrics and json.loads(metrics)["resumed_from_step"] == 0
    for a, b in zip(first.model.get_weights(), again.model.get_weights()):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match=r"different settings \(lr\)"):
        finetune(output_dir=str(tmp_path), **{**run, "lr": 0.5})
    model = keras.saving.load_model(str(tmp_path / "model.keras"))
    images = np.random.default_rng(0).uniform(-1, 1, (2, 8, 8, 3)).astype("float32")
    np.testing.assert_allclose(model.predict(images, verbose=0), again.model.predict(images, verbose=0), atol=1e-6)


@pytest.mark.backends("tensorflow")  # backend-independent
def test_gradient_accumulation_equals_the_whole_batch(tmp_path):
    """Two accumulated micro-batches of 8 make the same updates as one batch of 16 (same data order)."""
    run = {**RUN, "steps": 3, "dropout": 0.0, "clip_norm": 0.05}
    whole = finetune(output_dir=str(tmp_path / "whole"), **run)
    accumulated = finetune(output_dir=str(tmp_path / "accumulated"), accumulation_steps=2, **run)
    assert iterations(accumulated.model) == 3
    for a, b in zip(whole.model.get_weights(), accumulated.model.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert [e["step"] for e in read_log(str(tmp_path / "accumulated"))] == [1, 2, 3]


# TINY as the ablation's flags.
ABLATION_FLAGS = [*TINY_MODEL_FLAGS, "--batch-size=16", "--crop-area=0.6,1", "--warmup=2", "--eval-every=5"]


@pytest.mark.backends("tensorflow")  # the ablation's settings and folders: backend-independent
def test_ablation_gradient_accumulation_equals_the_whole_batch(tmp_path):
    """As finetune's: ``ablation --accumulation-steps 2`` (two micro-batches of 8 per update) makes the same updates
    as one batch of 16, on a setting of its own (learned 2-D position embeddings, spared SGD's weight decay)."""
    flags = [*ABLATION_FLAGS, "--positions=learned_2d", "--steps=3", "--optimizer=sgd", "--lr=0.05", "--clip-norm=0.05"]
    flags += ["--mixed-precision=none", "--log-every=1"]
    rows, folders = {}, {}
    for name, accumulation in (("whole", 1), ("accumulated", 2)):
        out = str(tmp_path / name)
        rows[name] = ablation.main([*flags, f"--accumulation-steps={accumulation}", "--output-dir", out])
        folders[name] = ablation.run_folder(out, "learned_2d", "token", 0)
    _, manifest, arrays = read_checkpoint(checkpoint_path(os.path.join(folders["accumulated"], "checkpoints"), 6))
    names = [path.rpartition("/")[2] for path, *_ in manifest["optimizer"]]
    # Keras counts micro-batches (6); its optimizer.iterations divides by the accumulation steps: 3 updates
    assert int(arrays["optimizer"][names.index("iteration")]) == 6
    whole, accumulated = (keras.saving.load_model(os.path.join(folders[name], "model.keras")) for name in folders)
    for a, b in zip(whole.get_weights(), accumulated.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert [e["step"] for e in read_log(folders["accumulated"])] == [1, 2, 3]
    assert rows["accumulated"][0].accuracies == pytest.approx(rows["whole"][0].accuracies)


@pytest.mark.backends("tensorflow")  # the ablation's settings and folders: backend-independent
def test_the_ablation_runs_each_setting_as_finetune_does_and_resumes(tmp_path, capsys):
    """Every setting is a run in its own folder (checkpoints, model.keras, metrics.json) in the precision asked
    for; started again, each is finished and nothing is trained again; changed settings are refused, naming them."""
    out = str(tmp_path / "ablation")
    flags = [*ABLATION_FLAGS, "--positions=none", "--classifiers=token,gap", "--steps=2", "--checkpoint-every=1"]
    flags += ["--mixed-precision=bfloat16", "--output-dir", out]
    first = ablation.main(flags)
    folders = [Path(ablation.run_folder(out, "none", classifier, 0)) for classifier in ("token", "gap")]
    for folder in folders:
        metrics = json.loads((folder / "metrics.json").read_text())
        assert (metrics["precision"], metrics["resumed_from_step"]) == ("mixed_bfloat16", 0)
        assert checkpoint_steps(str(folder)) == [1, 2] and (folder / "model.keras").exists()
    assert os.path.exists(os.path.join(out, "ablation.md"))
    metrics = [(folder / "metrics.json").read_bytes() for folder in folders]
    again = ablation.main(flags)  # every setting finished: nothing is trained or written again
    assert [(folder / "metrics.json").read_bytes() for folder in folders] == metrics
    assert [row.accuracies for row in again] == [row.accuracies for row in first]
    capsys.readouterr()
    with pytest.raises(SystemExit):
        ablation.main([*flags, "--lr=0.5"])
    assert "holds a run with different settings (lr)" in capsys.readouterr().err


@pytest.mark.slow
def test_killed_command_resumes_from_its_last_checkpoint(tmp_path):
    """Really SIGKILL the command mid-run, start it again: it restarts from the last checkpoint."""
    out = str(tmp_path / "run")
    args = [
        sys.executable,
        "-m",
        "keras_vit.training.finetune",
        *TINY_MODEL_FLAGS,
        "--batch-size",
        "16",
        "--steps",
        "3000",
        "--checkpoint-every",
        "50",
        "--log-every",
        "1",
        "--eval-every",
        "1000",
        "--verbose",
        "0",
        "--output-dir",
        out,
    ]
    env = backend_env(keras.backend.backend())
    process = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = os.path.join(out, "train_log.jsonl")
    deadline = time.time() + 600
    while time.time() < deadline and process.poll() is None:
        if os.path.exists(log) and len(read_log(out)) >= 130:
            break
        time.sleep(0.05)
    assert process.poll() is None, "the run ended before it could be killed"
    process.send_signal(signal.SIGKILL)
    process.wait()
    killed_at = read_log(out)[-1]["step"]
    checkpoint = checkpoint_steps(out)[-1]
    assert checkpoint == killed_at // 50 * 50 >= 100

    args[args.index("--verbose") + 1] = "2"  # how a run reports may change between restarts
    done = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["resumed_from_step"] == checkpoint
    assert [e["step"] for e in read_log(out)] == list(range(1, 3001))
    assert f"held-out accuracy: {metrics['eval']['accuracy']:.4f}" in done.stdout
