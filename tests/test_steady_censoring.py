"""A run stopped early (``sim/planning/sweeps/early_stop.py``) still measures what its unfinished
requests had waited: ``censored_at`` takes each one's latencies as they stood when the clock stopped
(lower bounds). Worked by hand on four requests."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from sim.planning.sweeps.steady import censored_at

NAN = math.nan


def requests() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "request_id": [0, 1, 2, 3],
            "arrival_s": [0.0, 1.0, 2.0, 3.0],
            "admitted_s": [0.5, 1.5, NAN, NAN],
            "first_token_s": [1.0, 2.0, NAN, NAN],
            "finish_s": [3.0, NAN, NAN, NAN],
            "outcome": ["finished", "unfinished", "unfinished", "rejected"],
            "output_tokens": [5, 5, 1, 5],
            "client_overhead_s": [0.1, 0.1, 0.1, 0.1],
        }
    )


def test_unfinished_requests_count_as_ending_when_the_clock_stopped():
    """Stopped at t=4. Request 0 finished: TTFT 1 + 0.1 client overhead, E2E 3.1, TPOT (3 - 1) / 4,
    queue 0.5. Request 1 had its first token at 2: it counts as finishing at 4 (E2E 3.1, TPOT
    (4 - 2) / 4). Request 2 was never admitted: admitted, first token and end all at 4 (queue 2, TTFT
    and E2E 2.1, no TPOT for one token). Request 3 was rejected: it stays so, without latencies."""
    original = requests()
    frame = censored_at(original, 4.0)
    assert list(frame["outcome"]) == ["finished", "finished", "finished", "rejected"]
    assert list(frame["finish_s"].iloc[:3]) == [3.0, 4.0, 4.0]
    assert frame["ttft_s"].tolist()[:3] == pytest.approx([1.1, 1.1, 2.1])
    assert frame["e2e_s"].tolist()[:3] == pytest.approx([3.1, 3.1, 2.1])
    assert frame["tpot_s"].tolist() == pytest.approx([0.5, 0.5, NAN, NAN], nan_ok=True)
    assert frame["queue_s"].tolist()[:3] == pytest.approx([0.5, 0.5, 2.0])
    assert frame[["ttft_s", "e2e_s", "queue_s"]].iloc[3].isna().all()
    assert frame["admitted_s"].tolist()[:3] == [0.5, 1.5, 4.0]
    assert frame["first_token_s"].tolist()[:3] == [1.0, 2.0, 4.0]
    # The caller's table is left as it was.
    pd.testing.assert_frame_equal(original, requests())
