"""The analysis figures (valid PNGs of the expected size), the input loaders and the command end to end."""

import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text
from PIL import Image
from staging_support import killed_staging

from keras_vit import datasets, zoo
from keras_vit.analysis import data, filter_components, plots
from keras_vit.analysis.__main__ import STAGING, main, model_input
from keras_vit.images import read_image
from keras_vit.preprocessing import ImagePreprocessor

pytestmark = pytest.mark.backends("tensorflow")  # the default backend only: backend-independent or slow

TINY_ARCHITECTURE = ["--patch-size", "8", "--hidden-size", "32", "--depth", "2", "--num-heads", "2", "--mlp-dim", "64"]
TINY_ARGS = ["Ti/16", "--image-size", "32", *TINY_ARCHITECTURE]
DEFAULT_SIZES = {  # figsize (inches) * dpi 100
    "attention_maps.png": (500, 500),
    "attention_distance.png": (500, 400),
    "position_similarity.png": (600, 500),
    "embedding_filters.png": (600, 400),
    "few_shot.png": (500, 400),
}


def assert_png(path, size):
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        assert image.format == "PNG"
        assert image.size == size
        pixels = np.asarray(image.convert("RGB"))
    assert pixels.std() > 0  # something was drawn


def test_mosaic_lays_tiles_out_in_rows_with_padding():
    tiles = np.arange(5 * 2 * 3, dtype=float).reshape(5, 2, 3)
    canvas = plots.mosaic(tiles, columns=2, pad=1, fill=-1)
    assert canvas.shape == (3 * 3 - 1, 2 * 4 - 1)
    np.testing.assert_array_equal(canvas[0:2, 4:7], tiles[1])
    np.testing.assert_array_equal(canvas[6:8, 0:3], tiles[4])
    np.testing.assert_array_equal(canvas[6:8, 4:7], -1)


@pytest.mark.parametrize(
    "draw, figsize, dpi",
    [
        (
            lambda p, **k: plots.plot_attention_maps(np.random.rand(3, 8, 8, 3), np.random.rand(3, 8, 8, 3), p, **k),
            (6, 4),
            50,
        ),
        (lambda p, **k: plots.plot_attention_distance(np.random.rand(4, 3) * 20, p, **k), (4, 3), 80),
        (lambda p, **k: plots.plot_position_similarity(np.random.uniform(-1, 1, (3, 4, 3, 4)), p, **k), (5, 4), 60),
        (
            lambda p, **k: plots.plot_filter_components(np.random.rand(6, 4, 4, 3), p, explained=np.full(6, 0.1), **k),
            (3, 2),
            100,
        ),
        (
            lambda p, **k: plots.plot_few_shot({1: np.array([0.2, 0.3]), 5: np.array([0.6, 0.7])}, p, chance=0.1, **k),
            (4, 3),
            70,
        ),
    ],
    ids=["attention_maps", "attention_distance", "position_similarity", "filter_components", "few_shot"],
)
def test_figures_are_valid_pngs_of_figsize_times_dpi(tmp_path, draw, figsize, dpi):
    path = str(tmp_path / "sub" / "figure.png")
    assert isinstance(draw(path, figsize=figsize, dpi=dpi), Figure)
    assert_png(path, (figsize[0] * dpi, figsize[1] * dpi))


MODEL = "Tiny/8 (tiny.npz)"
FIGURES = {  # draw(path) with the model named -> (words of the title, the label of its colour bar or None)
    "attention_maps": (
        lambda p: plots.plot_attention_maps(
            np.random.rand(3, 8, 8, 3), np.random.rand(3, 8, 8, 3), p, names=["cat.jpg", "dog.png", "7"], model=MODEL
        ),
        ["Attention rollout"],
        "Attention rollout (peak 1) x image",
    ),
    "attention_distance": (
        lambda p: plots.plot_attention_distance(np.random.rand(12, 16) * 20, p, names=["a.jpg", "b.jpg"], model=MODEL),
        ["Mean attention distance", "a.jpg, b.jpg"],
        "Head",
    ),
    "position_similarity": (
        lambda p: plots.plot_position_similarity(np.random.uniform(-1, 1, (14, 14, 14, 14)), p, model=MODEL),
        ["Position-embedding similarity"],
        "Cosine similarity",
    ),
    "filter_components": (
        lambda p: plots.plot_filter_components(
            np.random.rand(28, 4, 4, 3), p, explained=np.full(28, 0.01), model=MODEL
        ),
        ["28 principal components"],
        None,
    ),
    "few_shot": (
        lambda p: plots.plot_few_shot(
            {1: np.random.rand(3), 5: np.random.rand(3)}, p, chance=0.1, dataset="digits", model=MODEL
        ),
        ["Few-shot", "digits, 3 seeds"],
        None,
    ),
}


def colour_bar_labels(fig) -> list[str]:
    """The labels of ``fig``'s colour bars (matplotlib names their axes ``<colorbar>``), on their long side."""
    bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    return [ax.get_xlabel() if ax.get_position().width > ax.get_position().height else ax.get_ylabel() for ax in bars]


@pytest.mark.parametrize("name", FIGURES)
def test_figures_name_what_they_show_have_colour_bars_and_legible_unclipped_text(tmp_path, name):
    """The title names what is shown, the model and inputs; colour that carries a value has a labelled colour bar;
    every text (ticks, legends, labels, titles) is at least 8 points and inside the figure at the default 100 dpi."""
    draw, words, bar = FIGURES[name]
    fig = draw(str(tmp_path / "figure.png"))
    title = fig.get_suptitle()
    assert all(word in title for word in [*words, MODEL]), title
    assert colour_bar_labels(fig) == ([bar] if bar else [])
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text()]
    assert len(texts) > 3
    assert min(t.get_fontsize() for t in texts) >= 8
    assert max(t.get_fontsize() for t in texts) == max(t.get_fontsize() for t in texts if t.get_text() == title)
    canvas = FigureCanvasAgg(fig)  # pyplot closed the figure: draw it again, at 100 dpi
    canvas.draw()
    drawn = fig.get_tightbbox(canvas.get_renderer())  # inches, around everything drawn
    assert drawn.x0 >= 0 and drawn.y0 >= 0, drawn
    assert drawn.x1 <= fig.get_figwidth() and drawn.y1 <= fig.get_figheight(), drawn
    if name == "attention_maps":
        assert [ax.get_title() for ax in fig.axes if ax.get_title()] == ["cat.jpg", "dog.png", "7"]


def test_the_attention_figures_name_their_images_by_default_and_by_count(tmp_path):
    fig = plots.plot_attention_maps(np.random.rand(2, 8, 8, 3), np.random.rand(2, 8, 8, 3), str(tmp_path / "a.png"))
    assert fig.get_suptitle() == "Attention rollout"
    assert [ax.get_title() for ax in fig.axes if ax.get_title()] == ["image 1", "image 2"]
    fig = plots.plot_attention_distance(np.random.rand(2, 3), str(tmp_path / "d.png"), names=list("abcde"))
    assert fig.get_suptitle() == "Mean attention distance\n5 images"


def test_plots_reject_bad_arrays(tmp_path):
    with pytest.raises(ValueError, match="as many overlays as images"):
        plots.plot_attention_maps(np.zeros((2, 4, 4, 3)), np.zeros((1, 4, 4, 3)), str(tmp_path / "a.png"))
    with pytest.raises(ValueError, match="a name for each, got 2 images, 2 overlays and 1 names"):
        plots.plot_attention_maps(np.zeros((2, 4, 4, 3)), np.zeros((2, 4, 4, 3)), str(tmp_path / "a.png"), names=["x"])
    with pytest.raises(ValueError, match="RGB"):
        plots.plot_filter_components(np.zeros((2, 4, 4)), str(tmp_path / "b.png"))
    assert not os.listdir(tmp_path)


def test_resize_images_centre_crops_and_makes_grey_rgb():
    wide = np.zeros((10, 30, 3), np.uint8)
    wide[:, 10:20] = 255  # the centre square is white, the sides black
    grey = np.full((8, 8), 100, np.uint8)
    out = data.resize_images([wide, grey], 6)
    assert out.shape == (2, 6, 6, 3) and out.dtype == np.uint8
    assert out[0].min() == 255 and np.all(out[1] == 100)
    assert data.resize_images([wide], (4, 12)).shape == (1, 4, 12, 3)
    scaled = model_input([np.array([[0, 255], [255, 0]], np.uint8)], (2, 2))
    assert isinstance(scaled, np.ndarray) and scaled.dtype == np.float32 and scaled.shape == (1, 2, 2, 3)
    np.testing.assert_allclose(scaled[0, :, :, 0], [[-1.0, 1.0], [1.0, -1.0]])


def test_the_model_input_of_a_catalogue_checkpoint_is_its_evaluations_preprocessing():
    """CLIP's mean and std and timm's crop, as predict applies them, not [-1, 1] of the whole image."""
    photo = data.sample_image()
    entry = zoo.get("CLIP_B_16.openai")
    expected = ImagePreprocessor.from_weights(entry.name, image_size=32)(photo)
    got = model_input([photo], (32, 32), entry.name)
    np.testing.assert_allclose(got[0], keras.ops.convert_to_numpy(expected), atol=1e-6)
    plain = model_input([photo], (32, 32))
    assert np.abs(got - plain).max() > 0.1  # another mean/std and crop: visibly other inputs
    assert got.min() < -1.0 <= plain.min()  # CLIP's std of 0.27 reaches below [-1, 1]


def test_datasets_load_from_scikit_learn_npz_and_tfds(tmp_path):
    digits = data.load_fewshot_dataset("digits")
    assert digits.images.shape == (1797, 8, 8) and digits.images.max() == 255 and digits.test_images is None
    assert set(digits.labels) == set(range(10))
    images, labels = datasets.load_digits()
    assert np.array_equal(digits.images, images) and np.array_equal(digits.labels, labels)
    path = str(tmp_path / "set.npz")
    np.savez(path, images=np.zeros((4, 5, 5, 3), np.uint8), labels=[0, 1, 0, 1])
    assert data.load_fewshot_dataset(path).images.shape == (4, 5, 5, 3)
    np.savez(str(tmp_path / "bad.npz"), x=np.zeros(3))
    with pytest.raises(ValueError, match=r"lacks the arrays \['images', 'labels'\]"):
        data.load_fewshot_dataset(str(tmp_path / "bad.npz"))
    flipped = bytearray(Path(path).read_bytes())
    flipped[flipped.index(b"PK\x01\x02") + 6] ^= 0x80  # zipfile's NotImplementedError ("zip file version 14.8")
    Path(path).write_bytes(flipped)
    with pytest.raises(ValueError, match=r"set\.npz is not a readable \.npz dataset \(NotImplementedError: zip file"):
        data.load_fewshot_dataset(path)
    with pytest.raises(ValueError, match="Unknown few-shot dataset"):
        data.load_fewshot_dataset("imagenet")
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=6):
        mocked = data.load_fewshot_dataset("tfds:mnist")
    assert mocked.images.shape == (6, 28, 28, 1) and mocked.test_labels.shape == (6,)
    assert data.sample_image("flower.jpg").shape == (427, 640, 3)
    with pytest.raises(ValueError, match=r"Unknown sample image 'cat\.jpg'"):
        data.sample_image("cat.jpg")


def drawn_figures(monkeypatch) -> dict:
    """The Figure each ``plots.plot_*`` the command calls returns, by function name, in the dict this returns."""
    figures = {}

    def keeping(name, draw):
        def drawing(*args, **kwargs):
            figures[name] = draw(*args, **kwargs)
            return figures[name]

        return drawing

    for name in plots.__all__:
        if name.startswith("plot_"):
            monkeypatch.setattr(plots, name, keeping(name, getattr(plots, name)))
    return figures


def test_command_end_to_end_on_a_tiny_model(tmp_path, capsys, monkeypatch):
    photo = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 60, 3), dtype=np.uint8)).save(photo)
    (tmp_path / "second.png").write_bytes(photo.read_bytes())
    out = tmp_path / "figures"
    figures = drawn_figures(monkeypatch)
    argv = [
        *TINY_ARGS,
        "--images",
        str(photo),
        str(tmp_path / "second.png"),
        "--shots",
        "1",
        "5",
        "--seeds",
        "2",
        "--pool-per-class",
        "10",
        "--test-examples",
        "100",
        "--output-dir",
        str(out),
    ]
    assert main(argv) == 0
    for name, size in DEFAULT_SIZES.items():
        assert_png(out / name, size)
    results = json.loads((out / "results.json").read_text())
    assert np.shape(results["mean_attention_distance"]) == (2, 2)
    assert sorted(results["few_shot"]) == ["1", "5"] and len(results["few_shot"]["5"]["per_seed"]) == 2
    assert all(0 <= r["mean"] <= 1 for r in results["few_shot"].values())
    assert len(results["filter_variance_explained"]) == 28
    assert str(out / "few_shot.png") in capsys.readouterr().out
    # the figures name the model, the images (file names) and the dataset
    assert len(figures) == 5 and all("Ti/16 (random init)" in f.get_suptitle() for f in figures.values())
    maps = figures["plot_attention_maps"]
    assert [ax.get_title() for ax in maps.axes if ax.get_title()] == ["photo.png", "second.png"]
    assert figures["plot_attention_distance"].get_suptitle().endswith(" on photo.png, second.png")
    assert figures["plot_few_shot"].get_suptitle().endswith(" on digits, 2 seeds")


@pytest.mark.filterwarnings("ignore:.*no classification head:UserWarning")  # include_top=False skips it
def test_command_loads_a_checkpoint_and_analyses_its_weights(tmp_path, monkeypatch):
    from npz_layout import vit_checkpoint, write_checkpoint

    arrays = vit_checkpoint(patch=8, width=32, depth=2, heads=2, mlp=64, grid=(4, 4), num_classes=5)
    path = write_checkpoint(str(tmp_path / "tiny.npz"), arrays)
    out = tmp_path / "out"
    argv = [
        "Ti/16",
        "--weights",
        path,
        *TINY_ARCHITECTURE,
        "--analyses",
        "filters",
        "position",
        "--output-dir",
        str(out),
    ]
    figures = drawn_figures(monkeypatch)
    assert main(argv) == 0
    assert figures["plot_position_similarity"].get_suptitle().endswith("\nTi/16 (tiny.npz)")  # the weights' file
    results = json.loads((out / "results.json").read_text())
    assert results["image_size"] == [32, 32]  # the checkpoint's 4x4 grid of 8-pixel patches
    _, expected = filter_components(arrays["embedding/kernel"], 28)
    np.testing.assert_allclose(results["filter_variance_explained"], expected.round(5), atol=2e-5)
    assert_png(out / "position_similarity.png", DEFAULT_SIZES["position_similarity.png"])


def exit_code(argv) -> int:
    """The command's exit status: what ``main`` returns, or the status it exits with (an error: 1)."""
    try:
        return main(argv)
    except SystemExit as exit_info:
        return exit_info.code


def test_command_rejects_bad_input(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*TINY_ARGS, "--shots", "60", "--output-dir", str(tmp_path)])
    assert exit_info.value.code == 2 and "--pool-per-class (50)" in capsys.readouterr().err
    assert exit_code(["Q/16", "--output-dir", str(tmp_path / "x")]) == 1
    assert "Unknown ViT variant 'Q/16'" in capsys.readouterr().err
    assert main([*TINY_ARGS, "--analyses", "position", "--images", "missing.jpg", "--output-dir", str(tmp_path)]) == 0
    assert (
        exit_code([*TINY_ARGS, "--analyses", "attention", "--images", "missing.jpg", "--output-dir", str(tmp_path)])
        == 1
    )
    assert "missing.jpg: no such file" in capsys.readouterr().err


@pytest.mark.parametrize("variant, heads", [("R50+B/16", 12), ("ViT_R26_S32", 6)])
def test_command_takes_hybrid_variants_in_any_spelling(tmp_path, variant, heads):
    out = tmp_path / "hybrid"
    assert (
        main(
            [
                variant,
                "--image-size",
                "32",
                "--depth",
                "1",
                "--analyses",
                "attention",
                "distance",
                "--output-dir",
                str(out),
            ]
        )
        == 0
    )
    for name in ("attention_maps.png", "attention_distance.png", "results.json"):
        assert (out / name).is_file()
    results = json.loads((out / "results.json").read_text())
    assert results["variant"] == variant and np.shape(results["mean_attention_distance"]) == (1, heads)


def test_command_skips_what_does_not_apply_to_relative_position_embeddings(tmp_path, capsys):
    dataset = tmp_path / "tiny.npz"
    rng = np.random.default_rng(0)
    np.savez(
        dataset,
        images=rng.integers(0, 255, (12, 16, 16, 3), dtype=np.uint8),
        labels=np.arange(12) % 3,
        test_images=rng.integers(0, 255, (6, 16, 16, 3), dtype=np.uint8),
        test_labels=np.arange(6) % 3,
    )
    common = [
        *TINY_ARGS,
        "--position-embedding",
        "relative",
        "--dataset",
        str(dataset),
        "--shots",
        "1",
        "2",
        "--pool-per-class",
        "4",
        "--seeds",
        "1",
    ]
    assert main([*common, "--output-dir", str(tmp_path / "out")]) == 0
    written = sorted(os.listdir(tmp_path / "out"))
    assert written == sorted(set(DEFAULT_SIZES) - {"position_similarity.png"} | {"results.json"})
    assert exit_code([*common, "--analyses", "position", "--output-dir", str(tmp_path / "none")]) == 1
    assert "--analyses position does not apply" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()


@pytest.mark.slow
def test_console_command_runs_in_a_fresh_process(tmp_path):
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "keras_vit.analysis",
            *TINY_ARGS,
            "--analyses",
            "position",
            "filters",
            "--output-dir",
            str(tmp_path),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert_png(tmp_path / "position_similarity.png", DEFAULT_SIZES["position_similarity.png"])
    assert_png(tmp_path / "embedding_filters.png", DEFAULT_SIZES["embedding_filters.png"])


@pytest.mark.filterwarnings("ignore:.*no classification head:UserWarning")
def test_analysis_on_non_finite_weights_exits_non_zero_and_writes_nothing(tmp_path, capsys):
    from npz_layout import vit_checkpoint, write_checkpoint

    arrays = vit_checkpoint(patch=8, width=32, depth=2, heads=2, mlp=64, grid=(4, 4), num_classes=5)
    arrays["Transformer/encoderblock_1/MlpBlock_3/Dense_0/kernel"][0, 0] = np.nan
    path, out = write_checkpoint(tmp_path / "nan.npz", arrays), tmp_path / "out"
    argv = ["Ti/16", "--weights", str(path), *TINY_ARCHITECTURE, "--analyses", "position", "--output-dir", str(out)]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 1 and "nan.npz holds NaN or infinite values in 1 arrays" in err
    assert not out.exists()


def test_results_json_is_strict_json(tmp_path):
    from keras_vit.analysis.__main__ import _write_outputs

    _write_outputs(str(tmp_path), [], {"accuracy": float("nan"), "curve": [1.0, float("inf")]})

    def refuse(constant):
        raise AssertionError(f"non-strict JSON: {constant}")

    text = (tmp_path / "results.json").read_text()
    assert json.loads(text, parse_constant=refuse) == {"accuracy": None, "curve": [1.0, None]}


# --- bad inputs: 16-bit images, unreadable files, options that cannot work together -----------------


def test_a_16_bit_png_is_scaled_to_8_bits_not_saturated(tmp_path):
    """16-bit values v become round(v / 257) (= (v + 128) // 257; 65535 -> 255), the inverse of 8-bit v * 257."""
    wide = np.array([[0, 128, 129, 257, 385, 386], [1000, 32767, 32768, 65279, 65407, 65535]], np.uint16)
    wide = np.concatenate([wide, np.random.default_rng(0).integers(0, 65536, (6, 6), dtype=np.uint16)])
    path = tmp_path / "deep.png"
    Image.fromarray(wide).save(path)
    with Image.open(path) as written:
        assert written.mode == "I;16"  # a real 16-bit PNG
    loaded = read_image(str(path))
    expected = np.round(wide / 257).astype(np.uint8)
    assert loaded.shape == (*wide.shape, 3) and loaded.dtype == np.uint8
    np.testing.assert_array_equal(loaded, np.repeat(expected[..., None], 3, axis=-1))
    assert list(loaded[0, :6, 0]) == [0, 0, 1, 1, 1, 2] and loaded[1, 5, 0] == 255


def _unreadable_files(tmp_path) -> dict[str, str]:
    photo = np.random.default_rng(0).integers(0, 255, (40, 60, 3), dtype=np.uint8)
    files = {}
    for kind, fmt in (("png", "PNG"), ("jpg", "JPEG")):
        whole = tmp_path / f"whole.{kind}"
        Image.fromarray(photo).save(whole, format=fmt)
        cut = tmp_path / f"truncated.{kind}"
        cut.write_bytes(whole.read_bytes()[: len(whole.read_bytes()) // 2])
        files[f"truncated {kind}"] = str(cut)
    text = tmp_path / "notes.png"
    text.write_text("not an image at all\n")
    files["text named .png"] = str(text)
    empty = tmp_path / "empty.jpg"
    empty.write_bytes(b"")
    files["empty .jpg"] = str(empty)
    return files


def test_unreadable_image_files_are_a_clear_error_naming_the_file(tmp_path, capsys):
    for kind, path in _unreadable_files(tmp_path).items():
        with pytest.raises(ValueError, match="Cannot read image file") as error:
            read_image(path)
        assert repr(path) in str(error.value), kind
        out = tmp_path / "out"
        assert exit_code([*TINY_ARGS, "--analyses", "attention", "--images", path, "--output-dir", str(out)]) == 1, kind
        err = capsys.readouterr().err
        assert "Traceback" not in err and err.count("\n") == 1 and path in err, (kind, err)
        assert not out.exists(), kind


@pytest.mark.slow
def test_the_console_command_prints_one_line_for_an_unreadable_image(tmp_path):
    path = _unreadable_files(tmp_path)["text named .png"]
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "keras_vit.analysis",
            *TINY_ARGS,
            "--images",
            path,
            "--output-dir",
            str(tmp_path / "out"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"error: Cannot read image file {path!r}" in done.stderr
    assert not (tmp_path / "out").exists()


def _small_dataset(tmp_path, per_class: int) -> str:
    rng = np.random.default_rng(0)
    path = tmp_path / f"small{per_class}.npz"
    np.savez(
        path,
        images=rng.integers(0, 255, (3 * per_class, 16, 16, 3), dtype=np.uint8),
        labels=np.arange(3 * per_class) % 3,
        test_images=rng.integers(0, 255, (6, 16, 16, 3), dtype=np.uint8),
        test_labels=np.arange(6) % 3,
    )
    return str(path)


@pytest.mark.parametrize(
    "case",
    [
        "filters on a hybrid",
        "position with relative",
        "shots over pool-per-class",
        "missing image",
        "truncated image",
        "dataset too small for shots",
        "missing dataset",
        "unknown variant",
    ],
)
def test_options_that_cannot_work_together_write_nothing(tmp_path, capsys, case):
    out = tmp_path / "figures"
    out.mkdir()
    (out / "mine.txt").write_text("the user's own file")
    (out / "results.json").write_text('{"from": "an earlier run"}')
    bad = _unreadable_files(tmp_path)["truncated png"]
    argv = {
        "filters on a hybrid": ["R26+S/32", "--image-size", "32", "--depth", "1", "--analyses", "filters"],
        "position with relative": [*TINY_ARGS, "--position-embedding", "relative", "--analyses", "position"],
        "shots over pool-per-class": [*TINY_ARGS, "--shots", "1", "60"],
        "missing image": [*TINY_ARGS, "--images", str(tmp_path / "missing.jpg")],
        "truncated image": [*TINY_ARGS, "--images", bad],
        "dataset too small for shots": [
            *TINY_ARGS,
            "--dataset",
            _small_dataset(tmp_path, 3),
            "--shots",
            "1",
            "5",
            "--pool-per-class",
            "10",
        ],
        "missing dataset": [*TINY_ARGS, "--dataset", str(tmp_path / "missing.npz")],
        "unknown variant": ["Q/16"],
    }[case]
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--output-dir", str(out)])
    lines = capsys.readouterr().err.strip().splitlines()
    by_argparse = lines[0].startswith("usage:")  # argparse's own errors: the usage, then one error line
    assert exit_info.value.code == (2 if by_argparse else 1)
    assert "error:" in lines[-1] and (by_argparse or len(lines) == 1), lines
    assert not any("Traceback" in line for line in lines)
    assert sorted(os.listdir(out)) == ["mine.txt", "results.json"]  # nothing new, nothing removed
    assert (out / "mine.txt").read_text() == "the user's own file"
    assert (out / "results.json").read_text() == '{"from": "an earlier run"}'


def test_the_few_shot_check_names_the_class_and_the_shots(tmp_path, capsys):
    argv = [
        *TINY_ARGS,
        "--dataset",
        _small_dataset(tmp_path, 3),
        "--shots",
        "1",
        "5",
        "--pool-per-class",
        "10",
        "--output-dir",
        str(tmp_path / "out"),
    ]
    assert exit_code(argv) == 1
    assert "--shots 5 needs 5 training examples of every class, but class 0" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_failure_while_drawing_leaves_the_folder_as_it_was(tmp_path, monkeypatch, capsys):
    out = tmp_path / "figures"
    killed_staging(out, STAGING)  # what a run killed by SIGKILL left: the next one removes it
    argv = [*TINY_ARGS, "--analyses", "attention", "distance", "position", "filters", "--output-dir", str(out)]
    assert main(argv) == 0
    before = {name: (out / name).read_bytes() for name in os.listdir(out)}
    assert len(before) == 5

    def broken(*args, **kwargs):
        raise ValueError("the disk is full")

    monkeypatch.setattr(plots, "plot_filter_components", broken)  # the last figure drawn
    assert exit_code([*argv[:-2], "--dpi", "50", "--overwrite", "--output-dir", str(out)]) == 1
    assert "the disk is full" in capsys.readouterr().err
    assert {name: (out / name).read_bytes() for name in os.listdir(out)} == before  # no temporary file either
    assert exit_code([*argv[:-2], "--output-dir", str(tmp_path / "new")]) == 1
    assert not (tmp_path / "new").exists()  # created by the run, removed with it


def test_a_figure_that_fails_to_save_leaves_the_old_one(tmp_path, monkeypatch):
    path = tmp_path / "figure.png"
    path.write_bytes(b"old")

    def savefig_fails(self, *args, **kwargs):
        args[0].write(b"partial png")
        raise OSError("no space left on device")

    monkeypatch.setattr("matplotlib.figure.Figure.savefig", savefig_fails)
    with pytest.raises(OSError, match="no space"):
        plots.plot_attention_distance(np.random.rand(2, 2), str(path))
    assert os.listdir(tmp_path) == ["figure.png"] and path.read_bytes() == b"old"


def test_the_analyses_in_bfloat16_match_float32(tmp_path):
    """``--mixed-precision bfloat16`` against ``none`` on the same checkpoint: results.json names the policy, the
    mean attention distances (pixels, ~16 here) agree within 0.05 and the few-shot accuracies within 0.02
    (measured on TensorFlow: 0.004 and 0.0007)."""
    from npz_layout import vit_checkpoint, write_checkpoint

    arrays = vit_checkpoint(patch=8, width=32, depth=2, heads=2, mlp=64, grid=(4, 4), num_classes=5)
    path = write_checkpoint(str(tmp_path / "tiny.npz"), arrays)
    common = ["Ti/16", "--weights", path, *TINY_ARCHITECTURE, "--analyses", "distance", "fewshot", "--shots", "1", "5"]
    common += ["--pool-per-class", "10", "--test-examples", "200", "--seeds", "2"]
    results = {}
    for choice in ("bfloat16", "none"):
        assert main([*common, "--mixed-precision", choice, "--output-dir", str(tmp_path / choice)]) == 0
        results[choice] = json.loads((tmp_path / choice / "results.json").read_text())
    assert [results[c]["precision"] for c in ("bfloat16", "none")] == ["mixed_bfloat16", "float32"]
    distances = [np.asarray(results[c]["mean_attention_distance"]) for c in ("bfloat16", "none")]
    accuracies = [np.asarray([r["mean"] for r in results[c]["few_shot"].values()]) for c in ("bfloat16", "none")]
    np.testing.assert_allclose(*distances, atol=0.05)
    np.testing.assert_allclose(*accuracies, atol=0.02)


def test_an_output_folder_holding_the_user_s_results_is_refused_unless_overwrite(tmp_path, capsys):
    out = tmp_path / "figures"
    out.mkdir()
    (out / "results.json").write_text('{"mine": true}')
    argv = [*TINY_ARGS, "--analyses", "position", "--output-dir", str(out)]
    assert exit_code(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.splitlines()) == 1
    assert str(out / "results.json") in err and "--overwrite" in err
    assert os.listdir(out) == ["results.json"] and (out / "results.json").read_text() == '{"mine": true}'
    assert main([*argv, "--overwrite"]) == 0
    assert sorted(os.listdir(out)) == ["position_similarity.png", "results.json"]
    assert json.loads((out / "results.json").read_text())["figures"] == ["position_similarity.png"]


def test_an_output_dir_that_is_a_file_is_one_line(tmp_path, capsys):
    path = tmp_path / "a_file"
    path.write_text("not a folder")
    assert exit_code([*TINY_ARGS, "--analyses", "position", "--output-dir", str(path)]) == 1
    assert capsys.readouterr().err == f"error: --output-dir {path} is a file, not a folder.\n"
    assert path.read_text() == "not a folder"
