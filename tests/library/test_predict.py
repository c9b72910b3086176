"""`python -m keras_vit.predict` on a tiny checkpoint in the published .npz layout whose head fixes the ranking."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from npz_layout import vit_checkpoint, write_checkpoint
from PIL import Image
from sklearn.datasets import load_sample_image

from keras_vit.predict import main

pytestmark = pytest.mark.backends("tensorflow")  # the default backend only: backend-independent or slow

# A zero head kernel makes the logits equal the bias, whatever the image: goldfish (1), tench (0),
# great white shark (2), then the rest (0.0, in index order).
BIAS = {1: 3.0, 0: 2.0, 2: 1.0}
EXPECTED = ["goldfish", "tench", "great_white_shark", "tiger_shark", "hammerhead"]  # keras.applications' spelling


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    arrays = vit_checkpoint(patch=16, width=32, depth=1, heads=2, mlp=64, grid=(2, 2), num_classes=1000)
    arrays["head/kernel"] = np.zeros_like(arrays["head/kernel"])
    arrays["head/bias"] = np.zeros_like(arrays["head/bias"])
    for index, value in BIAS.items():
        arrays["head/bias"][index] = value
    return str(write_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny_in1k.npz", arrays))


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    folder = tmp_path_factory.mktemp("images")
    china, flower = folder / "china.jpg", folder / "flower.png"
    Image.fromarray(load_sample_image("china.jpg")).save(china)
    Image.fromarray(load_sample_image("flower.jpg")[100:300, 50:400]).save(flower)
    return [str(china), str(flower)]


def softmax_of_bias():
    logits = np.zeros(1000)
    for index, value in BIAS.items():
        logits[index] = value
    probs = np.exp(logits) / np.exp(logits).sum()
    return [probs[1], probs[0], probs[2], probs[3], probs[4]]


def test_table(checkpoint, images, capsys):
    assert main([*images, "--weights", checkpoint, "--top", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 * 5
    for block in (lines[:5], lines[5:]):
        assert block[0] in images
        assert block[1].split() == ["rank", "class", "id", "name", "softmax"]
        assert [line.split()[1] for line in block[2:]] == ["n01443537", "n01440764", "n01484850"]
        for line, name, score in zip(block[2:], EXPECTED, softmax_of_bias()):
            assert name in line and f"{score:.4f}" in line


def test_json(checkpoint, images, capsys):
    assert main([images[1], "--weights", checkpoint, "--json"]) == 0
    (result,) = json.loads(capsys.readouterr().out)
    assert result["image"] == images[1]
    assert [p["name"] for p in result["predictions"]] == EXPECTED
    np.testing.assert_allclose([p["score"] for p in result["predictions"]], softmax_of_bias(), rtol=1e-5)
    assert main([images[0], "--weights", checkpoint, "--json", "--scores", "logits", "--top", "2"]) == 0
    (result,) = json.loads(capsys.readouterr().out)
    assert [(p["wnid"], p["score"]) for p in result["predictions"]] == [("n01443537", 3.0), ("n01440764", 2.0)]


@pytest.mark.parametrize("case", ["missing_image", "not_an_image", "unknown_weights", "missing_weights"])
def test_errors_are_one_line(checkpoint, images, tmp_path, capsys, case):
    text = tmp_path / "notes.jpg"
    text.write_text("not a picture")
    argv = {
        "missing_image": [str(tmp_path / "nope.jpg"), "--weights", checkpoint],
        "not_an_image": [str(text), "--weights", checkpoint],
        "unknown_weights": [images[0], "--weights", "B_16.no_such_checkpoint"],
        "missing_weights": [images[0], "--weights", str(tmp_path / "missing.npz")],
    }[case]
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1 and captured.err.startswith("error: ")


def test_module_entry_point(tmp_path):
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"}
    run = subprocess.run(
        [sys.executable, "-m", "keras_vit.predict", str(tmp_path / "nope.jpg"), "--weights", "x"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert run.returncode == 1
    assert run.stderr.strip().splitlines()[-1] == f"error: {tmp_path / 'nope.jpg'}: no such file"


def test_a_catalogue_checkpoint_is_preprocessed_as_it_was_evaluated():
    """classify(weights=NAME) crops and resizes as the catalogue records (here timm's crop_pct 0.9, bicubic)."""
    import keras_vit
    from keras_vit.predict import classify
    from keras_vit.preprocessing import ImagePreprocessor

    arrays = vit_checkpoint(patch=16, width=32, depth=1, heads=2, mlp=64, grid=(2, 2), num_classes=1000)
    model = keras_vit.model_from_checkpoint(arrays)
    photo = load_sample_image("china.jpg")
    name = "Ti_16.augreg_in21k_ft_in1k_224"
    (ours,) = classify(model, [photo], top=3, scores="logits", weights=name)
    evaluated = ImagePreprocessor.from_weights(name, image_size=32)(photo)[None]
    logits = np.asarray(model.predict_on_batch(evaluated))[0]
    assert [score for _, _, score in ours] == pytest.approx(sorted(logits)[::-1][:3], rel=1e-5)
    (whole,) = classify(model, [photo], top=3, scores="logits")  # no checkpoint named: the whole image, bilinear
    assert [s for _, _, s in whole] != pytest.approx([s for _, _, s in ours], rel=1e-3)
    channels_first = keras_vit.model_from_checkpoint(arrays, data_format="channels_first")
    (again,) = classify(channels_first, [photo], top=3, scores="logits", weights=name)  # (H, W, 3) photos still
    assert [s for _, _, s in again] == pytest.approx([s for _, _, s in ours], rel=1e-5)
