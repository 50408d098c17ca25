"""Reading sweep and plan files: YAML, pydantic errors in kvsim's style, key-path overrides.

Errors are ``sim/config.py``'s (:func:`sim.config.format_problems`): the file, the key path and
the value, and the nearest valid key (``axes.engine.blok_size`` is caught later, when the points
are validated, with the point named).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from sim.config import ConfigError, data_path, format_problems, models_in, yaml_mapping
from workloads.config_base import ConfigModel


class Strict(ConfigModel):
    # (Numbers are finite: an infinite one raised deep inside, or ran as NaN.)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, populate_by_name=True)


def read_yaml_mapping(path: Path, what: str) -> dict[str, Any]:
    """The top-level mapping of a YAML file, or a :class:`ConfigError` naming the file and line."""
    if not path.is_file():
        raise ConfigError(f"{path}: no such {what} file")
    return yaml_mapping(path)


def validate_file(model: type[BaseModel], data: dict[str, Any], path: Path, what: str) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise ConfigError(format_schema_error(error, path, data, model, what)) from None


def format_schema_error(
    error: ValidationError, path: Path, data: Any, model: type[BaseModel], what: str
) -> str:
    return format_problems(
        f"{path}: invalid {what}",
        error.errors(),
        location=lambda problem: data_path(
            problem["loc"], data, keep_last=problem["type"] in ("extra_forbidden", "missing")
        ),
        known_keys_at=lambda location: _fields_at(model, location),
    )


def _fields_at(model: type[BaseModel], location: list[Any]) -> list[str]:
    """Field names valid at ``location`` (walking nested models; list indexes are skipped)."""
    current: Any = model
    for part in location:
        if isinstance(part, int):
            continue
        field = _fields_by_key(current).get(part)
        if field is None:
            return []
        current = next(iter(models_in(field.annotation)), None)
        if current is None:
            return []
    return list(_fields_by_key(current))


def _fields_by_key(model: Any) -> dict[str, Any]:
    """A model's fields by the key a file gives them: the alias where one is set (``set``, ``zip``)."""
    return {field.alias or name: field for name, field in getattr(model, "model_fields", {}).items()}


def set_key_path(data: dict[str, Any], key_path: str, value: Any) -> None:
    """Set ``engine.block_size`` or ``variants.0.policy`` in a config mapping (creating mappings on
    the way, as ``--set`` does); a path through something that is not a mapping or list is an error."""
    keys = key_path.split(".")
    node: Any = data
    for depth, key in enumerate(keys[:-1]):
        node = _step(node, key, keys[: depth + 1])
    last = keys[-1]
    if isinstance(node, list):
        node[_index(node, last, keys)] = copy.deepcopy(value)
    elif isinstance(node, dict):
        node[last] = copy.deepcopy(value)
    else:
        raise KeyError(f"{'.'.join(keys[:-1])} holds {node!r}, not a mapping")


def _step(node: Any, key: str, so_far: list[str]) -> Any:
    if isinstance(node, list):
        return node[_index(node, key, so_far)]
    if isinstance(node, dict):
        child = node.setdefault(key, {})
        if child is None:
            child = node[key] = {}
        return child
    raise KeyError(f"{'.'.join(so_far[:-1])} holds {node!r}, not a mapping")


def _index(node: list[Any], key: str, so_far: list[str]) -> int:
    if not key.isdigit() or int(key) >= len(node):
        raise KeyError(f"{'.'.join(so_far)}: {key!r} is not an index of a list of {len(node)}")
    return int(key)
