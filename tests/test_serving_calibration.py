"""The serving terms fitted to measured runs (sim/costs/serving.py), the client overhead they put
in latencies, and the fit itself (calibrate/from_runs.py)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from calibrate.from_runs import RunErrors, best_overhead, calibrate_from_runs, log_loss, summarize_errors
from sim.costs.core import CostModelError, make_cost_model
from sim.costs.derated import DeratedCostModel
from sim.costs.serving import (
    NEUTRAL,
    CalibrationError,
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


def test_bandwidth_scales_are_capped_at_the_datasheet() -> None:
    # H100 kv_bandwidth 0.938: x 2 would exceed the datasheet, so the share is 1.0 exactly
    model = DeratedCostModel(LLAMA, H100, serving=ServingCalibration(kv_bandwidth_scale=2.0))
    kv_bytes = LLAMA.kv_bytes_per_token()
    assert model.decode.per_context_token_s == pytest.approx(kv_bytes / H100.hbm_bandwidth_bytes_per_s)
    assert model.efficiency.kv_bandwidth == 1.0


def test_attention_scale_multiplies_the_per_sequence_cost() -> None:
    plain = DeratedCostModel(LLAMA, H100, serving=NEUTRAL)
    scaled = DeratedCostModel(LLAMA, H100, serving=ServingCalibration(decode_attention_per_seq_scale=0.25))
    assert scaled.decode_attention_per_seq_s == pytest.approx(plain.decode_attention_per_seq_s * 0.25)


def test_per_sequence_attention_divides_with_tensor_parallelism() -> None:
    single = DeratedCostModel(resolve_model("Llama-2-70B"), H100, serving=NEUTRAL)
    four = DeratedCostModel(resolve_model("Llama-2-70B"), H100, serving=NEUTRAL, tensor_parallel_size=4)
    assert four.decode_attention_per_seq_s == pytest.approx(single.decode_attention_per_seq_s / 4)


def test_transferred_scale_touches_only_gpus_without_their_own_factors() -> None:
    calibration = ServingCalibration(transferred_bandwidth_scale=1.25)
    rtx = resolve_gpu("RTX-4090-24GB")
    assert rtx.efficiency.transferred and not H100.efficiency.transferred
    assert calibration.derate(rtx.efficiency).weight_bandwidth == pytest.approx(
        rtx.efficiency.weight_bandwidth * 1.25
    )
    assert calibration.derate(H100.efficiency).weight_bandwidth == H100.efficiency.weight_bandwidth


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


def _errors(name: str, anchor: str, measured_ttft: float, simulated_ttft: float) -> RunErrors:
    return RunErrors(
        name,
        anchor,
        {"ttft_mean": measured_ttft, "tpot": 0.01, "e2e_mean": 2.0 + measured_ttft},
        {"ttft_mean": simulated_ttft, "tpot": 0.01, "e2e_mean": 2.0 + simulated_ttft},
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
        paths, max_evaluations=3, leave_one_out_evaluations=2, start=start, names=["iteration_overhead_s"]
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
