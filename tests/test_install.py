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


PLANS = {
    "library": (".",),
    "gpu": (".[gpu]",),
    "pinned-tensorflow": ("tensorflow==2.21.0", "."),
    "extras": (".[test,jax,export]",),
}


@pytest.fixture(scope="module")
def plans() -> dict[str, set[str]]:
    """For each of PLANS, the normalised names of the distributions ``pip install REQUIREMENTS`` would install into
    a new environment. The four resolutions run at once: they mostly wait on the registry."""
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report", "-"]
    running = {
        name: subprocess.Popen([*command, *requirements], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for name, requirements in PLANS.items()
    }
    names = {}
    for name, process in running.items():
        out, err = process.communicate(timeout=900)
        assert process.returncode == 0, f"{name}: {err.decode()[-3000:]}"
        report = json.loads(out)
        names[name] = {item["metadata"]["name"].lower().replace("_", "-") for item in report["install"]}
    return names


@pytest.mark.slow  # resolves against the package registry
@pytest.mark.parametrize("name", list(PLANS))
def test_the_plan_holds_one_tensorflow(plans, name):
    plan = plans[name]
    assert "keras-vit" in plan and "keras" in plan
    assert len(plan & TENSORFLOW_DISTRIBUTIONS) == 1, sorted(plan & TENSORFLOW_DISTRIBUTIONS)
