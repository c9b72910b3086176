"""Dataclass fields that carry their own help (:func:`option`), and the ``argparse`` options generated from them
(:func:`add_arguments`). Plain Python. See docs/design.md."""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = ["add_arguments", "flag_name", "given", "option", "option_fields"]


def option(
    help: str,
    default: Any = None,
    *,
    unset: str | None = None,
    choices: Sequence | None = None,
    flag: str | None = None,
    parse: Callable[[str], Any] | None = None,
    **extra: Any,
) -> Any:
    """A dataclass field with its help: ``unset`` (what ``None`` means), ``choices``, ``flag`` (the option's
    name), ``parse`` (text to value); ``default=dataclasses.MISSING`` makes it required; ``extra`` goes to the metadata.
    """
    metadata = dict(help=help, unset=unset, choices=tuple(choices) if choices else None, flag=flag, parse=parse)
    return dataclasses.field(default=default, metadata={**metadata, **extra})


def option_fields(cls) -> Iterator[dataclasses.Field]:
    """The fields of ``cls`` declared with :func:`option`."""
    return (f for f in dataclasses.fields(cls) if "help" in f.metadata)


def flag_name(field: dataclasses.Field) -> str:
    """The option's name with underscores (``"batch_size"`` for ``--batch-size``)."""
    return field.metadata.get("flag") or field.name


def _pair(kinds: tuple[type, ...]) -> Callable[[str], tuple]:
    def parse(text: str) -> tuple:
        parts = text.split(",")
        if len(parts) != len(kinds):
            raise argparse.ArgumentTypeError(f"expected {len(kinds)} comma-separated values, got {text!r}")
        return tuple(kind(part) for kind, part in zip(kinds, parts))

    return parse


def _value_type(hint: Any) -> Any:
    """``int | None`` -> ``int``; other annotations unchanged."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        kinds = [a for a in typing.get_args(hint) if a is not type(None)]
        return kinds[0] if len(kinds) == 1 else hint
    return hint


def _show(value: Any) -> str:
    if isinstance(value, tuple):  # as typed: 0.05,1
        return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
    return str(value)


def _help(field: dataclasses.Field, default: Any) -> str:
    text = field.metadata["help"]
    shown = field.metadata["unset"] if default is None else _show(default)
    return (f"{text} (default: {shown})" if shown is not None else text).replace("%", "%%")


def add_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup, defaults: Any) -> None:
    """One option per :func:`option` field of the dataclass instance ``defaults`` (whose values the help shows)."""
    hints = typing.get_type_hints(type(defaults))
    for field in option_fields(type(defaults)):
        kind = _value_type(hints[field.name])
        name = flag_name(field)
        settings: dict[str, Any] = dict(
            dest=name, default=argparse.SUPPRESS, help=_help(field, getattr(defaults, field.name))
        )
        if kind is bool:
            settings["action"] = argparse.BooleanOptionalAction
        else:
            if "metavar" in field.metadata:
                settings["metavar"] = field.metadata["metavar"]
            elif typing.get_origin(kind) is tuple:
                settings["metavar"] = ",".join(k.__name__.upper() for k in typing.get_args(kind))
            settings["type"] = field.metadata["parse"] or (
                _pair(typing.get_args(kind)) if typing.get_origin(kind) is tuple else kind
            )
            if field.metadata["choices"]:
                settings["choices"] = field.metadata["choices"]
        parser.add_argument(f"--{name.replace('_', '-')}", **settings)


def given(namespace: argparse.Namespace, cls) -> dict[str, Any]:
    """``{field name: value}`` of the options of ``cls`` that the command line gave."""
    values = vars(namespace)
    return {f.name: values[flag_name(f)] for f in option_fields(cls) if flag_name(f) in values}
