"""The install plan: every way of installing keras-vit holds exactly one TensorFlow distribution.

``tensorflow`` and ``tensorflow-cpu`` (and the other builds) all write the same ``tensorflow/`` folder: two in one
environment leave whichever was unpacked last. pip's ``--dry-run --report`` resolves the plan without installing
it; it asks the package registry, so these tests are slow-marked (CI runs them).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.backend_independent  # files, names and checks: the same on every backend

REPO = Path(__file__).resolve().parents[1]
# Distributions that install the `tensorflow` package (PyPI names, normalised).
TENSORFLOW_DISTRIBUTIONS = {
    "tensorflow",
    "tensorflow-cpu",
    "tensorflow-gpu",
    "tensorflow-intel",
    "tensorflow-macos",
    "tensorflow-aarch64",
    "tf-nightly",
    "tf-nightly-cpu",
}


def install_plan(*requirements: str) -> set[str]:
    """The normalised names of the distributions ``pip install REQUIREMENTS`` would install into a new environment."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--report",
            "-",
            *list(requirements),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    return {item["metadata"]["name"].lower().replace("_", "-") for item in report["install"]}


@pytest.mark.slow  # resolves against the package registry
@pytest.mark.parametrize(
    "requirements",
    [
        pytest.param((".",), id="library"),
        pytest.param((".[gpu]",), id="gpu"),
        pytest.param(("tensorflow==2.21.0", "."), id="pinned-tensorflow"),
        pytest.param((".[test,jax,export]",), id="extras"),
    ],
)
def test_the_plan_holds_one_tensorflow(requirements):
    plan = install_plan(*requirements)
    assert "keras-vit" in plan and "keras" in plan
    assert len(plan & TENSORFLOW_DISTRIBUTIONS) == 1, sorted(plan & TENSORFLOW_DISTRIBUTIONS)
