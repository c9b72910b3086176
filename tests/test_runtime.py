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

pytestmark = pytest.mark.skipif(
    platform.machine().lower() not in X86_64, reason="keras_vit only turns oneDNN on for x86-64"
)

PROBE = """
import json, os, sys
{imports}
from keras_vit import runtime
print(json.dumps({{"variable": os.environ.get("{variable}"), "onednn": runtime.onednn_enabled()}}))
"""


def _probe(imports: str, variable: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != ONEDNN_VARIABLE}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow")
    if variable is not None:
        env[ONEDNN_VARIABLE] = variable
    probe = PROBE.format(imports=imports, variable=ONEDNN_VARIABLE)
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_keras_vit_first_turns_onednn_on():
    assert _probe("import keras_vit", None) == {"variable": "1", "onednn": True}


def test_the_users_choice_is_kept():
    assert _probe("import keras_vit", "0") == {"variable": "0", "onednn": False}


def test_nothing_changes_once_tensorflow_is_loaded():
    # Too late to choose: TensorFlow read the variable when it loaded; keras_vit leaves it unset
    # rather than pretend. (TensorFlow's own default on this CPU decides.)
    result = _probe("import tensorflow\nimport keras_vit", None)
    assert result["variable"] is None


def test_the_training_command_gets_onednn_too():
    # training/finetune.py imports Keras before keras_vit; the package's __init__ comes first.
    assert _probe("import keras_vit.training.finetune", None) == {"variable": "1", "onednn": True}
