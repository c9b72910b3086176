"""The int8 routes of benchmarks/int8.py that its table recommends are correct on a tiny model (speed: the benchmark).

OpenVINO with NNCF post-training quantisation (``keras_vit.export.export_openvino(quantize="int8")``, the fastest
correct int8 route at batch 8 on the AMX Xeon, docs/performance.md): the patch convolution and dense layers run int8
kernels (the attention's activation matmuls may stay float, as on an AMD Zen 4), and on crops of real photos its
logits keep a cosine similarity >= 0.98 with float32 and the same top-1 class wherever float32's is decided (margin
over the second class at least a tenth of the logits' range). Measured: 0.997 and 16 of 16 agreeing on the AMX Xeon;
0.991 and 13 of 16 on an AMD EPYC Zen 4 without AMX, where the three that differ have margins under 0.1 against int8
errors up to 0.26, and all 7 decided images agree. Calibration and evaluation crops differ (seeds 1 and 0). LiteRT
dynamic-range int8, the other recommended route, is tested in test_export.py.
"""

import importlib.util
import os
import sys

import numpy as np
import pytest
from npz_layout import vit_checkpoint

import keras_vit
from keras_vit import export

pytestmark = pytest.mark.backends("tensorflow")  # the routes export through TensorFlow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def int8():
    spec = importlib.util.spec_from_file_location("benchmarks_int8", os.path.join(REPO, "benchmarks", "int8.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def model():
    """Random weights everywhere, head included; 16 patches of 8 px, so that activations have some spread."""
    arrays = vit_checkpoint(patch=8, width=32, depth=1, heads=2, mlp=64, grid=(4, 4), num_classes=10)
    return keras_vit.model_from_checkpoint(arrays)


def test_quality_is_the_largest_difference_lowest_cosine_and_top1_agreement(int8):
    reference = np.array([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]])
    got = np.array([[1.0, 0.0, 0.0], [0.0, 2.0, 3.0]])  # row 2 turned to (0, 2, 3): cosine 2/sqrt(13)
    diff, cosine, agree = int8.quality(got, reference)
    assert diff == 3.0 and cosine == pytest.approx(2 / np.sqrt(13)) and agree == 0.5
    assert int8.quality(reference, reference) == (0.0, pytest.approx(1.0), 1.0)


@pytest.mark.requires("openvino", "nncf")
def test_openvino_int8_export_runs_int8_kernels_and_agrees_with_float32(int8, model, tmp_path):
    """``export.export_openvino(quantize="int8", calibration=...)``, through the benchmark's route (which reads
    the compiled graph's kernels) and through ``export.load``."""
    calibration, evaluation = export.photo_images(32, 8, seed=1), export.photo_images(32, 16, seed=0)
    call, size, kernels = int8.openvino_route(int8.Bench(model, None, 32, str(tmp_path), calibration), mode="int8")
    got = call(evaluation)
    reference = model.predict_on_batch(evaluation)
    diff, cosine, _ = int8.quality(got, reference)
    assert got.shape == (16, 10) and 0 < diff < 0.5 and cosine >= 0.98
    top2 = np.sort(reference, axis=-1)[:, -2:]
    decided = top2[:, 1] - top2[:, 0] >= 0.1 * np.ptp(reference, axis=-1)
    assert decided.sum() >= 4, "too few decided images to compare"
    np.testing.assert_array_equal(got[decided].argmax(-1), reference[decided].argmax(-1))
    matmuls = kernels().split("kernels: ")[1]  # what the compiled graph ran at the call above
    weighted = [kind for kind in matmuls.split(", ") if "FullyConnected" in kind or "Convolution" in kind]
    assert weighted and all("i8" in kind.lower() for kind in weighted), matmuls  # the attention's matmuls may not be
    assert size < 0.5 * sum(w.nbytes for w in model.get_weights()) / 1e6 + 0.1  # int8 weights (+ the graph)
    folder = tmp_path / "openvino-int8"
    assert sorted(os.listdir(folder)) == ["model.bin", "model.xml"]
    np.testing.assert_allclose(export.load(folder)(evaluation), got, atol=1e-2 * np.abs(got).max())


@pytest.mark.requires("openvino")
def test_openvino_int8_needs_calibration_images_and_writes_nothing_without(model, tmp_path):
    for calibration in (None, np.zeros((0, 32, 32, 3), "float32")):
        with pytest.raises(ValueError, match="needs calibration images"):
            export.export_openvino(model, tmp_path / "int8", quantize="int8", calibration=calibration)
    with pytest.raises(ValueError, match="quantize"):
        export.export_openvino(model, tmp_path / "int8", quantize="int4")
    assert os.listdir(tmp_path) == []
