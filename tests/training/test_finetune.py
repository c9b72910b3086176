"""The command and the API end to end: outputs, pretrained weights, mixed precision, the offline default."""

import glob
import json
import os

import keras
import numpy as np
import pytest
from npz_layout import vit_checkpoint, write_checkpoint
from training_support import TINY, TINY_MODEL_FLAGS, Crash, iterations

from keras_vit import lora_parameter_count
from keras_vit.precision import auto_policy, with_policy
from keras_vit.training.config import TrainConfig
from keras_vit.training.data import load_digits
from keras_vit.training.finetune import finetune, main
from keras_vit.training.model import build_model, policy_name
from keras_vit.training.pipeline import Augment, eval_dataset

# torch runs the library tests, and of these only the tests marked for it below
pytestmark = pytest.mark.backends("tensorflow", "jax")

TINY_ARGS = [
    *TINY_MODEL_FLAGS,
    "--batch-size",
    "16",
    "--eval-every",
    "2",
    "--log-every",
    "1",
]


@pytest.mark.backends("tensorflow", "jax", "torch")
def test_command_trains_and_writes_every_output(tmp_path, capsys):
    out = tmp_path / "run"
    result = main([*TINY_ARGS, "--steps", "4", "--checkpoint-every", "2", "--verbose", "2", "--output-dir", str(out)])
    printed, warned = capsys.readouterr()
    assert "patch grid" not in warned  # 8-pixel images, 4-pixel patches: 2x2
    metrics = json.loads((out / "metrics.json").read_text())
    assert f"held-out accuracy: {metrics['eval']['accuracy']:.4f} on 359 images (digits" in printed
    assert "preset digits" in printed and "step 4/4: " in printed  # progress in steps (issue 37), not "Epoch 2/2"
    assert metrics["history"]["epoch"] == [0, 1] and len(metrics["history"]["val_accuracy"]) == 2
    assert metrics["config"]["optimizer"] == "adamw" and metrics["resumed_from_step"] == 0
    assert metrics["precision"] == auto_policy("cpu")  # --mixed-precision auto: mixed_bfloat16 on this CPU under TF
    assert result.model.get_layer("encoderblock_0").dtype_policy.name == auto_policy("cpu")
    assert sorted(os.listdir(out / "checkpoints")) == ["ckpt-2.npz", "ckpt-4.npz"]
    for events in ("train", "validation", "steps"):
        assert glob.glob(str(out / "tensorboard" / events / "events.out.tfevents.*"))
    assert json.loads((out / "run.json").read_text())["steps"] == 4
    loaded = keras.saving.load_model(str(out / "model.keras"))
    assert not loaded.compiled  # an inference model; the optimizer state is in checkpoints/
    images = np.zeros((1, 8, 8, 3), "float32")
    np.testing.assert_allclose(loaded.predict(images, verbose=0), result.model.predict(images, verbose=0), atol=1e-6)
    assert iterations(result.model) == 4


@pytest.mark.backends("tensorflow")  # backend-independent
def test_a_grid_of_fewer_than_two_by_two_patches_is_warned_of(tmp_path, capsys):
    """``--model B/16`` on 16-pixel digits: one patch per image trains, with a line saying why it will not learn."""
    flags = [*TINY_ARGS, "--image-size", "4", "--steps", "1", "--verbose", "0", "--output-dir", str(tmp_path)]
    main(flags)
    assert (
        "warning: 4x4 images give Ti/4 a 1x1 patch grid (fewer than 2x2 patches): choose a smaller patch "
        "(--model Ti/4) or a larger --image-size."
    ) in capsys.readouterr().err.splitlines()


def test_command_rejects_bad_options(tmp_path):
    for bad in (["--strategy", "horovod"], ["--model", "X/16"], ["--model", "R51+B/16"]):
        with pytest.raises(SystemExit):
            main(bad)
    with pytest.raises(ValueError, match="Unknown ViT variant 'X/16'"):
        finetune(**{**TINY, "model": "X/16"}, output_dir=str(tmp_path))


@pytest.mark.backends("tensorflow")  # backend-independent
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


@pytest.mark.backends("tensorflow")  # backend-independent
def test_mixed_precision_trains_and_resumes(tmp_path):
    """float16 (with its loss-scale optimizer, whose state is checkpointed too); on JAX, whose CPU compiler has no
    float16 matmul, bfloat16 (float16 is refused there: test_auto_mixed_precision_is_the_hardware_policy)."""
    policy = "bfloat16" if keras.backend.backend() == "jax" else "float16"
    run = {**TINY, "steps": 2, "mixed_precision": policy, "output_dir": str(tmp_path)}
    first = finetune(**run)
    assert first.model.get_layer("encoderblock_0").dtype_policy.name == f"mixed_{policy}"
    assert first.model.get_layer("head").dtype_policy.variable_dtype == "float32"
    assert keras.mixed_precision.dtype_policy().name == "float32"  # the global policy is restored
    again = finetune(**{**run, "steps": 3})  # extended: restores the loss-scale optimizer's state too
    assert json.loads((tmp_path / "metrics.json").read_text())["resumed_from_step"] == 2
    assert np.isfinite(again.metrics["loss"])


@pytest.mark.slow
def test_offline_default_run_reaches_its_stated_accuracy(tmp_path, capsys):
    """``python -m keras_vit.training.finetune`` with no arguments: the digits preset (README: 0.95+)."""
    result = main(["--output-dir", str(tmp_path), "--verbose", "2"])
    assert result.metrics["accuracy"] >= 0.93
    assert "held-out accuracy" in capsys.readouterr().out
    # The trained model for inference in float32 and in bfloat16 (keras_vit.precision.with_policy): the same
    # held-out accuracy within 0.01 (measured: equal, 0.9638 both, for the model trained in float32).
    data = eval_dataset(load_digits(0.2, 0).eval, 10, 32, Augment.of(result.config))
    accuracy = {}
    for policy in ("float32", "mixed_bfloat16"):
        model = with_policy(result.model, policy)
        model.compile(loss=keras.losses.CategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        accuracy[policy] = model.evaluate(data, return_dict=True, verbose=0)["accuracy"]
    trained = result.model.get_layer("encoderblock_0").dtype_policy.name
    assert abs(accuracy[trained] - result.metrics["accuracy"]) < 1e-6  # the copy in its own policy: the run's score
    assert abs(accuracy["mixed_bfloat16"] - accuracy["float32"]) <= 0.01


@pytest.mark.parametrize(
    "device, facts, expected",
    [
        ("cpu", dict(features=["avx512_bf16"]), {"tensorflow": "mixed_bfloat16", "jax": "float32"}),
        ("cpu", dict(features=[]), "float32"),
        ("gpu", dict(gpu_capability=(7, 5)), "mixed_float16"),
        ("gpu", dict(gpu_capability=(9, 0)), "mixed_bfloat16"),
        ("tpu", {}, "mixed_bfloat16"),
    ],
)
@pytest.mark.backends("tensorflow", "jax", "torch")
def test_auto_mixed_precision_is_the_hardware_policy(monkeypatch, device, facts, expected):
    """``--mixed-precision auto`` asks keras_vit.precision.auto_policy (bfloat16 on this CI's AVX512_BF16 CPU under
    TensorFlow and torch, float32 under JAX on a CPU); the other choices are fixed."""
    monkeypatch.setattr("keras_vit.precision.cpu_features", lambda *args: frozenset(facts.get("features", ())))
    monkeypatch.setattr("keras_vit.precision.detect_device", lambda: (device, facts.get("gpu_capability")))
    if isinstance(expected, dict):
        expected = expected.get(keras.backend.backend(), expected["tensorflow"])
    assert policy_name(TrainConfig(), device) == expected
    assert policy_name(TrainConfig().replace(mixed_precision="none"), device) == "float32"
    float16 = TrainConfig().replace(mixed_precision="float16")
    if device == "cpu" and keras.backend.backend() == "jax":
        with pytest.raises(ValueError, match="float16 does not run on JAX's CPU"):
            policy_name(float16, device)
    else:
        assert policy_name(float16, device) == "mixed_float16"


@pytest.mark.backends("tensorflow", "jax", "torch")
def test_lora_trains_only_the_adapters_and_the_head_and_resumes(tmp_path):
    """Rank 4 on the tiny ViT (width 16, MLP 32, one block): adapters 16*4+4*48 (qkv) + 16*4+4*16 (out) +
    16*4+4*32 + 32*4+4*16 (MLP) = 768 parameters, the head 16*10+10 = 170: 938 train, every other weight stays
    as built. A crashed LoRA run resumes (adapters included) to the weights of an uninterrupted one."""
    run = {**TINY, "steps": 4, "checkpoint_every": 2, "lora_rank": 4, "lr": 0.05, "warmup": 1}
    whole = finetune(output_dir=str(tmp_path / "whole"), **run)
    model = whole.model
    assert sum(int(np.prod(v.shape)) for v in model.trainable_variables) == 938 == lora_parameter_count(model) + 170
    keras.utils.set_random_seed(whole.config.optim.seed)
    initial = {v.path: keras.ops.convert_to_numpy(v) for v in build_model(whole.config, 10).variables}
    trained = {v.path: keras.ops.convert_to_numpy(v) for v in model.variables}
    trainable = {v.path for v in model.trainable_variables}
    frozen = [p for p in trained if p not in trainable and "seed_generator" not in p]
    assert "encoderblock_0/MultiHeadDotProductAttention_1/qkv/kernel" in frozen and len(frozen) >= 14
    for path in frozen:
        np.testing.assert_array_equal(trained[path], initial[path], err_msg=path)
    for path in trainable:
        assert not np.array_equal(trained[path], initial[path]), f"{path} did not train"

    crashed = str(tmp_path / "crashed")
    with pytest.raises(RuntimeError, match="simulated crash"):
        finetune(output_dir=crashed, callbacks=[Crash(3)], **run)
    resumed = finetune(output_dir=crashed, **run)
    assert json.loads((tmp_path / "crashed" / "metrics.json").read_text())["resumed_from_step"] == 2
    assert resumed.model.count_params() == model.count_params()
    for a, b in zip(resumed.model.variables, model.variables):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b), atol=1e-6)
    with pytest.raises(ValueError, match="--lora-rank must be >= 1, got 0"):
        finetune(output_dir=str(tmp_path / "bad"), **{**run, "lora_rank": 0})


@pytest.mark.backends("tensorflow")  # JAX's remat: tests/library/test_layers.py
def test_remat_trains_to_the_same_weights(tmp_path):
    """``--remat`` recomputes each block in the backward pass: with dropout and drop-path on, the run ends on the
    plain run's weights (float32 rounding), and the blocks of its ``model.keras`` keep the option."""
    run = {**TINY, "steps": 3, "dropout": 0.1, "drop_path": 0.1}
    plain = finetune(output_dir=str(tmp_path / "plain"), **run)
    remat = finetune(output_dir=str(tmp_path / "remat"), remat=True, **run)
    assert remat.config.model.remat and not plain.config.model.remat
    for a, b in zip(remat.model.variables, plain.model.variables, strict=True):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b), atol=1e-6)
    saved = keras.saving.load_model(tmp_path / "remat" / "model.keras")
    assert [layer.remat for layer in saved.layers if hasattr(layer, "remat")] == [True]
