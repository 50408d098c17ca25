"""kvsim replay-run: readers of measured runs, prompt identity, the comparison's arithmetic, and a
replay of a run kvsim itself produced (which must come back with no error)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

from sim.config import ConfigError
from sim.replay.compare import compare, headline_tpot, in_system, paired_frame, per_request_tpot, throughput
from sim.replay.measured import MeasuredRun, ServerSettings, Stage
from sim.replay.prompts import ChainInterner, CyclingPrompts, chains_from_token_ids
from sim.replay.readers import (
    ReplayInputError,
    read_blis_csv,
    read_llmservingsim_bench,
    read_vllm_bench_json,
)
from sim.replay.spec import load_replay_spec, read_run, validate_replay_spec

DATA = Path(__file__).parent / "data" / "replays"
LSS_RUN = DATA / "lss" / "bench" / "examples" / "GPU" / "Model"


# --------------------------------------------------------------------------------------------------
# Prompt identity
# --------------------------------------------------------------------------------------------------


def test_token_chains_share_exactly_the_common_leading_blocks() -> None:
    a = list(range(40))
    b = [*range(32), 9, 9, 9, 9]  # first two 16-token blocks equal to a's
    c = [*range(16), 5, *range(17, 40)]  # differs inside block 2: only block 1 shared
    chains = chains_from_token_ids([a, b, c, a], block_len=16)
    assert chains[0] == [0, 1, 2]
    assert chains[1] == [0, 1, 3]
    assert chains[2] == [0, 4, 5]  # block 3's tokens equal a's, but its prefix differs: a new id
    assert chains[3] == chains[0]


def test_interner_numbers_pairs_in_first_seen_order() -> None:
    interner = ChainInterner()
    assert interner.chain(["x", "y"]) == [0, 1]
    assert interner.chain(["y"]) == [2]  # "y" after nothing is not "y" after "x"
    assert len(interner) == 3


def test_cycling_prompts_share_system_blocks_in_a_group_and_repeat_prompts() -> None:
    rule = CyclingPrompts(distinct=4, group_size=2, system_prompt_tokens=40)
    # 6 requests of 70 tokens: prompts 0,1,2,3,0,1; groups {0,1}, {2,3}; 40 // 16 = 2 system blocks
    chains = rule.chains([70] * 6, block_len=16)
    assert [len(chain) for chain in chains] == [5] * 6  # ceil(70 / 16)
    assert chains[0][:2] == chains[1][:2]  # same group: the system prompt's two full blocks
    assert chains[0][2] != chains[1][2]  # block 3 holds system and question tokens: the prompt's own
    assert chains[0][:2] != chains[2][:2]  # another group
    assert chains[4] == chains[0] and chains[5] == chains[1]  # request 4 repeats prompt 0


def test_cycling_prompts_reject_nonsense() -> None:
    with pytest.raises(ValueError, match="distinct"):
        CyclingPrompts(distinct=0, group_size=10, system_prompt_tokens=100)


# --------------------------------------------------------------------------------------------------
# Readers
# --------------------------------------------------------------------------------------------------


def test_blis_reader_takes_settings_stages_and_server_output_counts() -> None:
    run = read_blis_csv(DATA / "blis" / "run-a.csv", run="run-a", gpu="H100-80GB")
    settings = run.settings
    assert (settings.model, settings.max_num_seqs, settings.num_gpu_blocks) == (
        "meta-llama/Llama-2-7b-hf",
        64,
        4000,
    )
    assert run.stages == [Stage(0.0, 1.0, 4.0), Stage(1.0, 2.0, 8.0)]
    requests = run.requests
    assert requests["stage"].tolist() == [0, 0, 0, 1, 1, 1]
    assert requests["output_tokens"].tolist() == [5, 5, 5, 5, 5, 6]  # the server's, not the client's
    assert math.isnan(requests["ttft_s"].iloc[4])  # has_error: no latency
    assert run.anchor == "client" and run.tpot_definition == "ratio_of_means"
    # the runs.csv rule: prompt i mod 100, groups of 10, a 32-token system prompt (two 16-token blocks)
    assert run.prompt_hashes is not None
    assert run.prompt_hashes[0][:2] == run.prompt_hashes[1][:2]
    assert run.prompt_hashes[0][2] != run.prompt_hashes[1][2]


def test_blis_reader_names_the_file_and_line_of_a_bad_row(tmp_path: Path) -> None:
    shutil.copy(DATA / "blis" / "runs.csv", tmp_path / "runs.csv")
    text = (DATA / "blis" / "run-a.csv").read_text().replace("0.5,72,4,5", "0.5,seventy,4,5")
    (tmp_path / "run-a.csv").write_text(text)
    with pytest.raises(ReplayInputError, match=r"run-a\.csv:4: input_tokens must be a number, got 'seventy'"):
        read_blis_csv(tmp_path / "run-a.csv")


def test_blis_reader_refuses_arrivals_going_backwards(tmp_path: Path) -> None:
    shutil.copy(DATA / "blis" / "runs.csv", tmp_path / "runs.csv")
    text = (DATA / "blis" / "run-a.csv").read_text().replace("\n3,1.0,", "\n3,0.1,")
    (tmp_path / "run-a.csv").write_text(text)
    with pytest.raises(ReplayInputError, match=r"run-a\.csv:5: arrival_s 0.1 is before the previous row's"):
        read_blis_csv(tmp_path / "run-a.csv")


def test_blis_reader_names_an_unknown_run() -> None:
    with pytest.raises(ReplayInputError, match=r"no run named 'run-b' \(runs: run-a\)"):
        read_blis_csv(DATA / "blis" / "run-a.csv", run="run-b")


def test_llmservingsim_reader_sorts_by_queue_time_and_anchors_there() -> None:
    run = read_llmservingsim_bench(LSS_RUN)
    requests = run.requests
    # queued at 100.0, 100.2 (bench-1), 100.3 (bench-2): sorted, shifted to 0
    assert requests["arrival_s"].round(9).tolist() == [0.0, 0.2, 0.3]
    assert requests["prompt_tokens"].tolist() == [40, 36, 20]
    assert requests["ttft_s"].round(9).tolist() == [0.05, 0.05, 0.02]
    assert requests["e2e_s"].round(9).tolist() == [0.07, 0.11, 0.04]
    assert run.anchor == "engine" and run.settings.num_gpu_blocks == 500
    assert run.settings.gpu == "NVIDIA H100 80GB HBM3"
    # bench-1 shares its first two 16-token blocks with bench-0 (token ids in tiny.jsonl)
    assert run.prompt_hashes == [[0, 1, 2], [0, 1, 3], [4, 5]]
    assert run.timeseries is not None and run.timeseries["kv_usage_frac"].tolist() == [0.125]


def test_llmservingsim_reader_refuses_a_workload_that_does_not_match(tmp_path: Path) -> None:
    lines = (DATA / "lss" / "workloads" / "tiny.jsonl").read_text().splitlines()
    item = json.loads(lines[1])
    item["input_tok_ids"] = item["input_tok_ids"][:-1]
    lines[1] = json.dumps(item)
    (tmp_path / "other.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ReplayInputError, match="line 2 has 35 token ids, but the run measured input_toks=36"):
        read_llmservingsim_bench(LSS_RUN, workload=tmp_path / "other.jsonl")


def test_llmservingsim_reader_names_a_broken_line(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    shutil.copytree(LSS_RUN, folder)
    requests = folder / "vllm" / "requests.jsonl"
    requests.write_text(requests.read_text() + '{"request_id": "bench-3", "input_toks": 5\n')
    with pytest.raises(ReplayInputError, match=r"requests\.jsonl:4: not valid JSON"):
        read_llmservingsim_bench(folder, workload=DATA / "lss" / "workloads" / "tiny.jsonl")


def test_vllm_bench_reader_regenerates_arrivals_and_sums_inter_token_latencies() -> None:
    run = read_vllm_bench_json(DATA / "vllm-bench.json", gpu="H100-80GB", arrival_seed=3)
    gaps = np.random.default_rng(3).gamma(1.0, 1.0 / 2.0, 4)
    gaps[0] = 0.0
    assert run.requests["arrival_s"].tolist() == pytest.approx(np.cumsum(gaps).tolist())
    assert run.requests["e2e_s"].iloc[0] == pytest.approx(0.05 + 9 * 0.01)
    assert math.isnan(run.requests["ttft_s"].iloc[2])  # the failed request
    assert any("regenerated" in note for note in run.notes)
    assert run.prompt_hashes is None


def test_vllm_bench_arrivals_follow_the_clients_gamma_and_its_send_times(tmp_path: Path) -> None:
    # vLLM's client draws gaps from a gamma of shape `burstiness` and scale 1 / (rate x burstiness),
    # so their mean stays 1 / rate whatever the burstiness (at 1 it is Poisson, where any scale
    # parameterisation agrees): at rate 2 and burstiness 4, gamma(4, 1 / 8).
    data = json.loads((DATA / "vllm-bench.json").read_text()) | {"burstiness": 4.0}
    (tmp_path / "bursty.json").write_text(json.dumps(data))
    run = read_vllm_bench_json(tmp_path / "bursty.json", gpu="H100-80GB", arrival_seed=3)
    gaps = np.random.default_rng(3).gamma(4.0, 1.0 / 8.0, 4)
    gaps[0] = 0.0
    assert run.requests["arrival_s"].tolist() == pytest.approx(np.cumsum(gaps).tolist())
    # Recorded send times (epoch seconds) are replayed from the first send; with no numeric rate
    # ("inf") the one stage's rate is the observed one, 3 gaps over 2 s.
    sends = [1e9, 1e9 + 0.5, 1e9 + 1, 1e9 + 2]
    data = json.loads((DATA / "vllm-bench.json").read_text()) | {"start_times": sends, "request_rate": "inf"}
    (tmp_path / "sent.json").write_text(json.dumps(data))
    run = read_vllm_bench_json(tmp_path / "sent.json", gpu="H100-80GB")
    assert run.requests["arrival_s"].tolist() == pytest.approx([0.0, 0.5, 1.0, 2.0])
    assert [stage.rate_per_s for stage in run.stages] == [pytest.approx(1.5)]


def test_vllm_bench_reader_replays_a_closed_loop_as_a_loop(tmp_path: Path) -> None:
    data = json.loads((DATA / "vllm-bench.json").read_text())
    data |= {"max_concurrency": 2, "request_rate": "inf", "start_times": [5.0, 5.1, 9.0, 9.5]}
    (tmp_path / "bench.json").write_text(json.dumps(data))
    run = read_vllm_bench_json(tmp_path / "bench.json")
    assert run.max_concurrency == 2
    assert run.requests["arrival_s"].tolist() == [0.0] * 4  # rate inf: each goes when a slot frees
    assert any("closed loop (max_concurrency=2)" in note for note in run.notes)


def test_replay_file_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"run\.pth: unknown key"):
        validate_replay_spec({"name": "x", "run": {"pth": "a.csv"}}, "replay.yaml")
    with pytest.raises(ConfigError, match="unknown engine key"):
        validate_replay_spec(
            {"name": "x", "run": {"path": "a.csv"}, "engine": {"max_seqs": 4}}, "replay.yaml"
        )


# --------------------------------------------------------------------------------------------------
# The comparison's arithmetic, against a hand computation
# --------------------------------------------------------------------------------------------------


def _run(requests: pd.DataFrame, stages: list[Stage], definition: str = "per_request") -> MeasuredRun:
    return MeasuredRun(
        name="hand",
        source_format="test",
        path=Path("."),
        requests=requests,
        settings=ServerSettings(),
        anchor="engine",
        tpot_definition=definition,  # type: ignore[arg-type]
        stages=stages,
    )


def test_comparison_numbers_equal_a_hand_computation() -> None:
    measured = pd.DataFrame(
        {
            "request_id": [0, 1, 2, 3],
            "arrival_s": [0.0, 1.0, 2.0, 3.0],
            "prompt_tokens": [10, 10, 10, 10],
            "output_tokens": [3, 5, 3, 2],
            "ttft_s": [0.1, 0.2, 0.3, np.nan],  # request 3 failed in the measured run
            "e2e_s": [0.5, 1.0, 0.7, np.nan],
            "stage": [0, 0, 1, 1],
        }
    )
    simulated = pd.DataFrame(
        {
            "request_id": [3, 2, 1, 0],  # any order: paired by id
            "outcome": ["finished", "unfinished", "finished", "finished"],
            "ttft_s": [0.05, 9.0, 0.3, 0.2],
            "e2e_s": [0.2, 9.9, 1.1, 0.6],
            "preemptions": [0, 0, 0, 0],
            "cached_prompt_tokens": [0, 0, 0, 0],
        }
    )
    run = _run(measured, [Stage(0, 2, 1.0), Stage(2, 4, 1.0)])
    paired = paired_frame(run, simulated)
    assert math.isnan(paired.loc[2, "ttft_s_simulated"])  # unfinished in the simulation
    scopes = compare(run, paired)
    whole = scopes[0]
    assert (whole.requests, whole.compared) == (4, 2)  # requests 0 and 1 finished on both sides
    assert whole.not_compared == {"measured_failed": 1, "unfinished": 1}
    ttft = whole.metrics["ttft_s"]
    assert ttft["measured"]["mean"] == pytest.approx(0.15)
    assert ttft["simulated"]["mean"] == pytest.approx(0.25)
    assert ttft["signed_error"]["mean"] == pytest.approx(0.25 / 0.15 - 1)
    # per-request TPOT: measured (0.5-0.1)/2 = 0.2, (1.0-0.2)/4 = 0.2; simulated 0.2, 0.2
    assert whole.metrics["tpot_s"]["measured"]["headline"] == pytest.approx(0.2)
    assert whole.metrics["tpot_s"]["simulated"]["headline"] == pytest.approx(0.2)
    assert whole.metrics["e2e_s"]["abs_error"]["mean"] == pytest.approx(abs(0.85 / 0.75 - 1))
    assert [scope.name for scope in scopes] == [
        "whole run",
        "stage 1 (0-2 s at 1 req/s)",
        "stage 2 (2-4 s at 1 req/s)",
    ]
    assert scopes[2].compared == 0
    # throughput: measured finishes 3 requests (11 tokens) by 2.7 s; simulated 3 by 3.2 s
    flows = whole.throughput
    assert flows["measured"]["output_tokens_per_s"] == pytest.approx(11 / 2.7)
    assert flows["simulated"]["output_tokens_per_s"] == pytest.approx(10 / 3.2)


def test_ratio_of_means_tpot_is_the_publishers_formula() -> None:
    frame = pd.DataFrame({"ttft_s": [0.1, 0.3], "e2e_s": [1.1, 2.3], "output_tokens": [11, 21]})
    assert headline_tpot(frame, "ratio_of_means") == pytest.approx((1.7 - 0.2) / 15)
    assert headline_tpot(frame, "per_request") == pytest.approx((0.1 + 0.1) / 2)
    assert per_request_tpot(frame).tolist() == pytest.approx([0.1, 0.1])


def test_a_single_token_output_has_no_tpot_and_a_failure_still_starts_the_span() -> None:
    # A one-token output decodes nothing: no TPOT (not a division by zero), left out of the mean. (A
    # client's clock can still put its end after its first token: measured E2E 0.6 s, TTFT 0.5 s.)
    frame = pd.DataFrame({"ttft_s": [0.5, 0.5], "e2e_s": [0.6, 1.5], "output_tokens": [1, 3]})
    tpot = per_request_tpot(frame)
    assert math.isnan(tpot[0]) and tpot[1] == pytest.approx(0.5)
    assert headline_tpot(frame, "per_request") == pytest.approx(0.5)
    # Throughput spans the first arrival to the last finish, whether the first request finished or
    # not: arrivals 0, 1, 2 s, the first failed (no E2E), the others end at 2 and 4 s: 2 requests and
    # 3 + 5 output tokens over 4 s.
    runs = pd.DataFrame(
        {"arrival_s": [0.0, 1.0, 2.0], "e2e_s": [math.nan, 1.0, 2.0], "output_tokens": [7, 3, 5]}
    )
    assert throughput(runs) == pytest.approx({"requests_per_s": 0.5, "output_tokens_per_s": 2.0})


def test_in_system_counts_arrived_and_unfinished_requests() -> None:
    arrivals = np.array([0.0, 1.0, 2.0])
    e2e = np.array([1.5, 0.5, np.nan])  # the third never finished: not counted
    assert in_system(arrivals, e2e, np.array([0.5, 1.2, 1.6, 3.0])).tolist() == [1, 2, 0, 0]


# --------------------------------------------------------------------------------------------------
# End to end: kvsim's own output, replayed, comes back with no error
# --------------------------------------------------------------------------------------------------


def _self_measured_run(tmp_path: Path) -> Path:
    """A 'measured' run that kvsim produced: a small experiment's per-request table written as a
    vllm bench serve result with start_times."""
    data = {
        "name": "self",
        "model": "Llama-2-7B",
        "gpu": "H100-80GB",
        "engine": {"max_num_seqs": 256, "max_num_batched_tokens": 8192},
        "workload": {
            "num_requests": 40,
            "arrival": {"kind": "poisson", "rate_per_s": 20},
            "prompt_len": {"kind": "uniform", "low": 50, "high": 400},
            "output_len": {"kind": "uniform", "low": 5, "high": 60},
        },
        "variants": [{"name": "p", "policy": "paged"}],
    }
    return measured_by_kvsim(data, tmp_path, rate_per_s=20.0)


def measured_by_kvsim(experiment: dict[str, Any], folder: Path, rate_per_s: float) -> Path:
    """``experiment`` run by kvsim, its per-request table written as a ``vllm bench serve`` result
    with start_times (``folder/bench.json``): a 'measured' run whose truth is known."""
    from sim.config import validate_experiment
    from sim.runner import prepare_experiment, run_experiment

    config_path = folder / "measured-by-kvsim.yaml"
    config = validate_experiment(experiment, config_path)
    results = run_experiment(config, config_path, prepared=prepare_experiment(config, config_path))
    table = results[0].sink.requests().sort_values("request_id")
    assert (table["outcome"] == "finished").all()
    itls = [
        [(e2e - ttft) / (out - 1)] * (out - 1)
        for e2e, ttft, out in zip(table["e2e_s"], table["ttft_s"], table["output_tokens"], strict=True)
    ]
    bench = {
        "model_id": "meta-llama/Llama-2-7b-hf",
        "request_rate": rate_per_s,
        "start_times": (table["arrival_s"] + 1000.0).tolist(),  # any origin
        "input_lens": table["prompt_tokens"].tolist(),
        "output_lens": table["output_tokens"].tolist(),
        "ttfts": table["ttft_s"].tolist(),
        "itls": itls,
        "errors": [""] * len(table),
    }
    path = folder / "bench.json"
    path.write_text(json.dumps(bench))
    return path


def test_replaying_kvsims_own_run_gives_no_error(tmp_path: Path) -> None:
    from sim.replay.pipeline import replay_run

    bench = _self_measured_run(tmp_path)
    spec = validate_replay_spec(
        {
            "name": "self-replay",
            "run": {"path": str(bench)},
            "gpu": "H100-80GB",
            "policy": "paged",
            "engine": {"max_num_seqs": 256, "max_num_batched_tokens": 8192},
        },
        "test",
    )
    outcome = replay_run(spec, tmp_path, tmp_path / "out")
    for error in outcome.document["headline"].values():
        assert abs(error) < 1e-9
    folder = tmp_path / "out"
    for name in (
        "report.md",
        "report.html",
        "comparison.json",
        "paired_requests.csv",
        "figures/latency_cdfs.png",
    ):
        assert (folder / name).is_file(), name
    document = json.loads((folder / "comparison.json").read_text())
    # the report's numbers are those of an independent recomputation from the paired table
    paired = pd.read_csv(folder / "paired_requests.csv")
    assert document["scopes"][0]["metrics"]["e2e_s"]["measured"]["mean"] == pytest.approx(
        paired["e2e_s_measured"].mean()
    )
    assert document["scopes"][0]["metrics"]["ttft_s"]["simulated"]["p90"] == pytest.approx(
        float(np.percentile(paired["ttft_s_simulated"], 90))
    )
    assert "data:image/png;base64," in (folder / "report.html").read_text()
    # the simulation can be rerun as a plain experiment
    assert (folder / "simulation" / "experiment.yaml").is_file()


def test_replay_refuses_a_folder_it_did_not_write(tmp_path: Path) -> None:
    from sim.replay.pipeline import replay_run
    from sim.storage import OutputTargetError

    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    spec = validate_replay_spec(
        {"name": "x", "run": {"path": str(DATA / "vllm-bench.json")}, "gpu": "H100-80GB"}, "t"
    )
    with pytest.raises(OutputTargetError, match="not written by kvsim"):
        replay_run(spec, tmp_path, out)
    assert (out / "notes.txt").read_text() == "mine"


def test_replay_without_a_gpu_says_which_key_to_set(tmp_path: Path) -> None:
    from sim.replay.pipeline import replay_run

    spec = validate_replay_spec({"name": "x", "run": {"path": str(DATA / "vllm-bench.json")}}, "t")
    with pytest.raises(ConfigError, match="do not say which gpu") as caught:
        replay_run(spec, tmp_path, tmp_path / "out")
    assert "--set gpu=" in str(caught.value)  # a JSON file given directly has no replay file to edit
    assert not (tmp_path / "out").exists()


def test_a_shipped_replay_whose_data_is_missing_points_to_the_readme_on_fetching_it(tmp_path: Path) -> None:
    runs = tmp_path / "reference_runs" / "some-runs"
    runs.mkdir(parents=True)
    (runs / "README.md").write_text("fetch them from ...")
    replays = tmp_path / "configs" / "replays"
    replays.mkdir(parents=True)
    spec_path = replays / "r.yaml"
    spec_path.write_text(yaml.safe_dump({"run": {"path": "../../reference_runs/some-runs/run.csv"}}))
    with pytest.raises(ConfigError) as caught:
        read_run(load_replay_spec(spec_path), replays)
    message = str(caught.value)
    assert f"(looked at {runs / 'run.csv'})" in message
    assert f"{runs / 'README.md'} says where this data comes from and how to fetch it" in message
    (runs / "README.md").unlink()
    with pytest.raises(ConfigError) as caught:
        read_run(load_replay_spec(spec_path), replays)
    assert "README" not in str(caught.value)


def test_a_vllm_bench_json_without_requests_is_refused_before_anything_reduces(tmp_path: Path) -> None:
    # An empty run used to crash in numpy (zero-size array to reduction operation minimum).
    empty = {key: [] for key in ("input_lens", "output_lens", "ttfts", "itls")} | {"request_rate": 1.0}
    (tmp_path / "empty.json").write_text(json.dumps(empty))
    with pytest.raises(ReplayInputError, match=r"empty.json: no requests \(input_lens is empty\)"):
        read_vllm_bench_json(tmp_path / "empty.json", gpu="H100-80GB")


def test_requests_kvsim_cannot_serve_are_counted_with_kvsims_reason(tmp_path: Path, capsys) -> None:
    """A measured request whose prompt is beyond the replay's max_model_len is left out of the
    statistics: the console and the report say how many and why (it used to vanish silently)."""
    from sim.cli import main

    bench = _self_measured_run(tmp_path)
    measured = json.loads(bench.read_text())
    prompts = measured["input_lens"]
    limit = 300  # vLLM's rule: prompt + output must fit in max_model_len
    too_long = sum(p + o > limit for p, o in zip(prompts, measured["output_lens"], strict=True))
    assert 0 < too_long < len(prompts)
    replay = tmp_path / "short-context.yaml"
    replay.write_text(
        yaml.safe_dump(
            {
                "run": {"path": str(bench)},
                "gpu": "H100-80GB",
                "model": "Llama-2-7B",
                "engine": {"max_model_len": limit, "max_num_batched_tokens": 8192},
            }
        )
    )
    assert main(["replay-run", str(replay), "-o", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert (
        f"{too_long} of {len(prompts)} measured requests not compared: {too_long} rejected by kvsim"
        in printed
    )
    assert "max_model_len" in printed  # kvsim's own reason, with its numbers
    document = json.loads((tmp_path / "out" / "comparison.json").read_text())
    assert document["scopes"][0]["not_compared"] == {"rejected": too_long}
    assert document["scopes"][0]["compared"] == len(prompts) - too_long
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## Requests not compared" in report and f"{too_long} rejected by kvsim before it ran" in report
