"""The cyclic collector's threshold during runs (``sim/engine/gc_tuning.py``): raised for a run (the
rows handed over at its end included) and restored after it, and never lowered."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pandas as pd
import pytest

from policies import PoolSpec, make_policy
from sim.engine.core import Engine, EngineKnobs
from sim.engine.gc_tuning import YOUNG_COLLECTION_EVERY, fewer_collections
from sim.outputs.metrics import RequestRecord
from sim.outputs.sinks import MemorySink
from tests.engine_helpers import RoundCostModel, request


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


class _ThresholdAtHandOver(MemorySink):
    """A sink that notes the collector's young threshold whenever the engine hands it rows."""

    def __init__(self) -> None:
        super().__init__()
        self.thresholds: list[int] = []

    def write_requests(self, records: list[RequestRecord]) -> None:
        self.thresholds.append(gc.get_threshold()[0])
        super().write_requests(records)

    def write_timeseries(self, frame: pd.DataFrame) -> None:
        self.thresholds.append(gc.get_threshold()[0])
        super().write_timeseries(frame)


def test_a_run_hands_its_last_rows_over_with_the_raised_threshold() -> None:
    """The rows handed over when the clock stops (the requests table and the time series' last chunk,
    built while the whole run's objects are alive) are built inside the run's raised threshold, not
    after it; the threshold is Python's again once the run returns."""
    gc.set_threshold(700, 10, 10)
    sink = _ThresholdAtHandOver()
    engine = Engine(
        make_policy("paged", PoolSpec(160, 16, 128)),
        RoundCostModel(),
        EngineKnobs(max_model_len=128),
        iter([request(0, 0.0, 20, 3), request(1, 0.5, 10, 2)]),
        block_size=16,
        sink=sink,
    )
    engine.run()
    assert sink.thresholds == [YOUNG_COLLECTION_EVERY, YOUNG_COLLECTION_EVERY]  # requests, then rows
    assert gc.get_threshold() == (700, 10, 10)
    assert len(sink.records) == 2
