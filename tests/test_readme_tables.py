"""The README's tables of simulated figures are what the shipped configs give today (they used to
drift: the `radix` against `prefix` L4 row printed 29.91 / 19.36 / 18.61 % while the config gave
29.37 / 19.11 / 18.96 %)."""

from __future__ import annotations

import pytest

from tools import readme_tables


def test_the_markers_hold_a_table_and_rewriting_keeps_the_rest():
    text = "intro\n<!-- kvsim:generated radix-vs-prefix -->\n| old |\n<!-- /kvsim:generated -->\nafter\n"
    updated = readme_tables.with_tables(text, {"radix-vs-prefix": "| new |\n|---|"})
    assert (
        updated
        == "intro\n<!-- kvsim:generated radix-vs-prefix -->\n| new |\n|---|\n<!-- /kvsim:generated -->\nafter\n"
    )
    with pytest.raises(ValueError, match="no <!-- kvsim:generated other -->"):
        readme_tables.block(text, "other")


def test_a_row_reads_its_runs_figures():
    run = {"requests": 1750, "prompt_tokens": 24_512_345, "kv_pool_tokens": 907_824}
    runs = [
        run | {"hit_rates": [0.8999, 0.904, 0.8999], "preemptions": [0, 0, 0]},
        run | {"hit_rates": [0.2937, 0.1911, 0.1896], "preemptions": [825, 797, 868]},
        run | {"hit_rates": [0.1813, 0.1845, 0.1815], "preemptions": [33, 24, 37]},
        run | {"hit_rates": [0.07096, 0.04806, 0.04768], "preemptions": [32, 24, 31]},
        run | {"hit_rates": [0.1859, 0.1849, 0.1845], "preemptions": [0, 0, 0]},
    ]
    lines = readme_tables.radix_vs_prefix_table(runs).splitlines()
    assert lines[3] == (
        "| same, `--set gpu=L4-24GB` (overloaded, 825 / 797 / 868 preemptions) | 907,824 tokens | "
        "29.37 % | 19.11 % | 18.96 % |"
    )
    assert lines[5].startswith(
        "| Mooncake, first 10 min (1,750 requests, 24.5 M prompt tokens), H200 (32 / 24 / 31"
    )
    assert lines[5].endswith("| 7.096 % | 4.806 % | 4.768 % |")
    assert "(no preemptions)" in lines[6]


@pytest.mark.slow
@pytest.mark.timeout(400)  # five runs of 1,750-3,000 requests: about 45 s on one idle core
def test_the_readme_tables_are_up_to_date():
    text = readme_tables.README.read_text(encoding="utf-8")
    for name, make in readme_tables.TABLES.items():
        start, end = readme_tables.block(text, name)
        assert text[start:end] == make() + "\n", f"README.md table {name}: run python -m tools.readme_tables"
