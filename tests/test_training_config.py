"""Learning-rate schedules, presets and how the defaults are chosen, strategy choice."""

import json
import math

import keras
import pytest

from keras_vit.training.config import TrainConfig, choose_preset, parse_model_name, resolve, run_differences
from keras_vit.training.schedules import WarmupDecay
from keras_vit.training.strategy import choose_strategy, get_strategy


def formula(t, base, total, warmup, decay, end=0.0):
    """The schedule of the module docstring for update t (1-based), written out independently."""
    progress = min(max((t - warmup) / (total - warmup), 0.0), 1.0)
    if decay == "cosine":
        lr = end + (base - end) * 0.5 * (1 + math.cos(math.pi * progress))
    elif decay == "linear":
        lr = end + (base - end) * (1 - progress)
    else:
        lr = base
    return lr * min(1.0, t / warmup) if warmup else lr


@pytest.mark.parametrize("decay", ["cosine", "linear", "constant"])
def test_schedule_equals_formula(decay):
    schedule = WarmupDecay(0.03, total_steps=100, warmup_steps=10, decay=decay, end_lr=1e-4)
    for step in [0, 1, 4, 9, 10, 11, 37, 50, 98, 99, 120]:
        expected = formula(step + 1, 0.03, 100, 10, decay, 1e-4)
        assert float(schedule(step)) == pytest.approx(expected, rel=1e-5, abs=1e-9), step
    if decay == "cosine":
        assert float(schedule(9)) == pytest.approx(0.03)  # warmup ends at the base rate
        assert float(schedule(99)) == pytest.approx(1e-4)  # and decays to end_lr at the last update


def test_schedule_without_warmup_and_with_accumulation():
    plain = WarmupDecay(1.0, total_steps=20, warmup_steps=0)
    assert float(plain(0)) == pytest.approx(formula(1, 1.0, 20, 0, "cosine"))
    accumulated = WarmupDecay(1.0, total_steps=20, warmup_steps=5, accumulation_steps=4)
    warm = WarmupDecay(1.0, total_steps=20, warmup_steps=5)
    for micro_step in range(0, 80, 3):  # the optimizer calls it once per micro-batch
        assert float(accumulated(micro_step)) == pytest.approx(float(warm(micro_step // 4)))


def test_schedule_serialises_and_rejects_bad_arguments():
    schedule = WarmupDecay(0.01, 500, 50, "linear", 1e-5, 2)
    clone = keras.optimizers.schedules.deserialize(keras.optimizers.schedules.serialize(schedule))
    assert clone.get_config() == schedule.get_config()
    with pytest.raises(ValueError, match="decay"):
        WarmupDecay(0.1, 10, 0, "step")
    with pytest.raises(ValueError, match="warmup_steps"):
        WarmupDecay(0.1, 10, 11)


@pytest.mark.parametrize("name, variant", [("B/16", "B/16"), ("ViT_B16", "B/16"), ("vit-ti/16", "Ti/16"),
                                           ("ViT-L/32", "L/32"), ("s16", "S/16"), ("H/14", "H/14")])
def test_parse_model_name(name, variant):
    assert parse_model_name(name) == variant


def test_parse_model_name_rejects_unknown():
    with pytest.raises(ValueError, match="Unknown model 'R50"):
        parse_model_name("R50+B/16")


def test_auto_preset():
    assert choose_preset(TrainConfig()) == "digits"
    assert choose_preset(TrainConfig(dataset="cifar10")) == "scratch"
    assert choose_preset(TrainConfig(dataset="cifar10", weights="imagenet21k/ViT-B_16")) == "finetune"
    with pytest.raises(ValueError, match="preset"):
        choose_preset(TrainConfig(preset="paper"))


def test_finetune_preset_is_the_paper_recipe_on_accelerators():
    config = resolve(TrainConfig(dataset="oxford_iiit_pet", weights="w"), train_examples=3680, accelerator="gpu")
    assert (config.optimizer, config.momentum, config.clip_norm, config.weight_decay) == ("sgd", 0.9, 1.0, 0.0)
    assert (config.batch_size, config.lr, config.warmup, config.steps) == (512, 0.03, 500, 10_000)
    assert (config.schedule, config.image_size, config.crop_area, config.flip) == ("cosine", 384, (0.05, 1.0), True)
    assert (config.eval_crop, config.mixup, config.randaugment[0]) == (1.0, 0.0, 0)
    imagenet = resolve(TrainConfig(dataset="imagenet2012", weights="w"), train_examples=None, accelerator="tpu")
    assert imagenet.steps == 20_000
    cifar = resolve(TrainConfig(dataset="cifar10", weights="w", model="ViT_B16"), train_examples=50_000,
                    accelerator="gpu")
    assert cifar.lr == 0.01


def test_cpu_rule_scales_batch_and_lr_unless_given():
    config = resolve(TrainConfig(dataset="cifar100", weights="w"), train_examples=50_000, accelerator="cpu")
    assert (config.batch_size, config.lr) == (32, pytest.approx(0.03 / 16))
    given = resolve(TrainConfig(dataset="cifar100", weights="w", lr=0.01), train_examples=50_000, accelerator="cpu")
    assert (given.batch_size, given.lr) == (32, 0.01)
    digits = resolve(TrainConfig(), train_examples=1438, accelerator="cpu")
    assert digits.batch_size == 64 and digits.preset == "digits"


def test_scratch_preset_epochs_and_warmup_fraction():
    config = resolve(TrainConfig(dataset="cifar10"), train_examples=50_000, accelerator="gpu")
    assert (config.optimizer, config.weight_decay, config.label_smoothing) == ("adamw", 0.1, 0.1)
    assert (config.randaugment, config.mixup, config.cutmix) == ((2, 0.5), 0.8, 1.0)
    per_pass = math.ceil(50_000 / 512)
    assert (config.steps, config.eval_every, config.warmup) == (300 * per_pass, per_pass, round(0.05 * 300 * per_pass))
    with pytest.raises(ValueError, match="steps or epochs"):
        resolve(TrainConfig(dataset="cifar10", steps=10, epochs=1), train_examples=10, accelerator="cpu")
    with pytest.raises(ValueError, match="number of training examples"):
        resolve(TrainConfig(dataset="cifar10"), train_examples=None, accelerator="gpu")


def test_named_model_drops_the_presets_architecture():
    config = resolve(TrainConfig(model="S/16", depth=2), train_examples=1438, accelerator="cpu")
    assert config.architecture() == {"depth": 2}


def test_bad_batch_splits_are_rejected():
    with pytest.raises(ValueError, match="accumulation_steps=3"):
        resolve(TrainConfig(batch_size=64, accumulation_steps=3), train_examples=1438, accelerator="cpu")
    with pytest.raises(ValueError, match="over 4 replicas"):
        resolve(TrainConfig(batch_size=18), train_examples=1438, accelerator="gpu", replicas=4)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        resolve(TrainConfig(steps=0), train_examples=1438, accelerator="cpu")


def test_run_differences_ignore_how_a_run_runs():
    config = resolve(TrainConfig(), train_examples=1438, accelerator="cpu")
    saved = json.loads(json.dumps({**vars(config), "crop_area": list(config.crop_area),
                                   "randaugment": list(config.randaugment)}))
    assert run_differences(saved, config) == []
    moved = resolve(TrainConfig(strategy="default", verbose=0, lr=0.5, checkpoint_every=7), train_examples=1438,
                    accelerator="cpu")
    assert run_differences(saved, moved) == ["lr"]


@pytest.mark.parametrize("env, gpus, expected", [
    ({}, 0, "default"),
    ({}, 1, "default"),
    ({}, 4, "mirrored"),
    ({"TPU_NAME": "my-tpu"}, 0, "tpu"),
    ({"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}})},
     0, "multi_worker"),
    ({"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}})},
     2, "mirrored"),
])
def test_choose_strategy(env, gpus, expected, monkeypatch):
    monkeypatch.setattr("os.path.exists", lambda path: False)  # no /dev/accel0
    assert choose_strategy(env, num_gpus=gpus) == expected


def test_get_strategy_by_name(monkeypatch):
    import tensorflow as tf

    assert get_strategy("default") is tf.distribute.get_strategy()
    with pytest.raises(ValueError, match="Unknown strategy 'horovod'"):
        get_strategy("horovod")
    monkeypatch.delenv("TPU_NAME", raising=False)
    monkeypatch.setattr("os.path.exists", lambda path: False)
    with pytest.raises(ValueError, match="no TPU"):
        get_strategy("tpu")
    with pytest.raises(ValueError, match="TF_CONFIG is not valid JSON"):
        choose_strategy({"TF_CONFIG": "{"}, num_gpus=0)
    assert get_strategy("one_device").num_replicas_in_sync == 1
