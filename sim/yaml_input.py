"""YAML as kvsim reads a user's files: PyYAML's safe loader, plus the keys a mapping repeats.

YAML lets a mapping repeat a key and keeps the last value: a config that says ``engine:`` twice runs
with the second section only, and nothing tells its author. :func:`load_yaml` loads as
``yaml.safe_load`` does and also returns each repeated key with the lines of its first and its
repeated occurrence, so that the caller can say so (``sim.config.yaml_mapping`` warns).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode
from yaml.resolver import BaseResolver

__all__ = ["RepeatedKey", "load_yaml"]


@dataclass(frozen=True)
class RepeatedKey:
    key: Any
    first_line: int  # 1-based
    repeated_line: int


class _Loader(yaml.SafeLoader):
    def __init__(self, stream: str):
        super().__init__(stream)
        self.repeated: list[RepeatedKey] = []


def _construct_mapping(loader: _Loader, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
    first_lines: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # (`<<: *base`: overriding the merged keys is what it is for)
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, Hashable):
            continue  # (the safe constructor refuses an unhashable key itself, with its line)
        line = key_node.start_mark.line + 1
        if key in first_lines:
            loader.repeated.append(RepeatedKey(key, first_lines[key], line))
        else:
            first_lines[key] = line
    return SafeConstructor.construct_mapping(loader, node, deep=deep)


_Loader.add_constructor(BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml(text: str) -> tuple[Any, list[RepeatedKey]]:
    """``yaml.safe_load(text)``, and every key a mapping repeats (the value kept is the last one's).
    Raises what ``yaml.safe_load`` raises."""
    loader = _Loader(text)
    try:
        data = loader.get_single_data()
    finally:
        loader.dispose()
    return data, loader.repeated
