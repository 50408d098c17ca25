"""Experiment configs: clear errors for bad input, and a small end-to-end run of the quickstart."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sim.cli import main
from sim.config import ConfigError, load_experiment
from sim.results import load_results
from workloads.factory import build_workload

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "experiment.yaml"
    path.write_text(text)
    return path


def quickstart_data() -> dict:
    return yaml.safe_load(QUICKSTART.read_text())


def test_quickstart_validates():
    config = load_experiment(QUICKSTART)
    assert [variant.name for variant in config.variants] == ["contiguous-max", "paged", "prefix-cow"]


def test_malformed_yaml_names_file_and_line(tmp_path):
    path = write_config(tmp_path, "name: x\nengine:\n  block_size: [16\n")
    with pytest.raises(ConfigError, match=r"experiment\.yaml: line \d+, column \d+ malformed YAML"):
        load_experiment(path)


def test_unknown_key_suggests_nearest_name(tmp_path):
    data = quickstart_data()
    data["engine"]["blok_size"] = 32
    path = write_config(tmp_path, yaml.safe_dump(data))
    with pytest.raises(ConfigError) as error:
        load_experiment(path)
    message = str(error.value)
    assert "experiment.yaml" in message
    assert "engine.blok_size: unknown key; did you mean 'block_size'?" in message


def test_bad_value_names_key_path_and_value(tmp_path):
    data = quickstart_data()
    data["engine"]["gpu_memory_utilization"] = 1.5
    path = write_config(tmp_path, yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"engine\.gpu_memory_utilization: .*\(got 1\.5\)"):
        load_experiment(path)


def test_unknown_policy_and_variant_engine_key(tmp_path):
    data = quickstart_data()
    data["variants"][1]["policy"] = "pagd"
    data["variants"][2]["engine"] = {"max_num_seq": 4}
    path = write_config(tmp_path, yaml.safe_dump(data))
    with pytest.raises(ConfigError) as error:
        load_experiment(path)
    assert "variants.1.policy" in str(error.value) and "did you mean 'paged'" in str(error.value)
    assert "did you mean 'max_num_seqs'" in str(error.value)


def test_set_overrides_and_bad_set(tmp_path):
    config = load_experiment(QUICKSTART, ["engine.block_size=32", "variants.0.options.reservation=pow2"])
    assert config.engine.block_size == 32
    assert config.variants[0].options["reservation"] == "pow2"
    with pytest.raises(ConfigError, match="KEY.PATH=VALUE"):
        load_experiment(QUICKSTART, ["engine.block_size"])


def test_model_that_does_not_fit_is_a_clear_error(tmp_path, capsys):
    out = tmp_path / "out"
    code = main(
        ["run", str(QUICKSTART), "-q", "-o", str(out), "--set", "model=Llama-2-70B", "--set", "gpu=T4-16GB"]
    )
    assert code == 2
    error = capsys.readouterr().err
    assert "Llama-2-70B" in error and "GiB" in error
    assert not out.exists(), "a failed run must not leave a results folder"


def test_small_quickstart_run_writes_every_output(tmp_path, capsys):
    out = tmp_path / "quick"
    code = main(["run", str(QUICKSTART), "-q", "-o", str(out), "--set", "workload.num_requests=150"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "GPU KV cache size: 458,096 tokens" in printed
    results = load_results(out)
    assert results.variants == ["contiguous-max", "paged", "prefix-cow"]
    for variant in results.variants:
        summary = results.variant_summary(variant)
        assert summary["requests_total"] == 150
        fractions = [summary[f"mean_{name}_frac"] for name in ("used", "reserved", "internal_frag")]
        fractions += [summary[f"mean_{name}_frac"] for name in ("external_frag", "cached", "free")]
        assert sum(fractions) == pytest.approx(1.0)
        series = results.timeseries(variant)
        categories = [f"{name}_tokens" for name in ("used", "reserved", "internal_fragmentation")]
        categories += [f"{name}_tokens" for name in ("external_fragmentation", "cached", "free")]
        totals = series[categories].sum(axis=1)
        assert (totals == summary["kv_pool_tokens"]).all(), "breakdown must sum to the pool in every row"
        requests = results.requests(variant)
        assert len(requests) == 150
    summary_csv = pd.read_csv(out / "summary.csv")
    assert len(summary_csv) == 3
    # Identical request streams: every variant saw the same requests.
    ids = [tuple(sorted(results.requests(v)["request_id"])) for v in results.variants]
    assert ids[0] == ids[1] == ids[2]
    # The paged policy never wastes a whole reservation: it holds more token states than contiguous-max.
    frame = results.summary.set_index("variant")
    assert (
        frame.loc["paged", "mean_internal_frag_frac"] < frame.loc["contiguous-max", "mean_internal_frag_frac"]
    )
    for figure in (
        "memory_breakdown",
        "utilization",
        "fragmentation",
        "running",
        "queue",
        "oom_preemptions",
        "latency_cdf",
    ):
        assert (out / "figures" / f"{figure}.png").stat().st_size > 10_000
    # The run says which cost model is in effect and how far it is validated, on screen and on file.
    assert "cost model = derated-analytic (A100 factors fitted to Vidur's A100-80GB" in printed
    assert "error band: decode -9..+12 %, prefill -9..+15 % vs held-out Vidur A100" in printed
    on_file = json.loads((out / "paged" / "summary.json").read_text())
    assert on_file["cost_model"].startswith("derated-analytic (A100 factors fitted to Vidur")
    assert on_file["cost_model_error_band"].startswith("decode -9..+12 %")
    shutil.rmtree(out)


def test_error_path_has_no_union_tags(tmp_path):
    data = quickstart_data()
    data["workload"]["arrival"]["rate_per_s"] = -1
    data["workload"]["arrival"]["burst"] = 2
    path = write_config(tmp_path, yaml.safe_dump(data))
    with pytest.raises(ConfigError) as error:
        load_experiment(path)
    message = str(error.value)
    assert "workload.arrival.rate_per_s:" in message and "(got -1)" in message
    assert "workload.arrival.burst: unknown key" in message
    assert "synthetic" not in message and "poisson." not in message


def test_unknown_key_inside_a_union_suggests_from_the_right_member(tmp_path):
    data = quickstart_data()
    data["workload"]["arrival"] = {"kind": "gamma", "rate_per_s": 2, "cvv": 2}
    path = write_config(tmp_path, yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"workload\.arrival\.cvv: unknown key; did you mean 'cv'\?"):
        load_experiment(path)


@pytest.mark.parametrize("name", ["azure-conv", "azure-code", "mooncake"])
def test_trace_example_configs_replay(tmp_path, name):
    out = tmp_path / name
    config = ROOT / "configs" / "traces" / f"{name}.yaml"
    assert main(["run", str(config), "-q", "-o", str(out), "--set", "workload.window.end_s=40"]) == 0
    results = load_results(out)
    assert len(results.variants) == 4
    totals = {int(results.variant_summary(v)["requests_total"]) for v in results.variants}
    assert len(totals) == 1 and totals.pop() > 10
    if name == "mooncake":
        assert results.variant_summary("prefix")["prefix_cache_hits"] > 0


def test_profile_cost_model_runs_and_a_foreign_profile_is_refused(tmp_path, capsys):
    out = tmp_path / "profiled"
    profile = "configs/profiles/analytic-llama-3.1-8b-a100-80gb.yaml"
    small = ["run", str(QUICKSTART), "-q", "--set", "workload.num_requests=60"]
    assert main([*small, "-o", str(out), "--set", f"cost_model={profile}"]) == 0
    assert "profile" in load_results(out).variant_summary("paged")["cost_model"]
    refused = tmp_path / "refused"
    foreign = "cost_model=configs/profiles/cpu-llama-3.2-1b.yaml"
    assert main([*small, "-o", str(refused), "--set", foreign]) == 2
    assert "rescale" in capsys.readouterr().err
    assert not refused.exists()


def test_pinned_system_prompts_are_hit_from_the_first_request(tmp_path):
    out = tmp_path / "pinned"
    args = ["run", str(QUICKSTART), "-q", "-o", str(out), "--set", "workload.num_requests=40"]
    pin = ["--set", "variants.2.pin_shared_prefixes=true"]
    assert main([*args, *pin]) == 0
    results = load_results(out)
    pinned = results.variant_summary("prefix-cow")
    # 4 system prompts of 256 tokens = 16 full blocks each.
    assert pinned["pinned_tokens"] == 4 * 256
    # The same request stream, rebuilt here: a prompt that starts with one of the 4 system prompts
    # ([system prompt] + its own tokens) hits exactly the 16 pinned blocks from its first admission,
    # including the very first request; any other prompt hits nothing.
    config = load_experiment(QUICKSTART, ["workload.num_requests=40"])
    workload = build_workload(config.workload, seed=config.seed, base_dir=QUICKSTART.parent)
    system_prompts = {prefix[0] for prefix in workload.shared_prefixes()}
    expected = {r.request_id: 256 if r.prompt[0] in system_prompts else 0 for r in workload.requests()}
    assert 0 < sum(value == 256 for value in expected.values()) < 40  # both kinds are present
    requests = results.requests("prefix-cow")
    admitted = requests[requests["outcome"] != "rejected"]
    assert len(admitted) >= 35
    got = dict(zip(admitted["request_id"], admitted["cached_prompt_tokens"], strict=True))
    assert got == {request_id: expected[request_id] for request_id in got}
    first = min(expected)
    assert got[first] == expected[first]
    refused = tmp_path / "refused"
    small = ["run", str(QUICKSTART), "-q", "--set", "workload.num_requests=40"]
    assert main([*small, "-o", str(refused), "--set", "variants.1.pin_shared_prefixes=true"]) == 2
    assert not refused.exists()


def test_a_yaml_boolean_where_a_string_belongs_gets_a_hint_to_quote_it(tmp_path):
    from sim.config import ConfigError, load_experiment

    path = tmp_path / "off.yaml"
    path.write_text(
        "name: off\nmodel: Llama-3.1-8B\ngpu: A100-80GB\n"
        "workload: {num_requests: 5, arrival: {kind: poisson, rate_per_s: 1}, prompt_len: 10, output_len: 5}\n"
        "variants: [{name: p, policy: paged}]\n"
    )
    with pytest.raises(
        ConfigError, match=r"name: Input should be a valid string \(got False\); YAML reads off"
    ):
        load_experiment(path)


def test_a_bad_value_from_set_says_it_came_from_the_command_line(tmp_path):
    from sim.config import ConfigError, load_experiment

    path = tmp_path / "x.yaml"
    path.write_text(
        "name: x\nmodel: Llama-3.1-8B\ngpu: A100-80GB\n"
        "workload: {num_requests: 5, arrival: {kind: poisson, rate_per_s: 1}, prompt_len: 10, output_len: 5}\n"
        "variants: [{name: p, policy: paged}]\n"
    )
    with pytest.raises(ConfigError, match=r"engine\.block_size came from --set engine\.block_size=abc"):
        load_experiment(path, ["engine.block_size=abc"])


def test_a_trace_runs_config_yaml_runs_again_as_written(tmp_path):
    """A run folder's config.yaml holds every resolved value, the trace's default `on_too_long: cap`
    among them; without a trace `max_model_len` it must still validate and give the same summary."""
    from sim.cli import main

    first, second = tmp_path / "first", tmp_path / "second"
    base = [
        "--set", "workload.max_model_len=null", "--set", "workload.window.end_s=60",
        "--set", 'variants=[{"name": "paged", "policy": "paged"}]', "--set", "output.figures=false",
    ]  # fmt: skip
    assert main(["run", "configs/traces/azure-conv.yaml", "-o", str(first), *base]) == 0
    assert main(["run", str(first / "config.yaml"), "-o", str(second)]) == 0
    summaries = [pd.read_csv(folder / "summary.csv").drop(columns=["wall_s"]) for folder in (first, second)]
    pd.testing.assert_frame_equal(*summaries)
