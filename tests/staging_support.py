"""A staging folder (:mod:`keras_vit.staging`) left by a real process killed with SIGKILL while it staged: what the
next run of a command finds after ``kill -9``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

# A child Python that stages a half-written file through the library, then kills itself at that point.
_KILLED = """
import os, sys
from keras_vit.staging import new_staging
staging = new_staging(sys.argv[1], sys.argv[2])
(staging / "half-written").write_bytes(bytes(1000))
os.kill(os.getpid(), 9)
"""


def killed_staging(parent: str | os.PathLike, prefix: str) -> Path:
    """The staging folder of ``prefix`` that a child process made in ``parent`` before it was killed (SIGKILL)."""
    os.makedirs(parent, exist_ok=True)
    before = set(os.listdir(parent))
    child = subprocess.run([sys.executable, "-c", _KILLED, str(parent), prefix], capture_output=True, timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()
    (left,) = set(os.listdir(parent)) - before
    return Path(parent, left)
