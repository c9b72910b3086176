"""A run's folder when it is run again or is not as the run left it: a finished run run again (nothing changes), more
--steps (the run is extended), damaged run files, paths the run cannot write (checked before the first step), an
empty --output-dir, a file given as --dataset, a full disk. Real files, real processes. See docs/faults.md."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest
from PIL import Image
from training_support import REPO, TINY, TINY_MODEL_FLAGS, backend_env, checkpoint_steps, read_log

from keras_vit.files import naming
from keras_vit.training import outputs
from keras_vit.training.data import Source, Split
from keras_vit.training.errors import OutputDirError
from keras_vit.training.finetune import finetune, main
from keras_vit.training.finetune import main as finetune_main
from keras_vit.training.resume import check_classes
from keras_vit.training.schedules import WarmupDecay

# A run folder's decisions (finished, extend, damaged files, unwritable paths) are the same Python on every backend:
# TensorFlow only. JAX's restores: test_loop's exact crash-and-resume and test_runner's preempted run.
pytestmark = pytest.mark.backend_independent

FLAGS = [
    *TINY_MODEL_FLAGS,
    "--batch-size=16",
    "--eval-every=5",
    "--warmup=2",
    "--verbose=0",
    "--crop-area=0.6,1.0",
    "--mixed-precision=none",
    "--checkpoint-every=2",
    "--log-every=1",
]


def command(out, *more):
    """``main`` on the tiny run into ``out``: its status (0 when it returned) and its result."""
    try:
        return 0, main([*FLAGS, "--output-dir", str(out), *more])
    except SystemExit as exited:
        return exited.code, None


def contents(folder):
    """Every file under ``folder``: its bytes and modification time."""
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def run_reporting(argv: list[str]) -> tuple[subprocess.CompletedProcess, list[str]]:
    """``argv`` run from the repository on TensorFlow, output captured; and its ``error``/``Traceback`` lines."""
    done = subprocess.run(argv, cwd=REPO, env=backend_env(), capture_output=True, text=True, timeout=300)
    return done, [line for line in done.stderr.splitlines() if line.startswith(("error", "Traceback"))]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished run of 4 steps (checkpoints 2 and 4, model.keras, metrics.json)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert command(out, "--steps", "4")[0] == 0
    return out


def copy_of(run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(run, out)
    return out


def test_a_finished_run_run_again_says_so_and_changes_nothing(finished, tmp_path, capsys):
    out = copy_of(finished, tmp_path)
    before = contents(out)
    metrics = json.loads((out / "metrics.json").read_text())
    capsys.readouterr()
    status, result = command(out, "--steps", "4")
    assert status == 0
    said = capsys.readouterr().out
    assert f"{out} holds this run, finished at 4 steps (held-out accuracy " in said and "nothing to do" in said
    assert contents(out) == before  # metrics.json (its history and curves), the model, the logs: untouched
    assert result.metrics == metrics["eval"] and result.history == metrics["history"] != {}
    assert result.model.count_params() == keras.saving.load_model(out / "model.keras").count_params()


def test_more_steps_extend_a_finished_run_on_the_longer_schedule(finished, tmp_path, capsys):
    out = copy_of(finished, tmp_path)
    first = json.loads((out / "metrics.json").read_text())
    capsys.readouterr()
    status, _ = command(out, "--steps", "8")
    assert status == 0
    assert f"extending the run in {out} from 4 to 8 steps" in capsys.readouterr().out
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 8 and metrics["resumed_from_step"] == 4
    assert json.loads((out / "run.json").read_text())["steps"] == 8
    assert checkpoint_steps(str(out))[-1] == 8
    log = read_log(str(out))
    assert [e["step"] for e in log] == list(range(1, 9))
    # the first 4 steps followed the 4-step schedule, the extension follows the 8-step one from step 4 on
    lr = metrics["config"]["lr"]
    short, long = WarmupDecay(lr, 4, 2), WarmupDecay(lr, 8, 2)
    expected = [float(short(s - 1)) for s in range(1, 5)] + [float(long(s - 1)) for s in range(5, 9)]
    np.testing.assert_allclose([e["lr"] for e in log], expected, rtol=1e-6)
    assert log[4]["lr"] > log[3]["lr"]  # cosine: the longer schedule is higher at step 5 than the short one ended
    # the history holds the finished run's evaluations, then the extension's
    assert metrics["history"]["loss"][: len(first["history"]["loss"])] == first["history"]["loss"]
    assert len(metrics["history"]["loss"]) == len(first["history"]["loss"]) + 2  # steps 5 and 6-8: two evaluations
    # fewer steps than the run has cannot shorten it
    status, _ = command(out, "--steps", "6")
    assert status == 1
    assert f"error: {out} holds a run of 8 steps; --steps 6 cannot shorten it." in capsys.readouterr().err


def test_a_finished_run_without_checkpoints_is_not_trained_again_nor_extended(finished, tmp_path, capsys):
    out = copy_of(finished, tmp_path)
    shutil.rmtree(out / "checkpoints")  # the user freed the space
    before = contents(out)
    assert command(out, "--steps", "4")[0] == 0 and contents(out) == before
    assert command(out, "--steps", "8")[0] == 1
    assert "holds a run of 4 steps but no checkpoint" in capsys.readouterr().err
    assert contents(out) == before


def garbage(path):
    path.write_bytes(b"\x89\xff{{ not json \x00")


def truncated(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def a_list(path):
    path.write_text("[1, 2, 3]")


def deeply_nested(path):
    path.write_text("[" * 100_000)


@pytest.mark.parametrize("name", ["run.json", "metrics.json"])
@pytest.mark.parametrize("damage", [garbage, truncated, a_list, deeply_nested])
def test_a_damaged_run_file_is_one_line_naming_it(finished, tmp_path, capsys, name, damage):
    out = copy_of(finished, tmp_path)
    damage(out / name)
    before = contents(out)
    assert command(out, "--steps", "4")[0] == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {out / name} is damaged (")
    assert err[0].endswith("or start over with --overwrite.")
    assert contents(out) == before


def test_a_damaged_marker_log_or_missing_checkpoint_is_passed_over(finished, tmp_path, capsys):
    """The marker is never read (a garbage one still marks the folder); damaged log lines are dropped; a checkpoint
    that is gone (a dangling link) is passed over as a truncated one is."""
    out = copy_of(finished, tmp_path)
    garbage(out / outputs.MARKER)
    assert command(out, "--steps", "4")[0] == 0
    for name in ("metrics.json", "model.keras"):  # as if killed after the last checkpoint: evaluated again
        os.remove(out / name)
    os.remove(out / "checkpoints" / "ckpt-4.npz")
    os.symlink(out / "checkpoints" / "gone.npz", out / "checkpoints" / "ckpt-4.npz")
    with open(out / "train_log.jsonl", "ab") as log:
        log.write(b'\xff\xfe{"batch": "x"}\n[1]\n{"batch": [2]}\n')
    capsys.readouterr()
    assert command(out, "--steps", "4")[0] == 0
    warning = capsys.readouterr().err
    assert f"resuming from {out / 'checkpoints' / 'ckpt-2.npz'} (step 2)" in warning and "ckpt-4.npz: " in warning
    assert [e["step"] for e in read_log(str(out))] == [1, 2, 3, 4]
    assert json.loads((out / "metrics.json").read_text())["resumed_from_step"] == 2


@pytest.mark.parametrize(
    "entry, kind, message",
    [
        ("checkpoints", "file", "is a file, where the run writes its folder checkpoints"),
        ("tensorboard", "file", "is a file, where the run writes its folder tensorboard"),
        ("model.keras", "folder", "is a folder, where the run writes its file model.keras"),
        ("metrics.json", "folder", "is a folder, where the run writes its file metrics.json"),
    ],
)
def test_a_path_the_run_cannot_write_is_refused_before_the_first_step(finished, tmp_path, capsys, entry, kind, message):
    out = copy_of(finished, tmp_path)
    for name in ("checkpoints", "tensorboard", "model.keras", "metrics.json", "train_log.jsonl"):
        path = out / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()  # a run that failed before its first checkpoint
    (out / entry).mkdir() if kind == "folder" else (out / entry).write_text("the user's")
    assert command(out, "--steps", "4")[0] == 1
    assert capsys.readouterr().err == f"error: {out / entry} {message}: move it away, or choose another --output-dir.\n"
    assert not (out / "train_log.jsonl").exists()  # not one step


@pytest.mark.backends("tensorflow")  # backend-independent
def test_a_path_a_commands_runs_cannot_write_is_refused_before_the_first_of_them(tmp_path, capsys):
    """pretrain's summary.json, written after both phases, a folder: refused before the masked-patch phase starts."""
    from keras_vit.training import pretrain

    (tmp_path / outputs.MARKER).write_text("{}")
    (tmp_path / "summary.json").mkdir()
    with pytest.raises(SystemExit) as exited:
        pretrain.main([*FLAGS, "--steps=1", "--pretrain-steps=1", "--output-dir", str(tmp_path)])
    assert exited.value.code == 1
    assert capsys.readouterr().err == (
        f"error: {tmp_path / 'summary.json'} is a folder, where the run writes its file summary.json: move it away, "
        "or choose another --output-dir.\n"
    )
    assert sorted(os.listdir(tmp_path)) == [outputs.MARKER, "summary.json"]


def test_an_empty_output_dir_or_a_file_as_output_dir_or_dataset_is_one_line(tmp_path, capsys):
    assert command("", "--steps", "1")[0] == 1
    assert capsys.readouterr().err == "error: --output-dir must name a folder, got an empty string.\n"
    (tmp_path / "notes.txt").write_text("mine")
    assert command(tmp_path / "notes.txt", "--steps", "1")[0] == 1
    assert capsys.readouterr().err.startswith(f"error: --output-dir {tmp_path / 'notes.txt'} is a file, not a folder.")
    (tmp_path / "images.zip").write_bytes(b"PK\x05\x06" + bytes(18))
    for dataset in (str(tmp_path / "images.zip"), os.path.relpath(tmp_path / "images.zip")):
        assert command(tmp_path / "run", "--dataset", dataset, "--steps", "1")[0] == 1
        assert capsys.readouterr().err == (
            f"error: --dataset {dataset} is a file: give an image folder (one sub-folder of images per class; unpack "
            "an archive first) or a TFDS name.\n"
        )
    assert not (tmp_path / "run").exists()


@pytest.mark.backends("tensorflow")  # backend-independent
def test_a_grayscale_image_folder_trains_a_three_channel_model_as_rgb(tmp_path):
    """1-channel (mode L) PNGs: read as RGB with the grey level in each channel, and trained on."""
    from keras_vit.training.data import load_source

    for label, level in (("dark", 30), ("light", 220)):
        (tmp_path / "images" / label).mkdir(parents=True)
        for i in range(4):
            Image.fromarray(np.full((10, 12), level, np.uint8), "L").save(tmp_path / "images" / label / f"{i}.png")
    source = load_source(str(tmp_path / "images"), eval_fraction=0.25)
    image, label = next(iter(source.train.examples()))
    assert image.shape == (10, 12, 3) and image.numpy()[0, 0].tolist() == [30 if int(label) == 0 else 220] * 3
    status, result = command(tmp_path / "run", "--dataset", str(tmp_path / "images"), "--steps", "2")
    assert status == 0 and result.model.input_shape == (None, 8, 8, 3)


@pytest.mark.backends("tensorflow")  # backend-independent
def test_a_one_channel_tfds_dataset_trains_a_three_channel_model_as_rgb(tmp_path, monkeypatch):
    """mnist's images are (28, 28, 1): decoded to RGB, the grey level in each channel."""
    import tensorflow_datasets as tfds

    from keras_vit.training import data as data_lib

    monkeypatch.setattr(data_lib, "unresolvable_host", lambda urls: None)  # mock data: nothing is downloaded
    with tfds.testing.mock_data(num_examples=20):
        source = data_lib.load_tfds("mnist")
        image, _ = next(iter(source.train.examples()))
        status, result = command(tmp_path / "run", "--dataset", "mnist", "--steps", "2")
    channels = image.numpy().reshape(-1, 3)
    assert image.shape == (28, 28, 3) and (channels == channels[:, :1]).all()
    assert status == 0 and result.model.input_shape == (None, 8, 8, 3)


def test_a_failed_write_names_the_file_it_was_writing():
    """A real ENOSPC: /dev/full fails every write with errno 28."""
    with pytest.raises(OSError) as caught, naming("run/checkpoints/ckpt-2.npz"), open("/dev/full", "wb") as full:
        full.write(b"x" * 4096)
        full.flush()
    assert caught.value.errno == 28
    assert str(caught.value) == "[Errno 28] No space left on device while writing: 'run/checkpoints/ckpt-2.npz'"


@pytest.mark.backends("tensorflow")  # backend-independent
def test_a_full_disk_is_one_line_naming_the_checkpoint_and_leaves_no_partial_file(tmp_path):
    """A real full file system: a 64 KiB tmpfs in a user namespace (no root needed) that holds the run's small
    files but not its 72 KB checkpoint."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode != 0:
        pytest.skip("no user namespaces here to mount a small tmpfs in")
    out = disk / "run"
    run = " ".join([sys.executable, "-m", "keras_vit.training.finetune", *FLAGS, "--steps=4", f"--output-dir={out}"])
    script = f"mount -t tmpfs -o size=64k none {disk} && {{ {run}; echo status=$?; ls -A {out / 'checkpoints'}; }}"
    done, errors = run_reporting(["unshare", "-rm", "sh", "-c", script])
    assert errors == [
        f"error: [Errno 28] No space left on device while writing: '{out / 'checkpoints' / 'ckpt-2.npz'}'"
    ], done.stderr[-2000:]
    assert done.stdout.split() == ["status=1"]  # and the checkpoints folder is empty: no partial file


CAPPED = """
import resource, sys
from keras_vit.cli import load_tensorflow
from keras_vit.memory import proc_bytes
from keras_vit.training import supervised
from keras_vit.training.finetune import main
load_tensorflow()  # the command imports these once its checks pass: the cap is above a process that has them
in_use = proc_bytes("/proc/self/status", "VmSize")
resource.setrlimit(resource.RLIMIT_AS, (in_use + (2 << 30), resource.RLIM_INFINITY))  # 2 GiB more than now
main(sys.argv[1:])
"""
PLAIN = ["--mixed-precision=none", "--verbose=0"]
WIDE = ["--model=Ti/8", "--image-size=64", "--hidden-size=64", "--depth=2", "--num-heads=2", "--mlp-dim=128"]


@pytest.mark.backends("tensorflow")  # the host's memory: backend-independent
def test_an_oversized_batch_under_a_memory_cap_is_refused_saying_what_fits(tmp_path):
    """A real process under a real cap (RLIMIT_AS, 2 GiB above what it uses): a batch of 4096 needs 2.7 GiB of
    activations; refused before the first step, naming the limit and the batch that fits, instead of a crash."""
    out = tmp_path / "run"
    done, errors = run_reporting(
        [sys.executable, "-c", CAPPED, *WIDE, "--batch-size=4096", "--steps=2", *PLAIN, f"--output-dir={out}"]
    )
    assert done.returncode == 1 and len(errors) == 1, done.stderr[-2000:]
    fits = int(re.search(r"at most (\d+) images fit in a step", errors[0])[1])
    assert errors[0].startswith("error: A step of 4096 images needs at least 2.7 GiB for its activations (0.68 MiB")
    assert "left under the address-space limit (ulimit -v)" in errors[0] and 1500 < fits < 4096
    assert "--accumulation-steps 2 or more" in errors[0]
    assert not (out / "train_log.jsonl").exists()


MEASURE = """
import resource, sys
import numpy as np
import keras_vit
from keras_vit.training.memory import activation_bytes
model = keras_vit.ViT("Ti/8", image_size=64, num_classes=10, hidden_size=64, depth=2, num_heads=2, mlp_dim=128)
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
batch = int(sys.argv[1])
images, labels = np.random.rand(batch, 64, 64, 3).astype("float32"), np.zeros(batch)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
model.fit(images, labels, batch_size=batch, epochs=1, verbose=0)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024, activation_bytes(model.config))
"""


@pytest.mark.slow
@pytest.mark.backends("tensorflow")
def test_the_activation_estimate_is_a_lower_bound_of_a_real_step():
    """The peak memory a real training step adds per image (between batches of 128 and 512): above the estimate
    and within twice it (measured 1.35 times)."""
    (small, estimate), (large, _) = (
        map(
            int,
            subprocess.run(
                [sys.executable, "-c", MEASURE, str(b)],
                cwd=REPO,
                env=backend_env(),
                capture_output=True,
                text=True,
                timeout=300,
                check=True,
            ).stdout.split()[-2:],
        )
        for b in (128, 512)
    )
    per_image = (large - small) / (512 - 128)
    assert estimate < per_image < 2 * estimate


# Class names travel with a run: classes.txt and the saved model's config; a resume on other classes is refused.

RUN = dict(TINY, steps=2, checkpoint_every=1)


def _folder(root, classes) -> str:
    rng = np.random.default_rng(0)
    for index, name in enumerate(classes):
        os.makedirs(root / name)
        for i in range(4):
            pixels = np.clip(rng.normal(60 * index, 20, (12, 12, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return str(root)


def test_digits_runs_record_their_classes(tmp_path):
    digits = finetune(output_dir=str(tmp_path / "digits"), **RUN)
    assert (tmp_path / "digits" / "classes.txt").read_text() == "".join(f"{d}\n" for d in range(10))
    loaded = keras.saving.load_model(tmp_path / "digits" / "model.keras")
    assert loaded.config.class_names == tuple(str(d) for d in range(10)) == digits.model.config.class_names


def test_a_resume_on_renamed_or_added_classes_is_refused_saying_what_changed(tmp_path):
    data = tmp_path / "pets"
    _folder(data, ["cat", "dog", "emu"])
    out = str(tmp_path / "run")
    finetune(dataset=str(data), eval_fraction=0.25, output_dir=out, **RUN)
    assert (tmp_path / "run" / "classes.txt").read_text().split() == ["cat", "dog", "emu"]
    saved = keras.saving.load_model(tmp_path / "run" / "model.keras")
    assert saved.config.class_names == ("cat", "dog", "emu") and saved.output_shape == (None, 3)
    os.rename(data / "dog", data / "zebra")  # labels would shift: emu 2 -> 1
    with pytest.raises(OutputDirError, match=r"the dataset changed, classes added zebra; gone dog\. Restore"):
        finetune(dataset=str(data), eval_fraction=0.25, output_dir=out, **RUN)
    os.rename(data / "zebra", data / "dog")
    os.makedirs(data / "fox")
    for i in range(4):
        Image.fromarray(np.zeros((12, 12, 3), np.uint8)).save(data / "fox" / f"{i}.png")
    with pytest.raises(OutputDirError, match=r"classes added fox\. .*--weights .*run/model.keras"):
        finetune(dataset=str(data), eval_fraction=0.25, output_dir=out, **RUN)
    assert sorted(os.listdir(os.path.join(out, "checkpoints"))) == ["ckpt-1.npz", "ckpt-2.npz"]  # nothing touched
    reordered = Source("pets", 3, Split(0), Split(0), "held-out", ("dog", "cat", "emu"))
    with pytest.raises(OutputDirError, match=r"the same classes in another order \(was cat, dog, emu; now dog, cat"):
        check_classes(out, reordered)


@pytest.mark.slow  # three runs: masked patches, its fine-tuning, then LoRA from the encoder
def test_finetune_from_pretrain_s_encoder_as_its_advice_says(tmp_path, capsys):
    from keras_vit.training.pretrain import main as pretrain

    out = str(tmp_path / "pre")
    argv = ["--pretrain-steps=2", "--steps=1", *TINY_MODEL_FLAGS, "--mixed-precision=none", "--verbose=0"]
    argv += ["--output-dir", out]
    with pytest.raises(SystemExit):
        pretrain([*argv, "--lora-rank", "2"])
    advice = re.search(r"keras_vit\.training\.finetune (--weights \S+ --lora-rank N)", capsys.readouterr().err)[1]
    pretrain(argv)
    given = shlex.split(advice.replace("OUT", out).replace("N", "2"))
    tiny = ["--steps=2", "--mixed-precision=none", "--verbose=0"]
    result = finetune_main([*given, *tiny, "--output-dir", str(tmp_path / "lora")])
    encoder = keras.saving.load_model(os.path.join(out, "encoder.keras"))
    assert result.model.config.architecture == encoder.config.architecture  # the file's, though no --model was given
    assert sum(int(np.prod(v.shape)) for v in result.model.trainable_weights) < encoder.count_params() / 4  # LoRA
    trained = {variable.path for variable in result.model.trainable_weights}
    attention = "encoderblock_0/MultiHeadDotProductAttention_1/out"
    assert f"{attention}/lora_kernel_a" in trained and f"{attention}/kernel" not in trained
