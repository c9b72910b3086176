"""What every keras-vit command shares: its errors, its help and a quiet TensorFlow; imports no Keras.
Errors are one line and an exit status (0, 1 :data:`REPORTED`, 2, 130; ``--debug``): docs/faults.md."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator

__all__ = [
    "LIBRARY_MEMORY",
    "OUT_OF_MEMORY",
    "REPORTED",
    "TF_LOG_VARIABLE",
    "CommandError",
    "HelpFormatter",
    "add_debug_flag",
    "command_errors",
    "for_weights",
    "load_tensorflow",
    "shown",
]

TF_LOG_VARIABLE = "TF_CPP_MIN_LOG_LEVEL"
# A native log line of TensorFlow, XLA or absl (``I0000 00:00:1796497747.640030   23299 port.cc:153] ...``), absl's
# notice before them, and the second line of TensorFlow's CPU-feature notice.
NATIVE_LOG = re.compile(
    r"[IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [\w.-]+:\d+\] "
    r"|WARNING: All log messages before absl::InitializeLog\(\) is called"
    r"|To enable the following instructions: .* rebuild TensorFlow"
)


class CommandError(Exception):
    """A failure a command reports in one line, raised where no built-in error type says it better."""


# What a command reports in one line (ImportError: an optional package not installed, naming the install).
REPORTED = (CommandError, ValueError, OSError, ImportError)


# A MemoryError without a message (most of Python's): what a command says for it.
OUT_OF_MEMORY = (
    "out of memory (MemoryError): the command needs more than this process may allocate; free memory, raise the "
    "limit (ulimit -v, the container's) or give it less work (a smaller batch, fewer or smaller images)"
)


# The dynamic loader's words when a shared library (TensorFlow's, 1 GB of address space) does not fit the process.
_LIBRARY_UNMAPPED = ("failed to map segment", "cannot allocate memory")
LIBRARY_MEMORY = (
    "a shared library did not fit in the memory this process may use: raise the limit (ulimit -v, the container's) "
    "or free memory"
)


def add_debug_flag(parser: argparse.ArgumentParser) -> None:
    """``--debug``: show the traceback of an error (as ``KERAS_VIT_DEBUG=1`` does)."""
    parser.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,  # absent options stay absent
        help="show the traceback of an error (or KERAS_VIT_DEBUG=1)",
    )


def debugging(args: argparse.Namespace | None = None) -> bool:
    """Whether ``--debug`` or ``KERAS_VIT_DEBUG`` asks for tracebacks."""
    return getattr(args, "debug", False) or os.environ.get("KERAS_VIT_DEBUG", "") not in ("", "0")


def shown(error: BaseException) -> str:
    """An error's message as a command shows it: its ``command_line`` text where it has one (a flag, ``--weights
    PATH``, where Python's says an argument, ``weights='PATH'``), else ``str(error)``."""
    return getattr(error, "command_line", None) or str(error)


@contextlib.contextmanager
def command_errors(args: argparse.Namespace | None = None) -> Iterator[None]:
    """Turn :data:`REPORTED` errors and a ``MemoryError`` (:data:`OUT_OF_MEMORY` when it has no message; a library
    the loader could not map gains :data:`LIBRARY_MEMORY`) into one line ``error: ...`` on stderr and exit status 1
    (130 when interrupted), unless :func:`debugging`."""
    try:
        yield
    except (*REPORTED, MemoryError, KeyboardInterrupt) as error:
        if debugging(args):
            raise
        if isinstance(error, KeyboardInterrupt):
            print("interrupted", file=sys.stderr, flush=True)
            raise SystemExit(130) from None
        message = shown(error) or (OUT_OF_MEMORY if isinstance(error, MemoryError) else type(error).__name__)
        if isinstance(error, ImportError) and any(words in message.lower() for words in _LIBRARY_UNMAPPED):
            message = f"{message} ({LIBRARY_MEMORY})"
        print(f"error: {' '.join(message.split())}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


@contextlib.contextmanager
def for_weights(weights: str) -> Iterator[None]:
    """An ``OSError`` or ``ValueError`` of the block (reading or finding checkpoint ``weights``) as a
    :class:`CommandError` ``weights 'NAME': ...``."""
    try:
        yield
    except (OSError, ValueError) as exc:  # missing file, unknown name, failed download (zoo.DownloadError)
        raise CommandError(f"weights {weights!r}: {shown(exc)}") from exc


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help with ``(default: ...)`` after an option whose help names no default and whose default is
    set (not ``None``, not a flag's ``False``)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        shown = action.default not in (None, False, argparse.SUPPRESS) and action.nargs != 0
        return f"{text} (default: %(default)s)".strip() if shown and "default" not in text.lower() else action.help


def load_tensorflow() -> None:
    """Import TensorFlow and Keras and find the devices, without TensorFlow's start-up lines on stderr (its native
    log lines, :data:`NATIVE_LOG`; TensorFlow writes them before it reads any setting), and set
    ``TF_CPP_MIN_LOG_LEVEL=1`` (no INFO lines after). A ``TF_CPP_MIN_LOG_LEVEL`` the user set keeps every line."""
    if TF_LOG_VARIABLE in os.environ or "tensorflow" in sys.modules:
        return
    os.environ[TF_LOG_VARIABLE] = "1"
    with _native_log_dropped():
        import keras
        import tensorflow as tf

        tf.config.list_physical_devices()  # CUDA's start, and its error on a machine without a GPU
        del keras


@contextlib.contextmanager
def _native_log_dropped() -> Iterator[None]:
    """Send file descriptor 2 to a file while the block runs, then write what it got to stderr less the lines of
    :data:`NATIVE_LOG` (a Python traceback or warning of the block passes)."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to filter
        yield
        return
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            lines = captured.read().decode("utf-8", "replace").splitlines(keepends=True)
            kept = "".join(line for line in lines if not NATIVE_LOG.match(line))
            if kept:
                sys.stderr.write(kept)
                sys.stderr.flush()
