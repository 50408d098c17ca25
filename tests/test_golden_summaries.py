"""Every shipped experiment config, shortened (and five of them in a tight pool), and the four
shipped replays give exactly the summaries, per-request tables and time series recorded in
tests/golden/summaries.json: recorded before the engine was split into parts (issue "The engine as
parts"), and identical since, with the Python sources and with the compiled build. A change meant to move results regenerates the file
(``python -m tools.golden_summaries``) and its diff shows what moved."""

from __future__ import annotations

import json

import pytest

from tools import golden_summaries


@pytest.mark.slow
@pytest.mark.timeout(600)  # 19 runs of 150 requests and 4 replays of 300: about 25 s on one idle core
def test_every_shipped_config_gives_its_golden_summary():
    golden = json.loads(golden_summaries.GOLDEN.read_text())
    current = golden_summaries.generate()
    assert sorted(current) == sorted(golden)
    for key, variants in golden.items():
        for name, expected in variants.items():
            got = current[key][name]
            moved = {
                field: (expected["summary"][field], got["summary"].get(field))
                for field in expected["summary"]
                if got["summary"].get(field) != expected["summary"][field]
            }
            assert moved == {}, f"{key}: {name}: summary fields moved"
            assert (got["requests"], got["timeseries"]) == (expected["requests"], expected["timeseries"]), (
                f"{key}: {name}: the per-request table or the time series moved"
            )


def test_the_checksum_sees_one_bit():
    import pandas as pd

    frame = pd.DataFrame({"a": [1.0, 2.0], "b": ["x", "y"]})
    nudged = frame.copy()
    nudged.loc[1, "a"] = 2.0000000000000004  # the next float after 2.0
    assert golden_summaries.table_checksum(frame) == golden_summaries.table_checksum(frame.copy())
    assert golden_summaries.table_checksum(frame) != golden_summaries.table_checksum(nudged)
    assert golden_summaries.table_checksum(frame) != golden_summaries.table_checksum(frame[::-1])
