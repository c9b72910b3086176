"""keras_vit on Keras' OpenVINO backend (``KERAS_BACKEND=openvino``, inference only) and its OpenVINO export.

Every kind of ViT the library builds is saved as ``.keras`` here (TensorFlow) and run in a process on the OpenVINO
backend on crops of real photos: its logits must match TensorFlow's float32 ones within bfloat16 rounding (OpenVINO
computes in bfloat16 on CPUs with bfloat16 units: ``keras_vit.precision.openvino_precision``, checked against the
runtime's own choice) and give the same top-1 class; ``keras_vit.predict`` on that backend names the same classes.
"""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import export
from keras_vit.preprocessing import ImagePreprocessor

pytestmark = [pytest.mark.backends("tensorflow"), pytest.mark.requires("openvino")]

SHAPE = dict(hidden_size=32, depth=2, num_heads=2, mlp_dim=64, image_size=32, patch_size=8, num_classes=5)
# name: (variant, options): each of the library's building blocks at least once.
CASES = {
    "vit": ("Ti/16", {}),
    "gelu_exact_avg_features": ("Ti/16", dict(gelu="exact", pooling="avg", include_top=False)),
    "hybrid": ("Ti/16", dict(image_size=64, patch_size=2, resnet={"num_layers": (1,), "width": 32})),
    "deit_distilled": ("DeiT-Ti/16-Distilled", {}),
    "dinov2_registers": ("DINOv2-S/14-Reg4", {}),
    "dinov2_swiglu": ("DINOv2-G/14", dict(mlp_dim=64)),
    "clip_qk_norm": ("CLIP-B/16", dict(qk_norm=True)),
    "siglip_map_head": ("SigLIP-B/16", {}),
    "preprocessing_inside": ("Ti/16", dict(include_preprocessing=True)),
}
# bfloat16 keeps 8 significant bits: logits of order 0.1-1 within 1% of the largest.
RELATIVE_TOLERANCE = 1e-2
RUN_ON_OPENVINO = """
import json, sys
import numpy as np, keras
from keras_vit.precision import openvino_precision
folder, names = sys.argv[1], sys.argv[2:]
report = {"backend": keras.backend.backend(), "policy": keras.mixed_precision.dtype_policy().name, "precision": {}}
for name in names:
    model = keras.saving.load_model(f"{folder}/{name}.keras")
    np.save(f"{folder}/{name}_openvino.npy", np.asarray(model.predict_on_batch(np.load(f"{folder}/{name}_x.npy"))))
    report["precision"][name] = model.ov_compiled_model.get_property("INFERENCE_PRECISION_HINT").to_string()
report["rule"] = openvino_precision()
print(json.dumps(report))
"""


def openvino_env() -> dict:
    return dict(os.environ, KERAS_BACKEND="openvino", TF_CPP_MIN_LOG_LEVEL="3")


def randomised(variant: str, **options) -> keras.Model:
    model = keras_vit.ViT(variant, **dict(SHAPE, **options))
    rng = np.random.default_rng(2)
    for variable in model.weights:
        variable.assign(rng.normal(0, 0.1, variable.shape))
    return model


def photo_batch(model: keras.Model, count: int = 6) -> np.ndarray:
    """Crops of real photos as the model takes them: [-1, 1] at its size, or uint8-range 80x96 with preprocessing."""
    if model.config.include_preprocessing:  # the model resizes and scales itself
        preprocess = ImagePreprocessor((80, 96), mean=0.0, std=1 / 255)
    else:
        preprocess = ImagePreprocessor(model.input_shape[1:3])
    return np.stack([np.asarray(preprocess(crop)) for crop in export.photo_crops(count)])


def test_every_kind_of_vit_runs_on_the_openvino_backend(tmp_path):
    expected = {}
    for name, (variant, options) in CASES.items():
        model = randomised(variant, **options)
        images = photo_batch(model)
        np.save(tmp_path / f"{name}_x.npy", images)
        expected[name] = np.asarray(model.predict_on_batch(images))
        model.save(tmp_path / f"{name}.keras")
    done = subprocess.run(
        [sys.executable, "-c", RUN_ON_OPENVINO, str(tmp_path), *CASES],
        capture_output=True,
        text=True,
        env=openvino_env(),
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert (report["backend"], report["policy"]) == ("openvino", "float32")
    assert set(report["precision"].values()) == {report["rule"]}  # the runtime's choice is keras_vit's rule
    for name, want in expected.items():
        got = np.load(tmp_path / f"{name}_openvino.npy")
        assert got.shape == want.shape, name
        scale = np.abs(want).max()
        assert scale > 0.01 and np.abs(got - want).max() <= RELATIVE_TOLERANCE * scale, name
        if name != "gelu_exact_avg_features":
            np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1), err_msg=name)


def test_predict_on_the_openvino_backend_names_the_same_classes(tmp_path):
    from PIL import Image

    model = randomised("Ti/16", class_names=("ant", "bee", "cat", "dog", "eel"))
    model.save(tmp_path / "model.keras")
    (tmp_path / "photos").mkdir()
    for i, crop in enumerate(export.photo_crops(4, seed=3)):
        Image.fromarray(crop).save(tmp_path / "photos" / f"{i}.png")
    command = [sys.executable, "-m", "keras_vit.predict", str(tmp_path / "photos"), "--weights"]
    command += [str(tmp_path / "model.keras"), "--top", "2", "--json", "--mixed-precision", "none"]
    tops = []
    for env in (dict(os.environ), openvino_env()):
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        tops.append([[p["name"] for p in row["predictions"]] for row in json.loads(done.stdout)])
    assert len(tops[0]) == 4 and tops[0] == tops[1]


def test_export_to_openvino_runs_in_float32_exactly_and_in_bfloat16_closely(tmp_path):
    model = randomised("Ti/16")
    images = photo_batch(model, 16)
    path = export.export_openvino(model, tmp_path / "vit_openvino")
    assert sorted(os.listdir(path)) == ["model.bin", "model.xml"]
    expected = np.asarray(model.predict_on_batch(images))
    np.testing.assert_allclose(export.load(path, precision="f32")(images), expected, atol=1e-5)
    np.testing.assert_allclose(export.load(path / "model.xml", precision="f32")(images[:1]), expected[:1], atol=1e-5)
    fast = export.load(path)(images)  # the CPU's precision: bfloat16 here on an AMX / AVX512_BF16 machine
    assert np.abs(fast - expected).max() <= RELATIVE_TOLERANCE * np.abs(expected).max()
    assert np.mean(fast.argmax(-1) == expected.argmax(-1)) >= 0.9
    with pytest.raises(ValueError, match="OpenVINO precision"):
        export.load(path, precision="int4")
    with pytest.raises(ValueError, match="vit_openvino exists"):
        export.export_openvino(model, path)


def test_training_on_the_openvino_backend_is_refused_in_one_line_before_anything_is_written(tmp_path):
    run = tmp_path / "run"
    command = [sys.executable, "-m", "keras_vit.training.finetune", "--output-dir", str(run), "--steps", "2"]
    done = subprocess.run(command, capture_output=True, text=True, env=openvino_env(), timeout=300, check=False)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith("error: Keras' openvino backend runs inference only")
    assert "Traceback" not in done.stderr and not run.exists()
