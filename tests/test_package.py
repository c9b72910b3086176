"""The installed package: one import namespace that a user's own files cannot shadow, and nothing else top level."""

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest
from npz_layout import vit_checkpoint, write_checkpoint

from keras_vit import zoo

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
    arrays = vit_checkpoint(patch=16, width=32, depth=1, heads=2, mlp=64, grid=(2, 2), num_classes=1000)
    (root / entry.path).parent.mkdir(parents=True)
    write_checkpoint(root / entry.path, arrays)
    code = (
        "import numpy as np, keras_vit\n"
        "m = keras_vit.ViT_Ti16(weights='Ti_16.augreg_in21k_ft_in1k_224', hidden_size=32, depth=1, num_heads=2, "
        "mlp_dim=64)\n"
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
