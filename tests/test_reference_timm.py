"""Parity with an independent implementation: timm's VisionTransformer and its own Google ``.npz`` loader.

Checkpoints are written with numpy in the published layout (``npz_layout.py``), loaded into keras-vit
here and into timm in a subprocess (``reference/timm_vit.py``: TensorFlow and timm in one process
crash), and both run on the same images. timm has no ``pre_logits`` layer, so the token model's
pre-head features are compared with timm and ``pre_logits`` + head with a numpy computation.
"""

import json
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import scipy.ndimage
from npz_layout import vit_checkpoint, write_checkpoint

import keras_vit
from keras_vit.checkpoints.load import load_weights

pytestmark = [pytest.mark.backends("tensorflow"), pytest.mark.reference, pytest.mark.requires("timm", "torch")]

REFERENCE = Path(__file__).with_name("reference") / "timm_vit.py"
B16 = dict(patch_size=16, hidden_size=768, depth=2, num_heads=12, mlp_dim=3072)  # B/16, 2 blocks
TOLERANCE = 1e-4
RESAMPLES = [
    ((24, 24), "bilinear"),
    ((24, 24), "bicubic"),
    ((7, 7), "bilinear"),
    ((7, 7), "bicubic"),
    ((20, 12), "bilinear"),
    ((20, 12), "bicubic"),
]


def timm_model(image_size, classifier, num_classes):
    return dict(
        img_size=image_size,
        patch_size=16,
        embed_dim=768,
        depth=2,
        num_heads=12,
        mlp_ratio=4.0,
        num_classes=num_classes,
        class_token=classifier == "token",
        global_pool="token" if classifier == "token" else "avg",
        fc_norm=False,
    )


@pytest.fixture(scope="module")
def timm_runs(tmp_path_factory):
    """Write the checkpoints and inputs, run timm once on all jobs, return paths and timm's outputs."""
    tmp = tmp_path_factory.mktemp("timm")
    rng = np.random.default_rng(1)
    images = {size: rng.uniform(-1, 1, (2, size, size, 3)).astype("float32") for size in (224, 384)}
    for size, array in images.items():
        np.savez(tmp / f"images{size}.npz", images=array)
    cases = {
        "token": (
            vit_checkpoint(patch=16, width=768, heads=12, mlp=3072, grid=(14, 14), representation_size=768, seed=2),
            224,
            "token",
            0,
        ),
        "gap": (
            vit_checkpoint(patch=16, width=768, heads=12, mlp=3072, grid=(14, 14), classifier="gap", seed=3),
            224,
            "gap",
            10,
        ),
        "resized": (vit_checkpoint(patch=16, width=768, heads=12, mlp=3072, grid=(14, 14), seed=4), 384, "token", 10),
    }
    jobs = []
    for name, (arrays, size, classifier, classes) in cases.items():
        write_checkpoint(tmp / f"{name}.npz", arrays)
        jobs.append(
            dict(
                kind="vit",
                checkpoint=str(tmp / f"{name}.npz"),
                images=str(tmp / f"images{size}.npz"),
                output=str(tmp / f"{name}_out.npz"),
                model=timm_model(size, classifier, classes),
            )
        )
    posemb = rng.normal(size=(1, 1 + 14 * 14, 16)).astype("float32")
    np.savez(tmp / "posemb.npz", posemb=posemb)
    for i, (size, method) in enumerate(RESAMPLES):
        jobs.append(
            dict(
                kind="resample",
                input=str(tmp / "posemb.npz"),
                output=str(tmp / f"resample{i}.npz"),
                new_size=list(size),
                num_prefix_tokens=1,
                interpolation=method,
                antialias=method == "bicubic",
            )
        )
    (tmp / "jobs.json").write_text(json.dumps(jobs))
    run = subprocess.run(
        [sys.executable, str(REFERENCE), str(tmp / "jobs.json")], capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    outputs = {name: dict(np.load(tmp / f"{name}_out.npz")) for name in cases}
    resampled = [np.load(tmp / f"resample{i}.npz")["posemb"] for i in range(len(RESAMPLES))]
    return dict(tmp=tmp, images=images, cases=cases, outputs=outputs, posemb=posemb, resampled=resampled)


def report(name, error):
    """Print a measured parity error (shown with ``pytest -s``; the README quotes these)."""
    print(f"\nparity {name}: max |keras-vit - reference| = {error:.2e}")
    return error


def features_and_logits(model, pool, images):
    features = keras.Model(model.input, model.get_layer(pool).output)
    return features.predict(images, verbose=0), model.predict(images, verbose=0)


def test_token_model_with_pre_logits_matches_timm_and_numpy(timm_runs):
    arrays = timm_runs["cases"]["token"][0]
    images = timm_runs["images"][224]
    model = keras_vit.ViT(None, weights=timm_runs["tmp"] / "token.npz", gelu="exact", **B16)
    assert model.get_layer("pre_logits").units == 768 and model.output_shape == (None, 10)
    features, logits = features_and_logits(model, "token_pool", images)
    reference = timm_runs["outputs"]["token"]["features"]
    assert report("token B/16 features vs timm", np.abs(features - reference).max()) <= TOLERANCE
    assert np.abs(reference).max() > 0.5  # the comparison is not between two near-zero vectors

    # pre_logits (tanh) and head by hand, on timm's features.
    pre = np.tanh(reference.astype("float64") @ arrays["pre_logits/kernel"] + arrays["pre_logits/bias"])
    expected = pre @ arrays["head/kernel"] + arrays["head/bias"]
    assert report("token B/16 pre_logits+head logits vs numpy", np.abs(logits - expected).max()) <= TOLERANCE
    keras.backend.clear_session()


def test_gap_model_matches_timm(timm_runs):
    images = timm_runs["images"][224]
    model = keras_vit.ViT(None, weights=timm_runs["tmp"] / "gap.npz", classifier="gap", gelu="exact", **B16)
    assert "class_token" not in [layer.name for layer in model.layers]
    features, logits = features_and_logits(model, "avg_pool", images)
    out = timm_runs["outputs"]["gap"]
    assert report("gap B/16 features vs timm", np.abs(features - out["features"]).max()) <= TOLERANCE
    assert report("gap B/16 logits vs timm", np.abs(logits - out["logits"]).max()) <= TOLERANCE
    assert np.abs(out["logits"]).max() > 0.5
    keras.backend.clear_session()


def test_224_checkpoint_in_384_model_matches_timm_bilinear_resize(timm_runs):
    images = timm_runs["images"][384]
    model = keras_vit.ViT(None, image_size=384, num_classes=10, gelu="exact", **B16)
    load_weights(model, timm_runs["tmp"] / "resized.npz", resize_method="bilinear")
    assert model.get_layer("posembed_input").pos_embedding.shape == (1, 1 + 24 * 24, 768)
    logits = model.predict(images, verbose=0)
    error = np.abs(logits - timm_runs["outputs"]["resized"]["logits"]).max()
    assert report("224 checkpoint -> 384 model (bilinear) logits vs timm", error) <= TOLERANCE
    keras.backend.clear_session()


@pytest.mark.parametrize("index", range(len(RESAMPLES)), ids=[f"{s[0]}x{s[1]}-{m}" for s, m in RESAMPLES])
def test_resample_methods_match_timm_resample_abs_pos_embed(timm_runs, index):
    size, method = RESAMPLES[index]
    ours = keras_vit.resample_position_embeddings(timm_runs["posemb"], size, method=method)
    assert ours.shape == timm_runs["resampled"][index].shape == (1, 1 + size[0] * size[1], 16)
    assert report(f"resample {size} {method} vs timm", np.abs(ours - timm_runs["resampled"][index]).max()) <= 1e-5


def test_zoom_linear_differs_from_timm_bilinear(timm_runs):
    """The original's corner-aligned zoom and timm's half-pixel bilinear are different resizes."""
    ours = keras_vit.resample_position_embeddings(timm_runs["posemb"], (24, 24), method="zoom_linear")
    grid = scipy.ndimage.zoom(timm_runs["posemb"][0, 1:].reshape(14, 14, 16), (24 / 14, 24 / 14, 1), order=1)
    np.testing.assert_allclose(ours[0, 1:], grid.reshape(-1, 16), atol=1e-6)
    assert np.abs(ours - timm_runs["resampled"][0]).max() > 1e-2
