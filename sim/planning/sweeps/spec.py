"""Sweep files: the schema, axis expansion, and every point validated before anything runs.

A sweep names a base experiment (``base: path.yaml`` or an inline ``experiment:``) and axes over
config key paths. Axes combine as a cartesian product; a ``zip:`` group moves its keys together and
counts as one axis::

    name: block-sizes
    base: ../quickstart.yaml
    set: {workload.num_requests: 300}          # fixed overrides of the base
    axes:
      engine.block_size: [16, 32]
      workload.arrival.rate_per_s: {from: 1, to: 4, steps: 4}   # log: true for geometric steps
      seed: [1, 2]
    zip:
      - {gpu: [A100-80GB, H100-80GB], engine.gpu_memory_utilization: [0.9, 0.92]}

Each point is one experiment (all its variants replay one request stream). A point's id is a hash of
its resolved config, the folder its relative paths are read from, and the kvsim version.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from sim.config import (
    ConfigError,
    ExperimentConfig,
    apply_overrides,
    validate_experiment,
    with_override_notes,
)
from sim.planning.schema import Strict, read_yaml_mapping, set_key_path, validate_file
from sim.storage.folders import config_hash, kvsim_version


class RangeAxis(Strict):
    """An axis (of ``axes`` or of a ``zip`` group) as a range instead of a list of values:
    ``{from: 1, to: 20, steps: 8}``, evenly spaced values, both ends included (``log: true``:
    geometric spacing; ``integer: true``: rounded to whole numbers)."""

    start: float = Field(alias="from", description="First value.")
    to: float = Field(description="Last value.")
    steps: int = Field(ge=2, description="Number of values, both ends included.")
    log: bool = Field(False, description="Geometric spacing (a constant ratio) instead of even steps.")
    integer: bool = Field(False, description="Round every value to a whole number.")

    @model_validator(mode="after")
    def _positive_for_log(self) -> RangeAxis:
        if self.log and (self.start <= 0 or self.to <= 0):
            raise ValueError("a log range needs `from` and `to` > 0")
        return self

    def values(self) -> list[Any]:
        if self.log:
            ratio = (self.to / self.start) ** (1 / (self.steps - 1))
            raw = [self.start * ratio**i for i in range(self.steps)]
        else:
            step = (self.to - self.start) / (self.steps - 1)
            raw = [self.start + step * i for i in range(self.steps)]
        raw[-1] = self.to  # no rounding drift at the end the user wrote
        if self.integer:
            return [int(round(value)) for value in raw]
        return [_tidy(value) for value in raw]


def _tidy(value: float) -> float:
    """10 significant digits: 1.7142857142857142 and 1.7142857143 are the same request rate."""
    return float(f"{value:.10g}")


AxisSpec = list[Any] | RangeAxis

NAME_PATTERN = r"^[A-Za-z0-9_.-]+$"


class SweepSpec(Strict):
    name: str | None = Field(
        None,
        pattern=NAME_PATTERN,
        description="Also the default output folder name. Default: the sweep file's name without its "
        "extension (`block-size-rate` for block-size-rate.yaml).",
    )
    description: str = Field("", description="Free text, for the reader of the sweep file.")
    base: str | None = Field(None, description="The base experiment YAML, relative to this file.")
    experiment: dict[str, Any] | None = Field(None, description="The base experiment, inline.")
    overrides: dict[str, Any] = Field(
        default_factory=dict,
        alias="set",
        description="Fixed overrides of the base experiment, key path -> value, e.g. "
        "workload.num_requests: 300.",
    )
    axes: dict[str, AxisSpec] = Field(
        default_factory=dict,
        description="Key path -> the values it takes (a list, or a range): the points are every "
        "combination of the axes (first axis slowest).",
    )
    zip_groups: list[dict[str, AxisSpec]] = Field(
        default_factory=list,
        alias="zip",
        description="Groups of key paths whose values move together (the n-th value of each at once); "
        "each group counts as one axis of the product.",
    )

    @model_validator(mode="after")
    def _one_base(self) -> SweepSpec:
        if (self.base is None) == (self.experiment is None):
            raise ValueError("give exactly one of `base` (a path) or `experiment` (inline)")
        return self

    @field_validator("axes")
    @classmethod
    def _non_empty_axes(cls, axes: dict[str, AxisSpec]) -> dict[str, AxisSpec]:
        for key, values in axes.items():
            if isinstance(values, list) and not values:
                raise ValueError(f"axis {key!r} is empty: give at least one value")
        return axes

    @field_validator("zip_groups")
    @classmethod
    def _zip_lengths(cls, groups: list[dict[str, AxisSpec]]) -> list[dict[str, AxisSpec]]:
        for number, group in enumerate(groups):
            lengths = {key: len(_values(spec)) for key, spec in group.items()}
            if not group or 0 in lengths.values():
                raise ValueError(f"zip group {number} is empty: {lengths}")
            if len(set(lengths.values())) > 1:
                raise ValueError(f"zip group {number}: its keys must have as many values each, got {lengths}")
        return groups

    @model_validator(mode="after")
    def _keys_once(self) -> SweepSpec:
        keys = list(self.axes) + [key for group in self.zip_groups for key in group]
        repeated = sorted({key for key in keys if keys.count(key) > 1})
        if repeated:
            raise ValueError(f"a key may be swept by one axis only; repeated: {', '.join(repeated)}")
        return self


def _values(spec: AxisSpec) -> list[Any]:
    return spec.values() if isinstance(spec, RangeAxis) else list(spec)


@dataclass(frozen=True)
class Axis:
    """One dimension of the product: a single key, or the keys of a zip group moving together."""

    keys: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]


def axes_of(spec: SweepSpec) -> list[Axis]:
    axes = [Axis((key,), tuple((value,) for value in _values(values))) for key, values in spec.axes.items()]
    for group in spec.zip_groups:
        columns = [_values(values) for values in group.values()]
        axes.append(Axis(tuple(group), tuple(zip(*columns, strict=True))))
    return axes


def combinations(axes: list[Axis]) -> list[dict[str, Any]]:
    """The cartesian product, first axis slowest, as ``{key path: value}`` per point."""
    points = []
    for rows in itertools.product(*(axis.rows for axis in axes)):
        values: dict[str, Any] = {}
        for axis, row in zip(axes, rows, strict=True):
            values.update(zip(axis.keys, row, strict=True))
        points.append(values)
    return points


@dataclass(frozen=True)
class Point:
    """One experiment of a sweep: its axis values, its validated config and its id."""

    index: int
    point_id: str
    values: dict[str, Any]
    config: ExperimentConfig
    base_dir: Path

    def label(self) -> str:
        return ", ".join(f"{key}={shown(value)}" for key, value in self.values.items()) or "(no axes)"


def shown(value: Any) -> str:
    """An axis value as a table cell or label: scalars as they are, the rest as compact JSON."""
    if isinstance(value, str | int | float | bool) or value is None:
        return str(value)
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def point_id(config: ExperimentConfig, base_dir: Path) -> str:
    return config_hash(
        {
            "config": config.model_dump(mode="json"),
            "base_dir": str(base_dir.resolve()),
            "kvsim": kvsim_version(),
        }
    )


def make_point(index: int, base: dict[str, Any], values: dict[str, Any], base_dir: Path, where: str) -> Point:
    """Apply ``values`` to a copy of ``base`` and validate it; errors name the point, key and value."""
    data = copy.deepcopy(base)
    label = ", ".join(f"{key}={shown(value)}" for key, value in values.items()) or "(no axes)"
    for key, value in values.items():
        try:
            set_key_path(data, key, value)
        except KeyError as error:
            raise ConfigError(
                f"{where}: point {index} ({label}): key path {key!r} = {shown(value)}: {error.args[0]}"
            ) from None
    config = validate_experiment(data, f"{where}: point {index} ({label})")
    return Point(index, point_id(config, base_dir), values, config, base_dir)


@dataclass(frozen=True)
class Sweep:
    spec: SweepSpec
    path: Path
    points: list[Point]
    axis_keys: list[str]

    @property
    def name(self) -> str:
        """The sweep's name: its ``name:``, which loading fills in from the file name when omitted."""
        assert self.spec.name is not None, "load_sweep_spec names every sweep"
        return self.spec.name

    def digest(self) -> str:
        return config_hash({"spec": self.spec.model_dump(mode="json", by_alias=True), "points": self.ids()})

    def ids(self) -> list[str]:
        return [point.point_id for point in self.points]


def load_sweep_spec(path: str | Path, overrides: list[str] | None = None) -> Sweep:
    """Read a sweep file, expand its axes and validate every point (and preflight it: hardware, pool,
    policy options, cost model, workload files) before anything runs."""
    from sim.planning.sweeps.preflight import preflight

    path = Path(path)
    data = read_yaml_mapping(path, "sweep")
    _name_after_the_file(data, path)
    spec: SweepSpec = validate_file(SweepSpec, data, path, "sweep file")
    base, base_dir = _base_experiment(spec, path)
    for key, value in spec.overrides.items():
        _set_or_fail(base, key, value, f"{path}: set.{key}")
    apply_overrides(base, overrides or [])  # kvsim run's --set, applied to the base experiment
    axes = axes_of(spec)
    try:
        points = [
            make_point(index, base, values, base_dir, str(path))
            for index, values in enumerate(combinations(axes))
        ]
        for point in points:
            preflight(point.config, point.base_dir, f"{path}: point {point.index} ({point.label()})")
    except ConfigError as error:
        raise ConfigError(with_override_notes(str(error), overrides or [])) from None
    return Sweep(spec, path, points, [key for axis in axes for key in axis.keys])


def _name_after_the_file(data: dict[str, Any], path: Path) -> None:
    """A sweep without ``name:`` is named after its file, as earlier versions' sweep files without
    one expect (the name is the default results folder, so the file's name must be usable as one)."""
    if "name" in data:
        return
    if not re.fullmatch(NAME_PATTERN, path.stem):
        raise ConfigError(
            f"{path}: name: required key is missing, and the file's name {path.stem!r} cannot stand in "
            "for it (a folder name: letters, digits, '-', '_' and '.'); add `name:`"
        )
    data["name"] = path.stem


def _set_or_fail(data: dict[str, Any], key: str, value: Any, where: str) -> None:
    try:
        set_key_path(data, key, value)
    except KeyError as error:
        raise ConfigError(f"{where}: {error.args[0]}") from None


def _base_experiment(spec: SweepSpec, path: Path) -> tuple[dict[str, Any], Path]:
    if spec.experiment is not None:
        return copy.deepcopy(spec.experiment), path.parent
    assert spec.base is not None
    base_path = (path.parent / spec.base).resolve()
    if not base_path.is_file():
        raise ConfigError(f"{path}: base: {spec.base!r}: no such experiment file ({base_path})")
    return read_yaml_mapping(base_path, "experiment"), base_path.parent
