"""Sweep and plan files: expansion, and bad files failing before any simulation with file, key and value."""

from __future__ import annotations

import pytest

from sim.cli import main
from sim.config import ConfigError
from sim.planning.plans.spec import load_plan_spec
from sim.planning.schema import set_key_path
from sim.planning.sweeps.spec import RangeAxis, load_sweep_spec
from tests.planning_helpers import TINY_EXPERIMENT, plan_data, sweep_file, write_yaml


def test_axes_product_then_zip_groups(tmp_path):
    path = sweep_file(
        tmp_path,
        axes={"engine.block_size": [16, 32], "seed": [1, 2, 3]},
        zip=[{"gpu": ["A100-80GB", "H100-80GB"], "engine.gpu_memory_utilization": [0.9, 0.8]}],
    )
    sweep = load_sweep_spec(path)
    assert len(sweep.points) == 2 * 3 * 2
    assert sweep.axis_keys == ["engine.block_size", "seed", "gpu", "engine.gpu_memory_utilization"]
    assert sweep.points[0].values == {
        "engine.block_size": 16,
        "seed": 1,
        "gpu": "A100-80GB",
        "engine.gpu_memory_utilization": 0.9,
    }
    assert sweep.points[1].values["gpu"] == "H100-80GB"
    assert sweep.points[1].values["engine.gpu_memory_utilization"] == 0.8
    last = sweep.points[-1]
    assert (last.config.engine.block_size, last.config.seed, last.config.gpu) == (32, 3, "H100-80GB")
    assert len(set(sweep.ids())) == 12


def test_range_axes():
    assert RangeAxis.model_validate({"from": 1, "to": 4, "steps": 4}).values() == [1.0, 2.0, 3.0, 4.0]
    assert RangeAxis.model_validate({"from": 1, "to": 8, "steps": 4, "log": True}).values() == [
        1.0,
        2.0,
        4.0,
        8.0,
    ]
    assert RangeAxis.model_validate(
        {"from": 8, "to": 64, "steps": 4, "log": True, "integer": True}
    ).values() == [
        8,
        16,
        32,
        64,
    ]
    assert RangeAxis.model_validate({"from": 1, "to": 2, "steps": 3}).values() == [1.0, 1.5, 2.0]


def test_fixed_overrides_and_cli_set_apply_to_every_point(tmp_path):
    path = sweep_file(tmp_path, set={"workload.num_requests": 25})
    sweep = load_sweep_spec(path, ["engine.max_num_seqs=7"])
    assert {p.config.workload.num_requests for p in sweep.points} == {25}
    assert {p.config.engine.max_num_seqs for p in sweep.points} == {7}


def test_points_with_the_same_config_share_an_id_and_others_do_not(tmp_path):
    one = load_sweep_spec(sweep_file(tmp_path))
    again = load_sweep_spec(sweep_file(tmp_path))
    assert one.ids() == again.ids()
    assert len(set(one.ids())) == 4


def test_base_file_relative_to_the_sweep(tmp_path):
    (tmp_path / "exp").mkdir()
    write_yaml(tmp_path / "exp" / "base.yaml", TINY_EXPERIMENT)
    path = write_yaml(
        tmp_path / "sweep.yaml", {"name": "s", "base": "exp/base.yaml", "axes": {"seed": [1, 2]}}
    )
    sweep = load_sweep_spec(path)
    assert [p.config.seed for p in sweep.points] == [1, 2]
    assert sweep.points[0].base_dir == (tmp_path / "exp").resolve()


def test_a_sweep_without_a_name_is_named_after_its_file(tmp_path):
    # Sweep files without `name:` were refused ("name: required key is missing"); `kvsim sweep`
    # names them after the file, as the results folder would be named.
    data = {"experiment": TINY_EXPERIMENT, "axes": {"seed": [1, 2]}}
    sweep = load_sweep_spec(write_yaml(tmp_path / "block-sizes.v2.yaml", data))
    assert sweep.spec.name == sweep.name == "block-sizes.v2"
    assert len(sweep.points) == 2


def test_a_sweep_named_by_a_file_name_that_cannot_be_a_folder_is_refused(tmp_path):
    data = {"experiment": TINY_EXPERIMENT, "axes": {"seed": [1]}}
    with pytest.raises(ConfigError) as caught:
        load_sweep_spec(write_yaml(tmp_path / "my sweep.yaml", data))
    message = str(caught.value)
    assert "my sweep.yaml: name: required key is missing" in message
    assert "the file's name 'my sweep' cannot stand in for it" in message


def test_cli_sweep_without_a_name_writes_to_a_folder_named_after_the_file(tmp_path, capsys, monkeypatch):
    data = {"experiment": TINY_EXPERIMENT | {"workload": TINY_EXPERIMENT["workload"] | {"num_requests": 5}}}
    path = write_yaml(tmp_path / "nameless.yaml", data)
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", str(path), "-j", "1", "-q"]) == 0
    assert "kvsim sweep nameless: 1 points" in capsys.readouterr().out
    assert (tmp_path / "results" / "nameless" / "sweep.json").is_file()


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"axes": {"engine.blok_size": [16]}},
            [
                "sweep.yaml: point 0 (engine.blok_size=16)",
                "engine.blok_size: unknown key; did you mean 'block_size'? (got 16)",
            ],
        ),
        (
            {"axes": {"engine.block_size": [16, 0]}},
            ["point 1 (engine.block_size=0)", "engine.block_size: Input should be greater than 0 (got 0)"],
        ),
        ({"axes": {"engine.block_size": []}}, ["invalid sweep file", "axis 'engine.block_size' is empty"]),
        ({"axis": {"seed": [1]}}, ["invalid sweep file", "axis: unknown key; did you mean 'axes'?"]),
        (
            {"axes": {"seed.x": [1]}},
            ["point 0 (seed.x=1)", "key path 'seed.x' = 1: seed holds 3, not a mapping"],
        ),
        (
            {"axes": {"variants.0.options.reservaton": ["max"]}},
            [
                "point 0 (variants.0.options.reservaton=max)",
                "unknown option(s) 'reservaton' for policy 'paged' (valid: none)",
            ],
        ),
        (
            {"zip": [{"seed": [1, 2], "engine.block_size": [16]}]},
            ["zip group 0: its keys must have as many values each", "'seed': 2, 'engine.block_size': 1"],
        ),
        (
            {"axes": {"gpu": ["A100-80GB", "A99"]}},
            ["point 1 (gpu=A99)", "unknown GPU 'A99'"],
        ),
    ],
)
def test_bad_sweeps_name_file_point_key_and_value(tmp_path, changes, expected):
    with pytest.raises(ConfigError) as caught:
        load_sweep_spec(sweep_file(tmp_path, **changes))
    for text in expected:
        assert text in str(caught.value)


def test_bad_sweep_stops_the_cli_before_any_output(tmp_path, capsys):
    path = sweep_file(tmp_path, axes={"engine.block_size": [16, -1]})
    out = tmp_path / "out"
    assert main(["sweep", str(path), "-o", str(out), "-j", "1"]) == 2
    assert "point 1 (engine.block_size=-1)" in capsys.readouterr().err
    assert not out.exists()


def test_set_key_path_into_lists_and_errors():
    data = {"variants": [{"name": "a", "policy": "paged"}], "seed": 1}
    set_key_path(data, "variants.0.policy", "prefix")
    set_key_path(data, "engine.block_size", 32)
    assert data["variants"][0]["policy"] == "prefix" and data["engine"] == {"block_size": 32}
    with pytest.raises(KeyError, match="not an index of a list of 1"):
        set_key_path(data, "variants.3.policy", "paged")


def engine_pool_tokens(model: str, gpu: str, **engine: object) -> int:
    from sim.config import EngineConfig
    from sim.hardware.gpus import resolve_gpu
    from sim.hardware.models import resolve_model
    from sim.runner import engine_pool

    return engine_pool(
        resolve_model(model), resolve_gpu(gpu), EngineConfig.model_validate(engine)
    ).kv_pool_tokens


def test_plan_expands_candidates_and_marks_models_that_do_not_fit(tmp_path):
    data = plan_data(
        gpus=[{"gpu": "A100-80GB", "price_per_hour": 2.0}, "T4-16GB"],
        engine={"max_model_len": 1024},
        candidates={"policies": [{"name": "paged", "policy": "paged"}], "block_sizes": [16, 32]},
    )
    plan = load_plan_spec(write_yaml(tmp_path / "plan.yaml", data))
    assert [c.key for c in plan.candidates] == [
        "A100-80GB / paged / block 16",
        "A100-80GB / paged / block 32",
        "T4-16GB / paged / block 16",
        "T4-16GB / paged / block 32",
    ]
    assert plan.candidates[0].price_per_hour == 2.0 and not plan.candidates[0].infeasible
    assert "Llama-3.1-8B on T4-16GB does not fit" in plan.candidates[2].infeasible
    config = plan.probe_config(plan.candidates[1], 3.5, seed=2)
    assert (config.engine.block_size, config.seed) == (32, 2)
    assert config.workload.arrival.rate_per_s == 3.5
    # The first probe spans 3 KV-pool fills with a 10 % margin: 1.1 x 3 x pool tokens / KV tokens per
    # request, where a request holds a uniform 64..256 prompt and 32..128 output, 240 tokens on average
    # (drawn: within 2 %).
    pool = plan.candidates[1].kv_pool_tokens
    assert pool == engine_pool_tokens("Llama-3.1-8B", "A100-80GB", block_size=32, max_model_len=1024)
    assert config.workload.num_requests == pytest.approx(1.1 * 3 * pool / 240, rel=0.02)
    assert config.workload.num_requests > 120  # min_requests is only the floor
    unsized = load_plan_spec(
        write_yaml(tmp_path / "unsized.yaml", data | {"search": data["search"] | {"min_fill_multiple": 0}})
    )
    assert unsized.probe_config(unsized.candidates[1], 3.5, seed=2).workload.num_requests == 120


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"slos": {"ttft_p99": 1.0}}, "slos.ttft_p99: unknown key; did you mean 'ttft_p99_s'?"),
        ({"slos": {}}, "give at least one SLO"),
        ({"slos": {"ttft_p99_s": -1}}, "slos.ttft_p99_s: Input should be greater than 0 (got -1)"),
        ({"target_rate": 3}, "target_rate: unknown key; did you mean 'target_rate_per_s'?"),
        ({"engine": {"blok_size": 16}}, "engine.blok_size: unknown key; did you mean 'block_size'?"),
        (
            {"candidates": {"policies": [{"name": "p", "policy": "paged"}], "engine": {"max_num_seq": [4]}}},
            "unknown engine knob; did you mean 'max_num_seqs'?",
        ),
        (
            {"candidates": {"policies": [{"name": "p", "policy": "pagd"}]}},
            "unknown policy 'pagd'; did you mean 'paged'?",
        ),
        ({"gpus": ["A99"]}, "unknown GPU 'A99'"),
        (
            {"workload": {"arival": {"kind": "poisson", "rate_per_s": 1}}},
            "workload.arival: unknown key; did you mean 'arrival'?",
        ),
        (
            {"search": {"start_rate_per_s": 0.01, "min_rate_per_s": 0.1}},
            "need min_rate_per_s <= start_rate_per_s",
        ),
        (
            {"engine": {"data_parallel_size": 2}},
            "engine.data_parallel_size 2: plans do not size data-parallel servers yet",
        ),
    ],
)
def test_bad_plans_name_file_key_and_value(tmp_path, changes, expected):
    path = write_yaml(tmp_path / "plan.yaml", plan_data(**changes))
    with pytest.raises(ConfigError) as caught:
        load_plan_spec(path)
    assert str(path) in str(caught.value)
    assert expected in str(caught.value)


def test_plan_crosses_cluster_keys_and_probes_the_whole_cluster(tmp_path):
    data = plan_data(
        candidates={
            "policies": [{"name": "prefix", "policy": "prefix"}],
            "engine": {"tensor_parallel_size": [1, 2]},
            "cluster": {"replicas": [2], "router": ["round_robin", "prefix_aware"]},
        }
    )
    plan = load_plan_spec(write_yaml(tmp_path / "plan.yaml", data))
    assert [c.key for c in plan.candidates] == [
        "A100-80GB / prefix / block 16 / tensor_parallel_size=1 / replicas=2 / router=round_robin",
        "A100-80GB / prefix / block 16 / tensor_parallel_size=1 / replicas=2 / router=prefix_aware",
        "A100-80GB / prefix / block 16 / tensor_parallel_size=2 / replicas=2 / router=round_robin",
        "A100-80GB / prefix / block 16 / tensor_parallel_size=2 / replicas=2 / router=prefix_aware",
    ]
    last = plan.candidates[-1]
    assert (last.replicas, last.router, last.tensor_parallel_size) == (2, "prefix_aware", 2)
    # The probe is the whole cluster at the full rate: the rate is not divided over replicas.
    config = plan.probe_config(last, 8.0, seed=1)
    assert config.workload.arrival.rate_per_s == 8.0
    assert config.cluster is not None and (config.cluster.replicas, config.cluster.router) == (
        2,
        "prefix_aware",
    )
    assert config.engine.tensor_parallel_size == 2


@pytest.mark.parametrize(
    ("cluster", "expected"),
    [
        ({"replica": [2]}, "candidates.cluster.replica: unknown cluster key; did you mean 'replicas'?"),
        ({"replicas": [0]}, "cluster.replicas: Input should be greater than 0 (got 0)"),
        ({"router": ["round_robin", "fastest"]}, "unknown router 'fastest'"),
    ],
)
def test_bad_plan_cluster_keys(tmp_path, cluster, expected):
    data = plan_data(candidates={"policies": [{"name": "prefix", "policy": "prefix"}], "cluster": cluster})
    with pytest.raises(
        ConfigError, match=expected.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")
    ):
        load_plan_spec(write_yaml(tmp_path / "plan.yaml", data))


def test_a_plan_without_a_cost_model_uses_the_runs_default(tmp_path):
    data = plan_data()
    data.pop("cost_model", None)
    plan = load_plan_spec(write_yaml(tmp_path / "plan.yaml", data))
    assert plan.spec.cost_model == "derated"  # what `kvsim run` uses (issue 27: it was analytic)


def test_a_plan_whose_search_key_runs_through_a_value_is_refused_naming_file_and_key(tmp_path):
    """The search sets the rate at ``workload.arrival.rate_per_s``; a workload whose ``arrival`` is a
    word, not a mapping, was a KeyError traceback (found by tests/fuzz_bad_input.py). It is a
    configuration error naming the file, the candidate and the key the search sets."""
    data = plan_data()
    data["workload"]["arrival"] = "poisson"
    path = write_yaml(tmp_path / "plan.yaml", data)
    with pytest.raises(ConfigError) as raised:
        load_plan_spec(path)
    message = str(raised.value)
    assert str(path) in message
    assert (
        "search sets workload.arrival.rate_per_s: workload.arrival holds 'poisson', not a mapping" in message
    )
