"""The cyclic collector's threshold during runs (``sim/engine/gc_tuning.py``): raised for a run and
restored after it, and never lowered."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from sim.engine.gc_tuning import YOUNG_COLLECTION_EVERY, fewer_collections


@pytest.fixture(autouse=True)
def _restore_thresholds() -> Iterator[None]:
    saved = gc.get_threshold()
    yield
    gc.set_threshold(*saved)


def test_a_run_raises_the_threshold_and_restores_it_afterwards() -> None:
    gc.set_threshold(700, 10, 10)
    with fewer_collections():
        assert gc.get_threshold() == (YOUNG_COLLECTION_EVERY, 10, 10)
    assert gc.get_threshold() == (700, 10, 10)


@pytest.mark.parametrize("first", [0, 5 * YOUNG_COLLECTION_EVERY])
def test_a_larger_threshold_or_a_disabled_collector_is_left_as_it_is(first: int) -> None:
    gc.set_threshold(first, 10, 10)
    with fewer_collections():
        assert gc.get_threshold() == (first, 10, 10)
    assert gc.get_threshold() == (first, 10, 10)
