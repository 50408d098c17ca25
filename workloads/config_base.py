"""The base of every model that reads a user's file (experiments, workloads, plans, sweeps, replays,
cost models, claims).

It lives with the workloads because they are the lowest layer that reads config files; ``sim``'s
config models build on it (the imports run one way: ``sim`` -> ``workloads``).

Pydantic's lax mode turns ``true`` into 1 for a number field: ``block_size: true`` would run with
blocks of one token and no word said. Booleans are refused wherever a number is expected (also
inside lists and mappings of numbers). Numeric strings (``"200"``, and ``1e6``, which YAML 1.1 reads
as a string) stay accepted: files with them have always worked.
"""

from __future__ import annotations

import types
import typing
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, model_validator

_NUMBERS = (int, float)


def _admits_bool(annotation: Any) -> bool:
    """Whether a field of this type may hold a boolean: it names bool (or Any, or a literal
    ``True``/``False``) itself or in a union, or no number at all (that type judges the value)."""
    members = _members(annotation)
    return any(_names_bool(member) for member in members) or not any(_is_number(m) for m in members)


def _members(annotation: Any) -> list[Any]:
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _members(typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return [member for argument in typing.get_args(annotation) for member in _members(argument)]
    return [annotation]


def _names_bool(annotation: Any) -> bool:
    if annotation is bool or annotation is Any:
        return True
    if typing.get_origin(annotation) is Literal:
        return any(isinstance(choice, bool) for choice in typing.get_args(annotation))
    return False


def _is_number(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, _NUMBERS) and annotation is not bool


def boolean_as_number(value: Any, annotation: Any) -> bool:
    """Whether ``value`` puts a boolean where ``annotation`` wants a number (one level into lists,
    tuples and mapping values, where config files keep numbers)."""
    if isinstance(value, bool):
        return not _admits_bool(annotation)
    for member in _members(annotation):
        origin = typing.get_origin(member)
        arguments = typing.get_args(member)
        if origin in (list, tuple) and isinstance(value, (list, tuple)) and arguments:
            items, element = list(value), arguments[0]
        elif origin is dict and isinstance(value, dict) and len(arguments) == 2:
            items, element = list(value.values()), arguments[1]
        else:
            continue
        if any(isinstance(item, bool) for item in items) and not _admits_bool(element):
            return True
    return False


class ConfigModel(BaseModel):
    """Subclasses set their own ``model_config`` (``extra="forbid"`` and so on); this base adds only
    the boolean rule."""

    @model_validator(mode="before")
    @classmethod
    def _no_boolean_as_number(cls, data: Any) -> Any:
        # (a model validator, not a field one: pydantic allows no `before` field validator on the
        # discriminator fields, `kind:`, that many of these models have)
        if not isinstance(data, dict):
            return data
        offenders = [
            f"{key}: {_shown(value)}"
            for key, value in data.items()
            if (field := cls._field_named(key)) is not None and boolean_as_number(value, field.annotation)
        ]
        if offenders:
            raise ValueError(f"{'; '.join(offenders)}: a boolean where a number is expected; give a number")
        return data

    @classmethod
    def _field_named(cls, key: Any) -> Any:
        if not isinstance(key, str):
            return None
        field = cls.model_fields.get(key)
        return field or next((f for f in cls.model_fields.values() if f.alias == key), None)


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {_shown(item)}" for key, item in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_shown(item) for item in value) + "]"
    return repr(value)
