"""The fitted serving terms (``sim/costs/serving.py``) on a small fit written by hand: which folds a
GPU's band comes from and the text a report prints, how the scales derate a GPU's efficiency, the
all-reduce on PCIe, and the checks on a calibration's values."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim.costs.serving import ServingCalibration
from sim.costs.terms import AllReduceCost
from sim.hardware.gpus import GPU_PRESETS

FIT = {
    "gpus": {"run-a": "H100-80GB", "run-b": "H100-80GB", "run-c": "RTX-4090-24GB"},
    "leave_one_out": {
        "summary": {"ttft_mean_mean_abs": 0.05, "tpot_mean_abs": 0.03, "e2e_mean_mean_abs": 0.04},
        "runs": {"run-a": {"tpot": 0.10}, "run-b": {"tpot": -0.05}, "run-c": {"tpot": 0.02}},
    },
    "leave_one_gpu_out": {
        "summary": {"ttft_mean_mean_abs": 0.2, "tpot_mean_abs": 0.12, "e2e_mean_mean_abs": 0.15},
        "groups": {"H100-80GB": {}, "RTX-4090-24GB": {}},
        "runs": {"run-a": {"tpot": 0.25}, "run-b": {"tpot": 0.0}, "run-c": {"tpot": -0.2}},
    },
}


def calibration(**terms) -> ServingCalibration:
    return ServingCalibration(source="hand", fit=FIT, **{"kv_bandwidth_scale": 1.5, **terms})


def test_the_gpus_of_the_fit_and_how_much_of_a_gpu_was_measured():
    cal = calibration()
    assert cal.fitted_gpus() == {"H100-80GB": 2, "RTX-4090-24GB": 1}
    assert cal.evidence(GPU_PRESETS["H100-80GB"]) == "measured"
    assert cal.evidence(GPU_PRESETS["L4-24GB"]) == "transferred"  # its GEMMs were measured
    assert cal.evidence(GPU_PRESETS["A10G-24GB"]) == "datasheet-only"
    assert ServingCalibration().fitted_gpus() == {}


def test_a_measured_gpu_quotes_the_run_folds_and_any_other_the_gpu_folds():
    cal = calibration()
    h100, l4 = GPU_PRESETS["H100-80GB"], GPU_PRESETS["L4-24GB"]
    assert cal.error_band() == (
        "end to end, leave-one-run-out over 3 measured vLLM runs: mean |error| TTFT 5%, TPOT 3%, E2E 4%"
    )
    assert cal.error_band(h100) == (
        "H100-80GB is measured: end to end, leave-one-run-out over 3 measured vLLM runs: "
        "mean |error| TTFT 5%, TPOT 3%, E2E 4%"
    )
    assert cal.error_band(l4) == (
        "L4-24GB is transferred: end to end, leave-one-GPU-out over 2 GPUs (3 measured vLLM runs): "
        "mean |error| TTFT 20%, TPOT 12%, E2E 15%; L4-24GB is partly measured: achievable bandwidth 98% "
        "of the datasheet assumed (79%..100% measured on parts of its memory type), which widens its band"
    )
    assert ServingCalibration().error_band(h100) == ""  # no held-out errors: nothing to quote
    # A GPU of the fit whose memory was assumed: its runs measured it, so nothing is said assumed.
    assert cal.error_band(GPU_PRESETS["RTX-4090-24GB"]) == (
        "RTX-4090-24GB is measured: end to end, leave-one-run-out over 3 measured vLLM runs: "
        "mean |error| TTFT 5%, TPOT 3%, E2E 4%"
    )


def test_the_time_scale_band_from_held_out_tpot_errors():
    """Run folds: TPOT errors +10 %, -5 %, +2 %: a measured server's step took 1/1.10 to 1/0.95 of
    kvsim's. GPU folds (+25 %, 0, -20 %) for the L4, times its memory's assumed range (0.977 of
    0.791..1.0: x0.977 at the fast end, x0.977/0.791 at the slow)."""
    cal = calibration()
    assert cal.time_scale_band(GPU_PRESETS["H100-80GB"]) == pytest.approx((1 / 1.10, 1 / 0.95))
    memory = GPU_PRESETS["L4-24GB"].memory_ceiling
    assert cal.time_scale_band(GPU_PRESETS["L4-24GB"]) == pytest.approx(
        (1 / 1.25 * memory.share / memory.band[1], 1 / 0.8 * memory.share / memory.band[0])
    )
    assert ServingCalibration().time_scale_band() is None
    # A GPU with runs in the fit keeps its run folds unwidened, even where its memory was assumed
    # (the RTX 4090's GDDR6X): its runs measured what the assumption would widen.
    assert cal.time_scale_band(GPU_PRESETS["RTX-4090-24GB"]) == pytest.approx((1 / 1.10, 1 / 0.95))


def test_the_scales_derate_a_gpus_efficiency_capped_at_what_it_can_reach():
    base = replace(
        GPU_PRESETS["H100-80GB"].efficiency,
        kv_bandwidth=0.5,
        weight_bandwidth=0.6,
        decode_attention_per_seq_s=2e-6,
    )
    cal = calibration(weight_bandwidth_scale=2.0, decode_attention_per_seq_scale=3.0)
    derated = cal.derate(base, achievable_share=0.9)
    assert derated.kv_bandwidth == pytest.approx(0.75)  # 0.5 x 1.5
    assert derated.weight_bandwidth == pytest.approx(0.9)  # 0.6 x 2 = 1.2, capped at 0.9
    assert derated.decode_attention_per_seq_s == pytest.approx(6e-6)
    assert ServingCalibration().derate(base) is base
    assert cal.describe() == "serving terms fitted to hand"
    assert ServingCalibration().describe() == "no serving calibration"


def test_the_all_reduce_scale_applies_on_pcie_only():
    cost = AllReduceCost(2, per_iteration_s=1e-4, per_token_s=1e-6)
    cal = calibration(pcie_all_reduce_scale=2.5)
    assert cal.all_reduce(cost, nvlink=True) is cost
    scaled = cal.all_reduce(cost, nvlink=False)
    assert (scaled.per_iteration_s, scaled.per_token_s) == pytest.approx((2.5e-4, 2.5e-6))
    assert calibration().all_reduce(cost, nvlink=False) is cost


@pytest.mark.parametrize(
    ("terms", "message"),
    [
        ({"iteration_overhead_s": -0.001}, "iteration_overhead_s must be a number >= 0, got -0.001"),
        ({"request_overhead_s": True}, "request_overhead_s must be a number >= 0, got True"),
        ({"kv_bandwidth_scale": "2"}, "kv_bandwidth_scale must be a number >= 0, got '2'"),
        ({"weight_bandwidth_scale": 0}, "weight_bandwidth_scale must be positive, got 0"),
        ({"all_reduce_latency_s": -1.0}, "all_reduce_latency_s must be a number >= 0, got -1.0"),
        # (checked after an unset all_reduce_latency_s, which is valid)
        ({"pcie_all_reduce_scale": -2.0}, "pcie_all_reduce_scale must be a number >= 0, got -2.0"),
    ],
)
def test_a_calibrations_values_are_checked_naming_the_term(terms, message):
    with pytest.raises(ValueError, match="^serving calibration: " + message.replace("(", r"\(")):
        ServingCalibration(**terms)


def test_zero_overheads_and_an_unset_all_reduce_latency_are_valid():
    cal = ServingCalibration(iteration_overhead_s=0, request_overhead_s=0.0, all_reduce_latency_s=None)
    assert cal.is_neutral
    assert not calibration().is_neutral
