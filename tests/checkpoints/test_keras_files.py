"""A saved keras-vit model (``.keras``) as ``weights=`` / ``--weights`` everywhere, with its architecture and class
names; ``predict`` on folders and with label files. Tiny models (32 pixels, width 32, one or two blocks)."""

import json
import re

import keras
import numpy as np
import pytest
from PIL import Image

import keras_vit
from keras_vit.labels import decode_predictions, read_label_file

pytestmark = pytest.mark.backend_independent  # files, names and checks: the same on every backend

TINY = dict(image_size=32, patch_size=16, hidden_size=32, depth=2, num_heads=2, mlp_dim=64)
NAMES = ("cat", "dog", "emu")


def _randomised(model: keras.Model, seed: int = 0) -> keras.Model:
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        variable.assign(rng.normal(0, 0.2, variable.shape))
    return model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A trained-looking model saved as .keras, with class names and a non-default structure."""
    model = _randomised(
        keras_vit.ViT(None, num_classes=3, class_names=NAMES, position_embedding="learned_2d", gelu="exact", **TINY)
    )
    path = tmp_path_factory.mktemp("saved") / "model.keras"
    model.save(path)
    return model, str(path)


@pytest.fixture(scope="module")
def images():
    return np.random.default_rng(1).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")


def test_vit_reads_the_architecture_options_and_class_names_from_the_file(saved, images):
    model, path = saved
    for loaded in (keras_vit.ViT(weights=path), keras_vit.model_from_checkpoint(path)):
        assert loaded.config.architecture == model.config.architecture
        assert (loaded.config.position_embedding, loaded.config.gelu) == ("learned_2d", "exact")
        assert loaded.config.class_names == NAMES
        np.testing.assert_array_equal(loaded.predict(images, verbose=0), model.predict(images, verbose=0))
    # a new head drops the names; features take the encoder; a 2-D position embedding is not resized: refused
    other = keras_vit.ViT(weights=path, num_classes=5)  # a head asked to replace: no warning
    assert other.output_shape == (None, 5) and other.config.class_names is None
    features = keras_vit.ViT(weights=path, include_top=False, pooling="token")
    assert features.output_shape == (None, 32)
    np.testing.assert_array_equal(features.get_layer("posembed_input").row_embedding, model.weights[3])
    with pytest.raises(ValueError, match=r"row_embedding \(2, 16\): the model's is \(3, 16\)"):
        keras_vit.ViT(weights=path, image_size=48)


def test_a_saved_published_layout_model_is_resized(tmp_path, images):
    model = _randomised(keras_vit.ViT(None, num_classes=3, class_names=NAMES, **TINY))
    model.save(tmp_path / "model.keras")
    resized = keras_vit.ViT(weights=str(tmp_path / "model.keras"), image_size=48)
    assert resized.get_layer("posembed_input").pos_embedding.shape == (1, 10, 32)
    assert resized.config.class_names == NAMES
    np.testing.assert_array_equal(resized.get_layer("head").kernel, model.get_layer("head").kernel)


def test_an_architecture_that_differs_from_the_file_is_refused_naming_it(saved):
    _, path = saved
    with pytest.raises(ValueError, match=r"hidden_size 192 \(the file's: 32\), depth 12 \(the file's: 2\)"):
        keras_vit.ViT_Ti16(weights=path)
    with pytest.raises(ValueError, match=r"depth 1 \(the file's: 2\)"):
        keras_vit.ViT(weights=path, depth=1)
    with pytest.raises(ValueError, match=r"position_embedding 'sincos_2d' \(the file's: 'learned_2d'\)"):
        keras_vit.ViT(weights=path, position_embedding="sincos_2d")


def test_a_plain_model_made_of_keras_vit_layers_reads_from_its_shapes(images, tmp_path):
    model = _randomised(keras_vit.ViT(None, num_classes=3, gelu="exact", **TINY))
    plain = keras.Model(model.inputs, model.outputs, name="mine")  # not a VisionTransformer: no config in the file
    plain.save(tmp_path / "mine.keras")
    loaded = keras_vit.model_from_checkpoint(tmp_path / "mine.keras")
    assert loaded.config.architecture == model.config.architecture and loaded.config.gelu == "exact"
    np.testing.assert_array_equal(loaded.predict(images, verbose=0), model.predict(images, verbose=0))
    other = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    other.save(tmp_path / "other.keras")
    with pytest.raises(ValueError, match=r"other.keras is a saved Keras model .* without keras-vit layers"):
        keras_vit.ViT(weights=str(tmp_path / "other.keras"))


def test_decode_predictions_and_label_files(saved, tmp_path):
    scores = np.array([[0.1, 0.7, 0.2]])
    assert decode_predictions(scores, top=2, labels=NAMES) == [[("1", "dog", 0.7), ("2", "emu", 0.2)]]
    (tmp_path / "classes.txt").write_text("cat\n\ndog\nemu\n")
    assert read_label_file(tmp_path / "classes.txt") == NAMES
    (tmp_path / "twice.txt").write_text("cat\ncat\n")
    with pytest.raises(ValueError, match=r"twice.txt must be distinct; repeated: \['cat'\]"):
        read_label_file(tmp_path / "twice.txt")
    with pytest.raises(ValueError, match=r"the class names \(cat, dog, emu, ...\) has 3 classes but the scores have 2"):
        decode_predictions(np.zeros((1, 2)), labels=NAMES)


def _photos(folder, count: int = 3) -> list[str]:
    (folder / "sub").mkdir(parents=True)
    paths = [folder / "a.png", folder / "sub" / "b.jpg", folder / "sub" / "c.png"][:count]
    for i, path in enumerate(paths):
        Image.fromarray(np.full((40, 50, 3), 60 * i, np.uint8)).save(path)
    (folder / ".hidden.png").write_bytes(b"not looked at")
    (folder / "notes.txt").write_text("not an image")
    return [str(path) for path in paths]


def test_predict_a_folder_with_the_model_s_class_names_or_a_label_file(saved, tmp_path, capsys):
    from keras_vit.predict import main

    model, path = saved
    photos = _photos(tmp_path / "photos")
    assert main([str(tmp_path / "photos"), "--weights", path, "--json", "--mixed-precision", "none"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert [r["image"] for r in results] == sorted(photos)  # every image of the folder and its sub-folders
    pixels = [keras_vit.preprocess_input(np.asarray(Image.open(p).convert("RGB").resize((32, 32)))) for p in photos]
    expected = keras.ops.softmax(model.predict(np.stack(pixels), verbose=0)).numpy()
    for result, probabilities in zip(results, expected):
        best = int(np.argmax(probabilities))
        assert result["predictions"][0]["name"] == NAMES[best] and len(result["predictions"]) == 3
        np.testing.assert_allclose(result["predictions"][0]["score"], probabilities[best], atol=0.02)
    (tmp_path / "labels.txt").write_text("one\ntwo\nthree\n")
    assert main([photos[0], "--weights", path, "--labels", str(tmp_path / "labels.txt"), "--top", "1"]) == 0
    assert re.search(r"^\s+1\s+\d\s+(one|two|three)\s+0\.\d{4}$", capsys.readouterr().out, flags=re.M)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit):
        main([str(tmp_path / "empty"), "--weights", path])
    assert (
        capsys.readouterr().err
        == f"error: {tmp_path / 'empty'}: a folder without image files (.jpg, .jpeg, .png, .bmp, .gif, .webp).\n"
    )


def test_analysis_export_and_zoo_convert_take_a_saved_model(saved, tmp_path, capsys):
    from keras_vit.analysis.__main__ import main as analysis
    from keras_vit.zoo.__main__ import main as zoo

    model, path = saved
    out = tmp_path / "figures"
    assert analysis(["--weights", path, "--analyses", "position", "--output-dir", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["image_size"] == [32, 32] and (out / "position_similarity.png").is_file()
    with pytest.raises(SystemExit):  # a variant that is not the file's
        analysis(["B/16", "--weights", path, "--analyses", "position", "--output-dir", str(tmp_path / "no")])
    assert "depth 12 (the file's: 2)" in capsys.readouterr().err
    zoo(["convert", path, str(tmp_path / "copy.weights.h5")])
    copy = keras_vit.ViT(None, num_classes=3, position_embedding="learned_2d", gelu="exact", **TINY)
    copy.load_weights(tmp_path / "copy.weights.h5")
    for ours, theirs in zip(copy.weights, model.weights):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
