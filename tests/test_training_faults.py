"""Training faults (issue 13), each on real files: --overwrite of a folder that is not a run's, a diverged
run, broken checkpoints, a run that fails before its first step, corrupt or unusual image files, bad
settings, and the commands' one-line errors. See docs/faults.md."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image
from test_training_data import write_images
from test_training_resume import Crash
from training_support import REPO, TINY, read_log

from keras_vit.training import outputs
from keras_vit.training.config import TrainConfig, resolve
from keras_vit.training.data import load_source
from keras_vit.training.errors import CorruptDataError, DivergedError, OutputDirError
from keras_vit.training.finetune import finetune, main

RUN = {**TINY, "steps": 6, "checkpoint_every": 2, "log_every": 1}


def strict_json(path):
    """The JSON in ``path``, refusing NaN and Infinity as a strict parser does."""
    with open(path) as file:
        return json.load(file, parse_constant=lambda name: pytest.fail(f"{path} holds {name}"))


def checkpoint_steps(out):
    return sorted(int(n[5:-6]) for n in os.listdir(os.path.join(out, "checkpoints")) if n.endswith(".index"))


# --- --overwrite -------------------------------------------------------------------------------------


def test_overwrite_refuses_a_folder_that_holds_no_run_and_deletes_nothing(tmp_path):
    (tmp_path / "photo.jpg").write_bytes(b"the user's")
    (tmp_path / "album").mkdir()
    with pytest.raises(OutputDirError, match=f"refuses to clear {tmp_path}: it is not empty and holds no run"):
        finetune(output_dir=str(tmp_path), overwrite=True, **RUN)
    assert sorted(os.listdir(tmp_path)) == ["album", "photo.jpg"]
    assert (tmp_path / "photo.jpg").read_bytes() == b"the user's"


def test_overwrite_of_a_run_folder_deletes_only_what_runs_write(tmp_path):
    out = tmp_path / "run"
    finetune(output_dir=str(out), **{**RUN, "steps": 2})
    (out / "notes.txt").write_text("mine")
    (out / "data").mkdir()
    (out / "data" / "x.csv").write_text("1,2")
    finetune(output_dir=str(out), overwrite=True, **{**RUN, "steps": 2, "lr": 0.5})
    assert (out / "notes.txt").read_text() == "mine" and (out / "data" / "x.csv").read_text() == "1,2"
    metrics = strict_json(out / "metrics.json")
    assert metrics["resumed_from_step"] == 0 and metrics["config"]["lr"] == 0.5  # a new run, not a resumed one
    assert sorted(os.listdir(out)) == [
        outputs.MARKER,
        "checkpoints",
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
    with pytest.raises(
        DivergedError,
        match=r"loss is nan at step 4 \(batch 4\); the last checkpoint, step 2.*"
        r"lower --lr.*--drop-path",
    ):
        finetune(output_dir=out, **{**RUN, "steps": 30, "lr": 1e6})
    assert checkpoint_steps(out) == [2]  # none at or after the NaN step
    reader = tf.train.load_checkpoint(os.path.join(out, "checkpoints", "ckpt-2"))
    for name, dtype in reader.get_variable_to_dtype_map().items():
        if dtype.is_floating:
            assert np.isfinite(reader.get_tensor(name)).all(), name
    assert not {"model.keras", "metrics.json"} & set(os.listdir(out))
    assert [e["step"] for e in read_log(out)] == [1, 2, 3]  # every logged loss is finite


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


def test_a_corrupt_checkpoint_state_file_resumes_from_the_newest_checkpoint(crashed_run, tmp_path, capsys):
    def corrupt(folder):
        with open(os.path.join(folder, "checkpoint"), "wb") as file:
            file.write(b"\x00garbage {{")

    out = resume_copy(crashed_run, tmp_path, corrupt)
    assert "warning: resuming from" in capsys.readouterr().err
    assert strict_json(os.path.join(out, "metrics.json"))["resumed_from_step"] == 4
    assert [e["step"] for e in read_log(out)] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("breakage", ["truncated data", "missing index"])
def test_a_broken_newest_checkpoint_falls_back_to_the_previous_one(crashed_run, tmp_path, capsys, breakage):
    def damage(folder):
        if breakage == "truncated data":
            path = os.path.join(folder, "ckpt-4.data-00000-of-00001")
            with open(path, "r+b") as file:
                file.truncate(os.path.getsize(path) // 2)
        else:
            os.remove(os.path.join(folder, "ckpt-4.index"))

    before = read_log(crashed_run)
    out = resume_copy(crashed_run, tmp_path, damage)
    warning = capsys.readouterr().err
    assert f"resuming from {os.path.join(out, 'checkpoints', 'ckpt-2')} (step 2)" in warning and "ckpt-4" in warning
    assert strict_json(os.path.join(out, "metrics.json"))["resumed_from_step"] == 2
    log = read_log(out)
    assert [e["step"] for e in log] == [1, 2, 3, 4, 5, 6]
    assert log[:2] == before[:2]  # the entries up to the restored step are kept


# --- a run that fails before its first step ----------------------------------------------------------


def test_a_run_that_fails_before_its_first_step_does_not_bind_the_corrected_rerun(tmp_path):
    out = str(tmp_path / "run")
    with pytest.raises(FileNotFoundError, match="No checkpoint file"):
        finetune(output_dir=out, weights=str(tmp_path / "missing.npz"), **RUN)
    assert not os.path.exists(os.path.join(out, "run.json"))
    result = finetune(output_dir=out, **{**RUN, "steps": 2})
    assert result.config.preset == "digits" and checkpoint_steps(out) == [2]


# --- image folders -----------------------------------------------------------------------------------


def damaged_folder(root):
    """Three classes of good images, plus a truncated JPEG and a text file named .png; returns the bad paths."""
    write_images(root, per_class=4)
    truncated, text = os.path.join(root, "dog", "cut.jpg"), os.path.join(root, "emu", "letter.png")
    with open(os.path.join(root, "dog", "0.jpg"), "rb") as file:
        data = file.read()
    with open(truncated, "wb") as file:
        file.write(data[: len(data) // 2])
    with open(text, "w") as file:
        file.write("not an image at all")
    return truncated, text


def test_corrupt_images_are_named_before_training(tmp_path):
    truncated, text = damaged_folder(str(tmp_path / "images"))
    out = str(tmp_path / "run")
    with pytest.raises(CorruptDataError, match="2 of 14 image files do not decode") as caught:
        finetune(dataset=str(tmp_path / "images"), output_dir=out, **RUN)
    assert f"{truncated} (" in str(caught.value) and "runcated" in str(caught.value)  # PIL's words vary
    assert f"{text} (not an image)" in str(caught.value) and "--skip-corrupt" in str(caught.value)
    assert not os.path.exists(out)  # nothing started


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


def test_an_empty_class_folder_is_an_error_naming_it(tmp_path):
    write_images(str(tmp_path), per_class=2)
    (tmp_path / "fox").mkdir()
    (tmp_path / "fox" / "readme.txt").write_text("no images yet")
    (tmp_path / ".cache").mkdir()  # hidden folders are not classes
    with pytest.raises(ValueError, match=f"Class folders without images .*: {tmp_path / 'fox'};"):
        load_source(str(tmp_path))


# --- settings and the command line -------------------------------------------------------------------


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


def test_the_command_prints_one_line_and_exits_non_zero(tmp_path):
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": REPO}
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
