"""Trace loaders: each format, each transformation, each class of bad input."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from workloads import Request, TraceError, TraceWarning, build_workload
from workloads.content import ContentIds
from workloads.traces import TraceWorkload

DATA = Path(__file__).parent / "data" / "traces"
AZURE_CODE = DATA / "azure" / "AzureLLMInferenceTrace_code_head200.csv"
AZURE_CONV = DATA / "azure" / "AzureLLMInferenceTrace_conv_head200.csv"
MOONCAKE = DATA / "mooncake" / "conversation_trace_head300.jsonl"
SHAREGPT = DATA / "etalon" / "sharegpt_8k_filtered_stats_llama2_tokenizer_head200.csv"


def trace(
    source: dict[str, Any], seed: int = 0, base_dir: Path | None = None, **fields: Any
) -> TraceWorkload:
    workload = build_workload({"source": source, **fields}, seed=seed, base_dir=base_dir)
    assert isinstance(workload, TraceWorkload)
    return workload


def azure(path: Path = AZURE_CODE, **fields: Any) -> TraceWorkload:
    return trace({"kind": "azure", "path": str(path)}, **fields)


def mooncake(path: Path = MOONCAKE, **fields: Any) -> TraceWorkload:
    return trace({"kind": "mooncake", "path": str(path)}, **fields)


def replay(workload: TraceWorkload) -> list[Request]:
    return list(workload.requests())


def mooncake_rows(path: Path = MOONCAKE) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# --------------------------------------------------------------------------------------------------
# Formats
# --------------------------------------------------------------------------------------------------


def test_azure_fixture_keeps_upstream_bytes() -> None:
    data = AZURE_CODE.read_bytes()
    assert b"\r\n" in data and not data.endswith(b"\n") and data.count(b"\r\n") == 200


@pytest.mark.parametrize("path", [AZURE_CODE, AZURE_CONV])
def test_azure(path: Path) -> None:
    requests = replay(azure(path))
    frame = pd.read_csv(path)
    assert len(requests) == len(frame) == 200
    seconds = (pd.to_datetime(frame.TIMESTAMP) - pd.to_datetime(frame.TIMESTAMP).iloc[0]).dt.total_seconds()
    np.testing.assert_allclose([r.arrival_s for r in requests], seconds, atol=1e-6)
    assert [r.prompt_len for r in requests] == frame.ContextTokens.tolist()
    assert [r.output_len for r in requests] == frame.GeneratedTokens.tolist()
    assert all(len(r.prompt) == 1 for r in requests)  # no prefix information
    assert len({r.prompt[0][0] for r in requests} | {r.output_content_id for r in requests}) == 400


def test_azure_first_rows_exactly() -> None:
    workload = azure()
    requests = replay(workload)
    assert requests[0].arrival_s == 0.0 and requests[1].arrival_s == pytest.approx(0.052)
    assert (requests[0].prompt_len, requests[0].output_len) == (4808, 10)
    assert (requests[1].prompt_len, requests[1].output_len) == (3180, 8)
    info = workload.describe()
    assert info["trace_origin"] == "2023-11-16T18:17:03.979960"
    assert info["counts"]["rows_read"] == info["counts"]["requests"] == 200


def test_mooncake_hash_blocks_become_segments() -> None:
    requests = replay(mooncake())
    rows = mooncake_rows()
    assert len(requests) == 300
    ids = ContentIds()
    for request, row in zip(requests, rows, strict=True):
        hashes = row["hash_ids"]
        assert request.arrival_s == row["timestamp"] / 1000
        assert request.prompt_len == row["input_length"] and request.output_len == row["output_length"]
        expected = [(ids.hash_block(h), 512) for h in hashes[:-1]]
        expected.append((ids.hash_block(hashes[-1]), row["input_length"] - 512 * (len(hashes) - 1)))
        assert list(request.prompt) == expected
    own = {r.output_content_id for r in requests}
    blocks = {content_id for r in requests for content_id, _ in r.prompt}
    assert len(own) == 300 and not own & blocks


def test_length_table_with_synthetic_arrivals() -> None:
    frame = pd.read_csv(SHAREGPT)
    source = {"kind": "length_table", "path": str(SHAREGPT)}
    ordered = replay(trace({**source, "order": "sequential"}, arrival={"kind": "constant", "rate_per_s": 2}))
    assert [r.prompt_len for r in ordered] == frame.num_prefill_tokens.tolist()
    assert [r.output_len for r in ordered] == frame.num_decode_tokens.tolist()
    assert [r.arrival_s for r in ordered] == [index / 2 for index in range(200)]
    shuffled = replay(trace({**source, "order": "shuffle"}, arrival={"kind": "poisson", "rate_per_s": 2}))
    pairs = sorted(zip(frame.num_prefill_tokens, frame.num_decode_tokens, strict=True))
    assert sorted((r.prompt_len, r.output_len) for r in shuffled) == pairs
    assert [(r.prompt_len, r.output_len) for r in shuffled] != [(r.prompt_len, r.output_len) for r in ordered]
    sampled = replay(trace(source, arrival={"kind": "poisson", "rate_per_s": 2}, num_requests=1000))
    assert len(sampled) == 1000 and {(r.prompt_len, r.output_len) for r in sampled} <= set(pairs)


def test_generic_csv_mapping(tmp_path: Path) -> None:
    path = tmp_path / "mine.csv"
    path.write_text('chat,t_ms,in,out,blocks\na,1000,20,5,"[1, 2]"\nb,1500,17,3,1;2\na,2500,40,9,7 8 9\n')
    source = {
        "kind": "csv",
        "path": "mine.csv",
        "arrival_column": "t_ms",
        "arrival_unit": "ms",
        "prompt_len_column": "in",
        "output_len_column": "out",
        "hash_ids_column": "blocks",
        "hash_block_len": 16,
        "session_column": "chat",
    }
    requests = replay(trace(source, base_dir=tmp_path))
    assert [r.arrival_s for r in requests] == [0.0, 0.5, 1.5]
    assert [r.session_id for r in requests] == [0, 1, 0]
    ids = ContentIds()
    assert requests[0].prompt == ((ids.hash_block(1), 16), (ids.hash_block(2), 4))
    assert requests[1].prompt == ((ids.hash_block(1), 16), (ids.hash_block(2), 1))
    assert [length for _, length in requests[2].prompt] == [16, 16, 8]
    unshifted = replay(trace(source, base_dir=tmp_path, shift_to_zero=False))
    assert [r.arrival_s for r in unshifted] == [1.0, 1.5, 2.5]


def test_generic_jsonl_with_datetimes_and_session_extension(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    lines = [
        {"when": "2024-05-01 10:00:00", "p": 100, "o": 20, "user": "u1"},
        {"when": "2024-05-01 10:00:02.5", "p": 50, "o": 10, "user": "u2"},
        {"when": "2024-05-01 10:00:04", "p": 150, "o": 20, "user": "u1"},  # 100 + 20 + 30 new
        {"when": "2024-05-01 10:00:09", "p": 60, "o": 5, "user": "u1"},  # shorter: a new context
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    source = {
        "kind": "jsonl",
        "path": str(path),
        "arrival_field": "when",
        "arrival_unit": "datetime",
        "prompt_len_field": "p",
        "output_len_field": "o",
        "session_field": "user",
    }
    workload = trace(source, session_mode="extend")
    first, second, third, fourth = replay(workload)
    assert [r.arrival_s for r in (first, second, third, fourth)] == [0.0, 2.5, 4.0, 9.0]
    assert third.prompt == (*first.prompt, (first.output_content_id, 20), (third.prompt[-1][0], 30))
    assert len(second.prompt) == 1 and len(fourth.prompt) == 1
    assert workload.describe()["counts"]["session_context_mismatches"] == 1
    labelled = replay(trace(source))
    assert len(labelled[2].prompt) == 1 and labelled[2].session_id == 0
    formatted = {**source, "datetime_format": "%Y-%m-%d %H:%M:%S"}
    with pytest.raises(TraceError, match=r"mine.jsonl:2: when is '2024-05-01 10:00:02.5', not a date-time"):
        replay(trace(formatted))


# --------------------------------------------------------------------------------------------------
# Transformations
# --------------------------------------------------------------------------------------------------


def test_time_window_and_shift() -> None:
    full = replay(azure())
    workload = azure(window={"start_s": 30.0, "end_s": 60.0})
    windowed = replay(workload)
    inside = [r for r in full if 30.0 <= r.arrival_s < 60.0]
    assert [r.prompt_len for r in windowed] == [r.prompt_len for r in inside]
    assert windowed[0].arrival_s == 0.0
    np.testing.assert_allclose(
        [r.arrival_s for r in windowed], [r.arrival_s - inside[0].arrival_s for r in inside]
    )
    counts = workload.describe()["counts"]
    assert counts["outside_window"] == sum(r.arrival_s < 30.0 for r in full) + 1  # reading stops at the end
    assert counts["stopped_at_window_end_line"] == len(inside) + counts["outside_window"] + 1
    unshifted = replay(azure(window={"start_s": 30.0, "end_s": 60.0}, shift_to_zero=False))
    np.testing.assert_allclose([r.arrival_s for r in unshifted], [r.arrival_s for r in inside])


def test_rate_scaling_keeps_burstiness() -> None:
    base = np.array([r.arrival_s for r in replay(azure())])
    halved = np.array([r.arrival_s for r in replay(azure(time_scale=0.5))])
    np.testing.assert_allclose(halved, base * 0.5)
    workload = azure(target_rate_per_s=20.0)
    target = np.array([r.arrival_s for r in replay(workload)])
    assert (len(target) - 1) / (target[-1] - target[0]) == pytest.approx(20.0)
    cv = lambda t: np.diff(t).std() / np.diff(t).mean()  # noqa: E731
    assert cv(target) == pytest.approx(cv(base))
    assert workload.describe()["time_scale_applied"] == pytest.approx(199 / base[-1] / 20)


def test_sampling_is_seeded_and_counted() -> None:
    one = azure(sample_fraction=0.5)
    kept = replay(one)
    assert 70 < len(kept) < 130
    assert one.describe()["counts"]["sampled_out"] == 200 - len(kept)
    assert kept == replay(azure(sample_fraction=0.5))
    assert [r.prompt_len for r in kept] != [
        r.prompt_len
        for r in replay(trace({"kind": "azure", "path": str(AZURE_CODE)}, seed=1, sample_fraction=0.5))
    ]
    assert len(replay(azure(num_requests=17))) == 17


def test_max_model_len_cap_and_drop() -> None:
    full = replay(mooncake())
    limit = 8192
    capped_workload = mooncake(max_model_len=limit, on_too_long="cap")
    capped = replay(capped_workload)
    assert len(capped) == 300 and max(r.final_len for r in capped) <= limit
    counts = capped_workload.describe()["counts"]
    too_long = [r for r in full if r.final_len > limit]
    assert counts["capped_output"] + counts["capped_prompt"] == len(too_long) > 0
    assert counts["capped_prompt"] == sum(r.prompt_len >= limit for r in full) > 0
    for original, cut in zip(full, capped, strict=True):
        if original.prompt_len >= limit:  # the prompt keeps its first limit - 1 tokens: a prefix of the chain
            assert cut.prompt_len == limit - 1 and cut.output_len == 1
            assert cut.prompt[:-1] == original.prompt[: len(cut.prompt) - 1]
        elif original.final_len > limit:
            assert cut.prompt == original.prompt and cut.output_len == limit - original.prompt_len
    dropped_workload = mooncake(max_model_len=limit, on_too_long="drop")
    dropped = replay(dropped_workload)
    assert len(dropped) == 300 - len(too_long)
    assert dropped_workload.describe()["counts"]["dropped_too_long"] == len(too_long)
    assert len(replay(mooncake(max_model_len=limit, on_too_long="keep"))) == 300


def test_spreading_quantised_timestamps_only_when_asked() -> None:
    plain = [r.arrival_s for r in replay(mooncake())]
    assert len(set(plain)) == 35  # 300 requests in 35 three-second batches
    even = [r.arrival_s for r in replay(mooncake(spread_ties={"mode": "even"}))]
    assert len(set(even)) == 300 and even == sorted(even)
    for before, after in zip(plain, even, strict=True):
        assert before <= after < before + 3.01
    batch = [t for t, p in zip(even, plain, strict=True) if p == plain[0]]
    np.testing.assert_allclose(np.diff(batch), 3.0 / len(batch))
    uniform = [r.arrival_s for r in replay(mooncake(spread_ties={"mode": "uniform", "width_s": 1.0}))]
    assert uniform == sorted(uniform) and len(set(uniform)) == 300
    assert all(p <= u < p + 1.0 for p, u in zip(plain, uniform, strict=True))
    assert uniform == [r.arrival_s for r in replay(mooncake(spread_ties={"mode": "uniform", "width_s": 1.0}))]


def test_every_row_is_accounted_for() -> None:
    workload = mooncake(
        window={"start_s": 10, "end_s": 80},
        max_model_len=16384,
        on_too_long="drop",
        sample_fraction=0.7,
    )
    requests = replay(workload)
    counts = workload.describe()["counts"]
    accounted = (
        counts["requests"]
        + counts["rows_skipped"]
        + counts["outside_window"]
        + counts["dropped_too_long"]
        + counts["sampled_out"]
    )
    assert counts["requests"] == len(requests) and accounted == counts["rows_read"]


def test_replays_restart_and_are_deterministic() -> None:
    workload = mooncake(
        spread_ties={"mode": "uniform"}, sample_fraction=0.5, n={"kind": "choice", "values": [1, 2]}
    )
    assert (
        replay(workload)
        == replay(workload)
        == replay(
            mooncake(
                spread_ties={"mode": "uniform"}, sample_fraction=0.5, n={"kind": "choice", "values": [1, 2]}
            )
        )
    )


def test_requests_stream() -> None:
    import types

    # A generator (requests are produced as the engine pulls them, never held as a list), whose
    # first item is the file's first line, parsed here independently. (Compiled, it is a native
    # generator, not a types.GeneratorType: it has a generator's methods; a list iterator has not.)
    stream = mooncake().requests()
    assert isinstance(stream, types.GeneratorType) or all(
        hasattr(stream, method) for method in ("send", "throw", "close")
    )
    first, row = next(stream), mooncake_rows()[0]
    assert (first.arrival_s, first.prompt_len, first.output_len) == (
        row["timestamp"] / 1000,
        row["input_length"],
        row["output_length"],
    )


# --------------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------------


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


AZ_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def test_missing_or_misnamed_columns(tmp_path: Path) -> None:
    path = write(tmp_path, "a.csv", "TIMESTAMP,ContextToken,Generated\n2023-11-16 18:17:03.9799600,1,2\n")
    with pytest.raises(TraceError) as info:
        azure(path)  # fails at build time, before any request
    message = str(info.value)
    assert "a.csv:1:" in message and "'ContextTokens' (did you mean 'ContextToken'?)" in message
    assert (
        "'GeneratedTokens'" in message
        and "columns found: 'TIMESTAMP', 'ContextToken', 'Generated'" in message
    )
    jsonl = write(
        tmp_path, "m.jsonl", '{"timestamp": 0, "input_len": 5, "output_length": 1, "hash_ids": [1]}\n'
    )
    with pytest.raises(
        TraceError,
        match=r"m.jsonl:1: missing field\(s\) 'input_length' \(did you mean 'input_len'\?\); fields found: 'timestamp', 'input_len'",
    ):
        mooncake(jsonl)


@pytest.mark.parametrize(
    ("cell", "reason", "message"),
    [
        ("12x", "non_numeric", "ContextTokens is '12x', not a number"),
        ("3.5", "non_numeric", "ContextTokens is '3.5', not a whole number"),
        ("-4", "negative", "ContextTokens is negative (-4)"),
        ("0", "zero", "ContextTokens is 0"),
        ("", "missing_value", "ContextTokens is empty"),
    ],
)
def test_bad_lengths_fail_with_line_or_are_skipped_and_counted(
    tmp_path: Path, cell: str, reason: str, message: str
) -> None:
    path = write(
        tmp_path,
        "a.csv",
        AZ_HEADER
        + "2023-11-16 18:17:03.0,10,2\n"
        + f"2023-11-16 18:17:04.0,{cell},2\n"
        + "2023-11-16 18:17:05.0,30,2\n",
    )
    with pytest.raises(TraceError, match=r"a.csv:3: " + re.escape(message)):
        replay(azure(path))
    workload = azure(path, on_bad_row="skip")
    with pytest.warns(TraceWarning, match="a.csv:3"):
        requests = replay(workload)
    assert [r.prompt_len for r in requests] == [10, 30]
    counts = workload.describe()["counts"]
    assert counts["rows_skipped"] == 1 and counts["skipped_by_reason"] == {reason: 1}
    assert counts["first_skipped_lines"] == [3]


def test_bad_timestamps_and_field_counts(tmp_path: Path) -> None:
    path = write(
        tmp_path, "a.csv", AZ_HEADER + "2023-11-16 18:17:03.0,10,2\nyesterday,5,5\n2023-11-16 18:17:05.0,30\n"
    )
    with pytest.raises(TraceError, match=r"a.csv:3: TIMESTAMP is 'yesterday', not a date-time \(ISO 8601\)"):
        replay(azure(path))
    workload = azure(path, on_bad_row="skip")
    with pytest.warns(TraceWarning):
        assert len(replay(workload)) == 1
    assert workload.describe()["counts"]["skipped_by_reason"] == {"bad_timestamp": 1, "field_count": 1}


def test_non_monotone_timestamps(tmp_path: Path) -> None:
    rows = [(0, 5), (3000, 6), (2000, 7), (4000, 8)]
    path = write(
        tmp_path,
        "m.jsonl",
        "".join(
            json.dumps({"timestamp": t, "input_length": p, "output_length": 1, "hash_ids": [p]}) + "\n"
            for t, p in rows
        ),
    )
    with pytest.raises(
        TraceError, match=r"m.jsonl:3: arrival time goes backwards: 2.000000 s after 3.000000 s at line 2"
    ):
        replay(mooncake(path))
    workload = mooncake(path, on_unsorted="sort")
    with pytest.warns(TraceWarning, match="1 rows arrive before an earlier row; sorted"):
        requests = replay(workload)
    assert [(r.arrival_s, r.prompt_len) for r in requests] == [(0.0, 5), (2.0, 7), (3.0, 6), (4.0, 8)]
    assert workload.describe()["counts"]["rows_out_of_order"] == 1


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("e.csv", "", "e.csv: empty file"),
        ("h.csv", AZ_HEADER, "h.csv: no data rows"),
        ("b.csv", "\n\n", "b.csv: empty file"),
        ("e.jsonl", "", "e.jsonl: empty file"),
        ("w.jsonl", "\n  \n", "w.jsonl: empty file"),
    ],
)
def test_empty_files(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = write(tmp_path, name, text)
    with pytest.raises(TraceError, match=message):
        replay(azure(path) if name.endswith(".csv") else mooncake(path))


def test_truncated_json_lines(tmp_path: Path) -> None:
    good = MOONCAKE.read_text().splitlines(keepends=True)[:5]
    path = write(tmp_path, "cut.jsonl", "".join(good) + good[0][:40])
    with pytest.raises(TraceError, match=r"cut.jsonl:6: invalid or truncated JSON: .*truncated file\?"):
        replay(mooncake(path))
    workload = mooncake(path, on_bad_row="skip")
    with pytest.warns(TraceWarning, match="cut.jsonl:6"):
        assert len(replay(workload)) == 5
    assert workload.describe()["counts"]["skipped_by_reason"] == {"invalid_json": 1}
    middle = write(
        tmp_path,
        "mid.jsonl",
        good[0] + "[1, 2]\n" + good[1] + '{"timestamp": 0, "input_length": 5}\n' + good[2],
    )
    with pytest.raises(TraceError, match=r"mid.jsonl:2: expected a JSON object, found list"):
        replay(mooncake(middle))
    skipping = mooncake(middle, on_bad_row="skip")
    with pytest.warns(TraceWarning):
        assert len(replay(skipping)) == 3
    assert skipping.describe()["counts"]["skipped_by_reason"] == {"invalid_json": 1, "missing_field": 1}


def test_hash_length_mismatch(tmp_path: Path) -> None:
    lines = [
        {"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [1, 2]},
        {"timestamp": 0, "input_length": 1100, "output_length": 1, "hash_ids": [1, 2]},  # one block short
        {"timestamp": 0, "input_length": 300, "output_length": 1, "hash_ids": [1, 3]},  # one block too many
    ]
    path = write(tmp_path, "m.jsonl", "".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(
        TraceError,
        match=r"m.jsonl:2: input_length=1100 does not match 2 hash ids of 512 tokens \(expected 513..1024",
    ):
        replay(mooncake(path))
    workload = trace({"kind": "mooncake", "path": str(path), "on_hash_length_mismatch": "warn"})
    with pytest.warns(TraceWarning, match="m.jsonl:2"):
        first, second, third = replay(workload)
    ids = ContentIds()
    assert second.prompt == ((ids.hash_block(1), 512), (ids.hash_block(2), 512), (second.prompt[-1][0], 76))
    assert second.prompt[-1][0] not in (ids.hash_block(1), ids.hash_block(2))
    assert third.prompt == ((ids.hash_block(1), 300),)
    assert workload.describe()["counts"]["hash_length_mismatches"] == 2


def test_nothing_left_to_replay(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"no requests left to replay \(rows_read=200, outside_window=200\)"):
        replay(azure(window={"start_s": 5000}))


def test_missing_file() -> None:
    with pytest.raises(TraceError, match="file not found"):
        azure(Path("/nonexistent/x.csv"))


def test_warnings_are_not_raised_for_clean_files() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        replay(mooncake())
        replay(azure())


def test_trace_samples_spread_lognormally_around_the_traced_length() -> None:
    """n = 3 on the Mooncake fixture: sample 0 keeps the traced output length; samples 1 and 2 are
    the traced length times exp(0.5 Z): their log ratio to it has mean ~0 and sd ~0.5 (rounding to
    whole tokens adds little on lengths of 100+ tokens). sigma 0 and `identical` keep the trace."""
    requests = replay(mooncake(n=3, sample_length_sigma=0.5))
    traced = replay(mooncake())
    assert [r.output_len for r in requests] == [r.output_len for r in traced]
    assert all(r.sample_output_lens[0] == r.output_len for r in requests)
    ratios = np.array(
        [np.log(np.array(r.sample_output_lens[1:]) / r.output_len) for r in requests if r.output_len >= 100]
    ).ravel()
    assert len(ratios) > 200
    assert ratios.mean() == pytest.approx(0.0, abs=0.08)
    assert ratios.std() == pytest.approx(0.5, rel=0.12)
    flat = replay(mooncake(n=3, sample_length_sigma=0.0))
    assert all(set(r.sample_output_lens) == {r.output_len} for r in flat)
    assert all(r.sample_output_lens == () for r in replay(mooncake(n=3, sample_lengths="identical")))
    capped = replay(mooncake(n=3, max_model_len=8192))
    assert max(r.final_len for r in capped) <= 8192


def test_a_trace_replayed_with_max_concurrency_is_a_closed_loop(tmp_path):
    """vllm bench serve --max-concurrency 2: requests go in trace order, each when a slot frees, or
    at its own time if that is later."""
    from sim.config import validate_experiment
    from sim.runner import prepare_experiment, run_experiment

    rows = [(0.0, 300, 20), (0.0, 300, 40), (0.0, 200, 10), (100.0, 100, 5)]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"t": t, "p": p, "o": o}) + "\n" for t, p, o in rows))
    data = {
        "name": "loop",
        "model": "Llama-3.1-8B",
        "gpu": "H100-80GB",
        "workload": {
            "source": {
                "kind": "jsonl",
                "path": str(trace),
                "arrival_field": "t",
                "prompt_len_field": "p",
                "output_len_field": "o",
            },
            "max_concurrency": 2,
        },
        "variants": [{"name": "p", "policy": "paged"}],
    }
    config = validate_experiment(data, tmp_path / "x.yaml")
    results = run_experiment(
        config, tmp_path / "x.yaml", prepared=prepare_experiment(config, tmp_path / "x.yaml")
    )
    table = results[0].sink.requests().set_index("request_id")
    assert (table["outcome"] == "finished").all()
    # request 0 (20 tokens) finishes first: request 2 takes its slot at that instant
    assert table.at[2, "arrival_s"] == table.at[0, "finish_s"]
    # request 3's trace time (100 s) is after request 1 frees its slot: it goes at 100 s
    assert table.at[1, "finish_s"] < 100.0 and table.at[3, "arrival_s"] == 100.0
    # never more than two in flight
    starts, ends = table["arrival_s"].to_numpy(), table["finish_s"].to_numpy()
    for instant in starts:
        assert ((starts <= instant) & (ends > instant)).sum() <= 2


def test_an_arrival_before_zero_kept_in_place_is_refused_with_its_line(tmp_path: Path) -> None:
    # shift_to_zero: false keeps each row's own time; a request before t = 0 would count its wait from
    # before the simulation started, so it is refused (issue 41), naming the line and the remedy.
    from workloads.base import TraceError

    (tmp_path / "early.csv").write_text("t,in,out\n-0.5,100,10\n1.0,100,10\n")
    source = {
        "kind": "csv",
        "path": "early.csv",
        "arrival_column": "t",
        "prompt_len_column": "in",
        "output_len_column": "out",
    }
    with pytest.raises(TraceError, match=r"arrival time -0.5 s is before the simulation starts") as raised:
        replay(trace(source, base_dir=tmp_path, shift_to_zero=False))
    assert raised.value.line == 2 and "shift_to_zero: true" in str(raised.value)
    assert [r.arrival_s for r in replay(trace(source, base_dir=tmp_path))] == [0.0, 1.5]
