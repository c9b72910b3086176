"""Settings: the config's sections and generated options, presets and how the defaults are chosen, the
learning-rate schedules (Keras' own, checked against the paper's formula), strategy choice."""

import dataclasses
import json
import math
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_vit.fields import option_fields
from keras_vit.training import ablation, finetune, pretrain
from keras_vit.training.config import (
    PRESET,
    PRESETS,
    RUN_ONLY_FIELDS,
    SECTIONS,
    TrainConfig,
    choose_preset,
    from_args,
    json_ready,
    resolve,
    run_differences,
)
from keras_vit.training.distributed.strategy import choose_strategy, get_strategy
from keras_vit.training.model import build_model
from keras_vit.training.schedules import WarmupDecay
from keras_vit.variants import parse_variant

# settings, presets and options are the same on every backend; the schedules compute with keras.ops
pytestmark = pytest.mark.backend_independent

PARSERS = {"finetune": finetune.parser, "pretrain": pretrain.parser, "ablation": ablation.parser}


def config(**flat) -> TrainConfig:
    return TrainConfig.from_flat(flat)


def digits(**flat) -> TrainConfig:
    return resolve(config(**flat), train_examples=1438, accelerator="cpu")


# --- schedules ---------------------------------------------------------------------------------------


def formula(t, base, total, warmup, decay, end=0.0):
    """The old WarmupDecay, written out: lr of update t (1-based), linear warmup to base over W updates,
    then decay to end at update T."""
    progress = min(max((t - warmup) / max(1, total - warmup), 0.0), 1.0)
    if decay == "cosine":
        lr = end + (base - end) * 0.5 * (1 + math.cos(math.pi * progress))
    elif decay == "linear":
        lr = end + (base - end) * (1 - progress)
    else:
        lr = base
    return lr * min(1.0, t / warmup) if warmup else lr


def compiled(schedule):
    """The schedule as the optimizer calls it: in the backend's compiled step, with an integer step."""
    if keras.backend.backend() == "tensorflow":
        return tf.function(schedule, input_signature=[tf.TensorSpec([], tf.int64)])
    if keras.backend.backend() == "jax":
        import jax

        return jax.jit(schedule)
    return schedule


@pytest.mark.backends("tensorflow", "jax")
@pytest.mark.parametrize("decay", ["cosine", "linear", "constant"])
@pytest.mark.parametrize("warmup", [0, 10, 100])
@pytest.mark.parametrize("accumulation", [1, 4])
def test_schedule_equals_the_old_formula_at_every_step(decay, warmup, accumulation):
    """The schedule in the compiled step = the old formula, at every optimizer call (iterations
    0 .. (T + 20) * A - 1), for t = iterations // A + 1."""
    schedule = WarmupDecay(
        0.03, total_steps=100, warmup_steps=warmup, decay=decay, end_lr=1e-4, accumulation_steps=accumulation
    )
    calls = range(120 * accumulation)
    learning_rate = compiled(schedule)
    values = [float(learning_rate(call)) for call in calls]
    expected = [formula(call // accumulation + 1, 0.03, 100, warmup, decay, 1e-4) for call in calls]
    np.testing.assert_allclose(values, expected, rtol=2e-6, atol=1e-9)
    if warmup:
        assert values[(warmup - 1) * accumulation] == pytest.approx(0.03)  # the warmup ends at the base rate
    if decay != "constant" and warmup < 100:
        # the last update is at end_lr, to float32 round-off of the 0.03-sized terms (JAX's XLA rounds differently)
        assert values[99 * accumulation] == pytest.approx(1e-4, abs=5e-9)


@pytest.mark.backends("tensorflow", "jax", "torch")
@pytest.mark.parametrize("decay", ["cosine", "linear", "constant"])
def test_the_rate_read_outside_the_step_is_the_formula_and_compiles_nothing_new(decay):
    """A logged step reads the rate eagerly: the formula's value on every backend, and on JAX no compilation after
    the first read (Keras' CosineDecay compiled its ops.cond at each read there, 50 ms and 1.7 MB kept each)."""
    schedule, calls = WarmupDecay(0.03, 100, 10, decay, 1e-4), range(0, 120, 7)
    schedule(0)  # the first read compiles the ops it uses
    compiles = []

    def listen(event, seconds, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)

    if keras.backend.backend() == "jax":
        import jax.monitoring

        jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        values = [float(keras.ops.convert_to_numpy(schedule(call))) for call in calls]
    finally:
        if keras.backend.backend() == "jax":
            jax.monitoring.unregister_event_duration_listener(listen)
    expected = [formula(call + 1, 0.03, 100, 10, decay, 1e-4) for call in calls]
    np.testing.assert_allclose(values, expected, rtol=2e-6, atol=1e-9)
    assert compiles == []


@pytest.mark.backends("tensorflow", "jax")
def test_schedule_serialises_loads_in_a_saved_model_and_rejects_bad_arguments(tmp_path):
    schedule = WarmupDecay(0.01, 500, 50, "linear", 1e-5, 2)
    clone = keras.optimizers.schedules.deserialize(keras.optimizers.schedules.serialize(schedule))
    assert clone.get_config() == schedule.get_config()
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(WarmupDecay(0.1, 20, 5)), loss="mse")
    model.save(tmp_path / "model.keras")
    optimizer = keras.saving.load_model(tmp_path / "model.keras").optimizer
    assert optimizer.get_config()["learning_rate"]["registered_name"] == "keras_vit_training>WarmupDecay"
    assert float(optimizer.learning_rate) == pytest.approx(0.1 / 5)  # update 1 of the 5 warmup steps
    with pytest.raises(ValueError, match="decay"):
        WarmupDecay(0.1, 10, 0, "step")
    with pytest.raises(ValueError, match="warmup_steps"):
        WarmupDecay(0.1, 10, 11)


# --- the config and its command line ----------------------------------------------------------------


@pytest.mark.parametrize("command", sorted(PARSERS))
def test_every_generated_option_has_help(command):
    parser = PARSERS[command]()
    options = [a for a in parser._actions if a.option_strings]
    assert all(a.help and a.help.strip() for a in options), [a.dest for a in options if not a.help]
    text = parser.format_help()
    for action in options:
        assert action.option_strings[0] in text
    flat = set(TrainConfig().flat())
    assert flat <= {a.dest for a in options}  # every field is an option


def test_options_keep_their_names_and_types():
    args = finetune.parser().parse_args(
        [
            "--lr",
            "0.1",
            "--batch-size",
            "32",
            "--crop-area",
            "0.05,1",
            "--no-flip",
            "--randaugment",
            "2,0.5",
            "--cpu-devices",
            "2",
            "--verbose",
            "2",
            "--overwrite",
            "--model",
            "ViT_B16",
            "--schedule",
            "linear",
            "--lora-rank",
            "8",
            "--strategy",
            "model_parallel",
            "--model-devices",
            "2",
        ]
    )
    parsed = from_args(args)
    assert (parsed.model.lora_rank, parsed.run.strategy, parsed.run.model_devices) == (8, "model_parallel", 2)
    assert (parsed.optim.lr, parsed.optim.batch_size, parsed.optim.schedule) == (0.1, 32, "linear")
    assert (parsed.data.crop_area, parsed.data.flip, parsed.data.randaugment) == ((0.05, 1.0), False, (2, 0.5))
    assert (parsed.run.cpu_devices, parsed.run.verbose, parsed.run.overwrite) == (2, 2, True)
    assert parsed.model.name == "ViT_B16"
    assert vars(finetune.parser().parse_args([])) == {}  # absent options stay absent: defaults live in the dataclasses
    assert from_args(finetune.parser().parse_args([])) == TrainConfig()
    assert from_args(ablation.parser().parse_args([]), ablation.BASE).optim.steps == 400
    for bad in (["--strategy", "horovod"], ["--model", "X/16"], ["--crop-area", "0.5"], ["--verbose", "3"]):
        with pytest.raises(SystemExit):
            finetune.parser().parse_args(bad)


def test_pretrain_and_ablation_options_come_from_their_dataclasses():
    args = pretrain.parser().parse_args(
        [
            "--pretrain-steps",
            "7",
            "--colour-bits",
            "2",
            "--compare-scratch",
            "--corruption-rate",
            "0.25",
            "--steps",
            "3",
        ]
    )
    options = pretrain.PretrainConfig(**pretrain.fields.given(args, pretrain.PretrainConfig))
    assert (options.steps, options.bits, options.compare_scratch, options.rate) == (7, 2, True, 0.25)
    assert from_args(args, pretrain.BASE).optim.steps == 3
    assert from_args(args, pretrain.BASE).run.output_dir == "runs/pretrain"
    args = ablation.parser().parse_args(["--positions", "none,relative", "--seeds", "2"])
    options = ablation.AblationOptions(**ablation.fields.given(args, ablation.AblationOptions))
    assert options.runs() == (("none", "token"), ("relative", "token")) and options.seeds == 2


def test_flat_names_round_trip_and_reject_unknown_ones():
    changed = TrainConfig().replace(lr=0.5, model="S/16", crop_area=(0.5, 1.0), preset="scratch")
    assert (changed.optim.lr, changed.model.name, changed.preset) == (0.5, "S/16", "scratch")
    saved = json.loads(json.dumps(json_ready(changed)))  # run.json: tuples are lists there
    assert TrainConfig.from_flat({k: tuple(v) if isinstance(v, list) else v for k, v in saved.items()}) == changed
    assert tuple(f.name for f in option_fields(SECTIONS["run"])) == RUN_ONLY_FIELDS
    with pytest.raises(TypeError, match="learning_rate"):
        TrainConfig().replace(learning_rate=0.1)


def test_presets_are_partial_overrides_of_the_sections():
    for name, preset in PRESETS.items():
        for section, values in preset.items():
            preset_fields = {f.name for f in option_fields(SECTIONS[section]) if f.metadata["unset"] == PRESET}
            assert set(values) <= preset_fields | {"patch_size", "hidden_size", "depth", "num_heads", "mlp_dim"}, name
            assert all(f.default is None for f in option_fields(SECTIONS[section]) if f.name in values)
    resolved = digits(lr=0.5, flip=True)
    assert (resolved.optim.lr, resolved.data.flip) == (0.5, True)  # the user's values win...
    assert (resolved.optim.optimizer, resolved.optim.steps, resolved.data.crop_area) == ("adamw", 2000, (0.6, 1.0))
    assert (resolved.optim.momentum, resolved.run.output_dir) == (0.9, "runs/finetune")  # ...then preset, defaults
    assert PRESETS["digits"]["optim"]["lr"] == 2e-3  # and the preset itself is untouched


@pytest.mark.parametrize(
    "name", ["B/16", "ViT_B16", "vit-ti/16", "ViT-L/32", "s16", "H/14", "R50+B/16", "ViT_R26_S32", "R50+L/32"]
)
def test_model_option_takes_every_variant_of_the_table(name):
    assert finetune.parser().parse_args(["--model", name]).model == name
    resolved = digits(model=name)
    assert resolved.model.name == name and resolved.architecture() == {}


def test_unknown_models_are_rejected():
    with pytest.raises(ValueError, match="Unknown ViT variant 'X/16'"):
        digits(model="X/16")
    with pytest.raises(ValueError, match="Unknown hybrid"):
        digits(model="R51+B/16")
    with pytest.raises(ValueError, match="num_heads"):
        digits(model="Ti/4", hidden_size=30, num_heads=4)


def test_a_hybrid_resolves_and_builds_in_a_tiny_config():
    resolved = digits(model="R50+B/16", image_size=32, depth=1, hidden_size=16, num_heads=2, mlp_dim=32)
    arch = parse_variant(resolved.model.name).replace(**resolved.architecture())
    assert arch.resnet_stages == (3, 4, 9) and arch.stride == 16 and arch.depth == 1
    model = build_model(resolved, num_classes=10)
    assert model.output_shape == (None, 10)
    assert model(np.zeros((2, 32, 32, 3), "float32")).shape == (2, 10)
    plain = build_model(digits(model="B/16", image_size=32, depth=1, hidden_size=16, num_heads=2, mlp_dim=32), 10)
    assert model.count_params() > 100 * plain.count_params()  # the ResNet


def test_auto_preset():
    assert choose_preset(TrainConfig()) == "digits"
    assert choose_preset(config(dataset="cifar10")) == "scratch"
    assert choose_preset(config(dataset="cifar10", weights="imagenet21k/ViT-B_16")) == "finetune"
    with pytest.raises(ValueError, match="preset"):
        choose_preset(config(preset="paper"))


def test_finetune_preset_is_the_paper_recipe_on_accelerators():
    resolved = resolve(config(dataset="oxford_iiit_pet", weights="w"), train_examples=3680, accelerator="gpu")
    optim, data = resolved.optim, resolved.data
    assert (optim.optimizer, optim.momentum, optim.clip_norm, optim.weight_decay) == ("sgd", 0.9, 1.0, 0.0)
    assert (optim.batch_size, optim.lr, optim.warmup, optim.steps) == (512, 0.03, 500, 10_000)
    assert (optim.schedule, resolved.model.image_size, data.crop_area, data.flip) == ("cosine", 384, (0.05, 1.0), True)
    assert (data.eval_crop, data.mixup, data.randaugment[0]) == (1.0, 0.0, 0)
    imagenet = resolve(config(dataset="imagenet2012", weights="w"), train_examples=None, accelerator="tpu")
    assert imagenet.optim.steps == 20_000
    cifar = resolve(config(dataset="cifar10", weights="w", model="ViT_B16"), train_examples=50_000, accelerator="gpu")
    assert cifar.optim.lr == 0.01
    hybrid = resolve(config(dataset="cifar10", weights="w", model="R50+B/16"), train_examples=50_000, accelerator="gpu")
    assert hybrid.optim.lr == 0.03  # the CIFAR-10 adjustment is B/16's only


def test_cpu_rule_scales_batch_and_lr_unless_given():
    resolved = resolve(config(dataset="cifar100", weights="w"), train_examples=50_000, accelerator="cpu")
    assert (resolved.optim.batch_size, resolved.optim.lr) == (32, pytest.approx(0.03 / 16))
    given = resolve(config(dataset="cifar100", weights="w", lr=0.01), train_examples=50_000, accelerator="cpu")
    assert (given.optim.batch_size, given.optim.lr) == (32, 0.01)
    resolved = digits()
    assert resolved.optim.batch_size == 64 and resolved.preset == "digits"


def test_scratch_preset_epochs_and_warmup_fraction():
    resolved = resolve(config(dataset="cifar10"), train_examples=50_000, accelerator="gpu")
    optim, data = resolved.optim, resolved.data
    assert (optim.optimizer, optim.weight_decay, optim.label_smoothing) == ("adamw", 0.1, 0.1)
    assert (data.randaugment, data.mixup, data.cutmix) == ((2, 0.5), 0.8, 1.0)
    per_pass = math.ceil(50_000 / 512)
    assert (optim.steps, optim.eval_every, optim.warmup) == (300 * per_pass, per_pass, round(0.05 * 300 * per_pass))
    with pytest.raises(ValueError, match="steps or epochs"):
        resolve(config(dataset="cifar10", steps=10, epochs=1), train_examples=10, accelerator="cpu")
    with pytest.raises(ValueError, match="number of training examples"):
        resolve(config(dataset="cifar10"), train_examples=None, accelerator="gpu")


def test_named_model_drops_the_presets_architecture():
    assert digits(model="S/16", depth=2).architecture() == {"depth": 2}


def test_bad_settings_are_rejected():
    with pytest.raises(ValueError, match="accumulation_steps=3"):
        digits(batch_size=64, accumulation_steps=3)
    with pytest.raises(ValueError, match="over 4 replicas"):
        resolve(config(batch_size=18), train_examples=1438, accelerator="gpu", replicas=4)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        digits(steps=0)
    with pytest.raises(ValueError, match="Unknown mixed_precision 'half'"):
        digits(mixed_precision="half")
    with pytest.raises(ValueError, match="Unknown optimizer 'lamb'"):
        digits(optimizer="lamb")


def test_run_differences_ignore_how_a_run_runs():
    resolved = digits()
    saved = json.loads(json.dumps(json_ready(resolved)))
    assert run_differences(saved, resolved) == []
    moved = digits(strategy="default", verbose=0, lr=0.5, checkpoint_every=7, cpu_devices=2)
    assert run_differences(saved, moved) == ["lr"]
    old_layout = {k: v for k, v in saved.items() if k != "cpu_devices"}  # a run.json written before cpu_devices
    assert run_differences(old_layout, resolved) == []
    assert dataclasses.is_dataclass(resolved.run) and set(saved) == {"preset", *TrainConfig().flat()}


@pytest.mark.parametrize(
    "env, gpus, expected",
    [
        ({}, 0, "default"),
        ({}, 1, "default"),
        ({}, 4, "mirrored"),
        ({"TPU_NAME": "my-tpu"}, 0, "tpu"),
        (
            {"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}})},
            0,
            "multi_worker",
        ),
        (
            {"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}})},
            2,
            "mirrored",
        ),
    ],
)
def test_choose_strategy(env, gpus, expected, monkeypatch):
    monkeypatch.setattr("os.path.exists", lambda path: False)  # no /dev/accel0
    assert choose_strategy(env, num_gpus=gpus) == expected


@pytest.mark.backends("tensorflow")
def test_get_strategy_by_name(monkeypatch):
    assert get_strategy("default") is tf.distribute.get_strategy()
    with pytest.raises(ValueError, match=r"data_parallel is a keras\.distribution of the JAX backend"):
        get_strategy("data_parallel")
    with pytest.raises(ValueError, match="Unknown strategy 'horovod'"):
        get_strategy("horovod")
    monkeypatch.delenv("TPU_NAME", raising=False)
    monkeypatch.setattr("os.path.exists", lambda path: False)
    with pytest.raises(ValueError, match="no TPU"):
        get_strategy("tpu")
    with pytest.raises(ValueError, match="TF_CONFIG is not valid JSON"):
        choose_strategy({"TF_CONFIG": "{"}, num_gpus=0)
    assert get_strategy("one_device").num_replicas_in_sync == 1


@pytest.mark.backend_independent
def test_config_imports_neither_tensorflow_nor_keras():
    code = (
        "import sys, keras_vit.training.config\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'tensorflow', 'keras'}))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout
