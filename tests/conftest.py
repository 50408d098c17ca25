"""The suite runs the Python sources unless ``KVSIM_NATIVE=1`` asks for the compiled build
(``make test`` runs it both ways: sim/native/__init__.py). Set before anything imports ``sim``."""

from __future__ import annotations

import os

os.environ.setdefault("KVSIM_NATIVE", "0")

import pytest  # noqa: E402

from sim.native import engine_build  # noqa: E402


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under the compiled build, skip the tests that need the Python sources (they subclass compiled
    classes, deep-copy them or build them without their constructor: test instruments, not uses)."""
    if engine_build() != "native":
        return
    skip = pytest.mark.skip(reason="needs the Python sources (compiled build running)")
    for item in items:
        if item.get_closest_marker("python_sources"):
            item.add_marker(skip)
