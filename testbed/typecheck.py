"""Check a dataclass's values against its field annotations, so a wrong type is refused naming the field
(`block_size: must be an integer, got '16'`) instead of failing later somewhere else."""

from __future__ import annotations

import dataclasses
import numbers
import types
import typing
from collections.abc import Mapping, Sequence


class FieldTypeError(TypeError, ValueError):
    """A value of the wrong type: a TypeError, and a ValueError for callers that refuse bad settings by that."""


def check_field_types(obj) -> None:
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if not _matches(value, hints[f.name]):
            raise FieldTypeError(f"{f.name}: must be {_describe(hints[f.name])}, got {value!r}")


def _options(annotation) -> tuple:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _matches(value, annotation) -> bool:
    for option in _options(annotation):
        origin = typing.get_origin(option) or option
        if option is typing.Any:
            return True
        if option is type(None) and value is None:
            return True
        if isinstance(value, bool):
            if origin is bool:
                return True
            continue
        if origin is int and isinstance(value, numbers.Integral):
            return True
        if origin is float and isinstance(value, numbers.Real):
            return True
        if origin is str and isinstance(value, str):
            return True
        if origin is dict and isinstance(value, Mapping):
            return True
        if origin in (list, tuple) and isinstance(value, Sequence) and not isinstance(value, str):
            (item,) = typing.get_args(option)[:1] or (typing.Any,)
            return all(_matches(v, item) for v in value)
        plain = (int, float, str, dict, list, tuple, bool, type(None))
        if isinstance(origin, type) and origin not in plain and isinstance(value, origin):
            return True
    return False


def _describe(annotation) -> str:
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string", dict: "a mapping"}
    parts = []
    for option in _options(annotation):
        origin = typing.get_origin(option) or option
        if option is type(None):
            parts.append("null")
        elif origin in (list, tuple):
            parts.append("a list")
        else:
            parts.append(names.get(origin, getattr(origin, "__name__", str(origin))))
    return " or ".join(parts)
