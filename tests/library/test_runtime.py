"""``import keras_vit`` asks TensorFlow for its oneDNN CPU kernels, unless the user chose or it is too late.

Each case runs in a fresh interpreter: the choice is made once, when TensorFlow loads.
"""

import json
import os
import platform
import subprocess
import sys

import pytest

from keras_vit.runtime import ONEDNN_VARIABLE, X86_64

pytestmark = [
    pytest.mark.backends("tensorflow"),  # TensorFlow's CPU kernels
    pytest.mark.skipif(platform.machine().lower() not in X86_64, reason="keras_vit only turns oneDNN on for x86-64"),
]

PROBE = """
import json, os, sys
{imports}
from keras_vit import runtime
print(json.dumps({{"variable": os.environ.get("{variable}"), "onednn": runtime.onednn_enabled()}}))
"""


CASES = {
    "first": ("import keras_vit", None),
    "users_choice": ("import keras_vit", "0"),
    "too_late": ("import tensorflow\nimport keras_vit", None),
    "training": ("import keras_vit.training.finetune", None),
}


def _start(imports: str, variable: str | None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != ONEDNN_VARIABLE}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow")
    if variable is not None:
        env[ONEDNN_VARIABLE] = variable
    probe = PROBE.format(imports=imports, variable=ONEDNN_VARIABLE)
    return subprocess.Popen(
        [sys.executable, "-c", probe], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.fixture(scope="module")
def probes() -> dict[str, dict]:
    """Every case's fresh interpreter, started together (each spends its time importing TensorFlow)."""
    started = {name: _start(*case) for name, case in CASES.items()}
    results = {}
    for name, process in started.items():
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, f"probe {name!r} failed:\n{err}"
        results[name] = json.loads(out.strip().splitlines()[-1])
    return results


def test_importing_keras_vit_first_turns_onednn_on(probes):
    assert probes["first"] == {"variable": "1", "onednn": True}


def test_the_users_choice_is_kept(probes):
    assert probes["users_choice"] == {"variable": "0", "onednn": False}


def test_nothing_changes_once_tensorflow_is_loaded(probes):
    # Too late to choose: TensorFlow read the variable when it loaded; keras_vit leaves it unset
    # rather than pretend. (TensorFlow's own default on this CPU decides.)
    assert probes["too_late"]["variable"] is None


def test_the_training_command_gets_onednn_too(probes):
    # training/finetune.py imports Keras before keras_vit; the package's __init__ comes first.
    assert probes["training"] == {"variable": "1", "onednn": True}
