"""``--set KEY.PATH=VALUE`` on ``kvsim plan`` and ``kvsim sweep``: kvsim run's parsing, its error words,
and a plan's digest (so its resume) that holds the overridden values."""

from __future__ import annotations

import json

import pytest

from sim.cli import main
from sim.config import ConfigError
from sim.planning.plans.spec import load_plan_spec
from sim.planning.sweeps.spec import load_sweep_spec
from sim.storage.folders import read_marker
from tests.planning_helpers import TINY_EXPERIMENT, plan_data, sweep_file, write_yaml


def test_plan_set_overrides_keys_of_the_plan_file_before_validation(tmp_path):
    path = write_yaml(tmp_path / "plan.yaml", plan_data())
    overrides = ["search.min_requests=2000", "slos.ttft_p99_s=1.5", "target_rate_per_s=80"]
    plan = load_plan_spec(path, overrides)
    assert plan.spec.search.min_requests == 2000
    assert plan.spec.slos.ttft_p99_s == 1.5
    assert plan.spec.target_rate_per_s == 80
    # The first probes are sized from the overridden minimum.
    assert plan.first_requests(plan.candidates[0], 2.0) == 2000


def test_a_plan_digest_holds_its_overrides(tmp_path):
    data = plan_data()
    path = write_yaml(tmp_path / "plan.yaml", data)
    written = write_yaml(tmp_path / "written.yaml", plan_data(slos={"ttft_p99_s": 1.5}))
    overridden = load_plan_spec(path, ["slos.ttft_p99_s=1.5"])
    assert overridden.digest() == load_plan_spec(written).digest()
    assert overridden.digest() != load_plan_spec(path).digest()


def test_a_plan_resumed_with_other_set_values_reuses_only_identical_simulations(tmp_path, capsys):
    path = write_yaml(tmp_path / "plan.yaml", plan_data())
    out = tmp_path / "out"
    small = ["--set", "candidates.engine.max_num_seqs=[64]", "--set", "search.seeds=[1]"]
    assert main(["plan", str(path), "-o", str(out), "-j", "1", "-q", *small]) == 0
    first = json.loads((out / "plan.json").read_text())
    capsys.readouterr()

    # A tighter SLO: the same simulations at the rates both searches probe, judged anew.
    tighter = [*small, "--set", "slos.ttft_p99_s=0.5"]
    assert main(["plan", str(path), "-o", str(out), "-j", "1", *tighter]) == 0
    second = json.loads((out / "plan.json").read_text())
    captured = capsys.readouterr()
    assert "holds an earlier plan with another config" in captured.err
    assert read_marker(out)["config_hash"] == load_plan_spec(path, tighter[1::2]).digest()
    assert second["slos"]["ttft_p99_s"]["limit"] == 0.5
    assert second["candidates"][0]["max_rate_per_s"] < first["candidates"][0]["max_rate_per_s"]
    assert 0 < second["run"]["reused"] < second["run"]["probes"]

    # Longer probes are other simulations: no point of the earlier runs is reused.
    longer = [*small, "--set", "search.min_requests=160"]
    assert main(["plan", str(path), "-o", str(out), "-j", "1", "-q", *longer]) == 0
    third = json.loads((out / "plan.json").read_text())
    assert third["run"]["reused"] == 0
    earlier = {
        seed["point_id"] for run in (first, second) for probe in run["probes"] for seed in probe["seeds"]
    }
    assert earlier.isdisjoint(seed["point_id"] for probe in third["probes"] for seed in probe["seeds"])


# kvsim run's words for a --set item that cannot be applied; sweep (to its base experiment) and plan
# (to the plan file) must say the same.
BAD_ITEMS = [
    (
        "engine.block_size=[1",
        "the value '[1' is not valid YAML (expected ',' or ']', but got '<stream end>'); "
        "quote it if it is a string",
    ),
    ("engine..block_size=1", "expected KEY.PATH=VALUE (keys joined by '.')"),
    ("block_size", "expected KEY.PATH=VALUE (keys joined by '.')"),
]


def _command_line(command: str, tmp_path) -> list[str]:
    if command == "run":
        return ["run", str(write_yaml(tmp_path / "experiment.yaml", TINY_EXPERIMENT))]
    if command == "sweep":
        return ["sweep", str(sweep_file(tmp_path))]
    return ["plan", str(write_yaml(tmp_path / "plan.yaml", plan_data()))]


@pytest.mark.parametrize("command", ["run", "sweep", "plan"])
@pytest.mark.parametrize(("item", "message"), BAD_ITEMS)
def test_a_bad_set_item_is_named_alike_by_run_sweep_and_plan(tmp_path, capsys, command, item, message):
    out = tmp_path / "out"
    assert main([*_command_line(command, tmp_path), "-q", "-o", str(out), "--set", item]) == 2
    assert capsys.readouterr().err == f"kvsim: error: --set {item!r}: {message}\n"
    assert not out.exists()


@pytest.mark.parametrize(
    ("command", "item", "message"),
    [
        ("run", "variants.5.policy=paged", "variants has 1 entries (indexes 0 to 0), so there is no entry 5"),
        (
            "sweep",
            "variants.5.policy=paged",
            "variants has 1 entries (indexes 0 to 0), so there is no entry 5",
        ),
        ("run", "seed.x=1", "seed is 3, not a mapping or list, so it has no key 'x'"),
        ("sweep", "seed.x=1", "seed is 3, not a mapping or list, so it has no key 'x'"),
        (
            "plan",
            "candidates.policies.5.name=x",
            "candidates.policies has 1 entries (indexes 0 to 0), so there is no entry 5",
        ),
        (
            "plan",
            "candidates.policies.x.name=p",
            "candidates.policies is a list; 'x' must be an index (0, 1, ...)",
        ),
        (
            "plan",
            "target_rate_per_s.x=1",
            "target_rate_per_s is 20, not a mapping or list, so it has no key 'x'",
        ),
    ],
)
def test_a_set_key_path_through_the_wrong_node_is_named(tmp_path, capsys, command, item, message):
    assert main([*_command_line(command, tmp_path), "-q", "-o", str(tmp_path / "out"), "--set", item]) == 2
    assert capsys.readouterr().err == f"kvsim: error: --set {item!r}: {message}\n"


def test_a_bad_value_from_set_in_a_plan_says_it_came_from_the_command_line(tmp_path):
    path = write_yaml(tmp_path / "plan.yaml", plan_data())
    with pytest.raises(ConfigError) as raised:
        load_plan_spec(path, ["slos.ttft_p99_s=-1"])
    assert str(raised.value) == (
        f"{path}: invalid plan file (1 problem(s))\n"
        "  slos.ttft_p99_s: Input should be greater than 0 (got -1)\n"
        "  (slos.ttft_p99_s came from --set slos.ttft_p99_s=-1, not from the file)"
    )


def test_a_probe_config_problem_from_set_in_a_plan_says_it_came_from_the_command_line(tmp_path):
    path = write_yaml(tmp_path / "plan.yaml", plan_data())
    with pytest.raises(ConfigError) as raised:
        load_plan_spec(path, ["workload.arrival.kind=bogus"])
    message = str(raised.value)
    assert message.startswith(
        f"{path}: candidate A100-80GB / paged / block 16 / max_num_seqs=2, rate 2/s, seed 1:"
    )
    # The union's error names the section around the key that was set.
    assert "\n  workload.arrival: Input tag 'bogus' found using 'kind'" in message
    assert message.endswith(
        "\n  (workload.arrival.kind came from --set workload.arrival.kind=bogus, not from the file)"
    )


def test_a_bad_value_from_set_in_a_sweep_says_it_came_from_the_command_line(tmp_path):
    path = sweep_file(tmp_path)
    with pytest.raises(ConfigError) as raised:
        load_sweep_spec(path, ["engine.max_num_seqs=0"])
    assert str(raised.value) == (
        f"{path}: point 0 (engine.block_size=16, workload.arrival.rate_per_s=2.0): invalid experiment "
        "config (1 problem(s))\n"
        "  engine.max_num_seqs: Input should be greater than 0 (got 0)\n"
        "  (engine.max_num_seqs came from --set engine.max_num_seqs=0, not from the file)"
    )


def test_a_mapping_from_set_is_named_for_the_key_inside_it(tmp_path):
    path = write_yaml(tmp_path / "plan.yaml", plan_data())
    with pytest.raises(
        ConfigError, match=r"\(engine came from --set engine=\{block_size: 0\}, not from the file\)$"
    ):
        load_plan_spec(path, ["engine={block_size: 0}"])


def test_sweep_set_overrides_the_base_experiment_and_the_axes_override_it(tmp_path):
    sweep = load_sweep_spec(sweep_file(tmp_path), ["engine.block_size=64", "workload.num_requests=12"])
    assert [p.config.engine.block_size for p in sweep.points] == [16, 16, 32, 32]
    assert {p.config.workload.num_requests for p in sweep.points} == {12}
