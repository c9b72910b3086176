"""The training commands' error types and warnings: every failure the user can fix is a :class:`TrainingError`, a
:class:`keras_vit.cli.CommandError` (one line on stderr, exit status 1)."""

from __future__ import annotations

import sys

from keras_vit.cli import CommandError

__all__ = ["CorruptDataError", "DivergedError", "OutputDirError", "PreemptedError", "TrainingError", "warn"]


class TrainingError(CommandError):
    """A training run that cannot go on for a reason the user can fix."""


class DivergedError(TrainingError):
    """The loss (or the weights) became NaN or infinite."""


class PreemptedError(TrainingError):
    """The run was stopped by a signal (SIGTERM, SIGINT) after writing a checkpoint at the step it reached."""


class CorruptDataError(TrainingError, ValueError):
    """Image files that do not decode."""


class OutputDirError(TrainingError, ValueError):
    """An output folder a run may not use or clear."""


def warn(message: str) -> None:
    """One ``warning: ...`` line on stderr."""
    print(f"warning: {message}", file=sys.stderr, flush=True)
