"""The shipped traces: byte-exact copies with their licences, and every number of traces/README.md."""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from workloads.stats import trace_stats

TRACES = Path(__file__).resolve().parents[1] / "traces"
README = (TRACES / "README.md").read_text()
FILES = {
    "azure/AzureLLMInferenceTrace_code.csv": "**`code`**",
    "azure/AzureLLMInferenceTrace_conv.csv": "**`conv`**",
    "mooncake/conversation_trace.jsonl": "* 12,031 requests",
    "vidur/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv": "### 3a.",
    "etalon/sharegpt_8k_filtered_stats_llama2_tokenizer.csv": "### 3b.",
    "etalon/bwb_stats_llama2_tokenizer_filtered_v2.csv": "### 3c.",
}
LICENCES = ["azure/LICENSE", "mooncake/LICENSE-APACHE", "vidur/LICENSE", "etalon/LICENSE"]


@cache
def stats(name: str) -> dict[str, Any]:
    return trace_stats(TRACES / name)


def test_checksums_and_git_blob_ids() -> None:
    sums = dict(reversed(line.split()) for line in (TRACES / "SHA256SUMS").read_text().splitlines())
    assert set(sums) == set(FILES)
    for name, expected in sums.items():
        data = (TRACES / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == expected, name
        blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        row = f"| `{name}` | {len(data):,} | `{blob}` | `{expected}` |"
        assert row in README, row


def test_licences_and_line_endings_are_kept() -> None:
    for name in LICENCES:
        assert (TRACES / name).stat().st_size > 1000
    assert (TRACES / ".gitattributes").read_text().split() == ["*", "-text"]
    assert "Attribution: Patel et al." in README and "Attribution: Qin et al." in README
    azure = (TRACES / "azure/AzureLLMInferenceTrace_code.csv").read_bytes()
    assert azure.count(b"\r\n") == 8819 and not azure.endswith(b"\n")


def readme_table(marker: str) -> dict[str, list[str]]:
    """The first ``| | mean | p50 | ...`` table after ``marker``: row label -> cells as printed."""
    start = README.index(marker)
    table = README.index("| | mean |", start)
    rows: dict[str, list[str]] = {}
    for line in README[table:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def close_to_printed(value: float, printed: str) -> bool:
    """``value`` rounds to ``printed`` (e.g. '2,047.8'): within half a unit of its last digit."""
    text = printed.replace(",", "")
    decimals = len(text.split(".")[1]) if "." in text else 0
    return abs(value - float(text)) <= 0.5 * 10**-decimals * 1.001


LABELS = {
    "prompt tokens": ("prompt_tokens",),
    "output tokens": ("output_tokens",),
    "`len(hash_ids)`": ("hash_blocks", "per_request"),
}


@pytest.mark.parametrize("name", sorted(FILES))
def test_readme_length_tables(name: str) -> None:
    table = readme_table(FILES[name])
    result = stats(name)
    assert set(table) == (
        {"prompt tokens", "output tokens", "`len(hash_ids)`"}
        if "mooncake" in name
        else {"prompt tokens", "output tokens"}
    )
    for label, printed in table.items():
        values = result
        for key in LABELS[label]:
            values = values[key]
        for key, cell in zip(("mean", "p50", "p90", "p99", "min", "max"), printed, strict=True):
            assert close_to_printed(values[key], cell), (name, label, key, values[key], cell)


@pytest.mark.parametrize("name", sorted(FILES))
def test_readme_overview_table(name: str) -> None:
    line = next(line for line in README.splitlines() if line.startswith(f"| `{name}` |"))
    cells = [cell.strip() for cell in line.strip("|").split("|")]
    result = stats(name)
    assert int(cells[2].replace(",", "")) == result["requests"]
    if cells[3] == "n/a":
        assert "span_s" not in result
    else:
        assert close_to_printed(result["span_s"] / 60, cells[3].removesuffix(" min"))


def phrase_in_readme(phrase: str) -> None:
    assert phrase in " ".join(README.split()), phrase


def test_readme_azure_arrival_statistics() -> None:
    code = stats("azure/AzureLLMInferenceTrace_code.csv")
    phrase_in_readme(f"8,819 requests, 2023-11-16 18:17:03.980 → 19:14:19.928 ({code['span_s']:,.1f} s)")
    phrase_in_readme(
        f"rate {code['rate_per_s']:.2f} req/s. Very bursty: IA CV {code['interarrival_cv']:.1f}, "
        f"peak {code['peak_per_s']}/s, peak {code['peak_per_min']}/min"
    )
    phrase_in_readme(f"the longest is {code['longest_gap_s']:.0f} s")
    phrase_in_readme(
        f"{code['empty_wallclock_minutes']} of the {code['wallclock_minutes']} wall-clock minutes are empty"
    )
    conv = stats("azure/AzureLLMInferenceTrace_conv.csv")
    phrase_in_readme(f"19,366 requests, 2023-11-16 18:15:46.681 → 19:14:08.403 ({conv['span_s']:,.1f} s)")
    phrase_in_readme(
        f"rate {conv['rate_per_s']:.2f} req/s, IA CV {conv['interarrival_cv']:.2f} (close to Poisson), "
        f"peak {conv['peak_per_s']}/s, peak {conv['peak_per_min']}/min"
    )
    assert conv["output_tokens"]["max"] == 1000


def test_readme_mooncake_statistics() -> None:
    result = stats("mooncake/conversation_trace.jsonl")
    hashes = result["hash_blocks"]
    phrase_in_readme(f"timestamps 0 → {result['last_arrival_s'] * 1000:,.0f} ms")
    phrase_in_readme(f"mean rate {result['rate_per_s']:.2f} req/s")
    phrase_in_readme(f"there are only {result['distinct_arrival_times']:,} distinct values")
    phrase_in_readme(
        f"{100 * result['tied_consecutive_frac']:.1f} % of consecutive requests share a timestamp"
    )
    phrase_in_readme(f"(peak {result['peak_per_s']} in one bucket, peak {result['peak_per_min']}/min)")
    phrase_in_readme(
        f"{hashes['distinct_blocks']:,} distinct block ids among {hashes['block_references']:,} block references"
    )
    phrase_in_readme(
        f"{100 * hashes['block_reuse_frac']:.1f} % of block references are to blocks seen before"
    )
    phrase_in_readme(
        f"the longest cached prefix covers {100 * hashes['cached_prompt_tokens_frac']:.1f} % of all prompt tokens"
    )
    phrase_in_readme(
        f"{100 * hashes['requests_reusing_beyond_first_block_frac']:.1f} % of requests reuse more than the shared first block"
    )
    assert (
        hashes["length_mismatches"] == 0
    )  # "len(hash_ids) == ceil(input_length / 512) holds for every request"
    assert hashes["non_prefix_shaped_requests"] == 0  # "Reuse is strictly prefix-shaped"
    assert hashes["all_share_first_block"]  # "Every request's first block is id 0"


def test_readme_mooncake_timestamp_spacing() -> None:
    import json

    times = sorted(
        {
            json.loads(line)["timestamp"]
            for line in (TRACES / "mooncake/conversation_trace.jsonl").read_text().splitlines()
        }
    )
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    phrase_in_readme(f"{len(times):,} distinct values, spaced {min(gaps):,}–{max(gaps):,} ms apart")
