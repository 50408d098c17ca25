"""The serving terms fitted to measured runs (sim/costs/serving.py), the client overhead they put
in latencies, and the fit itself (calibrate/from_runs.py)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from calibrate.from_runs import (
    INFORMED_BY,
    RunErrors,
    RunTraits,
    best_overhead,
    calibrate_from_runs,
    fold_groups,
    log_loss,
    model_family,
    summarize_errors,
)
from sim.costs.core import CostModelError
from sim.costs.derated import DeratedCostModel
from sim.costs.factory import make_cost_model
from sim.costs.serving import (
    NEUTRAL,
    CalibrationError,
    CalibrationWarning,
    ServingCalibration,
    load_calibration,
    write_calibration,
)
from sim.costs.terms import ALL_REDUCES_PER_LAYER
from sim.hardware.gpus import resolve_gpu
from sim.hardware.models import resolve_model

LLAMA = resolve_model("Llama-2-7B")
H100 = resolve_gpu("H100-80GB")


def test_iteration_overhead_is_added_once_to_every_iteration() -> None:
    plain = DeratedCostModel(LLAMA, H100, serving=NEUTRAL)
    slow = DeratedCostModel(LLAMA, H100, serving=ServingCalibration(iteration_overhead_s=1e-3))
    assert slow.decode.intercept_s - plain.decode.intercept_s == pytest.approx(1e-3)
    assert slow.decode.per_seq_s == plain.decode.per_seq_s
    assert slow.prefill_fixed_s - plain.prefill_fixed_s == pytest.approx(1e-3)
    chunks = [(300, 0), (20, 500)]
    assert slow.iteration_s(8, 4000, chunks) - plain.iteration_s(8, 4000, chunks) == pytest.approx(1e-3)


def test_bandwidth_scales_are_capped_at_the_gpus_achievable_bandwidth() -> None:
    # H100 kv_bandwidth 0.938 x 2 would exceed what its memory delivers: the share is its achievable
    # share exactly (never the datasheet's 1.0)
    model = DeratedCostModel(LLAMA, H100, serving=ServingCalibration(kv_bandwidth_scale=2.0))
    ceiling = H100.memory_ceiling.share
    assert ceiling < 1.0
    kv_bytes = LLAMA.kv_bytes_per_token()
    assert model.decode.per_context_token_s == pytest.approx(
        kv_bytes / (H100.hbm_bandwidth_bytes_per_s * ceiling)
    )
    assert model.efficiency.kv_bandwidth == ceiling
    weights = DeratedCostModel(LLAMA, H100, serving=ServingCalibration(weight_bandwidth_scale=1.05))
    assert weights.efficiency.weight_bandwidth == pytest.approx(min(0.791 * 1.05, ceiling))


def test_attention_scale_multiplies_the_per_sequence_cost() -> None:
    plain = DeratedCostModel(LLAMA, H100, serving=NEUTRAL)
    scaled = DeratedCostModel(LLAMA, H100, serving=ServingCalibration(decode_attention_per_seq_scale=0.25))
    assert scaled.decode_attention_per_seq_s == pytest.approx(plain.decode_attention_per_seq_s * 0.25)


def test_per_sequence_attention_divides_with_tensor_parallelism() -> None:
    single = DeratedCostModel(resolve_model("Llama-2-70B"), H100, serving=NEUTRAL)
    four = DeratedCostModel(resolve_model("Llama-2-70B"), H100, serving=NEUTRAL, tensor_parallel_size=4)
    assert four.decode_attention_per_seq_s == pytest.approx(single.decode_attention_per_seq_s / 4)


def test_factors_measured_on_another_gpu_follow_its_memory() -> None:
    # The RTX 4090 has the A100's kernel factors: a GEMV that read at 0.761 of an A100 whose copies
    # reach a0 reads at 0.761 x a1 / a0 of a 4090 whose copies reach a1; a scale fitted on any GPU
    # then moves it only up to a1.
    rtx, a100 = resolve_gpu("RTX-4090-24GB"), resolve_gpu("A100-80GB")
    a0, a1 = a100.memory_ceiling.share, rtx.memory_ceiling.share
    assert rtx.efficiency.transferred and not H100.efficiency.transferred
    plain = DeratedCostModel(LLAMA, rtx, serving=NEUTRAL)
    assert plain.efficiency.weight_bandwidth == pytest.approx(0.761 * a1 / a0)
    scaled = DeratedCostModel(LLAMA, rtx, serving=ServingCalibration(weight_bandwidth_scale=1.6))
    assert scaled.efficiency.weight_bandwidth == a1
    own = DeratedCostModel(LLAMA, a100, serving=NEUTRAL)
    assert own.efficiency.weight_bandwidth == 0.761  # its own factors, as measured


def test_a_retired_parameter_loads_with_a_warning_naming_what_replaced_it(tmp_path: Path) -> None:
    path = tmp_path / "old.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "kind": "kvsim-serving-calibration",
                "parameters": {"iteration_overhead_s": 3e-4, "transferred_bandwidth_scale": 1.53},
            }
        )
    )
    with pytest.warns(
        CalibrationWarning, match="transferred_bandwidth_scale is ignored.*weight_bandwidth_scale"
    ):
        calibration = load_calibration(path)
    assert calibration.iteration_overhead_s == 3e-4 and calibration.weight_bandwidth_scale == 1.0


def test_all_reduce_terms_follow_the_link() -> None:
    model = resolve_model("Llama-2-70B")
    calibration = ServingCalibration(all_reduce_latency_s=4e-6, pcie_all_reduce_scale=3.0)
    nvlink = DeratedCostModel(model, H100, serving=calibration, tensor_parallel_size=4)
    # NVLink: the fitted latency x log2(4) per call, 2 calls per layer
    assert nvlink.all_reduce.per_iteration_s == pytest.approx(ALL_REDUCES_PER_LAYER * 80 * 4e-6 * 2)
    pcie_gpu = resolve_gpu({"base": "H100-80GB", "nvlink_gb_per_s": None})
    plain = DeratedCostModel(model, pcie_gpu, serving=NEUTRAL, tensor_parallel_size=4)
    pcie = DeratedCostModel(model, pcie_gpu, serving=calibration, tensor_parallel_size=4)
    # PCIe: NCCL's latency (not the fitted one), the whole term x 3
    assert pcie.all_reduce.per_iteration_s == pytest.approx(plain.all_reduce.per_iteration_s * 3)
    assert pcie.all_reduce.per_token_s == pytest.approx(plain.all_reduce.per_token_s * 3)


def test_calibration_file_round_trip_and_errors(tmp_path: Path) -> None:
    calibration = ServingCalibration(
        iteration_overhead_s=2e-4, request_overhead_s=0.01, source="x", fit={"loss": 1}
    )
    write_calibration(calibration, tmp_path / "c.yaml")
    assert load_calibration(tmp_path / "c.yaml") == calibration
    data = yaml.safe_load((tmp_path / "c.yaml").read_text())
    data["parameters"]["iteration_overheads"] = 1
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(CalibrationError, match=r"bad\.yaml: unknown parameter\(s\) iteration_overheads"):
        load_calibration(tmp_path / "bad.yaml")
    data["parameters"] = {"kv_bandwidth_scale": -1}
    (tmp_path / "neg.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(CalibrationError, match="kv_bandwidth_scale must be a number >= 0"):
        load_calibration(tmp_path / "neg.yaml")
    (tmp_path / "other.yaml").write_text("kind: something\n")
    with pytest.raises(CalibrationError, match="not a kvsim serving calibration"):
        load_calibration(tmp_path / "other.yaml")


def test_cost_model_config_names_its_calibration(tmp_path: Path) -> None:
    plain = make_cost_model({"kind": "derated", "calibration": "none"}, LLAMA, H100, block_size=16)
    assert plain.request_overhead_s == 0.0 and "serving terms" not in plain.label
    write_calibration(ServingCalibration(request_overhead_s=0.02, source="two runs"), tmp_path / "c.yaml")
    fitted = make_cost_model(
        {"kind": "derated", "calibration": "c.yaml"}, LLAMA, H100, block_size=16, base_dir=tmp_path
    )
    assert fitted.request_overhead_s == 0.02 and "fitted to two runs" in fitted.label
    with pytest.raises(CostModelError, match="serving calibration 'nope.yaml' not found"):
        make_cost_model({"kind": "derated", "calibration": "nope.yaml"}, LLAMA, H100, block_size=16)
    with pytest.raises(CostModelError, match="takes no `calibration`"):
        make_cost_model({"kind": "analytic", "calibration": "none"}, LLAMA, H100, block_size=16)


def test_client_overhead_relabels_latencies_and_delays_nothing(tmp_path: Path) -> None:
    from sim.config import validate_experiment
    from sim.runner import prepare_experiment, run_experiment

    def run(overhead: float):
        data = {
            "name": "overhead",
            "model": "Llama-2-7B",
            "gpu": "H100-80GB",
            "engine": {"client_overhead_s": overhead},
            "workload": {
                "num_requests": 30,
                "arrival": {"kind": "poisson", "rate_per_s": 10},
                "prompt_len": 200,
                "output_len": 20,
            },
            "variants": [{"name": "p", "policy": "paged"}],
        }
        config = validate_experiment(data, tmp_path / "x.yaml")
        result = run_experiment(
            config, tmp_path / "x.yaml", prepared=prepare_experiment(config, tmp_path / "x.yaml")
        )
        return result[0].sink.requests().sort_values("request_id").reset_index(drop=True)

    engine_side, client_side = run(0.0), run(0.5)
    assert (client_side["first_token_s"] == engine_side["first_token_s"]).all()  # nothing moved
    assert (client_side["ttft_s"] - engine_side["ttft_s"]).tolist() == pytest.approx([0.5] * 30)
    assert (client_side["e2e_s"] - engine_side["e2e_s"]).tolist() == pytest.approx([0.5] * 30)
    assert client_side["tpot_s"].tolist() == pytest.approx(engine_side["tpot_s"].tolist())


# --------------------------------------------------------------------------------------------------
# The fit
# --------------------------------------------------------------------------------------------------


TRAITS = RunTraits(gpu="H100-80GB", model_family="llama-2", tensor_parallel_size=1, collectives="none")


def _errors(name: str, anchor: str, measured_ttft: float, simulated_ttft: float) -> RunErrors:
    return RunErrors(
        name,
        anchor,
        {"ttft_mean": measured_ttft, "tpot": 0.01, "e2e_mean": 2.0 + measured_ttft},
        {"ttft_mean": simulated_ttft, "tpot": 0.01, "e2e_mean": 2.0 + simulated_ttft},
        TRAITS,
    )


def test_client_overhead_is_chosen_from_the_client_side_runs_alone() -> None:
    # every client-side run is 15 ms short in TTFT and E2E: the best overhead is 15 ms
    results = [
        _errors("a", "client", 0.030, 0.015),
        _errors("b", "client", 0.040, 0.025),
        _errors("c", "engine", 5.0, 1.0),
    ]
    assert best_overhead(results) == pytest.approx(0.015, abs=2e-4)
    assert results[0].with_overhead(0.015)["ttft_mean"] == pytest.approx(0.0)
    assert results[2].with_overhead(0.015)["ttft_mean"] == pytest.approx(1.0 / 5.0 - 1)  # not shifted
    assert best_overhead([results[2]]) == 0.0


def test_log_loss_is_symmetric_and_bounded() -> None:
    assert log_loss({"a": 1.0, "b": -0.5}) == pytest.approx(math.log(2))
    assert log_loss({"a": math.nan}) == 5.0
    summary = summarize_errors(
        {
            "x": {"ttft_mean": 0.1, "tpot": -0.2, "e2e_mean": 0.0},
            "y": {"ttft_mean": -0.3, "tpot": 0.0, "e2e_mean": 0.1},
        }
    )
    assert summary["ttft_mean_mean_abs"] == pytest.approx(0.2)
    assert summary["tpot_max_abs"] == pytest.approx(0.2)


def _replay_file(tmp_path: Path, name: str, rate: float) -> Path:
    """A replay file of a 'measured' run kvsim made itself (engine-side, no prompt identity)."""
    from tests.test_replay import _self_measured_run

    folder = tmp_path / name
    folder.mkdir()
    bench = _self_measured_run(folder)
    data = json.loads(bench.read_text())
    data["request_rate"] = rate
    bench.write_text(json.dumps(data))
    spec = {
        "name": name,
        "run": {"path": str(bench)},
        "gpu": "H100-80GB",
        "policy": "paged",
        "engine": {"max_num_seqs": 256, "max_num_batched_tokens": 8192},
    }
    path = folder / "replay.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_tiny_fit_records_in_sample_and_leave_one_out_errors(tmp_path: Path) -> None:
    paths = [_replay_file(tmp_path, "one", 20.0), _replay_file(tmp_path, "two", 20.0)]
    start = replace(NEUTRAL, iteration_overhead_s=1e-4, all_reduce_latency_s=6e-6)
    calibration = calibrate_from_runs(
        paths, max_evaluations=3, fold_evaluations=2, start=start, names=["iteration_overhead_s"]
    )
    fit = calibration.fit
    assert set(fit["in_sample"]["runs"]) == {"one", "two"}
    assert set(fit["leave_one_out"]["runs"]) == {"one", "two"}
    assert fit["evaluations"] == 3 + 2 * 2  # the full fit, then two refits (held-out replays apart)
    held = fit["leave_one_out"]["parameters"]["one"]
    assert held["kv_bandwidth_scale"] == 1.0  # not fitted: as the start has it
    assert calibration.fit["loss"] == pytest.approx(
        sum(log_loss(run) for run in fit["in_sample"]["runs"].values()) / 2
    )
    write_calibration(calibration, tmp_path / "fit.yaml")
    assert load_calibration(tmp_path / "fit.yaml").parameters() == calibration.parameters()


def test_folds_of_an_earlier_fit_replay_its_terms_once_and_run_only_the_folds(tmp_path: Path) -> None:
    """``--folds-of``: the earlier fit's terms stand for the full fit (one replay of every run, no
    search); the folds are added to its record and its evaluations counted on from its own."""
    paths = [_replay_file(tmp_path, "one", 20.0), _replay_file(tmp_path, "two", 20.0)]
    start = replace(NEUTRAL, iteration_overhead_s=1e-4, all_reduce_latency_s=6e-6)
    earlier = calibrate_from_runs(
        paths, max_evaluations=3, folds=(), start=start, names=["iteration_overhead_s"]
    )
    assert "leave_one_out" not in earlier.fit and earlier.fit["evaluations"] == 3
    added = calibrate_from_runs(
        paths,
        folds=("run",),
        fold_evaluations=2,
        start=start,
        names=["iteration_overhead_s"],
        fitted_before=earlier,
    )
    assert added.parameters() == earlier.parameters()
    assert added.fit["in_sample"] == earlier.fit["in_sample"]  # the same code replays the same terms
    assert set(added.fit["leave_one_out"]["runs"]) == {"one", "two"}
    assert added.fit["evaluations"] == 3 + 1 + 2 * 2  # its own 3, one replay, two refits of 2
    with pytest.raises(
        CalibrationError, match="fitted to other runs than those given; in its fit but not given: "
    ):
        calibrate_from_runs(paths[:1], folds=("run",), fitted_before=earlier)


def test_a_leave_one_out_refit_gets_the_full_fits_budget_unless_told(tmp_path: Path) -> None:
    # A fold stopped short of the full fit's search would report the search's error as the model's.
    paths = [_replay_file(tmp_path, "one", 20.0), _replay_file(tmp_path, "two", 20.0)]
    start = replace(NEUTRAL, iteration_overhead_s=1e-4, all_reduce_latency_s=6e-6)
    calibration = calibrate_from_runs(paths, max_evaluations=3, start=start, names=["iteration_overhead_s"])
    assert calibration.fit["evaluations"] == 3 + 2 * 3


def test_the_error_band_quotes_the_leave_one_out_errors() -> None:
    fit = {
        "leave_one_out": {
            "runs": {"a": {}, "b": {}},
            "summary": {"ttft_mean_mean_abs": 0.12, "tpot_mean_abs": 0.05, "e2e_mean_mean_abs": 0.061},
        }
    }
    model = DeratedCostModel(LLAMA, H100, serving=ServingCalibration(fit=fit))
    assert model.error_band.endswith(
        "end to end, leave-one-run-out over 2 measured vLLM runs: mean |error| TTFT 12%, TPOT 5%, E2E 6%"
    )
    assert DeratedCostModel(LLAMA, H100, serving=NEUTRAL).error_band == H100.efficiency.error_band


# --------------------------------------------------------------------------------------------------
# Leave one GPU out
# --------------------------------------------------------------------------------------------------

PLANTED_WEIGHT_SCALE = 1.08


def _fake_gpu(name: str, bandwidth_gb_per_s: float, achievable: float) -> dict[str, object]:
    return {
        "base": "H100-80GB",
        "name": name,
        "hbm_bandwidth_gb_per_s": bandwidth_gb_per_s,
        "achievable_bandwidth": achievable,
    }


def _planted_run(
    tmp_path: Path, name: str, gpu: dict[str, object], replayed_on: dict[str, object] | None = None
) -> Path:
    """A replay file of a run kvsim 'measured' on ``gpu`` with the serving terms planted: a light,
    decode-bound load (TPOT is the weight read), as a vllm bench JSON; replayed on ``replayed_on``
    (default: the same GPU)."""
    from tests.test_replay import measured_by_kvsim

    folder = tmp_path / name
    folder.mkdir()
    planted = ServingCalibration(weight_bandwidth_scale=PLANTED_WEIGHT_SCALE, source="planted")
    write_calibration(planted, folder / "planted.yaml")
    engine = {"max_num_seqs": 256, "max_num_batched_tokens": 8192, "async_scheduling": False}
    experiment = {
        "name": "planted",
        "model": "Llama-2-7B",
        "gpu": gpu,
        "cost_model": {"kind": "derated", "calibration": str(folder / "planted.yaml")},
        "engine": engine,
        "workload": {
            "num_requests": 12,
            "arrival": {"kind": "poisson", "rate_per_s": 1},
            "prompt_len": {"kind": "uniform", "low": 50, "high": 200},
            "output_len": {"kind": "uniform", "low": 40, "high": 80},
        },
        "variants": [{"name": "p", "policy": "paged"}],
    }
    bench = measured_by_kvsim(experiment, folder, rate_per_s=1.0)
    spec = {
        "name": name,
        "run": {"path": str(bench)},
        "gpu": replayed_on or gpu,
        "policy": "paged",
        "engine": engine,
    }
    (folder / "replay.yaml").write_text(yaml.safe_dump(spec))
    return folder / "replay.yaml"


def test_a_gpu_fold_carries_a_server_term_to_a_gpu_it_never_saw(tmp_path: Path) -> None:
    # Two fake GPUs whose memories reach different shares of their datasheets (the per-GPU factor,
    # 0.92 and 0.60), 'measured' with one planted server term (weights read at 1.08x the kernel
    # factor). Leaving either GPU out, the refit on the other recovers the term, and the held-out
    # GPU, known by its own achievable bandwidth, is predicted as measured: the term transfers.
    fast = _fake_gpu("fake-fast", 3000.0, 0.92)
    slow = _fake_gpu("fake-slow", 1200.0, 0.60)
    paths = [_planted_run(tmp_path, "on-fast", fast), _planted_run(tmp_path, "on-slow", slow)]
    calibration = calibrate_from_runs(
        paths, max_evaluations=20, folds=("gpu",), start=NEUTRAL, names=["weight_bandwidth_scale"]
    )
    fit = calibration.fit
    assert fit["gpus"] == {"on-fast": "H100-80GB", "on-slow": "H100-80GB"}  # the preset they derive from
    # (Nelder-Mead stops within xatol = 0.02 of the optimum, in log space)
    assert calibration.weight_bandwidth_scale == pytest.approx(PLANTED_WEIGHT_SCALE, rel=0.025)
    folds = fit["leave_one_gpu_out"]
    assert set(folds["groups"]) == {"fake-fast", "fake-slow"}
    for gpu in ("fake-fast", "fake-slow"):
        assert folds["parameters"][gpu]["weight_bandwidth_scale"] == pytest.approx(
            PLANTED_WEIGHT_SCALE, rel=0.025
        )
    for run in folds["runs"].values():
        assert abs(run["tpot"]) < 0.03 and abs(run["e2e_mean"]) < 0.03
    # The same run replayed on a GPU that does not know its memory's share (the H100's, 0.961, for
    # a memory that delivers 0.60) is off by about their ratio: the per-GPU factor is what transfers.
    unknown = _planted_run(tmp_path, "unknown", slow, replayed_on=_fake_gpu("fake-slow", 1200.0, 0.961))
    wrong = calibrate_from_runs(
        [unknown],
        max_evaluations=1,
        folds=(),
        start=replace(NEUTRAL, weight_bandwidth_scale=PLANTED_WEIGHT_SCALE),
        names=["weight_bandwidth_scale"],
    )
    assert wrong.fit["in_sample"]["runs"]["unknown"]["tpot"] < -0.25


def test_gpu_folds_group_runs_by_their_gpu_and_borrow_what_no_training_run_informs() -> None:
    def run(name: str, gpu: str, anchor: str, collectives: str) -> RunErrors:
        traits = RunTraits(gpu=gpu, model_family="llama-2", tensor_parallel_size=2, collectives=collectives)
        figures = {"ttft_mean": 0.1, "tpot": 0.01, "e2e_mean": 1.0}
        return RunErrors(name, anchor, figures, figures, traits)

    results = [
        run("h1", "H100-80GB", "client", "nvlink"),
        run("r1", "RTX-4090-24GB", "engine", "none"),
        run("h2", "H100-80GB", "client", "none"),
        run("p1", "RTX-PRO-6000-96GB", "engine", "pcie"),
    ]
    groups = fold_groups(results, ["a", "b", "c", "d"], "gpu")
    assert groups == {"H100-80GB": [0, 2], "RTX-4090-24GB": [1], "RTX-PRO-6000-96GB": [3]}
    assert fold_groups(results, [], "run") == {"h1": [0], "r1": [1], "h2": [2], "p1": [3]}
    assert list(fold_groups(results, [], "tp")) == ["TP 2"]
    informs = {term: [r.name for r in results if rule(r)] for term, rule in INFORMED_BY.items()}
    assert informs == {
        "request_overhead_s": ["h1", "h2"],
        "all_reduce_latency_s": ["h1"],
        "pcie_all_reduce_scale": ["p1"],
    }


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("Llama-2-70B", "llama-2"),
        ("Llama-3.1-8B", "llama-3.1"),
        ("CodeLlama-34B", "codellama"),
        ("Qwen3-30B-A3B-Instruct-2507", "qwen3"),
        ("Qwen3-32B", "qwen3"),
        ("Mixtral-8x7B", "mixtral"),
        ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1"),
        ("Qwen/Qwen3-30B-A3B", "qwen3"),
    ],
)
def test_model_family_is_the_name_before_its_size(name: str, family: str) -> None:
    assert model_family(name) == family
