"""The training commands' error types, warnings, and how a command reports an error: one line, non-zero exit.

Every failure the user can fix (a diverged run, corrupt data, an output folder that is not a run's,
no intact checkpoint) is a :class:`TrainingError`. The commands turn it, and a ``ValueError`` or
``OSError`` (bad settings, missing files), into one line ``error: ...`` on stderr and exit status 1;
``--debug`` or ``KERAS_VIT_DEBUG=1`` lets the traceback through instead.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator

__all__ = [
    "CommandErrors",
    "CorruptDataError",
    "DivergedError",
    "OutputDirError",
    "TrainingError",
    "add_debug_flag",
    "command_errors",
    "warn",
]


class TrainingError(Exception):
    """A training run that cannot go on for a reason the user can fix."""


class DivergedError(TrainingError):
    """The loss (or the weights) became NaN or infinite."""


class CorruptDataError(TrainingError, ValueError):
    """Image files that do not decode."""


class OutputDirError(TrainingError, ValueError):
    """An output folder a run may not use or clear."""


CommandErrors = (TrainingError, ValueError, OSError)  # what a command reports in one line


def warn(message: str) -> None:
    """One ``warning: ...`` line on stderr."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


def add_debug_flag(parser: argparse.ArgumentParser) -> None:
    """``--debug``: show the traceback of an error (as ``KERAS_VIT_DEBUG=1`` does)."""
    parser.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,  # absent options stay absent
        help="show the traceback of an error (or KERAS_VIT_DEBUG=1)",
    )


@contextlib.contextmanager
def command_errors(args: argparse.Namespace | None = None) -> Iterator[None]:
    """Turn :data:`CommandErrors` into one line on stderr and exit status 1 (130 when interrupted), unless
    ``args`` has ``debug`` set or ``KERAS_VIT_DEBUG`` is."""
    debug = getattr(args, "debug", False) or os.environ.get("KERAS_VIT_DEBUG", "") not in ("", "0")
    try:
        yield
    except CommandErrors as error:
        if debug:
            raise
        print(f"error: {' '.join(str(error).split())}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        if debug:
            raise
        print("interrupted", file=sys.stderr, flush=True)
        raise SystemExit(130) from None
