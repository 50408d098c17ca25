"""The files a config reads, found by the schema's mark, and the config rewritten for another folder.

A relative path in a config is read against the config file's folder (then the project root), so a
config copied elsewhere, as a sweep or plan point's ``config.yaml``, reads other files or none. The
fields that may name a file carry :data:`workloads.config.FILE_FIELD` in their ``json_schema_extra``;
this walks a validated config for them, so a new path field is found once it is marked.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from workloads.config import FILE_FIELD

KeyPath = tuple[str | int, ...]


def file_references(config: BaseModel, where: KeyPath = ()) -> Iterator[tuple[KeyPath, str]]:
    """``(key path, value)`` of every marked field of ``config`` (nested models, lists and mappings
    included) whose value may be a path: a string, with one of the field's suffixes if it names any."""
    for name, field in type(config).model_fields.items():
        value = getattr(config, name)
        extra = field.json_schema_extra
        if isinstance(extra, dict) and FILE_FIELD in extra and isinstance(value, str):
            suffixes = extra[FILE_FIELD]
            if not suffixes or value.endswith(tuple(suffixes)):  # type: ignore[arg-type]
                yield (*where, name), value
        yield from _nested(value, (*where, name))


def _nested(value: Any, where: KeyPath) -> Iterator[tuple[KeyPath, str]]:
    if isinstance(value, BaseModel):
        yield from file_references(value, where)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _nested(item, (*where, index))
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _nested(item, (*where, key))


def relocated(data: dict[str, Any], config: BaseModel, from_dir: Path, to_dir: Path) -> dict[str, Any]:
    """A copy of ``data`` (a dump of ``config``, read from ``from_dir``) that reads the same files
    from ``to_dir``: each relative path that names a file in ``from_dir`` is rewritten relative to
    ``to_dir`` (absolute where none joins them, e.g. another drive). Names (presets, ``derated``) and
    paths found only under the project root are left as they are: they resolve from anywhere."""
    moved = copy.deepcopy(data)
    for key_path, value in file_references(config):
        path = Path(value).expanduser()
        if path.is_absolute() or not (from_dir / path).is_file():
            continue
        target = os.path.abspath(from_dir / path)
        try:
            new_value = os.path.relpath(target, os.path.abspath(to_dir))
        except ValueError:  # Windows: no relative path between drives
            new_value = target
        _set(moved, key_path, Path(new_value).as_posix())
    return moved


def _set(data: Any, key_path: KeyPath, value: str) -> None:
    node = data
    for key in key_path[:-1]:
        node = node[key]
    node[key_path[-1]] = value
