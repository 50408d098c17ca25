"""``kvsim check``: any experiment, plan, sweep or replay file validated as its command would, without
running it; one line per file, exit 2 when any fails."""

from __future__ import annotations

from pathlib import Path

from sim.cli import main
from tests.planning_helpers import TINY_EXPERIMENT, plan_data, sweep_file, write_yaml

ROOT = Path(__file__).resolve().parents[1]


def test_check_tells_each_kind_by_its_keys(tmp_path, capsys):
    experiment = write_yaml(tmp_path / "experiment.yaml", TINY_EXPERIMENT)
    plan = write_yaml(tmp_path / "plan.yaml", plan_data())
    sweep = sweep_file(tmp_path)
    assert main(["check", str(experiment), str(plan), str(sweep)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"ok: {experiment} (experiment)",
        f"ok: {plan} (plan)",
        f"ok: {sweep} (sweep)",
    ]


def test_check_reports_each_bad_file_as_its_command_does_and_exits_2(tmp_path, capsys):
    good = write_yaml(tmp_path / "good.yaml", TINY_EXPERIMENT)
    bad = write_yaml(tmp_path / "bad.yaml", TINY_EXPERIMENT | {"engine": {"blok_size": 16}})
    assert main(["check", str(bad), str(good), str(tmp_path / "absent.yaml")]) == 2
    out, err = capsys.readouterr()
    assert out == f"ok: {good} (experiment)\n"
    assert f"kvsim: error: {bad}: invalid experiment config (1 problem(s))" in err
    assert "engine.blok_size: unknown key; did you mean 'block_size'?" in err
    assert f"kvsim: error: {tmp_path / 'absent.yaml'}: no such file" in err
    assert err.rstrip().endswith("kvsim check: 2 of 3 file(s) failed")
    # kvsim run words it the same way
    assert main(["run", str(bad), "-o", str(tmp_path / "out")]) == 2
    assert "engine.blok_size: unknown key; did you mean 'block_size'?" in capsys.readouterr().err


def test_check_prepares_every_variant_as_run_does(tmp_path, capsys):
    # Valid as a schema, but the policy's option is unknown: found by the preparation, not the schema.
    variants = [{"name": "paged", "policy": "paged", "options": {"reservaton": "max"}}]
    path = write_yaml(tmp_path / "options.yaml", TINY_EXPERIMENT | {"variants": variants})
    assert main(["check", str(path)]) == 2
    assert "unknown option(s) 'reservaton' for policy 'paged'" in capsys.readouterr().err


def test_check_kind_can_be_forced_and_unknown_shapes_are_named(tmp_path, capsys):
    experiment = write_yaml(tmp_path / "experiment.yaml", TINY_EXPERIMENT)
    assert main(["check", "--kind", "sweep", str(experiment)]) == 2
    assert f"{experiment}: invalid sweep file" in capsys.readouterr().err
    odd = write_yaml(tmp_path / "odd.yaml", {"name": "x", "seed": 1})
    claim = ROOT / "configs" / "validation" / "vllm-block-size.yaml"
    assert main(["check", str(odd), str(claim)]) == 2
    err = capsys.readouterr().err
    assert f"{odd}: cannot tell which kind of file this is from its keys (name, seed)" in err
    assert "give --kind {experiment,plan,sweep,replay}" in err
    assert "a claim file of `kvsim validate`" in err


def test_check_names_the_file_of_a_replay_whose_run_is_missing(tmp_path, capsys):
    path = write_yaml(
        tmp_path / "replay.yaml", {"name": "r", "run": {"path": "nowhere.csv"}, "gpu": "H100-80GB"}
    )
    assert main(["check", str(path)]) == 2
    assert f"kvsim: error: {path}: run.path: 'nowhere.csv' not found" in capsys.readouterr().err
