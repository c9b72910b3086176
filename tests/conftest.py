"""Shared test set-up: the backend (TensorFlow unless ``KERAS_BACKEND`` says otherwise), quiet logs, seeds.

A test runs on every Keras backend unless marked ``@pytest.mark.backends("tensorflow", ...)`` (on a parameter,
the test, or a file's ``pytestmark``; the closest mark counts): then it runs only on the backends it names and is
deselected on the others. A test whose behaviour does not depend on the backend (file readers, the zoo, argument checks)
is marked ``@pytest.mark.backend_independent`` and runs once, in the TensorFlow pass. CI runs the whole suite again
under ``KERAS_BACKEND=jax`` and under torch, so the marks alone choose what each backend runs.
A test marked ``@pytest.mark.requires("timm", "torch")`` needs those optional packages, in its own process or in
a subprocess, and is skipped, naming the install, where one is missing: the README's set-up installs none of
them. ``tests/test_package.py`` checks that every test file using an optional package carries the marker.
"""

import gc
import importlib.util
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# pytest -n N: the N workers share the machine's cores, so each framework in a worker (and the processes it starts) uses
# its share; more threads than cores would spin on each other.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _threads = str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    for _name in ("TF_NUM_INTRAOP_THREADS", "OMP_NUM_THREADS"):
        os.environ.setdefault(_name, _threads)

import keras_vit  # noqa: F401  (before Keras loads TensorFlow, as in a user's program: it picks TF's CPU kernels)

# isort: split

import keras
import pytest

# The optional packages tests use (top-level module -> how to install it), beyond the README's set-up line.
OPTIONAL = {
    "jax": "pip install -e '.[jax]'",
    "torch": "pip install -e '.[reference]'",
    "torchvision": "pip install -e '.[reference]'",
    "timm": "pip install -e '.[reference]'",
    "transformers": "pip install -e '.[reference]'",
    "tf2onnx": "pip install -e '.[export]'",
    "onnx": "pip install -e '.[export]'",
    "onnxruntime": "pip install -e '.[export]'",
    "ai_edge_litert": "pip install -e '.[export]'",
    "jax2onnx": "pip install jax2onnx",
    "openvino": "pip install -e '.[openvino]'",
    "nncf": "pip install -e '.[openvino]'",
    "keras_hub": "pip install --no-deps keras-hub kagglehub kagglesdk regex sentencepiece tokenizers pyyaml",
}


def missing_packages(modules) -> list[str]:
    """The modules of ``modules`` that are not installed."""
    return [module for module in modules if importlib.util.find_spec(module) is None]


def _runs_on(item, backend: str) -> bool:
    """Whether ``item`` runs in this backend's pass: its closest ``backends`` or ``backend_independent`` mark
    (a parameter's mark before its test's, a test's before its file's), every backend when it has neither."""
    parameter_marks = getattr(getattr(item, "callspec", None), "marks", [])
    for mark in [*parameter_marks, *item.iter_markers()]:
        if mark.name == "backend_independent":
            return backend == "tensorflow"
        if mark.name == "backends":
            return backend in mark.args
    return True


def pytest_collection_modifyitems(config, items):
    """Deselect, rather than skip, the tests another backend's pass runs: a pass collects only its own."""
    backend = keras.backend.backend()
    kept = [item for item in items if _runs_on(item, backend)]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if not _runs_on(item, backend)])
        items[:] = kept


def pytest_collection_finish(session):
    """What is loaded by now (TensorFlow, Keras, the test modules: about 450,000 objects) lives as long as the
    process: the cyclic garbage collector stops walking it (every full collection did, 20-45 s of a worker)."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """Likewise what is still alive once a file's tests and fixtures are done (Keras' and TensorFlow's caches)."""
    yield
    if nextitem is None or nextitem.module is not item.module:
        gc.collect()
        gc.freeze()


def pytest_runtest_setup(item):
    missing = missing_packages(module for mark in item.iter_markers("requires") for module in mark.args)
    if missing:
        installs = sorted({OPTIONAL.get(module, f"pip install {module}") for module in missing})
        pytest.skip(f"needs {', '.join(missing)}, not installed ({'; '.join(installs)})")


@pytest.fixture(autouse=True)
def _seed_and_policy():
    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy("float32")
    yield
    keras.mixed_precision.set_global_policy("float32")
