"""The installed package: one import namespace that a user's own files cannot shadow, and nothing else top level;
importing it loads no framework, and what it names and the docs write resolves on first use; and the test suite
itself: every test needing an optional package says so, so the README's set-up passes."""

import ast
import functools
import http.server
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import keras
import numpy as np
import pytest
from conftest import OPTIONAL
from npz_layout import TI_16, vit_checkpoint, write_checkpoint
from test_import_graph import module_files

import keras_vit
from keras_vit import zoo

pytestmark = pytest.mark.backend_independent  # files, names and checks: the same on every backend

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}  # the backend of this run (conftest.py sets KERAS_BACKEND)


@pytest.fixture
def user_folder(tmp_path):
    """A user's working folder holding a ``zoo.py`` and a ``training/`` package of their own."""
    folder = tmp_path / "project"
    (folder / "training").mkdir(parents=True)
    (folder / "zoo.py").write_text("")
    (folder / "training" / "__init__.py").write_text("")
    (folder / "training.py").write_text("")
    return folder


@pytest.fixture
def mirror(tmp_path):
    """A local mirror of the checkpoint bucket on 127.0.0.1, serving ``tmp_path / 'bucket'``."""
    root = tmp_path / "bucket"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def run_in(folder: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=folder, env={**ENV, **(env or {})}, capture_output=True, text=True, timeout=300
    )


def test_a_users_zoo_and_training_do_not_shadow_the_package(user_folder, mirror, tmp_path):
    root, url = mirror
    entry = zoo.get("Ti_16.augreg_in21k_ft_in1k_224")
    arrays = vit_checkpoint(**TI_16, num_classes=1000)  # the entry's architecture: the zoo refuses any other
    (root / entry.path).parent.mkdir(parents=True)
    write_checkpoint(root / entry.path, arrays)
    code = (
        "import numpy as np, keras_vit\n"
        "m = keras_vit.ViT_Ti16(weights='Ti_16.augreg_in21k_ft_in1k_224', image_size=32)\n"
        "print(m.input_shape, m.output_shape, float(np.abs(m.get_layer('head').bias.numpy()).sum()))\n"
    )
    done = run_in(user_folder, "-c", code, env={"KERAS_VIT_ZOO_URL": url, "KERAS_HOME": str(tmp_path / "home")})
    assert done.returncode == 0, done.stderr[-3000:]
    shapes = done.stdout.strip().splitlines()[-1]
    assert shapes.startswith("(None, 32, 32, 3) (None, 1000)")
    assert float(shapes.split()[-1]) == pytest.approx(float(abs(arrays["head/bias"]).sum()), rel=1e-5)

    help_text = run_in(user_folder, "-m", "keras_vit.training.finetune", "--help")
    assert help_text.returncode == 0, help_text.stderr[-3000:]
    assert "keras_vit.training.finetune" in help_text.stdout and "--weights" in help_text.stdout
    listing = run_in(user_folder, "-m", "keras_vit.zoo", "list")
    assert listing.returncode == 0 and entry.name in listing.stdout


def test_the_wheel_holds_one_top_level_package(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md", "LICENSE"):
        if (REPO / name).exists():
            shutil.copy(REPO / name, source / name)
    for folder in ("keras_vit", "zoo", "training"):
        shutil.copytree(REPO / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "dist"),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("keras_vit-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names} == {"keras_vit", wheel.name.split("-py")[0] + ".dist-info"}
    for expected in (
        "keras_vit/zoo/catalogue.json",
        "keras_vit/zoo/__main__.py",
        "keras_vit/training/finetune.py",
        "keras_vit/analysis/__main__.py",
    ):
        assert expected in names
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    scripts = [line.split("=")[1].strip() for line in entry_points.splitlines() if "=" in line]
    assert scripts and all(target.startswith("keras_vit.") for target in scripts)


# --- what importing loads, and what resolves after it -----------------------------------------------------------

FRAMEWORKS = ("keras", "tensorflow", "jax", "torch", "numpy")


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def test_the_zoo_lists_without_starting_tensorflow(tmp_path):
    before = _children_cpu_seconds()
    done = run_in(tmp_path, "-m", "keras_vit.zoo", "list", env={"KERAS_HOME": str(tmp_path)})
    cpu = _children_cpu_seconds() - before
    assert done.returncode == 0, done.stderr[-3000:]
    assert "B_16.orig_in21k" in done.stdout
    assert done.stderr == ""  # where TensorFlow writes its start-up lines
    assert cpu < 1.0, f"python -m keras_vit.zoo list took {cpu:.2f} s of CPU"


def test_every_public_name_resolves():
    for name in keras_vit.__all__:
        assert getattr(keras_vit, name) is not None
    assert set(keras_vit.__all__) <= set(dir(keras_vit))
    assert keras_vit.ViT_B16 is keras_vit.applications.ViT_B16
    with pytest.raises(AttributeError, match="no_such_name"):
        keras_vit.no_such_name  # noqa: B018


# A test file the docs name: ``tests/``-relative (``zoo/test_download.py``) or by its name alone, with an optional
# ``::test_name`` or ``::test_prefix_*``; other projects' test files the docs cite are not ours.
TEST_REFERENCE = re.compile(r"(?<![\w/.])((?:tests/)?(?:\w+/)*test_\w+\.py)(?:::(test_\w+)(\*?))?")
OTHER_PROJECTS_TESTS = {"test_case.py"}  # keras-hub's (docs/models.md)


def test_every_test_the_docs_name_exists():
    """Each ``test_*.py`` (and ``::test_name``) that README.md and docs/*.md point a reader to is a file of tests/
    holding that test: a moved or renamed test leaves no dangling pointer."""
    tests = REPO / "tests"
    dangling = []
    for document in [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]:
        for path, name, prefix in TEST_REFERENCE.findall(document.read_text()):
            relative = path.removeprefix("tests/")
            if relative in OTHER_PROJECTS_TESTS:
                continue
            files = [tests / relative] if "/" in relative else list(tests.rglob(relative))
            defined = f"^def {name}" + ("" if prefix else r"\b")
            if not any(f.is_file() and (not name or re.search(defined, f.read_text(), re.M)) for f in files):
                dangling.append(f"{document.name}: {path}{'::' + name + prefix if name else ''}")
    assert not dangling, dangling


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    """A ``.keras`` file holding a layer of each module that registers some (a hybrid's features, with its
    preprocessing), an input, and what the model makes of it."""
    folder = tmp_path_factory.mktemp("saved")
    tiny = dict(image_size=64, hidden_size=32, depth=1, num_heads=2, mlp_dim=64, include_preprocessing=True)
    model = keras_vit.feature_model(keras_vit.ViT("R26+S/32", **tiny), -1)
    images = np.random.default_rng(0).integers(0, 256, (2, 64, 64, 3)).astype("uint8")
    model.save(folder / "model.keras")
    np.save(folder / "images.npy", images)
    np.save(folder / "expected.npy", keras.ops.convert_to_numpy(model.predict_on_batch(images)))
    return folder


# A saved model loaded after the first import; then what the outputs are.
LOAD_MODEL = """
import pathlib, sys, keras, numpy as np
folder = pathlib.Path(sys.argv[1])
model = keras.saving.load_model(folder / 'model.keras')
np.save(sys.argv[2], keras.ops.convert_to_numpy(model.predict_on_batch(np.load(folder / 'images.npy'))))
"""

# The fresh-interpreter checks of `import keras_vit`, in one interpreter: each import loads no framework;
# keras_vit.precision.with_policy (as docs/models.md writes it) resolves without loading Keras; then the saved model
# loads (Keras first loaded by the user, after keras_vit), and every name of sys.argv[3:] resolves attribute by
# attribute from keras_vit.
IMPORT_CHECKS = """
import functools, json, sys
def frameworks():
    return sorted({{m.split('.')[0] for m in sys.modules}} & {frameworks})
loaded = {{}}
for module in ("keras_vit", "keras_vit.zoo", "keras_vit.variants"):
    __import__(module)
    loaded[module] = frameworks()
import keras_vit
attribute = keras_vit.precision.with_policy.__name__, "keras" in sys.modules
{load_model}
for name in sys.argv[3:]:
    functools.reduce(getattr, name.split('.')[1:], keras_vit)
print(json.dumps({{"loaded": loaded, "attribute": attribute}}))
"""


def _same_outputs(saved_model: Path, folder: Path) -> None:
    np.testing.assert_allclose(np.load(folder / "loaded.npy"), np.load(saved_model / "expected.npy"), atol=1e-5)


def test_import_keras_vit_loads_no_framework_and_then_everything_resolves(saved_model, tmp_path):
    """In a fresh interpreter: no framework on import; attributes without imports of their own; a saved model's
    layers found by Keras loaded after keras_vit; each module by its dotted name (``keras_vit.training.config``) and
    each ``keras_vit.x.y`` of the docs and README resolves from ``import keras_vit`` alone."""
    documents = [*(REPO / "docs").glob("*.md"), REPO / "README.md"]
    written = {name for path in documents for name in re.findall(r"\bkeras_vit(?:\.\w+)+", path.read_text())}
    names = sorted(written | {m for m in module_files() if not m.endswith("__main__")})
    code = IMPORT_CHECKS.format(frameworks=set(FRAMEWORKS), load_model=LOAD_MODEL)
    done = run_in(tmp_path, "-c", code, str(saved_model), str(tmp_path / "loaded.npy"), *names)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["loaded"] == {"keras_vit": [], "keras_vit.zoo": [], "keras_vit.variants": []}
    assert out["attribute"] == ["with_policy", False]
    _same_outputs(saved_model, tmp_path)


@pytest.mark.parametrize(
    "first_import",
    [
        "import keras_vit.layers",  # Keras first loaded by a module that registers layers, half run
        "import keras_vit.checkpoints",  # ... by keras_vit.position, itself half run beneath checkpoints.infer
    ],
)
def test_load_model_finds_the_layers_after_import_keras_vit(saved_model, first_import, tmp_path):
    done = run_in(tmp_path, "-c", first_import + LOAD_MODEL, str(saved_model), str(tmp_path / "loaded.npy"))
    assert done.returncode == 0, done.stderr[-3000:]
    _same_outputs(saved_model, tmp_path)


# --- the suite's optional packages ------------------------------------------------------------------------------

TESTS = Path(__file__).resolve().parent
# Inside a string (a script a test runs in a subprocess): "import timm, torch", "from transformers import ...".
SCRIPT_IMPORT = re.compile(r"^\s*(?:import\s+([\w.]+(?:\s*,\s*[\w.]+)*)|from\s+([\w.]+)\s+import)", re.MULTILINE)


def _only_on_backend(node: ast.AST, parents: dict, module: str) -> bool:
    """Whether ``node`` sits in an ``if`` that tests for ``module`` as the Keras backend (so it is installed)."""
    while node in parents:
        node = parents[node]
        test = ast.unparse(node.test) if isinstance(node, ast.If) else ""
        if "backend" in test and repr(module) in test:
            return True
    return False


def _script_modules(text: str) -> set[str]:
    """Top-level modules a Python script (or a script in a string) imports."""
    modules = set()
    for imported, source in SCRIPT_IMPORT.findall(text):
        modules.update(name.strip().split(".")[0] for name in (imported or source).split(","))
    return modules


def _backends_run(node: ast.AST, library_names: set[str]) -> set[str]:
    """Keras backends a node runs something on: ``KERAS_BACKEND="jax"`` (a keyword or a dict entry), a
    ``backend="torch"`` keyword of a call that is not keras_vit's own (the library reasons about backends without
    running them), or a ``BACKENDS = (...)`` tuple."""
    values = []
    if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[0] not in library_names:
        values += [k.value for k in node.keywords if k.arg in ("backend", "KERAS_BACKEND")]
    elif isinstance(node, ast.Call):
        values += [k.value for k in node.keywords if k.arg == "KERAS_BACKEND"]
    if isinstance(node, ast.Dict):
        values += [
            v for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant) and k.value == "KERAS_BACKEND"
        ]
    if isinstance(node, ast.Assign) and any("BACKENDS" in ast.unparse(target) for target in node.targets):
        values += getattr(node.value, "elts", [])
    return {value.value for value in values if isinstance(value, ast.Constant)}


def optional_packages_used(path: Path) -> set[str]:
    """The optional packages a test file needs: imported (outside an ``if`` on that Keras backend), in a script it
    runs (a string, or a file of ``tests/reference`` it names), probed (``importorskip``, ``find_spec``), or set as
    the Keras backend of what it runs."""
    source = path.read_text()
    tree = ast.parse(source)
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    library_names = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("keras_vit")
        for alias in node.names
    }
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            used.update(m for m in (n.split(".")[0] for n in names) if not _only_on_backend(node, parents, m))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            used.update(_script_modules(node.value))
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and ast.unparse(node.func).endswith(("importorskip", "find_spec"))
        ):
            used.add(str(node.args[0].value))
        used |= _backends_run(node, library_names)
    for script in (TESTS / "reference").glob("*.py"):
        if script.name in source:
            used |= _script_modules(script.read_text())
    return used & set(OPTIONAL)


def optional_packages_declared(path: Path) -> set[str]:
    """The packages named in the file's ``pytest.mark.requires(...)`` markers."""
    tree = ast.parse(path.read_text())
    return {
        str(arg.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("mark.requires")
        for arg in node.args
        if isinstance(arg, ast.Constant)
    }


def test_every_test_file_needing_an_optional_package_is_marked():
    """The README's set-up installs none of them: a test needing one skips (``requires``), it never errors."""
    undeclared = {
        str(path.relative_to(TESTS)): sorted(optional_packages_used(path) - optional_packages_declared(path))
        for path in sorted(TESTS.rglob("test_*.py"))  # the folders' too: tests/<package>/test_<module>.py
        if path != Path(__file__).resolve()  # this file's examples of what the check finds
    }
    undeclared = {name: missing for name, missing in undeclared.items() if missing}
    assert not undeclared, f"add @pytest.mark.requires(...) for these packages: {undeclared}"


def test_the_marker_check_finds_every_way_a_test_uses_a_package(tmp_path):
    test = tmp_path / "test_example.py"
    test.write_text(
        "import keras\n"
        "import timm\n"
        "SCRIPT = 'import json, sys\\nfrom transformers import ViTModel'\n"
        "def test_a():\n"
        "    pytest.importorskip('tf2onnx')\n"
        "    run(code, backend='jax')\n"
        "    env = {'KERAS_BACKEND': 'torch'}\n"
        "    if keras.backend.backend() == 'jax':\n"
        "        import jax  # runs only where JAX is the backend: installed\n"
        "    subprocess.run([sys.executable, 'timm_vit.py'])\n"
        "@pytest.mark.requires('timm', 'jax')\n"
        "def test_b(): pass\n"
        "def test_c():\n"
        "    assert precision.auto_policy('cpu', backend='torch')  # keras_vit's own: runs nothing on torch\n"
        "    if backend == 'jax':\n"
        "        import jax\n"
        "    resnet(weight_standardization='torch')\n"
        "BACKENDS = ('tensorflow', 'jax')\n"
        "from keras_vit import precision\n"
    )
    used = optional_packages_used(test)
    assert used == {"timm", "transformers", "tf2onnx", "jax", "torch"}  # torch too: tests/reference/timm_vit.py
    assert optional_packages_declared(test) == {"timm", "jax"}


@pytest.mark.requires("a_package_that_does_not_exist")
def test_a_missing_optional_package_skips_naming_it():
    raise AssertionError("unreachable: conftest.py skips this test")
