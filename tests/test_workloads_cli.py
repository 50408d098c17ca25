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


AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def test_a_relative_path_is_read_from_the_current_folder(tmp_path: Path, monkeypatch, capsys) -> None:
    (tmp_path / "conv.csv").write_text(AZURE_HEADER + "2023-11-16 18:00:00,5,1\n2023-11-16 18:00:01,7,2\n")
    monkeypatch.chdir(tmp_path)
    for name in ("conv.csv", "./conv.csv"):
        assert run(["trace-stats", name, "--json"]) == 0, capsys.readouterr().err
        assert json.loads(capsys.readouterr().out)["requests"] == 2
    assert run(["trace-stats", "other.csv"]) == 2
    assert capsys.readouterr().err == "kvsim trace-stats: error: other.csv: file not found\n"


def test_a_refused_raw_file_names_the_flag_that_accepts_it(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(AZURE_HEADER + "2023-11-16 18:00:00,5,1\n2023-11-16 18:00:01,5\n")
    assert run(["trace-stats", str(bad)]) == 2
    assert capsys.readouterr().err == (
        f"kvsim trace-stats: error: {bad}:3: expected 3 fields, found 2 (rerun with --skip-bad-rows to skip "
        "such rows)\n"
    )
    unsorted = tmp_path / "unsorted.csv"
    unsorted.write_text(AZURE_HEADER + "2023-11-16 18:00:05,5,1\n2023-11-16 18:00:01,5,1\n")
    assert run(["trace-stats", str(unsorted)]) == 2
    assert capsys.readouterr().err.endswith("at line 2 (rerun with --sort to sort the trace)\n")
    # A config is read with its own settings: the message names the setting, as kvsim run's does.
    config = tmp_path / "replay.yaml"
    config.write_text(f"workload: {{source: {{kind: azure, path: {bad}}}}}\n")
    assert run(["trace-stats", str(config)]) == 2
    assert capsys.readouterr().err.endswith("(set on_bad_row: skip to skip such rows)\n")


def test_skipped_rows_are_one_warning_line_with_the_count_and_the_first(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(
        AZURE_HEADER
        + "2023-11-16 18:00:00,5,1\n"
        + "2023-11-16 18:00:01,x,1\n"  # line 3: not a count
        + "2023-11-16 18:00:02,5\n"  # line 4: a field short
        + "2023-11-16 18:00:03,y,1\n"  # line 5: not a count again
        + "2023-11-16 18:00:04,6,2\n"
    )
    assert run(["trace-stats", str(bad), "--skip-bad-rows"]) == 0
    captured = capsys.readouterr()
    assert "rows_skipped=3" in captured.out
    assert captured.err == (
        f"kvsim trace-stats: warning: {bad}: skipped 3 malformed rows; the first, line 3: ContextTokens is "
        "'x', not a number\n"
    )


def test_kvsim_run_prints_a_skipped_row_as_one_warning_line(tmp_path: Path, capsys) -> None:
    from sim.cli import main

    (tmp_path / "conv.csv").write_text(AZURE_HEADER + "2023-11-16 18:00:00,5,1\n2023-11-16 18:00:01,5\n")
    config = tmp_path / "replay.yaml"
    config.write_text(
        "name: replay\nmodel: Llama-3.1-8B\ngpu: A100-80GB\n"
        "workload: {source: {kind: azure, path: conv.csv}, on_bad_row: skip}\n"
        "variants: [{name: paged, policy: paged}]\noutput: {figures: false}\n"
    )
    assert main(["run", str(config), "-o", str(tmp_path / "out"), "-q"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line.lower()]
    assert warnings == [
        f"kvsim: warning: {tmp_path}/conv.csv:3: expected 3 fields, found 2; skipping such rows "
        "(counted in describe())"
    ]
