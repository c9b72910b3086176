"""Training faults, each on real files: --overwrite of a folder that is not a run's, a diverged
run, broken checkpoints, a run that fails before its first step, corrupt or unusual image files, bad
settings, and the commands' one-line errors. See docs/faults.md."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
from PIL import Image
from training_support import (
    REPO,
    TINY,
    TINY_MODEL_FLAGS,
    Crash,
    backend_env,
    checkpoint_steps,
    damaged_folder,
    read_log,
    write_images,
)

from keras_vit.files import temporary_path
from keras_vit.training import outputs
from keras_vit.training.checkpoint import Checkpointer, read_checkpoint
from keras_vit.training.config import TrainConfig, resolve
from keras_vit.training.data import load_source
from keras_vit.training.errors import CorruptDataError, DivergedError, OutputDirError, TrainingError
from keras_vit.training.finetune import finetune, main

# torch runs the library tests, and of these only the tests marked for it below
pytestmark = pytest.mark.backends("tensorflow", "jax")

RUN = {**TINY, "steps": 6, "checkpoint_every": 2, "log_every": 1}


def strict_json(path):
    """The JSON in ``path``, refusing NaN and Infinity as a strict parser does."""
    with open(path) as file:
        return json.load(file, parse_constant=lambda name: pytest.fail(f"{path} holds {name}"))


# --- --overwrite -------------------------------------------------------------------------------------


@pytest.mark.backend_independent
def test_overwrite_refuses_a_folder_that_holds_no_run_and_deletes_nothing(tmp_path):
    (tmp_path / "photo.jpg").write_bytes(b"the user's")
    (tmp_path / "album").mkdir()
    with pytest.raises(OutputDirError, match=f"refuses to clear {tmp_path}: it is not empty and holds no run"):
        finetune(output_dir=str(tmp_path), overwrite=True, **RUN)
    assert sorted(os.listdir(tmp_path)) == ["album", "photo.jpg"]
    assert (tmp_path / "photo.jpg").read_bytes() == b"the user's"


@pytest.mark.backend_independent
@pytest.mark.parametrize("command", ["finetune", "pretrain"])
def test_a_first_run_into_a_users_folder_is_refused_and_touches_nothing(tmp_path, command, capsys):
    """A folder holding the user's own model.keras, metrics.json and tensorboard/ (no run marker): the run would
    overwrite them and mark the folder, so that a later --overwrite would delete the rest. It is refused."""
    from keras_vit.training import pretrain

    (tmp_path / "model.keras").write_bytes(b"the user's model")
    (tmp_path / "metrics.json").write_text('{"mine": 1}')
    (tmp_path / "tensorboard").mkdir()
    (tmp_path / "tensorboard" / "my_events.txt").write_text("the user's events")
    before = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    main_of = {"finetune": main, "pretrain": pretrain.main}[command]
    with pytest.raises(SystemExit) as exited:
        main_of(["--output-dir", str(tmp_path), "--steps", "1"])
    assert exited.value.code == 1
    assert capsys.readouterr().err.strip().endswith("Choose another --output-dir.")
    assert {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


@pytest.mark.backends("tensorflow", "jax")
@pytest.mark.parametrize(
    "signal_number",
    [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.backends("tensorflow"))],  # one handler for both
)
def test_a_preempted_run_checkpoints_where_it_is_says_so_and_resumes(tmp_path, signal_number):
    """SIGTERM (a preemption) or Ctrl-C mid-run: a checkpoint at the step reached, one line, a non-zero exit; the
    same command resumes from that step, nothing since the last periodic checkpoint (here: none) is lost, and
    ``metrics.json`` keeps the history of every epoch, those before the stop included."""
    out = tmp_path / "run"
    flags = [*TINY_MODEL_FLAGS, "--output-dir", str(out), "--steps", "120", "--eval-every", "20", "--log-every", "1"]
    flags += ["--checkpoint-every", "1000", "--batch-size", "8", "--mixed-precision", "none"]
    command = [sys.executable, "-m", "keras_vit.training.finetune", *flags]
    run = subprocess.Popen(
        command, env=backend_env(keras.backend.backend()), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    log = out / "train_log.jsonl"
    deadline = time.monotonic() + 240
    while not (log.exists() and len(log.read_text().splitlines()) >= 25) and time.monotonic() < deadline:
        assert run.poll() is None, run.stderr.read()[-2000:]
        time.sleep(0.05)
    run.send_signal(signal_number)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 1
    last = err.strip().splitlines()[-1]
    stopped = int(re.fullmatch(rf"error: stopped by {signal_number.name} at step (\d+): .*resume\.", last).group(1))
    assert 25 <= stopped < 120  # past the first epoch
    assert checkpoint_steps(str(out)) == [stopped]  # the only checkpoint: the one written on the signal
    main([*flags, "--verbose", "0"])  # the same command again, in this process
    steps = [entry["step"] for entry in read_log(str(out))]
    assert steps == list(range(1, 121))  # every step logged once: the resume went on from the checkpoint
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["resumed_from_step"] == stopped
    history = metrics["history"]
    assert history["epoch"] == list(range(6))  # 120 steps, an epoch every 20: none lost to the stop
    assert {"loss", "accuracy", "val_loss", "val_accuracy"} <= set(history)
    assert all(len(values) == 6 for values in history.values())
    assert all(isinstance(value, float) for key in ("loss", "val_accuracy") for value in history[key])


@pytest.mark.backends("tensorflow")  # processes and folders: backend-independent
def test_a_run_folder_deleted_while_the_run_trains_ends_the_process_in_one_line(tmp_path):
    out = tmp_path / "run"
    command = [sys.executable, "-m", "keras_vit.training.finetune", *TINY_MODEL_FLAGS, "--output-dir", str(out)]
    command += ["--steps", "100000", "--eval-every", "100000", "--checkpoint-every", "20", "--mixed-precision", "none"]
    run = subprocess.Popen(command, env=backend_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while not checkpoint_steps(str(out)) and time.monotonic() < deadline:
            assert run.poll() is None, run.stderr.read()[-2000:]
            time.sleep(0.1)
        shutil.rmtree(out)
        _, err = run.communicate(timeout=30)  # it ends: no thread left waiting
    finally:
        run.kill()
    assert run.returncode == 1
    errors = [line for line in err.splitlines() if line.startswith(("error", "Traceback"))]
    assert errors == [
        f"error: --output-dir {out} was deleted while the run was writing it; the run stopped. Start it again to "
        "train from the beginning."
    ]


@pytest.mark.backends("tensorflow")  # folders: backend-independent
def test_a_run_folder_deleted_just_before_a_checkpoint_is_not_made_again_and_the_run_stops(tmp_path):
    """Deleted after step 39 with a checkpoint due at step 40, whose save would make the folder again (and the log line
    after it would write there): the run stops at the next batch with the one error, and the folder stays gone. The
    test above deletes it at a moment the operating system picks, which once (CI, 2026-12-07) fell there."""
    out = tmp_path / "run"

    class Delete(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 38:  # the epoch's 39th batch: step 39, after the run's own step-end work
                shutil.rmtree(out)

    with pytest.raises(OutputDirError, match=f"--output-dir {re.escape(str(out))} was deleted while the run was"):
        run = {**RUN, "steps": 60, "checkpoint_every": 20, "log_every": 10, "eval_every": 60}
        finetune(output_dir=str(out), callbacks=[Delete()], **run)
    assert not out.exists()


@pytest.mark.backend_independent
def test_a_run_refused_by_its_checks_leaves_no_folder_it_made_and_keeps_the_users(tmp_path):
    """An image size the patch does not divide is refused when the model is built, inside the run's folder lock."""
    bad = {**TINY, "image_size": 10, "steps": 2}
    with pytest.raises(ValueError, match="image_size"):
        finetune(output_dir=str(tmp_path / "new" / "run"), **bad)
    assert not (tmp_path / "new").exists()  # neither the run folder nor the parent it made
    (tmp_path / "mine").mkdir()
    with pytest.raises(ValueError, match="image_size"):
        finetune(output_dir=str(tmp_path / "mine"), **bad)
    assert (tmp_path / "mine").is_dir() and not list((tmp_path / "mine").iterdir())  # the user's folder stays
    with pytest.raises(ValueError, match="refused"), outputs.run_lock(str(tmp_path / "locked" / "run")):
        assert (tmp_path / "locked" / "run" / outputs.LOCK).is_file()
        raise ValueError("refused inside the lock")
    assert not (tmp_path / "locked").exists()


@pytest.mark.backends("tensorflow")  # processes and file locks: backend-independent
def test_a_second_run_into_a_live_runs_folder_is_refused_and_a_killed_runs_lock_is_taken_over(tmp_path, capsys):
    out = tmp_path / "run"
    flags = [*TINY_MODEL_FLAGS, "--output-dir", str(out), "--steps", "5000"]
    first = subprocess.Popen(
        [sys.executable, "-m", "keras_vit.training.finetune", *flags],
        env=backend_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        lock = out / outputs.LOCK
        deadline = time.monotonic() + 180
        while not (lock.exists() and lock.read_text().strip()) and time.monotonic() < deadline:
            assert first.poll() is None, "the first run ended before it took the lock"
            time.sleep(0.1)
        first.send_signal(signal.SIGSTOP)  # alive and holding the lock, without taking the CPU the test needs
        assert lock.read_text().strip() == str(first.pid)
        with pytest.raises(SystemExit) as second:  # the same command, in this process
            main(flags)
        assert second.value.code == 1
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            f"error: {out} is in use by another run (process {first.pid}): wait for it to end, or choose another "
            "--output-dir."
        )
        assert first.poll() is None  # the first run goes on
    finally:
        first.kill()
        first.wait()
    with outputs.run_lock(str(out)):  # a killed run's lock is free: the next run takes it over
        assert lock.read_text().strip() == str(os.getpid())
    assert not lock.exists()  # a run that ends removes its lock file


@pytest.mark.backends("tensorflow")  # backend-independent
def test_overwrite_of_a_run_folder_deletes_only_what_runs_write(tmp_path):
    out = tmp_path / "run"
    finetune(output_dir=str(out), **{**RUN, "steps": 2})
    (out / "notes.txt").write_text("mine")
    (out / "data").mkdir()
    (out / "data" / "x.csv").write_text("1,2")
    with open(temporary_path(out / "model.keras"), "wb") as file:  # what a run killed while saving leaves
        file.write(b"PK\x03\x04 cut short")
    finetune(output_dir=str(out), overwrite=True, **{**RUN, "steps": 2, "lr": 0.5})
    assert (out / "notes.txt").read_text() == "mine" and (out / "data" / "x.csv").read_text() == "1,2"
    metrics = strict_json(out / "metrics.json")
    assert metrics["resumed_from_step"] == 0 and metrics["config"]["lr"] == 0.5  # a new run, not a resumed one
    assert sorted(os.listdir(out)) == [
        outputs.MARKER,
        "checkpoints",
        "classes.txt",
        "data",
        "metrics.json",
        "model.keras",
        "notes.txt",
        "run.json",
        "tensorboard",
        "train_log.jsonl",
    ]


# --- divergence and strict JSON ----------------------------------------------------------------------


def test_a_diverged_run_stops_at_the_first_non_finite_loss_and_keeps_the_last_good_checkpoint(tmp_path):
    out = str(tmp_path)
    with pytest.raises(DivergedError) as caught:
        finetune(output_dir=out, **{**RUN, "steps": 30, "lr": 1e6})
    message = re.search(
        r"loss is nan at step (\d+) \(batch \1\); the last checkpoint, step 2.*lower --lr.*--drop-path",
        str(caught.value),
    )
    assert message, caught.value  # the step varies by backend: 4 on TensorFlow, 3 on JAX
    nan_step = int(message[1])
    assert checkpoint_steps(out) == [2] and nan_step in (3, 4)  # none at or after the NaN step
    step, manifest, arrays = read_checkpoint(os.path.join(out, "checkpoints", "ckpt-2.npz"))
    assert step == 2 and len(arrays["model"]) == len(manifest["model"]) > 10
    for (path, _, _), array in zip(manifest["model"] + manifest["optimizer"], arrays["model"] + arrays["optimizer"]):
        assert not np.issubdtype(array.dtype, np.floating) or np.isfinite(array).all(), path
    assert not {"model.keras", "metrics.json"} & set(os.listdir(out))
    assert [e["step"] for e in read_log(out)] == list(range(1, nan_step))  # every logged loss is finite


@pytest.mark.backend_independent
def test_json_outputs_are_strict_with_non_finite_values_as_null(tmp_path):
    path = str(tmp_path / "m.json")
    outputs.write_json(path, {"loss": float("nan"), "history": [1.0, float("inf")], "n": 3})
    assert strict_json(path) == {"loss": None, "history": [1.0, None], "n": 3}


# --- broken checkpoints ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def crashed_run(tmp_path_factory):
    """A run that died after batch 5: checkpoints 2 and 4, log entries 1-5."""
    out = str(tmp_path_factory.mktemp("crashed") / "run")
    with pytest.raises(RuntimeError, match="simulated crash"):
        finetune(output_dir=out, callbacks=[Crash(5)], **RUN)
    assert checkpoint_steps(out) == [2, 4]
    return out


def resume_copy(crashed_run, tmp_path, breakage):
    out = str(tmp_path / "run")
    shutil.copytree(crashed_run, out)
    breakage(os.path.join(out, "checkpoints"))
    finetune(output_dir=out, **RUN)
    return out


@pytest.mark.parametrize("older", [False, True], ids=["this version", "older keras-vit"])
@pytest.mark.backends("tensorflow")  # checkpoint files: backend-independent (restores: test_loop)
def test_a_temporary_file_of_a_killed_save_is_passed_over_and_removed(crashed_run, tmp_path, capsys, older):
    def half_written(folder):
        name = ".ckpt-6-x1y2.tmp" if older else temporary_path(os.path.join(folder, "ckpt-6.npz"))
        with open(os.path.join(folder, name), "wb") as file:
            file.write(b"PK\x03\x04 cut short")
        with open(temporary_path(os.path.join(folder, os.pardir, "metrics.json")), "w") as file:
            file.write('{"accur')

    out = resume_copy(crashed_run, tmp_path, half_written)
    assert "warning" not in capsys.readouterr().err
    assert strict_json(os.path.join(out, "metrics.json"))["resumed_from_step"] == 4
    assert sorted(os.listdir(os.path.join(out, "checkpoints"))) == ["ckpt-2.npz", "ckpt-4.npz", "ckpt-6.npz"]
    assert not [name for name in os.listdir(out) if name.startswith(".metrics.")]
    assert [e["step"] for e in read_log(out)] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize(
    "breakage", ["truncated", "not a checkpoint", "non-finite values", "another step", "another dtype"]
)
@pytest.mark.backends("tensorflow")  # checkpoint files: backend-independent (restores: test_loop)
def test_a_broken_newest_checkpoint_falls_back_to_the_previous_one(crashed_run, tmp_path, capsys, breakage):
    def damage(folder):
        path = os.path.join(folder, "ckpt-4.npz")
        if breakage == "truncated":
            with open(path, "r+b") as file:
                file.truncate(os.path.getsize(path) // 2)
        elif breakage == "not a checkpoint":
            with open(path, "wb") as file:
                file.write(b"\x00garbage {{")
        else:  # a whole file whose contents do not fit: a NaN weight, the step of another file, another dtype
            with np.load(path) as data:
                arrays = dict(data)
            if breakage == "non-finite values":
                arrays["model/0"] = np.full_like(arrays["model/0"], np.nan)
            elif breakage == "another dtype":
                arrays["model/0"] = arrays["model/0"].astype(np.float64)
            else:
                arrays["step"] = np.int64(2)
            np.savez(path, **arrays)

    before = read_log(crashed_run)
    out = resume_copy(crashed_run, tmp_path, damage)
    warning = capsys.readouterr().err
    assert f"resuming from {os.path.join(out, 'checkpoints', 'ckpt-2.npz')} (step 2)" in warning
    assert "ckpt-4.npz: " in warning
    reason = {
        "non-finite values": "NaN or infinite values in model ",
        "another step": "holds step 2, not 4",
        "another dtype": "is float64 ",
    }
    assert reason.get(breakage, "") in warning
    assert strict_json(os.path.join(out, "metrics.json"))["resumed_from_step"] == 2
    log = read_log(out)
    assert [e["step"] for e in log] == [1, 2, 3, 4, 5, 6]
    assert log[:2] == before[:2]  # the entries up to the restored step are kept


def test_a_checkpoint_of_another_model_or_an_older_format_is_refused(tmp_path):
    def compiled(units):
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(units, name="dense")], name="tiny")
        model.compile(optimizer="sgd", loss="mse")
        model.optimizer.build(model.trainable_variables)
        return model

    folder = str(tmp_path / "checkpoints")
    Checkpointer(folder).save(compiled(4), 7)
    other = compiled(5)
    mismatch = r"ckpt-7.npz does not match .*tiny/dense/kernel \(3, 4\) vs tiny/dense/kernel \(3, 5\)"
    with pytest.raises(ValueError, match=mismatch):
        Checkpointer(folder).restore(other)
    same = compiled(4)
    assert Checkpointer(folder).restore(same) == 7
    old = tmp_path / "old" / "checkpoints"
    old.mkdir(parents=True)
    (old / "ckpt-4.index").write_bytes(b"")
    with pytest.raises(TrainingError, match=r"tf.train checkpoints .* --overwrite"):
        Checkpointer(str(old)).restore(same)


# --- a run that fails before its first step ----------------------------------------------------------


@pytest.mark.backend_independent
def test_a_run_that_fails_before_its_first_step_does_not_bind_the_corrected_rerun(tmp_path):
    out = str(tmp_path / "run")
    with pytest.raises(FileNotFoundError, match="No checkpoint file"):
        finetune(output_dir=out, weights=str(tmp_path / "missing.npz"), **RUN)
    assert not os.path.exists(os.path.join(out, "run.json"))
    result = finetune(output_dir=out, **{**RUN, "steps": 2})
    assert result.config.preset == "digits" and checkpoint_steps(out) == [2]


# --- image folders -----------------------------------------------------------------------------------


@pytest.mark.backend_independent
def test_corrupt_images_are_named_before_training(tmp_path):
    truncated, text = damaged_folder(str(tmp_path / "images"))
    out = str(tmp_path / "run")
    with pytest.raises(CorruptDataError, match="2 of 14 image files do not decode") as caught:
        finetune(dataset=str(tmp_path / "images"), output_dir=out, **RUN)
    assert f"{truncated} (" in str(caught.value) and "runcated" in str(caught.value)  # PIL's words vary
    assert f"{text} (not an image)" in str(caught.value) and "--skip-corrupt" in str(caught.value)
    assert not os.path.exists(out)  # nothing started


@pytest.mark.backends("tensorflow")  # backend-independent
def test_skip_corrupt_leaves_them_out_and_webp_images_train(tmp_path, capsys):
    root = str(tmp_path / "images")
    truncated, text = damaged_folder(root)
    for i in range(2):  # WebP images of the emu class's colour
        Image.fromarray(np.full((9, 11, 3), (30, 30, 220), np.uint8)).save(
            os.path.join(root, "emu", f"w{i}.webp"), lossless=True
        )
    source = load_source(root, eval_fraction=0.25, skip_corrupt=True)
    warning = capsys.readouterr().err
    assert "skipping 2 of 16 image files that do not decode" in warning and truncated in warning and text in warning
    assert source.train.num_examples + source.eval.num_examples == 14
    paths = [*source.train.items, *source.eval.items]
    assert sum(p.endswith(".webp") for p in paths) == 2 and truncated not in paths
    images = dict(zip(paths, [*source.train.examples(), *source.eval.examples()]))
    image, label = images[os.path.join(root, "emu", "w0.webp")]
    assert image.shape == (9, 11, 3) and int(label) == 2 and image.numpy()[0, 0].tolist() == [30, 30, 220]
    result = finetune(dataset=root, skip_corrupt=True, output_dir=str(tmp_path / "run"), **{**RUN, "steps": 2})
    assert result.config.data.skip_corrupt and os.path.exists(tmp_path / "run" / "model.keras")


@pytest.mark.backend_independent
def test_an_empty_class_folder_is_an_error_naming_it(tmp_path):
    write_images(str(tmp_path), per_class=2)
    (tmp_path / "fox").mkdir()
    (tmp_path / "fox" / "readme.txt").write_text("no images yet")
    (tmp_path / ".cache").mkdir()  # hidden folders are not classes
    with pytest.raises(ValueError, match=f"Class folders without images .*: {tmp_path / 'fox'};"):
        load_source(str(tmp_path))


@pytest.mark.backend_independent
def test_an_output_folder_inside_the_dataset_is_refused_and_an_older_run_folder_there_is_not_a_class(tmp_path, capsys):
    """``finetune --dataset ds --output-dir ds/run``, run again, found ``ds/run`` a class without images and said to
    remove it (the run). Now a run refuses an output folder inside its image folder before anything is written,
    naming both; a run folder already there (an older keras-vit's, moved in) is left out of the classes with a
    warning naming it."""
    dataset = tmp_path / "ds"
    write_images(str(dataset), per_class=4)
    inside = dataset / "run"
    with pytest.raises(OutputDirError, match=f"--output-dir {inside} is inside --dataset {dataset}: .* class"):
        finetune(dataset=str(dataset), output_dir=str(inside), **{**RUN, "steps": 1})
    assert not inside.exists()
    finetune(dataset=str(dataset), output_dir=str(tmp_path / "run"), **{**RUN, "steps": 1})
    (tmp_path / "run").rename(inside)
    capsys.readouterr()
    source = load_source(str(dataset))
    assert source.class_names == ("cat", "dog", "emu")
    assert f"warning: leaving out {inside}: a keras-vit run folder (.keras_vit_run)" in capsys.readouterr().err


# --- settings and the command line -------------------------------------------------------------------


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "flat, message",
    [
        (dict(lr=-0.1), "--lr must be >= 0, got -0.1"),
        (dict(warmup=-3.0), "--warmup must be >= 0, got -3."),
        (dict(drop_path=1.0), r"--drop-path must be in \[0, 1\), got 1."),
        (dict(dropout=-0.5), r"--dropout must be in \[0, 1\), got -0.5"),
        (dict(steps=0), "--steps must be >= 1, got 0"),
        (dict(batch_size=0), "--batch-size must be >= 1, got 0"),
        (dict(eval_fraction=1.5), r"--eval-fraction must be in \(0, 1\), got 1.5"),
        (dict(epochs=0, steps=None), "--epochs must be >= 1, got 0"),
        (dict(label_smoothing=1.0), r"--label-smoothing must be in \[0, 1\), got 1"),
        (dict(crop_area=(0.0, 1.0)), r"--crop-area must be in \(0, 1\], got 0,1"),
        (dict(crop_area=(0.9, 0.5)), "--crop-area must be low,high with low <= high, got 0.9,0.5"),
    ],
)
def test_bad_settings_are_errors_naming_the_option_and_the_value_as_given(flat, message):
    with pytest.raises(ValueError, match=message):
        resolve(TrainConfig.from_flat(flat), train_examples=1438, accelerator="cpu")


@pytest.mark.backend_independent
def test_a_command_line_error_is_one_line_unless_debugging(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("KERAS_VIT_DEBUG", raising=False)
    args = ["--warmup", "-3", "--output-dir", str(tmp_path / "run")]
    with pytest.raises(SystemExit) as exited:
        main(args)
    assert exited.value.code == 1
    assert capsys.readouterr().err == "error: --warmup must be >= 0, got -3.\n"
    with pytest.raises(ValueError, match="--warmup"):
        main([*args, "--debug"])
    monkeypatch.setenv("KERAS_VIT_DEBUG", "1")
    with pytest.raises(ValueError, match="--warmup"):
        main(args)


@pytest.mark.backends("tensorflow")  # backend-independent
def test_the_command_prints_one_line_and_exits_non_zero(tmp_path):
    env = {**backend_env(keras.backend.backend()), "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("KERAS_VIT_DEBUG", None)
    (tmp_path / "keep.txt").write_text("mine")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "keras_vit.training.finetune",
            "--output-dir",
            str(tmp_path),
            "--overwrite",
            "--steps",
            "2",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.startswith(("error", "Traceback"))]
    assert lines == [
        f"error: --overwrite refuses to clear {tmp_path}: it is not empty and holds no run (no "
        f"{outputs.MARKER} or run.json). Choose another --output-dir."
    ]
    assert os.listdir(tmp_path) == ["keep.txt"]
