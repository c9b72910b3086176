"""How every keras-vit command reports an error: one line ``error: ...`` on stderr and a documented exit status.

Exit statuses: 0 done; 1 an error the user can fix (:data:`REPORTED`); 2 a command line argparse refuses;
130 interrupted. ``--debug`` or ``KERAS_VIT_DEBUG=1`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator

__all__ = ["REPORTED", "CommandError", "add_debug_flag", "command_errors", "shown"]


class CommandError(Exception):
    """A failure a command reports in one line, raised where no built-in error type says it better."""


# What a command reports in one line (ImportError: an optional package not installed, naming the install).
REPORTED = (CommandError, ValueError, OSError, ImportError)


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
    """Turn :data:`REPORTED` errors into one line ``error: ...`` on stderr and exit status 1 (130 when
    interrupted), unless :func:`debugging`."""
    try:
        yield
    except REPORTED as error:
        if debugging(args):
            raise
        print(f"error: {' '.join(shown(error).split())}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        if debugging(args):
            raise
        print("interrupted", file=sys.stderr, flush=True)
        raise SystemExit(130) from None
