"""The cyclic collector's threshold during runs (``sim/engine/gc_tuning.py``): raised for a run and
restored after it, raised for good in a process that only runs points (a plan's or sweep's local
worker), and never lowered."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from sim.engine.gc_tuning import YOUNG_COLLECTION_EVERY, collect_less_often, fewer_collections


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


def test_a_worker_keeps_the_raised_threshold_after_its_points() -> None:
    gc.set_threshold(700, 10, 10)
    collect_less_often()
    assert gc.get_threshold() == (YOUNG_COLLECTION_EVERY, 10, 10)
    with fewer_collections():
        pass
    assert gc.get_threshold() == (YOUNG_COLLECTION_EVERY, 10, 10)


@pytest.mark.parametrize("first", [0, 5 * YOUNG_COLLECTION_EVERY])
def test_a_larger_threshold_or_a_disabled_collector_is_left_as_it_is(first: int) -> None:
    gc.set_threshold(first, 10, 10)
    collect_less_often()
    with fewer_collections():
        assert gc.get_threshold() == (first, 10, 10)
    assert gc.get_threshold() == (first, 10, 10)


def test_local_workers_start_with_the_raised_threshold() -> None:
    """The executor's worker initializer raises it (run here, in this process: it also ignores
    Ctrl-C, restored afterwards, and gives tqdm a thread lock, which this process may keep)."""
    import signal

    from sim.planning.sweeps.executors import _start_worker

    handler = signal.getsignal(signal.SIGINT)
    gc.set_threshold(700, 10, 10)
    try:
        _start_worker()
    finally:
        signal.signal(signal.SIGINT, handler)
    assert gc.get_threshold()[0] == YOUNG_COLLECTION_EVERY
