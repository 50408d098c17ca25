"""The readers of measured runs (sim/replay/readers.py) on tiny hand-made files: every field of the
MeasuredRun they return, the notes the report prints, and every refusal naming the file, the line
(or the entry) and the bad value."""

from __future__ import annotations

import csv
import json
import locale
import math
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from sim.replay.measured import ServerSettings, Stage
from sim.replay.readers import (
    BLIS_STAGES_COLUMN,
    ReplayInputError,
    async_scheduling_by_default,
    read_blis_csv,
    read_llmservingsim_bench,
    read_vllm_bench_json,
)

NO_PROMPT_IDENTITY = "no prompt identity: every prompt is unique (prefix caching cannot be replayed)"


def _frame(**columns: list[Any]) -> pd.DataFrame:
    """The requests frame a reader must return, in REQUEST_COLUMNS order, with its dtypes."""
    count = len(columns["arrival_s"])
    return pd.DataFrame(
        {
            "request_id": np.arange(count, dtype=np.int64),
            "arrival_s": np.array(columns["arrival_s"], dtype=float),
            "prompt_tokens": np.array(columns["prompt_tokens"], dtype=np.int64),
            "output_tokens": np.array(columns["output_tokens"], dtype=np.int64),
            "ttft_s": np.array(columns["ttft_s"], dtype=float),
            "e2e_s": np.array(columns["e2e_s"], dtype=float),
            "stage": np.array(columns.get("stage", [0] * count), dtype=np.int64),
        }
    )


def _raises(message: str):
    """pytest.raises for a ReplayInputError whose message contains ``message`` verbatim."""
    return pytest.raises(ReplayInputError, match=re.escape(message))


# --------------------------------------------------------------------------------------------------
# BLIS: per-request CSV + runs.csv
# --------------------------------------------------------------------------------------------------

BLIS_HEADER = "index,arrival_s,input_tokens,output_tokens_server,has_error,ttft_s,e2e_s"
BLIS_GOOD_ROW = {
    "index": "0",
    "arrival_s": "0.0",
    "input_tokens": "40",
    "output_tokens_server": "5",
    "has_error": "0",
    "ttft_s": "0.03",
    "e2e_s": "0.07",
}
THREE_STAGES = json.dumps(
    [{"duration": 1, "rate": 4}, {"duration": 2, "rate": 8}, {"duration": 3, "rate": 2}]
)


def _runs_csv(path: Path, **target: str | None) -> Path:
    """A runs.csv with a decoy run r0 on line 2 and run r1 (with ``target``'s changes; None drops a
    column) on line 3."""
    r1 = {
        "run": "r1",
        "model": "org/blis-model",
        "tp": "2",
        "max_num_seqs": "64",
        "max_num_batched_tokens": "2048",
        "gpu_kv_blocks": "4000",
        "block_size": "32",
        BLIS_STAGES_COLUMN: THREE_STAGES,
        "system_prompt_len": "64",
    } | target
    r1 = {key: value for key, value in r1.items() if value is not None}
    r0 = {key: "1" for key in r1} | {"run": "r0", "model": "decoy"}
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(r1))
        writer.writeheader()
        writer.writerows([r0, r1])
    return path


def _blis_csv(path: Path, rows: list[str], header: str = BLIS_HEADER) -> Path:
    path.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    return path


def test_blis_reader_returns_every_field_of_the_run(tmp_path: Path) -> None:
    runs = _runs_csv(tmp_path / "settings" / "runs.csv")  # not beside the CSV: the argument is used
    path = _blis_csv(
        tmp_path / "r1.csv",
        [
            "0,10.0,40,5,0,0.03,0.07",
            "1,10.5,33,1,,0.02,0.02",  # one output token: E2E = TTFT is allowed
            "2,11.5,1,4,False,0.04,0.09",  # a one-token prompt is allowed
            "3,11.5,64,3,false,0.01,0.05",  # the same arrival as the previous row is allowed
            "4,13.0,70,2,1,,",  # failed: no latencies
            "5,14.0,70,2,true,0.5,0.1",  # failed ("true" is not a no): its E2E < TTFT is not checked
            "6,20.0,16,2, 0 ,0.02,0.06",  # arrives after the last stage ends: counted in the last
        ],
    )
    run = read_blis_csv(path, runs, gpu="H100-80GB")
    assert (run.name, run.source_format, run.path) == ("r1", "blis_csv", path)
    assert (run.anchor, run.tpot_definition, run.max_concurrency, run.timeseries) == (
        "client",
        "ratio_of_means",
        None,
        None,
    )
    assert run.settings == ServerSettings(
        model="org/blis-model",
        gpu="H100-80GB",
        tensor_parallel_size=2,
        max_num_seqs=64,
        max_num_batched_tokens=2048,
        max_model_len=4096,
        block_size=32,
        num_gpu_blocks=4000,
        engine_version="vLLM v0.15.1",
        async_scheduling=True,  # 0.15 >= 0.14
    )
    # stages: durations 1, 2, 3 s from 0: [0, 1), [1, 3), [3, 6)
    assert run.stages == [Stage(0.0, 1.0, 4.0), Stage(1.0, 3.0, 8.0), Stage(3.0, 6.0, 2.0)]
    nan = math.nan
    expected = _frame(
        arrival_s=[0.0, 0.5, 1.5, 1.5, 3.0, 4.0, 10.0],  # from the first arrival, 10.0
        prompt_tokens=[40, 33, 1, 64, 70, 70, 16],
        output_tokens=[5, 1, 4, 3, 2, 2, 2],
        ttft_s=[0.03, 0.02, 0.04, 0.01, nan, nan, 0.02],
        e2e_s=[0.07, 0.02, 0.09, 0.05, nan, nan, 0.06],
        stage=[0, 0, 1, 1, 2, 2, 2],
    )
    pd.testing.assert_frame_equal(run.requests, expected)
    # runs.csv's rule: prompts 0..6 all in group 0; 64-token system prompt = two 32-token blocks,
    # shared; the third block of a 70-token prompt is its own (prompts 4 and 5 differ)
    assert run.prompt_hashes == [[0, 1], [0, 1], [0], [0, 1], [0, 1, 2], [0, 1, 3], [0]]
    assert run.hash_block_len == 32
    assert run.notes == [
        "latencies are client-side (the inference-perf client's send to its receipt of the first / last "
        "streamed token: HTTP, the API server, tokenization and SSE streaming included)",
        "output lengths are the server's own counts (output_tokens_server; the client's re-tokenized "
        "counts are wrong for some requests)",
        "the server also had 8 GiB of CPU KV offload (vLLM OffloadingConnector); not replayed",
        "prompt identity from a rule: request i sends prompt i mod 100; groups of 10 consecutive prompts "
        "share a 64-token system prompt (which prompts share a group is not recorded)",
    ]


def test_blis_reader_without_a_prompt_rule_or_a_system_prompt(tmp_path: Path) -> None:
    _runs_csv(tmp_path / "runs.csv", system_prompt_len="")
    path = _blis_csv(tmp_path / "r1.csv", ["0,0.0,40,5,0,0.03,0.07"])
    run = read_blis_csv(path, prompts=None)
    assert run.prompt_hashes is None
    assert run.notes[-1] == NO_PROMPT_IDENTITY
    # the documented rule with an empty system_prompt_len: no system prompt at all
    run = read_blis_csv(path)
    assert run.notes[-1] == (
        "prompt identity from a rule: request i sends prompt i mod 100; groups of 10 consecutive prompts "
        "share a 0-token system prompt (which prompts share a group is not recorded)"
    )


def test_blis_reader_keeps_a_quoted_line_break_as_written(tmp_path: Path) -> None:
    # csv needs the file opened with newline="": a quoted CRLF stays CRLF (not translated to LF)
    _runs_csv(tmp_path / "runs.csv", model="org/\r\nmodel")
    run = read_blis_csv(_blis_csv(tmp_path / "r1.csv", ["0,0.0,40,5,0,0.03,0.07"]), prompts=None)
    assert run.settings.model == "org/\r\nmodel"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tp": "1.5"}, ":3: tp must be a whole number, got '1.5'"),
        ({"max_num_seqs": "1.5"}, ":3: max_num_seqs must be a whole number, got '1.5'"),
        ({"max_num_batched_tokens": "1.5"}, ":3: max_num_batched_tokens must be a whole number, got '1.5'"),
        ({"block_size": "1.5"}, ":3: block_size must be a whole number, got '1.5'"),
        ({"gpu_kv_blocks": "1.5"}, ":3: gpu_kv_blocks must be a whole number, got '1.5'"),
        ({"system_prompt_len": "1.5"}, ":3: system_prompt_len must be a whole number, got '1.5'"),
        ({BLIS_STAGES_COLUMN: "fast"}, f":3: {BLIS_STAGES_COLUMN} is not a JSON list: 'fast'"),
        ({BLIS_STAGES_COLUMN: "[]"}, f":3: {BLIS_STAGES_COLUMN} must be a non-empty list, got '[]'"),
        (
            {BLIS_STAGES_COLUMN: '{"rate": 1}'},
            f""":3: {BLIS_STAGES_COLUMN} must be a non-empty list, got '{{"rate": 1}}'""",
        ),
        ({BLIS_STAGES_COLUMN: None}, f":3: {BLIS_STAGES_COLUMN} must be a non-empty list, got ''"),
        (
            {BLIS_STAGES_COLUMN: '[{"duration": 1}]'},
            ":3: a stage needs duration and rate, got {'duration': 1}",
        ),
        ({BLIS_STAGES_COLUMN: "[5]"}, ":3: a stage needs duration and rate, got 5"),
        (
            {BLIS_STAGES_COLUMN: '[{"duration": -1, "rate": 1}]'},
            ":3: stage duration must be finite and >= 0, got -1",
        ),
        ({BLIS_STAGES_COLUMN: '[{"duration": 1, "rate": "x"}]'}, ":3: stage rate must be a number, got 'x'"),
    ],
)
def test_blis_reader_names_runs_csv_its_line_and_the_bad_setting(
    tmp_path: Path, change: dict[str, str | None], message: str
) -> None:
    runs = _runs_csv(tmp_path / "runs.csv", **change)
    path = _blis_csv(tmp_path / "r1.csv", ["0,0.0,40,5,0,0.03,0.07"])
    with _raises(f"{runs}{message}"):
        read_blis_csv(path)


def test_blis_reader_names_a_missing_runs_table_column_or_run(tmp_path: Path) -> None:
    path = _blis_csv(tmp_path / "r1.csv", ["0,0.0,40,5,0,0.03,0.07"])
    runs = tmp_path / "runs.csv"
    with _raises(f"{runs}: cannot read the runs table: No such file or directory"):
        read_blis_csv(path)
    _runs_csv(runs, tp=None, block_size=None)
    with _raises(f"{runs}: missing column(s) tp, block_size"):
        read_blis_csv(path)
    _runs_csv(runs)
    with _raises(f"{runs}: no run named 'r9' (runs: r0, r1)"):
        read_blis_csv(path, run="r9")
    with _raises(f"{tmp_path / 'r2.csv'}: cannot read: No such file or directory"):
        read_blis_csv(tmp_path / "r2.csv", run="r1")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"arrival_s": "-1"}, ":3: arrival_s must be finite and >= 0, got '-1'"),
        ({"input_tokens": "2.5"}, ":3: input_tokens must be a whole number, got '2.5'"),
        ({"output_tokens_server": "2.5"}, ":3: output_tokens_server must be a whole number, got '2.5'"),
        ({"ttft_s": "x"}, ":3: ttft_s must be a number, got 'x'"),
        ({"e2e_s": "inf"}, ":3: e2e_s must be finite and >= 0, got 'inf'"),
        ({"input_tokens": "0"}, ":3: input_tokens and output_tokens_server must be >= 1, got 0 and 5"),
        (
            {"output_tokens_server": "0"},
            ":3: input_tokens and output_tokens_server must be >= 1, got 40 and 0",
        ),
        ({"ttft_s": "0.05", "e2e_s": "0.04"}, ":3: e2e_s 0.04 is shorter than ttft_s 0.05"),
    ],
)
def test_blis_reader_names_the_line_and_value_of_a_bad_request(
    tmp_path: Path, change: dict[str, str], message: str
) -> None:
    _runs_csv(tmp_path / "runs.csv")
    bad = ",".join((BLIS_GOOD_ROW | change).values())
    path = _blis_csv(tmp_path / "r1.csv", [",".join(BLIS_GOOD_ROW.values()), bad])
    with _raises(f"{path}{message}"):
        read_blis_csv(path)


def test_blis_reader_refuses_a_csv_without_its_columns_or_requests(tmp_path: Path) -> None:
    _runs_csv(tmp_path / "runs.csv")
    path = _blis_csv(
        tmp_path / "r1.csv",
        ["0,0.0,40,5,0.03"],
        header="index,arrival_s,input_tokens,output_tokens_server,ttft_s",
    )
    with _raises(f"{path}: missing column(s) has_error, e2e_s"):
        read_blis_csv(path)
    path = _blis_csv(tmp_path / "r1.csv", [])
    with _raises(f"{path}: no requests"):
        read_blis_csv(path)


# --------------------------------------------------------------------------------------------------
# LLMServingSim bench folder
# --------------------------------------------------------------------------------------------------

ENGINE_SIDE = (
    "latencies are engine-side, anchored at the engine's queued_ts (in-process AsyncLLM: no HTTP, no "
    "API server); arrivals are the queued_ts, so the client's own submission delay is not replayed"
)
SAMPLES_ON_CLOCK = "the server's 1 s samples are placed on the replay's clock with t = 0 at the first request"


def _lss_request(request_id: Any, prompt: Any, output: Any, queued: Any, first: Any, last: Any) -> dict:
    return {
        "request_id": request_id,
        "input_toks": prompt,
        "output_toks": output,
        "queued_ts": queued,
        "first_token_ts": first,
        "last_token_ts": last,
    }


def _lss_folder(
    root: Path, meta: dict[str, Any], requests: list[dict[str, Any] | str], timeseries: str | None = None
) -> Path:
    """``root``/bench/examples/H100/run1 holding vllm/meta.json, requests.jsonl (a str: a raw line)
    and, when given, timeseries.csv."""
    folder = root / "bench" / "examples" / "H100" / "run1"
    (folder / "vllm").mkdir(parents=True, exist_ok=True)
    (folder / "vllm" / "meta.json").write_text(json.dumps(meta, ensure_ascii=False), encoding="utf-8")
    lines = [line if isinstance(line, str) else json.dumps(line) for line in requests]
    (folder / "vllm" / "requests.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    if timeseries is not None:
        (folder / "vllm" / "timeseries.csv").write_text(timeseries)
    return folder


def _workload(path: Path, prompts: list[list[int] | None]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        {"input_toks": len(ids or [])} | ({} if ids is None else {"input_tok_ids": ids}) for ids in prompts
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


FULL_META = {
    "model": "org/meta-model",
    "vllm_version": "0.19.0",
    "engine_kwargs": {
        "model": "org/kwargs-model",
        "tensor_parallel_size": 2,
        "data_parallel_size": 2,
        "enable_expert_parallel": True,
        "max_num_seqs": 32,
        "max_num_batched_tokens": 512,
        "max_model_len": 4096,
        "kv_cache_dtype": "fp8",
    },
    "dataset_path": "workloads/w.jsonl",
    "kv_cache": {
        "num_gpu_blocks": 500,
        "block_size": 8,
        "gpu_memory_utilization": 0.85,
        "enable_prefix_caching": False,
    },
    "hardware": {"device_name": "NVIDIA H100 80GB HBM3"},
    # recorded off although 0.19 schedules asynchronously by default: the record wins
    "resolved_config": {"scheduler_config": {"async_scheduling": False}},
}

# three 8-token-block prompts: line 0 (9 tokens) and line 1 (8 tokens) share their first block
WORKLOAD = [list(range(1, 10)), list(range(1, 9)), [50, 51, 52, 53]]


def test_llmservingsim_reader_returns_every_field_of_the_run(tmp_path: Path) -> None:
    folder = _lss_folder(
        tmp_path,
        FULL_META,
        [
            _lss_request("bench-1", 8, 2, 50.0, 50.25, 50.5),
            "",  # a blank line is skipped, not the end of the file
            _lss_request("bench-0", 9, 1, 50.0, 50.0, 50.0),  # queued = first = last is allowed
            _lss_request("dp-1-bench-2", 4, 3, 49.5, 49.75, 50.0),  # the number after the last "-"
        ],
        timeseries="t,running,waiting,kv_cache_pct\n1,2,0,0.5\n2,1,1,0\n",
    )
    _workload(tmp_path / "bench" / "workloads" / "w.jsonl", WORKLOAD)  # found above the folder
    run = read_llmservingsim_bench(folder)
    assert (run.name, run.source_format, run.path) == ("H100-run1", "llmservingsim_bench", folder)
    assert (run.anchor, run.tpot_definition, run.max_concurrency) == ("engine", "per_request", None)
    assert run.settings == ServerSettings(
        model="org/kwargs-model",
        gpu="NVIDIA H100 80GB HBM3",
        tensor_parallel_size=2,
        data_parallel_size=2,
        enable_expert_parallel=True,
        max_num_seqs=32,
        max_num_batched_tokens=512,
        max_model_len=4096,
        block_size=8,
        num_gpu_blocks=500,
        gpu_memory_utilization=0.85,
        enable_prefix_caching=False,
        kv_cache_dtype="fp8",
        engine_version="vLLM 0.19.0",
        async_scheduling=False,
    )
    # queue order: bench-2 at 49.5, then bench-0 and bench-1 both at 50.0 (the lower index first)
    expected = _frame(
        arrival_s=[0.0, 0.5, 0.5],
        prompt_tokens=[4, 9, 8],
        output_tokens=[3, 1, 2],
        ttft_s=[0.25, 0.0, 0.25],
        e2e_s=[0.5, 0.0, 0.5],
    )
    pd.testing.assert_frame_equal(run.requests, expected)
    assert run.stages == [Stage(0.0, 0.5, 4.0)]  # 2 gaps in 0.5 s
    # bench-2: [50..53] one block; bench-0: [1..8] + [9]; bench-1: [1..8], bench-0's first block
    assert run.prompt_hashes == [[0], [1, 2], [1]]
    assert run.hash_block_len == 8
    pd.testing.assert_frame_equal(
        run.timeseries,
        pd.DataFrame(
            {
                "time_s": [1.0, 2.0],
                "running": [2.0, 1.0],
                "waiting": [0.0, 1.0],
                "kv_usage_frac": [0.005, 0.0],  # 0.5 % and 0 %
            }
        ),
    )
    assert run.notes == [
        ENGINE_SIDE,
        "prompt identity from the token ids in w.jsonl (8-token blocks)",
        SAMPLES_ON_CLOCK,
    ]


def test_llmservingsim_reader_defaults_for_a_sparse_meta(tmp_path: Path) -> None:
    meta = {"model": "org/meta-model", "engine_kwargs": {}, "dataset_path": "w.jsonl"}
    folder = _lss_folder(tmp_path, meta, [_lss_request(7, 1, 1, 3.0, 3.5, 4.0)])  # an id without "-"
    (folder / "w.jsonl").write_text("")  # (the reader wants the workload even when it reads no ids)
    run = read_llmservingsim_bench(folder, gpu="H100-80GB", use_token_ids=False)
    assert run.settings == ServerSettings(model="org/meta-model", gpu="H100-80GB", engine_version="vLLM ?")
    assert run.settings.async_scheduling is None  # no version: no default known
    pd.testing.assert_frame_equal(
        run.requests, _frame(arrival_s=[0.0], prompt_tokens=[1], output_tokens=[1], ttft_s=[0.5], e2e_s=[1.0])
    )
    assert run.stages == [Stage(0.0, 0.0, None)]
    assert run.prompt_hashes is None and run.timeseries is None and run.hash_block_len == 16
    assert run.notes == [
        ENGINE_SIDE,
        NO_PROMPT_IDENTITY,
        "the run did not record its GPU KV block count: the pool is sized from the GPU and model",
    ]


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"vllm_version": "0.13.1"}, False),
        ({"vllm_version": "v0.19.0"}, True),
        # not a bool: the version's default
        (
            {"vllm_version": "0.13.1", "resolved_config": {"scheduler_config": {"async_scheduling": None}}},
            False,
        ),
        (
            {"vllm_version": "0.13.1", "resolved_config": {"scheduler_config": {"async_scheduling": True}}},
            True,
        ),
    ],
)
def test_llmservingsim_async_scheduling_is_the_record_else_the_versions_default(
    tmp_path: Path, extra: dict[str, Any], expected: bool
) -> None:
    meta = {"engine_kwargs": {}, "dataset_path": "w.jsonl", "kv_cache": {"num_gpu_blocks": 10}} | extra
    folder = _lss_folder(tmp_path, meta, [_lss_request("bench-0", 1, 1, 0.0, 0.0, 0.0)])
    (folder / "w.jsonl").write_text("")
    assert read_llmservingsim_bench(folder, use_token_ids=False).settings.async_scheduling is expected


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("0.14.0", True),  # the first release that does
        ("0.13.9", False),
        ("0.15.1", True),
        (" v0.19.0 ", True),
        ("1.2", True),
        ("nightly", None),
    ],
)
def test_async_scheduling_default_by_vllm_version(version: str, expected: bool | None) -> None:
    assert async_scheduling_by_default(version) is expected


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            {"request_id": "bench-1"},
            ":2: missing field(s) input_toks, output_toks, queued_ts, first_token_ts, last_token_ts",
        ),
        (_lss_request("bench-x", 5, 5, 1, 2, 3), ":2: request_id 'bench-x' does not end in a number"),
        (_lss_request("bench-1", 5, 5, "x", 2, 3), ":2: queued_ts must be a number, got 'x'"),
        (_lss_request("bench-1", 5, 5, 1, -1, 3), ":2: first_token_ts must be finite and >= 0, got -1"),
        (_lss_request("bench-1", 5, 5, 1, 2, "inf"), ":2: last_token_ts must be finite and >= 0, got 'inf'"),
        (
            _lss_request("bench-1", 5, 5, 10, 9, 11),
            ":2: expected queued_ts <= first_token_ts <= last_token_ts, got 10.0, 9.0, 11.0",
        ),
        (
            _lss_request("bench-1", 5, 5, 10, 11, 10.5),
            ":2: expected queued_ts <= first_token_ts <= last_token_ts, got 10.0, 11.0, 10.5",
        ),
        (_lss_request("bench-1", 2.5, 5, 1, 2, 3), ":2: input_toks must be a whole number, got 2.5"),
        (_lss_request("bench-1", 5, 2.5, 1, 2, 3), ":2: output_toks must be a whole number, got 2.5"),
        (_lss_request("bench-1", 0, 5, 1, 2, 3), ":2: input_toks and output_toks must be >= 1"),
        (_lss_request("bench-1", 5, 0, 1, 2, 3), ":2: input_toks and output_toks must be >= 1"),
        ("[1, 2]", ":2: expected a JSON object, got list"),
    ],
)
def test_llmservingsim_reader_names_the_line_and_value_of_a_bad_request(
    tmp_path: Path, line: dict[str, Any] | str, message: str
) -> None:
    meta = {"engine_kwargs": {}, "dataset_path": "w.jsonl"}
    folder = _lss_folder(tmp_path, meta, [_lss_request("bench-0", 5, 5, 1, 2, 3), line])
    with _raises(f"{folder / 'vllm' / 'requests.jsonl'}{message}"):
        read_llmservingsim_bench(folder, use_token_ids=False)


def test_llmservingsim_reader_names_a_bad_meta_or_a_missing_workload(tmp_path: Path) -> None:
    folder = _lss_folder(tmp_path, {}, [])
    meta_path = folder / "vllm" / "meta.json"
    with _raises(f"{meta_path}: missing engine_kwargs (is this an LLMServingSim bench folder?)"):
        read_llmservingsim_bench(folder)
    meta_path.write_text("[]")
    with _raises(f"{meta_path}: expected a JSON object at the top level"):
        read_llmservingsim_bench(folder)
    meta_path.write_text('{"engine_kwargs": {}}\n{')
    with _raises(f"{meta_path}:2: not valid JSON (Extra data)"):
        read_llmservingsim_bench(folder)
    meta_path.unlink()
    with _raises(f"{meta_path}: cannot read: No such file or directory"):
        read_llmservingsim_bench(folder)
    requests = [_lss_request("bench-0", 4, 1, 0.0, 0.0, 0.0)]
    _lss_folder(tmp_path, {"engine_kwargs": {}}, requests)
    with _raises(f"{meta_path}: no dataset_path; name the workload file"):
        read_llmservingsim_bench(folder)
    _lss_folder(tmp_path, {"engine_kwargs": {}, "dataset_path": "workloads/none.jsonl"}, requests)
    with _raises(
        f"{meta_path}: dataset_path 'workloads/none.jsonl' not found above {folder}; name the workload"
    ):
        read_llmservingsim_bench(folder)
    with _raises(f"{folder / 'vllm' / 'requests.jsonl'}: no requests"):
        read_llmservingsim_bench(
            _lss_folder(tmp_path, {"engine_kwargs": {}}, []), workload=tmp_path / "w.jsonl"
        )


def test_llmservingsim_reader_without_token_ids_needs_no_workload_file(tmp_path: Path) -> None:
    """The workload JSONL only gives the prompts' token ids: without them neither a missing
    dataset_path nor a dataset file that is not there stops the read."""
    requests = [_lss_request("bench-0", 4, 1, 0.0, 0.5, 0.5)]
    for meta in ({"engine_kwargs": {}}, {"engine_kwargs": {}, "dataset_path": "workloads/none.jsonl"}):
        folder = _lss_folder(tmp_path, meta, requests)
        run = read_llmservingsim_bench(folder, gpu="H100-80GB", use_token_ids=False)
        assert run.prompt_hashes is None
        assert run.requests["prompt_tokens"].tolist() == [4]
        assert "no prompt identity: every prompt is unique (prefix caching cannot be replayed)" in run.notes


def test_llmservingsim_reader_names_a_workload_line_without_token_ids(tmp_path: Path) -> None:
    requests = [
        _lss_request(f"bench-{index}", 4, 1, float(index), float(index), float(index)) for index in range(3)
    ]
    folder = _lss_folder(tmp_path, {"engine_kwargs": {}}, requests)
    workload = _workload(tmp_path / "w.jsonl", [[1, 2, 3, 4], None, [5, 6, 7, 8]])
    with _raises(f"{workload}:2: input_tok_ids must be a list of integers"):
        read_llmservingsim_bench(folder, workload=workload)
    workload = _workload(tmp_path / "w.jsonl", [[1, 2, 3, 4], [1, 2, 3, 4.5], [5, 6, 7, 8]])
    with _raises(f"{workload}:2: input_tok_ids must be a list of integers"):
        read_llmservingsim_bench(folder, workload=workload)
    workload = _workload(tmp_path / "w.jsonl", [[1, 2, 3, 4], [1, 2, 3, 5]])
    with _raises(f"{workload}: has no line for request 2 (2 lines)"):
        read_llmservingsim_bench(folder, workload=workload)


@pytest.mark.parametrize(
    ("text", "columns", "zero_note"),
    [
        ("t,waiting\n1,3\n", {"time_s": [1.0], "waiting": [3.0]}, False),
        ("t,running,kv_cache_pct\n1,2,0\n2,2,0\n", {"time_s": [1.0, 2.0], "running": [2.0, 2.0]}, True),
    ],
)
def test_llmservingsim_timeseries_takes_the_columns_it_has(
    tmp_path: Path, text: str, columns: dict[str, list[float]], zero_note: bool
) -> None:
    meta = {"engine_kwargs": {}, "dataset_path": "w.jsonl", "kv_cache": {"num_gpu_blocks": 10}}
    folder = _lss_folder(tmp_path, meta, [_lss_request("bench-0", 1, 1, 0.0, 0.0, 0.0)], timeseries=text)
    (folder / "w.jsonl").write_text("")
    run = read_llmservingsim_bench(folder, use_token_ids=False)
    pd.testing.assert_frame_equal(run.timeseries, pd.DataFrame(columns))
    zero = "its timeseries.csv has kv_cache_pct 0 throughout (not recorded): KV usage is not compared"
    assert run.notes[2:] == ([zero, SAMPLES_ON_CLOCK] if zero_note else [SAMPLES_ON_CLOCK])


def test_llmservingsim_timeseries_errors_name_the_file(tmp_path: Path) -> None:
    meta = {"engine_kwargs": {}, "dataset_path": "w.jsonl"}
    folder = _lss_folder(tmp_path, meta, [_lss_request("bench-0", 1, 1, 0.0, 0.0, 0.0)], timeseries="")
    (folder / "w.jsonl").write_text("")
    series = folder / "vllm" / "timeseries.csv"
    with _raises(f"{series}: cannot read: No columns to parse from file"):
        read_llmservingsim_bench(folder, use_token_ids=False)
    series.write_text("time,running\n1,2\n")
    with _raises(f"{series}: missing column t"):
        read_llmservingsim_bench(folder, use_token_ids=False)


# --------------------------------------------------------------------------------------------------
# vllm bench serve --save-result --save-detailed
# --------------------------------------------------------------------------------------------------

CLIENT_SIDE = "latencies are client-side (vllm bench serve: HTTP, the API server and streaming included)"
NO_PROMPTS_SAVED = "prompt content is not saved by vllm bench serve: every prompt is replayed as unique"


def _bench(path: Path, **data: Any) -> Path:
    base = {
        "model_id": "org/bench-model",
        "request_rate": 2.0,
        "input_lens": [10, 20, 30, 40],
        "output_lens": [3, 1, 5, 2],
        "ttfts": [0.5, 0.25, 0.1, 0.2],
        "itls": [[0.25, 0.5], [], [0.1] * 4, [0.125]],
    }
    path.write_text(json.dumps({key: value for key, value in (base | data).items() if value is not None}))
    return path


def test_vllm_bench_reader_returns_every_field_of_the_run(tmp_path: Path) -> None:
    # no burstiness (Poisson) and no arrival_seed (0); a request with an error, one with no output
    path = _bench(
        tmp_path / "bench.json",
        request_rate=0.5,
        output_lens=[3, 1, 5, 0],
        ttfts=[0.5, 0.25, 0.1, 0.0],
        itls=[[0.25, 0.5], [], [0.1] * 4, []],
        errors=["", "", "boom", ""],
    )
    run = read_vllm_bench_json(path, gpu="H100-80GB")
    # the client's process: gamma(1, 1 / 0.5) gaps, the first at 0, seed 0
    gaps = np.random.default_rng(0).gamma(1.0, 2.0, 4)
    gaps[0] = 0.0
    arrivals = np.cumsum(gaps).tolist()
    assert run.requests["arrival_s"].tolist() == arrivals
    nan = math.nan
    expected = _frame(
        arrival_s=arrivals,
        prompt_tokens=[10, 20, 30, 40],
        output_tokens=[3, 1, 5, 1],  # no output (failed) still counts one token
        ttft_s=[0.5, 0.25, nan, nan],  # an error fails a request even with output
        e2e_s=[1.25, 0.25, nan, nan],  # TTFT + the ITLs: 0.5 + 0.75; one token: E2E = TTFT
    )
    pd.testing.assert_frame_equal(run.requests, expected)
    assert (run.name, run.source_format, run.path) == ("bench", "vllm_bench_json", path)
    assert (run.anchor, run.tpot_definition, run.max_concurrency) == ("client", "per_request", None)
    assert run.settings == ServerSettings(
        model="org/bench-model", gpu="H100-80GB", engine_version="vLLM (bench serve)"
    )
    assert run.stages == [Stage(0.0, arrivals[-1], 0.5)]  # the recorded rate, not the observed one
    assert run.prompt_hashes is None and run.timeseries is None
    assert run.notes == [
        CLIENT_SIDE,
        "no start_times: arrivals regenerated from request_rate=0.5/s, burstiness=1 with seed 0 (the same "
        "process as the client's, not its draws)",
        NO_PROMPTS_SAVED,
    ]


def test_vllm_bench_reader_replays_recorded_send_times_in_order(tmp_path: Path) -> None:
    sends = [1e9 + 1.3, 1e9 + 0.1, 1e9 + 0.6]  # epoch seconds, not in order
    path = _bench(
        tmp_path / "sent.json",
        request_rate="inf",
        start_times=sends,
        input_lens=[10, 20, 30],
        output_lens=[3, 1, 5],
        ttfts=[0.5, 0.25, 0.125],
        itls=[[0.25, 0.5], [], [0.25] * 4],
        errors=None,  # no errors key: every request with output was served
    )
    run = read_vllm_bench_json(path, model="my-model", settings=lambda s: replace(s, max_num_seqs=8))
    # from the first send, each in the float arithmetic of one subtraction
    offsets = [sends[1] - sends[1], sends[2] - sends[1], sends[0] - sends[1]]
    expected = _frame(
        arrival_s=offsets,
        prompt_tokens=[20, 30, 10],
        output_tokens=[1, 5, 3],
        ttft_s=[0.25, 0.125, 0.5],
        e2e_s=[0.25, 1.125, 1.25],
    )
    pd.testing.assert_frame_equal(run.requests, expected, check_exact=True)
    assert run.settings == ServerSettings(
        model="my-model", max_num_seqs=8, engine_version="vLLM (bench serve)"
    )
    assert run.stages == [Stage(0.0, offsets[-1], 2 / offsets[-1])]  # no numeric rate: 2 gaps observed
    assert run.notes == [
        CLIENT_SIDE,
        "arrivals are the client's recorded send times (start_times)",
        NO_PROMPTS_SAVED,
    ]


def test_vllm_bench_two_sends_give_an_observed_rate(tmp_path: Path) -> None:
    path = _bench(
        tmp_path / "two.json",
        request_rate=None,
        start_times=[100.0, 100.25],
        input_lens=[10, 20],
        output_lens=[3, 1],
        ttfts=[0.5, 0.25],
        itls=[[0.25, 0.5], []],
    )
    assert read_vllm_bench_json(path).stages == [Stage(0.0, 0.25, 4.0)]  # 1 gap in 0.25 s


def test_vllm_bench_rate_inf_without_send_times_sends_everything_at_zero(tmp_path: Path) -> None:
    path = _bench(tmp_path / "burst.json", request_rate="inf")
    run = read_vllm_bench_json(path)
    assert run.requests["arrival_s"].tolist() == [0.0] * 4
    assert run.requests["prompt_tokens"].tolist() == [10, 20, 30, 40]
    assert run.notes[1] == "request_rate inf and no start_times: every request is replayed as sent at t = 0"


def test_vllm_bench_requests_sent_at_the_same_time_keep_the_files_order(tmp_path: Path) -> None:
    # 20 requests sent at 100 s and 101 s alternately: the sort by send time is stable, so the
    # even-numbered ones (prompts 1, 3, ..., 19) come first in the file's order, then the odd ones
    count = 20
    path = _bench(
        tmp_path / "ties.json",
        start_times=[100.0 + index % 2 for index in range(count)],
        input_lens=list(range(1, count + 1)),
        output_lens=[1] * count,
        ttfts=[0.1] * count,
        itls=[[]] * count,
    )
    run = read_vllm_bench_json(path)
    assert run.requests["prompt_tokens"].tolist() == [*range(1, count + 1, 2), *range(2, count + 1, 2)]
    assert run.requests["arrival_s"].tolist() == [0.0] * 10 + [1.0] * 10


def test_vllm_bench_bursty_arrivals_are_the_clients_gamma_draws(tmp_path: Path) -> None:
    path = _bench(tmp_path / "bursty.json", burstiness=4.0)
    run = read_vllm_bench_json(path, arrival_seed=2)
    # rate 2, burstiness 4: gamma(4, 1 / (2 x 4)) gaps, the first one 0; cumulated, nothing shifted
    gaps = np.random.default_rng(2).gamma(4.0, 0.125, 4)
    gaps[0] = 0.0
    assert run.requests["arrival_s"].tolist() == np.cumsum(gaps).tolist()
    assert run.notes[1] == (
        "no start_times: arrivals regenerated from request_rate=2/s, burstiness=4 with seed 2 (the same "
        "process as the client's, not its draws)"
    )


@pytest.mark.parametrize(("value", "expected"), [(0, None), (1, 1)])
def test_vllm_bench_max_concurrency_zero_is_no_limit(
    tmp_path: Path, value: int, expected: int | None
) -> None:
    path = _bench(tmp_path / "loop.json", max_concurrency=value, request_rate="inf")
    run = read_vllm_bench_json(path)
    assert run.max_concurrency == expected
    if expected is not None:
        assert run.notes[1] == (
            "closed loop (max_concurrency=1): each request is sent when one of the 1 slots frees, as the "
            "client did; the recorded send times are not replayed (the client's own delay between a "
            "finish and the next send is not modelled)"
        )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"itls": None}, ": missing field(s) itls"),
        ({"input_lens": "abc"}, ": input_lens must be a list (one entry per request)"),
        ({"ttfts": [0.1]}, ": ttfts must be a list of 4 entries (one per request)"),
        ({"input_lens": [10, 2.5, 30, 40]}, ": input_lens[1] must be a whole number, got 2.5"),
        ({"output_lens": [3, 2.5, 5, 2]}, ": output_lens[1] must be a whole number, got 2.5"),
        ({"ttfts": [-1, 0.25, 0.1, 0.2]}, ": ttfts[0] must be finite and >= 0, got -1"),
        ({"itls": [0.5, [], [], []]}, ": itls[0] must be a list (request 0)"),
        ({"itls": [[0.1, "x"], [], [], []]}, ": itls[0] must be a number, got 'x'"),
        ({"start_times": [1, 2, -1, 3]}, ": start_times must be finite and >= 0, got -1"),
        ({"max_concurrency": 2.5}, ": max_concurrency must be a whole number, got 2.5"),
        ({"request_rate": "-1"}, ": request_rate must be finite and >= 0, got '-1'"),
        ({"request_rate": 0}, ": request_rate and burstiness must be positive"),
        ({"burstiness": "0"}, ": request_rate and burstiness must be positive"),  # "0" is not a missing value
        ({"burstiness": "x"}, ": burstiness must be a number, got 'x'"),
    ],
)
def test_vllm_bench_reader_names_the_file_and_the_bad_entry(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    path = _bench(tmp_path / "bad.json", **change)
    with _raises(f"{path}{message}"):
        read_vllm_bench_json(path)


# --------------------------------------------------------------------------------------------------
# Text encoding
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def ascii_locale():
    """The C locale, where Python's default text encoding is ASCII (as a cp1252 or latin-1 host's is
    not UTF-8 either): the readers must not depend on it."""
    saved = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")
    try:
        if locale.getpreferredencoding(False).lower().replace("-", "") == "utf8":
            pytest.skip("the C locale's encoding is UTF-8 on this platform")
        yield
    finally:
        locale.setlocale(locale.LC_CTYPE, saved)


def test_readers_read_utf8_whatever_the_locale(tmp_path: Path, ascii_locale: None) -> None:
    _runs_csv(tmp_path / "runs.csv", model="org/modèle")
    run = read_blis_csv(_blis_csv(tmp_path / "r1.csv", ["0,0.0,40,5,0,0.03,0.07"]), prompts=None)
    assert run.settings.model == "org/modèle"
    meta = {"model": "org/modèle", "engine_kwargs": {}, "dataset_path": "w.jsonl"}
    folder = _lss_folder(tmp_path, meta, ['{"note": "é", ' + json.dumps(_lss_request(7, 1, 1, 0, 0, 0))[1:]])
    (folder / "w.jsonl").write_text("")
    assert read_llmservingsim_bench(folder, use_token_ids=False).settings.model == "org/modèle"
