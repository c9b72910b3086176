"""The command and the API end to end: outputs, pretrained weights, mixed precision, the offline default."""

import glob
import json
import os

import keras
import numpy as np
import pytest
from npz_layout import vit_checkpoint, write_checkpoint
from training_support import TINY, TINY_MODEL_FLAGS

from keras_vit.training.finetune import finetune, main

TINY_ARGS = [
    *TINY_MODEL_FLAGS,
    "--batch-size",
    "16",
    "--eval-every",
    "2",
    "--log-every",
    "1",
]


def test_command_trains_and_writes_every_output(tmp_path, capsys):
    out = tmp_path / "run"
    result = main([*TINY_ARGS, "--steps", "4", "--checkpoint-every", "2", "--verbose", "2", "--output-dir", str(out)])
    printed = capsys.readouterr().out
    metrics = json.loads((out / "metrics.json").read_text())
    assert f"held-out accuracy: {metrics['eval']['accuracy']:.4f} on 359 images (digits" in printed
    assert "preset digits" in printed and "Epoch 2/2" in printed
    assert metrics["history"]["epoch"] == [0, 1] and len(metrics["history"]["val_accuracy"]) == 2
    assert metrics["config"]["optimizer"] == "adamw" and metrics["resumed_from_step"] == 0
    assert sorted(os.listdir(out / "checkpoints")) == [
        "checkpoint",
        "ckpt-2.data-00000-of-00001",
        "ckpt-2.index",
        "ckpt-4.data-00000-of-00001",
        "ckpt-4.index",
    ]
    for events in ("train", "validation", "steps"):
        assert glob.glob(str(out / "tensorboard" / events / "events.out.tfevents.*"))
    assert json.loads((out / "run.json").read_text())["steps"] == 4
    loaded = keras.saving.load_model(str(out / "model.keras"))
    assert not loaded.compiled  # an inference model; the optimizer state is in checkpoints/
    images = np.zeros((1, 8, 8, 3), "float32")
    np.testing.assert_allclose(loaded.predict(images, verbose=0), result.model.predict(images, verbose=0), atol=1e-6)
    assert result.model.optimizer.iterations.numpy() == 4


def test_command_rejects_bad_options(tmp_path):
    for bad in (["--strategy", "horovod"], ["--model", "X/16"], ["--model", "R51+B/16"]):
        with pytest.raises(SystemExit):
            main(bad)
    with pytest.raises(ValueError, match="Unknown ViT variant 'X/16'"):
        finetune(**{**TINY, "model": "X/16"}, output_dir=str(tmp_path))


def test_pretrained_weights_are_loaded_resized_and_fine_tuned(tmp_path):
    """A checkpoint of an 8 px model with a 1000-class head and pre_logits, fine-tuned at 16 px on the
    10 digits: the encoder comes from the checkpoint, position embeddings are resized, the head is new."""
    arrays = vit_checkpoint(
        patch=4, width=16, depth=1, heads=2, mlp=32, grid=(2, 2), num_classes=1000, representation_size=24
    )
    path = write_checkpoint(str(tmp_path / "tiny.npz"), arrays)
    with pytest.warns(UserWarning, match="head"):
        result = finetune(
            weights=path,
            image_size=16,
            steps=2,
            lr=0.0,
            output_dir=str(tmp_path / "run"),
            **{k: v for k, v in TINY.items() if k not in ("image_size",)},
        )
    assert result.config.preset == "finetune" and result.config.optim.optimizer == "sgd"
    model = result.model
    np.testing.assert_allclose(model.get_layer("embedding").kernel.numpy(), arrays["embedding/kernel"], atol=1e-6)
    assert model.get_layer("posembed_input").pos_embedding.shape == (1, 1 + 4 * 4, 16)
    np.testing.assert_array_equal(model.get_layer("head").kernel.numpy(), 0.0)  # lr 0: the new head stays zero
    assert model.output_shape == (None, 10)


def test_mixed_precision_trains_and_resumes(tmp_path):
    run = {**TINY, "steps": 2, "mixed_precision": "float16", "output_dir": str(tmp_path)}
    first = finetune(**run)
    assert first.model.get_layer("encoderblock_0").dtype_policy.name == "mixed_float16"
    assert first.model.get_layer("head").dtype_policy.variable_dtype == "float32"
    assert keras.mixed_precision.dtype_policy().name == "float32"  # the global policy is restored
    again = finetune(**run)  # restores the loss-scale optimizer's state too
    assert json.loads((tmp_path / "metrics.json").read_text())["resumed_from_step"] == 2
    assert np.isfinite(again.metrics["loss"])


@pytest.mark.slow
def test_offline_default_run_reaches_its_stated_accuracy(tmp_path, capsys):
    """``python -m keras_vit.training.finetune`` with no arguments: the digits preset (README: 0.95+)."""
    result = main(["--output-dir", str(tmp_path), "--verbose", "2"])
    assert result.metrics["accuracy"] >= 0.93
    assert "held-out accuracy" in capsys.readouterr().out
