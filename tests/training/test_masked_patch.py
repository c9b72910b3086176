"""Masked patch prediction (keras_vit.training.masked_patch, keras_vit.training.pretrain) and the ablation's pieces."""

import json
import os

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.precision import global_policy
from keras_vit.training.ablation import AblationRow, _runs, table
from keras_vit.training.config import DataConfig
from keras_vit.training.data import load_digits
from keras_vit.training.masked_patch import (
    KEEP,
    MASK,
    RANDOM,
    UNCHANGED,
    PatchCorruption,
    colour_targets,
    masked_patch_dataset,
    masked_patch_model,
    patch_grid,
    sample_corruption,
)
from keras_vit.training.pipeline import Augment
from keras_vit.training.pretrain import LoadEncoder, copy_encoder_weights

pytestmark = pytest.mark.backends("tensorflow")  # the default backend only: backend-independent or slow

ENCODER = dict(image_size=16, patch_size=4, depth=1, hidden_size=32, num_heads=2, mlp_dim=64, num_classes=10)


def encoder(**kwargs) -> keras.Model:
    return keras_vit.ViT("Ti/4", **{**ENCODER, **kwargs})


def test_corruption_hits_the_stated_proportions():
    """50% of each image's patches; of those 80% mask, 10% random, 10% unchanged (within 4 standard errors)."""
    batch, patches = 1000, 64
    kinds, sources = (keras.ops.convert_to_numpy(t) for t in sample_corruption(batch, patches, (3, 4)))
    corrupted = kinds != KEEP
    np.testing.assert_array_equal(corrupted.sum(axis=1), patches // 2)
    n = corrupted.sum()
    for kind, p in ((MASK, 0.8), (RANDOM, 0.1), (UNCHANGED, 0.1)):
        share = (kinds == kind).sum() / n
        assert abs(share - p) < 4 * np.sqrt(p * (1 - p) / n), (kind, share)
    # which patches get corrupted is uniform over positions: each position ~50% of the time
    per_position = corrupted.mean(axis=0)
    assert np.all(np.abs(per_position - 0.5) < 4 * np.sqrt(0.25 / batch))
    # a random replacement comes from another patch of the same image; everything else from itself
    positions = np.broadcast_to(np.arange(patches), kinds.shape)
    assert np.all(sources[kinds == RANDOM] != positions[kinds == RANDOM])
    np.testing.assert_array_equal(sources[kinds != RANDOM], positions[kinds != RANDOM])
    assert sources.min() >= 0 and sources.max() < patches
    # stateless: the same seed gives the same plan, another seed another
    again = keras.ops.convert_to_numpy(sample_corruption(batch, patches, (3, 4))[0])
    other = keras.ops.convert_to_numpy(sample_corruption(batch, patches, (3, 5))[0])
    np.testing.assert_array_equal(again, kinds)
    assert np.mean(other != kinds) > 0.3


def test_corruption_leaves_the_uncorrupted_positions_untouched():
    tokens = np.random.default_rng(0).normal(size=(64, 16, 8)).astype("float32")
    kinds, sources = (keras.ops.convert_to_numpy(t) for t in sample_corruption(64, 16, (1, 2)))
    layer = PatchCorruption()
    out = keras.ops.convert_to_numpy(layer(tokens, kinds, sources))
    mask = keras.ops.convert_to_numpy(layer.mask_token)[0, 0]
    for kind in (KEEP, UNCHANGED):
        np.testing.assert_array_equal(out[kinds == kind], tokens[kinds == kind])
    np.testing.assert_array_equal(out[kinds == MASK], np.broadcast_to(mask, out[kinds == MASK].shape))
    b, n = np.nonzero(kinds == RANDOM)
    assert len(b) > 0
    np.testing.assert_array_equal(out[b, n], tokens[b, sources[b, n]])
    assert not np.any(np.all(out[b, n] == tokens[b, n], axis=-1))


def test_colour_target_of_a_constant_patch():
    """Mean colour per channel v in [0, 255] -> bin floor(v * 8 / 256) -> class r_bin * 64 + g_bin * 8 + b_bin.

    (255, 0, 128) -> bins (7, 0, 4) -> class 7 * 64 + 0 * 8 + 4 = 452;
    (31, 32, 200) -> bins (0, 1, 6) -> class 0 * 64 + 1 * 8 + 6 = 14.
    """
    image = np.zeros((1, 4, 8, 3), "float32")
    image[:, :, :4] = (255, 0, 128)
    image[:, :, 4:] = (31, 32, 200)
    targets = keras.ops.convert_to_numpy(colour_targets(image, 4))
    np.testing.assert_array_equal(targets, [[7 * 64 + 0 * 8 + 4, 0 * 64 + 1 * 8 + 6]])
    # the same image in the model's [-1, 1] range gives the same classes
    scaled = (image - 127.5) / 127.5
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(colour_targets(scaled, 4, value_range=(-1, 1))), targets)
    # the mean, not a pixel, decides: half black, half (64, 64, 64) -> mean 32 -> bins (1, 1, 1) = 73
    mixed = np.zeros((1, 4, 4, 3), "float32")
    mixed[:, :2] = 64
    assert keras.ops.convert_to_numpy(colour_targets(mixed, 4))[0, 0] == 64 + 8 + 1
    with pytest.raises(ValueError, match="divisible"):
        colour_targets(image, 3)


def test_masked_patch_model_shares_the_encoder():
    model = encoder()
    assert patch_grid(model) == (16, 4)
    mpp = masked_patch_model(model)
    encoder_paths = {w.path for w in model.weights if not w.path.startswith("head/")}
    assert encoder_paths <= {w.path for w in mpp.weights}
    assert len(mpp.weights) == len(model.weights) - 2 + 1 + 2  # no head; the [mask] token and the 512-way head
    kinds, sources = (keras.ops.convert_to_numpy(t) for t in sample_corruption(3, 16, (0, 0)))
    logits = mpp({"images": np.zeros((3, 16, 16, 3), "float32"), "corruption": kinds, "sources": sources})
    assert logits.shape == (3, 16, 512)
    with pytest.raises(ValueError, match="bits"):
        masked_patch_model(model, bits=0)


def test_short_masked_patch_pretraining_lowers_the_loss_and_trains_the_encoder(tmp_path):
    keras.utils.set_random_seed(0)
    model = encoder(hidden_size=48, num_heads=3)
    mpp = masked_patch_model(model)
    mpp.compile(
        optimizer=keras.optimizers.Adam(2e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="mean_with_sample_weight"),
        weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
    )
    source = load_digits()
    augment = Augment(16, DataConfig())
    held_out = masked_patch_dataset(source.eval, 128, augment, 4, training=False)
    before = mpp.evaluate(held_out, return_dict=True, verbose=0)
    embedding_before = keras.ops.convert_to_numpy(model.get_layer("embedding").kernel)
    mpp.fit(masked_patch_dataset(source.train, 64, augment, 4), steps_per_epoch=30, epochs=1, verbose=0)
    after = mpp.evaluate(held_out, return_dict=True, verbose=0)
    assert after["loss"] < 0.6 * before["loss"], (before, after)
    assert after["accuracy"] > before["accuracy"] + 0.2
    assert not np.allclose(keras.ops.convert_to_numpy(model.get_layer("embedding").kernel), embedding_before)

    # the pre-trained encoder goes into a fresh model of the same shape, all but the classifier
    path = os.path.join(tmp_path, "encoder.keras")
    model.save(path)
    fresh = encoder(hidden_size=48, num_heads=3, num_classes=3)
    callback = LoadEncoder(path)
    callback.set_model(fresh)
    fresh.compile(optimizer="sgd", loss="mse")
    fresh.optimizer.build(fresh.trainable_variables)
    callback.on_train_begin()
    for name in ("embedding", "class_token", "posembed_input", "encoderblock_0", "encoder_norm"):
        for ours, theirs in zip(fresh.get_layer(name).weights, model.get_layer(name).weights):
            np.testing.assert_array_equal(keras.ops.convert_to_numpy(ours), keras.ops.convert_to_numpy(theirs))
    assert fresh.get_layer("head").kernel.shape == (48, 3)


def test_load_encoder_names_mismatches_and_spares_resumed_runs():
    source = encoder()
    with pytest.raises(ValueError, match="encoderblock_0"):
        copy_encoder_weights(source, encoder(mlp_dim=32))
    assert "head" not in copy_encoder_weights(source, encoder(num_classes=4))
    resumed = encoder()
    resumed.compile(optimizer="sgd", loss="mse")
    resumed.optimizer.build(resumed.trainable_variables)
    resumed.optimizer.iterations.assign(5)
    kernel = keras.ops.convert_to_numpy(resumed.get_layer("embedding").kernel)
    callback = LoadEncoder("/nonexistent.keras")  # never opened: the run is past step 0
    callback.set_model(resumed)
    callback.on_train_begin()
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(resumed.get_layer("embedding").kernel), kernel)


def test_ablation_runs_and_table():
    assert _runs(None, None)[-1] == ("learned_1d", "gap") and len(_runs(None, None)) == 6
    assert _runs("none,relative", None) == (("none", "token"), ("relative", "token"))
    assert _runs("none", "token,gap") == (("none", "token"), ("none", "gap"))
    rows = [AblationRow("learned_1d", "token", 1234, [0.9, 0.8], 12.0), AblationRow("none", "gap", 99, [0.5], 3.0)]
    text = table(rows).splitlines()
    assert text[2] == "| `learned_1d` | token | 1,234 | 0.850 ± 0.071 | 12 |"
    assert text[3] == "| `none` | gap | 99 | 0.500 | 3 |"


@pytest.mark.slow
def test_pretrain_command_end_to_end(tmp_path):
    from keras_vit.training.pretrain import main

    out = os.path.join(tmp_path, "run")
    result = main(
        [
            "--pretrain-steps",
            "20",
            "--steps",
            "10",
            "--depth",
            "1",
            "--hidden-size",
            "32",
            "--output-dir",
            out,
            "--verbose",
            "0",
            "--compare-scratch",
        ]
    )
    assert os.path.exists(result.encoder_path)
    assert {"finetune", "scratch"} <= set(os.listdir(out))
    assert 0.0 <= result.finetuned.metrics["accuracy"] <= 1.0
    assert result.history["loss"][-1] < result.history["loss"][0]


@pytest.mark.slow
def test_ablation_command_trains_each_setting(tmp_path):
    from keras_vit.training.ablation import main

    rows = main(
        [
            "--positions",
            "learned_2d,none",
            "--steps",
            "5",
            "--depth",
            "1",
            "--hidden-size",
            "32",
            "--output-dir",
            str(tmp_path),
        ]
    )
    assert [r.position_embedding for r in rows] == ["learned_2d", "none"]
    assert all(0.0 <= r.mean <= 1.0 for r in rows)
    assert os.path.exists(os.path.join(tmp_path, "ablation.md"))


# A small model for the command's runs: 16 patches of 4 pixels.
SMALL = ["--model=Ti/4", "--image-size=16", "--depth=1", "--hidden-size=32", "--num-heads=2", "--mlp-dim=64"]


def test_pretrain_runs_its_masked_phase_in_the_chosen_precision(tmp_path):
    """``--mixed-precision bfloat16``: the masked-patch phase builds its encoder in bfloat16 (saved so in
    encoder.keras) with a float32 patch head, learns, and leaves the global policy as it was."""
    from keras_vit.training.pretrain import main

    before = keras.mixed_precision.dtype_policy().name
    argv = ["--pretrain-steps", "10", "--steps", "1", *SMALL, "--verbose", "0"]
    result = main([*argv, "--mixed-precision", "bfloat16", "--output-dir", str(tmp_path / "run")])
    encoder = keras.saving.load_model(result.encoder_path)
    assert encoder.get_layer("encoderblock_0").dtype_policy.name == "mixed_bfloat16"
    with global_policy("mixed_bfloat16"):
        model = masked_patch_model(encoder)
    assert model.get_layer("mpp_corruption").compute_dtype == "bfloat16"
    assert model.get_layer("mpp_head").compute_dtype == "float32"
    assert result.history["loss"][-1] < result.history["loss"][0]
    assert keras.mixed_precision.dtype_policy().name == before


def test_pretrain_phases_are_runs_as_finetune_is(tmp_path, capsys):
    """Both phases go through the one training run: the masked-patch phase writes run.json, metrics.json and its
    checkpoints in OUT/pretrain (and the encoder as OUT/encoder.keras); started again, both phases are finished and
    nothing changes; more pre-training steps extend its phase; a changed pre-training setting is refused, naming it."""
    from keras_vit.training.pretrain import main

    out = tmp_path / "run"
    argv = ["--pretrain-steps=4", "--pretrain-eval-every=2", "--steps=2", *SMALL]
    argv += ["--mixed-precision=none", "--verbose=0", "--output-dir", str(out)]
    first = main(argv)
    masked = json.loads((out / "pretrain" / "metrics.json").read_text())
    assert masked["steps"] == 4 and masked["resumed_from_step"] == 0 and masked["history"] == first.history
    assert json.loads((out / "pretrain" / "run.json").read_text())["optimizer"] == "adam"
    assert (out / "encoder.keras").exists() and not (out / "pretrain" / "model.keras").exists()
    metrics = {phase: (out / phase / "metrics.json").read_bytes() for phase in ("pretrain", "finetune")}
    again = main(argv)  # both phases finished: nothing is trained or written again
    assert {phase: (out / phase / "metrics.json").read_bytes() for phase in metrics} == metrics
    assert again.history == first.history
    main([*argv, "--pretrain-steps=6"])  # more pre-training steps extend the masked-patch phase
    assert json.loads((out / "pretrain" / "metrics.json").read_text())["resumed_from_step"] == 4
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main([*argv, "--pretrain-steps=6", "--pretrain-lr", "0.5"])
    assert "holds a run with different settings (lr)" in capsys.readouterr().err


def test_whole_masked_eval_batches_weigh_only_real_patches():
    """``whole_batches=True`` (TPU, JAX data_parallel): every batch whole, the blanks' patches weigh 0, so the
    corrupted patches scored are exactly those of the plain batches (359 digits at batch 64: 25 blanks)."""
    split = load_digits(0.2, 0).eval
    augment = Augment(16, DataConfig())
    plain = list(masked_patch_dataset(split, 64, augment, 4, training=False))
    whole = list(masked_patch_dataset(split, 64, augment, 4, training=False, whole_batches=True))
    assert [w.shape for *_, w in whole] == [(64, 16)] * 6 and sum(len(t) for _, t, _ in plain) == 359
    for (inputs, targets, weights), (inputs_w, targets_w, weights_w) in zip(plain, whole):
        n = len(targets)
        np.testing.assert_array_equal(inputs["corruption"], inputs_w["corruption"][:n])
        np.testing.assert_array_equal(weights, weights_w[:n])
        np.testing.assert_array_equal(targets, targets_w[:n])
    assert float(whole[-1][2][359 - 5 * 64 :].numpy().sum()) == 0.0  # the 25 blanks
    assert sum(float(w.numpy().sum()) for *_, w in whole) == sum(float(w.numpy().sum()) for *_, w in plain) > 0
