"""``kvsim trace-stats``: registered on a parser, prints a table, exits with a code."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from workloads.cli import register

DATA = Path(__file__).parent / "data" / "traces"


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kvsim")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_table_for_a_trace_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        run(
            [
                "trace-stats",
                str(DATA / "mooncake/conversation_trace_head300.jsonl"),
                "--block-size",
                "16",
                "--block-size",
                "512",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "(mooncake)" in out and "requests" in out and "300" in out
    assert "req/s" in out and "inter-arrival CV" in out and "prompt tokens" in out
    assert "full 16-token blocks" in out and "full 512-token blocks" in out
    assert "hash ids (512-token blocks)" in out


def test_json_output_and_length_tables(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        run(
            [
                "trace-stats",
                str(DATA / "etalon/sharegpt_8k_filtered_stats_llama2_tokenizer_head200.csv"),
                "--json",
            ]
        )
        == 0
    )
    stats = json.loads(capsys.readouterr().out)
    assert stats["requests"] == 200 and stats["format"] == "length_table" and "span_s" not in stats


def test_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "exp.yaml"
    config.write_text(
        "seed: 5\n"
        "workload:\n"
        "  num_requests: 400\n"
        "  arrival: {kind: poisson, rate_per_s: 4}\n"
        "  prompt_len: 100\n"
        "  output_len: 10\n"
        "  shared_prefix: {num_prefixes: 1, prefix_len: 300}\n"
    )
    assert run(["trace-stats", str(config), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["requests"] == 400 and stats["workload"]["seed"] == 5
    # every request after the first finds the 300-token system prompt cached
    assert stats["prefix_reuse"]["cached_prompt_tokens"] == 399 * 300
    azure = tmp_path / "azure.yaml"
    azure.write_text(
        f"source: {{kind: azure, path: {DATA / 'azure/AzureLLMInferenceTrace_code_head200.csv'}}}\ntime_scale: 2\n"
    )
    assert run(["trace-stats", str(azure)]) == 0
    assert "prefix reuse" in capsys.readouterr().out


def test_errors_exit_with_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["trace-stats", str(tmp_path / "missing.csv")]) == 2
    assert "file not found" in capsys.readouterr().err
    bad = tmp_path / "bad.csv"
    bad.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00,x,1\n2023-11-16 18:00:01,5,1\n"
    )
    assert run(["trace-stats", str(bad)]) == 2
    assert "bad.csv:2: ContextTokens is 'x'" in capsys.readouterr().err
    with pytest.warns(UserWarning):
        assert run(["trace-stats", str(bad), "--skip-bad-rows"]) == 0
    assert "rows_skipped=1" in capsys.readouterr().out
    unknown = tmp_path / "u.csv"
    unknown.write_text("a,b\n1,2\n")
    assert run(["trace-stats", str(unknown)]) == 2
    assert "unknown CSV columns ['a', 'b']" in capsys.readouterr().err
    config = tmp_path / "c.yaml"
    config.write_text("workload: {num_requests: 3, arrival: {kind: poisson}, prompt_len: 1, output_len: 1}\n")
    assert run(["trace-stats", str(config)]) == 2
    assert "rate_per_s" in capsys.readouterr().err
