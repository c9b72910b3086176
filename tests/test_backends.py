"""The library on every Keras backend: the same files give the same numbers on TensorFlow, JAX and torch.

The backend is fixed when Keras is imported, so each backend runs in its own subprocess: this file run as a
script (``python test_backends.py JOB``) is the worker. Two rounds, one subprocess per backend each:

1. every backend loads the same ``.npz`` checkpoints (a plain and a hybrid ViT, each at its own resolution
   and at another one, resizing the position embeddings) and a timm ``.safetensors`` file, runs the analyses,
   preprocesses photos eagerly and inside a ``tf.data`` map, and saves ``.keras`` files;
2. every backend loads the ``.keras`` files the other two saved. JAX and torch run this round with TensorFlow
   blocked in ``sys.meta_path``, so it also shows that the library runs without TensorFlow installed:
   import, build, load, predict, analyses, a zoo download, and the clear error of what does need TensorFlow.

Measured here (keras 3.15, jax 0.10, torch 2.14, CPU; logits of order 1): JAX's and torch's logits are within
8.2e-7 of TensorFlow's, a ``.keras`` file gives its saver's logits to 7.2e-7 on the other backends, and the
preprocessing in ``tf.data`` is TensorFlow's own, bit for bit, on every backend. Eagerly, JAX's and torch's
bilinear resize differ from TensorFlow's by float32 round-off (3e-7 here, up to 1.6e-5 in test_preprocessing.py).
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = [
    pytest.mark.backends("tensorflow"),
    pytest.mark.requires("jax", "torch"),
]  # each test compares the three backends' workers

START = time.perf_counter()
BACKENDS = ("tensorflow", "jax", "torch")
LOGITS_ATOL = 1e-5
EAGER_RESIZE_ATOL = 2e-5  # float32 round-off of the resize's sample positions, see the module docstring
ZOO_NAME = "Ti_16.augreg_in21k_ft_in1k_224"
TINY = dict(patch=8, width=32, depth=2, heads=2, mlp=64, grid=(4, 4), num_classes=5)  # 32 x 32 images
HYBRID = dict(num_layers=(1,), width=32, hidden=32, depth=1, heads=2, mlp=64, grid=8, num_classes=5)  # stride 4
# what each model is evaluated on: (checkpoint, model_from_checkpoint options, image size)
CHECKPOINT_CASES = {
    "plain": ("plain.npz", {}, 32),
    "plain_resized_bicubic": ("plain.npz", dict(image_size=(40, 56), resize_method="bicubic"), (40, 56)),
    "hybrid": ("hybrid.npz", dict(resnet_options=dict(width=32)), 32),
    "hybrid_resized_zoom_linear": ("hybrid.npz", dict(image_size=64, resnet_options=dict(width=32)), 64),
    "timm_safetensors": ("timm.safetensors", dict(num_heads=2), 32),
    "clip_tower": ("clip.safetensors", dict(num_heads=2, gelu="quick"), 32),  # norm_pre, QuickGELU, qk-norm
    "siglip_tower": ("siglip.safetensors", dict(num_heads=2), 32),  # the MAP head
}
TOWERS = {"clip": ("CLIP-B/16", dict(qk_norm=True)), "siglip": ("SigLIP-B/16", dict(num_classes=5))}
KERAS_FILES = ("plain_with_preprocessing", "hybrid")
ANALYSES = ("rollout", "distances", "position_similarity", "features")
VIT_SHAPE = dict(patch_size=8, hidden_size=32, depth=2, num_heads=2, mlp_dim=64)  # TINY, as ViT() options


# --- the worker (runs in the subprocess) ---------------------------------------------------------------------------


def _block_tensorflow() -> list[str]:
    """Make ``import tensorflow`` (and tensorflow_datasets) fail as if not installed; returns the attempts made."""
    import importlib.abc
    import importlib.machinery

    attempts = []

    class Refuse(importlib.abc.Loader):
        def create_module(self, spec):
            attempts.append(spec.name)
            raise ModuleNotFoundError(f"No module named {spec.name!r}", name=spec.name)

        def exec_module(self, module):
            raise AssertionError("unreachable")

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in ("tensorflow", "tensorflow_datasets"):
                return importlib.machinery.ModuleSpec(name, Refuse())
            return None

    sys.meta_path.insert(0, Block())
    return attempts


def _images(size, count=2, seed=0) -> np.ndarray:
    height, width = (size, size) if isinstance(size, int) else size
    return np.random.default_rng(seed).uniform(-1, 1, (count, height, width, 3)).astype("float32")


def _photos() -> list[np.ndarray]:
    """uint8 photos of different sizes and aspect ratios (scikit-learn's samples)."""
    from sklearn.datasets import load_sample_image

    china, flower = load_sample_image("china.jpg"), load_sample_image("flower.jpg")
    return [flower[40:400, 100:250], china[:97, 5:300]]


def _numpy(x) -> np.ndarray:
    import keras

    return np.asarray(keras.ops.convert_to_numpy(x))


def _keras_file_logits(model, photos) -> np.ndarray:
    """What a saved model is compared on: its logits of photos (with preprocessing) or of random images."""
    if model.input_shape[1] is None:
        return np.concatenate([_numpy(model.predict_on_batch(photo[None])) for photo in photos])
    return _numpy(model.predict_on_batch(_images(model.input_shape[1:3], seed=3)))


def _checkpoints(folder: Path, out: dict, cases=tuple(CHECKPOINT_CASES)) -> dict:
    """Each case's model and its logits (``out["{case}/logits"]``)."""
    import keras_vit

    models = {}
    for case in cases:
        file, options, size = CHECKPOINT_CASES[case]
        models[case] = keras_vit.model_from_checkpoint(folder / file, **options)
        out[f"{case}/logits"] = _numpy(models[case].predict_on_batch(_images(size)))
    return models


def _analyses(model, out: dict) -> None:
    from keras_vit import analysis

    images = _images(32, count=3)
    attention = analysis.analyse_attention(model, images)
    out["analysis/rollout"], out["analysis/distances"] = attention.maps, attention.distances
    out["analysis/position_similarity"] = analysis.model_position_similarity(model)
    out["analysis/features"] = analysis.extract_features(model, images, pooling="token")


def _preprocessing(out: dict) -> None:
    """ImagePreprocessor and preprocess_input eagerly and in tf.data maps."""
    import keras
    import tensorflow as tf

    import keras_vit

    layer = keras_vit.ImagePreprocessor(40, crop_fraction=0.9)
    photos = _photos()
    for dtype in ("uint8", "float32"):
        spec = tf.TensorSpec((None, None, 3), dtype)
        dataset = tf.data.Dataset.from_generator(lambda d=dtype: (p.astype(d) for p in photos), output_signature=spec)
        out[f"tf_data/{dtype}"] = np.stack(list(dataset.map(layer).as_numpy_iterator()))
        out[f"eager/{dtype}"] = np.stack([_numpy(layer(photo.astype(dtype))) for photo in photos])
    pixels = photos[0][:4]
    out["tf_data/preprocess_input"] = np.stack(
        list(tf.data.Dataset.from_tensor_slices(pixels).map(keras_vit.preprocess_input))
    )
    eager = keras_vit.preprocess_input(pixels)
    assert keras.backend.backend() == "tensorflow" or not tf.is_tensor(eager)  # the backend's own tensor
    out["eager/preprocess_input"] = _numpy(eager)


def _save_keras_files(folder: Path, hybrid, out: dict) -> None:
    """A plain ViT with ``include_preprocessing=True`` and a hybrid, saved as ``{name}.{backend}.keras``."""
    import keras

    import keras_vit

    plain = keras_vit.ViT("Ti/16", weights=str(folder / "plain.npz"), include_preprocessing=True, **VIT_SHAPE)
    for name, model in zip(KERAS_FILES, (plain, hybrid)):
        model.save(folder / f"{name}.{keras.backend.backend()}.keras")
        out[f"{name}/saved_logits"] = _keras_file_logits(model, _photos())


def _load_keras_files(folder: Path, out: dict) -> None:
    import keras

    import keras_vit  # noqa: F401  (registers the layers, as a user's program does before load_model)

    for saver in BACKENDS:
        if saver != keras.backend.backend():
            for name in KERAS_FILES:
                model = keras.saving.load_model(folder / f"{name}.{saver}.keras")
                out[f"{name}.{saver}/logits"] = _keras_file_logits(model, _photos())


def _without_tensorflow(folder: Path, out: dict, attempts: list[str]) -> None:
    """What a JAX or torch user without TensorFlow runs: it works, and what needs TensorFlow says how to get it."""
    import keras_vit
    from keras_vit import export
    from keras_vit.analysis import data

    model = keras_vit.ViT_Ti16(weights=ZOO_NAME, image_size=32)
    out["zoo/logits"] = _numpy(model.predict_on_batch(_images(32)))
    _analyses(model, out)
    _checkpoints(folder, out, ("timm_safetensors",))
    out["tensorflow_attempts"] = np.asarray(attempts, str)  # before the calls below try on purpose
    (folder / "a_saved_model").mkdir(exist_ok=True)
    messages = []
    for needs_tensorflow in (
        lambda: export.load(folder / "a_saved_model"),
        lambda: data.load_fewshot_dataset("tfds:mnist"),
    ):
        with pytest.raises(ImportError) as error:
            needs_tensorflow()
        messages.append(str(error.value))
    out["errors"] = np.asarray(messages)
    out["tensorflow_modules"] = np.asarray(sorted(m for m in sys.modules if m.split(".")[0] == "tensorflow"), str)


def worker(job: dict) -> None:
    """One backend's round (``job``: backend, round, folder); writes ``{folder}/{round}.{backend}.npz``."""
    attempts = _block_tensorflow() if job["block_tensorflow"] else []
    os.environ["KERAS_BACKEND"] = job["backend"]
    import keras

    assert keras.backend.backend() == job["backend"]
    folder, out = Path(job["folder"]), {}
    if job["round"] == 1:
        models = _checkpoints(folder, out)
        _analyses(models["plain"], out)
        _preprocessing(out)
        _save_keras_files(folder, models["hybrid"], out)
    else:
        _load_keras_files(folder, out)
        if job["block_tensorflow"]:
            _without_tensorflow(folder, out, attempts)
    np.savez(folder / f"{job['round']}.{job['backend']}.npz", **out)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    took, cpu = time.perf_counter() - START, usage.ru_utime + usage.ru_stime
    print(f"worker {job['backend']} round {job['round']}: {took:.1f} s, {cpu:.1f} s of CPU")


# --- the tests (run in pytest) ---------------------------------------------------------------------------------


def _write_inputs(folder: Path) -> None:
    """The checkpoints every backend loads: numpy-written ``.npz`` files and a timm file written from one."""
    from npz_layout import flax_hybrid_checkpoint, vit_checkpoint, write_checkpoint

    import keras_vit

    write_checkpoint(folder / "plain.npz", vit_checkpoint(**TINY))
    write_checkpoint(folder / "hybrid.npz", flax_hybrid_checkpoint(5, **HYBRID))
    timm_source = keras_vit.model_from_checkpoint(vit_checkpoint(**dict(TINY, seed=1)), gelu="exact")
    keras_vit.save_timm_safetensors(timm_source, folder / "timm.safetensors")
    rng = np.random.default_rng(2)
    for name, (variant, options) in TOWERS.items():  # the image towers, written to timm's layout by keras-vit
        tower = keras_vit.ViT(variant, **VIT_SHAPE, image_size=32, **options)
        for variable in tower.weights:
            variable.assign(rng.normal(0, 0.2, variable.shape))
        keras_vit.save_timm_safetensors(tower, folder / f"{name}.safetensors")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def zoo_mirror(tmp_path_factory):
    """A local mirror of the checkpoint bucket holding a small checkpoint under the name ``ZOO_NAME``."""
    from npz_layout import TI_16, vit_checkpoint, write_checkpoint

    from keras_vit import zoo

    root = tmp_path_factory.mktemp("bucket")
    entry = zoo.get(ZOO_NAME)
    (root / entry.path).parent.mkdir(parents=True)
    arrays = vit_checkpoint(**TI_16, num_classes=1000)  # the entry's architecture: the zoo refuses any other
    write_checkpoint(root / entry.path, arrays)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def _run_round(folder: Path, number: int, env: dict) -> None:
    """The round's workers, one per backend, side by side; a failure shows the worker's output."""
    with contextlib.ExitStack() as stack:
        runs = {}
        for backend in BACKENDS:
            block = number == 2 and backend != "tensorflow"
            job = json.dumps(dict(backend=backend, round=number, folder=str(folder), block_tensorflow=block))
            log = stack.enter_context(open(folder / f"{number}.{backend}.log", "w"))
            runs[backend] = subprocess.Popen([sys.executable, __file__, job], env=env, stdout=log, stderr=log)
        for process in runs.values():
            try:
                process.wait(timeout=600)
            except subprocess.TimeoutExpired:
                process.kill()
                raise
    for backend, process in runs.items():
        log = (folder / f"{number}.{backend}.log").read_text()
        assert process.returncode == 0, f"{backend}, round {number}:\n{log[-4000:]}"


@pytest.fixture(scope="module")
def results(tmp_path_factory, zoo_mirror) -> dict[tuple[int, str], dict[str, np.ndarray]]:
    """``{(round, backend): {name: array}}`` from the two rounds of workers."""
    folder = tmp_path_factory.mktemp("backends")
    _write_inputs(folder)
    env = {
        **os.environ,
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "KERAS_VIT_ZOO_URL": zoo_mirror,
        "KERAS_HOME": str(folder / "home"),
        # JAX compiles every random initialiser and forward pass: round 2 reuses round 1's compilations
        "JAX_COMPILATION_CACHE_DIR": str(folder / "jax_cache"),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    }
    for number in (1, 2):
        _run_round(folder, number, env)
    return {
        (number, backend): dict(np.load(folder / f"{number}.{backend}.npz"))
        for number in (1, 2)
        for backend in BACKENDS
    }


@pytest.mark.parametrize("case", list(CHECKPOINT_CASES))
def test_the_same_checkpoint_gives_the_same_logits_on_every_backend(results, case):
    reference = results[1, "tensorflow"][f"{case}/logits"]
    assert reference.std() > 0.1  # a real model's logits, not zeros
    for backend in ("jax", "torch"):
        np.testing.assert_allclose(results[1, backend][f"{case}/logits"], reference, atol=LOGITS_ATOL, rtol=0)


def test_the_analyses_agree_across_backends(results):
    reference = results[1, "tensorflow"]
    assert reference["analysis/rollout"].shape == (3, 4, 4) and reference["analysis/distances"].shape == (2, 2)
    for backend in ("jax", "torch"):
        for name in ANALYSES:
            np.testing.assert_allclose(
                results[1, backend][f"analysis/{name}"], reference[f"analysis/{name}"], atol=1e-5, rtol=1e-5
            )


def test_image_preprocessor_in_tf_data_is_tensorflows_own_on_every_backend(results):
    tensorflow = results[1, "tensorflow"]
    for backend in BACKENDS:
        out = results[1, backend]
        for dtype in ("uint8", "float32"):
            assert out[f"tf_data/{dtype}"].shape == (2, 40, 40, 3)
            np.testing.assert_array_equal(out[f"tf_data/{dtype}"], tensorflow[f"eager/{dtype}"])
            np.testing.assert_allclose(out[f"eager/{dtype}"], tensorflow[f"eager/{dtype}"], atol=EAGER_RESIZE_ATOL)
        np.testing.assert_array_equal(out["tf_data/preprocess_input"], tensorflow["eager/preprocess_input"])
        # one float32 ulp at most: XLA multiplies by the reciprocal of 127.5 where TensorFlow and torch divide
        np.testing.assert_allclose(
            out["eager/preprocess_input"], tensorflow["eager/preprocess_input"], rtol=0, atol=6e-8
        )
    scaled = tensorflow["eager/preprocess_input"]
    assert scaled.dtype == np.float32 and scaled.min() >= -1 and scaled.max() <= 1 and scaled.std() > 0.1


def test_include_preprocessing_gives_the_same_logits_on_every_backend(results):
    reference = results[1, "tensorflow"]["plain_with_preprocessing/saved_logits"]
    assert reference.shape == (2, 5) and reference.std() > 0.1
    for backend in ("jax", "torch"):
        got = results[1, backend]["plain_with_preprocessing/saved_logits"]
        np.testing.assert_allclose(got, reference, atol=LOGITS_ATOL, rtol=0)


@pytest.mark.parametrize("name", KERAS_FILES)
def test_a_keras_file_saved_on_one_backend_loads_on_the_others(results, name):
    for saver in BACKENDS:
        saved = results[1, saver][f"{name}/saved_logits"]
        for loader in BACKENDS:
            if loader != saver:
                got = results[2, loader][f"{name}.{saver}/logits"]
                np.testing.assert_allclose(got, saved, atol=LOGITS_ATOL, rtol=0, err_msg=f"{saver} -> {loader}")


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_the_library_runs_without_tensorflow(results, backend):
    out = results[2, backend]
    assert out["tensorflow_modules"].size == 0 and out["tensorflow_attempts"].size == 0
    assert out["zoo/logits"].shape == (2, 1000) and out["zoo/logits"].std() > 0.1  # downloaded from the mirror
    reference = results[1, "tensorflow"]["timm_safetensors/logits"]
    np.testing.assert_allclose(out["timm_safetensors/logits"], reference, atol=LOGITS_ATOL, rtol=0)
    other = results[2, "torch" if backend == "jax" else "jax"]
    for name in ("zoo/logits", *(f"analysis/{name}" for name in ANALYSES)):
        np.testing.assert_allclose(out[name], other[name], atol=1e-5, rtol=1e-5)
    saved_model, tfds = out["errors"]
    assert "Running a SavedModel needs tensorflow" in saved_model and "pip install tensorflow" in saved_model
    assert "'tfds:mnist'" in tfds and "pip install tensorflow" in tfds


def test_require_names_what_needs_a_module_and_how_to_install_it(tmp_path, monkeypatch):
    from keras_vit.optional import require

    assert require("json", "Reading JSON") is json
    with pytest.raises(
        ImportError, match=r"^Running X needs tensorflow, which is not installed: pip install tensorflow$"
    ):
        monkeypatch.setitem(sys.modules, "tensorflow", None)  # as if not installed
        require("tensorflow", "Running X")
    with pytest.raises(ImportError, match="needs no_such_module_here, which is not installed: pip install no_such_"):
        require("no_such_module_here", "Something")
    (tmp_path / "half_installed.py").write_text("import no_such_dependency_here\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as error:  # installed, but broken: its own error, which names the culprit
        require("half_installed", "Something")
    assert error.value.name == "no_such_dependency_here"


if __name__ == "__main__":
    worker(json.loads(sys.argv[1]))
