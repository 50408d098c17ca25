"""The decode clock's small parts, against an independent method."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st


class _State:
    """Stands in for a RequestState: only its admission number is read."""

    def __init__(self, admission: int):
        self.admission = admission


@pytest.mark.python_sources  # hands the compiled function stand-ins for RequestState
@settings(deadline=None)
@given(st.lists(st.integers(0, 10_000), unique=True, max_size=40))
def test_sort_by_admission_is_sorted_by_admission(admissions):
    """Flush groups of any length (insertion sort up to 16, a keyed sort past it), sorted in place:
    the same objects in the order ``sorted`` gives their admission numbers (unique, as the engine's)."""
    from sim.engine.decoding import _sort_by_admission

    states = [_State(admission) for admission in admissions]
    expected = sorted(states, key=lambda state: state.admission)
    _sort_by_admission(states)
    assert [id(state) for state in states] == [id(state) for state in expected]
