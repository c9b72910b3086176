"""keras_vit.precision: the hardware -> dtype-policy rule, the CPU-flag probe, and bfloat16 parity."""

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import precision

ZEN4 = {"fpu", "avx2", "avx512f", "avx512_vnni", "avx512_bf16"}
ZEN3 = {"fpu", "avx2", "fma"}
SAPPHIRE_RAPIDS = {"avx512f", "amx_tile", "amx_bf16", "amx_int8"}


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    ("device", "features", "capability", "expected"),
    [
        ("cpu", ZEN4, None, "mixed_bfloat16"),
        ("cpu", ZEN3, None, "float32"),
        ("cpu", SAPPHIRE_RAPIDS, None, "mixed_bfloat16"),
        ("cpu", {"amx_tile"}, None, "mixed_bfloat16"),
        ("cpu", {"AVX512_BF16"}, None, "mixed_bfloat16"),
        ("cpu", set(), None, "float32"),
        ("gpu", (), (6, 1), "float32"),
        ("gpu", (), (7, 0), "mixed_float16"),
        ("gpu", (), "7.5", "mixed_float16"),
        ("gpu", (), (8, 0), "mixed_bfloat16"),
        ("gpu", (), "8.6", "mixed_bfloat16"),
        ("gpu", (), (9, 0), "mixed_bfloat16"),
        ("GPU:0", (), "sm_90", "mixed_bfloat16"),
        ("cuda", (), 8.9, "mixed_bfloat16"),
        ("tpu", (), None, "mixed_bfloat16"),
        ("tpu", ZEN3, None, "mixed_bfloat16"),
    ],
)
def test_rule_follows_the_hardware_table(device, features, capability, expected):
    assert precision.auto_policy(device, features=features, gpu_capability=capability, backend="tensorflow") == expected
    assert precision.policy_for(device, features, capability) == expected


def test_jax_on_cpu_stays_float32():
    """XLA's CPU compiler has no bfloat16 matmul kernels: bfloat16 units or not, float32."""
    assert precision.auto_policy("cpu", features=ZEN4, backend="jax") == "float32"
    assert precision.auto_policy("cpu", features=ZEN4, backend="torch") == "mixed_bfloat16"
    assert precision.auto_policy("gpu", gpu_capability=(9, 0), backend="jax") == "mixed_bfloat16"


def test_openvino_keeps_keras_in_float32_and_its_runtime_follows_the_bfloat16_units(monkeypatch):
    """Keras' OpenVINO backend keeps the graph float32 (its runtime computes in bfloat16 itself); the runtime's
    precision (:func:`~keras_vit.precision.openvino_precision`) follows the CPU flags as the TensorFlow rule does."""
    assert precision.auto_policy("cpu", features=SAPPHIRE_RAPIDS, backend="openvino") == "float32"
    assert precision.auto_policy("gpu", gpu_capability=(9, 0), backend="openvino") == "mixed_bfloat16"
    precisions = [precision.openvino_precision(flags) for flags in (SAPPHIRE_RAPIDS, ZEN4, ZEN3, set())]
    assert precisions == ["bf16", "bf16", "f32", "f32"]
    monkeypatch.setattr(precision, "cpu_features", lambda: frozenset(ZEN3))
    assert precision.openvino_precision() == "f32"


def test_cpu_probe_is_used_and_mockable(monkeypatch):
    monkeypatch.setattr(precision, "cpu_features", lambda: frozenset(ZEN4))
    assert precision.auto_policy("cpu", backend="tensorflow") == "mixed_bfloat16"
    assert precision.auto_policy("cpu") == ("float32" if keras.backend.backend() == "jax" else "mixed_bfloat16")
    monkeypatch.setattr(precision, "cpu_features", lambda: frozenset(ZEN3))
    assert precision.auto_policy("cpu", backend="tensorflow") == "float32"
    assert precision.auto_policy("cpu") == "float32"


@pytest.mark.backend_independent
def test_detected_device_feeds_the_rule(monkeypatch):
    monkeypatch.setattr(precision, "detect_device", lambda: ("gpu", (7, 5)))
    assert precision.auto_policy() == "mixed_float16"
    assert precision.auto_policy(gpu_capability=(9, 0)) == "mixed_bfloat16"
    monkeypatch.setattr(precision, "detect_device", lambda: ("cpu", None))
    monkeypatch.setattr(precision, "cpu_features", lambda: frozenset())
    assert precision.auto_policy() == "float32"


@pytest.mark.backend_independent
def test_gpu_of_unknown_capability_stays_float32(monkeypatch):
    monkeypatch.setattr(precision, "detect_device", lambda: ("cpu", None))  # asked "gpu", none visible
    assert precision.auto_policy("gpu") == "float32"


@pytest.mark.backend_independent
def test_unknown_device_is_an_error():
    with pytest.raises(ValueError, match="Unknown device"):
        precision.auto_policy("npu")


@pytest.mark.backend_independent
def test_cpu_features_reads_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu avx2 avx512_bf16 avx512_vnni\n\n")
    assert precision.cpu_features(str(info)) == {"fpu", "avx2", "avx512_bf16", "avx512_vnni"}
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd sve bf16\n")
    assert "bf16" in precision.cpu_features(str(arm))


def test_detect_device_on_this_backend_is_cpu():
    device, capability = precision.detect_device()
    assert device in ("cpu", "gpu", "tpu")
    if device == "cpu":
        assert capability is None


def test_bfloat16_inference_matches_float32():
    """Same weights, ``mixed_bfloat16`` vs float32: logits (up to ~4) within 0.05 absolute, cosine >= 0.999.

    Measured here: max abs diff 0.022, cosine 0.99996.
    """
    x = np.random.default_rng(0).uniform(-1, 1, (4, 32, 32, 3)).astype("float32")
    reference = keras_vit.ViT("Ti/16", image_size=32, depth=2, num_classes=10)
    head = reference.get_layer("head")  # zero-initialised, as published: give it weights to test
    head.kernel.assign(np.random.default_rng(1).normal(0, 0.1, head.kernel.shape))
    expected = np.asarray(reference.predict_on_batch(x))
    try:
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
        model = keras_vit.ViT("Ti/16", image_size=32, depth=2, num_classes=10)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    model.set_weights(reference.get_weights())
    got = np.asarray(model.predict_on_batch(x), dtype="float32")
    assert model.get_layer("encoderblock_0").compute_dtype == "bfloat16"  # the head stays float32
    assert np.abs(expected).max() > 0.1  # not trivially zero
    assert np.abs(got - expected).max() < 0.05
    cosine = np.sum(got * expected, -1) / (np.linalg.norm(got, axis=-1) * np.linalg.norm(expected, axis=-1))
    assert cosine.min() >= 0.999


def test_a_bfloat16_training_step_follows_the_float32_gradient():
    """One SGD step (learning rate 1, no momentum) from the same weights on crops of real photos: under
    ``mixed_bfloat16`` (float32 variables, bfloat16 compute) each variable moves by minus its gradient, which must
    point the way float32's does (cosine >= 0.999 per kernel, 0.9999 over all weights; measured 0.99995 and 0.99998
    on TensorFlow and torch), on every backend: the training path the AMX table measures on TensorFlow and torch."""
    from keras_vit.export import photo_crops
    from keras_vit.preprocessing import ImagePreprocessor

    images = np.stack([np.asarray(ImagePreprocessor(32)(crop)) for crop in photo_crops(8)])
    labels = np.arange(8) % 10
    deltas = []
    for policy in ("float32", "mixed_bfloat16"):
        keras.utils.set_random_seed(0)
        with precision.global_policy(policy):
            model = keras_vit.ViT("Ti/16", image_size=32, depth=2, num_classes=10, dropout=0.0)
        if not deltas:
            rng = np.random.default_rng(1)
            start = [rng.normal(0, 0.05, w.shape).astype("float32") for w in model.get_weights()]
        model.set_weights(start)
        model.compile(keras.optimizers.SGD(1.0), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.train_on_batch(images, labels)
        deltas.append([np.asarray(w, "float32") - s for w, s in zip(model.get_weights(), start, strict=True)])

    def cosine(a, b):
        return float(np.sum(a * b) / (np.linalg.norm(a) * np.linalg.norm(b)))

    assert all(np.abs(d).max() > 0 for d in deltas[0])
    kernels = [(a, b) for a, b in zip(*deltas, strict=True) if a.ndim >= 2]
    assert min(cosine(a, b) for a, b in kernels) >= 0.999
    assert cosine(*(np.concatenate([d.ravel() for d in ds]) for ds in deltas)) >= 0.9999


def _pretend_cpu(monkeypatch, features):
    monkeypatch.setattr("keras_vit.precision.cpu_features", lambda *args: frozenset(features))
    monkeypatch.setattr("keras_vit.precision.detect_device", lambda: ("cpu", None))


@pytest.mark.backend_independent
def test_the_commands_choices_name_their_policies(monkeypatch):
    _pretend_cpu(monkeypatch, {"avx512f", "avx512_bf16"})
    auto = "float32" if keras.backend.backend() == "jax" else "mixed_bfloat16"
    assert precision.policy_of_choice("auto") == auto
    assert precision.policy_of_choice("none") == "float32"
    assert precision.policy_of_choice("bfloat16") == "mixed_bfloat16"
    assert precision.policy_of_choice("float16", "gpu") == "mixed_float16"
    _pretend_cpu(monkeypatch, {"avx2", "fma"})
    assert precision.policy_of_choice("auto") == "float32"
    with pytest.raises(ValueError, match="Unknown mixed precision 'half'"):
        precision.policy_of_choice("half")


@pytest.mark.backend_independent
def test_global_policy_is_restored_even_after_an_error():
    before = keras.mixed_precision.dtype_policy().name
    with pytest.raises(RuntimeError), precision.global_policy("mixed_bfloat16"):
        assert keras_vit.ViT("Ti/16", image_size=32, depth=1).get_layer("encoderblock_0").compute_dtype == "bfloat16"
        raise RuntimeError("inside")
    assert keras.mixed_precision.dtype_policy().name == before


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    from npz_layout import vit_checkpoint, write_checkpoint

    arrays = vit_checkpoint(patch=8, width=32, depth=2, heads=2, mlp=64, grid=(4, 4), num_classes=1000)
    return str(write_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny_in1k.npz", arrays))


@pytest.mark.parametrize("features", [{"avx512f", "avx512_bf16"}, SAPPHIRE_RAPIDS, {"avx2", "fma"}])
def test_predict_builds_the_hardwares_precision_and_agrees_with_float32(monkeypatch, tiny_checkpoint, features):
    """``python -m keras_vit.predict --mixed-precision auto`` (its default) on a CPU with and without bfloat16 units
    (probe mocked; with AMX, SAPPHIRE_RAPIDS, bfloat16 inference runs the batched-matmul projections of
    ``keras_vit.layers.project`` on TensorFlow): bfloat16 where the table says, with the float32 model's top class
    and logits (3-4 here) within
    0.05 (measured on this random tiny checkpoint: 0.014; its 5th and 6th classes are a near tie, so only the
    classes both lists hold are compared)."""
    from sklearn.datasets import load_sample_image

    from keras_vit.predict import _build_model, classify

    _pretend_cpu(monkeypatch, features)
    model = _build_model(tiny_checkpoint, "auto")
    expected = precision.auto_policy("cpu", features)
    compute = keras.dtype_policies.get(expected).compute_dtype  # the weights cast once (keras_vit.for_inference)
    assert model.get_layer("encoderblock_0").dtype_policy.name == compute
    assert model.get_layer("encoderblock_0").attn.qkv.kernel.dtype == compute
    assert model.get_layer("head").compute_dtype == "float32"
    images = [load_sample_image("china.jpg"), load_sample_image("flower.jpg")]
    got = classify(model, images, top=5, scores="logits")
    reference = classify(_build_model(tiny_checkpoint, "none"), images, top=5, scores="logits")
    for ours, theirs in zip(got, reference):
        assert ours[0][0] == theirs[0][0]
        ours, theirs = {w: s for w, _, s in ours}, {w: s for w, _, s in theirs}
        both = sorted(set(ours) & set(theirs))
        assert len(both) >= 4
        tolerance = 0.05 if expected == "mixed_bfloat16" else 1e-5
        np.testing.assert_allclose([ours[w] for w in both], [theirs[w] for w in both], atol=tolerance)


def test_with_policy_runs_a_saved_float32_model_in_bfloat16(tmp_path):
    """A float32 model saved as ``.keras`` and loaded, copied by ``with_policy``: same weights, blocks in bfloat16,
    head in float32, logits within the bfloat16 tolerance of the float32 model's (and float32 -> float32 exact)."""
    x = np.random.default_rng(0).uniform(-1, 1, (4, 32, 32, 3)).astype("float32")
    names = tuple(f"class {i}" for i in range(10))
    model = keras_vit.ViT("Ti/16", image_size=32, depth=2, num_classes=10, class_names=names)
    head = model.get_layer("head")
    head.kernel.assign(np.random.default_rng(1).normal(0, 0.1, head.kernel.shape))
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    expected = np.asarray(loaded.predict_on_batch(x))
    fast = precision.with_policy(loaded, "mixed_bfloat16")
    assert fast.get_layer("encoderblock_0").compute_dtype == "bfloat16"
    assert fast.get_layer("encoderblock_0").attn.qkv.compute_dtype == "bfloat16"
    assert fast.get_layer("head").compute_dtype == "float32"
    assert loaded.get_layer("encoderblock_0").compute_dtype == "float32"  # the original is untouched
    assert type(fast) is type(loaded) is keras_vit.VisionTransformer  # a keras_vit model still: config, class names
    assert fast.config == loaded.config and fast.config.class_names == names
    assert fast.name == loaded.name
    all_bfloat16 = precision.with_policy(loaded, "mixed_bfloat16", keep_float32=())
    assert all_bfloat16.get_layer("head").compute_dtype == "bfloat16"
    for ours, theirs in zip(fast.weights, loaded.weights):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    got = np.asarray(fast.predict_on_batch(x), dtype="float32")
    assert np.abs(expected).max() > 0.1
    assert np.abs(got - expected).max() < 0.05
    with pytest.raises(ValueError, match="Cannot convert 'bf16'"):
        precision.with_policy(loaded, "bf16")
    again = precision.with_policy(fast, "float32")
    np.testing.assert_allclose(np.asarray(again.predict_on_batch(x)), expected, atol=1e-6)


def test_predict_refuses_float16_on_jax_cpu_in_one_line(tiny_checkpoint):
    """``--mixed-precision float16`` where it cannot run (JAX on a CPU) is the command's one-line error, not a
    traceback or a complaint about the weights; elsewhere it builds a ``mixed_float16`` model."""
    from keras_vit.cli import CommandError
    from keras_vit.predict import _build_model

    if keras.backend.backend() == "jax":
        with pytest.raises(CommandError, match=r"^mixed precision float16 does not run on JAX's CPU"):
            _build_model(tiny_checkpoint, "float16")
    else:
        assert _build_model(tiny_checkpoint, "float16").get_layer("encoderblock_0").compute_dtype == "float16"


def test_with_policy_of_a_lora_model_merges_its_adapters():
    """A LoRA-adapted model (adapters made non-zero) copied by ``with_policy``: no adapters left, the adapted model's
    outputs in float32 (round-off) and within the bfloat16 tolerance in bfloat16."""
    x = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    model = keras_vit.ViT("Ti/16", image_size=32, depth=2, num_classes=5)
    head = model.get_layer("head")
    head.kernel.assign(np.random.default_rng(1).normal(0, 0.1, head.kernel.shape))
    base = keras.ops.convert_to_numpy(model(x))  # eager calls: predict_on_batch keeps the function it traced first
    keras_vit.enable_lora(model, 4)
    for layer in keras_vit.lora.lora_layers(model):
        layer.lora_kernel_b.assign(np.random.default_rng(2).normal(0, 0.05, layer.lora_kernel_b.shape))
    adapted = keras.ops.convert_to_numpy(model(x))
    assert np.abs(adapted - base).max() > 0.01  # the adapters matter
    copies = {policy: precision.with_policy(model, policy) for policy in ("float32", "mixed_bfloat16")}
    assert all(keras_vit.lora_parameter_count(copy) == 0 for copy in copies.values())
    np.testing.assert_allclose(np.asarray(copies["float32"].predict_on_batch(x)), adapted, atol=1e-5)
    assert np.abs(np.asarray(copies["mixed_bfloat16"].predict_on_batch(x), "float32") - adapted).max() < 0.05
